"""``coda serve``: a stream of generation requests on a cluster of GPU machines, on SimPy as
the rest of the system model: latency percentiles, throughput and cost per served video
against arrival rate, per scheduling policy.

:func:`serve` simulates Poisson arrivals of request classes on workers (GPU groups, one
generation at a time to completion, no preemption) under a policy (:data:`POLICIES`): one
request a generation, or with ``batch`` up to ``max_batch`` waiting requests of one class in
one batched generation. A class's service time and energy, alone or batched, are its
generation's replay (:func:`coda.host.system.batching.batch_generation`, once per class and
batch size); :func:`serve_curve` runs :func:`serve` per policy and rate and prices each run
(:func:`coda.host.system.prices.serving_cost`), and :func:`main` writes
``DIR/serving.json`` and ``DIR/serving.png``. The model, the policies and the figures
written: ``docs/system-model.md``, "Serving".
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
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
from .batching import MAX_BATCH, batch_generation
from .presets import model_names
from .prices import PriceConfig
from .replay import SYSTEMS

__all__ = ["POLICIES", "RequestClass", "ServeConfig", "parse_mix", "service_time", "serve",
           "serve_curve", "configure", "main"]

#: the scheduling policies, all non-preemptive: ``fcfs`` (first come, first served), ``sjf``
#: (shortest job first: the waiting request with the shortest service time, ties by arrival)
#: and ``batch`` (a free worker takes the first waiting request and up to ``max_batch - 1``
#: more waiting requests of its class, in arrival order, as one batched generation; it does
#: not wait for a batch to fill)
POLICIES = ("fcfs", "sjf", "batch")
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
class ServeConfig(PriceConfig):
    """Every option of ``coda serve`` with its default (the one source of them); the prices
    of the cost per served video from :class:`coda.host.system.prices.PriceConfig`."""
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
    max_batch: int = option(4, f"batch: most requests of one class in one generation, "
                            f"1..{MAX_BATCH} (read by the batch policy only)")
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
    the one-GPU replay for one GPU), with ``coda sim``'s schedule and machine: the
    ``latency_s`` of :func:`coda.host.system.batching.batch_generation` with a batch of one.
    Raises ValueError naming the flag for bad input, and when the system does not fit (its
    reason)."""
    return batch_generation(model, cls, 1, system=system, seconds=seconds, gpu=gpu,
                            dram=dram, dimms=dimms, ranks=ranks, schedule=schedule,
                            gpus=gpus, parallel=parallel, gpu_link=gpu_link,
                            shape_cache=shape_cache)["latency_s"]


def _batch_table(classes, service: dict, table: dict | None, max_batch: int, what: str):
    """``{class name: (value of a batch of 1, of 2, ...)}`` from ``table`` (None: ``service``
    as batches of one), checked to cover ``max_batch``; ValueError naming ``what``."""
    out = {c.name: tuple(table[c.name]) if table is not None and c.name in table
           else (service[c.name],) for c in classes}
    short = [n for n, v in out.items() if len(v) < max_batch]
    if short:
        raise ValueError(f"{what}: class {short[0]} has {len(out[short[0]])} batch sizes, "
                         f"expected {max_batch} (--max-batch {max_batch})")
    return out


