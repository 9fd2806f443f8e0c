"""Refresh manager of the rank memory controller: all-bank refresh every tREFI.

Every tREFI cycles a REF becomes pending (the first one tREFI cycles after reset). While it is
pending the scheduler issues no new ACT/PRE/RD/WR; the manager asks for a PREA that closes the
open banks as soon as the timing table allows one (tRAS/tRTP/tWR), then for the REF once no
bank is open and tRPab/tRC allow; the timing table then blocks everything for tRFC. A REF
issued in the cycle in which the next interval elapses leaves that next one pending.

Like Ramulator 2's ``AllBank`` refresh manager, it is a plug-in with a small interface (what
the table says about the banks in, the commands it needs out); no postponing.
:class:`SameBankRefresh` is the DDR5 same-bank (REFsb) alternative.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .dram_standards import get_standard

__all__ = ["AllBankRefresh", "SameBankRefresh"]


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


class SameBankRefresh(wiring.Component):
    """Same-bank refresh (DDR5 REFsb) of one rank: a REFsb of bank address BA (that bank in
    every bank group) every ``tREFI // banks_per_group`` cycles, BA rotating, so every bank is
    refreshed once per tREFI (JESD79-5) while the other bank addresses keep serving requests.

    While one is pending, requests to BA are held (``block``: no ACT, RD or WR for it); the
    manager closes BA's open banks one PRE at a time, lowest bank group first, as the timing
    table allows (tRAS/tRTP/tWR), then issues the REFsb once they are closed and tRC/tRP,
    tRPab/tRFC and the previous REFsb's tRFCsb allow. No postponement.

    Parameters:
        std: a :class:`coda.hw.dram_standards.DRAMStandard` with ``tRFCsb`` (DDR5).

    Members:
        sb_open: In(bank_groups), sb_pre_ok: In(1), sb_ok: In(1): the timing table's answers
            about BA (:class:`coda.hw.dram_timing.TimingTable`, ``same_bank``).
        issued: In(1): the REFsb issued this cycle.
        ba: Out(range(banks_per_group)): the bank address due. block: Out(1): one is pending.
        pre: Out(1), pre_bg: Out(range(bank_groups)): issue a PRE of bank BA in that group.
        refsb: Out(1): issue the REFsb now.

    Raises:
        ValueError: the standard has no same-bank refresh (tRFCsb = 0).
    """

    def __init__(self, std):
        self.std = std = get_standard(std)
        if not std.tRFCsb:
            raise ValueError(f"{std.name}: same-bank refresh: the standard has no REFsb "
                             f"(tRFCsb = 0); expected refresh='all'")
        self.interval = std.tREFI // std.banks_per_group
        super().__init__({
            "sb_open": In(std.bank_groups), "sb_pre_ok": In(1), "sb_ok": In(1),
            "issued": In(1),
            "ba": Out(range(std.banks_per_group)), "block": Out(1),
            "pre": Out(1), "pre_bg": Out(range(std.bank_groups)), "refsb": Out(1),
        })

    def elaborate(self, platform):
        std = self.std
        m = Module()
        timer = Signal(range(self.interval), init=self.interval - 1)
        pending = Signal(range(4))      # REFsb due (more can fall due while one waits)
        ba = Signal(range(std.banks_per_group))
        with m.If(timer == 0):
            m.d.sync += timer.eq(self.interval - 1)
        with m.Else():
            m.d.sync += timer.eq(timer - 1)
        m.d.sync += pending.eq(pending + (timer == 0) - self.issued)
        with m.If(self.issued):
            m.d.sync += ba.eq(Mux(ba == std.banks_per_group - 1, 0, ba + 1))
        first = Signal(range(std.bank_groups))   # lowest bank group with BA open
        for g in reversed(range(std.bank_groups)):
            with m.If(self.sb_open[g]):
                m.d.comb += first.eq(g)
        m.d.comb += [
            self.ba.eq(ba), self.block.eq(pending != 0), self.pre_bg.eq(first),
            self.pre.eq((pending != 0) & self.sb_open.any() & self.sb_pre_ok),
            self.refsb.eq((pending != 0) & self.sb_ok),
        ]
        return m
