"""``coda sim``: latency and energy of a cached generation on a GPU + PCIe + DIMM-NMP machine,
for the six systems of the CODA ablation and the forecast's history over PCIe (g), for the
shipped model or a paper-scale video DiT.

:func:`simulate` traces the model's shapes on the meta device (cached under
``build/system/shapes``), builds the schedule (:func:`coda.host.system.schedules.resolve`),
synthesises the generation's operator events in the segments' form and the cache mode
(:mod:`coda.host.system.workload`), replays them as systems a..g and writes
``DIR/report.json``, ``DIR/timeline.png`` and ``DIR/breakdown.png``, and prints a table
(what the report holds: ``docs/system-model.md``). :func:`paper_scale` gives ``coda run``
the same schedule at the paper-scale target, :func:`sim_argv` its command line.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from coda.host.cache.compress import CACHE_FORMATS
from coda.host.cache.forecast import CACHE_MODES
from coda.host.cache.policies.uniform import DEFAULT_INTERVAL, DEFAULT_WARMUP
from coda.hw.dram.standards import DEFAULT_STANDARD, STANDARDS
from coda.host.model.defaults import DEFAULT_STEPS
from coda.hw.nme.isa import NMEConfig
from coda.hw.nmp import NMP_DEPTH
from coda.jsonout import json_text
from coda.paths import write_file
from coda.options import add_options, option

from .parallel import PARALLEL_MODES
from .platforms import DEFAULT_PLATFORM, GPU_LINKS, GPUS, PCIE_PRESETS
from .presets import model_names
from .prices import PriceConfig
from .prices import prices as price_table

#: the diffusion schedulers of every modelled model have 1000 training timesteps
MAX_STEPS = 1000

__all__ = ["configure", "main", "simulate", "checked_simulate", "parse_systems", "sweep_point",
           "sweep_kind", "setup", "workload", "cache_summary", "SimConfig", "PAPER_SCALE",
           "paper_scale", "sim_argv"]

DEFAULT_SHAPE_CACHE = Path("build/system/shapes")


@dataclass(frozen=True)
class SimConfig(PriceConfig):
    """Every option of ``coda sim`` with its default (the one source of them: :func:`setup`,
    :func:`simulate` and :func:`checked_simulate` read their defaults here); the prices of
    the cost per video from :class:`coda.host.system.prices.PriceConfig`."""
    model: str = option("wan2.1-14b", f"one of {', '.join(model_names())}")
    resolution: str = option(None, "480p, 720p or WIDTHxHEIGHT", type=str,
                             default_text="720p; the shipped Lattes: 32x32")
    seconds: float = option(None, "video length", type=float, unit="s",
                            default_text="4 s; fixed-length models: their frame count")
    frames: int = option(None, "frames instead of --seconds", type=int,
                         default_text="from --seconds")
    steps: int = option(DEFAULT_STEPS, "denoising steps", unit="steps",
                        source="coda.host.model.defaults.DEFAULT_STEPS")
    platform: str = option(DEFAULT_PLATFORM, f"GPU: one of {', '.join(GPUS)}")
    dram: str = option(DEFAULT_STANDARD, "host DIMMs: " + ", ".join(STANDARDS))
    dimms: int = option(2, "DIMMs")
    ranks: int = option(2, "ranks per DIMM, one NME each (a DDR5 rank = one 32-bit "
                        "subchannel, as in coda.hw.dram.standards)")
    lanes: int = option(NMEConfig.lanes, "NME lanes", source="coda.hw.nme.isa.NMEConfig")
    depth: int = option(NMP_DEPTH, "NME buffer depth", unit="words",
                        source="coda.hw.nmp.NMP_DEPTH, the DIMM-NMP's")
    nme_mhz: float = option(None, "the NMEs' own clock, as coda nme run --nme-mhz", type=float,
                            unit="MHz", default_text="the DRAM command clock, 2,400 MHz for "
                            "DDR5-4800")
    schedule: str = option("uniform", "uniform, coda (the shipped searched schedule) or a "
                           "Schedule JSON file (transferred to the model)")
    interval: int = option(DEFAULT_INTERVAL, "uniform: recompute every k steps, as coda run",
                           unit="steps")
    intervals: str = option("", "uniform: per operator type, e.g. cross_attn=6,temporal_attn=4 "
                            "(types of the shipped model; each model operator has one)")
    warmup: int = option(DEFAULT_WARMUP, "uniform: first steps always computed, as coda run",
                         unit="steps")
    system: str = option("all", "a..g, several (e.g. c,e,f) or all")
    prefetch: int = option(1, "operators of H2D prefetch look-ahead", unit="operators")
    segment_output: str = option("sum", "what an NMP segment returns (systems d-f): sum (as "
                                 "the cache engine: the gates go down, z = sum g*c comes up, "
                                 "the GPU adds the residual) or residual (x down, y = x + sum "
                                 "g*c up)", choices=("sum", "residual"))
    cache: str = option(CACHE_MODES[0], "what a reused operator contributes: reuse (its last "
                        "computed output) or forecast ((1+alpha) c_k - alpha c_k' of its last "
                        "two: two cached tensors read per forecast term, two entries per "
                        "operator, stores for either of the next two steps)",
                        choices=CACHE_MODES, source="coda.host.cache.forecast.CACHE_MODES")
    cache_format: str = option(CACHE_FORMATS[0], "what a cache entry is stored as: bf16 or "
                               "int8 (q packed two per 16-bit element and one 16-bit scale "
                               "per --cache-group channels: 0.5 + 1/G of the bytes in the "
                               "footprint, stores and loads; segments run segment_int8)",
                               choices=CACHE_FORMATS,
                               source="coda.host.cache.compress.CACHE_FORMATS")
    cache_group: int = option(None, "int8: G, channels per scale (a divisor of the hidden "
                              "size C, a multiple of --lanes)", type=int, unit="channels",
                              default_text="the largest multiple of the lanes up to 64 "
                              "dividing C (coda.host.cache.compress.resolve_group)")
    gpu_table: str = option(None, "measured xPU times (coda calibrate --out FILE) instead of "
                            "the roofline where the table has them; refused unless measured "
                            "for the simulated model, resolution and frames", type=str,
                            default_text="none: the roofline of the --platform preset")
    pcie: str = option(None, "the GPU's host link: " + ", ".join(PCIE_PRESETS) + " (PCIe "
                       "generation and lanes)", type=str, choices=tuple(PCIE_PRESETS),
                       default_text="the GPU preset's own (PCIe 4.0 x16; Gen5 x16 for the "
                       "H100, H20 and H200)", source="coda.host.system.platforms.PCIE_PRESETS")
    gpus: int = option(1, "GPUs on one generation, each with its own PCIe link, DIMMs and "
                       "NMEs (--dimms x --ranks per GPU)")
    parallel: str = option("none", "how the GPUs split a generation: none (one GPU), cfg "
                           "(a CFG branch per GPU), ulysses or ring (sequence shards), "
                           "cfg+ulysses", choices=PARALLEL_MODES,
                           source="coda.host.system.parallel.PARALLEL_MODES")
    gpu_link: str = option("pcie4-p2p", "the link between the GPUs: " + ", ".join(GPU_LINKS),
                           choices=tuple(GPU_LINKS),
                           source="coda.host.system.platforms.GPU_LINKS")
    utilisation: float = option(None, "fraction of its working life the machine generates "
                                "videos", type=float, group="cost per video",
                                default_text="1, coda.host.system.prices.SOURCES")
    out: str = option("out-sim", "output folder")


#: the configuration ``coda sim`` hands to :func:`main` (coda.cli)
CONFIG = SimConfig


def configure(parser) -> None:
    add_options(parser, SimConfig)


def parse_systems(text: str) -> str:
    """``"all"``, ``"a"``..``"g"`` or a comma list -> the letters in order.
    Raises ValueError naming the value."""
    from .replay import SYSTEMS

    t = str(text).strip().lower()
    if t == "all":
        return "".join(SYSTEMS)
    parts = [p.strip() for p in t.replace(",", " ").split()]
    if not parts or any(p not in SYSTEMS for p in parts):
        raise ValueError(f"--system {text!r}: expected one of {', '.join(SYSTEMS)}, a comma "
                         "list of them, or all")
    return "".join(s for s in SYSTEMS if s in parts)


def simulate(model: str, *, resolution=None, seconds=None, frames=None,
             steps: int = SimConfig.steps, gpu: str = SimConfig.platform,
             dram: str = SimConfig.dram, dimms: int = SimConfig.dimms,
             ranks: int = SimConfig.ranks, lanes: int = SimConfig.lanes,
             depth: int = SimConfig.depth, nme_mhz: float | None = None,
             schedule: str = SimConfig.schedule, interval: int = SimConfig.interval,
             warmup: int = SimConfig.warmup, intervals: dict | None = None,
             systems: str = "abcdefg", prefetch: int = SimConfig.prefetch,
             segment_output: str = SimConfig.segment_output, cache: str = SimConfig.cache,
             cache_format: str = SimConfig.cache_format,
             cache_group: int | None = SimConfig.cache_group,
             shape_cache: Path | None = DEFAULT_SHAPE_CACHE, record: bool = True,
             gpu_table=None, layers: int | None = None, gpus: int = SimConfig.gpus,
             parallel: str = SimConfig.parallel, gpu_link: str = SimConfig.gpu_link,
             pcie: str | None = SimConfig.pcie, prices=None, **platform_overrides) -> dict:
    """Everything ``coda sim`` computes, as a dict (no files). ``segment_output``: the NMP
    segments' form (:data:`coda.host.nmp.link.SEGMENT_OUTPUTS`, ``--segment-output``);
    ``cache``: the cache mode (:data:`coda.host.cache.forecast.CACHE_MODES`, ``--cache``);
    ``cache_format``, ``cache_group``: the entries' format and int8 G (``--cache-format``,
    ``--cache-group``; G default :func:`coda.host.cache.compress.resolve_group` of the
    model's hidden size, :mod:`coda.host.system.formats`); ``gpu_table``: a table of
    measured xPU times (a path or a :class:`~coda.host.system.gputable.GpuTimes`,
    ``--gpu-table``) that replaces the roofline where it has entries; ``layers``: the model
    cut to that many blocks per block list (:func:`coda.host.system.presets.model_shape`;
    a check at a small size, as ``scripts/gpu_check.py`` runs one); ``gpus``, ``parallel``,
    ``gpu_link``: several GPUs on the generation (:mod:`coda.host.system.parallel`;
    ``gpus=1, parallel="none"`` is the one-GPU model, unchanged); ``pcie``: a host link of
    :data:`~coda.host.system.platforms.PCIE_PRESETS` instead of the GPU's own (``--pcie``);
    ``prices``: a :class:`~coda.host.system.prices.Prices` (None: the GPU preset's sourced
    prices, :func:`coda.host.system.prices.prices`): every system that fits gains ``cost``,
    its cost per video (:func:`coda.host.system.prices.video_cost`: ``usd``, its capital and
    energy parts, USD), and the report ``prices``. With several GPUs the
    report gains ``parallel`` (the layout, the link and its sources), ``one_gpu`` (systems
    a..g on one GPU: ``latency_s``, ``energy_j``) and per system ``speedup_vs_1gpu``,
    ``p2p_bytes``, ``p2p_s``, ``p2p_j``; ``memory`` is one GPU's.

    Returns ``{"report": JSON-able report, "ablation": run_ablation's result, "workload":
    the Workload}`` (with several GPUs ``"device_workload"``: one GPU's shard). Raises
    ValueError for bad input (message names the flag).
    """
    from .ablation import run_ablation
    from .schedules import resolve

    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"--steps {steps}: expected 1..{MAX_STEPS} (the models' schedulers "
                         f"have {MAX_STEPS} training timesteps)")
    if prefetch < 0:
        raise ValueError(f"--prefetch {prefetch}: expected >= 0")
    if cache not in CACHE_MODES:
        raise ValueError(f"--cache {cache!r}: expected one of {', '.join(CACHE_MODES)}")
    from .parallel import gpu_link as link_of, layout, run_parallel, shard_shape

    layout(gpus, parallel, None)      # the flags' own checks before the model is traced
    link = link_of(gpu_link)
    if pcie is not None:
        if pcie not in PCIE_PRESETS:
            raise ValueError(f"--pcie {pcie!r}: expected one of {', '.join(PCIE_PRESETS)}")
        platform_overrides = {**platform_overrides, "pcie": PCIE_PRESETS[pcie]}
    t0 = time.perf_counter()
    shape, plat = setup(model, resolution=resolution, seconds=seconds, frames=frames, gpu=gpu,
                        dram=dram, dimms=dimms, ranks=ranks, lanes=lanes, depth=depth,
                        nme_mhz=nme_mhz, shape_cache=shape_cache, gpu_table=gpu_table,
                        layers=layers, **platform_overrides)
    t_shape = time.perf_counter() - t0
    sched = resolve(schedule, shape, steps, interval=interval, warmup=warmup,
                    intervals=intervals)
    lay = layout(gpus, parallel, shape)
    t0 = time.perf_counter()
    wl = workload(shape, plat, sched, segment_output, cache, cache_format, cache_group)
    wl_dev = wl if lay.gpus == 1 else workload(shard_shape(shape, lay.sp), plat, sched,
                                               segment_output, cache, cache_format,
                                               cache_group)
    t_events = time.perf_counter() - t0
    if lay.gpus == 1:
        abl = run_ablation(wl, plat, systems, prefetch=prefetch, record=record)
    else:
        abl = run_parallel(wl_dev, plat, lay, link, systems, prefetch=prefetch,
                           record=record)
    pr = prices if prices is not None else price_table(gpu)
    _add_costs(abl["systems"], plat, pr, lay.gpus)
    report = {
        "model": shape.describe(),
        "cache_bytes": wl.cache_bytes,
        "cache": cache_summary(wl),
        "cache_bytes_per_branch": wl.cache_bytes_per_branch(),
        "cache_bytes_all_ops_per_branch": shape.all_ops_cache_bytes(1),
        "steps": steps,
        "schedule": {**sched.describe(), "transferred": sched.source.startswith("transferred")},
        "platform": plat.describe(),
        "replay": {"prefetch": prefetch, "nme_timing": "model",
                   **_gpu_timing(plat, abl["results"].values()),
                   "segment_output": segment_output, "cache": cache,
                   "cache_format": wl.cache_format, "cache_group": wl.cache_group},
        "memory": {k: v for k, v in abl["memory"].items() if k != "fits"},
        "systems": abl["systems"],
        "simulation_s": {"shapes": round(t_shape, 3), "events": round(t_events, 3),
                         "replay": round(abl["sim_s"], 3)},
        "sources": plat.sources(),
        "prices": pr.describe(),
        "model_source": shape.source,
        "assumptions": _ASSUMPTIONS,
    }
    if lay.gpus > 1:
        one = run_ablation(wl, plat, systems, prefetch=prefetch, record=False)["systems"]
        _add_costs(one, plat, pr, 1)
        report["one_gpu"] = {s: ({"latency_s": r["latency_s"], "energy_j": r["energy_j"],
                                  "cost": r["cost"]}
                                 if r["fits"] else {"fits": False, "reason": r["reason"]})
                             for s, r in one.items()}
        for s, r in report["systems"].items():
            if r["fits"]:
                r["speedup_vs_1gpu"] = (one[s]["latency_s"] / r["latency_s"]
                                        if one.get(s, {}).get("fits") else None)
        report["parallel"] = {**lay.describe(), "gpu_link": link.name,
                              "gpu_link_bw": link.bw, "gpu_link_latency_s": link.latency_s,
                              "per_gpu": "its own PCIe link, --dimms x --ranks DIMMs with "
                                         "NMEs, a copy of the weights",
                              "sources": link.sources}
        report["assumptions"] = _ASSUMPTIONS + _PARALLEL_ASSUMPTIONS
    return {"report": report, "ablation": abl, "workload": wl, "shape": shape,
            "device_workload": wl_dev}


def _add_costs(rows: dict, plat, pr, gpus: int) -> None:
    """Each fitting system's row of :func:`~coda.host.system.ablation.run_ablation` gains
    ``cost``: the cost per video on ``gpus`` GPUs of ``plat`` at prices ``pr``
    (:func:`coda.host.system.prices.video_cost`)."""
    from .prices import machine_capital, video_cost

    for s, r in rows.items():
        if r.get("fits"):
            r["cost"] = video_cost(r["latency_s"], r["energy_j"],
                                   machine_capital(plat, pr, s, gpus), pr)


#: The paper-scale target of ``coda run``'s summary: ``coda sim``'s model, size, length, GPU
#: and DRAM defaults (:class:`SimConfig`: Wan 2.1-14B, 720p x 4 s, the edge GPU preset,
#: DDR5-4800) on 4 DIMMs x 8 ranks, the machine docs/system-model.md and the README's ``coda
#: sim`` example use: the smallest there that holds Wan 2.1-14B's bf16 reuse cache
#: (SimConfig's 2 x 2 ranks do not; docs/system-model.md has the footprints).
PAPER_SCALE = {"model": SimConfig.model, "dimms": 4, "ranks": 8}
#: the systems a paper-scale row keeps (the rest of a coda sim report is one command away)
_PAPER_FIGURES = ("name", "fits", "reason", "latency_s", "energy_j", "speedup",
                  "energy_efficiency", "speedup_vs_c")


def sim_argv(**options) -> list[str]:
    """The ``coda sim`` command line (without ``--out``) of :func:`checked_simulate`'s
    keyword ``options`` (SimConfig field names; None values left out), e.g. for a report
    to say how to reproduce its figures."""
    names = {f.name for f in dataclasses.fields(SimConfig)}
    argv = ["sim"]
    for k, v in options.items():
        if k not in names:
            raise ValueError(f"{k}={v!r}: not an option of coda sim (SimConfig)")
        if v is not None:
            argv += ["--" + k.replace("_", "-"), str(v)]
    return argv


def paper_scale(schedule: str, *, steps: int = SimConfig.steps,
                interval: int = SimConfig.interval, warmup: int = SimConfig.warmup,
                cache: str = SimConfig.cache, cache_format: str = SimConfig.cache_format,
                note: str | None = None,
                shape_cache: Path | None = DEFAULT_SHAPE_CACHE) -> dict:
    """A schedule of the shipped model transferred to the paper-scale target
    (:data:`PAPER_SCALE`) and replayed as systems a..g: exactly :func:`checked_simulate`
    with those options, so ``coda sim`` with the returned ``argv`` computes the same figures.

    Args:
        schedule: ``coda sim --schedule``'s value: ``"uniform"`` (with ``interval``,
            ``warmup``), ``"coda"`` or a Schedule JSON file of the shipped model.
        steps: denoising steps. cache, cache_format: the cache mode and entry format (int8:
            the target's default G, :func:`coda.host.cache.compress.resolve_group`).
        note: a caveat of the transfer for the label (e.g. what the schedule leaves out).
    Returns:
        JSON-able dict: ``label`` (one line naming model, size, GPU, machine and schedule),
        ``argv`` (the ``coda sim`` arguments), ``model`` (name, width, height, frames),
        ``platform`` (:meth:`~coda.host.system.platforms.Platform.describe`), ``schedule``
        (as ``coda sim``'s report), ``systems`` (letter -> :data:`_PAPER_FIGURES`: seconds,
        joules, ratios against a and c, or ``fits: false`` with ``reason``).
    Raises ValueError as :func:`checked_simulate` (the message names the flag)."""
    options = dict(model=PAPER_SCALE["model"], steps=steps, dimms=PAPER_SCALE["dimms"],
                   ranks=PAPER_SCALE["ranks"], schedule=schedule, cache=cache,
                   cache_format=cache_format)
    if schedule == "uniform":
        options.update(interval=interval, warmup=warmup)
    res = checked_simulate(**options, shape_cache=shape_cache)
    report = res["report"]
    m, plat = report["model"], report["platform"]
    label = (f"the same schedule on {m['name']} {m['width']}x{m['height']}, {m['frames']} "
             f"frames, {steps} steps, {plat['gpu']} + {plat['dimms']} DIMMs x "
             f"{plat['ranks']} ranks of {plat['dram']}: schedule "
             f"{report['schedule']['name']}"
             f"{' (transferred)' if report['schedule']['transferred'] else ''}, "
             f"{report['schedule']['ops_skipped_fraction']:.0%} of operators reused"
             + (f"; {note}" if note else ""))
    return {"label": label, "argv": sim_argv(**options),
            "model": {k: m[k] for k in ("name", "width", "height", "frames")},
            "platform": plat, "schedule": report["schedule"],
            "systems": {s: {k: r[k] for k in _PAPER_FIGURES if k in r}
                        for s, r in report["systems"].items()}}


def _gpu_timing(plat, results) -> dict:
    """``gpu_timing``: ``"roofline"`` without measured times; with them ``"measured"`` only
    if the table had every kernel the replayed systems looked up, ``"partly measured"``
    if some kept the roofline, ``"roofline"`` if none was found there; ``gpu_lookups``: those
    kernels counted (distinct per system, summed over the systems)."""
    if plat.gpu_times is None:
        return {"gpu_timing": "roofline"}
    measured = sum(r.gpu_measured for r in results)
    roofline = sum(r.gpu_roofline for r in results)
    timing = ("roofline" if not measured else "measured" if not roofline
              else "partly measured")
    return {"gpu_timing": timing, "gpu_lookups": {"measured": measured, "roofline": roofline}}


def setup(model: str, *, resolution=None, seconds=None, frames=None,
          gpu: str = SimConfig.platform, dram: str = SimConfig.dram, dimms: int = SimConfig.dimms,
          ranks: int = SimConfig.ranks, lanes: int = SimConfig.lanes,
          depth: int = SimConfig.depth, nme_mhz: float | None = None,
          shape_cache: Path | None = DEFAULT_SHAPE_CACHE, gpu_table=None,
          layers: int | None = None, **platform_overrides):
    """``coda sim``'s model and machine: (:class:`~coda.host.system.shapes.ModelShape`,
    :class:`~coda.host.system.platforms.Platform`), with its defaults (720p but for the
    shipped model; 4 s but for the fixed-length Latte models); ``gpu_table`` (a path or a
    :class:`~coda.host.system.gputable.GpuTimes`) goes into the platform after its check
    against the shape. Raises ValueError for bad input (message names the flag), e.g. a
    hidden size that is not a multiple of ``lanes`` or a table measured at another shape."""
    from .gputable import GpuTimes
    from .platforms import platform
    from .presets import model_shape, shipped_presets

    times = (None if gpu_table is None else gpu_table if isinstance(gpu_table, GpuTimes)
             else GpuTimes.load(gpu_table))
    plat = platform(gpu, dram, dimms, ranks, lanes=lanes, depth=depth, nme_mhz=nme_mhz,
                    gpu_times=times, **platform_overrides)
    shipped = model in shipped_presets()
    if resolution is None and not shipped:
        resolution = "720p"
    if seconds is None and frames is None and not shipped and model != "latte-1":
        seconds = 4
    shape = model_shape(model, resolution, seconds, frames, cache_dir=shape_cache,
                        layers=layers)
    if shape.hidden % lanes:
        raise ValueError(f"--lanes {lanes}: the NME needs the hidden size {shape.hidden} of "
                         f"{model} to be a multiple of its lanes")
    if times is not None:
        times.check_shape(shape)
    return shape, plat


def workload(shape, plat, sched, segment_output: str = "sum", cache: str = "reuse",
             cache_format: str = SimConfig.cache_format,
             cache_group: int | None = SimConfig.cache_group, samples: int = 1):
    """The :class:`~coda.host.system.workload.Workload` of one generation of ``shape`` under
    the :class:`~coda.host.system.schedules.ModelSchedule` ``sched`` on ``plat``'s DIMM-NMP
    (synthesised events), its segments of form ``segment_output``, its cache in mode
    ``cache``, its entries ``cache_format`` (int8: G ``cache_group``, default
    :func:`coda.host.cache.compress.resolve_group` of the hidden size; ValueError naming G
    and C for a bad one). ``samples``: videos generated together in one batched generation
    (rows per branch, each with its own cache entries and segments; every transformer call
    carries all of a step's rows, as a batched pipeline call does); ValueError below 1."""
    if int(samples) < 1:
        raise ValueError(f"samples {samples!r}: expected >= 1")
    from .formats import cache_group as resolve
    from .workload import from_events, synthesize

    group = resolve(cache_format, shape.hidden, plat.lanes, cache_group)
    for c in sorted({o.channels for o in shape.ops} - {shape.hidden}) if group else ():
        resolve(cache_format, c, plat.lanes, group)
    log = synthesize(shape, sched, n_ranks=plat.n_ranks, lanes=plat.lanes, depth=plat.depth,
                     samples=int(samples), segment_output=segment_output, cache=cache,
                     cache_group=group)
    return from_events(log, shape, segment_output=segment_output, cache=cache,
                       cache_group=group)


def cache_summary(wl) -> dict:
    """The report's ``cache``: ``mode`` (:data:`coda.host.cache.forecast.CACHE_MODES`),
    ``history`` (entries kept per stored operator), ``bytes`` (the footprint, B),
    ``reused_ops`` (reused operator executions, all rows), ``forecast_terms`` (those read
    as forecast terms: two cached tensors), ``format`` (bf16 or int8), ``group`` (int8's G,
    else None) and ``entry_ratio`` (an entry's bytes against bf16's: 1 or 0.5 + 1/G)."""
    reused = sum(a.reused for calls in wl.calls for c in calls for acts in c.actions
                 for a in acts)
    out = {"mode": wl.cache, "history": wl.history, "bytes": wl.cache_bytes,
           "reused_ops": reused, "forecast_terms": wl.forecast_terms,
           "format": wl.cache_format, "group": wl.cache_group,
           "entry_ratio": wl.entry_ratio}
    if wl.cache == "forecast" and wl.source == "synthesized":
        out["note"] = ("no alpha table for this model: every reuse with two earlier computed "
                       "steps is a forecast term, alpha = 0 steps included (the engine runs "
                       "those as plain reuses), an upper bound of the forecast's cost")
    return out


_ASSUMPTIONS = [
    "GPU kernel time: roofline per traced kernel with per-class efficiencies (platforms.py); "
    "with --gpu-table the times measured by coda calibrate where the table has them "
    "(platform.gpu_times says which; gputable.py)",
    "NME time: cycle model of the compiled program, bounded by the DIMM-NMP DRAM utilisation "
    "measured in the cosimulation (nme.py)",
    "while the NMEs run a segment they own their ranks: host copies to those ranks wait",
    "segments of > 8 terms chain NME launches in rank memory (one round trip per segment, "
    "the paper's coalescing), as NMPDriver.segment_submit runs them",
    "cache forecast: two cached tensors (NME terms, or PCIe loads in c) per reused operator "
    "with two earlier computed steps, two entries per stored operator in the footprint; "
    "g reads the older entry over PCIe and adds it on the GPU",
    "cache_format int8: every entry 0.5 + 1/G of the bf16 bytes (footprint, stores, c/g "
    "loads, b's cache kernels); segments run segment_int8 (4 micro-ops, 3 streams a term, "
    "7 terms a launch; cycle model of that program), at the DRAM utilisation measured for "
    "bf16 segments of the same terms (int8 programs have no DRAM-timed measurement)",
    "segment_output sum (the cache engine's default): a segment sends gates and commands "
    "down, z = sum g*c up, and the GPU adds it to the residual stream (an elementwise "
    "kernel); residual: x down, y up",
    "c prefetches cached outputs one operator ahead (double buffering)",
    "weights that do not fit next to the activations are streamed per operator over PCIe",
    "GPU power while stalled: the RTX 4090 nvidia-smi figure; other GPUs the same fraction",
    "host CPU, DIMM background power, text encoder and VAE are outside the model",
]


_PARALLEL_ASSUMPTIONS = [
    "several GPUs: every GPU its own PCIe link, DIMMs and NMEs; the GPUs on their own ports "
    "of a switch (GPU_LINKS); the GPUs of a sequence-parallel group in lockstep on equal "
    "shards (one replayed for the group); kernels do 1/N of the work, weights replicated",
    "Ulysses: two all-to-alls around every sequence attention (Q, K, V; output) the GPU "
    "waits for; ring: K, V passes overlapped with the attention's blocks, the excess "
    "waited for; the GPU draws its stalled power while it waits",
    "CFG parallel: the noise predictions exchanged after every step; sequence shards "
    "gathered once at the end for the VAE",
]


def checked_simulate(*, model: str, resolution=None, seconds=None, frames=None,
                     steps: int = SimConfig.steps, platform: str | None = None,
                     dram: str = SimConfig.dram, dimms: int = SimConfig.dimms,
                     ranks: int = SimConfig.ranks, lanes: int = SimConfig.lanes,
                     depth: int = SimConfig.depth, nme_mhz: float | None = None,
                     schedule: str = SimConfig.schedule, interval: int = SimConfig.interval,
                     intervals: str = SimConfig.intervals, warmup: int = SimConfig.warmup,
                     system: str = SimConfig.system, prefetch: int = SimConfig.prefetch,
                     segment_output: str = SimConfig.segment_output,
                     cache: str = SimConfig.cache,
                     cache_format: str = SimConfig.cache_format,
                     cache_group: int | None = SimConfig.cache_group,
                     gpu_table: str | None = SimConfig.gpu_table,
                     gpus: int = SimConfig.gpus, parallel: str = SimConfig.parallel,
                     gpu_link: str = SimConfig.gpu_link, pcie: str | None = SimConfig.pcie,
                     price_gpu: float | None = None, price_dram_gb: float | None = None,
                     price_nme: float | None = None, usd_per_kwh: float | None = None,
                     lifetime_years: float | None = None, utilisation: float | None = None,
                     shape_cache: Path | None = DEFAULT_SHAPE_CACHE) -> dict:
    """:func:`simulate` after ``coda sim``'s checks of its flags (counts >= 1, one of
    seconds / frames, the prices: :func:`coda.host.system.prices.prices`), with ``system``
    and ``intervals`` as the command line writes them. Returns simulate's dict plus
    ``systems`` (the letters) and ``wall_s``. Raises ValueError naming the flag."""
    from coda.host.nmp.link import SEGMENT_OUTPUTS

    from .schedules import parse_intervals

    systems = parse_systems(system)
    if segment_output not in SEGMENT_OUTPUTS:
        raise ValueError(f"--segment-output {segment_output!r}: expected one of "
                         f"{', '.join(SEGMENT_OUTPUTS)}")
    counts = {"steps": steps, "dimms": dimms, "ranks": ranks, "lanes": lanes, "depth": depth,
              "interval": interval, "warmup": warmup}
    for flag, value in counts.items():
        if value < 1:
            raise ValueError(f"--{flag} {value}: expected >= 1")
    if seconds is not None and frames is not None:
        raise ValueError("--seconds and --frames: give one of them")
    pr = price_table(platform or DEFAULT_PLATFORM, price_gpu=price_gpu,
                     price_dram_gb=price_dram_gb, price_nme=price_nme, usd_per_kwh=usd_per_kwh,
                     lifetime_years=lifetime_years, utilisation=utilisation)
    t0 = time.perf_counter()
    res = simulate(model, resolution=resolution, seconds=seconds, frames=frames, steps=steps,
                   gpu=platform or DEFAULT_PLATFORM, dram=dram, dimms=dimms, ranks=ranks,
                   lanes=lanes, depth=depth, nme_mhz=nme_mhz, schedule=schedule,
                   interval=interval,
                   warmup=warmup, intervals=parse_intervals(intervals), systems=systems,
                   prefetch=prefetch, segment_output=segment_output, cache=cache,
                   cache_format=cache_format, cache_group=cache_group,
                   gpu_table=gpu_table, gpus=gpus, parallel=parallel, gpu_link=gpu_link,
                   pcie=pcie, prices=pr, shape_cache=shape_cache)
    res["report"]["wall_s"] = round(time.perf_counter() - t0, 3)
    res["systems"] = systems
    return res


def main(cfg: SimConfig) -> int:
    """Run ``coda sim`` as ``cfg`` says (what the command line gave, or a :class:`SimConfig`
    built in Python, e.g. ``main(SimConfig(steps=10, out="/tmp/sim"))``): simulate the
    systems (:func:`checked_simulate`), write ``report.json``, ``timeline.png`` and
    ``breakdown.png`` to ``--out`` and print the table. Returns 0; a bad option: ValueError
    naming it, before any file."""
    from rich.console import Console

    from coda.paths import check_output_path
    from coda.results import record

    from .plots import breakdown_bars, pick_steps, timeline

    out = check_output_path(cfg.out, "--out", folder=True)
    console = Console(width=max(Console().width, 150))
    options = dataclasses.asdict(cfg)
    del options["out"]
    res = checked_simulate(**options)
    systems = res["systems"]
    report, abl, wl = res["report"], res["ablation"], res["workload"]
    out.mkdir(parents=True, exist_ok=True)
    write_file(out / "report.json", json_text(_jsonable(report), indent=1) + "\n")
    steps = pick_steps(wl, 2)
    sh = res["shape"]
    clock = f", NMEs at {cfg.nme_mhz:g} MHz" if cfg.nme_mhz is not None else ""
    title = (f"{sh.name} {sh.width}x{sh.height} {sh.frames} frames, {report['steps']} steps, "
             f"{cfg.platform} + {cfg.dimms}x{cfg.ranks} {cfg.dram}{clock}; steps {steps}")
    timeline({s: r for s, r in abl["results"].items() if s in systems}, steps,
             out / "timeline.png", title)
    breakdown_bars(report["systems"], out / "breakdown.png", title)
    console.print(_table(report, out))
    figures = {}
    for s, r in report["systems"].items():
        if r["fits"]:
            figures[f"{s} {r['name']}: latency (s)"] = round(r["latency_s"], 1)
            figures[f"{s} {r['name']}: energy (kJ)"] = round(r["energy_j"] / 1e3, 2)
            figures[f"{s} {r['name']}: speedup over a"] = round(r["speedup"], 3)
    record("sim", title, figures, pictures={"GPU, PCIe and NME activity over two steps":
                                            out / "timeline.png",
                                            "time per system": out / "breakdown.png"})
    for s, r in report["systems"].items():
        if not r["fits"]:
            console.print(f"{s} does not fit: {r['reason']}")
    return 0


def _table(report: dict, out: Path):
    from rich.table import Table

    m, cache, par = report["model"], report["cache"], report.get("parallel")
    fmt = cache["format"] + ("" if cache["group"] is None else f" G={cache['group']}")
    t = Table(title=(f"coda sim: {m['name']} {m['width']}x{m['height']}, {m['frames']} frames, "
                     f"{report['steps']} steps, cache {report['cache_bytes'] / 1e9:.1f} GB "
                     f"({cache['mode']}, {fmt}), "
                     f"schedule {report['schedule']['name']}"
                     f"{' (transferred)' if report['schedule']['transferred'] else ''}, "
                     f"{report['replay']['segment_output']} segments"
                     + (f", {par['gpus']} GPUs {par['mode']} over {par['gpu_link']}"
                        if par else "")),
              caption=f"report: {out / 'report.json'}; $/video: the machine's price "
                      "amortised over the generation plus its electricity (report: prices, "
                      "with sources); speedup / energy efficiency against a "
                      "and c; GPU stalls on NMEs / PCIe as % of latency"
                      + ("; x 1 GPU: against the same system on one GPU; stall link: one "
                         "GPU's wait on the other GPUs" if par else ""))
    cols = ("system", "s", "s/step", "kJ", "$/video", "x a", "x c", "E x a", "E x c", "PCIe GB",
            "GPU busy", "stall NME", "stall PCIe") + (("x 1 GPU", "stall link") if par else ())
    for col in cols:
        t.add_column(col, justify="left" if col == "system" else "right")
    for s, r in report["systems"].items():
        if not r["fits"]:
            t.add_row(f"{s} {r['name']} [{r['cache']}]", "does not fit", *[""] * (len(cols) - 2))
            continue
        f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"   # noqa: E731
        b, lat = r.get("breakdown") or {}, r["latency_s"] or 1.0
        pct = lambda k: f"{100 * b[k] / lat:.1f} %" if k in b else "-"   # noqa: E731
        t.add_row(f"{s} {r['name']} [{r['cache']}]", f(r["latency_s"], 1),
                  f(r["latency_per_step_s"], 3),
                  f(r["energy_j"] / 1e3, 1), _usd(r["cost"]["usd"]), f(r["speedup"]),
                  f(r["speedup_vs_c"]),
                  f(r["energy_efficiency"]), f(r["energy_efficiency_vs_c"]),
                  f(r["pcie_bytes"] / 1e9, 0), f"{100 * r['gpu_busy_fraction']:.1f} %",
                  pct("stall_nme_s"), pct("stall_pcie_s"),
                  *((f(r["speedup_vs_1gpu"]), f"{100 * r['p2p_s'] / lat:.1f} %") if par
                    else ()))
    return t


def _usd(v) -> str:
    """A cost for the table: three significant digits, ``-`` without a price."""
    return "-" if v is None else f"{v:.3g}"


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    return obj


# ----------------------------------------------------------------------------- sweeps
#: figures of each system a..f kept per sweep point (``coda sweep sim``)
SWEEP_FIGURES = ("fits", "latency_s", "energy_j", "speedup", "energy_efficiency",
                 "speedup_vs_c", "energy_efficiency_vs_c", "pcie_bytes", "speedup_vs_1gpu",
                 "p2p_bytes")


def sweep_point(params: dict, workdir: Path) -> dict:
    """One ``coda sweep sim`` point: :func:`checked_simulate` with ``params`` (the flags of
    ``coda sim`` by their Python names); writes ``workdir/report.json``. Returns the flat
    figures ``cache_bytes`` and ``<system>.<figure>`` for each system and SWEEP_FIGURES
    (seconds, joules, bytes, ratios) and ``<system>.cost_usd`` (the cost per video, USD;
    None without a GPU price), plus ``timing`` (the simulation's wall seconds)."""
    shape_cache = Path(workdir).resolve().parent.parent / "shapes"
    res = checked_simulate(**params, shape_cache=shape_cache)
    report = res["report"]
    write_file(Path(workdir) / "report.json", json_text(_jsonable(report), indent=1) + "\n")
    figures = {"cache_bytes": report["cache_bytes"]}
    for letter, r in report["systems"].items():
        for k in SWEEP_FIGURES:
            if k in r:
                figures[f"{letter}.{k}"] = r[k]
        if "cost" in r:
            figures[f"{letter}.cost_usd"] = r["cost"]["usd"]
    figures["timing"] = {"wall_s": report["wall_s"], **report["simulation_s"]}
    return _jsonable(figures)


_TYPES = {"int": int, "float": float, "str": str}
#: SimConfig's options that are not sweep parameters (the NME clock is the DRAM's in a sweep;
#: a measured table belongs to one model and size)
_NOT_SWEPT = ("nme_mhz", "gpu_table", "out")


def sweep_kind():
    """The ``sim`` sweep kind (coda.sweep.SweepKind): models x resolutions x platforms x
    DIMM counts x schedules ... of the system model, one point per ``coda sim`` run."""
    import coda.hw
    from coda.sweep import Param, SweepKind, sources_digest

    return SweepKind(
        name="sim", run=sweep_point, description=__doc__.splitlines()[0],
        version=sources_digest(Path(__file__).parent, Path(coda.hw.__file__).parent,
                               Path(__file__).parent.parent / "nmp" / "link.py"),
        params=tuple(Param(f.name, _TYPES[f.type], f.default)
                     for f in dataclasses.fields(SimConfig) if f.name not in _NOT_SWEPT),
        headline=("cache_bytes", "a.latency_s", "c.latency_s", "f.latency_s", "f.speedup",
                  "f.speedup_vs_c", "f.energy_efficiency"))
