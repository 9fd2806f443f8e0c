"""The DIMM-NMP design space of one rank: the sweep, its rows and the knees.

:func:`sweep` (``coda bench`` unless ``--sweep-lanes ''``; ``coda sweep bench`` runs the same
points, :func:`sweep_kind`) measures lanes x buffer depth x NME clock x DRAM standard of one
DIMM-NMP rank (:mod:`coda.cosim.nmp.measure`), every point with the NME units ``"M,A,O"``
(:mod:`coda.cosim.nme.units`), and writes ``build/bench/dse.json`` with the knee per standard
and clock (:func:`knees`); its points run through the sweep engine (:mod:`coda.sweep`). What
each point measures, the units and the builds: :func:`sweep`. The tables and the plot of the
rows: :mod:`coda.experiments.design_space_report`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from coda.cosim.nme.units import COMBINATIONAL, DEFAULT_UNITS, parse_units, units_label
from coda.cosim.nmp.measure import PROGRAM_STREAMS, measure_nmp, mem_words
from coda.experiments.synth_area import SYNTH_ROOT, perf_per_area, synth_areas
from coda.hw.nme.isa import NMEConfig
from coda.jsonout import json_text
from coda.paths import write_file
from coda.hw.dram.standards import DEFAULT_STANDARD

SWEEP_LANES = (1, 2, 4, 8, 16, 32)
SWEEP_DEPTHS = (256,)
SWEEP_DRAMS = ("DDR5-4800", "DDR4-3200")
#: NME clocks of the sweep in MHz; 0 = the same-domain NME (on the DRAM clock, no crossing)
SWEEP_CLOCKS = (0.0, 100.0, 200.0, 400.0, 800.0, 1200.0)
#: bytes per stream of the sweep's programs (64 KiB, 32,768 elements: a 1-lane point at
#: 100 MHz stays seconds of simulation; the 2 x 2 figures use
#: :data:`coda.experiments.bench.NMP_STREAM_BYTES`)
SWEEP_STREAM_BYTES = 64 << 10
#: the knee rule's tolerance: the fewest lanes reaching this share of the best utilisation
KNEE_TOLERANCE = 0.95
#: NME units of the sweep, ``"M,A,O"``: FPMul / FPAdd / operand register stages
#: (:class:`~coda.hw.nme.isa.NMEConfig` ``mul_latency``, ``add_latency``, ``operand_latency``);
#: the default NME's (:data:`coda.cosim.nme.units.DEFAULT_UNITS`, the timing-closed preset);
#: records and rows that name none are the combinational ``0,0,0`` (from before the units)
SWEEP_UNITS = DEFAULT_UNITS
#: dse.json format: 1 (no key; one standard, NME on the DRAM clock), 2 (standard and NME
#: clock per row, knees, areas), 3 (the NME units of the sweep and of every row and knee)
DSE_VERSION = 3
#: the figures of a program in a row of :func:`dse_rows`
ROW_KEYS = ("elements", "cycles", "dram_cycles", "ns", "elements_per_ns", "cycles_per_element",
            "elements_per_cycle", "utilisation", "gbps")


# ----------------------------------------------------------------------------- clocks
def parse_clocks(text: str) -> list[float]:
    """``--sweep-clocks`` as MHz: comma-separated numbers, ``dram`` (or 0) for the
    same-domain NME. Raises ValueError naming a bad entry or an empty list."""
    out = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if tok.lower() in ("dram", "same", "0"):
            out.append(0.0)
            continue
        try:
            f = float(tok)
        except ValueError:
            raise ValueError(f"--sweep-clocks entry {tok!r}: expected MHz or 'dram'") from None
        if not f > 0 or f != f or f == float("inf"):
            raise ValueError(f"--sweep-clocks entry {tok!r}: expected a positive number of "
                             "MHz or 'dram'")
        out.append(f)
    if not out:
        raise ValueError("--sweep-clocks: expected at least one clock")
    return out


def clock_label(nme_mhz: float | None) -> str:
    """``'dram'`` for the same-domain NME (None or 0), else the MHz as ``'%g'``."""
    return "dram" if not nme_mhz else f"{nme_mhz:g}"


# ----------------------------------------------------------------------------- one point
def program_figures(m: dict, std) -> dict:
    """The figures of one program of a :func:`~coda.cosim.nmp.measure.measure_nmp` result
    ``m`` on one rank of ``std``: ``elements`` (output elements per rank), ``cycles`` (NME
    cycles), ``dram_cycles`` (tCK), ``ns``, ``elements_per_ns``, ``cycles_per_element`` /
    ``elements_per_cycle`` (NME cycles), ``utilisation`` (rank 0: DRAM bytes moved / peak
    bytes of the DRAM cycles, 0..1), ``gbps`` (rank 0, GB/s)."""
    r0 = m["ranks"][0]
    return {"elements": m["elements_per_rank"], "cycles": m["cycles"],
            "dram_cycles": m["dram_cycles"], "ns": m["ns"],
            "elements_per_ns": round(m["elements_per_rank"] / m["ns"], 5),
            "cycles_per_element": m["cycles_per_element"],
            "elements_per_cycle": round(m["elements_per_rank"] / m["cycles"], 4),
            "utilisation": r0["utilisation"], "gbps": r0["gbps"]}


def dse_point(params: dict, workdir: Path | None = None) -> dict:
    """One point of the design space: a 1 DIMM x 1 rank DIMM-NMP of ``params["dram"]`` with
    an NME of ``lanes`` lanes and ``depth`` words per stream block (``fmt``) on its own clock
    of ``nme_mhz`` MHz (0 or absent: on the DRAM clock, no crossing; that is a separate
    Verilator build, every other clock shares one build per lanes, depth, standard, units)
    and ``units`` (``"M,A,O"``, :func:`~coda.cosim.nme.units.parse_units`; absent:
    ``0,0,0``) register stages in its FPMul / FPAdd / operand path (``NMEConfig.mul_latency``
    / ``add_latency`` / ``operand_latency``), running the residual add and the 4-stream
    segment of :func:`~coda.cosim.nmp.measure.segment_programs` over ``stream_bytes`` bytes
    per stream. Returns, per program ``P`` in (residual_add, segment4), the figures of
    :func:`program_figures` as ``P.<name>`` (NME cycles, DRAM cycles, ns, elements per ns
    and per NME cycle, utilisation 0..1, GB/s per rank); ``nme_mhz_effective`` (the DRAM
    clock for the same-domain NME); ``timing``: simulated cycles per wall second and the
    build's seconds.
    Raises ValueError for a size the NME cannot take, a clock outside (0, DRAM clock] or
    units that are not three ints in range (all before any build)."""
    from coda.hw.dram.standards import get_standard
    from coda.hw.nmp import check_nme_mhz

    n_lanes, depth = int(params["lanes"]), int(params["depth"])
    if n_lanes < 1 or depth < 1:
        raise ValueError(f"lanes={n_lanes}, depth={depth}: expected >= 1")
    words = int(params["stream_bytes"]) // (2 * n_lanes)
    if words < 1:
        raise ValueError(f"stream_bytes={params['stream_bytes']}: expected at least one NME "
                         f"word ({2 * n_lanes} bytes at {n_lanes} lanes)")
    std = get_standard(params["dram"])
    raw = params.get("nme_mhz") or 0.0
    if raw < 0:
        raise ValueError(f"nme_mhz={raw!r}: expected a positive number of MHz, or 0 for the "
                         "NME on the DRAM clock")
    mhz = check_nme_mhz(raw, std) if raw else None
    # `coda sweep bench --param units=3,5,1` splits on the commas: say where the value goes
    try:
        mul, add, opnd = parse_units(units_label(params.get("units")))
    except ValueError as exc:
        raise ValueError(f"{exc}; with `coda sweep`, give units in a --grid TOML file "
                         "(units = [\"3,5,1\"]): --param splits on commas") from None
    cfg = NMEConfig(lanes=n_lanes, fmt=params["fmt"], depth=depth, mem_words=mem_words(words),
                    mul_latency=mul, add_latency=add, operand_latency=opnd)
    r = measure_nmp(cfg, std.name, 1, 1, stream_words=words, nme_mhz=mhz)
    figures = {"nme_mhz_effective": round(mhz or 1000.0 / std.tCK_ns, 3)}
    timing = {"build_seconds": r["build_seconds_recorded"]}
    for prog in PROGRAM_STREAMS:
        figures.update({f"{prog}.{k}": v for k, v in program_figures(r[prog], std).items()})
        timing[f"{prog}.sim_cycles_per_s"] = r[prog]["sim_cycles_per_s"]
    figures["timing"] = timing
    return figures


def sweep_kind():
    """The ``bench`` sweep kind (coda.sweep.SweepKind): the DIMM-NMP design space, one
    :func:`dse_point` per (lanes, depth, fmt, dram, stream_bytes, nme_mhz, units)."""
    import coda.cosim
    import coda.hw
    from coda.sweep import Param, SweepKind, sources_digest
    return SweepKind(
        name="bench", run=dse_point,
        version=sources_digest(Path(__file__).parent, Path(coda.cosim.__file__).parent,
                               Path(coda.hw.__file__).parent),
        description="DIMM-NMP design space: lanes x buffer depth x NME clock of one rank "
                    "(make bench)",
        params=(Param("lanes", int, 8), Param("depth", int, 256), Param("fmt", str, "bf16"),
                Param("dram", str, DEFAULT_STANDARD), Param("stream_bytes", int, SWEEP_STREAM_BYTES),
                Param("nme_mhz", float, 0.0,
                      help="NME clock in MHz; 0: on the DRAM clock (no crossing)"),
                Param("units", str, SWEEP_UNITS,
                      help="NME units M,A,O: FPMul / FPAdd / operand register stages "
                           "(mul_latency, add_latency, operand_latency)")),
        headline=("residual_add.elements_per_ns", "residual_add.utilisation",
                  "segment4.elements_per_ns", "segment4.utilisation", "segment4.gbps"))


# ----------------------------------------------------------------------------- rows, knees
def dse_rows(records: list[dict]) -> list[dict]:
    """The finished sweep records of :func:`sweep_kind` as the rows of ``dse.json``: one per
    (dram, units, nme_mhz, lanes, depth, program) with ``dram, units`` (``"M,A,O"``,
    :func:`~coda.cosim.nme.units.units_label`), ``nme_mhz`` (None: on the DRAM clock),
    ``nme_mhz_effective, lanes, depth, program``, the :data:`ROW_KEYS` figures,
    ``sim_cycles_per_s, build_seconds``.
    Records of the first sweep (no ``nme_mhz`` parameter, no ns) are rows on the DRAM clock;
    the figures they lack (``dram_cycles``, ``ns``, ``elements_per_ns``) are derived from
    their NME cycles = DRAM cycles. Records without ``units`` (before units were a
    parameter) are the combinational NME, ``0,0,0``. Raises ValueError for an ok record
    whose units are not :func:`~coda.cosim.nme.units.parse_units`'s."""
    from coda.hw.dram.standards import get_standard

    rows = []
    for rec in records:
        if rec["status"] != "ok":
            continue
        p, f, t = rec["params"], rec["figures"], rec.get("timing") or {}
        std = get_standard(p.get("dram", DEFAULT_STANDARD))
        mhz = p.get("nme_mhz") or None
        for prog in PROGRAM_STREAMS:
            vals = {k: f.get(f"{prog}.{k}") for k in ROW_KEYS}
            if vals["ns"] is None:          # a version-1 record: NME cycle = tCK
                vals["dram_cycles"] = vals["cycles"]
                vals["ns"] = round(vals["cycles"] * std.tCK_ns, 1)
                vals["elements_per_ns"] = round(vals["elements"] / vals["ns"], 5)
            rows.append({"dram": std.name, "units": units_label(p.get("units")),
                         "nme_mhz": mhz,
                         "nme_mhz_effective": f.get("nme_mhz_effective",
                                                    round(1000.0 / std.tCK_ns, 3)),
                         "lanes": p["lanes"], "depth": p["depth"], "program": prog, **vals,
                         "sim_cycles_per_s": t.get(f"{prog}.sim_cycles_per_s"),
                         "build_seconds": t.get("build_seconds")})
    return rows


