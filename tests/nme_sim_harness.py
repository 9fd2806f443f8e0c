"""The NME in amaranth.sim for tests/hw/test_nme_sim_programs.py and test_nme_sim_timing.py: a
seeded memory model and command driver (:func:`simulate`), an ISA reference (:func:`reference`)
and the helpers that run programs on both and compare them (:func:`check`).

The memory model answers reads in order after a random latency (>= 1 cycle) with random gaps
and refuses requests at random (``mem_req_ready`` low), all from an explicit seed. The
reference executes a program per :mod:`coda.hw.nme.isa` with torch eager bf16/fp16
arithmetic, block by block, so results must match bit for bit.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, Status, UOp, validate
from coda.hw.nme.top import NME


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------------------------------
# memory model + command driver
# ---------------------------------------------------------------------------------------
@dataclass
class MemTiming:
    """Random memory behaviour: read latency in [lat_min, lat_max] cycles, probability that
    ``mem_req_ready`` is high in a cycle, probability that a due response is held back."""
    lat_min: int = 1
    lat_max: int = 4
    p_ready: float = 0.7
    p_gap: float = 0.2


ALWAYS_READY_1CYCLE = MemTiming(1, 1, 1.0, 0.0)


@dataclass
class Outcome:
    status: Status
    l1: int            # fp32 bits
    cycles: int        # first command word offered .. done (inclusive)
    toggles: int       # dbg_fu_toggles after the program


def _word_int(row: np.ndarray) -> int:
    return int.from_bytes(row.astype("<u2").tobytes(), "little")


def _int_word(value: int, lanes: int) -> np.ndarray:
    return np.frombuffer(value.to_bytes(2 * lanes, "little"), dtype="<u2").copy()


def simulate(cfg: NMEConfig, programs: list[list[int]], mem: np.ndarray, *, seed: int = 0,
             timing: MemTiming = MemTiming(), reset_after: dict[int, int] | None = None,
             max_cycles: int = 20000, measure_toggles: bool = True,
             ) -> tuple[np.ndarray, list[Outcome], dict]:
    """Run command-word lists one after the other on an NME against memory ``mem``.

    Args:
        programs: each a list of 64-bit command words (header + micro-ops).
        mem: uint16 [mem_words, lanes] image (copied).
        reset_after: {program index: cycles after its first word} to pulse ``rst`` for one
            cycle; that program then gets no Outcome (``None``) and the next one follows.
        measure_toggles: elaborate the NME with its toggle counter (``Outcome.toggles``;
            0 without it).
    Returns:
        (memory image after all programs, outcomes, log) where log counts writes seen
        after each reset (``writes_after_reset``).
    """
    mem = mem.copy()
    outcomes: list[Outcome | None] = []
    log = {"writes_after_reset": 0, "cycles": 0}
    sim, job = _simulator(cfg, measure_toggles)
    job.update(programs=programs, mem=mem, seed=seed, timing=timing, max_cycles=max_cycles,
               reset_after=reset_after or {}, outcomes=outcomes, log=log)
    sim.run()
    return mem, outcomes, log


#: compiled simulators of the last few (cfg, measure_toggles), reset and run again by
#: :func:`simulate`: compiling the NME into amaranth.sim's Python code takes 1.6 s of the
#: 1.9 s that a simulate() of a 2-lane NME's four random programs takes
_SIMULATORS: dict = {}
_SIMULATORS_KEPT = 2


def _simulator(cfg: NMEConfig, measure_toggles: bool) -> tuple[Simulator, dict]:
    """A simulator of the NME ``cfg`` in its initial state, and the job its testbench runs
    (the keyword arguments of :func:`simulate`, set by the caller before ``run``)."""
    key = (cfg, measure_toggles)
    if key in _SIMULATORS:
        sim, job = _SIMULATORS.pop(key)
        sim.reset()                       # every signal initial, the testbench restarted
        _SIMULATORS[key] = sim, job       # the most recent last
        return sim, job
    while len(_SIMULATORS) >= _SIMULATORS_KEPT:
        del _SIMULATORS[next(iter(_SIMULATORS))]
    lanes = cfg.lanes
    dut = NME(cfg, measure_toggles=measure_toggles)
    top = Module()
    top.domains.sync = cd = ClockDomain("sync")
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-8)
    job: dict = {}

    async def bench(ctx):
        programs, mem, seed, timing = job["programs"], job["mem"], job["seed"], job["timing"]
        max_cycles, reset_after = job["max_cycles"], job["reset_after"]
        outcomes, log = job["outcomes"], job["log"]
        rng = random.Random(seed)
        inflight: deque[tuple[int, int]] = deque()
        cycle, last_due = 0, 0
        in_reset_window = False
        for n, words in enumerate(programs):
            ci, start = 0, cycle
            reset_at = reset_after.get(n)
            while True:
                if cycle - start > max_cycles:
                    raise AssertionError(f"program {n} did not finish in {max_cycles} cycles")
                do_reset = reset_at is not None and cycle - start == reset_at
                ctx.set(cd.rst, do_reset)
                ctx.set(dut.cmd_valid, ci < len(words))
                ctx.set(dut.cmd_data, words[ci] if ci < len(words) else 0)
                ready = rng.random() < timing.p_ready
                ctx.set(dut.mem_req_ready, ready)
                rsp = None
                if inflight and inflight[0][0] <= cycle and rng.random() >= timing.p_gap:
                    rsp = inflight.popleft()
                ctx.set(dut.mem_rsp_valid, rsp is not None)
                ctx.set(dut.mem_rsp_data, rsp[1] if rsp else 0)

                cmd_fire = ci < len(words) and ctx.get(dut.cmd_ready)
                req = ready and ctx.get(dut.mem_req_valid)
                if req:
                    addr = ctx.get(dut.mem_req_addr)
                    assert addr < cfg.mem_words, f"request address {addr} out of memory"
                    if ctx.get(dut.mem_req_we):
                        wmask = ctx.get(dut.mem_req_wmask)
                        data = _int_word(ctx.get(dut.mem_req_wdata), lanes)
                        for j in range(lanes):
                            if wmask >> j & 1:
                                mem[addr, j] = data[j]
                        if in_reset_window:
                            log["writes_after_reset"] += 1
                    else:
                        last_due = max(cycle + rng.randint(timing.lat_min, timing.lat_max),
                                       last_due + 1)
                        inflight.append((last_due, _word_int(mem[addr])))
                done = ctx.get(dut.done)
                if done:
                    outcomes.append(Outcome(Status(ctx.get(dut.status)), ctx.get(dut.l1),
                                            cycle - start + 1,
                                            ctx.get(dut.dbg_fu_toggles) if measure_toggles
                                            else 0))
                    assert not ctx.get(dut.busy)
                await ctx.tick()
                cycle += 1
                if cmd_fire and not do_reset:
                    ci += 1
                if do_reset:
                    outcomes.append(None)
                    in_reset_window = True
                    break
                if done:
                    in_reset_window = False
                    break
        log["cycles"] = cycle

    sim.add_testbench(bench)
    _SIMULATORS[key] = sim, job
    return sim, job


# ---------------------------------------------------------------------------------------
# ISA reference (torch eager, block by block)
# ---------------------------------------------------------------------------------------
def _as_float(bits: np.ndarray, dtype) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16).copy()).view(dtype)


def _as_bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def _r_operand(cfg, u: UOp, ws: np.ndarray, mem: np.ndarray, bufs, dtype, blen):
    L = cfg.lanes
    if u.rsrc == RSrc.BUF:
        return bufs[u.r][:blen]
    if u.rsrc == RSrc.MEM:
        return _as_float(mem[u.addr + ws], dtype)
    if u.rsrc == RSrc.CHAN:
        return _as_float(mem[u.addr + ws % u.param], dtype)
    if u.rsrc == RSrc.GROUP:
        e = ws // u.param if u.param else np.zeros_like(ws)
        elem = mem[u.addr + e // L, e % L]
        return _as_float(np.repeat(elem[:, None], L, axis=1), dtype)
    packed = mem[u.addr + ws // 2].view(np.int8).reshape(len(ws), 2 * L)
    half = (ws % 2)[:, None] * L + np.arange(L)[None, :]
    vals = np.take_along_axis(packed, half, axis=1)
    return torch.from_numpy(vals.copy()).to(dtype)


def reference(cfg: NMEConfig, prog: Program, mem: np.ndarray):
    """(memory image, Status, l1 fp32 bits) of ``prog`` per the ISA."""
    words = prog.words()
    status = validate(len(prog.uops), prog.n_elems, words[1:], cfg)
    mem = mem.copy()
    if status != Status.OK:
        return mem, status, 0
    dtype, L, D = DTYPES[cfg.fmt], cfg.lanes, cfg.depth
    W = -(-prog.n_elems // L)
    bufs = [torch.zeros(D, L, dtype=dtype) for _ in range(cfg.nbuf)]
    acc = torch.zeros(L, dtype=torch.float32)
    has_l1 = any(u.op == Op.L1 for u in prog.uops)
    for base in range(0, W, D):
        blen = min(D, W - base)
        ws = np.arange(base, base + blen)
        valid = (ws[:, None] * L + np.arange(L)[None, :]) < prog.n_elems
        for u in prog.uops:
            r = _r_operand(cfg, u, ws, mem, bufs, dtype, blen)
            p, q = bufs[u.p][:blen], bufs[u.q][:blen]
            if u.op == Op.L1:
                d = (p.float() - r.float()).abs()
                for i in range(blen):
                    acc = torch.where(torch.from_numpy(valid[i]), acc + d[i], acc)
                continue
            y = {Op.MOV: lambda: r.clone(), Op.ADD: lambda: p + r, Op.SUB: lambda: p - r,
                 Op.MUL: lambda: p * r, Op.MAC: lambda: p + q * r}[u.op]()
            if u.store:
                target = mem[u.addr + ws]
                target[valid] = _as_bits(y)[valid]
                mem[u.addr + ws] = target
            else:
                bufs[u.d] = bufs[u.d].clone()
                bufs[u.d][:blen] = y
    if not has_l1:
        return mem, status, 0
    total = torch.zeros((), dtype=torch.float32)
    for j in range(L):
        total = total + acc[j]
    return mem, status, int(total.view(torch.int32).item()) & 0xFFFF_FFFF


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def random_image(cfg: NMEConfig, seed: int, scale: float = 4.0) -> np.ndarray:
    """Finite random values of the format (no NaN/inf), as a bit image [mem_words, lanes]."""
    g = torch.Generator().manual_seed(seed)
    vals = (torch.randn(cfg.mem_words, cfg.lanes, generator=g) * scale).to(DTYPES[cfg.fmt])
    return _as_bits(vals).copy()


def check(cfg: NMEConfig, progs: list[Program], mem: np.ndarray, *, seed: int = 1,
          timing: MemTiming = MemTiming()) -> tuple[np.ndarray, list[Outcome]]:
    """Run ``progs`` in sequence on the NME and on the reference; assert identical bits.
    Returns the NME's memory image and outcomes."""
    got_mem, outcomes, _ = simulate(cfg, [p.words() for p in progs], mem, seed=seed,
                                    timing=timing)
    want = mem
    for prog, out in zip(progs, outcomes):
        want, status, l1 = reference(cfg, prog, want)
        assert out.status == status, (prog, out.status, status)
        assert out.l1 == l1, (hex(out.l1), hex(l1))
    np.testing.assert_array_equal(got_mem, want)
    return got_mem, outcomes


