"""Long regression: >= 10^6 random operand pairs per arithmetic op and format through the RTL.

Run by ``make verify-long`` (``pytest -m slow``). For each format (bf16, fp16) and each of
add, sub, mul and the MAC / gated residual ``x + g*c``, big programs (~170k elements each) run
on the Verilated NME through :class:`coda.cosim.nme.rtl_backend.RTLBackend` (memory loaded and read
in bulk), and every result element is compared with torch computed directly (NaNs by class);
the memory image is also compared with :class:`coda.host.nme.backend.TorchBackend`. Operands are
uniform random 16-bit patterns (every class: zeros, subnormals, normals, inf, NaN) mixed with
finite normal values. Prints the counts; zero mismatches required.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, UOp

PAIRS_PER_OP = 1_000_000
MEM_WORDS = 1 << 16


def _operands(rng: np.random.Generator, n: int, fmt: str) -> np.ndarray:
    from coda.host.nme import bits as hb

    raw = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    finite = hb.to_bits(torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 8)
                        .to(hb.torch_dtype(fmt)))
    return np.where(rng.random(n) < 0.5, raw, finite).astype(np.uint16)


def _program(op: str, n: int, wn: int) -> Program:
    a, b, c, y = 0, wn, 2 * wn, 3 * wn
    if op == "mac":   # gated residual with a full-length gate stream: y = a + c*b
        return Program(n, (UOp(Op.MOV, RSrc.MEM, d=0, addr=a), UOp(Op.MOV, RSrc.MEM, d=1, addr=c),
                           UOp(Op.MAC, RSrc.MEM, d=0, p=0, q=1, addr=b),
                           UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=y)))
    code = {"add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL}[op]
    return Program(n, (UOp(Op.MOV, RSrc.MEM, d=0, addr=a),
                       UOp(code, RSrc.MEM, d=0, p=0, addr=b),
                       UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=y)))


def _torch(op: str, a, b, c):
    return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
            "mac": lambda: a + c * b}[op]()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_million_pairs_per_op(fmt):
    from coda.cosim.nme.rtl_backend import RTLBackend
    from coda.host.nme import bits as hb
    from coda.host.nme.backend import TorchBackend

    cfg = NMEConfig(lanes=8, fmt=fmt, mem_words=MEM_WORDS)
    wn = MEM_WORDS // 4 - 1                  # four streams of wn words each fit the memory
    n = wn * cfg.lanes - 5                   # a masked tail in every program
    rng = np.random.default_rng(2024 if fmt == "bf16" else 2025)
    torch_be = TorchBackend()
    counts = {}
    with RTLBackend(latency=4, req_stall=0.1, rsp_stall=0.1, seed=99) as rtl:
        for op in ("add", "sub", "mul", "mac"):
            checked = mismatches = programs = cycles = 0
            t0 = time.perf_counter()
            while checked < PAIRS_PER_OP:
                mem = rng.integers(0, 1 << 16, size=(MEM_WORDS, cfg.lanes), dtype=np.uint16)
                a, b, c = (_operands(rng, n, fmt) for _ in range(3))
                for k, bits in enumerate((a, b, c)):
                    mem[k * wn:(k + 1) * wn].reshape(-1)[:n] = bits
                program = _program(op, n, wn)
                res = rtl.execute(cfg, program, mem)
                exp = _torch(op, *(hb.from_bits(x, fmt) for x in (a, b, c)))
                got = res.mem[3 * wn:4 * wn].reshape(-1)[:n]
                want = hb.to_bits(exp)
                nan_both = hb.is_nan_bits(got, fmt) & hb.is_nan_bits(want, fmt)
                mismatches += int(((got != want) & ~nan_both).sum())
                ref = torch_be.execute(cfg, program, mem)
                assert hb.same_bits(res.mem, ref.mem, fmt), f"{fmt} {op}: image differs from interp"
                checked += n
                programs += 1
                cycles += res.cycles
            dt = time.perf_counter() - t0
            counts[op] = (checked, mismatches)
            print(f"\n{fmt} {op}: {checked} operand pairs in {programs} programs, "
                  f"{mismatches} mismatches, {cycles} NME cycles, {dt:.1f} s "
                  f"({cycles / dt:.0f} cycles/s incl. bulk load/compare)")
    for op, (checked, mismatches) in counts.items():
        assert checked >= PAIRS_PER_OP and mismatches == 0, (fmt, op, checked, mismatches)
