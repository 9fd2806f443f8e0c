"""NME in amaranth.sim: programs against a seeded memory model and the ISA reference
(tests/nme_sim_harness.py), bit for bit: directed programs (every R source, the arithmetic,
int8 dequantisation, L1), bad programs of every error class of isa.validate, and random
programs with random memory stalls."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, Status, UOp, validate
from nme_sim_harness import (DTYPES, SMALL, _as_bits, _as_float, _canon_nan, _random_program,
                             check, random_image, reference, simulate)


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
