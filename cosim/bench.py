"""Cosimulation speed: build time, simulated NME cycles per second, per-job overhead.

``python -m coda.cosim.bench [--lanes 8] [--fmt bf16] [--mem-words 65536]`` (``make bench``)
builds (or reuses) the Verilated NME, then through :class:`~coda.cosim.rtl_backend.RTLBackend`:

- one big MOV/ADD program over three streams filling the memory: NME cycles / wall second of
  the job (the job includes loading the changed words and reading back the written ones, so it
  is a lower bound of the simulator's raw speed);
- many tiny programs on an unchanged image: wall time per job (the persistent simulator's
  overhead: socket round trip, file traffic, cocotb handshakes).

Prints one JSON object; writes it to ``--out`` if given.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from coda.hw.isa import NMEConfig, Op, Program, RSrc, UOp


def measure(cfg: NMEConfig, tiny_jobs: int = 50) -> dict:
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
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="coda.cosim.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--fmt", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--mem-words", type=int, default=1 << 16)
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    cfg = NMEConfig(lanes=args.lanes, fmt=args.fmt, mem_words=args.mem_words, depth=args.depth)
    result = measure(cfg)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