def row_units(row: dict) -> str:
    """The NME units ``"M,A,O"`` of a row of :func:`dse_rows` or :func:`knees` (a row of a
    ``dse.json`` before units: ``0,0,0``, :data:`~coda.cosim.nme.units.COMBINATIONAL`)."""
    return row.get("units") or COMBINATIONAL


def by_units(rows: list[dict]) -> dict[str, list[dict]]:
    """``rows`` (of :func:`dse_rows` or :func:`knees`) split by their NME units
    (:func:`row_units`), in units order, each list in the order of ``rows``; ``{"0,0,0":
    []}`` for no rows (an empty table still has its title)."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(row_units(r), []).append(r)
    if not out:
        return {SWEEP_UNITS: []}
    return {u: out[u] for u in sorted(out, key=parse_units)}


def best_rows(rows: list[dict]) -> list[dict]:
    """Per (dram, units, nme_mhz, program, lanes) the row of the best depth (the most
    elements per ns; ties: the smaller depth), sorted by those keys (same-domain clock
    first)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r.get("dram"), row_units(r), r.get("nme_mhz"), r["program"], r["lanes"])
        b = best.get(key)
        if b is None or (r["elements_per_ns"], -r["depth"]) > (b["elements_per_ns"], -b["depth"]):
            best[key] = r
    return [best[k] for k in sorted(best, key=lambda k: (k[0] or "", k[1], k[2] or 0.0,
                                                         k[3], k[4]))]


