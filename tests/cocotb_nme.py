"""cocotb tests of the NME RTL against the torch reference (run inside the simulator).

Started by ``tests/test_cosim_nme.py`` (or :func:`coda.cosim.build.run_cocotb`) with:

- ``CODA_COSIM_CFG``: the :class:`~coda.hw.nme.isa.NMEConfig` of the build, as JSON;
- ``CODA_COSIM_LANES`` / ``CODA_COSIM_MEM_WORDS``: memory geometry (for the models);
- ``CODA_COSIM_SCALE``: sample-size multiplier (default 1: a few minutes for all tests);
- ``CODA_COSIM_REPORT``: optional JSON file where tests record numbers (cycles, toggles);
- ``CODA_COVERAGE``: optional JSON file: functional coverage (:mod:`coda.cosim.coverage`) is
  sampled on every program and written there at the end of each test;
- ``CODA_MUTANT``: on the mutant netlist of :mod:`coda.verify.mutation`, the mutant to run.

Every check compares the whole memory image (so masked tail lanes and bytes outside the output
must be untouched) and the L1 bits, NaNs by class (the NME emits a canonical NaN, torch keeps
x86 payloads for fp16). References: :mod:`coda.host.nme.interp` (the program interpreter) and, for
micro-ops and operators, torch computed directly here or through :mod:`coda.host.nme.ops`.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import struct
from pathlib import Path

import cocotb
import numpy as np
import torch
from cocotb.triggers import Timer

from coda.cosim.coverage import NMECoverage
from coda.cosim.tb import CLOCK_NS, NMEHarness
from coda.host.nme import bits as hb
from coda.host.nme import ops as ref
from coda.host.nme.compiler import compile_op, plan_layout
from coda.host.nme.interp import run_words
from coda.hw.nme.isa import (NMEConfig, Op, Program, RSrc, Status, UOp, decode_uop, encode_header,
                         encode_uop, validate)

torch.set_num_threads(1)

CFG = NMEConfig(**json.loads(os.environ.get("CODA_COSIM_CFG", "{}")))
SCALE = max(1, int(os.environ.get("CODA_COSIM_SCALE", "1")))
DTYPE = hb.torch_dtype(CFG.fmt)
L = CFG.lanes
EXP_BITS, MAN_BITS = {"bf16": (8, 7), "fp16": (5, 10)}[CFG.fmt]
COVERAGE_FILE = os.environ.get("CODA_COVERAGE")
COV = NMECoverage(CFG) if COVERAGE_FILE else None


MUTANT = int(os.environ.get("CODA_MUTANT", "0"))
_MUTANT_KILLED = []      # the test that killed the mutant under test, once one has


def nme_test(test):
    """Every test of this module: on a mutant netlist (coda.verify.mutation, ``CODA_MUTANT``
    = K > 0) first select mutant K, and once a test has failed (the mutant is killed) skip
    the rest; when the test ends, passed or failed, write the coverage sampled so far
    (cumulative over this simulator's tests)."""
    @functools.wraps(test)
    async def run(dut):
        if MUTANT:
            if _MUTANT_KILLED:
                dut._log.info("mutant %d already killed by %s: skipped", MUTANT,
                              _MUTANT_KILLED[0])
                return
            dut.dut.mutsel.value = MUTANT
        try:
            await test(dut)
        except BaseException:
            _MUTANT_KILLED.append(test.__name__)
            raise
        finally:
            if COV is not None:
                COV.export(COVERAGE_FILE)
    return run


# ----------------------------------------------------------------------------- helpers
def record(key: str, value) -> None:
    """Add ``key: value`` to the JSON report named by CODA_COSIM_REPORT (if any)."""
    path = os.environ.get("CODA_COSIM_REPORT")
    if not path:
        return
    p = Path(path)
    data = json.loads(p.read_text()) if p.exists() else {}
    data[key] = value
    p.write_text(json.dumps(data, indent=1, sort_keys=True))


def f32_bits(x: float | torch.Tensor) -> int:
    if isinstance(x, torch.Tensor):
        return int(x.to(torch.float32).reshape(()).view(torch.int32).item()) & 0xFFFF_FFFF
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32_same(a: int, b: int) -> bool:
    """fp32 bit patterns equal, NaNs by class."""
    nan = lambda v: (v & 0x7F80_0000) == 0x7F80_0000 and (v & 0x007F_FFFF) != 0  # noqa: E731
    return (nan(a) and nan(b)) or a == b


def random_image(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 1 << 16, size=(CFG.mem_words, L), dtype=np.uint16)


def finite_bits(rng: np.random.Generator, n: int, scale: float = 4.0) -> np.ndarray:
    """Bit patterns of n normal-distributed finite values of the format."""
    t = (torch.from_numpy(rng.standard_normal(n).astype(np.float32)) * scale).to(DTYPE)
    return hb.to_bits(t)


def place(mem: np.ndarray, addr: int, bits: np.ndarray) -> int:
    """Write flat 16-bit patterns as words from ``addr`` (tail lanes of the last word kept as
    they were); returns the number of words."""
    flat = np.asarray(bits).view(np.uint16).reshape(-1)
    words = hb.words_for(flat.size, L)
    view = mem[addr:addr + words].reshape(-1)
    view[:flat.size] = flat
    mem[addr:addr + words] = view.reshape(words, L)
    return words


def assert_image(got: np.ndarray, exp: np.ndarray, what: str) -> None:
    """The RTL's memory image equals the interpreter's bit for bit (NaNs included: both
    give the NME's canonical quiet NaN for an arithmetic NaN result and copy a MOV's bits)."""
    if np.array_equal(got, exp):
        return
    bad = np.argwhere(got != exp)
    w, j = bad[0]
    raise AssertionError(f"{what}: {len(bad)} elements differ; first word {w} lane {j}: "
                         f"rtl {got[w, j]:#06x} expected {exp[w, j]:#06x}")


class Checker:
    """Runs programs on the RTL and on the interpreter, compares everything, keeps counts."""

    def __init__(self, dut):
        self.h = NMEHarness(dut)
        self.dut = dut
        self.programs = 0
        self.elements = 0
        self.cycles = 0

    async def start(self):
        await self.h.start()

    async def run(self, words: list[int], mem: np.ndarray, what: str, *, expect_l1=None):
        """Run ``words`` on ``mem`` in RTL; check image, status and L1 against the
        interpreter; returns (RunResult, image after)."""
        res, out = await self.h.execute(words, mem, cycle_limit(words))
        assert not res.protocol_faults(), f"{what}: protocol faults {res.protocol_faults()}"
        gold = run_words(CFG, words, mem, observe=COV.uop if COV else None)
        if COV is not None:
            COV.program(decode_n(words[0]), res.status, self.h.memory.config)
            if res.status == Status.OK:
                COV.buffers([decode_uop(w) for w in words[1:]])
            if any((w & 0xF) == Op.L1 for w in words[1:]) and res.status == Status.OK:
                COV.l1(gold.l1)
        assert res.status == gold.status, f"{what}: status {res.status!r}, expected {gold.status!r}"
        assert_image(out, gold.mem, what)
        assert f32_same(res.l1_bits, f32_bits(gold.l1)), \
            f"{what}: l1 {res.l1_bits:#010x}, interpreter {f32_bits(gold.l1):#010x}"
        if expect_l1 is not None:
            assert f32_same(res.l1_bits, expect_l1), \
                f"{what}: l1 {res.l1_bits:#010x}, torch {expect_l1:#010x}"
        self.programs += 1
        self.elements += decode_n(words[0])
        self.cycles += res.cycles
        return res, out


def cycle_limit(words: list[int]) -> int:
    """Watchdog for one program: far more cycles than it can need even at 85% stalls and a
    31-cycle latency (a hung NME fails in seconds, not after 50M cycles)."""
    n_uops, n = words[0] & 0xFF, decode_n(words[0])
    n_words = -(-n // L)
    return min((1 << 32) - 1, 60 * (n_uops + 2) * (n_words + 40) + 20_000)


def decode_n(header: int) -> int:
    return (header >> 8) & 0xFFFF_FFFF


def prog_words(n_elems: int, uops: list[UOp]) -> list[int]:
    return Program(n_elems, tuple(uops)).words()


# ----------------------------------------------------------------------------- micro-ops
OPS_UNDER_TEST = [Op.MOV, Op.ADD, Op.SUB, Op.MUL, Op.MAC, Op.L1]
RSRCS = [RSrc.BUF, RSrc.MEM, RSrc.CHAN, RSrc.GROUP, RSrc.INT8]


def torch_op(op: Op, p: torch.Tensor, q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    if op == Op.MOV:
        return r
    if op == Op.ADD:
        return p + r
    if op == Op.SUB:
        return p - r
    if op == Op.MUL:
        return p * r
    if op == Op.MAC:
        return p + q * r
    raise ValueError(op)


def l1_torch(p: torch.Tensor, r: torch.Tensor) -> int:
    """L1 the NME way: per-lane fp32 accumulation in word order, lanes summed 0..L-1."""
    n = p.numel()
    d = (p.to(torch.float32) - r.to(torch.float32)).abs()
    pad = torch.zeros(hb.words_for(n, L) * L, dtype=torch.float32)
    pad[:n] = d
    per_word = pad.reshape(-1, L)
    acc = torch.zeros(L, dtype=torch.float32)
    for row in per_word:
        acc = acc + row
    total = torch.zeros((), dtype=torch.float32)
    for j in range(L):
        total = total + acc[j]
    return f32_bits(total)


def r_operand(rsrc: RSrc, n: int, b: np.ndarray, chan: np.ndarray, group_vec: np.ndarray,
              group_words: int, q8: np.ndarray) -> torch.Tensor:
    """The R operand per element, computed from the isa definition (independent of interp)."""
    w = np.arange(n) // L
    j = np.arange(n) % L
    if rsrc in (RSrc.BUF, RSrc.MEM):
        bits = b[:n]
    elif rsrc == RSrc.CHAN:
        cw = chan.reshape(-1, L)
        bits = cw[w % cw.shape[0], j]
    elif rsrc == RSrc.GROUP:
        bits = group_vec[0] * np.ones(n, np.uint16) if group_words == 0 else \
            group_vec[w // group_words]
    else:
        vals = q8[(w % 2) * L + j + (w // 2) * 2 * L]
        return torch.from_numpy(vals.astype(np.int8)).to(DTYPE)
    return hb.from_bits(np.ascontiguousarray(bits), CFG.fmt)


async def uop_case(ck: Checker, rng, op: Op, rsrc: RSrc, n: int, *, store_direct: bool,
                   finite: bool, bufs: tuple[int, int, int, int] = (0, 2, 1, 3)) -> None:
    """One micro-op on random operands, checked against torch: P, Q, R loaded from memory
    into buffers ``bufs[:3]``, the result to buffer ``bufs[3]`` and stored (or stored
    directly)."""
    bp, bq, br, bd = bufs
    mem = random_image(rng)
    words_n = hb.words_for(n, L)
    gen = (lambda k: finite_bits(rng, k)) if finite else \
        (lambda k: rng.integers(0, 1 << 16, k, dtype=np.uint16))
    a, b, c = gen(n), gen(n), gen(n)
    chan_words = 3
    chan = gen(chan_words * L)
    group_words = 2 if rsrc != RSrc.GROUP or rng.random() < 0.5 else 0  # 0: scalar
    group_vec = gen(1 if group_words == 0 else (words_n - 1) // group_words + 1)
    q8 = rng.integers(-128, 128, 2 * L * (-(-words_n // 2)), dtype=np.int8)
    A, B, C, Y = 0, words_n, 2 * words_n, 3 * words_n
    CH = 4 * words_n
    GV = CH + chan_words
    Q = GV + hb.words_for(group_vec.size, L)
    if Q + q8.size // (2 * L) > CFG.mem_words:
        raise ValueError(f"uop_case n={n}: needs {Q + q8.size // (2 * L)} words, "
                         f"the memory has {CFG.mem_words}")
    for addr, bits in ((A, a), (B, b), (C, c), (CH, chan), (GV, group_vec)):
        place(mem, addr, bits)
    mem[Q:Q + q8.size // (2 * L)] = q8.view(np.uint16).reshape(-1, L)
    addr = {RSrc.BUF: 0, RSrc.MEM: B, RSrc.CHAN: CH, RSrc.GROUP: GV, RSrc.INT8: Q}[rsrc]
    param = {RSrc.CHAN: chan_words, RSrc.GROUP: group_words}.get(rsrc, 0)
    uops = [UOp(Op.MOV, RSrc.MEM, d=bp, addr=A), UOp(Op.MOV, RSrc.MEM, d=br, addr=B),
            UOp(Op.MOV, RSrc.MEM, d=bq, addr=C)]
    if store_direct:
        uops.append(UOp(op, RSrc.BUF, store=True, p=bp, q=bq, r=br, addr=Y))
    else:
        uops.append(UOp(op, rsrc, d=bd, p=bp, q=bq, r=br, addr=addr, param=param))
        if op != Op.L1:
            uops.append(UOp(Op.MOV, RSrc.BUF, store=True, r=bd, addr=Y))
    words = prog_words(n, uops)
    P = hb.from_bits(a, CFG.fmt)
    Q_ = hb.from_bits(c, CFG.fmt)
    R = r_operand(RSrc.BUF if store_direct else rsrc, n, b, chan, group_vec, group_words, q8)
    what = f"{op.name} {'store' if store_direct else rsrc.name} n={n} buffers {bufs}"
    if op == Op.L1:
        await ck.run(words, mem, what, expect_l1=l1_torch(P, R))
        return
    _, out = await ck.run(words, mem, what)
    exp = hb.to_bits(torch_op(op, P, Q_, R))
    got = hb.unpack_words(out[Y:Y + words_n], n)
    assert hb.same_bits(got, exp, CFG.fmt), f"{what}: differs from torch computed directly"


@cocotb.test()
@nme_test
async def test_uop_matrix(dut):
    """Every micro-op x every R source (and the direct store), random bits and finite values,
    lengths not a multiple of lanes, against torch directly and the interpreter."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(101)
    for op in OPS_UNDER_TEST:
        for rsrc in RSRCS:
            for finite in (False, True):
                n = int(rng.integers(1, 3 * CFG.depth * L)) | 1
                await uop_case(ck, rng, op, rsrc, n, store_direct=False, finite=finite)
        if op != Op.L1:
            await uop_case(ck, rng, op, RSrc.BUF, 5 * L + 3, store_direct=True, finite=False)
    record("uop_matrix_programs", ck.programs)
    dut._log.info("micro-op matrix: %d programs, %d elements, %d cycles, 0 mismatches",
                  ck.programs, ck.elements, ck.cycles)


@cocotb.test()
@nme_test
async def test_buffer_roles(dut):
    """Every buffer in every role: each assignment of buffers 0..3 to P, Q, R and the
    destination (all 24 orderings; buffers 4.. in a sliding window), by MAC (which reads P,
    Q, R and writes the destination), L1 and the direct store; short streams with a masked
    tail, against torch. (The micro-op matrix keeps P, Q, R, D in
    buffers 0, 2, 1, 3: a select that misroutes one buffer index would go unseen.)"""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(107)
    nbuf = CFG.nbuf
    assert nbuf >= 4, f"test_buffer_roles: needs nbuf >= 4 distinct buffers, nbuf={nbuf}"
    roles = list(itertools.permutations(range(4))) + \
        [tuple(i + k for k in range(4)) for i in range(1, nbuf - 3)]   # buffers 4.. if any
    for i, bufs in enumerate(roles):
        # MAC reads P, Q and R and writes the destination: every role in one program (the
        # operand routing is execute's, the same for every op); L1 reads P and R only
        for op in (Op.MAC, Op.L1):
            await uop_case(ck, rng, op, RSrc.BUF, 2 * L + 1 + i % L, store_direct=False,
                           finite=True, bufs=bufs)
        await uop_case(ck, rng, Op.ADD if i % 2 else Op.MAC, RSrc.BUF, L + 3,
                       store_direct=True, finite=True, bufs=bufs)
    record("buffer_roles_programs", ck.programs)
    dut._log.info("buffer roles: %d assignments, %d programs, 0 mismatches", len(roles),
                  ck.programs)


@cocotb.test()
@nme_test
async def test_long_periods(dut):
    """CHAN and scaled GROUP streams whose period (param, in words) passes 1024 and 2048:
    the issue side's phase counter and parameter register then use their upper bits (the
    other tests' periods are a few words). P + R, stored over P, against torch."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(111)
    for rsrc, period in ((RSrc.CHAN, 1030), (RSrc.GROUP, 1030), (RSrc.GROUP, 2050)):
        n = (period + 30) * L - 3
        words_n = hb.words_for(n, L)
        a, chan = finite_bits(rng, n), finite_bits(rng, period * L)
        group_vec = finite_bits(rng, (words_n - 1) // period + 1)
        A = 0
        R_AT = words_n
        end = R_AT + (period if rsrc == RSrc.CHAN else hb.words_for(group_vec.size, L))
        if end > CFG.mem_words:
            raise ValueError(f"test_long_periods: needs {end} words, the memory has "
                             f"{CFG.mem_words}")
        mem = random_image(rng)
        place(mem, A, a)
        place(mem, R_AT, chan if rsrc == RSrc.CHAN else group_vec)
        uops = [UOp(Op.MOV, RSrc.MEM, d=0, addr=A),
                UOp(Op.ADD, rsrc, d=1, p=0, addr=R_AT, param=period),
                UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=A)]
        what = f"ADD {rsrc.name} period {period} words, n={n}"
        _, out = await ck.run(prog_words(n, uops), mem, what)
        P = hb.from_bits(a, CFG.fmt)
        R = r_operand(rsrc, n, None, chan, group_vec, period, None)
        exp = hb.to_bits(torch_op(Op.ADD, P, P, R))
        got = hb.unpack_words(out[A:A + words_n], n)
        assert hb.same_bits(got, exp, CFG.fmt), f"{what}: differs from torch computed directly"
    record("long_period_programs", ck.programs)


@cocotb.test()
@nme_test
async def test_read_after_store(dut):
    """A micro-op that reads from memory what an earlier micro-op of the same program stored,
    in the same block: the issue side must hold its reads until the store pass has written
    (reads otherwise go ahead of the stores and see stale memory). (P + P) stored, then
    read back as R of a MUL, against torch."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(113)
    for n in (L + 3, CFG.depth * L, 3 * CFG.depth * L - 5):
        words_n = hb.words_for(n, L)
        a = finite_bits(rng, n)
        A, Y, Z = 0, words_n, 2 * words_n
        mem = random_image(rng)
        place(mem, A, a)
        uops = [UOp(Op.MOV, RSrc.MEM, d=0, addr=A),
                UOp(Op.ADD, RSrc.BUF, store=True, p=0, r=0, addr=Y),
                UOp(Op.MUL, RSrc.MEM, d=1, p=0, addr=Y),
                UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=Z)]
        what = f"store then read back, n={n}"
        _, out = await ck.run(prog_words(n, uops), mem, what)
        P = hb.from_bits(a, CFG.fmt)
        S = torch_op(Op.ADD, P, P, P)
        exp = hb.to_bits(torch_op(Op.MUL, P, P, S))
        got = hb.unpack_words(out[Z:Z + words_n], n)
        assert hb.same_bits(got, exp, CFG.fmt), f"{what}: differs from torch computed directly"
    record("read_after_store_programs", ck.programs)


# ----------------------------------------------------------------------------- operators
def operator_inputs(op: str, rng, t: int, c: int, k: int = 3, group: int | None = None,
                    finite: bool = True) -> dict:
    def fl(*shape):
        n = int(np.prod(shape))
        bits = finite_bits(rng, n) if finite else rng.integers(0, 1 << 16, n, dtype=np.uint16)
        return hb.from_bits(bits.reshape(shape), CFG.fmt)

    if op in ("add", "sub", "mul", "l1_distance"):
        return {"a": fl(t * c + 3), "b": fl(t * c + 3)}
    if op == "scale":
        return {"a": fl(t, c), "s": fl(c)}
    if op == "gated_residual":
        return {"x": fl(t, c), "g": fl(c), "c": fl(t, c)}
    if op == "segment":
        return {"x": fl(t, c), "g": fl(k, c), "c": fl(k, t, c)}
    if op == "cfg_combine":
        return {"u": fl(t, c), "c": fl(t, c), "s": fl()}
    if op == "dequant_int8":
        q = torch.from_numpy(rng.integers(-128, 128, (t, c), dtype=np.int8))
        return {"q": q, "scale": fl(t, c // group)}
    raise ValueError(op)


def image_with(inputs: dict, layout: dict, rng) -> np.ndarray:
    mem = random_image(rng)
    for name, tensor in inputs.items():
        addrs = layout[name]
        if isinstance(addrs, list):
            for kk, a in enumerate(addrs):
                place(mem, a, hb.to_bits(tensor[kk]))
        elif tensor.dtype == torch.int8:
            packed = hb.pack_int8_words(tensor, L)
            mem[addrs:addrs + packed.shape[0]] = packed
        else:
            place(mem, addrs, hb.to_bits(tensor))
    return mem


async def operator_case(ck: Checker, rng, op: str, t: int, c: int, *, k: int = 3,
                        group: int | None = None, finite: bool = True) -> None:
    inputs = operator_inputs(op, rng, t, c, k, group, finite)
    shapes = {n: tuple(v.shape) for n, v in inputs.items()}
    layout, _ = plan_layout(op, CFG, shapes, group, base=int(rng.integers(0, 64)))
    program = compile_op(op, CFG, shapes, layout, group)
    mem = image_with(inputs, layout, rng)
    kw = dict(inputs)
    if op == "dequant_int8":
        kw["group"] = group
    expected = ref.get_op(op)(**kw)
    what = f"{op} T={t} C={c} K={k} G={group}"
    if COV is not None:
        COV.operator(op, k=k, group=group, channels=c)
    if op == "l1_distance":
        await ck.run(program.words(), mem, what, expect_l1=f32_bits(expected))
        return
    _, out = await ck.run(program.words(), mem, what)
    y = layout["y"]
    got = hb.unpack_words(out[y:y + hb.words_for(expected.numel(), L)], expected.numel())
    assert hb.same_bits(got, hb.to_bits(expected).reshape(-1), CFG.fmt), \
        f"{what}: differs from coda.host.nme.ops"


@cocotb.test()
@nme_test
async def test_operators(dut):
    """Every operator of the reference table, compiled and run, vs coda.host.nme.ops."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(202)
    c = 3 * L
    for rep in range(SCALE):
        for op in ("add", "sub", "mul", "scale", "gated_residual", "cfg_combine",
                   "l1_distance"):
            for finite in (True, False):
                await operator_case(ck, rng, op, t=int(rng.integers(1, 9)), c=c, finite=finite)
        for k in range(1, 9):
            await operator_case(ck, rng, "segment", t=int(rng.integers(1, 7)), c=c, k=k)
        # scale groups of one word and wider, one group per row and several
        for cc, group in ((6 * L, L), (6 * L, 3 * L), (6 * L, 6 * L), (L, L)):
            await operator_case(ck, rng, "dequant_int8", t=int(rng.integers(1, 7)), c=cc,
                                group=group)
    dut._log.info("operators: %d programs, %d elements, 0 mismatches", ck.programs, ck.elements)
    record("operator_programs", ck.programs)


# ----------------------------------------------------------------------------- FP edge cases
def edge_values() -> np.ndarray:
    """Bit patterns of directed FP edge cases of the format (both signs)."""
    e, m = EXP_BITS, MAN_BITS
    bias = (1 << (e - 1)) - 1
    exp_max = (1 << e) - 1

    def enc(exp, man):
        return (exp << m) | man

    pos = {0, 1, 2, 3, (1 << m) - 1, 1 << (m - 1),               # zero, subnormals
           enc(1, 0), enc(1, 1), enc(2, 0),                       # smallest normals
           enc(exp_max - 1, (1 << m) - 1), enc(exp_max - 1, (1 << m) - 2),  # largest
           enc(exp_max, 0), enc(exp_max, 1 << (m - 1)), enc(exp_max, 1)}     # inf, NaNs
    # 1.0 and neighbours, and powers of two / halfway points relative to 1.0
    for k in range(-(m + 3), 3):
        ex = bias + k
        if 1 <= ex < exp_max:
            pos |= {enc(ex, 0), enc(ex, 1), enc(ex, (1 << m) - 1), enc(ex, 1 << (m - 1)),
                    enc(ex, (1 << (m - 1)) + 1)}
    vals = sorted(pos)
    return np.array(vals + [v | 0x8000 for v in vals], dtype=np.uint16)


async def check_pairs(ck: Checker, rng, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                      ops, what: str) -> int:
    """Run ``op(P=a, Q=c, R=b)`` for each op of ``ops`` (ADD/SUB/MUL/MAC) elementwise over the
    bit patterns (element i in lane i % L), in programs of as many elements as the memory
    holds, and compare every result with torch computed directly (and, through the Checker,
    with the interpreter). Returns the elements checked."""
    n = a.size
    chunk = (CFG.mem_words // 5) * L
    total = 0
    for start in range(0, n, chunk):
        sl = slice(start, min(n, start + chunk))
        aa, bb, cc = a[sl], b[sl], c[sl]
        k = aa.size
        wn = hb.words_for(k, L)
        for op in ops:
            mem = random_image(rng)
            place(mem, 0, aa)
            place(mem, wn, bb)
            place(mem, 2 * wn, cc)
            uops = [UOp(Op.MOV, RSrc.MEM, d=0, addr=0), UOp(Op.MOV, RSrc.MEM, d=2, addr=2 * wn),
                    UOp(op, RSrc.MEM, d=1, p=0, q=2, addr=wn),
                    UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=3 * wn)]
            _, out = await ck.run(prog_words(k, uops), mem, f"{what} {op.name}")
            P, R, Q = (hb.from_bits(x, CFG.fmt) for x in (aa, bb, cc))
            exp = hb.to_bits(torch_op(op, P, Q, R))
            got = hb.unpack_words(out[3 * wn:4 * wn], k)
            if not hb.same_bits(got, exp, CFG.fmt):
                i = int(np.flatnonzero((got != exp) & ~(hb.is_nan_bits(got, CFG.fmt)
                                                        & hb.is_nan_bits(exp, CFG.fmt)))[0])
                raise AssertionError(f"{what} {op.name}: a={aa[i]:#06x} b={bb[i]:#06x} "
                                     f"c={cc[i]:#06x}: rtl {got[i]:#06x} torch {exp[i]:#06x}")
            total += k
    return total


async def check_l1(ck: Checker, rng, p: np.ndarray, r: np.ndarray, what: str) -> None:
    """One L1 program over P = ``p``, R = ``r`` (bit patterns, element i in lane i % L); its
    sum against the NME's order of fp32 additions computed with torch (:func:`l1_torch`)."""
    mem = random_image(rng)
    wn = hb.words_for(p.size, L)
    place(mem, 0, p)
    place(mem, wn, r)
    words = prog_words(p.size, [UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                UOp(Op.L1, RSrc.MEM, p=0, addr=wn)])
    P, R = hb.from_bits(p, CFG.fmt), hb.from_bits(r, CFG.fmt)
    await ck.run(words, mem, what, expect_l1=l1_torch(P, R))


@cocotb.test()
@nme_test
async def test_fp_edge_cases(dut):
    """All pairs of directed edge values (ties, sticky bits, subnormal results, cancellation,
    overflow, inf-inf, 0*inf, signed zeros, largest/smallest) through ADD, SUB, MUL, MAC."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(303)
    vals = edge_values()
    a = np.repeat(vals, vals.size)
    b = np.tile(vals, vals.size)
    total = await check_pairs(ck, rng, a, b, np.roll(b, 7), (Op.ADD, Op.SUB, Op.MUL, Op.MAC),
                              "edge")
    dut._log.info("FP edge cases: %d values, %d operand pairs per op, %d checked, 0 mismatches",
                  vals.size, a.size, total)
    record("edge_pairs_per_op", int(a.size))


# ----------------------------------------------------------------------------- normalisation
def encode(sign: np.ndarray, exp: np.ndarray, man: np.ndarray) -> np.ndarray:
    """Bit patterns of the format from sign, biased exponent field and mantissa field."""
    return ((sign.astype(np.uint32) << (EXP_BITS + MAN_BITS))
            | (exp.astype(np.uint32) << MAN_BITS) | man.astype(np.uint32)).astype(np.uint16)


def lz_mantissas(rng, n: int) -> np.ndarray:
    """``n`` mantissa fields whose leading-zero count is uniform over 0..MAN_BITS (MAN_BITS:
    the field 0), the bits below the leading one random: every input of a normaliser's
    leading-zero tree is reached, not mostly the short counts uniform fields give."""
    lz = rng.integers(0, MAN_BITS + 1, n)
    full = rng.integers(0, 1 << MAN_BITS, n) | (1 << (MAN_BITS - 1))
    return (full >> lz).astype(np.uint32)


def near_cancellation(rng, n: int, max_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs (a, b) of finite values of the same sign whose difference ``a - b``
    cancels leading bits or needs alignment. Half: b's bit pattern within 8 of a's (the
    nearest values, across binade boundaries too: deep cancellation down to an exact 0);
    half: exponent fields at most ``max_offset`` apart with mantissas of uniform
    leading-zero count (:func:`lz_mantissas`). a's exponent field is drawn near the
    subnormal boundary (field 0 included), around 1.0 and at random."""
    bias, emax = (1 << (EXP_BITS - 1)) - 1, (1 << EXP_BITS) - 2
    base = np.concatenate([rng.integers(0, MAN_BITS + 4, n // 2),
                           bias + rng.integers(-2, 3, n // 4),
                           rng.integers(0, emax + 1, n - n // 2 - n // 4)])
    ea = np.clip(base, 0, emax)
    eb = np.clip(ea + rng.integers(-max_offset, max_offset + 1, n), 0, emax)
    sign = rng.integers(0, 2, n)
    a = encode(sign, ea, lz_mantissas(rng, n))
    far = encode(sign, eb, lz_mantissas(rng, n))
    mag = (a & np.uint16(0x7FFF)).astype(np.int32) + rng.integers(-8, 9, n)
    top = (emax << MAN_BITS) | ((1 << MAN_BITS) - 1)          # largest finite
    near = (np.clip(mag, 0, top).astype(np.uint16)) | (a & np.uint16(0x8000))
    b = np.where(rng.random(n) < 0.5, near, far).astype(np.uint16)
    perm = rng.permutation(n)
    return a[perm], b[perm]


def small_products(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs (a, b) whose product needs the multiplier's normalisation: a subnormal (or
    a tiny normal) times a value of exponent 0..MAN_BITS+3 above 1.0, and two normals whose
    product lands within MAN_BITS+3 binades of the subnormal boundary on either side;
    mantissas of uniform leading-zero count (:func:`lz_mantissas`)."""
    bias, emax = (1 << (EXP_BITS - 1)) - 1, (1 << EXP_BITS) - 2
    h = n // 2
    ea1 = rng.integers(0, 3, h)
    eb1 = bias + rng.integers(0, MAN_BITS + 4, h)
    ea2 = rng.integers(1, bias, n - h)
    eb2 = np.clip(bias + 1 - ea2 + rng.integers(-(MAN_BITS + 3), MAN_BITS + 4, n - h), 1, emax)
    ea, eb = np.concatenate([ea1, ea2]), np.concatenate([eb1, eb2])
    a = encode(rng.integers(0, 2, n), ea, lz_mantissas(rng, n))
    b = encode(rng.integers(0, 2, n), eb, lz_mantissas(rng, n))
    swap = rng.random(n) < 0.5
    return np.where(swap, b, a), np.where(swap, a, b)


@cocotb.test()
@nme_test
async def test_normalisation_paths(dut):
    """The normalisation of every lane's units: near-cancelling sums and differences (ADD,
    SUB; every leading-zero count, subnormal and zero results), products of subnormal and
    tiny operands (MUL, MAC), and the fp32 L1 subtractor and accumulator on near-cancelling
    16-bit pairs whose exponents are up to 27 apart, two pairs alone in one lane per program
    so that every |P - R| shows in the sum. Found by the mutation run (coda.verify.mutation):
    random bits reach these paths about once per 2**8 elements per exponent, too rarely per
    lane."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(909)
    n = 256 * L
    # deep cancellation (exponents <= 2 apart) and alignment with sticky bits (up to the
    # adder's MAN_BITS+4 alignment bits apart)
    pairs = [near_cancellation(rng, n, 2), near_cancellation(rng, n, MAN_BITS + 4)]
    a, b = (np.concatenate(x) for x in zip(*pairs))
    total = await check_pairs(ck, rng, a, b, b, (Op.SUB,), "cancellation")
    # ADD cancels when the signs differ: the same pairs with R negated
    total += await check_pairs(ck, rng, a, b ^ np.uint16(0x8000), b, (Op.ADD,), "cancellation")
    a, b = small_products(rng, 2 * n)
    total += await check_pairs(ck, rng, a, b, np.roll(a, 3), (Op.MUL, Op.MAC), "small products")
    # L1 (fp32 subtractor: 23 + 4 alignment bits; the accumulator adding two of them, often
    # both subnormal): two pairs per program, in lane i % L of two words, the other lanes
    # P = R, so the L1 sum is that lane's |P1 - R1| + |P2 - R2| alone and any change shows
    p, r = near_cancellation(rng, 2 * 16 * L, 23 + 4)
    for i in range(p.size // 2):
        pw = finite_bits(rng, 2 * L)
        rw = pw.copy()
        for w in range(2):
            pw[w * L + i % L], rw[w * L + i % L] = p[2 * i + w], r[2 * i + w]
        await check_l1(ck, rng, pw, rw, f"L1 pairs {p[2 * i]:#06x} {r[2 * i]:#06x} "
                       f"{p[2 * i + 1]:#06x} {r[2 * i + 1]:#06x} in lane {i % L}")
    dut._log.info("normalisation paths: %d elements through ADD/SUB/MUL/MAC, %d L1 pairs, "
                  "0 mismatches", total, p.size)


# ----------------------------------------------------------------------------- solver vectors
#: operands found by the equivalence analysis of surviving mutants (coda.verify.mutation_proof:
#: a copy of build/mutation/vectors.json that ``make mutation`` writes)
SOLVER_VECTORS = Path(__file__).resolve().parent / "data" / "mutation_vectors.json"


@cocotb.test()
@nme_test
async def test_solver_vectors(dut):
    """Each directed vector of :data:`SOLVER_VECTORS`: the operands under which a mutant of
    an arithmetic unit differs from the original (the solver's counterexample, made into a
    program), run as stored and, for single-lane L1 vectors, rotated into every lane;
    results against torch (and the interpreter). Vectors of another lane count are run
    with their words cut or padded to this NME's lanes (they then only test values)."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(1010)
    data = json.loads(SOLVER_VECTORS.read_text())
    runs = 0
    for vec in data["vectors"]:
        op = Op[vec["op"]]
        shifts = range(L) if vec["rotate"] else (0,)
        for shift in shifts:
            p, r = (np.array([np.roll((w + [0] * L)[:L], shift) for w in vec[k]],
                             np.uint16).reshape(-1) for k in ("p", "r"))
            what = f"solver vector of mutant {vec['mutant']} ({vec['module']}) shifted {shift}"
            if op == Op.L1:
                await check_l1(ck, rng, p, r, what)
            else:
                await check_pairs(ck, rng, p, r, p, (op,), what)
            runs += 1
    dut._log.info("solver vectors: %d vectors, %d programs, 0 mismatches",
                  len(data["vectors"]), runs)
    record("solver_vector_programs", runs)


# ----------------------------------------------------------------------------- random bits
@cocotb.test()
@nme_test
async def test_random_bits_with_stalls(dut):
    """Uniform random 16-bit patterns through ADD/SUB/MUL/MAC/L1 while the memory stalls at
    random with several latencies."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(404)
    settings = [(1, 0.0, 0.0), (2, 0.25, 0.25), (7, 0.5, 0.1), (31, 0.1, 0.6), (3, 0.85, 0.85)]
    cycles = {}
    for latency, ps_req, ps_rsp in settings:
        ck.h.memory.configure(latency=latency, req_stall=ps_req, rsp_stall=ps_rsp,
                              seed=int(rng.integers(1, 1 << 31)))
        for op in (Op.ADD, Op.SUB, Op.MUL, Op.MAC, Op.L1):
            n = int(rng.integers(2 * CFG.depth * L, 4 * CFG.depth * L)) * SCALE
            n = min(n, (CFG.mem_words // 5) * L) - 1
            finite = op == Op.L1
            before = ck.cycles
            await uop_case(ck, rng, op, RSrc.MEM, n, store_direct=False, finite=finite)
            cycles[f"{op.name}@lat{latency}/req{ps_req}/rsp{ps_rsp}/n{n}"] = ck.cycles - before
    # the other stall patterns (stalls on one side only, latency alone), one program each
    rng2 = np.random.default_rng(405)
    for latency, ps_req, ps_rsp in [(1, 0.0, 0.3), (1, 0.3, 0.0), (1, 0.3, 0.3), (4, 0.0, 0.0),
                                    (4, 0.0, 0.3), (4, 0.3, 0.0)]:
        ck.h.memory.configure(latency=latency, req_stall=ps_req, rsp_stall=ps_rsp,
                              seed=int(rng2.integers(1, 1 << 31)))
        n = int(rng2.integers(CFG.depth * L, 2 * CFG.depth * L)) * SCALE - 1
        await uop_case(ck, rng2, (Op.ADD, Op.MAC, Op.L1)[latency % 3], RSrc.MEM, n,
                       store_direct=False, finite=True)
    ck.h.memory.configure()
    record("random_stall_cycles", cycles)
    dut._log.info("random bits with stalls: %d programs, %d elements, 0 mismatches",
                  ck.programs, ck.elements)


# ----------------------------------------------------------------------------- L1 sums
@cocotb.test()
@nme_test
async def test_l1_corner_sums(dut):
    """L1 sums that are exactly zero (equal streams), infinite (an infinite operand; for
    bf16 also finite differences whose fp32 sum overflows) and NaN, vs torch."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(808)
    n = 3 * L + 5
    big = hb.to_bits(torch.full((n,), float(torch.finfo(DTYPE).max), dtype=DTYPE))
    cases = {"zero": (finite_bits(rng, n), None), "inf": (finite_bits(rng, n), "inf"),
             "nan": (finite_bits(rng, n), "nan")}
    if CFG.fmt == "bf16":   # n * (max - (-max)) exceeds fp32's range
        cases["overflow"] = (big, "neg")
    for what, (a, how) in cases.items():
        b = a.copy()
        if how == "inf":
            a = a.copy()
            a[n // 2] = hb.to_bits(torch.tensor([float("inf")], dtype=DTYPE))[0]
        elif how == "nan":
            a = a.copy()
            a[1] = hb.to_bits(torch.tensor([float("nan")], dtype=DTYPE))[0]
        elif how == "neg":
            b = b | np.uint16(0x8000)
        mem = random_image(rng)
        wn = hb.words_for(n, L)
        place(mem, 0, a)
        place(mem, wn, b)
        words = prog_words(n, [UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                               UOp(Op.L1, RSrc.MEM, p=0, addr=wn)])
        P, R = hb.from_bits(a, CFG.fmt), hb.from_bits(b, CFG.fmt)
        await ck.run(words, mem, f"L1 {what}", expect_l1=l1_torch(P, R))
    dut._log.info("L1 corner sums: %s, 0 mismatches", sorted(cases))


# ----------------------------------------------------------------------------- tails
@cocotb.test()
@nme_test
async def test_tails(dut):
    """Every length 1 .. 2*lanes+1 and around block boundaries: masked lanes stay untouched."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(505)
    lengths = list(range(1, 2 * L + 2))
    for blocks in (1, 2):
        edge = blocks * CFG.depth * L
        lengths += [edge - L - 1, edge - 1, edge, edge + 1, edge + L + 1]
    lengths = sorted({n for n in lengths if n >= 1})
    for n in lengths:
        op = (Op.MOV, Op.ADD, Op.MAC)[n % 3]
        await uop_case(ck, rng, op, RSrc.MEM, n, store_direct=False, finite=False)
    await uop_case(ck, rng, Op.L1, RSrc.MEM, 2 * L + 1, store_direct=False, finite=True)
    dut._log.info("tails: lengths %s, 0 mismatches", lengths)


# ----------------------------------------------------------------------------- bad commands
def bad_programs() -> list[tuple[str, list[int]]]:
    """(name, command words) of programs the NME must reject, one per error rule."""
    ok_uop = UOp(Op.MOV, RSrc.MEM, d=0, addr=0)
    st = UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=64)
    enc = encode_uop
    raw = lambda op=0, rsrc=0, store=0, d=0, p=0, q=0, r=0, addr=0, param=0: (  # noqa: E731
        op | rsrc << 4 | store << 7 | d << 8 | p << 12 | q << 16 | r << 20 | addr << 24
        | param << 48)
    nb = CFG.nbuf
    cases = [
        ("n_uops=0", [encode_header(0, 8)]),
        ("n_uops>imem_depth", [encode_header(CFG.imem_depth + 1, 8)]
         + [enc(ok_uop)] * (CFG.imem_depth + 1)),
        ("n_elems=0", [encode_header(2, 0), enc(ok_uop), enc(st)]),
        ("n_elems>max_elems", [encode_header(2, CFG.max_elems + 1), enc(ok_uop), enc(st)]),
        ("opcode 7", [encode_header(2, 8), enc(ok_uop), raw(op=7)]),
        ("opcode 15", [encode_header(1, 8), raw(op=15, rsrc=1)]),
        ("rsrc 5", [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=5, d=1, p=0)]),
        ("rsrc 7", [encode_header(1, 8), raw(op=0, rsrc=7)]),
        ("store with MEM", [encode_header(2, 8), enc(ok_uop), raw(op=0, rsrc=1, store=1)]),
        ("store with L1", [encode_header(2, 8), enc(ok_uop), raw(op=5, rsrc=0, store=1)]),
        ("CHAN param 0", [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=2, d=1)]),
        ("MEM past end", [encode_header(2, 8 * L), enc(ok_uop),
                          raw(op=0, rsrc=1, d=1, addr=CFG.mem_words - 7)]),
        ("store past end", [encode_header(2, 8 * L), enc(ok_uop),
                            raw(op=0, store=1, addr=CFG.mem_words - 1)]),
        ("CHAN past end", [encode_header(2, 8), enc(ok_uop),
                           raw(op=1, rsrc=2, d=1, addr=CFG.mem_words - 2, param=3)]),
        ("INT8 past end", [encode_header(2, 4 * L), enc(ok_uop),
                           raw(op=0, rsrc=4, d=1, addr=CFG.mem_words - 1)]),
        ("GROUP past end", [encode_header(2, 4 * L), enc(ok_uop),
                            raw(op=0, rsrc=3, d=1, addr=min(CFG.mem_words, (1 << 24) - 1),
                                param=1)]),
        ("addr 2**24-1", [encode_header(1, 8), raw(op=0, rsrc=1, addr=(1 << 24) - 1)]),
    ]
    if nb < 16:   # with 16 buffers no 4-bit index is out of range
        cases += [
            ("d>=nbuf", [encode_header(1, 8), raw(op=0, rsrc=1, d=nb)]),
            ("p>=nbuf", [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=1, d=0, p=nb)]),
            ("q>=nbuf (MAC)", [encode_header(2, 8), enc(ok_uop), raw(op=4, rsrc=1, q=nb)]),
            ("r>=nbuf (BUF)", [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=0, r=nb)]),
        ]
    if CFG.max_streams + 1 <= CFG.imem_depth:
        n = CFG.max_streams + 1
        cases.append(("too many streams", [encode_header(n, 8)] + [enc(ok_uop)] * n))
    cases.append(("read of an unwritten buffer",
                  [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=1, d=1, p=1)]))
    # a bad operand after a bad opcode: the earlier rule in program order wins
    cases.append(("opcode then operand", [encode_header(2, 8), raw(op=9), raw(op=0, d=nb)]))
    return cases


@cocotb.test()
@nme_test
async def test_bad_commands(dut):
    """Each error status: the code isa.validate gives, memory untouched (full dump), nothing
    written, and the next good program runs correctly."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(606)
    seen = set()
    for name, words in bad_programs():
        mem = random_image(rng)
        await ck.h.memory.load(mem)
        ck.h.forget()
        res = await ck.h.driver.run(words, cycle_limit(words))
        n_uops, n_elems = words[0] & 0xFF, (words[0] >> 8) & 0xFFFF_FFFF
        if COV is not None:
            COV.program(n_elems, res.status, ck.h.memory.config)
        expected = validate(n_uops, n_elems, words[1:], CFG)
        assert expected != Status.OK, f"{name}: test bug, validate() accepts it"
        assert res.status == expected, f"{name}: status {res.status!r}, expected {expected!r}"
        assert res.dirty_addrs.size == 0 and res.nwrites == 0, f"{name}: memory written"
        assert not res.protocol_faults(), f"{name}: protocol faults {res.protocol_faults()}"
        after = await ck.h.memory.dump()
        assert np.array_equal(after, mem), f"{name}: memory changed"
        seen.add(expected)
        # the NME is ready for the next program, which must work
        await uop_case(ck, rng, Op.ADD, RSrc.MEM, 3 * L + 1, store_direct=False, finite=False)
    errors = {s for s in Status if s != Status.OK}
    assert seen == errors, f"error classes covered {sorted(seen)}, expected {sorted(errors)}"
    dut._log.info("bad commands: %d programs, classes %s", len(bad_programs()),
                  sorted(s.name for s in seen))


def checker_programs() -> list[tuple[str, list[int]]]:
    """(name, words) of programs at the edges of every rule of the program check: addresses
    one word inside and outside the memory for each R source and the store (short and long
    programs, GROUP scale shapes whose extent needs the checker's multiplier, and scaled
    GROUPs whose last scale is exactly the last word of memory or one past it), every address
    bit alone, reads of each unwritten buffer from each operand slot, every out-of-range
    buffer index, out-of-range indices in the fields a micro-op does not use (which it must
    ignore), every opcode x R-source code, and the length limits. Their statuses come
    from isa.validate (the golden model), not from this list."""
    enc = encode_uop
    raw = lambda op=0, rsrc=0, store=0, d=0, p=0, q=0, r=0, addr=0, param=0: (  # noqa: E731
        op | rsrc << 4 | store << 7 | d << 8 | p << 12 | q << 16 | r << 20 | addr << 24
        | param << 48)
    mw, nb = CFG.mem_words, CFG.nbuf
    first = enc(UOp(Op.MOV, RSrc.MEM, d=0, addr=0))
    out = []
    for n in (3 * L + 1, 40 * L, CFG.max_elems):
        w = -(-n // L)
        ext = {"MEM": w, "INT8": -(-w // 2), "CHAN": 3, "GROUP": 1}
        for g in (1, 3, 1 << 10, (1 << 16) - 1):
            ext[f"GROUP/{g}"] = (w - 1) // (g * L) + 1
        for name, e in ext.items():
            rsrc = RSrc[name.split("/")[0]]
            param = 3 if name == "CHAN" else int(name.split("/")[1]) if "/" in name else 0
            for addr in sorted({mw - e, mw - e + 1, *(1 << k for k in range(8, 24)),
                                *((1 << k) - 1 for k in range(8, 25))}):
                if 0 <= addr < 1 << 24:
                    out.append((f"{name} n={n} addr={addr}",
                                [encode_header(2, n), first,
                                 raw(op=0, rsrc=rsrc, d=1, addr=addr, param=param)]))
        for addr in (mw - w, mw - w + 1, *(1 << k for k in range(12, 24))):
            if 0 <= addr < 1 << 24:
                out.append((f"store n={n} addr={addr}",
                            [encode_header(2, n), first, raw(op=0, store=1, r=0, addr=addr)]))
    for b in range(16):      # reads of unwritten / out-of-range buffers from every slot
        out.append((f"p={b}", [encode_header(2, 8), first, raw(op=1, rsrc=1, d=0, p=b)]))
        out.append((f"q={b}", [encode_header(2, 8), first, raw(op=4, rsrc=1, d=0, q=b)]))
        out.append((f"r={b}", [encode_header(2, 8), first, raw(op=0, rsrc=0, d=1, r=b)]))
        out.append((f"d={b}", [encode_header(2, 8), first, raw(op=0, rsrc=1, d=b)]))
        out.append((f"L1 p={b}", [encode_header(2, 8), first, raw(op=5, rsrc=1, p=b)]))
    for g, s in itertools.product((1, 3), (4, 8, 12, 13)):   # a scaled GROUP needing
        w = s * g * L + 1    # s + 1 scales (W - 1 = s g L): s + 1 or s left in memory
        for addr in (mw - s - 1, mw - s):
            out.append((f"GROUP/{g} W={w} addr={addr}", [encode_header(2, w * L), first, raw(
                op=0, rsrc=RSrc.GROUP, d=1, addr=addr, param=g)]))
    hdr = encode_header(2, 8)
    for b in (nb, 15):       # fields a micro-op does not use may hold anything
        for rsrc in (RSrc.MEM, RSrc.CHAN, RSrc.GROUP, RSrc.INT8):
            out.append((f"ADD {rsrc.name} r={b}", [hdr, first, raw(
                op=1, rsrc=rsrc, d=1, p=0, r=b, addr=64, param=1)]))
        out.append((f"MOV p={b} q={b}", [hdr, first, raw(op=0, rsrc=0, d=1, p=b, q=b)]))
        out.append((f"ADD q={b}", [hdr, first, raw(op=1, rsrc=0, d=1, p=0, q=b)]))
        out.append((f"store d={b} p={b}", [hdr, first, raw(op=0, store=1, d=b, p=b, addr=64)]))
        out.append((f"L1 d={b} q={b}", [hdr, first, raw(op=5, rsrc=0, d=b, q=b)]))
    for op in range(16):
        for rsrc in range(8):
            out.append((f"op={op} rsrc={rsrc}",
                        [encode_header(2, 8), first, raw(op=op, rsrc=rsrc, d=1, p=0, q=0, r=0,
                                                         addr=64, param=1)]))
    for n in (0, 1, CFG.max_elems, CFG.max_elems + 1, (1 << 32) - 1):
        out.append((f"n_elems={n}", [encode_header(1, n), first]))
    return out


@cocotb.test()
@nme_test
async def test_checker_rules(dut):
    """Every program of checker_programs ends with the status isa.validate gives; rejected
    ones write nothing and are rejected within a few cycles; the accepted short ones and the
    scaled-GROUP extent boundaries run and match the interpreter."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(909)
    mem = random_image(rng)
    await ck.h.memory.load(mem)
    ck.h.forget()
    counts: dict[str, int] = {}
    for name, words in checker_programs():
        n_uops, n_elems = words[0] & 0xFF, decode_n(words[0])
        expected = validate(n_uops, n_elems, words[1:], CFG)
        counts[expected.name] = counts.get(expected.name, 0) + 1
        if expected == Status.OK:
            # the short accepted ones run (the long ones are the other tests'), and the
            # GROUP extent boundaries (a multiplier that is wrong rejects them)
            if n_elems <= 4 * L or " W=" in name:
                await ck.run(words, random_image(rng), f"checker {name}")
            continue
        res = await ck.h.driver.run(words, 2_000)
        if COV is not None:
            COV.program(n_elems, res.status, ck.h.memory.config)
        assert res.status == expected, f"checker {name}: status {res.status!r}, expected " \
            f"{expected!r}"
        assert not res.timeout and res.nwrites == 0 and res.dirty_addrs.size == 0, \
            f"checker {name}: ran or wrote"
    dut._log.info("checker rules: %s", counts)


# ----------------------------------------------------------------------------- reset
@cocotb.test()
@nme_test
async def test_reset_mid_program(dut):
    """A reset in the middle of a long program: the NME goes idle at once, accepts the next
    program and computes it correctly (also with stalls and reads in flight)."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(707)
    n = (CFG.mem_words // 5) * L - 3
    for delay in (6, 17, 150, 1500):
        ck.h.memory.configure(latency=5, req_stall=0.3, rsp_stall=0.3, seed=delay)
        mem = random_image(rng)
        await ck.h.sync_memory(mem)
        words = prog_words(n, [UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                               UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=n // L + 1),
                               UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=3 * (n // L + 1))])
        ck.h.driver.start(words)
        await Timer(delay * CLOCK_NS, unit="ns")
        assert int(dut.tb_nme_busy.value) == 1, f"delay {delay}: NME not busy mid-program"
        await ck.h.driver.reset(3)
        if COV is not None:
            COV.reset(delay)
        res = await ck.h.driver.wait()
        assert res.aborted, "reset did not abort the job"
        assert not res.timeout
        assert int(dut.tb_nme_busy.value) == 0, "NME busy after reset"
        ck.h.forget()
        ck.h.memory.configure()
        await uop_case(ck, rng, Op.MAC, RSrc.MEM, 5 * L + 3, store_direct=False, finite=False)
        await uop_case(ck, rng, Op.L1, RSrc.MEM, 5 * L + 3, store_direct=False, finite=True)
    dut._log.info("reset mid-program: 3 resets, programs after each correct")


# ----------------------------------------------------------------------------- toggles
def isolation_program(rng) -> tuple[list[int], np.ndarray]:
    """Gated residual with a masked tail followed by a MOV/ADD mix (the representative
    program of the operand-isolation measurement)."""
    t, c = 5, 3 * L
    n = t * c - (L // 2 + 1)                  # masked tail
    wn = hb.words_for(n, L)
    mem = random_image(rng)
    X, G, C, Y, Z = 0, wn, wn + 3, 2 * wn + 3, 3 * wn + 3
    for addr, bits in ((X, finite_bits(rng, n)), (G, finite_bits(rng, c)),
                       (C, finite_bits(rng, n))):
        place(mem, addr, bits)
    uops = [UOp(Op.MOV, RSrc.MEM, d=0, addr=X), UOp(Op.MOV, RSrc.CHAN, d=1, addr=G, param=3),
            UOp(Op.MAC, RSrc.MEM, d=0, p=0, q=1, addr=C),
            UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=Y),
            UOp(Op.MOV, RSrc.MEM, d=2, addr=C), UOp(Op.ADD, RSrc.BUF, d=3, p=2, r=0),
            UOp(Op.MOV, RSrc.BUF, d=2, r=3), UOp(Op.ADD, RSrc.BUF, store=True, p=2, r=3, addr=Z)]
    return prog_words(n, uops), mem


@cocotb.test()
@nme_test
async def test_operand_isolation_toggles(dut):
    """Toggle count of the FU operand registers (dbg_fu_toggles) over the representative
    program (0 on an NME built without its simulation-only toggle counter, the default);
    the pytest side compares isolation-on and -off builds made with the counter."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(808)
    words, mem = isolation_program(rng)
    res, _ = await ck.run(words, mem, "isolation program")
    key = f"toggles_isolation_{'on' if CFG.operand_isolation else 'off'}"
    record(key, res.toggles)
    record("cycles_isolation_program", res.cycles)
    dut._log.info("%s = %d over %d cycles", key, res.toggles, res.cycles)


# ----------------------------------------------------------------------------- speed
@cocotb.test()
@nme_test
async def test_speed(dut):
    """Big MOV/ADD program: simulated NME cycles per second of wall time (recorded)."""
    import time as _time
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(909)
    wn = CFG.mem_words // 3 - 1
    n = wn * L
    mem = random_image(rng)
    words = prog_words(n, [UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                           UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=wn),
                           UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * wn)])
    await ck.h.sync_memory(mem)
    t0 = _time.perf_counter()
    res = await ck.h.driver.run(words, cycle_limit(words))
    dt = _time.perf_counter() - t0
    assert res.status == Status.OK and not res.protocol_faults()
    record("speed_cycles", res.cycles)
    record("speed_cycles_per_s", res.cycles / dt)
    dut._log.info("speed: %d cycles in %.3f s = %.0f cycles/s (%d elements)", res.cycles, dt,
                  res.cycles / dt, n)
