"""Cosimulation speed of the NME on an ideal memory: build time, simulated NME cycles per
second, per-job overhead.

:func:`measure` builds (or reuses) the Verilated NME, then through
:class:`~coda.cosim.rtl_backend.RTLBackend`:

- one big MOV/ADD program over three streams filling the memory: NME cycles / wall second of
  the job (the job includes loading the changed words and reading back the written ones, so it
  is a lower bound of the simulator's raw speed);
- many tiny programs on an unchanged image: wall time per job (the persistent simulator's
  overhead: socket round trip, file traffic, cocotb handshakes);
- ``two_ranks``: ``launches`` lockstep launches of the big program on two ranks' images through
  ``execute_many``, with one shared simulator (``max_sims=1``: each job reloads the other
  rank's image) and one simulator per rank (``max_sims=2``: images stay resident, the two run
  in parallel): wall seconds per launch and simulated cycles (both ranks) per wall second.

``coda bench`` (:mod:`coda.experiments.bench`) reports it unless ``--skip-nme``.
"""

from __future__ import annotations

import time

import numpy as np

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, UOp

__all__ = ["measure"]


def measure(cfg: NMEConfig, tiny_jobs: int = 50, launches: int = 3) -> dict:
    """Numbers of the module docstring for ``cfg`` (seconds, cycles, cycles/s)."""
    from coda.cosim.build import build_sim
    from coda.cosim.rtl_backend import RTLBackend

    t0 = time.perf_counter()
    build = build_sim(cfg)
    out = {"cfg": {"lanes": cfg.lanes, "fmt": cfg.fmt, "depth": cfg.depth,
                   "mem_words": cfg.mem_words},
           "build_seconds_recorded": round(build.build_seconds, 1),
           "build_or_cache_seconds_now": round(time.perf_counter() - t0, 1)}
    rng = np.random.default_rng(7)
    mem = rng.integers(0, 1 << 16, size=(cfg.mem_words, cfg.lanes), dtype=np.uint16)
    wn = cfg.mem_words // 3 - 1
    big = Program(wn * cfg.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                   UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=wn),
                                   UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * wn)))
    tiny = Program(cfg.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                               UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * wn)))
    with RTLBackend() as rtl:
        t0 = time.perf_counter()
        rtl.execute(cfg, tiny, mem)
        out["simulator_start_seconds"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        res = rtl.execute(cfg, big, mem)
        dt = time.perf_counter() - t0
        out["big_program"] = {"elements": big.n_elems, "cycles": res.cycles,
                              "seconds": round(dt, 3), "cycles_per_s": round(res.cycles / dt)}
        mem = res.mem
        t0 = time.perf_counter()
        for _ in range(tiny_jobs):
            mem = rtl.execute(cfg, tiny, mem).mem
        per = (time.perf_counter() - t0) / tiny_jobs
        out["tiny_job"] = {"cycles": rtl.execute(cfg, tiny, mem).cycles,
                           "ms_per_job": round(per * 1e3, 2)}
    # two ranks in lockstep (the driver's execute_many): each launch runs the big program on
    # both ranks' images; one shared simulator (max_sims=1) reloads the other rank's image
    # every job, one simulator per rank keeps it resident and runs the two in parallel
    images = [mem, rng.integers(0, 1 << 16, size=mem.shape, dtype=np.uint16)]
    out["two_ranks"] = {f"max_sims={sims}": _two_ranks(cfg, big, images, sims, launches)
                        for sims in (1, 2)}
    return out


def _two_ranks(cfg: NMEConfig, big: Program, images: list, sims: int, launches: int) -> dict:
    """``launches`` lockstep launches of ``big`` on the two ranks' ``images`` through
    ``execute_many`` with ``max_sims=sims`` simulators (after one warm launch): wall seconds
    per launch and simulated cycles (both ranks) per wall second."""
    from coda.cosim.rtl_backend import RTLBackend

    with RTLBackend(max_sims=sims) as rtl:
        imgs = [r.mem for r in rtl.execute_many(cfg, [(big, m) for m in images])]  # warm
        t0, cycles = time.perf_counter(), 0
        for _ in range(launches):
            res = rtl.execute_many(cfg, [(big, m) for m in imgs])
            imgs = [r.mem for r in res]
            cycles += sum(r.cycles for r in res)
        dt = time.perf_counter() - t0
    return {"launches": launches, "seconds_per_launch": round(dt / launches, 3),
            "cycles_per_s": round(cycles / dt)}