def serve(classes: list[RequestClass], service: dict, *, rate_per_h: float, requests: int,
          workers: int, policy: str = "fcfs", seed: int = 0, max_batch: int = 1,
          batch_service: dict | None = None, energy: dict | None = None) -> dict:
    """One serving simulation (``docs/system-model.md``, "Serving"): ``requests`` Poisson arrivals at
    ``rate_per_h`` per hour, classes drawn by weight, ``service[class name]`` seconds each,
    on ``workers`` workers under ``policy``.

    ``batch`` serves up to ``max_batch`` requests of a class in one generation of
    ``batch_service[class name][b - 1]`` seconds for ``b`` of them (default: only batches of
    one, of ``service``'s seconds); every request of a batch starts and ends with it.
    ``energy[class name][b - 1]``: joules of a generation of ``b`` requests (``[0]`` for the
    other policies), summed over the run's generations as ``energy_j`` (None: not counted).

    Returns ``{"policy", "rate_per_h", "requests", "workers", "p50_s", "p99_s", "mean_s",
    "max_s", "wait_p50_s", "wait_p99_s", "throughput_per_h", "utilisation",
    "offered_load", "makespan_s", "busy_s", "generations", "mean_batch", "max_batch",
    "energy_j", "per_class": {name: {"n", "p50_s", "p99_s"}}}`` (seconds; percentiles by
    numpy's linear interpolation; ``busy_s``: worker seconds spent generating;
    ``offered_load``: rate x mean one-request service / workers). Raises ValueError naming
    the bad value."""
    if policy not in POLICIES:
        raise ValueError(f"--policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if not 1 <= int(requests) <= MAX_REQUESTS:
        raise ValueError(f"--requests {requests}: expected 1..{MAX_REQUESTS}")
    if int(workers) < 1:
        raise ValueError(f"workers {workers}: expected >= 1")
    if not (rate_per_h > 0 and np.isfinite(rate_per_h)):
        raise ValueError(f"--rates: rate {rate_per_h!r}: expected a number > 0")
    if not 1 <= int(max_batch) <= MAX_BATCH:
        raise ValueError(f"--max-batch {max_batch}: expected 1..{MAX_BATCH}")
    missing = [c.name for c in classes if c.name not in service]
    if missing:
        raise ValueError(f"service times: no entry for class {missing[0]}")
    bmax = int(max_batch) if policy == "batch" else 1
    bsvc = _batch_table(classes, service, batch_service, bmax, "batch service times")
    bsvc = [bsvc[c.name] for c in classes]
    benergy = None
    if energy is not None:
        benergy = _batch_table(classes, {}, energy, bmax, "energies")
        benergy = [benergy[c.name] for c in classes]
    n = int(requests)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / rate_per_h, n)
    w = np.array([c.weight for c in classes], dtype=float)
    kind = rng.choice(len(classes), size=n, p=w / w.sum())
    svc = np.array([service[c.name] for c in classes], dtype=float)[kind]
    arrival, start, end = np.zeros(n), np.zeros(n), np.zeros(n)
    busy = np.zeros(n)                 # each request's share of its generation's time
    sizes: list[int] = []
    joules = [0.0]

    env = simpy.Environment()
    queue = simpy.Store(env) if policy == "batch" else simpy.PriorityStore(env)
    pending = [deque() for _ in classes]      # batch: waiting requests per class
    taken = np.zeros(n, dtype=bool)           # batch: served with an earlier request
    done = env.event()
    left = {"n": n}

    def source():
        for i in range(n):
            yield env.timeout(gaps[i])
            arrival[i] = env.now
            if policy == "batch":
                pending[kind[i]].append(i)
                yield queue.put(i)
            else:
                key = (i,) if policy == "fcfs" else (svc[i], i)
                yield queue.put(simpy.PriorityItem(key, i))

    def worker():
        while True:
            item = yield queue.get()
            if policy != "batch":
                group = [item.item]
            elif taken[item]:
                continue
            else:
                k = kind[item]
                group = [pending[k].popleft()]    # the class's first waiting one: item
                while len(group) < bmax and pending[k]:
                    group.append(pending[k].popleft())
                    taken[group[-1]] = True
            b = len(group)
            t = bsvc[kind[group[0]]][b - 1]
            start[group] = env.now
            yield env.timeout(t)
            end[group] = env.now
            busy[group] = t / b
            sizes.append(b)
            if benergy is not None:
                joules[0] += benergy[kind[group[0]]][b - 1]
            left["n"] -= b
            if left["n"] == 0:
                done.succeed()

    env.process(source())
    for _ in range(int(workers)):
        env.process(worker())
    env.run(until=done)
    lat, wait = end - arrival, start - arrival
    span = end.max() - arrival.min()
    busy_s = float(busy.sum())
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
            "utilisation": busy_s / (workers * span) if span > 0 else None,
            "offered_load": rate_per_h / 3600.0 * mean_svc / workers,
            "makespan_s": float(span), "busy_s": busy_s, "generations": len(sizes),
            "mean_batch": n / len(sizes), "max_batch": bmax,
            "energy_j": joules[0] if benergy is not None else None, "per_class": per_class}