def knees(rows: list[dict], tolerance: float = KNEE_TOLERANCE) -> list[dict]:
    """The knee per (standard, NME units, NME clock, program), derived from the sweep's rows.

    Rule: over the best depth per lanes count (:func:`best_rows`), the knee is the fewest
    lanes whose DRAM utilisation is at least ``tolerance`` times the best utilisation at that
    clock (``best_utilisation``); more lanes add area, not bandwidth. A knee is only a
    saturated rank when that best is itself DRAM-bound: ``saturated`` is True when
    ``best_utilisation >= tolerance * rank_best`` with ``rank_best`` the best utilisation of
    the program on that standard with those units at any clock of the rows (so a sweep of
    one clock is its own ``rank_best``: saturated by definition). Otherwise the NME port
    (lanes x 2 B x f) is the limit at every lanes count swept, the knee is just the widest
    NME, and ``lanes_to_saturate`` extrapolates linearly from the widest point:
    ``ceil(lanes_max * tolerance * rank_best / utilisation(lanes_max))`` (None when
    saturated).

    Returns one dict per (dram, units, nme_mhz, program), sorted like :func:`best_rows`:
    ``dram, units, nme_mhz, nme_mhz_effective, program, knee_lanes, knee_depth,
    knee_utilisation, knee_elements_per_ns, best_utilisation, rank_best, saturated,
    lanes_to_saturate, tolerance``. Raises ValueError for a tolerance outside (0, 1].
    """
    if not 0 < tolerance <= 1:
        raise ValueError(f"tolerance={tolerance!r}: expected 0 < tolerance <= 1")
    best = best_rows(rows)
    rank_best: dict[tuple, float] = {}
    for r in best:
        k = (r.get("dram"), row_units(r), r["program"])
        rank_best[k] = max(rank_best.get(k, 0.0), r["utilisation"])
    groups: dict[tuple, list[dict]] = {}
    for r in best:
        groups.setdefault((r.get("dram"), row_units(r), r.get("nme_mhz"), r["program"]),
                          []).append(r)
    out = []
    for (dram, units, mhz, prog), pts in groups.items():
        top = max(p["utilisation"] for p in pts)
        knee = min((p for p in pts if p["utilisation"] >= tolerance * top),
                   key=lambda p: p["lanes"])
        rb = rank_best[(dram, units, prog)]
        saturated = top >= tolerance * rb
        widest = max(pts, key=lambda p: p["lanes"])
        out.append({"dram": dram, "units": units, "nme_mhz": mhz,
                    "nme_mhz_effective": knee.get("nme_mhz_effective"), "program": prog,
                    "knee_lanes": knee["lanes"], "knee_depth": knee["depth"],
                    "knee_utilisation": knee["utilisation"],
                    "knee_elements_per_ns": knee["elements_per_ns"],
                    "best_utilisation": top, "rank_best": rb, "saturated": saturated,
                    "lanes_to_saturate": None if saturated else math.ceil(
                        widest["lanes"] * tolerance * rb / widest["utilisation"]),
                    "tolerance": tolerance})
    return out


