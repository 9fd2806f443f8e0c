"""What an executor of NME programs is, and what it returns: the contract between the
driver (``coda.host.nmp.driver``) and every backend (the torch interpreter, the Verilated NME,
the Verilated DIMM-NMP), kept beside the ISA (:mod:`coda.hw.nme.isa`) it executes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from coda.hw.nme.isa import NMEConfig, Program, Status

__all__ = ["ExecResult", "Backend"]


@dataclass
class ExecResult:
    """One program's outcome on one NME.

    Attributes:
        mem: uint16 [mem_words, lanes], the memory image after the program.
        status: :class:`coda.hw.nme.isa.Status` of the program.
        l1: fp32 L1 sum (0.0 if the program has no L1 micro-op or was rejected).
        cycles: NME clock cycles from the first command word to ``done`` (torch backend:
            the analytic model of :func:`coda.hw.nme.cycles.model_cycles`).
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

    def execute_many(self, cfg: NMEConfig, jobs: list[tuple[Program, np.ndarray]], *,
                     inplace: bool = False) -> list[ExecResult]:
        """Run each (program, image) job, as ranks in lockstep; results in job order.

        ``inplace=True``: the caller owns the images and lets the backend write the
        programs' stores into them (the result's ``mem`` is then the image itself) instead
        of into a copy; a backend whose memory lives elsewhere (a simulator) ignores it.
        """
        ...

    # Optional: ``rank_image(cfg, rank) -> np.ndarray``, the backend's own memory for a rank
    # (uint16 [cfg.mem_words, cfg.lanes]); a caller that passes it back as the rank's image
    # moves no words between jobs (the RTL backend maps it into its simulators). The driver
    # uses it where present.
