"""The shared parts of the NME's cocotb tests (tests/cocotb_nme_datapath.py and
cocotb_nme_control.py, gathered by tests/cocotb_nme.py; run inside the simulator): the
configuration read from the environment (see tests/cocotb_nme.py), the :func:`nme_test`
wrapper (mutant selection, coverage export), the :class:`Checker` that runs programs on the
RTL and the interpreter and compares everything, stimulus helpers, and one micro-op on
random operands against torch (:func:`uop_case`).
"""


from __future__ import annotations

import functools
import json
import os
import struct
from pathlib import Path

import numpy as np
import torch

from coda.cosim.nme.coverage import NMECoverage
from coda.cosim.nme.tb import NMEHarness
from coda.host.nme import bits as hb
from coda.host.nme.interp import run_words
from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, Status, UOp, decode_uop

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
    """Every cocotb test of the NME (tests/cocotb_nme_datapath.py, cocotb_nme_control.py): on
    a mutant netlist (coda.verify.mutation, ``CODA_MUTANT`` = K > 0) first select mutant K,
    and once a test has failed (the mutant is killed) skip the rest; when the test ends,
    passed or failed, write the coverage sampled so far (cumulative over this simulator's
    tests)."""
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
