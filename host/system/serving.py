"""``coda serve``: a stream of generation requests on a cluster of GPU machines, on SimPy as
the rest of the system model: latency percentiles and throughput against arrival rate, per
scheduling policy.

:func:`serve` simulates Poisson arrivals of request classes on workers (GPU groups, one
request at a time to completion, no preemption, no batching) under a policy
(:data:`POLICIES`), each class's service time being its one-generation replay
(:func:`service_time`, once per class); :func:`serve_curve` runs it per policy and rate and
:func:`main` writes ``DIR/serving.json`` and ``DIR/serving.png``. The model, the policies and
the figures written: ``docs/system-model.md``, "Serving".
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

from coda.hw.dram.standards import DEFAULT_STANDARD, STANDARDS
from coda.jsonout import json_text
from coda.options import add_options, option
from coda.paths import write_file

from .parallel import PARALLEL_MODES
from .platforms import DEFAULT_PLATFORM, GPU_LINKS, GPUS
from .presets import model_names
from .replay import SYSTEMS

__all__ = ["POLICIES", "RequestClass", "ServeConfig", "parse_mix", "service_time", "serve",
           "serve_curve", "configure", "main"]

#: the scheduling policies: ``fcfs`` (first come, first served) and ``sjf`` (shortest job
#: first: the waiting request with the shortest service time, ties by arrival), both
#: non-preemptive
POLICIES = ("fcfs", "sjf")
#: most requests one simulation takes (its arrays are held in memory)
MAX_REQUESTS = 1_000_000


@dataclass(frozen=True)
class RequestClass:
    """One kind of request: the model's video at ``resolution`` (``480p``, ``720p`` or
    ``WxH``) with ``steps`` denoising steps, drawn with relative ``weight``."""
    resolution: str
    steps: int
    weight: float

    @property
    def name(self) -> str:
        return f"{self.resolution}@{self.steps}"


@dataclass(frozen=True)
class ServeConfig:
    """Every option of ``coda serve`` with its default (the one source of them)."""
    model: str = option("wan2.1-1.3b", f"one of {', '.join(model_names())}")
    seconds: float = option(None, "video length of every request", type=float, unit="s",
                            default_text="4 s; fixed-length models: their frame count")
    mix: str = option("480p:50:0.5,720p:50:0.5", "request classes RESOLUTION:STEPS:WEIGHT, "
                      "comma-separated")
    platform: str = option(DEFAULT_PLATFORM, f"GPU: one of {', '.join(GPUS)}")
    dram: str = option(DEFAULT_STANDARD, "host DIMMs of every GPU: " + ", ".join(STANDARDS))
    dimms: int = option(4, "DIMMs per GPU")
    ranks: int = option(8, "ranks per DIMM, one NME each")
    schedule: str = option("uniform", "cache schedule of every request, as coda sim")
    system: str = option("f", "the system every GPU is (a..g, as coda sim)",
                         choices=tuple(SYSTEMS))
    gpus: int = option(4, "GPUs in the cluster")
    per_request: int = option(1, "GPUs one request runs on (a divisor of --gpus)")
    parallel: str = option("none", "how a request's GPUs split it (as coda sim --parallel)",
                           choices=PARALLEL_MODES)
    gpu_link: str = option("pcie4-p2p", "the link between a request's GPUs",
                           choices=tuple(GPU_LINKS))
    rates: str = option("10,20,30", "arrival rates, comma-separated", unit="requests/h")
    requests: int = option(1000, "requests per simulation")
    policy: str = option("fcfs,sjf", f"scheduling policies, comma-separated: {', '.join(POLICIES)}")
    seed: int = option(0, "seed of the arrivals and the class draws")
    out: str = option("out-serve", "output folder")


def parse_mix(text: str) -> list[RequestClass]:
    """``--mix`` -> request classes. Raises ValueError naming the bad item: not
    ``RESOLUTION:STEPS:WEIGHT``, steps < 1, a weight <= 0, a class given twice."""
    out = []
    for item in (t.strip() for t in str(text).split(",") if t.strip()):
        parts = item.split(":")
        try:
            res, steps, weight = parts[0], int(parts[1]), float(parts[2])
            if len(parts) != 3:
                raise IndexError
        except (IndexError, ValueError):
            raise ValueError(f"--mix {text!r}: item {item!r}: expected RESOLUTION:STEPS:WEIGHT, "
                             "e.g. 480p:50:0.5") from None
        if steps < 1 or not weight > 0 or not np.isfinite(weight):
            raise ValueError(f"--mix {text!r}: item {item!r}: expected steps >= 1 and a "
                             "finite weight > 0")
        c = RequestClass(res, steps, weight)
        if any(o.name == c.name for o in out):
            raise ValueError(f"--mix {text!r}: class {c.name} given twice")
        out.append(c)
    if not out:
        raise ValueError(f"--mix {text!r}: expected at least one RESOLUTION:STEPS:WEIGHT")
    return out


def _floats(text: str, flag: str) -> list[float]:
    try:
        vals = [float(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        vals = []
    if not vals or any(not (v > 0 and np.isfinite(v)) for v in vals):
        raise ValueError(f"--{flag} {text!r}: expected comma-separated numbers > 0")
    return vals


def service_time(model: str, cls: RequestClass, *, system: str = "f", seconds=None,
                 gpu: str = DEFAULT_PLATFORM, dram: str = DEFAULT_STANDARD, dimms: int = 4,
                 ranks: int = 8, schedule: str = "uniform", gpus: int = 1,
                 parallel: str = "none", gpu_link: str = "pcie4-p2p",
                 shape_cache: Path | None = None) -> float:
    """Seconds of one request of class ``cls``: the generation replayed as system ``system``
    on ``gpus`` GPUs in mode ``parallel`` (:func:`coda.host.system.parallel.replay_parallel`,
    the one-GPU replay for one GPU), with ``coda sim``'s schedule and machine. Only that
    system is replayed. Raises ValueError naming the flag for bad input, and when the system
    does not fit (its reason)."""
    from .ablation import memory_plan
    from .parallel import branch_workload, gpu_link as link_of, layout, replay_parallel
    from .parallel import shard_shape
    from .schedules import resolve
    from .sim import DEFAULT_SHAPE_CACHE, SimConfig, setup, workload

    if system not in SYSTEMS:
        raise ValueError(f"--system {system!r}: expected one of {', '.join(SYSTEMS)}")
    layout(gpus, parallel, None)
    link = link_of(gpu_link)
    shape, plat = setup(model, resolution=cls.resolution, seconds=seconds, gpu=gpu, dram=dram,
                        dimms=dimms, ranks=ranks,
                        shape_cache=DEFAULT_SHAPE_CACHE if shape_cache is None else shape_cache)
    lay = layout(gpus, parallel, shape)
    sched = resolve(schedule, shape, cls.steps, interval=SimConfig.interval,
                    warmup=SimConfig.warmup, intervals=None)
    wl = workload(shard_shape(shape, lay.sp), plat, sched)
    groups = [wl] if lay.cfg == 1 else [branch_workload(wl, (b,)) for b in
                                        sorted({r[0] for r in wl.rows()})]
    plans = [memory_plan(g, plat) for g in groups]
    for p in plans:
        ok, reason = p["fits"][system]
        if not ok:
            raise ValueError(f"--system {system}: {cls.name} does not fit: {reason}")
    tot, _ = replay_parallel(wl, plat, system, lay, link, record=False,
                             weights=plans[0]["weights"])
    return tot.latency_s


def serve(classes: list[RequestClass], service: dict, *, rate_per_h: float, requests: int,
          workers: int, policy: str = "fcfs", seed: int = 0) -> dict:
    """One serving simulation (``docs/system-model.md``, "Serving"): ``requests`` Poisson arrivals at
    ``rate_per_h`` per hour, classes drawn by weight, ``service[class name]`` seconds each,
    on ``workers`` workers under ``policy``.

    Returns ``{"policy", "rate_per_h", "requests", "workers", "p50_s", "p99_s", "mean_s",
    "max_s", "wait_p50_s", "wait_p99_s", "throughput_per_h", "utilisation",
    "offered_load", "makespan_s", "per_class": {name: {"n", "p50_s", "p99_s"}}}`` (seconds;
    percentiles by numpy's linear interpolation). Raises ValueError naming the bad value."""
    if policy not in POLICIES:
        raise ValueError(f"--policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if not 1 <= int(requests) <= MAX_REQUESTS:
        raise ValueError(f"--requests {requests}: expected 1..{MAX_REQUESTS}")
    if int(workers) < 1:
        raise ValueError(f"workers {workers}: expected >= 1")
    if not (rate_per_h > 0 and np.isfinite(rate_per_h)):
        raise ValueError(f"--rates: rate {rate_per_h!r}: expected a number > 0")
    missing = [c.name for c in classes if c.name not in service]
    if missing:
        raise ValueError(f"service times: no entry for class {missing[0]}")
    n = int(requests)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / rate_per_h, n)
    w = np.array([c.weight for c in classes], dtype=float)
    kind = rng.choice(len(classes), size=n, p=w / w.sum())
    svc = np.array([service[c.name] for c in classes], dtype=float)[kind]
    arrival, start, end = np.zeros(n), np.zeros(n), np.zeros(n)

    env = simpy.Environment()
    queue = simpy.PriorityStore(env)
    done = env.event()
    left = {"n": n}

    def source():
        for i in range(n):
            yield env.timeout(gaps[i])
            arrival[i] = env.now
            key = (i,) if policy == "fcfs" else (svc[i], i)
            yield queue.put(simpy.PriorityItem(key, i))

    def worker():
        while True:
            item = yield queue.get()
            i = item.item
            start[i] = env.now
            yield env.timeout(svc[i])
            end[i] = env.now
            left["n"] -= 1
            if left["n"] == 0:
                done.succeed()

    env.process(source())
    for _ in range(int(workers)):
        env.process(worker())
    env.run(until=done)
    lat, wait = end - arrival, start - arrival
    span = end.max() - arrival.min()
    pct = lambda x, q: float(np.percentile(x, q))   # noqa: E731
    per_class = {c.name: {"n": int((kind == k).sum()),
                          "p50_s": pct(lat[kind == k], 50) if (kind == k).any() else None,
                          "p99_s": pct(lat[kind == k], 99) if (kind == k).any() else None}
                 for k, c in enumerate(classes)}
    mean_svc = float(np.dot(w / w.sum(), [service[c.name] for c in classes]))
    return {"policy": policy, "rate_per_h": rate_per_h, "requests": n, "workers": int(workers),
            "p50_s": pct(lat, 50), "p99_s": pct(lat, 99), "mean_s": float(lat.mean()),
            "max_s": float(lat.max()), "wait_p50_s": pct(wait, 50), "wait_p99_s": pct(wait, 99),
            "throughput_per_h": n / span * 3600.0 if span > 0 else None,
            "utilisation": float(svc.sum() / (workers * span)) if span > 0 else None,
            "offered_load": rate_per_h / 3600.0 * mean_svc / workers,
            "makespan_s": float(span), "per_class": per_class}


def serve_curve(cfg: ServeConfig, shape_cache: Path | None = None) -> dict:
    """Everything ``coda serve`` computes (no files): ``classes`` (with ``service_s``),
    ``cluster`` and ``runs`` (:func:`serve` per policy and rate), ``wall_s`` (``service_s``:
    the service times' part, ``serving_s``: the simulations'). Raises ValueError naming the
    flag."""
    classes = parse_mix(cfg.mix)
    rates = _floats(cfg.rates, "rates")
    policies = [p.strip() for p in cfg.policy.split(",") if p.strip()]
    for p in policies or [""]:
        if p not in POLICIES:
            raise ValueError(f"--policy {cfg.policy!r}: expected a comma list of "
                             f"{', '.join(POLICIES)}")
    if cfg.gpus < 1 or cfg.per_request < 1 or cfg.gpus % cfg.per_request:
        raise ValueError(f"--gpus {cfg.gpus} --per-request {cfg.per_request}: expected "
                         "--per-request >= 1 dividing --gpus")
    if not 1 <= cfg.requests <= MAX_REQUESTS:
        raise ValueError(f"--requests {cfg.requests}: expected 1..{MAX_REQUESTS}")
    t0 = time.perf_counter()
    service = {c.name: service_time(cfg.model, c, system=cfg.system, seconds=cfg.seconds,
                                    gpu=cfg.platform, dram=cfg.dram, dimms=cfg.dimms,
                                    ranks=cfg.ranks, schedule=cfg.schedule,
                                    gpus=cfg.per_request, parallel=cfg.parallel,
                                    gpu_link=cfg.gpu_link, shape_cache=shape_cache)
               for c in classes}
    t_service = time.perf_counter() - t0
    workers = cfg.gpus // cfg.per_request
    t0 = time.perf_counter()
    runs = [serve(classes, service, rate_per_h=r, requests=cfg.requests, workers=workers,
                  policy=p, seed=cfg.seed) for p in policies for r in rates]
    t_serve = time.perf_counter() - t0
    return {"classes": [{**dataclasses.asdict(c), "name": c.name, "service_s": service[c.name]}
                        for c in classes],
            "cluster": {"gpus": cfg.gpus, "per_request": cfg.per_request, "workers": workers,
                        "parallel": cfg.parallel, "gpu_link": cfg.gpu_link,
                        "system": cfg.system, "platform": cfg.platform,
                        "memory": f"{cfg.dimms} x {cfg.ranks} {cfg.dram} per GPU"},
            "model": cfg.model, "runs": runs,
            "wall_s": {"service_s": round(t_service, 3), "serving_s": round(t_serve, 3)}}


#: the configuration ``coda serve`` hands to :func:`main` (coda.cli)
CONFIG = ServeConfig


def configure(parser) -> None:
    add_options(parser, ServeConfig)


def main(cfg: ServeConfig) -> int:
    """Run ``coda serve`` as ``cfg`` says (what the command line gave, or a
    :class:`ServeConfig` built in Python, e.g. ``main(ServeConfig(requests=50, out="/tmp/s"))``):
    :func:`serve_curve`, ``serving.json`` and ``serving.png`` in ``--out``, the table printed.
    Returns 0; a bad option: ValueError naming it, before any file."""
    from rich.console import Console
    from rich.table import Table

    from coda.paths import check_output_path, save_figure

    out = check_output_path(cfg.out, "--out", folder=True)
    res = serve_curve(cfg)
    out.mkdir(parents=True, exist_ok=True)
    write_file(out / "serving.json", json_text(res, indent=1) + "\n")
    _plot(res, out / "serving.png", save_figure)
    cl = res["cluster"]
    t = Table(title=(f"coda serve: {res['model']} "
                     + ", ".join(f"{c['name']} {c['service_s']:.0f} s" for c in res["classes"])
                     + f"; {cl['gpus']} GPUs, {cl['per_request']} a request ({cl['parallel']}),"
                     f" system {cl['system']}"),
              caption=f"report: {out / 'serving.json'}; latency from arrival to completion")
    for col in ("policy", "rate /h", "load", "p50 s", "p99 s", "mean s", "wait p50 s",
                "throughput /h", "utilisation"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in res["runs"]:
        t.add_row(r["policy"], f"{r['rate_per_h']:g}", f"{r['offered_load']:.2f}",
                  f"{r['p50_s']:.0f}", f"{r['p99_s']:.0f}", f"{r['mean_s']:.0f}",
                  f"{r['wait_p50_s']:.0f}", f"{r['throughput_per_h']:.1f}",
                  f"{100 * r['utilisation']:.0f} %")
    Console(width=max(Console().width, 120)).print(t)
    return 0


def _plot(res: dict, path: Path, save_figure) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for pol in dict.fromkeys(r["policy"] for r in res["runs"]):
        rows = [r for r in res["runs"] if r["policy"] == pol]
        x = [r["throughput_per_h"] for r in rows]
        ax.plot(x, [r["p50_s"] for r in rows], "o-", label=f"{pol} p50")
        ax.plot(x, [r["p99_s"] for r in rows], "s--", label=f"{pol} p99")
    ax.set_xlabel("throughput (requests / h)")
    ax.set_ylabel("latency (s)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(f"{res['model']}: {res['cluster']['gpus']} GPUs, "
                 f"{res['cluster']['per_request']} a request", fontsize=9)
    return save_figure(fig, path)


# ----------------------------------------------------------------------------- sweeps
#: figures of a serving simulation kept per ``coda sweep serve`` point (seconds, requests/h)
SWEEP_FIGURES = ("p50_s", "p99_s", "mean_s", "wait_p99_s", "throughput_per_h", "utilisation",
                 "offered_load")
#: ServeConfig's options that are not sweep parameters (a point writes into its own folder)
_NOT_SWEPT = ("out",)


def sweep_point(params: dict, workdir: Path) -> dict:
    """One ``coda sweep serve`` point: :func:`serve_curve` of ``ServeConfig(**params)`` (the
    flags of ``coda serve`` by their Python names; one arrival rate and one policy, the grid
    gives the others); writes ``workdir/serving.json``. Returns SWEEP_FIGURES of the run,
    ``service_s.<class>`` (each class's service time) and ``timing``. Raises ValueError naming
    the parameter for a comma list of rates or policies, or as :func:`serve_curve`."""
    for name in ("rates", "policy"):
        if "," in str(params.get(name, "")):
            raise ValueError(f"{name}={params[name]!r}: one value per sweep point (give the "
                             f"values as the grid's: --param {name}=a,b)")
    cfg = ServeConfig(**params, out=str(workdir))
    res = serve_curve(cfg, shape_cache=Path(workdir).resolve().parent.parent / "shapes")
    write_file(Path(workdir) / "serving.json", json_text(res, indent=1) + "\n")
    run = res["runs"][0]
    figures = {k: run[k] for k in SWEEP_FIGURES}
    figures.update({f"service_s.{c['name']}": c["service_s"] for c in res["classes"]})
    figures["timing"] = res["wall_s"]
    return figures


def sweep_kind():
    """The ``serve`` sweep kind (coda.sweep.SweepKind): serving simulations over arrival
    rates x policies x cluster sizes x parallel modes x systems ..., one point per rate and
    policy (``coda serve`` with one ``--rates`` and one ``--policy``)."""
    import coda.hw
    from coda.sweep import Param, SweepKind, sources_digest

    types = {"int": int, "float": float, "str": str}
    params = []
    for f in dataclasses.fields(ServeConfig):
        if f.name in _NOT_SWEPT:
            continue
        default = f.default
        if f.name == "rates":
            default = default.split(",")[0]
        elif f.name == "policy":
            default = POLICIES[0]
        params.append(Param(f.name, types[f.type], default))
    return SweepKind(
        name="serve", run=sweep_point, description=__doc__.splitlines()[0],
        version=sources_digest(Path(__file__).parent, Path(coda.hw.__file__).parent),
        params=tuple(params),
        headline=("p50_s", "p99_s", "throughput_per_h", "utilisation"))
