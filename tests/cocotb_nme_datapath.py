"""cocotb tests of the NME's datapath (gathered by tests/cocotb_nme.py, run inside the
simulator): every micro-op x R source and every buffer role, long CHAN/GROUP periods, reads
after stores in one block, the compiled operators, FP edge cases, the units' normalisation
paths, the solver's vectors of surviving mutants, random bits while the memory stalls, and
L1 sums at the corners; against torch computed directly and the interpreter, bit for bit.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import cocotb
import numpy as np
import torch

from coda.host.nme import bits as hb
from coda.host.nme import ops as ref
from coda.host.nme.compiler import compile_op, plan_layout
from coda.hw.nme.isa import Op, RSrc, UOp
from cocotb_nme_bench import (CFG, COV, DTYPE, EXP_BITS, MAN_BITS, SCALE, Checker, L, f32_bits,
                              finite_bits, l1_torch, nme_test, place, prog_words, r_operand,
                              random_image, record, torch_op, uop_case)


# ----------------------------------------------------------------------------- micro-ops
OPS_UNDER_TEST = [Op.MOV, Op.ADD, Op.SUB, Op.MUL, Op.MAC, Op.L1]
RSRCS = [RSrc.BUF, RSrc.MEM, RSrc.CHAN, RSrc.GROUP, RSrc.INT8]


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
