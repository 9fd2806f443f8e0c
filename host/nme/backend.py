"""Backends: one NME's execution of one program on a memory image.

``TorchBackend`` runs the torch interpreter (:mod:`coda.host.nme.interp`) and models the cycle
count; ``RTLBackend`` (:mod:`coda.cosim.nme.rtl_backend`, written by the cosimulation side) runs
the Verilated NME and must return identical ``mem``, ``status`` and ``l1`` bits.
:func:`get_backend` picks one by name.
"""

from __future__ import annotations

import numpy as np

from coda.hw.nme.executor import Backend, ExecResult  # noqa: F401  (Backend: get_backend's return type)
from coda.hw.nme.isa import NMEConfig, Program
from coda.hw.nme.cycles import model_cycles
from coda.host.nme.interp import run_program

__all__ = ["TorchBackend", "get_backend", "BACKENDS"]

#: names accepted by :func:`get_backend`
BACKENDS = ("torch", "rtl")


class TorchBackend:
    """The functional backend: :func:`coda.host.nme.interp.run_program` plus the cycle model.

    Args:
        mem_latency: memory read latency of the cycle model (:func:`model_cycles`), cycles
            >= 1 (the NME memory interface's minimum; RTLBackend's default is 1).
    """
    name = "torch"

    def __init__(self, mem_latency: int = 1):
        if int(mem_latency) < 1:
            raise ValueError(f"mem_latency={mem_latency}: expected >= 1 cycle")
        self.mem_latency = int(mem_latency)

    def execute(self, cfg: NMEConfig, program: Program, mem: np.ndarray, *,
                inplace: bool = False) -> ExecResult:
        """Run ``program`` on a copy of ``mem`` (uint16 [mem_words, lanes]; ``mem`` itself when
        the program stores nothing, or with ``inplace``, which writes the stores into ``mem``);
        without ``inplace`` ``mem`` is not modified. Raises ValueError for a malformed image
        or unencodable program fields."""
        res = run_program(cfg, program, mem, inplace=inplace)
        return ExecResult(res.mem, res.status, res.l1,
                          model_cycles(cfg, program, res.status, self.mem_latency))

    def execute_many(self, cfg: NMEConfig, jobs: list[tuple[Program, np.ndarray]], *,
                     inplace: bool = False) -> list[ExecResult]:
        """Run each (program, image) job, as ranks in lockstep; results in job order.
        ``inplace``: as :meth:`execute` (the driver, which owns its rank images, asks for
        it: copying a 2^22-word image per program was 240 s of a 10-video cached generation)."""
        return [self.execute(cfg, program, mem, inplace=inplace) for program, mem in jobs]


def get_backend(name: str, *, dram: str | None = None, dimms: int = 1, ranks: int = 1,
                **kw) -> Backend:
    """A backend by name: ``"torch"`` (:class:`TorchBackend`) or ``"rtl"`` (the Verilated NME,
    :class:`coda.cosim.nme.rtl_backend.RTLBackend`, imported only when asked for). With ``dram``
    (a preset of :mod:`coda.hw.dram.standards`, ``"rtl"`` only) the whole ``dimms x ranks``
    DIMM-NMP with DRAM timing instead (:class:`coda.cosim.nmp.backend.NMPRTLBackend`).

    Keyword arguments go to the backend's constructor.
    Raises ValueError for an unknown name or preset, or ``dram`` with ``"torch"``;
    RuntimeError if the RTL backend cannot be imported.
    """
    if dram is not None:
        if name != "rtl":
            raise ValueError(f"--dram {dram}: DRAM timing needs --backend rtl "
                             f"(got --backend {name})")
        from coda.cosim.nmp.backend import NMPRTLBackend
        return NMPRTLBackend(dram, dimms=dimms, ranks=ranks, **kw)
    if name == "torch":
        return TorchBackend(**kw)
    if name == "rtl":
        try:
            from coda.cosim.nme.rtl_backend import RTLBackend
        except ImportError as exc:
            raise RuntimeError(f"backend 'rtl' is unavailable: cannot import "
                               f"coda.cosim.nme.rtl_backend.RTLBackend ({exc})") from exc
        return RTLBackend(**kw)
    raise ValueError(f"unknown backend {name!r}: expected one of {list(BACKENDS)}")
