"""One request class's generation on a serving worker, alone or batched with others of its
class: :func:`batch_generation`, what ``coda serve`` (:mod:`coda.host.system.serving`) takes
as a request's (or a batch's) service time and energy.

A batch of ``b`` requests of one class is one generation of ``b`` samples
(:func:`coda.host.system.sim.workload` with ``samples=b``): every transformer call carries
the step's ``b`` rows of a branch (both branches' ``2b`` for a model whose pipeline batches
CFG), so every kernel does ``b`` times the FLOPs and activation bytes of one row while its
weights are read once (:func:`coda.host.system.replay.gpu_time`), and weights streamed over
PCIe because they do not fit the GPU are loaded once per operator and call for the whole
batch; each row has its own cache entries (the footprint is ``b`` times one request's) and its
own NMP segments; the activations checked against the GPU's memory are ``b`` (or ``2b``)
rows' (:func:`coda.host.system.ablation.memory_plan`); on several GPUs every sample's latent
is exchanged and gathered (:func:`coda.host.system.parallel.replay_parallel`). Nothing is
estimated apart: the batch is replayed as one generation.
"""

from __future__ import annotations

from pathlib import Path

from coda.hw.dram.standards import DEFAULT_STANDARD

from .platforms import DEFAULT_PLATFORM
from .replay import SYSTEMS

__all__ = ["batch_generation", "MAX_BATCH"]

#: most requests one batched generation takes
MAX_BATCH = 64


def batch_generation(model: str, cls, batch: int = 1, *, system: str = "f", seconds=None,
                     gpu: str = DEFAULT_PLATFORM, dram: str = DEFAULT_STANDARD,
                     dimms: int = 4, ranks: int = 8, schedule: str = "uniform", gpus: int = 1,
                     parallel: str = "none", gpu_link: str = "pcie4-p2p",
                     shape_cache: Path | None = None) -> dict:
    """One generation of ``batch`` requests of class ``cls`` (a
    :class:`coda.host.system.serving.RequestClass`: resolution and steps) of ``model``,
    replayed as system ``system`` on ``gpus`` GPUs in mode ``parallel``
    (:func:`coda.host.system.parallel.replay_parallel`; one GPU: the one-GPU replay), with
    ``coda sim``'s schedule and machine (``dimms x ranks`` ranks of ``dram`` per GPU).

    Returns ``{"batch", "latency_s", "energy_j"}``: seconds from the batch's start to its
    last video, joules of all its GPUs (:func:`coda.host.system.parallel.gpu_energy`).
    Raises ValueError naming the flag for bad input, ``batch`` outside 1..:data:`MAX_BATCH`
    (naming ``--max-batch``), and when the system does not fit (its reason: the batch's
    cache in the host DIMMs, its activations on the GPU).
    """
    from .ablation import memory_plan
    from .parallel import (branch_workload, gpu_energy, gpu_link as link_of, layout,
                           replay_parallel, shard_shape)
    from .schedules import resolve
    from .sim import DEFAULT_SHAPE_CACHE, SimConfig, setup, workload

    if system not in SYSTEMS:
        raise ValueError(f"--system {system!r}: expected one of {', '.join(SYSTEMS)}")
    if not 1 <= int(batch) <= MAX_BATCH:
        raise ValueError(f"--max-batch: a batch of {batch!r}: expected 1..{MAX_BATCH}")
    b = int(batch)
    layout(gpus, parallel, None)
    link = link_of(gpu_link)
    shape, plat = setup(model, resolution=cls.resolution, seconds=seconds, gpu=gpu, dram=dram,
                        dimms=dimms, ranks=ranks,
                        shape_cache=DEFAULT_SHAPE_CACHE if shape_cache is None else shape_cache)
    lay = layout(gpus, parallel, shape)
    sched = resolve(schedule, shape, cls.steps, interval=SimConfig.interval,
                    warmup=SimConfig.warmup, intervals=None)
    wl = workload(shard_shape(shape, lay.sp), plat, sched, samples=b)
    groups = [wl] if lay.cfg == 1 else [branch_workload(wl, (br,)) for br in
                                        sorted({r[0] for r in wl.rows()})]
    plans = [memory_plan(g, plat) for g in groups]
    for p in plans:
        ok, reason = p["fits"][system]
        if not ok:
            what = cls.name if b == 1 else f"a batch of {b} {cls.name} requests (--max-batch)"
            raise ValueError(f"--system {system}: {what} does not fit: {reason}")
    tot, per = replay_parallel(wl, plat, system, lay, link, record=False,
                               weights=plans[0]["weights"])
    return {"batch": b, "latency_s": tot.latency_s,
            "energy_j": gpu_energy(tot, per, lay, plat, link)["total_j"]}