# ----------------------------------------------------------------------------- the sweep
def sweep(lanes=SWEEP_LANES, depths=SWEEP_DEPTHS, fmt: str = "bf16",
          dram: str | tuple | list = SWEEP_DRAMS, stream_bytes: int = SWEEP_STREAM_BYTES,
          out: Path | None = None, *, clocks=SWEEP_CLOCKS, workers: int | None = None,
          sequential: bool = False, address: str | None = None,
          tolerance: float = KNEE_TOLERANCE, synth_root: Path = SYNTH_ROOT,
          units: str | tuple = SWEEP_UNITS) -> list[dict]:
    """Design-space exploration of one rank: NME lanes x buffer depth (words per stream
    block) x NME clock (MHz; 0 = on the DRAM clock) x DRAM standard(s) ``dram``, every point
    with the NME units ``units`` (``"M,A,O"`` or a tuple: FPMul / FPAdd / operand register
    stages, :func:`~coda.cosim.nme.units.parse_units`; default :data:`SWEEP_UNITS`, the
    default NME's).

    The design-space sweep :func:`sweep` (``coda bench`` unless ``--sweep-lanes ''``; ``coda sweep
    bench`` runs the same points): lanes x buffer depth x NME clock (MHz; 0, ``dram`` on the
    command line: the NME on the DRAM clock, no crossing) x DRAM standard (default DDR5-4800 and
    DDR4-3200) of one DIMM-NMP rank: elements per ns, NME and DRAM cycles, ns, GB/s and DRAM
    utilisation of the residual add and the 4-stream segment (:mod:`coda.cosim.nmp.measure`),
    written to ``build/bench/dse.json`` with the knee per standard and clock (:func:`knees`) and
    elements/ns per area where ``make synth-sweep`` left areas
    (:func:`coda.experiments.synth_area.perf_per_area`). Every point of the sweep has an NME with the
    units ``"M,A,O"`` (:mod:`coda.cosim.nme.units`; default the default NME's, ``5,7,1``,
    :data:`~coda.cosim.nme.units.DEFAULT_UNITS`): ``M`` register stages in each FPMul, ``A`` in each FPAdd and ``O`` operand stages after
    the buffers (:class:`~coda.hw.nme.isa.NMEConfig` ``mul_latency``, ``add_latency``,
    ``operand_latency``; ``5,7,1``, the deepest units, is the NME that places and routes on ECP5
    at about 100 MHz: docs/results.md, "ECP5 Fmax of the 8-lane NME"): the sweep parameter ``units``, named in the tables'
    titles and in ``dse.json``. Every (lanes, depth, standard, units) is one Verilator build for
    all its clocks (the clock is a plusarg) and one more for the same-domain NME (cached under
    ``build/cosim/``), so the first sweep takes a while; the points run through the sweep engine
    (:mod:`coda.sweep`): tasks on a local Ray, on a cluster or a plain loop, records in
    ``build/bench/dse/`` (a stopped sweep resumes).

    Every point is a :func:`dse_point` run by :func:`coda.sweep.run_sweep`: a task on Ray
    (local, ``workers`` CPUs, or the cluster at ``address``) or, with ``sequential``, a loop
    in this process. A clock above a standard's DRAM clock is left out for that standard
    (said on stdout). The points are ordered build by build: every clock of one (standard,
    lanes, depth) runs on the same cached Verilator model under ``build/cosim/`` (the NME
    clock is a plusarg), the same-domain clock on a second one. One rank suffices: the ranks
    of a DIMM-NMP run the same program in lockstep, each on its own DRAM, so per-rank cycles
    and bandwidth are those of the whole system (measured: the 2 x 2 system at lanes 8 /
    depth 256 gives exactly the cycles and utilisation of the 1 x 1 row, 88.15 % / 88.42 %).

    Returns the rows of :func:`dse_rows`. Point records go to ``<out without .json>/`` (the
    engine's ``results.jsonl``: a stopped sweep resumes where it was); ``out`` (JSON, when
    given) gets ``{"version": 3, "drams", "dram" (the first), "clocks", "fmt",
    "stream_bytes", "units", "rows", "knees"`` (:func:`knees` at ``tolerance``, with perf/area),
    ``"areas"`` (:func:`~coda.experiments.synth_area.synth_areas` of ``synth_root``, ``{}`` if
    none) ``}``.
    Raises ValueError for an empty lanes / depths / clocks / standards list, a clock
    below 0 or above every standard's DRAM clock, or bad ``units`` (before any point runs).
    """
    from coda.sweep import run_sweep

    drams = [dram] if isinstance(dram, str) else list(dram)
    lanes, depths, clocks = list(lanes), list(depths), [float(c) for c in clocks]
    for name, vals in (("lanes", lanes), ("depths", depths), ("clocks", clocks),
                       ("dram", drams)):
        if not vals:
            raise ValueError(f"sweep: {name} is empty, expected at least one value")
    units = units_label(units)
    kind = sweep_kind()
    points = _points(kind, lanes, depths, fmt, drams, stream_bytes, clocks, units)
    folder = (out.with_suffix("") if out else Path("build/bench/dse"))
    rows = dse_rows(run_sweep(kind, points, folder, workers=workers, sequential=sequential,
                              address=address))
    if out:
        write_dse(out, rows, drams, fmt, clocks, stream_bytes, tolerance, synth_root,
                  units=units)
    return rows


