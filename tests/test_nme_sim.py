"""NME in amaranth.sim: programs against a seeded memory model and an ISA reference.

The memory model answers reads in order after a random latency (>= 1 cycle) with random gaps
and refuses requests at random (``mem_req_ready`` low), all from an explicit seed. The
reference (:func:`reference`) executes a program per :mod:`coda.hw.isa` with torch eager
bf16/fp16 arithmetic, block by block, so results must match bit for bit.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from coda.hw.isa import NMEConfig, Op, Program, RSrc, Status, UOp, validate
from coda.hw.nme import NME
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
             max_cycles: int = 20000) -> tuple[np.ndarray, list[Outcome], dict]:
    """Run command-word lists one after the other on an NME against memory ``mem``.

    Args:
        programs: each a list of 64-bit command words (header + micro-ops).
        mem: uint16 [mem_words, lanes] image (copied).
        reset_after: {program index: cycles after its first word} to pulse ``rst`` for one
            cycle; that program then gets no Outcome (``None``) and the next one follows.
    Returns:
        (memory image after all programs, outcomes, log) where log counts writes seen
        after each reset (``writes_after_reset``).
    """
    mem = mem.copy()
    lanes = cfg.lanes
    dut = NME(cfg)
    top = Module()
    top.domains.sync = cd = ClockDomain("sync")
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-8)
    outcomes: list[Outcome | None] = []
    log = {"writes_after_reset": 0, "cycles": 0}
    reset_after = reset_after or {}

    async def bench(ctx):
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
                                            cycle - start + 1, ctx.get(dut.dbg_fu_toggles)))
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
    sim.run()
    return mem, outcomes, log


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
