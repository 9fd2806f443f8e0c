"""Cosimulation speed of the NME on an ideal memory: build time, simulated NME cycles per
second, per-job overhead, and the ceiling a cosimulated generation is measured against.

:func:`measure` builds (or reuses) the Verilated NME and times it through
:class:`~coda.cosim.nme.rtl_backend.RTLBackend` on the backend's own rank memories: one big program
on one rank (``one_rank``), many tiny jobs (``tiny_job``, the fixed cost of a job), the big
program on an image of the caller's own (``own_image``) and ``ranks`` ranks in lockstep
(``ceiling``); its docstring says what each figure counts.

``coda bench`` (:mod:`coda.experiments.bench`) reports it unless ``--skip-nme``.
"""

from __future__ import annotations

import time

import numpy as np

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, UOp

__all__ = ["measure", "big_program"]


def big_program(cfg: NMEConfig) -> Program:
    """``z = x + y`` over three streams that fill the memory (a third each)."""
    wn = cfg.mem_words // 3 - 1
    return Program(wn * cfg.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                    UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=wn),
                                    UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * wn)))


def measure(cfg: NMEConfig, tiny_jobs: int = 50, launches: int = 3, ranks: int = 2) -> dict:
    """Cosimulation speed figures for ``cfg`` (seconds, cycles, cycles/s).

    :func:`measure` builds (or reuses) the Verilated NME, then through
    :class:`~coda.cosim.nme.rtl_backend.RTLBackend` on the backend's own rank memories
    (:meth:`~coda.cosim.nme.rtl_backend.RTLBackend.rank_image`, which the simulators map: no words
    move between jobs, as in ``coda run``):

    - ``one_rank``: one big MOV/ADD program over three streams filling the memory: NME cycles per
      wall second of the job (launch to result) and of the simulator's own run (``sim_wall_s``
      of the job server: Verilator evaluating the model, the request's Python excluded);
    - ``tiny_job``: many 2-element programs: wall time per job, the fixed cost of a job (socket
      round trip, cocotb handshake, command file);
    - ``own_image``: the big program on an image of the caller's own, which the backend compares
      with its memory and copies in, and whose result is a copy of the memory: what the rank
      memories save per job;
    - ``ceiling``: ``ranks`` ranks in lockstep, each its own simulator process running the big
      program on its rank memory, ``launches`` times: NME cycles summed over the ranks per wall
      second from launch to results. No host work between launches: the most a cosimulated
      generation on that many ranks can simulate per second on this machine, counted as
      ``coda run`` counts its ``sim_cycles_per_s``.
    """
    from coda.cosim.nme.build import build_sim
    from coda.cosim.nme.rtl_backend import RTLBackend

    t0 = time.perf_counter()
    build = build_sim(cfg)
    out = {"cfg": {"lanes": cfg.lanes, "fmt": cfg.fmt, "depth": cfg.depth,
                   "mem_words": cfg.mem_words},
           "build_seconds_recorded": round(build.build_seconds, 1),
           "build_or_cache_seconds_now": round(time.perf_counter() - t0, 1)}
    rng = np.random.default_rng(7)
    big = big_program(cfg)
    wn = cfg.mem_words // 3 - 1
    tiny = Program(cfg.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                               UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * wn)))
    with RTLBackend(max_sims=ranks) as rtl:
        images = [rtl.rank_image(cfg, r) for r in range(ranks)]
        for img in images:
            img[:] = rng.integers(0, 1 << 16, size=img.shape, dtype=np.uint16)
        t0 = time.perf_counter()
        rtl.execute(cfg, tiny, images[0])
        out["simulator_start_seconds"] = round(time.perf_counter() - t0, 2)
        out["one_rank"] = _timed(rtl, cfg, [(big, images[0])])
        t0 = time.perf_counter()
        for _ in range(tiny_jobs):
            rtl.execute(cfg, tiny, images[0])
        out["tiny_job"] = {"cycles": rtl.execute(cfg, tiny, images[0]).cycles,
                           "ms_per_job": round((time.perf_counter() - t0) / tiny_jobs * 1e3, 2)}
        own = rtl.execute(cfg, tiny, images[0].copy()).mem.copy()   # its simulator started
        own[:wn] ^= 1            # every word of the first stream differs from its memory
        out["own_image"] = _timed(rtl, cfg, [(big, own)])
        rtl.execute_many(cfg, [(big, m) for m in images])         # every simulator started
        out["ceiling"] = _timed(rtl, cfg, [(big, m) for m in images], launches)
        out["ceiling"]["ranks"] = ranks
    return out


def _timed(rtl, cfg: NMEConfig, jobs: list, launches: int = 1) -> dict:
    """``launches`` lockstep launches of ``jobs``: NME cycles summed over the jobs, wall
    seconds per launch, cycles per wall second, and per second of the simulators' own runs
    (summed over the processes, so that ranks in parallel count once each)."""
    sim0 = rtl.stats["sim_seconds"]
    t0, cycles = time.perf_counter(), 0
    for _ in range(launches):
        cycles += sum(r.cycles for r in rtl.execute_many(cfg, jobs))
    dt = time.perf_counter() - t0
    sim = (rtl.stats["sim_seconds"] - sim0) / len(jobs)
    return {"launches": launches, "cycles": cycles, "seconds_per_launch": round(dt / launches, 4),
            "cycles_per_s": round(cycles / dt),
            "sim_cycles_per_s": round(cycles / sim) if sim else None}
