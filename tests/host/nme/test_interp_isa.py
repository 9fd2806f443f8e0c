"""The torch interpreter against a word-by-word model of the ISA written from hw/nme/isa.py
(random programs, hypothesis), and directed ISA cases: bad programs change nothing,
validate's rule against reads of unwritten buffers, NaN bits, masked tails and the L1 sum's
order, the INT8 and GROUP sources, image and framing errors, the backend lookup."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, Status, UOp, encode_header, validate
from coda.host.nme import interp
from coda.host.nme.backend import TorchBackend, get_backend
from coda.host.nme.bits import (canonical_nan_bits, from_bits, int8_words_for, pack_int8_words,
                            pack_words, to_bits, torch_dtype, unpack_words)
from nme_images import _image, random_bits


# ---------------------------------------------------------------- the ISA, word by word

def word_model(cfg: NMEConfig, program: Program, mem: np.ndarray, buf_bits=None):
    """hw/nme/isa.py executed literally: blocks, passes, words; lanes as small torch vectors.

    ``buf_bits`` (uint16 [nbuf, depth, lanes]) is what the buffers hold at the start (what a
    previous program left), zeros by default: an accepted program must not depend on it."""
    words = [int(w) for w in program.words()[1:]]
    status = validate(len(words), program.n_elems, words, cfg)
    mem = mem.copy()
    if status != Status.OK:
        return mem, status, 0.0
    dtype, lanes, depth = torch_dtype(cfg.fmt), cfg.lanes, cfg.depth
    mem_f = torch.from_numpy(mem.view(np.int16)).view(dtype)
    mem_i8 = mem.view(np.int8)
    nan = torch.tensor(canonical_nan_bits(cfg.fmt), dtype=torch.int16).view(dtype)
    n_words = -(-program.n_elems // lanes)
    bufs = torch.zeros(cfg.nbuf, depth, lanes, dtype=dtype)
    if buf_bits is not None:
        bufs = torch.from_numpy(buf_bits.astype(np.uint16).view(np.int16).copy()).view(dtype)
    acc = np.zeros(lanes, np.float32)
    for b0 in range(0, n_words, depth):
        for u in program.uops:
            for w in range(b0, min(b0 + depth, n_words)):
                valid = lanes if w < n_words - 1 else program.n_elems - w * lanes
                if u.rsrc == RSrc.BUF:
                    r = bufs[u.r, w % depth].clone()
                elif u.rsrc == RSrc.MEM:
                    r = mem_f[u.addr + w].clone()
                elif u.rsrc == RSrc.CHAN:
                    r = mem_f[u.addr + w % u.param].clone()
                elif u.rsrc == RSrc.GROUP:
                    e = 0 if u.param == 0 else w // u.param
                    r = mem_f[u.addr + e // lanes, e % lanes].repeat(lanes)
                else:
                    half = w % 2
                    raw = mem_i8[u.addr + w // 2, half * lanes:(half + 1) * lanes]
                    r = torch.from_numpy(raw.copy()).to(dtype)
                # unused fields may name any register (isa.validate ignores them)
                p = bufs[u.p, w % depth] if u.op != Op.MOV else None
                q = bufs[u.q, w % depth] if u.op == Op.MAC else None
                if u.op == Op.L1:
                    d = torch.abs(p.float() - r.float()).numpy()
                    with np.errstate(over="ignore"):   # fp32 overflow to inf is IEEE, expected
                        acc[:valid] = (acc[:valid] + d[:valid]).astype(np.float32)
                    continue
                res = {Op.MOV: lambda: r, Op.ADD: lambda: p + r, Op.SUB: lambda: p - r,
                       Op.MUL: lambda: p * r, Op.MAC: lambda: p + q * r}[Op(u.op)]()
                if u.op != Op.MOV:
                    res = torch.where(torch.isnan(res), nan, res)
                if u.store:
                    mem_f[u.addr + w, :valid] = res[:valid]
                else:
                    bufs[u.d, w % depth] = res
    total = np.float32(0)
    for lane in range(lanes):
        total = np.float32(total + acc[lane])
    return mem, status, float(total)


@st.composite
def random_programs(draw):
    fmt = draw(st.sampled_from(["bf16", "fp16"]))
    lanes = draw(st.integers(1, 4))
    cfg = NMEConfig(lanes=lanes, fmt=fmt, depth=draw(st.integers(1, 5)),
                    nbuf=draw(st.integers(2, 4)), mem_words=48, max_streams=4, imem_depth=6)
    uops, written = [], []
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(list(Op)))
        store = op != Op.L1 and draw(st.booleans()) and draw(st.booleans())
        rsrc = RSrc.BUF if store else draw(st.sampled_from(list(RSrc)))
        if not written and draw(st.integers(0, 9)):  # mostly start with a load
            op, store, rsrc = Op.MOV, False, draw(st.sampled_from(list(RSrc)[1:]))
        reg = st.integers(0, cfg.nbuf - (draw(st.integers(0, 9)) > 0))  # sometimes nbuf (bad)
        # reads mostly of buffers written before (else BAD_OPERAND), sometimes of any
        src = st.sampled_from(written) if written and draw(st.integers(0, 9)) else reg
        u = UOp(op, rsrc, store, d=draw(reg), p=draw(src), q=draw(src), r=draw(src),
                addr=draw(st.integers(0, 40)), param=draw(st.integers(0, 4)))
        uops.append(u)
        if not store and op != Op.L1:
            written.append(u.d)
    prog = Program(n_elems=draw(st.integers(1, 28)), uops=tuple(uops))
    return cfg, prog, draw(st.integers(0, 2 ** 32 - 1))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs())
def test_interpreter_equals_word_by_word_model(case):
    """Also: what the buffers held before (zeros or another program's leftovers) does not
    matter, because validate() rejects reads of buffers the program has not written."""
    cfg, program, seed = case
    rng = np.random.default_rng(seed)
    mem = random_bits(rng, (cfg.mem_words, cfg.lanes), cfg.fmt)
    leftovers = random_bits(rng, (cfg.nbuf, cfg.depth, cfg.lanes), cfg.fmt)
    res = interp.run_program(cfg, program, mem)
    want_mem, want_status, want_l1 = word_model(cfg, program, mem, leftovers)
    assert res.status == want_status
    assert np.array_equal(res.mem, want_mem)
    assert np.float32(res.l1).tobytes() == np.float32(want_l1).tobytes() or \
        (np.isnan(res.l1) and np.isnan(want_l1))


# ---------------------------------------------------------------- directed ISA cases

@pytest.mark.parametrize("uops, n_elems, status", [
    ((UOp(Op.MOV, RSrc.MEM, addr=0),) * 40, 8, Status.BAD_LENGTH),
    ((UOp(Op.MOV, RSrc.MEM, addr=0),), 0, Status.BAD_LENGTH),
    ((UOp(9, RSrc.MEM, addr=0),), 8, Status.BAD_OPCODE),
    ((UOp(Op.MOV, 6, addr=0),), 8, Status.BAD_OPCODE),
    ((UOp(Op.ADD, RSrc.MEM, p=4, addr=0),), 8, Status.BAD_OPERAND),
    ((UOp(Op.MOV, RSrc.MEM, True, addr=0),), 8, Status.BAD_OPERAND),
    ((UOp(Op.MOV, RSrc.CHAN, addr=0, param=0),), 8, Status.BAD_OPERAND),
    ((UOp(Op.MOV, RSrc.MEM, addr=62),), 24, Status.BAD_ADDR),
    ((UOp(Op.MOV, RSrc.MEM, addr=0),) * 25, 8, Status.TOO_MANY_STREAMS),
])
def test_bad_programs_change_nothing(uops, n_elems, status):
    cfg = NMEConfig(lanes=8, mem_words=64)
    mem = _image(cfg)
    good_then_bad = (UOp(Op.MOV, RSrc.MEM, addr=0), UOp(Op.MOV, RSrc.BUF, True, addr=8)) + uops
    for prog_uops in (uops, good_then_bad if len(good_then_bad) <= 32 else uops):
        res = interp.run_program(cfg, Program(n_elems, prog_uops), mem)
        assert res.status == status and res.l1 == 0.0
        assert np.array_equal(res.mem, mem)
        # the NME's check FSM (lanes a power of two, no GROUP): header + n words, V_LEN
        # (a BAD_LENGTH program is rejected in V_DIV's first cycle), V_DIV, 3 per micro-op
        # checked (V_FETCH, V_CHECK, V_DECIDE; the failing one too), V_END, FINISH
        n, k = len(prog_uops), len(prog_uops) - len(uops)
        cycles = TorchBackend().execute(cfg, Program(n_elems, prog_uops), mem).cycles
        assert cycles == {Status.BAD_LENGTH: 1 + n + 1 + 1 + 1,
                          Status.TOO_MANY_STREAMS: 1 + n + 1 + 1 + 3 * n + 1 + 1,
                          }.get(status, 1 + n + 1 + 1 + 3 * (k + 1) + 1)


_X = UOp(Op.MOV, RSrc.MEM, d=0, addr=0)   # writes buffer 0


@pytest.mark.parametrize("uops, status", [
    # every read field, of a buffer no earlier micro-op wrote
    ((UOp(Op.ADD, RSrc.MEM, d=1, p=0, addr=8),), Status.BAD_OPERAND),
    ((_X, UOp(Op.SUB, RSrc.MEM, d=1, p=2, addr=8)), Status.BAD_OPERAND),
    ((_X, UOp(Op.MUL, RSrc.BUF, d=1, p=0, r=3)), Status.BAD_OPERAND),
    ((_X, UOp(Op.MAC, RSrc.MEM, d=1, p=0, q=1, addr=8)), Status.BAD_OPERAND),
    ((_X, UOp(Op.L1, RSrc.MEM, p=1, addr=8)), Status.BAD_OPERAND),
    ((_X, UOp(Op.L1, RSrc.BUF, p=0, r=1)), Status.BAD_OPERAND),
    ((_X, UOp(Op.MOV, RSrc.BUF, True, r=1, addr=8)), Status.BAD_OPERAND),
    # the op's own d is not an earlier write; a store's or an L1's d field writes nothing
    ((_X, UOp(Op.ADD, RSrc.MEM, d=1, p=1, addr=8)), Status.BAD_OPERAND),
    ((_X, UOp(Op.MOV, RSrc.BUF, True, d=1, r=0, addr=8), UOp(Op.MOV, RSrc.BUF, d=2, r=1)),
     Status.BAD_OPERAND),
    ((_X, UOp(Op.L1, RSrc.MEM, d=1, p=0, addr=8), UOp(Op.MOV, RSrc.BUF, d=2, r=1)),
     Status.BAD_OPERAND),
    # fields the op does not use are not reads
    ((UOp(Op.MOV, RSrc.MEM, d=0, p=3, q=3, r=3, addr=0),), Status.OK),
    ((_X, UOp(Op.ADD, RSrc.CHAN, d=1, p=0, q=3, r=3, addr=8, param=1)), Status.OK),
    ((_X, UOp(Op.MOV, RSrc.BUF, d=0, r=0), UOp(Op.MAC, RSrc.BUF, d=0, p=0, q=0, r=0)),
     Status.OK),
    ((_X, UOp(Op.MOV, RSrc.BUF, True, r=0, addr=8)), Status.OK),
    # precedence: opcode, then operand, then address of the same micro-op; earlier micro-ops
    # first; the stream count last
    ((UOp(9, RSrc.BUF, p=1, r=1),), Status.BAD_OPCODE),
    ((UOp(Op.MOV, 6, d=0, r=1),), Status.BAD_OPCODE),
    ((UOp(Op.ADD, RSrc.MEM, d=0, p=1, addr=63),), Status.BAD_OPERAND),
    ((UOp(Op.MOV, RSrc.MEM, d=0, addr=63), UOp(Op.ADD, RSrc.BUF, p=1, r=1)), Status.BAD_ADDR),
    ((_X,) * 24 + (UOp(Op.ADD, RSrc.MEM, d=1, p=1, addr=0),), Status.BAD_OPERAND),
    ((_X,) * 25 + (UOp(Op.ADD, RSrc.MEM, d=1, p=0, addr=0),), Status.TOO_MANY_STREAMS),
])
def test_validate_rejects_reads_of_unwritten_buffers(uops, status):
    cfg = NMEConfig(lanes=4, nbuf=4, mem_words=64)
    words = Program(16, uops).words()
    assert validate(len(uops), 16, words[1:], cfg) == status
    mem = _image(cfg)
    res = interp.run_program(cfg, Program(16, uops), mem)
    assert res.status == status
    if status != Status.OK:
        assert np.array_equal(res.mem, mem)


def test_mov_copies_bits_and_arithmetic_nan_is_canonical():
    cfg = NMEConfig(lanes=2, fmt="fp16", mem_words=8)
    mem = np.zeros((8, 2), np.uint16)
    mem[0] = [0x7C01, 0xFE55]            # two NaN payloads
    mem[1] = [0x3C00, 0x3C00]
    copy = Program(2, (UOp(Op.MOV, RSrc.MEM, addr=0), UOp(Op.MOV, RSrc.BUF, True, addr=2)))
    add = Program(2, (UOp(Op.MOV, RSrc.MEM, addr=0), UOp(Op.ADD, RSrc.MEM, addr=1),
                      UOp(Op.MOV, RSrc.BUF, True, addr=3)))
    out = interp.run_program(cfg, add, interp.run_program(cfg, copy, mem).mem).mem
    assert out[2].tolist() == [0x7C01, 0xFE55]
    assert out[3].tolist() == [0x7E00, 0x7E00]


def test_masked_tail_stores_nothing_and_l1_sums_lanes_in_order():
    cfg = NMEConfig(lanes=2, fmt="bf16", mem_words=16, depth=2)
    a = np.array([2.0 ** 24, 0, 1, 5, 1, 7], np.float32)
    mem = np.full((16, 2), 0xFFFF, np.uint16)
    mem[0:3] = pack_words(to_bits(torch.tensor(a).to(torch.bfloat16)), 2)
    mem[3:6] = 0
    # 5 elements: the 6th (7.0) is a masked tail lane: it must not count
    prog = Program(5, (UOp(Op.MOV, RSrc.MEM, addr=0), UOp(Op.L1, RSrc.MEM, p=0, addr=3),
                       UOp(Op.MOV, RSrc.BUF, True, r=0, addr=8)))
    res = interp.run_program(cfg, prog, mem)
    # lane 0: ((2^24 + 1) -> 2^24) + 1 -> 2^24 in fp32; lane 1: 5; total 2^24 + 5 -> 2^24 + 4
    assert res.l1 == 2.0 ** 24 + 4
    assert res.mem[10, 1] == 0xFFFF and res.mem[10, 0] == to_bits(
        torch.tensor([1.0], dtype=torch.bfloat16))[0]


def test_int8_and_group_sources_follow_the_word_layout():
    cfg = NMEConfig(lanes=2, fmt="bf16", mem_words=16)
    q = np.array([1, -2, 3, -4, 5, -6, 7, -128], np.int8)
    mem = np.zeros((16, 2), np.uint16)
    mem[0:int8_words_for(8, 2)] = pack_int8_words(q, 2)
    mem[4] = to_bits(torch.tensor([0.5, 4.0], dtype=torch.bfloat16))  # one scale per 4 elems
    prog = Program(8, (UOp(Op.MOV, RSrc.INT8, addr=0),
                       UOp(Op.MUL, RSrc.GROUP, addr=4, param=2),
                       UOp(Op.MOV, RSrc.BUF, True, addr=6)))
    res = interp.run_program(cfg, prog, mem)
    y = from_bits(unpack_words(res.mem[6:10], 8), "bf16")
    assert y.tolist() == [0.5, -1.0, 1.5, -2.0, 20.0, -24.0, 28.0, -512.0]


def test_image_and_framing_errors():
    cfg = NMEConfig(lanes=4, mem_words=8)
    prog = Program(4, (UOp(Op.MOV, RSrc.MEM, addr=0),))
    with pytest.raises(ValueError, match=r"memory image of shape \(8, 2\): expected "
                                         r"\(mem_words, lanes\) = \(8, 4\)"):
        interp.run_program(cfg, prog, np.zeros((8, 2), np.uint16))
    with pytest.raises(ValueError, match=r"expected a numpy uint16 array"):
        interp.run_program(cfg, prog, np.zeros((8, 4), np.float32))
    with pytest.raises(ValueError, match=r"header says n_uops=2, got 1 micro-op words"):
        interp.run_words(cfg, [encode_header(2, 4), 0], np.zeros((8, 4), np.uint16))


def test_backend_lookup():
    assert get_backend("torch").name == "torch"
    with pytest.raises(ValueError, match=r"unknown backend 'gpu': expected one of"):
        get_backend("gpu")
    with pytest.raises(ValueError, match=r"mem_latency=0: expected >= 1 cycle"):
        TorchBackend(mem_latency=0)


def test_nan_l1_sum_is_the_canonical_fp32_nan():
    cfg = NMEConfig(lanes=2, fmt="fp16", mem_words=8)
    mem = np.zeros((8, 2), np.uint16)
    mem[0] = [0xFE01, 0x3C00]  # a negative NaN with a payload
    prog = Program(2, (UOp(Op.MOV, RSrc.MEM, addr=0), UOp(Op.L1, RSrc.MEM, p=0, addr=1)))
    l1 = interp.run_program(cfg, prog, mem).l1
    assert np.float32(l1).view(np.uint32) == 0x7FC00000