def serve_curve(cfg: ServeConfig, shape_cache: Path | None = None) -> dict:
    """Everything ``coda serve`` computes (no files): ``classes`` (with ``service_s`` and
    ``energy_j`` of one request and, with the batch policy, ``batch_service_s`` and
    ``batch_energy_j`` of batches of 1..``max_batch``), ``cluster``, ``prices``
    (:meth:`coda.host.system.prices.Prices.describe`) and ``runs`` (:func:`serve` per policy
    and rate, each with its ``energy_j`` (the cluster's over the run: the generations', plus
    every idle GPU's stalled power and the idle DIMMs' background), ``cost``
    (:func:`coda.host.system.prices.serving_cost`) and ``cost_per_video_usd``), ``wall_s``
    (``service_s``: the generations' replays, ``serving_s``: the simulations'). Raises
    ValueError naming the flag."""
    from .platforms import platform
    from .prices import machine_capital, prices, serving_cost

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
    if not 1 <= cfg.max_batch <= MAX_BATCH:
        raise ValueError(f"--max-batch {cfg.max_batch}: expected 1..{MAX_BATCH}")
    pr = prices(cfg.platform, **cfg.price_options())
    plat = platform(cfg.platform, cfg.dram, cfg.dimms, cfg.ranks)
    bmax = cfg.max_batch if "batch" in policies else 1
    t0 = time.perf_counter()
    gen = {(c.name, b): batch_generation(
               cfg.model, c, b, system=cfg.system, seconds=cfg.seconds, gpu=cfg.platform,
               dram=cfg.dram, dimms=cfg.dimms, ranks=cfg.ranks, schedule=cfg.schedule,
               gpus=cfg.per_request, parallel=cfg.parallel, gpu_link=cfg.gpu_link,
               shape_cache=shape_cache)
           for c in classes for b in range(1, bmax + 1)}
    t_service = time.perf_counter() - t0
    service = {c.name: gen[(c.name, 1)]["latency_s"] for c in classes}
    batches = {c.name: tuple(gen[(c.name, b)]["latency_s"] for b in range(1, bmax + 1))
               for c in classes}
    energy = {c.name: tuple(gen[(c.name, b)]["energy_j"] for b in range(1, bmax + 1))
              for c in classes}
    workers = cfg.gpus // cfg.per_request
    capital = machine_capital(plat, pr, cfg.system, cfg.gpus)
    t0 = time.perf_counter()
    runs = []
    for p in policies:
        for r in rates:
            run = serve(classes, service, rate_per_h=r, requests=cfg.requests,
                        workers=workers, policy=p, seed=cfg.seed, max_batch=bmax,
                        batch_service=batches, energy=energy)
            run["energy_j"] += _idle_energy(plat, cfg.per_request * (
                workers * run["makespan_s"] - run["busy_s"]))
            run["cost"] = serving_cost(capital, run["makespan_s"], run["energy_j"],
                                       run["requests"], pr)
            run["cost_per_video_usd"] = run["cost"]["usd"]
            runs.append(run)
    t_serve = time.perf_counter() - t0
    out_classes = []
    for c in classes:
        row = {**dataclasses.asdict(c), "name": c.name, "service_s": service[c.name],
               "energy_j": energy[c.name][0]}
        if bmax > 1:
            row.update(batch_service_s=list(batches[c.name]),
                       batch_energy_j=list(energy[c.name]))
        out_classes.append(row)
    return {"classes": out_classes,
            "cluster": {"gpus": cfg.gpus, "per_request": cfg.per_request, "workers": workers,
                        "parallel": cfg.parallel, "gpu_link": cfg.gpu_link,
                        "system": cfg.system, "platform": cfg.platform,
                        "memory": f"{cfg.dimms} x {cfg.ranks} {cfg.dram} per GPU",
                        "max_batch": bmax, "capital": capital},
            "prices": pr.describe(), "model": cfg.model, "runs": runs,
            "wall_s": {"service_s": round(t_service, 3), "serving_s": round(t_serve, 3)}}


def _idle_energy(plat, gpu_s: float) -> float:
    """Joules of ``gpu_s`` GPU-seconds of idle machine: the GPU at its stalled power (with
    the model loaded, between generations) and its ``plat`` DIMMs' refresh and background
    with every bank closed (:func:`coda.host.system.energy.dimm_dram_energy`)."""
    from .energy import dimm_dram_energy

    gpu_s = max(0.0, gpu_s)
    dimms = dimm_dram_energy(plat.dram, read_bytes=0, write_bytes=0, ranks=plat.n_ranks,
                             seconds=gpu_s, busy_s=0.0)["total_j"]
    return plat.gpu.power_stall_w * gpu_s + dimms


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
              caption=f"report: {out / 'serving.json'}; latency from arrival to completion; "
                      "batch: mean requests a generation; $/video: the cluster's price over "
                      "the run's span plus its electricity, per served video")
    for col in ("policy", "rate /h", "load", "p50 s", "p99 s", "mean s", "wait p50 s",
                "throughput /h", "utilisation", "batch", "$/video"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in res["runs"]:
        usd = r["cost_per_video_usd"]
        t.add_row(r["policy"], f"{r['rate_per_h']:g}", f"{r['offered_load']:.2f}",
                  f"{r['p50_s']:.0f}", f"{r['p99_s']:.0f}", f"{r['mean_s']:.0f}",
                  f"{r['wait_p50_s']:.0f}", f"{r['throughput_per_h']:.1f}",
                  f"{100 * r['utilisation']:.0f} %", f"{r['mean_batch']:.2f}",
                  "-" if usd is None else f"{usd:.3g}")
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
                 "offered_load", "mean_batch", "cost_per_video_usd")
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
        headline=("p50_s", "p99_s", "throughput_per_h", "utilisation", "cost_per_video_usd"))
