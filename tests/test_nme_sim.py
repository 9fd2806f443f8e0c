"""NME in amaranth.sim: programs against a seeded memory model and an ISA reference.

The memory model answers reads in order after a random latency (>= 1 cycle) with random gaps
and refuses requests at random (``mem_req_ready`` low), all from an explicit seed. The
reference (:func:`reference`) executes a program per :mod:`coda.hw.nme.isa` with torch eager
bf16/fp16 arithmetic, block by block, so results must match bit for bit.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from coda.hw.nme.isa import (MAX_ADD_LATENCY, MAX_MUL_LATENCY, MAX_OPERAND_LATENCY, NMEConfig, Op,
                         Program, RSrc, Status, UOp, validate)
from coda.hw.nme.top import NME
from coda.hw.verilog import nme_verilog

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
# directed programs
# ---------------------------------------------------------------------------------------
def test_mov_copy_with_tail():
    cfg = NMEConfig(lanes=3, fmt="bf16", **SMALL)
    mem = random_image(cfg, 1)
    n = 3 * 9 + 2                                      # 10 words, last one has 2 lanes
    prog = Program(n, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                       UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=20)))
    check(cfg, [prog], mem)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
@pytest.mark.parametrize("op", [Op.ADD, Op.SUB, Op.MUL, Op.MAC])
def test_arith_against_torch(fmt, op):
    cfg = NMEConfig(lanes=2, fmt=fmt, **SMALL)
    mem = random_image(cfg, 2 + int(op))
    n = 2 * 6 - 1
    uops = (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
            UOp(Op.MOV, RSrc.MEM, d=1, addr=10),
            UOp(op, RSrc.MEM, d=2, p=0, q=1, addr=20),
            UOp(Op.MOV, RSrc.BUF, store=True, r=2, addr=40))
    got, _ = check(cfg, [Program(n, uops)], mem, seed=int(op))
    # and directly against torch, independent of the reference's block walk
    dt = DTYPES[fmt]
    a, b, c = (_as_float(mem[s:s + 6], dt).flatten()[:n] for s in (0, 10, 20))
    want = {Op.ADD: a + c, Op.SUB: a - c, Op.MUL: a * c, Op.MAC: a + b * c}[op]
    assert np.array_equal(_as_bits(_as_float(got[40:46], dt).flatten()[:n]), _as_bits(want))


def test_gated_residual_chan():
    """y = x + g*c with a per-channel gate g (CHAN, C = 2 words)."""
    cfg = NMEConfig(lanes=2, fmt="bf16", **SMALL)
    mem = random_image(cfg, 3)
    uops = (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),       # x
            UOp(Op.MOV, RSrc.CHAN, d=1, addr=30, param=3),   # g (3 words = 6 channels)
            UOp(Op.MAC, RSrc.MEM, d=2, p=0, q=1, addr=12),   # x + g*c
            UOp(Op.MOV, RSrc.BUF, store=True, r=2, addr=40))
    check(cfg, [Program(2 * 10, uops)], mem)


@pytest.mark.parametrize("param", [0, 1, 3])
def test_group_scale(param):
    cfg = NMEConfig(lanes=2, fmt="fp16", **SMALL)
    mem = random_image(cfg, 4)
    uops = (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
            UOp(Op.MUL, RSrc.GROUP, d=1, p=0, addr=30, param=param),
            UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=40))
    check(cfg, [Program(2 * 9 - 1, uops)], mem)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_int8_dequant(fmt):
    """int8 codes times a per-group scale: the compressed-cache path."""
    cfg = NMEConfig(lanes=3, fmt=fmt, depth=3, nbuf=2, imem_depth=4, max_streams=4,
                    mem_words=64)
    mem = random_image(cfg, 5)
    uops = (UOp(Op.MOV, RSrc.INT8, d=0, addr=2),
            UOp(Op.MUL, RSrc.GROUP, d=1, p=0, addr=20, param=2),
            UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=30))
    check(cfg, [Program(3 * 8 - 1, uops)], mem)


def test_l1_accumulate():
    cfg = NMEConfig(lanes=3, fmt="bf16", **SMALL)
    mem = random_image(cfg, 6)
    n = 3 * 11 - 2
    uops = (UOp(Op.MOV, RSrc.MEM, d=0, addr=0), UOp(Op.L1, RSrc.MEM, p=0, addr=20))
    _, (out,) = check(cfg, [Program(n, uops)], mem)
    a = _as_float(mem[0:11], torch.bfloat16).flatten()[:n].float()
    b = _as_float(mem[20:31], torch.bfloat16).flatten()[:n].float()
    want = (a - b).abs().sum().item()
    got = np.array([out.l1], dtype=np.uint32).view(np.float32)[0]
    assert abs(got - want) <= 1e-5 * abs(want)


# ---------------------------------------------------------------------------------------
# bad programs: every error class of isa.validate
# ---------------------------------------------------------------------------------------
def _bad_programs(cfg: NMEConfig) -> list[tuple[Program, Status]]:
    mov = UOp(Op.MOV, RSrc.MEM, d=0, addr=0)
    st = UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=32)
    nb = cfg.nbuf
    return [
        (Program(4, ()), Status.BAD_LENGTH),                                  # n_uops 0
        (Program(4, (mov,) * (cfg.imem_depth + 1)), Status.BAD_LENGTH),      # too many uops
        (Program(0, (mov, st)), Status.BAD_LENGTH),                           # n_elems 0
        (Program(cfg.max_elems + 1, (mov, st)), Status.BAD_LENGTH),
        (Program(4, (mov, UOp(6, RSrc.BUF))), Status.BAD_OPCODE),             # undefined op
        (Program(4, (mov, UOp(Op.MOV, 5))), Status.BAD_OPCODE),               # undefined rsrc
        (Program(4, (UOp(Op.MOV, RSrc.MEM, d=nb),)), Status.BAD_OPERAND),     # d >= nbuf
        (Program(4, (mov, UOp(Op.ADD, RSrc.MEM, p=nb))), Status.BAD_OPERAND),
        (Program(4, (mov, UOp(Op.MAC, RSrc.MEM, q=nb))), Status.BAD_OPERAND),
        (Program(4, (mov, UOp(Op.MOV, RSrc.BUF, r=nb))), Status.BAD_OPERAND),
        (Program(4, (UOp(Op.MOV, RSrc.MEM, store=True),)), Status.BAD_OPERAND),
        (Program(4, (mov, UOp(Op.L1, RSrc.BUF, store=True))), Status.BAD_OPERAND),
        (Program(4, (UOp(Op.MOV, RSrc.CHAN, param=0),)), Status.BAD_OPERAND),
        (Program(4, (mov,) * (cfg.max_streams + 1)), Status.TOO_MANY_STREAMS),
        (Program(4, (UOp(Op.MOV, RSrc.MEM, addr=cfg.mem_words - 1),)), Status.BAD_ADDR),
        (Program(4, (mov, UOp(Op.MOV, RSrc.BUF, store=True, addr=cfg.mem_words - 1))),
         Status.BAD_ADDR),
        (Program(4, (UOp(Op.MOV, RSrc.CHAN, addr=cfg.mem_words - 2, param=3),)), Status.BAD_ADDR),
        (Program(4 * cfg.lanes, (UOp(Op.MOV, RSrc.INT8, addr=cfg.mem_words - 1),)),
         Status.BAD_ADDR),
        (Program(9 * cfg.lanes, (UOp(Op.MOV, RSrc.GROUP, addr=cfg.mem_words - 2, param=2),)),
         Status.BAD_ADDR),
        (Program(4, (UOp(Op.MOV, RSrc.GROUP, addr=cfg.mem_words, param=0),)), Status.BAD_ADDR),
        (Program(4, (UOp(Op.MOV, RSrc.GROUP, addr=(1 << 24) - 1, param=9),)), Status.BAD_ADDR),
        # precedence: the first bad micro-op decides; opcode before operand before address
        (Program(4, (UOp(Op.MOV, RSrc.MEM, addr=cfg.mem_words), UOp(7, RSrc.BUF))),
         Status.BAD_ADDR),
        (Program(4, (UOp(9, RSrc.MEM, d=nb, addr=cfg.mem_words),)), Status.BAD_OPCODE),
        (Program(4, (UOp(Op.MOV, RSrc.MEM, d=nb, addr=cfg.mem_words),)), Status.BAD_OPERAND),
        # reads of buffers no earlier micro-op of the program wrote (buffer 1 still holds the
        # previous good program's result: it must not be visible)
        (Program(4, (mov, UOp(Op.ADD, RSrc.MEM, d=1, p=1))), Status.BAD_OPERAND),   # own d
        (Program(4, (mov, UOp(Op.MAC, RSrc.MEM, d=1, p=0, q=2))), Status.BAD_OPERAND),
        (Program(4, (mov, UOp(Op.MOV, RSrc.BUF, d=2, r=1))), Status.BAD_OPERAND),
        (Program(4, (mov, UOp(Op.L1, RSrc.MEM, p=1, addr=8))), Status.BAD_OPERAND),
        (Program(4, (mov, UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=32))), Status.BAD_OPERAND),
        (Program(4, (mov, UOp(Op.MOV, RSrc.BUF, store=True, d=1, r=0, addr=32),  # a store's d
                     UOp(Op.ADD, RSrc.MEM, d=2, p=1, addr=8))), Status.BAD_OPERAND),
        (Program(4, (mov, UOp(Op.L1, RSrc.MEM, d=1, p=0, addr=8),              # an L1's d
                     UOp(Op.MUL, RSrc.BUF, d=2, p=0, r=1))), Status.BAD_OPERAND),
        # ... after the opcode check, before the address check, before the stream count
        (Program(4, (UOp(9, RSrc.BUF, p=1),)), Status.BAD_OPCODE),
        (Program(4, (UOp(Op.ADD, RSrc.MEM, p=1, addr=cfg.mem_words),)), Status.BAD_OPERAND),
        (Program(4, (UOp(Op.MOV, RSrc.MEM, addr=cfg.mem_words), UOp(Op.ADD, RSrc.BUF, p=2, r=2))),
         Status.BAD_ADDR),
        (Program(4, (mov,) * cfg.max_streams + (UOp(Op.ADD, RSrc.MEM, p=2),)), Status.BAD_OPERAND),
    ]


def test_bad_programs_leave_memory_untouched():
    cfg = NMEConfig(lanes=2, fmt="bf16", depth=4, nbuf=3, imem_depth=4, max_streams=3,
                    mem_words=48, max_elems=40)
    mem = random_image(cfg, 8)
    good = Program(7, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                       UOp(Op.ADD, RSrc.MEM, d=1, p=0, addr=8),
                       UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=32)))
    progs, want = [], []
    for bad, status in _bad_programs(cfg):
        words = bad.words()
        assert validate(len(bad.uops), bad.n_elems, words[1:], cfg) == status, bad
        progs += [bad, good]
        want += [status, Status.OK]
    # the good program writes the same values each time, so memory == one good run
    _, outcomes = check(cfg, progs, mem, seed=3)
    assert [o.status for o in outcomes] == want


def test_read_of_unwritten_buffer_is_rejected():
    """A program that reads buffer 1 without writing it would see what the previous program
    left there (the RTL keeps buffers; the torch interpreter would see nothing): the NME
    rejects it with BAD_OPERAND before any memory access, and the next program runs."""
    cfg = NMEConfig(lanes=3, fmt="fp16", **SMALL)
    mem = random_image(cfg, 10)
    fill = Program(3 * 5 - 1, (UOp(Op.MOV, RSrc.MEM, d=1, addr=0),
                               UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=20)))
    leak = Program(3 * 5 - 1, (UOp(Op.MOV, RSrc.MEM, d=0, addr=10),
                               UOp(Op.ADD, RSrc.BUF, d=2, p=0, r=1),
                               UOp(Op.MOV, RSrc.BUF, store=True, r=2, addr=40)))
    after_fill = reference(cfg, fill, mem)[0]
    got, outs = check(cfg, [fill, leak], mem, seed=4)
    np.testing.assert_array_equal(got, after_fill)      # the rejected program wrote nothing
    fixed = Program(leak.n_elems, (UOp(Op.MOV, RSrc.MEM, d=1, addr=0),) + leak.uops)
    _, (again,) = check(cfg, [fixed], got, seed=5)
    assert [o.status for o in outs] + [again.status] == [Status.OK, Status.BAD_OPERAND,
                                                         Status.OK]


def test_group_extent_boundary():
    """GROUP scaled extent exactly at the end of memory passes; one word more fails."""
    cfg = NMEConfig(lanes=2, fmt="bf16", depth=4, nbuf=2, imem_depth=4, max_streams=3,
                    mem_words=32)
    # W = 9 words, G = param*L = 4 elements: groups 0..4 -> elements 0..4 -> words 0..2
    ok = Program(18, (UOp(Op.MOV, RSrc.GROUP, d=0, addr=29, param=2),
                      UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=0)))
    bad = Program(18, (UOp(Op.MOV, RSrc.GROUP, d=0, addr=30, param=2),))
    _, outs = check(cfg, [ok, bad], random_image(cfg, 9))
    assert [o.status for o in outs] == [Status.OK, Status.BAD_ADDR]


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


@pytest.mark.parametrize("lanes,fmt,seed,lm,la,trail", [
    (2, "bf16", 11, 0, 0, False), (3, "fp16", 12, 0, 0, False), (2, "bf16", 11, 2, 3, False),
    (3, "fp16", 12, 1, 4, False), (2, "bf16", 13, 0, 0, True), (3, "fp16", 14, 1, 4, True)])
def test_random_programs(lanes, fmt, seed, lm, la, trail):
    """Random programs (stores over their own read streams among them) against the
    reference, with a memory that stalls requests and delays responses at random; with
    ``trail_stores`` the stores of the programs that allow it trail the next blocks'
    reads."""
    cfg = NMEConfig(lanes=lanes, fmt=fmt, depth=3, nbuf=3, imem_depth=5, max_streams=5,
                    mem_words=40, mul_latency=lm, add_latency=la, trail_stores=trail)
    rng = random.Random(seed)
    progs = [_random_program(rng, cfg) for _ in range(6)]
    mem = random_image(cfg, seed, scale=2.0)
    got, outcomes, _ = simulate(cfg, [p.words() for p in progs], mem, seed=seed)
    want = mem
    for prog, out in zip(progs, outcomes):
        want, status, l1 = reference(cfg, prog, want)
        assert out.status == validate(len(prog.uops), prog.n_elems, prog.words()[1:], cfg)
        assert out.status == status
        if not np.isnan(np.array([l1], np.uint32).view(np.float32)[0]):
            assert out.l1 == l1
    np.testing.assert_array_equal(_canon_nan(got, fmt), _canon_nan(want, fmt))
    assert {o.status for o in outcomes} >= {Status.OK}


# ---------------------------------------------------------------------------------------
# reset, stalls, operand isolation, cycles
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reset_at", [2, 14, 40])
def test_reset_mid_program(reset_at):
    """rst during intake / check / execution: no write afterwards, stale read data dropped,
    the next program correct."""
    cfg = NMEConfig(lanes=2, fmt="bf16", **SMALL)
    mem = random_image(cfg, 13)
    victim = Program(2 * 12, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                              UOp(Op.MUL, RSrc.MEM, d=0, p=0, addr=12),
                              UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=48)))
    good = Program(2 * 10 - 1, (UOp(Op.MOV, RSrc.MEM, d=1, addr=24),
                                UOp(Op.SUB, RSrc.MEM, d=2, p=1, addr=0),
                                UOp(Op.MOV, RSrc.BUF, store=True, r=2, addr=36)))
    slow = MemTiming(lat_min=30, lat_max=45, p_ready=0.8, p_gap=0.1)
    got, outcomes, log = simulate(cfg, [victim.words(), good.words()], mem, seed=reset_at,
                                  timing=slow, reset_after={0: reset_at})
    assert outcomes[0] is None and outcomes[1].status == Status.OK
    assert log["writes_after_reset"] == len(range(36, 46))     # only the good program's
    want, _, _ = reference(cfg, good, mem)
    np.testing.assert_array_equal(got[36:46], want[36:46])


def test_operand_isolation_toggles():
    """Isolation on: a MOV-only program toggles no FU operand register, and an ADD program
    toggles fewer bits than with isolation off; results are identical."""
    progs = [Program(2 * 7 - 1, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                 UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=40))),
             Program(2 * 7 - 1, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                 UOp(Op.ADD, RSrc.MEM, d=1, p=0, addr=20),
                                 UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=40)))]
    runs = {}
    for iso in (True, False):
        cfg = NMEConfig(lanes=2, fmt="fp16", operand_isolation=iso, **SMALL)
        runs[iso] = check(cfg, progs, random_image(cfg, 14), seed=5)
    (mem_on, (mov_on, add_on)), (mem_off, (mov_off, add_off)) = runs[True], runs[False]
    np.testing.assert_array_equal(mem_on, mem_off)
    assert mov_on.toggles == 0 < mov_off.toggles
    assert 0 < add_on.toggles < add_off.toggles - mov_off.toggles


def test_toggle_measurement_is_an_option_that_changes_nothing_else():
    """The toggle counter is simulation-only: without ``measure_toggles`` the NME has no
    ``dbg_fu_toggles`` (nor the lanes' shadow registers) and gives the same bits, statuses,
    L1 sums and cycles under the same random memory timing."""
    cfg = NMEConfig(lanes=3, fmt="bf16", **SMALL)
    rng = random.Random(21)
    progs = [_random_program(rng, cfg).words() for _ in range(4)]
    mem = random_image(cfg, 21)
    runs = [simulate(cfg, progs, mem, seed=21, measure_toggles=on) for on in (True, False)]
    (mem_on, outs_on, _), (mem_off, outs_off, _) = runs
    np.testing.assert_array_equal(mem_on, mem_off)
    assert [(o.status, o.l1, o.cycles) for o in outs_on] == \
        [(o.status, o.l1, o.cycles) for o in outs_off]
    assert sum(o.toggles for o in outs_on) > 0 == sum(o.toggles for o in outs_off)


#: ``make test``: every mul_latency and every add_latency once (a diagonal through the
#: grid), the deepest multiplier with the combinational adder, the operand stage alone, with
#: the shortest and with the deepest units; ``make verify-long``: half the (lm, la) grid
#: (every lm and la with every parity of the other)
_FAST_GRID = ([(k % (MAX_MUL_LATENCY + 1), k, 0) for k in range(1, MAX_ADD_LATENCY + 1)]
              + [(MAX_MUL_LATENCY, 0, 0), (0, 0, 1), (1, 1, 1),
                 (MAX_MUL_LATENCY, MAX_ADD_LATENCY, MAX_OPERAND_LATENCY)])
_HALF_GRID = ([(lm, la, 0) for lm in range(MAX_MUL_LATENCY + 1)
               for la in range(MAX_ADD_LATENCY + 1) if (lm or la) and (lm + la) % 2 == 0]
              + [(0, 0, 1), (1, 1, 1), (MAX_MUL_LATENCY, MAX_ADD_LATENCY, MAX_OPERAND_LATENCY)])


@pytest.mark.parametrize("grid", [pytest.param(_FAST_GRID, id="diagonal"),
                                  pytest.param(_HALF_GRID, id="half-grid",
                                               marks=pytest.mark.slow)])
def test_pipelined_units_change_no_bits(grid):
    """Every (mul_latency, add_latency, operand_latency) of ``grid`` gives the
    combinational NME's memory bits, statuses, L1 sums and toggle counts under the same random
    memory timing (stalls on both sides); only the cycles differ: never downwards with a
    memory that is always ready (with random stalls a deeper pipeline meets other stalls, so
    it may finish a few cycles sooner)."""
    rng = random.Random(31)
    base = NMEConfig(lanes=2, fmt="fp16", **SMALL)
    progs = [_random_program(rng, base).words() for _ in range(4)]
    progs.append(Program(2 * 9 - 1, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                     UOp(Op.L1, RSrc.MEM, p=0, addr=20))).words())
    mem = random_image(base, 31)
    timing = MemTiming(lat_min=1, lat_max=6, p_ready=0.7, p_gap=0.3)
    ref_mem, ref_outs, _ = simulate(base, progs, mem, seed=31, timing=timing)
    ref_cycles = [o.cycles for o in simulate(base, progs, mem, timing=ALWAYS_READY_1CYCLE)[1]]
    for lm, la, lo in grid:
        cfg = replace(base, mul_latency=lm, add_latency=la, operand_latency=lo)
        got, outs, _ = simulate(cfg, progs, mem, seed=31, timing=timing)
        np.testing.assert_array_equal(got, ref_mem, err_msg=f"lm={lm} la={la} lo={lo}")
        assert [(o.status, o.l1, o.toggles) for o in outs] == \
            [(o.status, o.l1, o.toggles) for o in ref_outs], (lm, la, lo)
        cycles = [o.cycles for o in simulate(cfg, progs, mem, timing=ALWAYS_READY_1CYCLE)[1]]
        assert all(c >= r for c, r in zip(cycles, ref_cycles)), (lm, la, lo)


def test_pipeline_latency_errors():
    for bad in (-1, MAX_MUL_LATENCY + 1, 1.5, True):
        with pytest.raises(ValueError, match=f"mul_latency={bad!r}"):
            NMEConfig(mul_latency=bad)
    for bad in (-1, MAX_ADD_LATENCY + 1, "2", False):
        with pytest.raises(ValueError, match=f"add_latency={bad!r}"):
            NMEConfig(add_latency=bad)
    for bad in (-1, MAX_OPERAND_LATENCY + 1, None):
        with pytest.raises(ValueError, match=f"operand_latency={bad!r}"):
            NMEConfig(operand_latency=bad)


@pytest.mark.parametrize("trail", [False, True])
def test_store_backpressure_and_latency(trail):
    """Long store pass against a memory that is rarely ready, with long read latency (with
    ``trail_stores``: the store passes hand over and the stores trail the next block's
    reads)."""
    cfg = NMEConfig(lanes=2, fmt="bf16", depth=16, nbuf=2, imem_depth=4, max_streams=4,
                    mem_words=96, trail_stores=trail)
    prog = Program(2 * 30, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                            UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=40)))
    check(cfg, [prog], random_image(cfg, 15), timing=MemTiming(3, 12, 0.25, 0.3))


def test_gated_residual_cycles_1000_elements():
    """Default config, always-ready memory: y = x + g*c over 1000 elements (C = 40 channels)
    runs one word per cycle per pass plus per-pass overhead; a 20-cycle read latency costs
    about once per block (2 blocks), not once per pass (the issue side reads ahead)."""
    cfg = NMEConfig()
    mem = random_image(cfg, 16)
    prog = Program(1000, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                          UOp(Op.MOV, RSrc.CHAN, d=1, addr=400, param=5),
                          UOp(Op.MAC, RSrc.MEM, d=0, p=0, q=1, addr=200),
                          UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=1000)))
    t0 = time.perf_counter()
    _, (fast,) = check(cfg, [prog], mem, timing=ALWAYS_READY_1CYCLE)
    _, (slow,) = check(cfg, [prog], mem, timing=MemTiming(20, 20, 1.0, 0.0))
    words, passes, blocks = 125, 4 * 2, 2
    print(f"gated residual 1000 elems: {fast.cycles} cycles at latency 1, {slow.cycles} at "
          f"latency 20 ({4 * words} word-passes, {time.perf_counter() - t0:.1f} s sim)")
    assert 4 * words <= fast.cycles <= 4 * words + passes * 10 + 16
    assert slow.cycles - fast.cycles <= blocks * (20 + 1)


def _cycle_programs(cfg: NMEConfig) -> list[Program]:
    """Compiled operators at 1 and 2*depth+1 words, stores followed by buffer passes, and a
    few rejected programs."""
    from coda.host.nme import compiler
    L, D = cfg.lanes, cfg.depth
    progs = []
    for words in (1, 2 * D + 1):
        t, c, n = words, L, words * L
        shapes = {"add": {"a": (n,), "b": (n,)}, "scale": {"a": (t, c), "s": (c,)},
                  "gated_residual": {"x": (t, c), "g": (c,), "c": (t, c)},
                  "segment": {"x": (t, c), "g": (2, c), "c": (2, t, c)},
                  "cfg_combine": {"u": (t, c), "c": (t, c), "s": ()},
                  "l1_distance": {"a": (n,), "b": (n,)},
                  "dequant_int8": {"q": (t, 2 * c), "scale": (t, 1)}}
        for op, sh in shapes.items():
            group = 2 * L if op == "dequant_int8" else None
            layout, _ = compiler.plan_layout(op, cfg, sh, group)
            progs.append(compiler.compile_op(op, cfg, sh, layout, group))
        progs.append(Program(n - (L > 1), (
            UOp(Op.MOV, RSrc.MEM, d=0, addr=0), UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=64),
            UOp(Op.ADD, RSrc.BUF, d=1, p=0, r=0), UOp(Op.MOV, RSrc.GROUP, d=2, addr=9, param=7),
            UOp(Op.MUL, RSrc.BUF, store=True, p=1, r=2, addr=96))))
    progs += [Program(4, ()),
              Program(4, (UOp(Op.MOV, RSrc.GROUP, d=0, addr=0, param=3),
                          UOp(Op.SUB, RSrc.MEM, d=1, p=1, addr=0))),
              Program(64 * L, (UOp(Op.MOV, RSrc.GROUP, d=0, addr=cfg.mem_words - 1, param=3),))]
    return progs


@pytest.mark.parametrize("lanes,depth,fmt,lm,la", [
    (1, 1, "bf16", 0, 0), (2, 2, "fp16", 0, 0), (5, 1, "fp16", 0, 0),
    # pipelined units: the L1 path longer than the result path (la > lm) and shorter
    (2, 2, "fp16", 2, 3), (1, 1, "bf16", 3, 1), (5, 1, "fp16", 1, 4)])
def test_cycle_model_matches_the_nme(lanes, depth, fmt, lm, la):
    """coda.hw.nme.cycles.model_cycles == the NME's cycles with a 1-cycle always-ready memory,
    for configurations the Verilator cosim cannot build (lanes 1, depth <= 2: zero-width
    wires), with combinational and pipelined units (same results); tests/test_interp.py
    checks the others against Verilated counts."""
    from coda.hw.nme.cycles import model_cycles
    cfg = NMEConfig(lanes=lanes, fmt=fmt, depth=depth, nbuf=4, imem_depth=8, max_streams=8,
                    mem_words=128, mul_latency=lm, add_latency=la)
    progs = _cycle_programs(cfg)
    mem = random_image(cfg, 17)
    got, outs, _ = simulate(cfg, [p.words() for p in progs], mem, timing=ALWAYS_READY_1CYCLE)
    want = mem
    for prog, out in zip(progs, outs):
        want, status, _l1 = reference(cfg, prog, want)
        assert out.status == status
    # later programs read earlier results, some inf - inf: NaNs are compared by class
    np.testing.assert_array_equal(_canon_nan(got, fmt), _canon_nan(want, fmt))
    assert {o.status for o in outs} == {Status.OK, Status.BAD_LENGTH, Status.BAD_OPERAND,
                                        Status.BAD_ADDR}
    assert [o.cycles for o in outs] == [model_cycles(cfg, p, o.status)
                                        for p, o in zip(progs, outs)]


# ---------------------------------------------------------------------------------------
# Verilog
# ---------------------------------------------------------------------------------------
PORTS = ["clk", "rst", "cmd_valid", "cmd_ready", "cmd_data", "mem_req_valid", "mem_req_ready",
         "mem_req_we", "mem_req_addr", "mem_req_wdata", "mem_req_wmask", "mem_rsp_valid",
         "mem_rsp_data", "busy", "done", "status", "l1"]


@pytest.mark.parametrize("lanes,fmt", [
    (1, "bf16"), (1, "fp16"), (3, "bf16"), (3, "fp16"),
    pytest.param(8, "bf16", marks=pytest.mark.slow), pytest.param(8, "fp16", marks=pytest.mark.slow),
    pytest.param(64, "bf16", marks=pytest.mark.slow), pytest.param(64, "fp16", marks=pytest.mark.slow),
])
def test_verilog_converts(lanes, fmt):
    text = nme_verilog(NMEConfig(lanes=lanes, fmt=fmt), name="nme_t")
    assert "module nme_t(" in text
    header = text[text.index("module nme_t("):text.index(");")]
    for port in PORTS:
        assert f" {port}" in header or f"({port}" in header, port
    assert f"[{16 * lanes - 1}:0] mem_req_wdata" in text
    # the toggle counter is measurement logic: not in the generated (synthesised) NME
    assert "dbg_fu_toggles" not in text and "_prev" not in text


def test_verilog_cli(tmp_path):
    from coda.cli import main
    out = tmp_path / "nme.v"
    assert main(["verilog", "--lanes", "2", "--fmt", "fp16", "--depth", "8",
                 "--operand-isolation", "off", "-o", str(out)]) == 0
    assert "module nme(" in out.read_text()
    assert main(["verilog", "--lanes", "65", "-o", str(out)]) == 2    # ValueError -> 2


def test_verilog_cli_pipelined_units(tmp_path, capsys):
    """``--mul-latency`` / ``--add-latency`` reach the units (their stage registers are in
    the Verilog); out-of-range values are refused naming the value, nothing written."""
    from coda.cli import main
    out = tmp_path / "nme.v"
    assert main(["verilog", "--lanes", "2", "--depth", "8", "--mul-latency", "2",
                 "--add-latency", "3", "-o", str(out)]) == 0
    text = out.read_text()
    assert "mul_s1_prod" in text and "mul_s3_norm" not in text     # FPMUL_CUTS[2] = (1, 2)
    assert "add_s1_shift" in text and "add_s4_norm_shift" in text  # FPADD_CUTS[3] = (1, 2, 4)
    assert "add_s3_" not in text and "add_s5_" not in text
    assert "buf0_q" not in text
    assert main(["verilog", "--lanes", "2", "--depth", "8", "--operand-latency", "1",
                 "-o", str(out)]) == 0
    assert "buf0_q" in out.read_text() and "int8_lz_r" in out.read_text()
    out.unlink()
    for flag, bad in (("--mul-latency", str(MAX_MUL_LATENCY + 1)), ("--add-latency", "-1"),
                      ("--add-latency", str(MAX_ADD_LATENCY + 1)),
                      ("--operand-latency", str(MAX_OPERAND_LATENCY + 1))):
        assert main(["verilog", "--lanes", "2", flag, bad, "-o", str(out)]) == 2
        assert f"{flag} {bad}: expected an int 0.." in capsys.readouterr().err
    assert not out.exists()


def test_verilog_cli_refuses_options_of_another_top(tmp_path, capsys):
    """``--dimms/--ranks/--dram`` describe the DIMM-NMP; with ``--top nme`` they are refused
    by name (they used to be ignored silently), and nothing is written."""
    from coda.cli import main
    out = tmp_path / "nme.v"
    assert main(["verilog", "--top", "nme", "--dimms", "3", "--dram", "DDR4-3200",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--dimms, --dram given with --top nme" in err and "--top dimm takes" in err
    assert not out.exists()
    # unusable output paths and oversized systems fail before any elaboration
    (tmp_path / "afile").write_text("")
    for bad, message in ((["-o", str(tmp_path)], "is a folder, expected a file path"),
                         (["-o", ""], "-o '': expected a file path"),
                         (["-o", str(tmp_path / "afile" / "x.v")], "afile is a file"),
                         (["--top", "dimm", "--dimms", "1000", "--ranks", "1000", "-o", str(out)],
                          "= 1000000 ranks: expected at most 256"),
                         (["--name", "", "-o", str(out)], "name='': expected a Verilog identifier")):
        assert main(["verilog", "--lanes", "1", "--depth", "8", *bad]) == 2, bad
        assert message in capsys.readouterr().err, bad
    assert not out.exists()


def test_clock_gating_cli(tmp_path):
    """``--clock-gating`` adds one falling-edge gate flip-flop and one gated clock per lane
    register group (:data:`GATED_DOMAINS`); off, the design has the one clock; asked for
    without operand isolation (whose registers load every cycle) it is refused."""
    import re

    from coda.cli import main
    from coda.hw.nme.lane import GATED_DOMAINS
    assert main(["verilog", "--lanes", "2", "--clock-gating", "on", "--operand-isolation",
                 "off", "-o", str(tmp_path / "bad.v")]) == 2
    for flag, isolation, gated in (("on", "on", True), ("off", "on", False),
                                   ("off", "off", False)):
        out = tmp_path / f"nme_{flag}_{isolation}.v"
        assert main(["verilog", "--lanes", "2", "--depth", "8", "--clock-gating", flag,
                     "--operand-isolation", isolation, "-o", str(out)]) == 0
        text = out.read_text()
        clocks = set(re.findall(r"always @\((?:pos|neg)edge (\w+)\)", text))
        assert clocks == ({"clk"} | {f"{d}_clk" for d in GATED_DOMAINS} if gated else {"clk"})
        assert ("always @(negedge clk)" in text) == gated