def _points(kind, lanes: list, depths: list, fmt: str, drams: list, stream_bytes: int,
            clocks: list[float], units: str) -> list[dict]:
    """The points of :func:`sweep`, build by build (every clock of one standard, lanes and
    depth in a row, the same-domain clock last), leaving out (and saying so) the clocks above
    a standard's DRAM clock. Raises ValueError for a clock below 0 or above every
    standard's DRAM clock."""
    from coda.hw.dram.standards import get_standard

    fastest = max(1000.0 / get_standard(s).tCK_ns for s in drams)
    for c in clocks:
        if c < 0 or c > fastest * (1 + 1e-9):
            raise ValueError(f"sweep: clock {c:g} MHz: expected 0 (on the DRAM clock) or up to "
                             f"the fastest standard's DRAM clock, {fastest:g} MHz")
    points = []
    for s in drams:
        top = 1000.0 / get_standard(s).tCK_ns
        over = [c for c in clocks if c > top * (1 + 1e-9)]
        if over:        # faster than this standard's DRAM clock: not a buffer-chip NME
            print(f"sweep: {s}: clocks {', '.join(f'{c:g}' for c in over)} MHz exceed its "
                  f"DRAM clock ({top:g} MHz), left out for it")
        points += [kind.full({"lanes": n, "depth": d, "fmt": fmt, "dram": s,
                              "stream_bytes": stream_bytes, "nme_mhz": c, "units": units})
                   for n in lanes for d in depths
                   for c in sorted(clocks, key=lambda c: (c == 0, c)) if c not in over]
    return points


