"""cocotb tests for tests/cosim/test_waves.py (run inside the traced simulator): one small
program on the NME, so its waveform shows a whole job (job port, command stream, memory requests, the
units' state machines, the lanes).

- ``test_copy``: copy 4 words through a buffer; status OK and the words arrive.
- ``test_copy_wrong_expectation``: the same job checked against a wrong value, run only when
  ``CODA_WAVES_BREAK=1``: a failing test, to check what a failure reports (the waveform path).

Environment: ``CODA_COSIM_LANES`` / ``CODA_COSIM_MEM_WORDS`` (the memory geometry).
"""

from __future__ import annotations

import os

import cocotb
import numpy as np

from coda.cosim.nme.tb import NMEHarness
from coda.hw.nme.isa import Op, Program, RSrc, Status, UOp

WORDS = 4        # memory words copied
SRC, DST = 0, 64


async def _copy(dut) -> tuple:
    h = NMEHarness(dut)
    await h.start()
    rng = np.random.default_rng(3)
    mem = rng.integers(0, 1 << 16, size=(h.mem_words, h.lanes), dtype=np.uint16)
    program = Program(WORDS * h.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=SRC),
                                        UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=DST)))
    res, out = await h.execute(program.words(), mem)
    dut._log.info("copy: status %s, %d cycles", res.status.name, res.cycles)
    return res, mem, out


@cocotb.test()
async def test_copy(dut):
    """4 words copied from SRC to DST by the NME: status OK, the words arrive, nothing else
    changes."""
    res, mem, out = await _copy(dut)
    assert res.status == Status.OK, res.status
    expected = mem.copy()
    expected[DST:DST + WORDS] = mem[SRC:SRC + WORDS]
    assert np.array_equal(out, expected)


@cocotb.test(skip=os.environ.get("CODA_WAVES_BREAK") != "1")
async def test_copy_wrong_expectation(dut):
    """The copy checked against the wrong words: fails on purpose (CODA_WAVES_BREAK=1 only)."""
    res, mem, out = await _copy(dut)
    assert np.array_equal(out[DST:DST + WORDS], mem[SRC + 1:SRC + 1 + WORDS]), \
        "DST holds SRC's words, not SRC+1's (a failure on purpose)"