SMALL = dict(depth=4, nbuf=4, imem_depth=8, max_streams=4, mem_words=64)


# ---------------------------------------------------------------------------------------
# random programs
# ---------------------------------------------------------------------------------------
def _random_program(rng: random.Random, cfg: NMEConfig) -> Program:
    """Mostly valid programs that read only buffers they wrote; some fields go out of range."""
    L, nb = cfg.lanes, cfg.nbuf
    n = rng.randint(1, 3 * cfg.depth * L)
    words = -(-n // L)
    written: list[int] = []
    uops = []
    for _ in range(rng.randint(1, cfg.imem_depth - 1)):
        op = rng.choice(list(Op))
        rsrc = rng.choice(list(RSrc)) if written else rng.choice(list(RSrc)[1:])
        if op != Op.MOV and not written:
            op = Op.MOV
        addr, param = rng.randint(0, cfg.mem_words - words - 1), 0
        if rsrc == RSrc.CHAN:
            param = rng.randint(1, 5)
        elif rsrc == RSrc.GROUP:
            param = rng.randint(0, 3)
        store = rsrc == RSrc.BUF and op != Op.L1 and rng.random() < 0.4
        src = lambda: rng.choice(written)  # noqa: E731
        u = UOp(op, rsrc, store, d=rng.randrange(nb), p=src() if written else 0,
                q=src() if written else 0, r=src() if written else 0, addr=addr, param=param)
        if rng.random() < 0.08:                      # an out-of-range field now and then
            u = UOp(u.op, u.rsrc, u.store, d=rng.randrange(16), p=u.p, q=u.q, r=u.r,
                    addr=rng.randrange(1 << 24), param=u.param)
        uops.append(u)
        if not u.store and u.op != Op.L1:
            written.append(u.d)
    if written and not uops[-1].store:               # make the result visible
        final = UOp(Op.MOV, RSrc.BUF, store=True, r=written[-1],
                    addr=rng.randint(0, cfg.mem_words - words))
        uops.append(final)
    return Program(n, tuple(uops))


def _canon_nan(bits: np.ndarray, fmt: str) -> np.ndarray:
    """Any NaN pattern -> one pattern (the ISA accepts any NaN where IEEE gives NaN)."""
    exp_mask, man_mask = (0x7F80, 0x007F) if fmt == "bf16" else (0x7C00, 0x03FF)
    bits = bits.copy()
    nan = ((bits & exp_mask) == exp_mask) & ((bits & man_mask) != 0)
    bits[nan] = exp_mask | (man_mask + 1) >> 1
    return bits
