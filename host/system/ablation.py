"""The CODA ablation: systems a..g (:data:`coda.host.system.replay.SYSTEMS`; g is the forecast
mode's history over PCIe) replayed on the same workload (same schedule and cache mode), with
memory checks, energy, speedups and what bounds each.

:func:`run_ablation` replays the systems; :func:`memory_plan` decides where weights and cache
live and which systems fit (its docstring: the memory checks); :func:`bottleneck` says what
bounds a system. Speedup and energy efficiency are against a (GPU only) and against c (host-offloaded cache
with the cache operators on the GPU: the baseline the CODA paper's NMP systems improve on).
"""

from __future__ import annotations

import time

from .energy import energy
from .platforms import Platform
from .replay import SYSTEMS, breakdown, replay
from .workload import Workload

__all__ = ["memory_plan", "run_ablation", "bottleneck"]

GIB = 2**30


def memory_plan(wl: Workload, plat: Platform) -> dict:
    """Where weights and cache live, and which systems fit.

    Returns ``{"weights": "resident"|"streamed", "activation_bytes", "weight_bytes",
    "cache_bytes", "cache", "history", "cache_format", "cache_group", "gpu_bytes",
    "host_bytes", "fits": {system: (bool, reason)}}`` (bytes; ``cache``: the cache mode,
    ``history``: entries per operator; ``cache_format``/``cache_group``: bf16 or int8 of G).

    Memory checks (``fits``):

    - activations: the largest traced kernel's inputs and output (per row; rows batched in a
      call multiply it). Weights are *resident* if weights + activations fit the GPU memory,
      else *streamed* per operator over PCIe in every system (two operators' weights buffered);
    - b keeps the cache in GPU memory: it fits only if cache + activations + weights (or the
      streaming buffers) fit;
    - c..g keep the cache in the host DIMMs: it must fit their capacity (``dimms x ranks x``
      rank capacity of the DRAM preset).

    The cache is the workload's footprint (:attr:`coda.host.system.workload.Workload.cache_bytes`):
    in the forecast mode two entries per operator stored more than once (history 2), so a cache
    that fits for plain reuse may not; int8 entries take ``0.5 + 1/G`` of the bf16 bytes
    (:mod:`coda.host.system.formats`), so one that does not fit in bf16 may.
    """
    sh, g = wl.shape, plat.gpu
    rows = max(len(c.rows) for calls in wl.calls for c in calls)
    act = sh.activation_bytes * rows
    max_op_w = max(float(o.kernels.weight_bytes.sum()) for o in sh.ops)
    resident = sh.weight_bytes + act <= g.mem_bytes
    w_gpu = sh.weight_bytes if resident else 2 * max_op_w
    cache = wl.cache_bytes
    notes = ([f"{wl.cache}, up to {wl.history} entries per operator"] if wl.history > 1
             else []) + ([f"int8 G={wl.cache_group}"] if wl.cache_group else [])
    what = f"cache ({'; '.join(notes)})" if notes else "cache"
    fits = {}
    base_ok = act + w_gpu <= g.mem_bytes
    base_reason = "" if base_ok else (
        f"activations {act / GIB:.1f} GiB + weight buffers {w_gpu / GIB:.1f} GiB exceed the "
        f"GPU's {g.mem_bytes / GIB:.0f} GiB")
    for s in SYSTEMS:
        ok, reason = base_ok, base_reason
        if ok and s == "b" and cache + act + w_gpu > g.mem_bytes:
            ok, reason = False, (
                f"{what} {cache / GIB:.1f} GiB + activations {act / GIB:.1f} GiB + weights "
                f"{w_gpu / GIB:.1f} GiB ({'resident' if resident else 'streamed buffers'}) "
                f"exceed the GPU's {g.mem_bytes / GIB:.0f} GiB")
        if ok and s in "cdefg" and cache > plat.host_bytes:
            ok, reason = False, (
                f"{what} {cache / GIB:.1f} GiB exceeds the host DIMMs' {plat.host_bytes / GIB:.0f}"
                f" GiB ({plat.dimms} DIMMs x {plat.ranks} ranks x {plat.rank_bytes / GIB:.0f} "
                f"GiB of {plat.dram.name}); add --dimms/--ranks")
        fits[s] = (ok, reason)
    return {"weights": "resident" if resident else "streamed", "activation_bytes": int(act),
            "weight_bytes": int(sh.weight_bytes), "cache_bytes": int(cache),
            "cache": wl.cache, "history": wl.history, "cache_format": wl.cache_format,
            "cache_group": wl.cache_group,
            "gpu_bytes": int(g.mem_bytes), "host_bytes": int(plat.host_bytes), "fits": fits}


