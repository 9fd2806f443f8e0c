"""The design-space sweep on screen and in a figure: a table of every point, a table of the
knees with performance per area, and ``dse.png``.

The rows are those of :func:`coda.experiments.design_space.dse_rows`, the knees those of
:func:`coda.experiments.design_space.knees`; one table per NME units (titled with them,
:func:`coda.cosim.nme.units.units_title`). ``coda bench`` prints both tables and writes the
plot next to ``dse.json``.
"""

from __future__ import annotations

from pathlib import Path

from coda.experiments.design_space import (KNEE_TOLERANCE, best_rows, by_units, clock_label,
                                     row_units)
from coda.cosim.nme.units import parse_units, units_title
from coda.cosim.nmp.measure import PROGRAM_STREAMS
from coda.experiments.synth_area import SYNTH_ROOT, perf_per_area
from coda.hw.dram.standards import DEFAULT_STANDARD
from coda.paths import save_figure

__all__ = ["print_sweep", "print_knees", "plot_sweep"]


def print_sweep(rows: list[dict]) -> None:
    """The sweep as rich tables, one per NME units (titled with them, :func:`units_title`):
    one line per (standard, NME clock, lanes, depth), both programs side by side: elements
    per ns, DRAM utilisation (%) and GB/s per rank."""
    from rich.console import Console
    from rich.table import Table

    for units, mine in by_units(rows).items():
        t = Table(title=f"DIMM-NMP design space (per rank), {units_title(units)}")
        for col in ("standard", "NME MHz", "lanes", "depth", "add elem/ns", "add util",
                    "add GB/s", "seg4 elem/ns", "seg4 util", "seg4 GB/s"):
            t.add_column(col, justify="right")
        by = {(r.get("dram"), r.get("nme_mhz"), r["lanes"], r["depth"], r["program"]): r
              for r in mine}
        for dram, mhz, lanes, depth in sorted({k[:4] for k in by},
                                              key=lambda k: (k[0] or "", k[1] or 0.0, k[2],
                                                             k[3])):
            cells = [dram or "-", clock_label(mhz), str(lanes), str(depth)]
            for prog in ("residual_add", "segment4"):
                r = by.get((dram, mhz, lanes, depth, prog))
                cells += ([f"{r['elements_per_ns']:.3f}", f"{100 * r['utilisation']:.1f} %",
                           f"{r['gbps']:.2f}"] if r else ["-"] * 3)
            t.add_row(*cells)
        Console(width=200).print(t)


def print_knees(knee_rows: list[dict], areas: dict[int, dict]) -> None:
    """The knee per (standard, clock, program) (:func:`~coda.experiments.design_space.knees`) with
    performance per area (:func:`~coda.experiments.synth_area.perf_per_area` of ``areas``; says so
    when there are none: no synthesis results under
    :data:`~coda.experiments.synth_area.SYNTH_ROOT`), one table per NME units (titled with them,
    :func:`~coda.cosim.nme.units.units_title`)."""
    from rich.console import Console
    from rich.table import Table

    tol = knee_rows[0]["tolerance"] if knee_rows else KNEE_TOLERANCE
    c = Console(width=200)
    for units, mine in by_units(knee_rows).items():
        t = Table(title=f"knee per clock: fewest lanes within {100 * tol:.0f} % of the best "
                        f"utilisation at that clock, {units_title(units)}")
        for col in ("standard", "NME MHz", "program", "knee lanes", "depth", "util", "elem/ns",
                    "best util", "DRAM-bound", "lanes to saturate", "elem/ns per 1k cells",
                    "elem/ns per 1k LUT4"):
            t.add_column(col, justify="right")
        for k in perf_per_area(mine, areas):
            t.add_row(k["dram"] or "-", clock_label(k["nme_mhz"]), k["program"],
                      str(k["knee_lanes"]), str(k["knee_depth"]),
                      f"{100 * k['knee_utilisation']:.1f} %",
                      f"{k['knee_elements_per_ns']:.3f}",
                      f"{100 * k['best_utilisation']:.1f} %", "yes" if k["saturated"] else "no",
                      "-" if k["lanes_to_saturate"] is None else f">= {k['lanes_to_saturate']}",
                      f"{k['per_kcell']:.4f}" if "per_kcell" in k else "-",
                      f"{k['per_klut']:.4f}" if "per_klut" in k else "-")
        c.print(t)
    if not areas:
        c.print(f"perf/area: no synthesis results under {SYNTH_ROOT} (run `make synth-sweep`); "
                "area columns left empty")


def plot_sweep(rows: list[dict], path: Path, dram: str | None = None) -> None:
    """Per standard, elements per ns (upper) and DRAM utilisation in % (lower) against lanes,
    one line per NME clock (best depth per lanes, :func:`~coda.experiments.design_space.best_rows`),
    one column per program, with the rank's DRAM ceiling (peak GB/s / (2 B x streams)) on the
    elements-per-ns axes (PNG); the NME units in the figure's title
    (:func:`~coda.cosim.nme.units.units_title`), and with rows of several units one line per
    units and clock, each labelled with its units. ``dram``: only that standard (default:
    every standard in ``rows``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from coda.hw.dram.standards import get_standard

    best = best_rows(rows)
    units_sets = list(by_units(best))
    stds = [dram] if dram else sorted({r.get("dram") or DEFAULT_STANDARD for r in best})
    fig, axes = plt.subplots(2 * len(stds), 2, figsize=(10, 6 * len(stds)), sharex=True,
                             squeeze=False)
    for s, name in enumerate(stds):
        std = get_standard(name)
        for col, prog in enumerate(("residual_add", "segment4")):
            top, bottom = axes[2 * s, col], axes[2 * s + 1, col]
            mine = [r for r in best if (r.get("dram") or DEFAULT_STANDARD) == std.name
                    and r["program"] == prog]
            for units, mhz in sorted({(row_units(r), r.get("nme_mhz") or 0.0) for r in mine},
                                     key=lambda k: (parse_units(k[0]), k[1])):
                pts = sorted((r["lanes"], r) for r in mine if (r.get("nme_mhz") or 0.0) == mhz
                             and row_units(r) == units)
                label = ("same domain" if not mhz else f"{mhz:g} MHz")
                if len(units_sets) > 1:
                    label += f", units {units}"
                x = [p[0] for p in pts]
                top.plot(x, [p[1]["elements_per_ns"] for p in pts], "o-", label=label)
                bottom.plot(x, [100 * p[1]["utilisation"] for p in pts], "o-", label=label)
            streams = PROGRAM_STREAMS[prog]
            top.axhline(std.peak_gbps / (2 * streams), color="r", linestyle="--",
                        label=f"DRAM peak / ({streams} x 2 B)")
            top.set_title(f"{std.name} {prog}")
            top.set_ylabel("elements / ns / rank")
            bottom.set_ylabel(f"{std.name} utilisation (%)")
            bottom.set_xlabel("NME lanes")
            for ax in (top, bottom):
                ax.set_xscale("log", base=2)
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=7)
            top.set_yscale("log", base=2)
    fig.suptitle("; ".join(units_title(u) for u in units_sets), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    plt.close(fig)
