"""Asynchronous launches of the NMP driver: what a lockstep launch of one program per rank
leaves in flight and how its result is taken.

:class:`Launch` is one launch (its jobs, their layouts, the backend's handle); the driver
submits it (``backend.submit_many`` where the backend has it: the RTL NMEs run while the host
goes on) and completes it (collect, merge the programs' output streams into the rank
images). :class:`PendingOp` is an operator launched and not taken yet: its ``result()``
waits, gathers and releases the operator's scratch. :class:`ChainedSegment` is a segment of
more than the NME's terms per program, as programs chained in rank memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["Launch", "PendingOp", "ChainedSegment", "result_device"]


def result_device(*tensors) -> torch.device | None:
    """The device of the first real (not ``meta``) tensor among ``tensors`` (lists searched
    too): where an operator's result returns (:attr:`PendingOp.device`). None if none."""
    for t in tensors:
        for u in (t if isinstance(t, (list, tuple)) else [t]):
            if isinstance(u, torch.Tensor) and u.device.type != "meta":
                return u.device
    return None


@dataclass
class Launch:
    """One lockstep launch: its jobs (rank, program), their layouts, the backend's handle
    (None: done at once), the results once collected, the submit time (perf_counter s)."""
    jobs: list
    layouts: list
    handle: Any
    results: list | None
    t_submit: float
    merged: bool = False


@dataclass
class PendingOp:
    """An operator launched on the NMEs whose result has not been taken yet.

    :meth:`result` waits for the launch (if it is still in flight), merges what the programs
    wrote into the rank images and returns the operator's result; later calls return the same
    object. Meanwhile the host may compute (the other CFG branch) and write cache slots; a
    second launch first completes this one (the NMEs run one program at a time). A tensor
    result goes to ``device`` (the xPU's device the operator's inputs came from, as the
    link returns it; None: it stays on the host, where the driver gathered it).
    """
    driver: Any     # the coda.host.nmp.driver.NMPDriver that launched it (None: done at once)
    gather: Callable[[list], Any] | None
    ticket: Launch | None
    release: Callable[[], None] | None
    bytes_to_nmp: int = 0
    bytes_from_nmp: int = 0
    nme_cycles: int = 0
    programs: int = 0
    y_addrs: list = field(default_factory=list)   # per rank: word address of the output tile
    device: Any = None
    _value: Any = None
    _done: bool = False

    @classmethod
    def done(cls, value, device=None) -> "PendingOp":
        """An operator whose result is there at once (``value``, sent to ``device``)."""
        op = cls(None, None, None, None, device=device, _done=True)
        op._value = op._to_device(value)
        return op

    def _to_device(self, value):
        if self.device is not None and isinstance(value, torch.Tensor):
            return value.to(self.device)
        return value

    def result(self):
        """The operator's result (waits for the launch). After it: ``bytes_to_nmp``
        (operands written and command words), ``bytes_from_nmp`` (result read back),
        ``nme_cycles`` (the slowest rank's), ``programs`` (lockstep launches) of this
        operator alone."""
        if not self._done:
            try:
                results = self.driver._complete(self.ticket)
                read = self.driver.stats["bytes_read"]
                self._value = self._to_device(self.gather(results))
                self.bytes_from_nmp = self.driver.stats["bytes_read"] - read
                self.nme_cycles = max(r.cycles for r in results)
                self.programs = 1
            finally:
                self.release()
            self._done = True
        return self._value

    def finish_in_place(self) -> None:
        """Complete the launch and release its scratch without reading the result back (an
        intermediate of a chained segment, already read by the next program)."""
        if not self._done:
            try:
                results = self.driver._complete(self.ticket)
                self.nme_cycles = max(r.cycles for r in results)
                self.programs = 1
            finally:
                self.release()
            self._done = True


@dataclass
class ChainedSegment:
    """A segment of more than MAX_SEGMENT_TERMS terms as programs chained in rank memory:
    program i+1 reads program i's output where it lies, so only x goes down and y comes up.
    Same interface as :class:`PendingOp`."""
    parts: list

    def result(self):
        y = self.parts[-1].result()
        for part in self.parts[:-1]:
            part.finish_in_place()
        return y

    def __getattr__(self, name):
        if name in ("bytes_to_nmp", "nme_cycles", "programs"):
            return sum(getattr(p, name) for p in self.parts)
        if name == "bytes_from_nmp":
            return self.parts[-1].bytes_from_nmp
        raise AttributeError(name)
