"""Figures of the system model (matplotlib, Agg backend): a timeline of GPU / PCIe / NME
activity over one or two steps with the segments shaded (as the paper's utilisation
figure), and a stacked time-breakdown bar per system."""

from __future__ import annotations

from pathlib import Path

from coda.paths import save_figure

__all__ = ["timeline", "breakdown_bars", "pick_steps"]

_LANES = ("gpu", "h2d", "d2h", "nme")
_LANE_LABEL = {"gpu": "GPU", "h2d": "PCIe H2D", "d2h": "PCIe D2H", "nme": "NMEs"}
_COLORS = {"compute": "#1f77b4", "other": "#7f7f7f", "cache_op": "#17becf", "store": "#ff7f0e",
           "load": "#d62728", "weights": "#bcbd22", "x": "#9467bd", "y": "#8c564b",
           "segment": "#2ca02c", "monitor": "#e377c2"}


def pick_steps(workload, count: int = 2) -> list[int]:
    """``count`` consecutive steps starting at the first step that reuses something (the
    first step otherwise)."""
    for calls in workload.calls:
        for c in calls:
            if any(a.reused for acts in c.actions for a in acts):
                s = c.step
                return list(range(s, min(workload.num_steps, s + count)))
    return list(range(min(count, workload.num_steps)))


def timeline(results: dict, steps: list[int], path: Path, title: str = "") -> Path:
    """Busy intervals of each system's resources over ``steps`` (one panel per system,
    time from the first of those steps, segments shaded). ``results``: letter ->
    SystemResult (with intervals)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    systems = [s for s in results if results[s].intervals]
    if not systems:                        # nothing replayed (e.g. no requested system fits)
        fig, ax = plt.subplots(figsize=(8, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, "no requested system fits: nothing to plot", ha="center")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_figure(fig, path, dpi=100)
        plt.close(fig)
        return path
    fig, axes = plt.subplots(len(systems), 1, figsize=(12, 1.5 + 1.3 * len(systems)),
                             squeeze=False)
    for ax, s in zip(axes[:, 0], systems):
        res = results[s]
        ivs = [iv for iv in res.intervals if iv.step in steps]
        if not ivs:
            continue
        t0 = min(iv.start for iv in ivs)
        t1 = max(iv.end for iv in ivs)
        scale, unit = _unit(t1 - t0)
        for lane_i, lane in enumerate(_LANES):
            for kind in _COLORS:
                bars = [((iv.start - t0) * scale, (iv.end - iv.start) * scale)
                        for iv in ivs if iv.lane == lane and iv.kind == kind]
                if bars:
                    ax.broken_barh(bars, (len(_LANES) - 1 - lane_i - 0.4, 0.8),
                                   facecolors=_COLORS[kind], linewidth=0)
        for iv in ivs:
            if iv.lane == "nme":
                ax.axvspan((iv.start - t0) * scale, (iv.end - t0) * scale, color="#2ca02c",
                           alpha=0.12, linewidth=0)
        ax.set_yticks(range(len(_LANES)))
        ax.set_yticklabels([_LANE_LABEL[l] for l in reversed(_LANES)], fontsize=8)
        ax.set_xlim(0, (t1 - t0) * scale)
        ax.set_title(f"{s}: {res.name}", fontsize=9, loc="left")
        ax.set_xlabel(f"time from step {steps[0]} ({unit})", fontsize=8)
    handles = [Patch(color=c, label=k) for k, c in _COLORS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7,
               frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def breakdown_bars(rows: dict, path: Path, title: str = "") -> Path:
    """Stacked bar per system: GPU busy, GPU waiting on the NMEs, on PCIe, other idle (s)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("gpu_busy_s", "GPU compute", "#1f77b4"), ("stall_nme_s", "waiting on NMEs", "#2ca02c"),
            ("stall_pcie_s", "waiting on PCIe", "#d62728"), ("idle_other_s", "other idle", "#7f7f7f")]
    systems = [s for s, r in rows.items() if r.get("fits") and r.get("breakdown")]
    fig, ax = plt.subplots(figsize=(1.2 + 1.0 * max(1, len(systems)), 4))
    scale, unit = _unit(max((rows[s]["latency_s"] for s in systems), default=1.0))
    bottom = [0.0] * len(systems)
    for key, label, color in keys:
        vals = [rows[s]["breakdown"][key] * scale for s in systems]
        ax.bar(systems, vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel(f"generation latency ({unit})")
    ax.legend(fontsize=7)
    not_fit = [s for s, r in rows.items() if not r.get("fits")]
    if not_fit:
        ax.set_xlabel("does not fit: " + ", ".join(not_fit), fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def _unit(seconds: float) -> tuple[float, str]:
    if seconds >= 1:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"
