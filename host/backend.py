"""Backends: one NME's execution of one program on a memory image.

``TorchBackend`` runs the torch interpreter (:mod:`coda.host.interp`) and models the cycle
count; ``RTLBackend`` (:mod:`coda.cosim.rtl_backend`, written by the cosimulation side) runs
the Verilated NME and must return identical ``mem``, ``status`` and ``l1`` bits.
:func:`get_backend` picks one by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from coda.hw.isa import NMEConfig, Op, Program, RSrc, Status
from coda.host.interp import run_program

__all__ = ["ExecResult", "Backend", "TorchBackend", "get_backend", "BACKENDS", "model_cycles"]

#: names accepted by :func:`get_backend`
BACKENDS = ("torch", "rtl")


@dataclass
class ExecResult:
    """One program's outcome on one NME.

    Attributes:
        mem: uint16 [mem_words, lanes], the memory image after the program.
        status: :class:`coda.hw.isa.Status` of the program.
        l1: fp32 L1 sum (0.0 if the program has no L1 micro-op or was rejected).
        cycles: NME clock cycles from the first command word to ``done`` (torch backend:
            the analytic model of :func:`model_cycles`).
    """
    mem: np.ndarray
    status: Status
    l1: float
    cycles: int


@runtime_checkable
class Backend(Protocol):
    """What the driver needs from an executor of NME programs."""
    name: str

    def execute(self, cfg: NMEConfig, program: Program, mem: np.ndarray) -> ExecResult: ...

    def execute_many(self, cfg: NMEConfig,
                     jobs: list[tuple[Program, np.ndarray]]) -> list[ExecResult]: ...


# Cycle constants of the NME RTL (hw/nme.py at commit 3ca384b), fitted exactly to cycle counts
# measured with coda.cosim.rtl_backend.RTLBackend (lanes=8, depth=4, memory latency 1 cycle,
# no stalls; 54 programs of 1-2 micro-ops over 1-40 words): see model_cycles.
INTAKE_CYCLES = 5            # header handshake, start and done
CYCLES_PER_UOP = 4           # intake of the micro-op word and its check
REJECT_CYCLES = 3            # a rejected program: 3 + 4 per micro-op
BLOCK_CYCLES = 1             # start of each block
READ_PASS_CYCLES = 9         # + memory latency: issue, response, lane pipeline, drain
BUFFER_PASS_CYCLES = 8       # buffer read, lane pipeline, drain
STORE_PASS_CYCLES = 9        # buffer pass whose results go through the store FIFO
GROUP_CHECK_CYCLES = 5       # shift-add multiply of the GROUP extent check (at param=1)
DIVIDER_CYCLES = 32          # W = ceil(N / lanes) when lanes is not a power of two


def model_cycles(cfg: NMEConfig, program: Program, status: Status, mem_latency: int = 1) -> int:
    """Analytic cycle count of one program on the NME, in NME clock cycles (header presented
    to ``done``), calibrated on the RTL (constants above):

    - rejected program: ``3 + 4 * n_uops``;
    - accepted: ``5 + 4 * n_uops`` (intake and check), ``+ 32`` if ``lanes`` is not a power
      of two (the divider), ``+ 5`` per GROUP micro-op (extent multiply);
    - for each block of ``blen <= depth`` words: ``1 +`` for each micro-op ``blen +``
      ``9 + mem_latency`` (R from memory), ``9`` (store), ``8`` (R from a buffer);
    - ``+ lanes`` if the program has an L1 micro-op (lane accumulators summed in order).

    Exact for the measured programs (memory latency 1, no stalls). The GROUP check is
    measured at ``param = 1``; the RTL's multiplier may take up to 22 cycles for large
    params, and DRAM stalls add cycles the model does not see.
    """
    n_uops = len(program.uops)
    if status != Status.OK:
        return REJECT_CYCLES + CYCLES_PER_UOP * n_uops
    cycles = INTAKE_CYCLES + CYCLES_PER_UOP * n_uops
    if cfg.lanes & (cfg.lanes - 1):
        cycles += DIVIDER_CYCLES
    cycles += GROUP_CHECK_CYCLES * sum(u.rsrc == RSrc.GROUP for u in program.uops)
    per_pass = sum(STORE_PASS_CYCLES if u.store else
                   READ_PASS_CYCLES + mem_latency if u.rsrc != RSrc.BUF else
                   BUFFER_PASS_CYCLES for u in program.uops)
    n_words = -(-program.n_elems // cfg.lanes)
    blocks = -(-n_words // cfg.depth)
    cycles += blocks * (BLOCK_CYCLES + per_pass) + n_uops * n_words
    if any(u.op == Op.L1 for u in program.uops):
        cycles += cfg.lanes
    return cycles


class TorchBackend:
    """The functional backend: :func:`coda.host.interp.run_program` plus the cycle model.

    Args:
        mem_latency: memory read latency of the cycle model (:func:`model_cycles`), cycles
            >= 1 (the NME memory interface's minimum; RTLBackend's default is 1).
    """
    name = "torch"

    def __init__(self, mem_latency: int = 1):
        if int(mem_latency) < 1:
            raise ValueError(f"mem_latency={mem_latency}: expected >= 1 cycle")
        self.mem_latency = int(mem_latency)

    def execute(self, cfg: NMEConfig, program: Program, mem: np.ndarray) -> ExecResult:
        """Run ``program`` on a copy of ``mem`` (uint16 [mem_words, lanes]); ``mem`` is not
        modified. Raises ValueError for a malformed image or unencodable program fields."""
        res = run_program(cfg, program, mem)
        return ExecResult(res.mem, res.status, res.l1,
                          model_cycles(cfg, program, res.status, self.mem_latency))

    def execute_many(self, cfg: NMEConfig,
                     jobs: list[tuple[Program, np.ndarray]]) -> list[ExecResult]:
        """Run each (program, image) job, as ranks in lockstep; results in job order."""
        return [self.execute(cfg, program, mem) for program, mem in jobs]


def get_backend(name: str, **kw) -> Backend:
    """A backend by name: ``"torch"`` (:class:`TorchBackend`) or ``"rtl"`` (the Verilated NME,
    :class:`coda.cosim.rtl_backend.RTLBackend`, imported only when asked for).

    Keyword arguments go to the backend's constructor.
    Raises ValueError for an unknown name, RuntimeError if the RTL backend cannot be imported.
    """
    if name == "torch":
        return TorchBackend(**kw)
    if name == "rtl":
        try:
            from coda.cosim.rtl_backend import RTLBackend
        except ImportError as exc:
            raise RuntimeError(f"backend 'rtl' is unavailable: cannot import "
                               f"coda.cosim.rtl_backend.RTLBackend ({exc})") from exc
        return RTLBackend(**kw)
    raise ValueError(f"unknown backend {name!r}: expected one of {list(BACKENDS)}")
