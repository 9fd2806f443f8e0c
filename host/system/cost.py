"""The modelled cost of a shipped-model schedule on a paper-scale machine, for a schedule
search: :func:`schedule_cost`.

A :class:`coda.host.cache.schedule.Schedule` of the shipped model (Latte, 4 layers, the 5
operator types) is transferred to the target model exactly as ``coda sim --schedule FILE``
transfers it (:func:`coda.host.system.schedules.transfer`: operator type, relative depth,
relative step), its generation synthesised (:func:`coda.host.system.sim.workload`) and
replayed as one of the systems a..g (:func:`coda.host.system.replay.replay`) on ``coda
sim``'s machine (:func:`coda.host.system.sim.setup`), with the memory check of the ablation
(:func:`coda.host.system.ablation.memory_plan`) and its energy
(:func:`coda.host.system.energy.energy`). Nothing is computed in a second way: a schedule
given to :func:`schedule_cost` and written to a file for ``coda sim --schedule FILE`` gives
the same figures.
"""

from __future__ import annotations

from coda.hw.dram.standards import DEFAULT_STANDARD
from coda.hw.nmp import NMP_DEPTH

import functools
from pathlib import Path

from coda.host.nmp.link import check_segment_output
from coda.host.cache.schedule import Schedule

from .sim import DEFAULT_SHAPE_CACHE, MAX_STEPS, SimConfig

__all__ = ["schedule_cost", "parse_target", "target_setup", "DEFAULT_TARGET"]

DEFAULT_TARGET = "wan2.1-14b@720p"


def parse_target(target: str) -> tuple[str, str | None]:
    """``"MODEL@RES"`` -> (model, resolution).

    MODEL is one of :func:`coda.host.system.presets.model_names`; RES one of
    :data:`coda.host.system.presets.RESOLUTIONS` (``480p``, ``720p``). A shipped model
    (``latte-digits``, ``latte-text``) has its resolution in its preset (its training size,
    ``SxS`` pixels): ``"latte-digits"`` or ``"latte-digits@SxS"`` give (``"latte-digits"``,
    None); another resolution is refused.

    Raises:
        ValueError: naming the value and the choices (models or resolutions).
    """
    from .presets import RESOLUTIONS, model_names, shipped_presets

    model, sep, res = str(target).partition("@")
    if model not in model_names():
        raise ValueError(f"target {target!r}: model {model!r} is not one of "
                         f"{', '.join(model_names())} (expected MODEL@RES, e.g. "
                         f"{DEFAULT_TARGET})")
    if model in shipped_presets():
        own = _shipped_resolution(model)
        if sep and res != own:
            raise ValueError(f"target {target!r}: {model} runs at its preset's "
                             f"resolution only: expected '{model}' or '{model}@{own}'")
        return model, None
    if res not in RESOLUTIONS:
        raise ValueError(f"target {target!r}: resolution {res!r} is not one of "
                         f"{', '.join(RESOLUTIONS)} (expected MODEL@RES, e.g. "
                         f"{DEFAULT_TARGET})")
    return model, res


def _shipped_resolution(preset: str) -> str:
    from .presets import video_size

    height, width, _ = video_size(preset)
    return f"{width}x{height}"


@functools.lru_cache(maxsize=32)
def target_setup(model: str, resolution: str | None, seconds: float | None, gpu: str,
                 dram: str, dimms: int, ranks: int, lanes: int, depth: int,
                 nme_mhz: float | None, shape_cache: Path | None):
    """``coda sim``'s (shape, platform) of a target (:func:`coda.host.system.sim.setup`),
    kept per argument tuple (at most 32). Raises ValueError as ``setup``.

    The target's shape and platform do not depend on the schedule and are kept
    (:func:`target_setup`, an LRU cache), so a call costs one transfer, one synthesis and one
    replay.
    """
    from .sim import setup

    return setup(model, resolution=resolution, seconds=seconds, gpu=gpu, dram=dram,
                 dimms=dimms, ranks=ranks, lanes=lanes, depth=depth, nme_mhz=nme_mhz,
                 shape_cache=shape_cache)


