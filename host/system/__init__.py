"""The system timing and energy model: how long a cached generation takes on a GPU + PCIe +
DIMM-NMP machine, where the time goes, and what it costs in energy.

One module per part (shapes and the meta-device trace, platform presets, NME time, cache
formats, schedules, workload, the SimPy replay, energy, the ablation, several GPUs,
serving, ``coda sim``); the table of modules: ``docs/system-model.md``, "How it works".
:func:`modelled` is the entry point for ``coda run``: the modelled systems of a real cached
generation of the shipped model.
"""

from __future__ import annotations

from coda.hw.dram.standards import DEFAULT_STANDARD
from coda.hw.nme.isa import NMEConfig

__all__ = ["modelled"]


def modelled(events, model_config: dict | None = None, platform=None, *, lanes: int = NMEConfig.lanes,
             depth: int = 64, dimms: int = 1, ranks: int = 2, dram: str = DEFAULT_STANDARD,
             nme_mhz: float | None = None, cfg: str = "batched",
             nme_timing: str = "model", segment_output: str = "sum",
             cache: str = "reuse", cache_format: str = "bf16",
             cache_group: int | None = None) -> dict:
    """The modelled systems a..f (and g: the forecast's history over PCIe, with
    ``cache="forecast"``) of the last generation in ``events`` (an
    :class:`coda.host.cache.events.EventLog` of the shipped model, e.g. from
    ``coda.host.model.sample.cached_generate(..., events=log)``).

    Args:
        events: the EventLog. model_config: the shipped model's config dict
            (``host/model/weights/latte_digits.json``; default: read it).
        platform: a :class:`coda.host.system.platforms.Platform` (default: RTX 4090, PCIe
            4.0 x16, ``dimms x ranks`` of ``dram`` with NMEs of ``lanes`` x ``depth``).
        lanes, depth, dimms, ranks: the driver's NME configuration (NMEConfig's default
            depth is 64); used for the default platform and to check the events' cycles.
        nme_mhz: the default platform's NME clock, MHz (None: the DRAM command clock); with
            ``nme_timing="events"`` it must be the clock the events' cycles were counted at.
        cfg: how the generation's CFG ran (``"batched"``: coda.host.model.sample's default).
        nme_timing: ``"model"`` (the platform's DRAM) or ``"events"`` (the events' cycles,
            e.g. from ``coda run --dram``).
        segment_output: the form the events' segments had (the cache engine's
            ``CodaCacheConfig.segment_output``, default ``"sum"``): their bytes and the
            measured DRAM utilisation the model uses.
        cache: the cache mode the generation ran in (``CodaCacheConfig.cache``, default
            ``"reuse"``; :data:`coda.host.cache.forecast.CACHE_MODES`): its segments'
            forecast terms and its footprint (two entries per operator stored twice).
        cache_format, cache_group: the entries' format the generation ran with
            (``CodaCacheConfig.cache_format``, ``.cache_group``; G default
            :func:`coda.host.cache.compress.resolve_group` of the model's C): with int8 its
            segments are timed as ``segment_int8`` programs (the bytes are the events').
    Events of a cache in device memory (``cache_memory="device"``,
    :class:`coda.host.cache.device.DeviceCache`: system b's own run, whose segments crossed
    no link) are replayed as systems a..c only.

    Returns:
        JSON-able dict: ``platform``, ``systems`` (a..f rows as in ``coda sim``'s report;
        a..g with ``cache="forecast"``; a..c for a device cache), ``cache`` (the mode),
        ``cache_format``,
        ``cache_group`` (int8's G, else None),
        ``cache_bytes``, ``nme_check`` (per segment, the cycle model's ideal-memory cycles
        against the events' ``nme_cycles``: ``segments``, ``max_rel_error``, sums).
    """
    from .ablation import run_ablation
    from .formats import cache_group as cache_group_of
    from .nme import segment_timing
    from .platforms import platform as make_platform
    from .presets import shipped_shape
    from .workload import from_events

    shape = shipped_shape(model_config)
    group = cache_group_of(cache_format, shape.hidden, lanes, cache_group)
    wl = from_events(events, shape, cfg=cfg, segment_output=segment_output, cache=cache,
                     cache_group=group)
    plat = platform or make_platform("rtx4090", dram, dimms, ranks, lanes=lanes, depth=depth,
                                     nme_mhz=nme_mhz)
    worst, ev_sum, model_sum = 0.0, 0, 0
    for seg in wl.segments.values():
        t = segment_timing(seg.tokens, seg.channels, seg.k, n_ranks=dimms * ranks,
                           lanes=lanes, depth=depth, group=group)
        ev_sum += seg.nme_cycles
        model_sum += t.cycles_ideal
        if seg.nme_cycles:
            worst = max(worst, abs(t.cycles_ideal - seg.nme_cycles) / seg.nme_cycles)
    on_device = any(e.cache_memory == "device" for e in events.of("op"))
    systems = "abc" if on_device else "abcdefg" if cache == "forecast" else "abcdef"
    abl = run_ablation(wl, plat, systems, nme_timing=nme_timing, record=True)
    return {
        "platform": plat.describe(),
        "cache_bytes": wl.cache_bytes,
        "cache": cache, "cache_format": wl.cache_format, "cache_group": group,
        "systems": abl["systems"],
        "memory": {k: v for k, v in abl["memory"].items() if k != "fits"},
        "nme_check": {"segments": len(wl.segments), "events_nme_cycles": ev_sum,
                      "model_ideal_cycles": model_sum, "max_rel_error": worst},
        "nme_timing": nme_timing,
    }
