"""Refresh manager of the rank memory controller: all-bank refresh every tREFI.

Every tREFI cycles a REF becomes pending (the first one tREFI cycles after reset). While it is
pending the scheduler issues no new ACT/PRE/RD/WR; the manager asks for a PREA that closes the
open banks as soon as the timing table allows one (tRAS/tRTP/tWR), then for the REF once no
bank is open and tRPab/tRC allow; the timing table then blocks everything for tRFC. A REF
issued in the cycle in which the next interval elapses leaves that next one pending.

Like Ramulator 2's ``AllBank`` refresh manager, it is a plug-in with a small interface (what
the table says about the banks in, the commands it needs out); no postponing, no per-bank
refresh.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .dram_standards import get_standard

__all__ = ["AllBankRefresh"]


class AllBankRefresh(wiring.Component):
    """All-bank refresh of one rank.

    Parameters:
        std: a :class:`coda.hw.dram_standards.DRAMStandard` or preset name (tREFI).

    Members:
        any_open: In(1), prea_ok: In(1), ref_ok: In(1): the timing table's state (some bank
            open; a PREA / a REF may issue now).
        issued: In(1): a REF issued this cycle.
        pending: Out(1): a REF is due: no other command may start.
        prea: Out(1): issue PREA now. ref: Out(1): issue REF now.
    """

    def __init__(self, std):
        self.std = get_standard(std)
        super().__init__({
            "any_open": In(1), "prea_ok": In(1), "ref_ok": In(1), "issued": In(1),
            "pending": Out(1), "prea": Out(1), "ref": Out(1),
        })

    def elaborate(self, platform):
        std = self.std
        m = Module()
        timer = Signal(range(std.tREFI), init=std.tREFI - 1)  # first REF after tREFI
        pending = Signal()
        with m.If(timer == 0):
            m.d.sync += [timer.eq(std.tREFI - 1), pending.eq(1)]
        with m.Else():
            m.d.sync += timer.eq(timer - 1)
        with m.If(self.issued):
            m.d.sync += pending.eq(0)
            with m.If(timer == 0):  # a new interval elapsed in the same cycle: keep it
                m.d.sync += pending.eq(1)
        m.d.comb += [
            self.pending.eq(pending),
            self.prea.eq(pending & self.any_open & self.prea_ok),
            self.ref.eq(pending & ~self.any_open & self.ref_ok),
        ]
        return m
