"""Area / Fmax sweep of the NME over lanes and formats, and where DRAM bandwidth caps lanes.

``coda synth-sweep`` (``make synth-sweep``; long: minutes per configuration; NOT part of
``make test``) runs :func:`coda.synth.flow.synthesize` for every (target, lanes, format) as a
point of the sweep engine (:mod:`coda.sweep`: on a local Ray, a cluster with ``--address``,
or in this process with ``--sequential``) into
``build/synth/sweep/points/<target>_l<lanes>_<fmt>/``, skipping configurations already done
with the same hardware sources (a stopped sweep resumes; a changed ``hw/`` or ``synth/`` is
synthesised again). It then writes ``sweep.json``, a table, and ``sweep.png`` into
``build/synth/``: the bandwidth bound per configuration (:func:`bandwidth_table`) and, where
``make bench`` left its DIMM-NMP design-space sweep, the measured throughput per area
(:func:`measured_table`, :func:`clock_table`). Its :func:`main` takes the command's
:class:`AreaSweepConfig` (``CONFIG``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from coda.cosim.nme.units import COMBINATIONAL, DEFAULT_UNITS as SWEEP_UNITS, parse_units, units_label
from coda.experiments.synth_area import config_units, fmax_below
from coda.hw.dram.standards import DDR4_3200, get_standard
from coda.hw.nme.isa import NMEConfig
from coda.synth.flow import check_synth_options, synthesize
from coda.sweep import RayOptions
from coda.jsonout import json_text
from coda.options import add_options, option
from coda.paths import check_output_path, save_figure, write_file

__all__ = ["LANES", "FORMATS", "run_sweep", "collect", "rank_peak_bytes_per_s",
           "bandwidth_table", "measured_table", "clock_table", "plot", "AreaSweepConfig",
           "CONFIG", "configure", "main"]

LANES = (1, 2, 4, 8, 16, 32)
FORMATS = ("bf16", "fp16")


def synth_point(params: dict, workdir: Path) -> dict:
    """One ``coda synth-sweep`` point: :func:`coda.synth.flow.synthesize` of an NME of
    ``lanes`` lanes and format ``fmt`` for ``target`` into ``workdir`` (``report.json``,
    netlists, logs).

    Returns for ``generic``: ``cells_total``, ``ff``, ``logic_depth``; for ``ecp5``:
    ``lut4``, ``ff``, ``mult18``, ``bram``, ``lutram``, ``fmax_mhz`` (MHz, None without place
    and route), ``device``; plus ``timing`` (the tools' seconds). Raises ValueError for an
    unknown target or format, SynthError if a tool fails or runs past ``timeout_s``."""
    target, n, fmt = params["target"], int(params["lanes"]), params["fmt"]
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}: expected one of {', '.join(FORMATS)}")
    mul, add, opnd = parse_units(units_label(params.get("units")), "units")
    cfg = NMEConfig(lanes=n, fmt=fmt, mul_latency=mul, add_latency=add, operand_latency=opnd)
    report = synthesize(cfg, target, workdir,
                        freq_mhz=params["freq_mhz"], pnr=params["pnr"],
                        timeout_s=params["timeout_s"], seed=int(params.get("seed") or 1))
    res = report[target]
    keys = (("cells_total", "ff", "logic_depth") if target == "generic" else
            ("lut4", "ff", "mult18", "bram", "lutram", "fmax_mhz", "device"))
    return {**{k: res.get(k) for k in keys}, "timing": report.get("runtime_s")}


def sweep_kind():
    """The ``synth`` sweep kind (coda.sweep.SweepKind): one synthesis per (target, lanes,
    fmt, units, seed), in the folder ``<target>_l<lanes>_<fmt>`` under the sweep's
    ``points/`` (``..._u<M><A><O>`` for NME units other than the combinational ``0,0,0``,
    ``..._s<seed>`` for a placer seed other than 1)."""
    import coda.hw
    import coda.synth
    from coda.sweep import Param, SweepKind, sources_digest
    return SweepKind(
        name="synth", run=synth_point,
        version=sources_digest(Path(__file__), Path(coda.synth.__file__).parent,
                               Path(coda.hw.__file__).parent),
        description="synthesise the NME (yosys generic cells or ECP5 with nextpnr)",
        params=(Param("target", str, "ecp5"), Param("lanes", int, 8), Param("fmt", str, "bf16"),
                Param("freq_mhz", float, 100.0), Param("pnr", bool, True),
                Param("timeout_s", float), Param("units", str, SWEEP_UNITS),
                Param("seed", int, 1)),
        folder=_folder,
        headline=("cells_total", "lut4", "ff", "mult18", "bram", "fmax_mhz"))


def _folder(params: dict) -> str:
    units = units_label(params.get("units"))
    # folder names from before the units were a parameter: no tag for the combinational units
    tag = "" if units == COMBINATIONAL else "_u" + units.replace(",", "")
    seed = int(params.get("seed") or 1)
    tag += "" if seed == 1 else f"_s{seed}"
    return f"{params['target']}_l{params['lanes']}_{params['fmt']}{tag}"


def run_sweep(root: Path, lanes=LANES, fmts=FORMATS, targets=("generic", "ecp5"), *,
              ecp5_max_lanes: int = 8, timeout_s: float | None = None, freq_mhz: float = 100.0,
              workers: int | None = None, sequential: bool = False,
              address: str | None = None, units: str = SWEEP_UNITS, seed: int = 1,
              log=print) -> list[dict]:
    """Synthesise every (target, lanes, fmt) configuration not yet done under ``root``, with
    NME ``units`` ``"M,A,O"`` (mul / add / operand latency, default the default NME's
    ``5,7,1``, :data:`~coda.cosim.nme.units.DEFAULT_UNITS`; ValueError
    naming it when out of range) and nextpnr placer ``seed``.

    Each configuration is a :func:`synth_point` run by :func:`coda.sweep.run_sweep`: a task
    on Ray (local with ``workers`` CPUs, or the cluster at ``address``) or, with
    ``sequential``, a loop in this process. ECP5 place and route runs only up to
    ``ecp5_max_lanes`` (synthesis alone above). A tool failure or timeout is recorded (in
    ``root/results.jsonl`` and ``<folder>/error.txt``) and the sweep goes on.

    Returns the sweep's records (coda.sweep), one per configuration.
    """
    from coda.sweep import run_sweep as run_points

    kind = sweep_kind()
    units = units_label(units)
    points = [kind.full({"target": t, "lanes": n, "fmt": f, "freq_mhz": freq_mhz,
                         "pnr": t == "ecp5" and n <= ecp5_max_lanes, "timeout_s": timeout_s,
                         "units": units, "seed": seed})
              for t in targets for f in fmts for n in lanes]
    records = run_points(kind, points, root, workers=workers, sequential=sequential,
                         address=address, log=log)
    for rec in records:
        p, f = rec["params"], rec["figures"]
        if rec["status"] != "ok":
            continue
        log(f"{p['target']} lanes={p['lanes']} {p['fmt']} units {units}: "
            + (f"{f['cells_total']} cells" if p["target"] == "generic" else
               f"{f['lut4']} LUT4 {f['ff']} FF {f['mult18']} MULT18 "
               f"{f['bram']} DP16KD fmax {f['fmax_mhz']} MHz on {f['device']}"))
    return records


def collect(root: Path, units: str = SWEEP_UNITS) -> list[dict]:
    """One row per (lanes, fmt) found under ``root`` for NME ``units`` ``"M,A,O"`` (reports
    without latencies are ``0,0,0``): generic and ECP5 numbers side by side (ECP5: of the
    placer seed with the best Fmax)."""
    want = units_label(units)
    rows: dict[tuple, dict] = {}
    for path in sorted(root.glob("points/*/report.json")):
        report = json.loads(path.read_text())
        cfg, target = report["config"], report["target"]
        if config_units(cfg) != want:
            continue
        row = rows.setdefault((cfg["lanes"], cfg["fmt"]), {"lanes": cfg["lanes"],
                                                            "fmt": cfg["fmt"]})
        res = report[target]
        if target == "generic":
            row.update(cells_total=res["cells_total"], generic_ff=res["ff"],
                       logic_depth=res["logic_depth"],
                       generic_s=report["runtime_s"]["total"])
        elif not fmax_below(res, row):
            row.update(lut4=res["lut4"], ecp5_ff=res["ff"], mult18=res["mult18"],
                       bram=res["bram"], lutram=res["lutram"], device=res["device"],
                       fmax_mhz=res["fmax_mhz"], ecp5_s=report["runtime_s"]["total"])
    return [rows[k] for k in sorted(rows)]


def rank_peak_bytes_per_s(dram: str = "DDR4-3200") -> float:
    """Peak data rate of one rank in bytes/s: ``rank_width/8`` bytes per beat, 2 beats per tCK."""
    std = get_standard(dram)
    return std.rank_width / 8 * 2 / (std.tCK_ns * 1e-9)


def bandwidth_table(rows: list[dict], dram: str = "DDR4-3200") -> list[dict]:
    """Add the bandwidth-bound throughput and performance per area to each row.

    Adds ``f_clk_mhz`` (+ ``f_from_lanes``), ``demand_gbs`` (``lanes*2*f``), ``peak_gbs``,
    ``gelem_s`` (useful Gelements/s), ``bound`` ("compute" or "DRAM"), ``melem_s_per_klut``
    and ``melem_s_per_kcell`` where the area is known, and ``knee`` (True on the first lanes
    count of a format whose demand reaches the peak).

    The NME's memory port moves one word of ``lanes`` 16-bit elements per clock, so it asks for
    ``lanes * 2 B * f_clk`` bytes/s; a rank delivers at most its peak
    ``rank_width / 8 B * 2 / tCK`` bytes/s (:mod:`coda.hw.dram.standards`; DDR4-3200 x64:
    25.6 GB/s). Useful element throughput is ``min(lanes * f_clk, peak / 2 B)`` elements/s, and
    performance per area is that over LUT4s (ECP5) or generic cells. The knee is the smallest
    ``lanes`` whose demand reaches the rank peak: beyond it more lanes add area, not throughput.
    ``f_clk`` is the ECP5 Fmax of that configuration (nextpnr), or of the nearest lanes count that
    was placed and routed (said so in the table). If the cosim bench left throughput results in
    ``build/bench/*.json`` they are listed next to the bound.
    """
    peak = rank_peak_bytes_per_s(dram)
    out = []
    for fmt in sorted({r["fmt"] for r in rows}):
        mine = [dict(r) for r in rows if r["fmt"] == fmt]
        routed = [r for r in mine if r.get("fmax_mhz")]
        knee_seen = False
        for r in mine:
            src = r if r.get("fmax_mhz") else (
                min(routed, key=lambda x: abs(x["lanes"] - r["lanes"])) if routed else None)
            if src is None:
                out.append(r)
                continue
            f = src["fmax_mhz"] * 1e6
            demand = r["lanes"] * 2 * f
            useful = min(demand, peak) / 2
            r.update(f_clk_mhz=src["fmax_mhz"], f_from_lanes=src["lanes"],
                     demand_gbs=demand / 1e9, peak_gbs=peak / 1e9, gelem_s=useful / 1e9,
                     bound="DRAM" if demand >= peak else "compute", dram=dram)
            r["knee"] = demand >= peak and not knee_seen
            knee_seen = knee_seen or demand >= peak
            if r.get("lut4"):
                r["melem_s_per_klut"] = useful / 1e6 / (r["lut4"] / 1e3)
            if r.get("cells_total"):
                r["melem_s_per_kcell"] = useful / 1e6 / (r["cells_total"] / 1e3)
            out.append(r)
    return out


KNEE_FRACTION = 0.95
DSE_PROGRAMS = ("residual_add", "segment4")


def measured_table(rows: list[dict], dse: dict, dram: str | None = None) -> list[dict]:
    """Add the DIMM-NMP sweep's measured throughput and performance per area to ``rows``.

    With the DIMM-NMP design-space sweep of ``make bench`` (``build/bench/dse.json``, from
    :func:`coda.experiments.design_space.sweep`: one rank; here its rows with the NME clocked at the DRAM tCK,
    best buffer depth per lanes count), :func:`measured_table` adds what the cosimulation achieved: elements per cycle of
    a residual add and of a 4-stream segment, and that per 1,000 generic cells / ECP5 LUT4s
    (performance per area, frequency-free because the cosim NME runs at tCK). The *measured knee*
    is the smallest lanes count reaching 95 % of the best elements/cycle: beyond it the DRAM, not
    the lanes, sets the throughput, and perf/area falls. A version-2 ``dse.json`` (the sweep
    over NME clocks and DRAM standards) also gives :func:`clock_table`: per standard, NME clock
    (MHz) and lanes count, the measured elements per ns per 1,000 generic cells / LUT4s, the knee
    of :func:`coda.experiments.design_space.knees` at that clock (said NME-bound when even the widest NME
    does not saturate the rank) and whether the ECP5 Fmax of that lanes count reaches the clock.

    Args:
        rows: synthesis rows (:func:`collect`, one per lanes x fmt).
        dse: the JSON of ``build/bench/dse.json`` (version 1: ``{"dram", "rows": [{lanes,
            depth, program, elements_per_cycle, utilisation, ...}]}``; version 2 adds ``dram``
            and ``nme_mhz`` per row, None for the NME on the DRAM clock).
        dram: the standard whose rows to use (default: ``dse["dram"]``).
    Uses the rows of the NME on the DRAM clock (one NME cycle = one tCK, so elements per
    cycle are comparable across lanes; the other clocks: :func:`clock_table`). Adds per row
    and program P in :data:`DSE_PROGRAMS` where measured: ``P_elem_per_cycle`` (best depth),
    ``P_depth``, ``P_utilisation``, ``P_per_kcell`` / ``P_per_klut`` (elements per cycle per
    1,000 cells / LUT4s), ``P_knee`` (True on the measured knee, see module doc).
    The DSE runs bf16; the datapath's cycle behaviour is the same for fp16, so both formats
    use it.
    """
    dram = dram or dse.get("dram")
    best: dict[tuple[int, str], dict] = {}
    for r in dse.get("rows", []):
        if r.get("nme_mhz") is not None or r.get("dram", dram) != dram:
            continue
        key = (r["lanes"], r["program"])
        if key not in best or r["elements_per_cycle"] > best[key]["elements_per_cycle"]:
            best[key] = r
    out = []
    knees = {}
    for prog in DSE_PROGRAMS:
        pts = sorted((lanes, r["elements_per_cycle"]) for (lanes, p), r in best.items() if p == prog)
        if pts:
            top = max(e for _, e in pts)
            knees[prog] = min(lanes for lanes, e in pts if e >= KNEE_FRACTION * top)
    for r in rows:
        r = dict(r)
        for prog in DSE_PROGRAMS:
            m = best.get((r["lanes"], prog))
            if m is None:
                continue
            e = m["elements_per_cycle"]
            r.update({f"{prog}_elem_per_cycle": e, f"{prog}_depth": m["depth"],
                      f"{prog}_utilisation": m["utilisation"],
                      f"{prog}_knee": knees.get(prog) == r["lanes"]})
            if r.get("cells_total"):
                r[f"{prog}_per_kcell"] = e / (r["cells_total"] / 1e3)
            if r.get("lut4"):
                r[f"{prog}_per_klut"] = e / (r["lut4"] / 1e3)
        out.append(r)
    return out


def clock_table(rows: list[dict], dse: dict, fmt: str = "bf16",
                tolerance: float = KNEE_FRACTION) -> list[dict]:
    """Measured throughput per area at every NME clock of a version-2 ``dse.json``.

    One dict per (standard, NME clock, program, lanes) with the best depth
    (:func:`coda.experiments.design_space.best_rows`): ``dram, nme_mhz`` (None: on the DRAM clock),
    ``program, lanes, depth, elements_per_ns, utilisation``; ``cells_total`` / ``lut4`` and
    ``per_kcell`` / ``per_klut`` (elements/ns per 1,000 generic cells / ECP5 LUT4s) where
    ``rows`` (:func:`collect`) has the lanes count in ``fmt``; ``ecp5_fmax_mhz`` where placed
    and routed and ``fmax_ok`` (that Fmax reaches the NME clock; None without a figure);
    ``knee`` (True on the knee of :func:`coda.experiments.design_space.knees` at ``tolerance``) and
    ``saturated`` (that clock's knee is DRAM-bound). ``[]`` for a version-1 file (no clocks).
    """
    from coda.experiments.design_space import best_rows, knees
    from coda.experiments.synth_area import perf_per_area

    if dse.get("version", 1) < 2:
        return []
    areas = {r["lanes"]: {k: r[k] for k in ("cells_total", "lut4", "fmax_mhz") if r.get(k)}
             for r in rows if r["fmt"] == fmt}
    kn = {(k["dram"], k["nme_mhz"], k["program"]): k
          for k in knees(dse.get("rows", []), tolerance)}
    out = []
    for r in perf_per_area(best_rows(dse.get("rows", [])), areas):
        k = kn[(r.get("dram"), r.get("nme_mhz"), r["program"])]
        fmax = areas.get(r["lanes"], {}).get("fmax_mhz")
        clk = r.get("nme_mhz_effective")
        out.append({**{key: r.get(key) for key in (
            "dram", "nme_mhz", "program", "lanes", "depth", "elements_per_ns", "utilisation",
            "cells_total", "lut4", "per_kcell", "per_klut") if key in r},
            "ecp5_fmax_mhz": fmax,
            "fmax_ok": None if fmax is None or clk is None else fmax >= clk,
            "knee": k["knee_lanes"] == r["lanes"], "saturated": k["saturated"]})
    return out


def print_clock_table(crow: list[dict]) -> None:
    """Rich table of :func:`clock_table` (the segment and residual add at every clock)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="measured DIMM-NMP throughput per area, per NME clock (best depth)")
    for col in ("standard", "NME MHz", "program", "lanes", "depth", "elem/ns", "util",
                "elem/ns per 1k cells", "elem/ns per 1k LUT4", "ECP5 Fmax", "knee"):
        table.add_column(col, justify="right")
    for r in crow:
        table.add_row(r["dram"], "dram" if r["nme_mhz"] is None else f"{r['nme_mhz']:g}",
                      r["program"], str(r["lanes"]), str(r["depth"]),
                      f"{r['elements_per_ns']:.3f}", f"{100 * r['utilisation']:.1f} %",
                      f"{r['per_kcell']:.4f}" if r.get("per_kcell") else "-",
                      f"{r['per_klut']:.4f}" if r.get("per_klut") else "-",
                      "-" if r["ecp5_fmax_mhz"] is None else
                      f"{r['ecp5_fmax_mhz']:.1f}" + ("" if r["fmax_ok"] else " (< clock)"),
                      ("knee" + ("" if r["saturated"] else " (NME-bound)")) if r["knee"] else "")
    Console(width=220).print(table)


def _bench_results(bench_dir: Path) -> list[dict]:
    """Throughput results the cosim bench left (any JSON under ``bench_dir``), as found."""
    found = []
    for path in sorted(bench_dir.glob("*.json")):
        try:
            found.append({"file": str(path), "data": json.loads(path.read_text())})
        except (OSError, json.JSONDecodeError):
            continue
    return found


def plot(rows: list[dict], path: Path, dram: str = "DDR4-3200") -> None:
    """Area vs lanes, and memory demand vs the rank's peak, per format (matplotlib PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = any(r.get("segment4_elem_per_cycle") for r in rows)
    fig, axes = plt.subplots(1, 3 if measured else 2, figsize=(16 if measured else 11, 4.2))
    ax_area, ax_bw = axes[0], axes[1]
    for fmt, marker in zip(FORMATS, ("o", "s")):
        mine = [r for r in rows if r["fmt"] == fmt]
        gen = [r for r in mine if r.get("cells_total")]
        lut = [r for r in mine if r.get("lut4")]
        if gen:
            ax_area.plot([r["lanes"] for r in gen], [r["cells_total"] for r in gen],
                         marker=marker, label=f"{fmt} generic cells")
        if lut:
            ax_area.plot([r["lanes"] for r in lut], [r["lut4"] for r in lut], marker=marker,
                         linestyle="--", label=f"{fmt} ECP5 LUT4")
        bw = [r for r in mine if r.get("demand_gbs")]
        if bw:
            ax_bw.plot([r["lanes"] for r in bw], [r["demand_gbs"] for r in bw], marker=marker,
                       label=f"{fmt} NME demand (lanes x 2 B x Fmax)")
    peak = rank_peak_bytes_per_s(dram) / 1e9
    ax_bw.axhline(peak, color="k", linestyle=":", label=f"{dram} rank peak {peak:.1f} GB/s")
    for ax, ylabel in ((ax_area, "cells / LUT4"), (ax_bw, "GB/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("lanes")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if measured:
        ax_pa = axes[2]
        for fmt, marker in zip(FORMATS, ("o", "s")):
            for prog, ls in zip(DSE_PROGRAMS, ("-", "--")):
                pts = [r for r in rows if r["fmt"] == fmt and r.get(f"{prog}_per_kcell")]
                if not pts:
                    continue
                ax_pa.plot([r["lanes"] for r in pts], [r[f"{prog}_per_kcell"] for r in pts],
                           marker=marker, linestyle=ls, label=f"{fmt} {prog}")
                for r in pts:
                    if r.get(f"{prog}_knee"):
                        ax_pa.annotate("knee", (r["lanes"], r[f"{prog}_per_kcell"]),
                                       textcoords="offset points", xytext=(4, 6), fontsize=7)
        ax_pa.set_xscale("log", base=2)
        ax_pa.set_yscale("log")
        ax_pa.set_xlabel("lanes")
        ax_pa.set_ylabel("elements / cycle / 1k generic cells")
        ax_pa.set_title("measured DIMM-NMP throughput per area")
        ax_pa.grid(True, which="both", alpha=0.3)
        ax_pa.legend(fontsize=7)
    ax_area.set_title("NME area (yosys)")
    ax_bw.set_title("memory-port demand vs DRAM rank bandwidth")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def print_table(rows: list[dict]) -> None:
    """Rich table of the sweep rows (after :func:`bandwidth_table`)."""
    from rich.console import Console
    from rich.table import Table

    cols = ("fmt", "lanes", "cells_total", "generic_ff", "logic_depth", "lut4", "ecp5_ff",
            "mult18", "bram", "device", "fmax_mhz", "f_clk_mhz", "demand_gbs", "gelem_s",
            "bound", "melem_s_per_klut", "melem_s_per_kcell",
            "residual_add_elem_per_cycle", "segment4_elem_per_cycle", "segment4_utilisation",
            "segment4_per_kcell")
    table = Table(title="NME synthesis sweep")
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        cells = []
        for col in cols:
            v = r.get(col)
            if isinstance(v, float):
                v = f"{v:.3g}"
            if col == "f_clk_mhz" and v is not None and r.get("f_from_lanes") != r["lanes"]:
                v = f"{v} (l{r['f_from_lanes']})"
            if col == "bound" and r.get("knee"):
                v = f"{v} <- knee"
            if col == "segment4_per_kcell" and v is not None and r.get("segment4_knee"):
                v = f"{v} <- knee"
            cells.append("" if v is None else str(v))
        table.add_row(*cells)
    Console(width=220).print(table)


@dataclass(frozen=True)
class AreaSweepConfig(RayOptions):
    """Every option of ``coda synth-sweep`` with its default (the one source of them; where
    its configurations run: :class:`coda.sweep.RayOptions`, as every sweep's).

    Checked when made, before any synthesis: ``--units`` (:meth:`record_units`), the seed and
    ``--timeout`` (:func:`coda.synth.flow.check_synth_options`), ``--dram``; ValueError naming
    the bad value."""
    lanes: tuple[int, ...] = option(LANES, "lanes counts of the sweep", nargs="+")
    fmts: tuple[str, ...] = option(FORMATS, "element formats of the sweep", nargs="+",
                                   choices=FORMATS)
    targets: tuple[str, ...] = option(("generic", "ecp5"), "synthesis targets of the sweep",
                                      nargs="+", choices=("generic", "ecp5"))
    ecp5_max_lanes: int = option(8, "place and route only up to this many lanes")
    timeout: float = option(None, "time limit of each tool run, in seconds", type=float,
                            default_text="no limit")
    dram: str = option(DDR4_3200.name, "DRAM preset for the bandwidth bound")
    root: Path = option(Path("build/synth/sweep"), "folder of the sweep's points")
    report_only: bool = option(False, "tabulate what exists")
    units: str = option(SWEEP_UNITS, "NME units of every configuration: register stages in "
                        "each FPMul, each FPAdd, after the buffers (5,7,1, the default NME's, "
                        "places and routes 8 lanes on ECP5 at about 100 MHz; 0,0,0 is "
                        "combinational)", metavar="M,A,O",
                        source="coda.cosim.nme.units.DEFAULT_UNITS")
    seed: int = option(1, "nextpnr placer seed")

    def __post_init__(self):
        self.record_units()
        check_synth_options(100.0, self.seed, self.timeout)
        get_standard(self.dram)

    def record_units(self) -> str:
        """``--units`` checked and written as every record writes it (``"M,A,O"``,
        :func:`coda.cosim.nme.units.units_label`); ValueError naming ``--units``."""
        return units_label(parse_units(self.units, "--units"))


#: the config of ``coda synth-sweep``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = AreaSweepConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda synth-sweep``: :class:`AreaSweepConfig` (where its configurations run
    included)."""
    add_options(parser, AreaSweepConfig)


def main(cfg: AreaSweepConfig) -> int:
    """Run the sweep of ``cfg`` (its :class:`AreaSweepConfig`; resuming), then tabulate,
    analyse bandwidth and plot. Returns 0. Bad options: ValueError before any synthesis
    (when ``cfg`` was made, the root folder here; ``coda: error:``, exit 2)."""
    units = cfg.record_units()
    root = check_output_path(cfg.root, "--root", folder=True)
    root.mkdir(parents=True, exist_ok=True)
    if not cfg.report_only:
        run_sweep(root, cfg.lanes, cfg.fmts, cfg.targets,
                  ecp5_max_lanes=cfg.ecp5_max_lanes, timeout_s=cfg.timeout,
                  workers=cfg.workers, sequential=cfg.sequential, address=cfg.address,
                  units=units, seed=cfg.seed)
    rows = bandwidth_table(collect(root, units), cfg.dram)
    dse_path = Path("build/bench/dse.json")
    if dse_path.exists():
        dse = json.loads(dse_path.read_text())
        crow = clock_table(rows, dse)
        rows = measured_table(rows, dse)
        print(f"measured throughput from {dse_path}")
    else:
        crow = []
        print(f"no {dse_path}: run `make bench` for measured throughput per area")
    print_table(rows)
    if crow:
        print_clock_table(crow)
    out = root.parent
    bench = _bench_results(Path("build/bench"))
    write_file(out / "sweep.json", json_text({"rows": rows, "dram": cfg.dram,
                                              "clock_rows": crow, "bench": bench},
                                             indent=1) + "\n")
    if rows:
        plot(rows, out / "sweep.png", cfg.dram)
    print(f"wrote {out / 'sweep.json'}" + (f", {out / 'sweep.png'}" if rows else ""))
    if bench:
        print(f"cosim bench results found: {[b['file'] for b in bench]}")
    return 0