def write_dse(out: Path, rows: list[dict], drams, fmt: str, clocks, stream_bytes: int,
              tolerance: float = KNEE_TOLERANCE, synth_root: Path = SYNTH_ROOT, *,
              units: str | tuple = SWEEP_UNITS) -> None:
    """Write ``dse.json`` (version :data:`DSE_VERSION`, keys of :func:`sweep`; ``units``: the
    sweep's NME units as ``"M,A,O"``) to ``out``. Raises ValueError for bad ``units``."""
    units = units_label(units)
    areas = synth_areas(synth_root, fmt, units)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, json_text({
        "version": DSE_VERSION, "drams": list(drams), "dram": list(drams)[0], "fmt": fmt,
        "clocks": list(clocks), "stream_bytes": stream_bytes, "units": units, "rows": rows,
        "knees": perf_per_area(knees(rows, tolerance), areas),
        "areas": {str(k): v for k, v in sorted(areas.items())}}, indent=1) + "\n")


def recorded_rows(folder: Path, lanes=None, depths=None, fmt: str = "bf16", drams=None,
                  stream_bytes: int = SWEEP_STREAM_BYTES, clocks=None,
                  units: str | tuple | None = SWEEP_UNITS) -> list[dict]:
    """The :func:`dse_rows` of the ``ok`` records already in ``folder/results.jsonl``, of any
    sources version (the records of an earlier code state, also version-1 records without
    an NME clock: the NME on the DRAM clock), newest per parameter set; only those matching
    ``fmt``, ``stream_bytes``, ``units`` (the NME units ``"M,A,O"``, default ``0,0,0``; a
    record without units is ``0,0,0``; None: any units) and, where given, ``lanes``,
    ``depths``, ``drams``, ``clocks`` (MHz, 0 = on the DRAM clock). For
    ``--sweep-report-only``: tables, JSON and plot without measuring. Raises ValueError
    (coda.sweep.read_results) for a file that is not this engine's records of the ``bench``
    kind, or for bad ``units``."""
    from coda.sweep import read_results

    want = None if units is None else units_label(units)
    newest: dict[str, dict] = {}
    for rec in read_results(folder, sweep_kind()):
        p = rec["params"]
        if rec["status"] != "ok":
            continue
        rec_units = units_label(p.get("units"))
        if p.get("fmt", "bf16") != fmt \
                or p.get("stream_bytes") != stream_bytes \
                or (lanes is not None and p["lanes"] not in lanes) \
                or (depths is not None and p["depth"] not in depths) \
                or (drams is not None and p.get("dram", DEFAULT_STANDARD) not in drams) \
                or (clocks is not None and float(p.get("nme_mhz") or 0.0) not in clocks) \
                or (want is not None and rec_units != want):
            continue
        newest[json.dumps({**{k: p.get(k) for k in ("lanes", "depth", "fmt", "dram",
                                                    "stream_bytes", "nme_mhz")},
                           "units": rec_units}, sort_keys=True)] = rec
    return dse_rows(list(newest.values()))
