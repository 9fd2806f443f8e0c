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

from coda.hw.isa import NMEConfig, Op, Program, Status
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


def model_cycles(cfg: NMEConfig, program: Program, status: Status, pass_latency: int = 3) -> int:
    """Analytic cycle count of one program on the NME, in NME clock cycles.

    Model (one command word and one memory word per cycle; the rank's internal bus delivers a
    full ``16 * lanes``-bit word per cycle):

    - command: ``1 + n_uops`` cycles (header and micro-op words, one per cycle);
    - validation: ``n_uops`` cycles (one micro-op checked per cycle, before any memory access);
    - rejected program: ``done`` one cycle later, nothing else;
    - execution: for each block of ``depth`` words and each micro-op, one pass of
      ``words_in_block`` cycles plus ``pass_latency`` cycles to fill and drain the pipeline;
    - L1: ``lanes`` cycles to sum the lane accumulators in order;
    - ``done``: 1 cycle.

    ``pass_latency`` = 3 by default: 1 cycle of memory response latency (the minimum the NME
    memory interface allows), 1 operand-register and 1 result-register stage. It is the
    model's assumption; calibrate it against RTL counts (:class:`coda.cosim.rtl_backend.RTLBackend`).
    """
    n_uops = len(program.uops)
    cycles = (1 + n_uops) + n_uops + 1
    if status != Status.OK:
        return cycles
    n_words = -(-program.n_elems // cfg.lanes)
    full, rest = divmod(n_words, cfg.depth)
    blocks = full + (rest > 0)
    cycles += n_uops * (n_words + blocks * pass_latency)
    if any(u.op == Op.L1 for u in program.uops):
        cycles += cfg.lanes
    return cycles


class TorchBackend:
    """The functional backend: :func:`coda.host.interp.run_program` plus the cycle model.

    Args:
        pass_latency: cycles per pass of the cycle model (:func:`model_cycles`), >= 0.
    """
    name = "torch"

    def __init__(self, pass_latency: int = 3):
        if int(pass_latency) < 0:
            raise ValueError(f"pass_latency={pass_latency}: expected >= 0 cycles")
        self.pass_latency = int(pass_latency)

    def execute(self, cfg: NMEConfig, program: Program, mem: np.ndarray) -> ExecResult:
        """Run ``program`` on a copy of ``mem`` (uint16 [mem_words, lanes]); ``mem`` is not
        modified. Raises ValueError for a malformed image or unencodable program fields."""
        res = run_program(cfg, program, mem)
        return ExecResult(res.mem, res.status, res.l1,
                          model_cycles(cfg, program, res.status, self.pass_latency))

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