def bottleneck(row: dict) -> str:
    """One line: what bounds this system, from its breakdown."""
    if not row.get("fits", True):
        return "does not fit: " + row["reason"]
    lat = row["latency_s"]
    b = row["breakdown"]
    parts = [("GPU compute", b["gpu_busy_s"]), ("GPU waiting on the NMEs", b["stall_nme_s"]),
             ("GPU waiting on PCIe", b["stall_pcie_s"]), ("other idle", b["idle_other_s"])]
    parts = [(k, v / lat) for k, v in parts if lat > 0 and v / lat >= 0.005]
    return ", ".join(f"{k} {100 * v:.1f} %" for k, v in parts)


def run_ablation(wl: Workload, plat: Platform, systems: str = "abcdefg", *,
                 nme_timing: str = "model", prefetch: int = 1, record: bool = True,
                 memory: dict | None = None, replayer=None) -> dict:
    """Replay ``wl`` as each of ``systems`` on ``plat``.

    ``memory`` (default :func:`memory_plan` of ``wl``) and ``replayer`` (default one GPU:
    :func:`~coda.host.system.replay.replay` and :func:`~coda.host.system.energy.energy`;
    ``replayer(system, weights) -> (SystemResult, energy dict)``) let several GPUs
    (:func:`coda.host.system.parallel.run_parallel`) share the rows, speedups and
    bottlenecks built here.

    Returns ``{"memory": memory_plan, "systems": {letter: row}, "results": {letter:
    SystemResult}, "sim_s": seconds of simulation}``; each row has ``name, fits`` and, when
    it fits, ``latency_s, latency_per_step_s, energy_j, energy (by component), speedup,
    speedup_vs_c, energy_efficiency, energy_efficiency_vs_c, pcie_bytes, h2d_bytes,
    d2h_bytes, history_bytes, gpu_busy_fraction, breakdown, segments, nme_launches,
    nme_busy_s, bottleneck``, and ``cache`` (the mode); else ``fits: false, reason``.
    Speedups against a system that did not run or fit are None.
    """
    mem = memory if memory is not None else memory_plan(wl, plat)
    rows, results = {}, {}
    t0 = time.perf_counter()
    want = set(systems) | {"a", "c"}       # the references are always replayed
    for s in SYSTEMS:
        if s not in want:
            continue
        ok, reason = mem["fits"][s]
        if not ok:
            rows[s] = {"name": SYSTEMS[s], "cache": wl.cache, "fits": False, "reason": reason}
            continue
        if replayer is None:
            res = replay(wl, plat, s, nme_timing=nme_timing, prefetch=prefetch,
                         record=record, weights=mem["weights"])
            en = energy(res, plat)
        else:
            res, en = replayer(s, mem["weights"])
        results[s] = res
        rows[s] = {
            "name": SYSTEMS[s], "cache": wl.cache, "fits": True, "latency_s": res.latency_s,
            "latency_per_step_s": res.latency_s / wl.num_steps, "energy_j": en["total_j"],
            "energy": en, "pcie_bytes": res.h2d_bytes + res.d2h_bytes,
            "h2d_bytes": res.h2d_bytes, "d2h_bytes": res.d2h_bytes,
            "history_bytes": res.history_bytes,
            "gpu_busy_fraction": res.gpu_busy_s / res.latency_s if res.latency_s else 0.0,
            "breakdown": breakdown(res) if record else {}, "segments": res.segments,
            "nme_launches": res.nme_launches, "nme_busy_s": res.nme_busy_s,
            "weights": res.weights}
    sim_s = time.perf_counter() - t0
    for s, row in rows.items():
        if not row["fits"]:
            continue
        for ref, suffix in (("a", ""), ("c", "_vs_c")):
            r = rows.get(ref)
            ok = r is not None and r.get("fits")
            row["speedup" + suffix] = r["latency_s"] / row["latency_s"] if ok else None
            row["energy_efficiency" + suffix] = r["energy_j"] / row["energy_j"] if ok else None
        if record:
            row["bottleneck"] = bottleneck(row)
    rows = {s: rows[s] for s in SYSTEMS if s in rows and s in systems}
    return {"memory": mem, "systems": rows, "results": results, "sim_s": sim_s}