def schedule_cost(schedule: Schedule, target: str = DEFAULT_TARGET, system: str = "f", *,
                  steps: int = SimConfig.steps, seconds: float | None = None,
                  gpu: str | None = None, dram: str = DEFAULT_STANDARD, dimms: int = 4,
                  ranks: int = 8, lanes: int = SimConfig.lanes,
                  depth: int = NMP_DEPTH, nme_mhz: float | None = None,
                  segment_output: str = "sum", prefetch: int = 1, cache: str = "reuse",
                  cache_format: str = SimConfig.cache_format,
                  cache_group: int | None = SimConfig.cache_group,
                  shape_cache: Path | None = DEFAULT_SHAPE_CACHE) -> dict:
    """Modelled latency and energy of one generation of ``target`` under ``schedule``, as
    system ``system`` of the ablation (what ``coda sim --schedule FILE --system SYSTEM``
    reports for that system).

    Args:
        schedule: a schedule of the shipped model (any steps and layers; transferred).
        target: ``"MODEL@RES"`` (:func:`parse_target`), e.g. ``"wan2.1-14b@720p"``.
        system: one letter of :data:`coda.host.system.replay.SYSTEMS` (a..g).
        steps: denoising steps of the target generation (1..1000; default 50).
        seconds: video length (default: ``coda sim``'s, 4 s; fixed-length models their
            frames).
        gpu, dram, dimms, ranks, lanes, depth, nme_mhz: the machine, as ``coda sim``'s
            flags (gpu default: ``coda sim``'s ``--platform``); dimms x ranks default 4 x 8,
            enough host DIMMs for Wan 2.1 14B's 720p cache.
        segment_output: ``"sum"`` (default, the cache engine's) or ``"residual"``
            (:mod:`coda.host.nmp.link`).
        prefetch: operators of H2D look-ahead (``--prefetch``).
        cache: the cache mode (``--cache``, :data:`coda.host.cache.forecast.CACHE_MODES`):
            ``"forecast"`` reads two cached tensors per forecast term and keeps two entries
            per stored operator (:mod:`coda.host.system.workload`).
        cache_format, cache_group: the entries' format, ``"bf16"`` or ``"int8"`` of G
            channels per scale (``--cache-format``, ``--cache-group``; G default
            :func:`coda.host.cache.compress.resolve_group` of the target's hidden size):
            int8 entries take ``0.5 + 1/G`` of the bytes (:mod:`coda.host.system.formats`).
        shape_cache: where traced shapes are cached on disk (None: trace every new target).
    Returns:
        ``{"latency_s": s, "energy_j": J, "segments": NME segments run, "host_link_bytes":
        PCIe bytes both directions (segments, stores, zero slots, streamed weights),
        "h2d_bytes", "d2h_bytes", "gpu_busy_s", "nme_busy_s", "fits": bool, "reason": "" or
        why it does not fit (then latency_s and energy_j are ``inf`` and the counts 0),
        "weights": "resident" | "streamed", "cache_bytes", "ops_skipped_fraction" and
        "fixups" of the transferred schedule, "target", "system", "segment_output",
        "cache", "cache_format", "cache_group"}``.
    Raises:
        TypeError: ``schedule`` is not a :class:`coda.host.cache.schedule.Schedule`.
        ValueError: a bad target, system, steps, segment_output, cache, cache format or G
            (naming G and C), or machine (the message names the value and the choices).
    """
    from .ablation import memory_plan
    from .energy import energy
    from .platforms import DEFAULT_PLATFORM
    from .replay import SYSTEMS, replay
    from .schedules import branches_of, transfer
    from .sim import workload
    from .workload import check_cache

    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule: expected a coda.host.cache.schedule.Schedule, got "
                        f"{type(schedule).__name__}")
    if system not in SYSTEMS:
        raise ValueError(f"system {system!r}: expected one of {', '.join(SYSTEMS)}")
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps {steps}: expected 1..{MAX_STEPS}")
    if prefetch < 0:
        raise ValueError(f"prefetch {prefetch}: expected >= 0")
    check_segment_output(segment_output)
    check_cache(cache)
    model, resolution = parse_target(target)
    shape, plat = target_setup(model, resolution, seconds, gpu or DEFAULT_PLATFORM, dram,
                               dimms, ranks, lanes, depth, nme_mhz, shape_cache)
    ms = transfer(schedule, shape, steps)
    wl = workload(shape, plat, ms, segment_output, cache, cache_format, cache_group)
    mem = memory_plan(wl, plat)
    ok, reason = mem["fits"][system]
    out = {"target": target, "system": system, "segment_output": segment_output, "cache": cache,
           "cache_format": wl.cache_format, "cache_group": wl.cache_group,
           "fits": ok, "reason": reason, "weights": mem["weights"],
           "cache_bytes": wl.cache_bytes,
           "ops_skipped_fraction": ms.ops_skipped_fraction(branches_of(shape)),
           "fixups": ms.fixups}
    if not ok:
        return {**out, "latency_s": float("inf"), "energy_j": float("inf"), "segments": 0,
                "host_link_bytes": 0, "h2d_bytes": 0, "d2h_bytes": 0, "gpu_busy_s": 0.0,
                "nme_busy_s": 0.0}
    res = replay(wl, plat, system, prefetch=prefetch, record=False, weights=mem["weights"])
    return {**out, "latency_s": res.latency_s, "energy_j": energy(res, plat)["total_j"],
            "segments": res.segments, "host_link_bytes": res.h2d_bytes + res.d2h_bytes,
            "h2d_bytes": res.h2d_bytes, "d2h_bytes": res.d2h_bytes,
            "gpu_busy_s": res.gpu_busy_s, "nme_busy_s": res.nme_busy_s}
