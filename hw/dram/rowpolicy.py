"""Row policy of the rank memory controller: when to close a row nobody asked to close.

A plug-in beside the scheduler (:mod:`coda.hw.dram.scheduler`), which closes rows only on a
conflict (a queued request needs another row of the bank). The policy watches the commands
issued and keeps up to ``candidates`` banks recently served by a column command; it asks for
a PRE of such a bank once ``delay`` cycles have passed since its last column command. The
scheduler takes such a PRE only with nothing else to issue, when no request in its window
uses the bank and the timing table allows it (tRAS, tRTP, tWR). :data:`ROW_POLICIES`: ``open``
(the default), ``closed``, ``timeout``; :class:`RowPolicy` says what each does.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from coda.hw.dram.scheduler import close_request
from coda.hw.dram.standards import get_standard
from coda.hw.dram.timing import Cmd, issued_command

__all__ = ["RowPolicy", "ROW_POLICIES", "check_row_policy"]

ROW_POLICIES = ("open", "closed", "timeout")


def check_row_policy(policy: str, timeout: int, candidates: int) -> int:
    """Check the parameters of :class:`RowPolicy`; returns how many close requests it offers
    (0 for ``open``). Raises ValueError naming a bad value."""
    if policy not in ROW_POLICIES:
        raise ValueError(f"row policy {policy!r}: expected one of {', '.join(ROW_POLICIES)}")
    if not isinstance(timeout, int) or timeout < 1:
        raise ValueError(f"timeout={timeout!r}: expected an int >= 1 cycle")
    if not isinstance(candidates, int) or candidates < 1:
        raise ValueError(f"candidates={candidates!r}: expected an int >= 1")
    return 0 if policy == "open" else candidates


class RowPolicy(wiring.Component):
    """Closed / open / timeout row policy.

    ===========  ==========================================================================
    policy       what it does
    ===========  ==========================================================================
    ``open``     never closes (no candidates): rows stay open until a conflict (the default)
    ``closed``   closes a bank as soon as its last queued request is served (delay 0)
    ``timeout``  closes a bank ``timeout`` cycles after its last column command if no request
                 for it came meanwhile: a request that follows soon still hits, a bank left
                 idle pays no PRE on its next (likely different) row
    ===========  ==========================================================================

    Parameters:
        std: a :class:`coda.hw.dram.standards.DRAMStandard` or preset name.
        policy: one of :data:`ROW_POLICIES`.
        timeout: cycles (tCK) after a bank's last column command before ``timeout`` closes it
            (>= 1; ignored by the others).
        candidates: banks tracked at once (>= 1; ``open`` tracks none).

    Members:
        issue: In(:func:`coda.hw.dram.timing.issued_command`): the command of this cycle.
        close: Out(:func:`coda.hw.dram.scheduler.close_request`) x :attr:`n_close`.

    Raises:
        ValueError: unknown policy, timeout < 1 or candidates < 1.
    """

    def __init__(self, std, policy: str = "open", *, timeout: int = 64, candidates: int = 4):
        self.std = std = get_standard(std)
        #: close requests offered to the scheduler (0 for the open policy)
        self.n_close = check_row_policy(policy, timeout, candidates)
        self.policy, self.timeout = policy, timeout
        self.delay = 0 if policy == "closed" else timeout
        super().__init__({
            "issue": In(issued_command(std)),
            "close": Out(close_request(std)).array(self.n_close),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n_close
        if n == 0:
            return m
        kind, bank = self.issue.kind, self.issue.bank
        col = kind.matches(Cmd.RD, Cmd.WR)
        valid = [Signal(name=f"valid{k}") for k in range(n)]
        timer = [Signal(range(self.delay + 1), name=f"timer{k}") for k in range(n)]
        victim = Signal(range(max(n, 2)))           # round-robin replacement
        same = [valid[k] & (self.close[k].bank == bank) for k in range(n)]
        any_same = same[0]
        for s in same[1:]:
            any_same = any_same | s
        for k, c in enumerate(self.close):
            m.d.comb += c.valid.eq(valid[k] & (timer[k] == 0))
            with m.If(timer[k] != 0):
                m.d.sync += timer[k].eq(timer[k] - 1)
            take = col & (same[k] | (~any_same & (victim == k)))
            with m.If(take):
                m.d.sync += [valid[k].eq(1), c.bank.eq(bank), c.bg.eq(self.issue.bg),
                             c.row.eq(self.issue.row), timer[k].eq(self.delay)]
            with m.Elif(kind.matches(Cmd.PREA, Cmd.REF) | (kind.matches(Cmd.ACT, Cmd.PRE)
                                                           & same[k])):
                m.d.sync += valid[k].eq(0)
        with m.If(col & ~any_same):
            m.d.sync += victim.eq(Mux(victim == n - 1, 0, victim + 1))
        return m
