"""The design space's performance per area: the NME's area per lanes count, read from the
synthesis sweep's reports, joined to measured throughput.

``make synth-sweep`` (:mod:`coda.experiments.area_sweep`) leaves one ``report.json`` per synthesised
configuration under ``build/synth/sweep/points/`` (:data:`SYNTH_ROOT`); :func:`synth_areas`
reads them by path (the synthesis flow sits above the cosimulation and is not imported
here) and :func:`perf_per_area` divides elements per ns by those areas, for the rows and knees
of the design-space sweep (:mod:`coda.experiments.design_space`) and for the synthesis sweep's own
tables.
"""

from __future__ import annotations

import json
from pathlib import Path

from coda.cosim.nme.units import COMBINATIONAL, units_label

__all__ = ["SYNTH_ROOT", "synth_areas", "config_units", "fmax_below", "perf_per_area"]

#: where :func:`synth_areas` looks for the synthesis sweep's reports (``make synth-sweep``)
SYNTH_ROOT = Path("build/synth/sweep")


def config_units(cfg: dict) -> str:
    """The ``"M,A,O"`` NME units of a synthesis report's ``config`` (an
    :class:`~coda.hw.nme.isa.NMEConfig` as a dict; absent latencies, as in reports from before
    the pipelined units: 0)."""
    return units_label(tuple(int(cfg.get(k) or 0) for k in
                             ("mul_latency", "add_latency", "operand_latency")))


def synth_areas(root: Path = SYNTH_ROOT, fmt: str = "bf16",
                units: str | tuple = COMBINATIONAL) -> dict[int, dict]:
    """Area per lanes count from the synthesis sweep's reports (``make synth-sweep``:
    ``root/points/*/report.json``) of format ``fmt`` and NME ``units`` ``"M,A,O"``
    (:func:`config_units`): ``{lanes: {"cells_total": yosys generic cells, "lut4": ECP5
    LUT4s, "fmax_mhz": ECP5 Fmax in MHz}}``, each key only where that target was
    synthesised (ECP5: of the seed with the best Fmax); ``{}`` when there are none (no
    synthesis sweep run yet). Raises ValueError for bad ``units``."""
    want = units_label(units)
    areas: dict[int, dict] = {}
    for path in sorted(Path(root).glob("points/*/report.json")):
        try:
            report = json.loads(path.read_text())
            cfg, target = report["config"], report["target"]
            res = report[target]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if cfg.get("fmt") != fmt or config_units(cfg) != want:
            continue
        a = areas.setdefault(int(cfg["lanes"]), {})
        if target == "generic" and res.get("cells_total"):
            a["cells_total"] = res["cells_total"]
        elif target == "ecp5" and res.get("lut4") and not fmax_below(res, a):
            a["lut4"] = res["lut4"]
            if res.get("fmax_mhz"):
                a["fmax_mhz"] = res["fmax_mhz"]
    return areas


def fmax_below(res: dict, kept: dict) -> bool:
    """An ECP5 report ``res`` whose Fmax is below that of the one ``kept`` for the same
    configuration: several placer seeds of one netlist (``make synth-sweep --seed``) give the
    same area and different Fmax, and the best one counts."""
    return (res.get("fmax_mhz") or 0.0) < (kept.get("fmax_mhz") or 0.0)


def perf_per_area(rows: list[dict], areas: dict[int, dict]) -> list[dict]:
    """``rows`` (any dicts with ``lanes`` and ``elements_per_ns``) with performance per area
    where the lanes count has an area in ``areas`` (:func:`synth_areas`):
    ``per_kcell`` = elements/ns per 1,000 yosys generic cells, ``per_klut`` = elements/ns per
    1,000 ECP5 LUT4s (that is, G elements/s per 1k cells / LUT4s), plus ``cells_total`` /
    ``lut4``; absent keys where there is no area. Rows of
    :func:`~coda.experiments.design_space.knees` use ``knee_lanes`` / ``knee_elements_per_ns``."""
    out = []
    for r in rows:
        r = dict(r)
        lanes = r.get("lanes", r.get("knee_lanes"))
        e = r.get("elements_per_ns", r.get("knee_elements_per_ns"))
        a = areas.get(lanes, {})
        if a.get("cells_total"):
            r["cells_total"] = a["cells_total"]
            r["per_kcell"] = e / (a["cells_total"] / 1e3)
        if a.get("lut4"):
            r["lut4"] = a["lut4"]
            r["per_klut"] = e / (a["lut4"] / 1e3)
        out.append(r)
    return out
