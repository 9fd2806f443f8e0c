"""Refresh manager of the rank memory controller: all-bank refresh every tREFI.

:class:`AllBankRefresh`: every tREFI cycles a REF falls due; the manager asks for a PREA that
closes the open banks, then for the REF, and the timing table blocks everything for tRFC. With
``postpone=P`` it postpones up to P REFs while requests are queued and catches up back to back
("post-pay" refresh, within JEDEC's limit, the preset's
:attr:`~coda.hw.dram.standards.DRAMStandard.refresh_postpone`); its docstring has the rules and
their JEDEC sources. :func:`check_postpone` validates P.

Like Ramulator 2's ``AllBank`` refresh manager, it is a plug-in with a small interface (what
the table says about the banks in, the commands it needs out).
:class:`SameBankRefresh` is the DDR5 same-bank (REFsb) alternative.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from coda.hw.dram.standards import get_standard

__all__ = ["AllBankRefresh", "SameBankRefresh", "check_postpone"]


def check_postpone(std, postpone) -> int:
    """``postpone`` if it is an int in 0 .. ``std.refresh_postpone`` (JEDEC's limit).

    Raises ValueError naming the value and the limit."""
    std = get_standard(std)
    if not isinstance(postpone, int) or not 0 <= postpone <= std.refresh_postpone:
        raise ValueError(f"refresh_postpone={postpone!r}: expected 0..{std.refresh_postpone} "
                         f"({std.name}: JEDEC lets at most {std.refresh_postpone} REF be "
                         f"postponed)")
    return postpone


def _postponing(m, timer, interval, limit, issued, busy):
    """Refresh owed with postponement (see :class:`AllBankRefresh`): a counter of refresh
    commands fallen due (one every ``interval`` cycles, ``timer`` counting down to it) and not
    yet issued; returns the signal "one is pending now" (block and refresh): some are owed and
    ``limit`` of them are, or no request is queued, or a catch-up once started is not done."""
    owed = Signal(range(limit + 2))
    catching = Signal()
    with m.If(timer == 0):
        m.d.sync += timer.eq(interval - 1)
    with m.Else():
        m.d.sync += timer.eq(timer - 1)
    nxt = owed + (timer == 0) - issued
    m.d.sync += owed.eq(nxt)
    pending = Signal()
    m.d.comb += pending.eq((owed != 0) & (catching | (owed >= limit) | ~busy))
    m.d.sync += catching.eq(pending & (nxt != 0))
    return pending


class AllBankRefresh(wiring.Component):
    """All-bank refresh of one rank.

    Every tREFI cycles a REF falls due (the first one tREFI cycles after reset). While one is
    pending the scheduler issues no new ACT/PRE/RD/WR; the manager asks for a PREA that closes the
    open banks as soon as the timing table allows one (tRAS/tRTP/tWR), then for the REF once no
    bank is open and tRPab/tRC allow; the timing table then blocks everything for tRFC. A REF
    issued in the cycle in which the next interval elapses leaves that next one pending.

    Refresh postponement (``postpone=P``; 0, the default, and 1 are the behaviour above). JEDEC
    lets a controller postpone REF commands while it is busy and catch up later. DDR4 (JESD79-4,
    the "Refresh Command" section, worded as JESD79-3's): "A maximum of 8 Refresh commands can be
    postponed ..., meaning that at no point in time more than a total of 8 Refresh commands are
    allowed to be postponed. In case that 8 Refresh commands are postponed in a row, the resulting
    maximum interval between the surrounding Refresh commands is limited to 9 x tREFI"; DDR5
    (JESD79-5 4.13 "Refresh Operation", normal refresh mode): 4 REFab; LPDDR5 (JESD209-5): 8. The
    limit is the preset's :attr:`~coda.hw.dram.standards.DRAMStandard.refresh_postpone`.
    Controllers use it as "post-pay" refresh (Intel's DDR4 EMIF user guide, "Controller Pre-pay
    and Post-pay Refresh": "The accumulated refresh commands are issued continuously when the
    upper limit is reached"); so does this manager: REFs that fall due while requests are queued
    (``busy``) are counted, not issued; with no request queued the owed ones are issued (refresh
    in idle time); when P are owed the manager blocks the rank and issues all owed REFs back to
    back (one PREA, then a REF every tRFC) until none is owed. So at most P REFs are owed at any
    cycle: REFs by cycle t >= t // tREFI - P, the rule :mod:`coda.cosim.dram.check` checks (it
    counts a REF as owed from the end of its tREFI interval, as here; P = 1 issues each REF as soon
    as it is owed, as P = 0 does).

    Parameters:
        std: a :class:`coda.hw.dram.standards.DRAMStandard` or preset name (tREFI).
        postpone: REFs that may be owed at once while requests are queued (0 .. the
            standard's ``refresh_postpone``; 0 and 1: none postponed, see above).
        first: cycles to the first REF (default tREFI; less staggers the ranks of a channel).

    Members:
        any_open: In(1), prea_ok: In(1), ref_ok: In(1): the timing table's state (some bank
            open; a PREA / a REF may issue now).
        issued: In(1): a REF issued this cycle.
        busy: In(1): requests are queued (only read with ``postpone`` >= 2).
        pending: Out(1): a REF is due: no other command may start.
        prea: Out(1): issue PREA now. ref: Out(1): issue REF now.

    Raises:
        ValueError: ``postpone`` outside 0 .. std.refresh_postpone, ``first`` outside
            1 .. tREFI.
    """

    def __init__(self, std, postpone: int = 0, *, first: int | None = None):
        self.std = std = get_standard(std)
        self.postpone = check_postpone(std, postpone)
        self.first = std.tREFI if first is None else first
        if not 1 <= self.first <= std.tREFI:
            raise ValueError(f"first={first}: expected 1..{std.tREFI} (tREFI)")
        super().__init__({
            "any_open": In(1), "prea_ok": In(1), "ref_ok": In(1), "issued": In(1),
            "busy": In(1), "pending": Out(1), "prea": Out(1), "ref": Out(1),
        })

    def elaborate(self, platform):
        std = self.std
        m = Module()
        timer = Signal(range(std.tREFI), init=self.first - 1)  # first REF after `first`
        if self.postpone >= 2:
            pending = _postponing(m, timer, std.tREFI, self.postpone, self.issued, self.busy)
            m.d.comb += [
                self.pending.eq(pending),
                self.prea.eq(pending & self.any_open & self.prea_ok),
                self.ref.eq(pending & ~self.any_open & self.ref_ok),
            ]
            return m
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
    tRPab/tRFC and the previous REFsb's tRFCsb allow.

    Postponement (``postpone=P`` >= 2) as :class:`AllBankRefresh`'s, counted in REFsb:
    ``banks_per_group`` REFsb stand for one REF (the checker's count), so up to
    ``P * banks_per_group`` REFsb may be owed; then all owed REFsb are issued, BA rotating.

    Parameters:
        std: a :class:`coda.hw.dram.standards.DRAMStandard` with ``tRFCsb`` (DDR5).
        postpone: as :class:`AllBankRefresh`'s (in REF units).

    Members:
        sb_open: In(bank_groups), sb_pre_ok: In(1), sb_ok: In(1): the timing table's answers
            about BA (:class:`coda.hw.dram.timing.TimingTable`, ``same_bank``).
        issued: In(1): the REFsb issued this cycle.
        busy: In(1): requests are queued (only read with ``postpone`` >= 2).
        ba: Out(range(banks_per_group)): the bank address due. block: Out(1): one is pending.
        pre: Out(1), pre_bg: Out(range(bank_groups)): issue a PRE of bank BA in that group.
        refsb: Out(1): issue the REFsb now.

    Raises:
        ValueError: the standard has no same-bank refresh (tRFCsb = 0); ``postpone`` out of
            range.
    """

    def __init__(self, std, postpone: int = 0):
        self.std = std = get_standard(std)
        self.postpone = check_postpone(std, postpone)
        if not std.tRFCsb:
            raise ValueError(f"{std.name}: same-bank refresh: the standard has no REFsb "
                             f"(tRFCsb = 0); expected refresh='all'")
        self.interval = std.tREFI // std.banks_per_group
        super().__init__({
            "sb_open": In(std.bank_groups), "sb_pre_ok": In(1), "sb_ok": In(1),
            "issued": In(1), "busy": In(1),
            "ba": Out(range(std.banks_per_group)), "block": Out(1),
            "pre": Out(1), "pre_bg": Out(range(std.bank_groups)), "refsb": Out(1),
        })

    def elaborate(self, platform):
        std = self.std
        m = Module()
        timer = Signal(range(self.interval), init=self.interval - 1)
        ba = Signal(range(std.banks_per_group))
        if self.postpone >= 2:
            due = _postponing(m, timer, self.interval, self.postpone * std.banks_per_group,
                              self.issued, self.busy)
        else:
            pending = Signal(range(4))      # REFsb due (more can fall due while one waits)
            with m.If(timer == 0):
                m.d.sync += timer.eq(self.interval - 1)
            with m.Else():
                m.d.sync += timer.eq(timer - 1)
            m.d.sync += pending.eq(pending + (timer == 0) - self.issued)
            due = pending != 0
        with m.If(self.issued):
            m.d.sync += ba.eq(Mux(ba == std.banks_per_group - 1, 0, ba + 1))
        first = Signal(range(std.bank_groups))   # lowest bank group with BA open
        for g in reversed(range(std.bank_groups)):
            with m.If(self.sb_open[g]):
                m.d.comb += first.eq(g)
        m.d.comb += [
            self.ba.eq(ba), self.block.eq(due), self.pre_bg.eq(first),
            self.pre.eq(due & self.sb_open.any() & self.sb_pre_ok),
            self.refsb.eq(due & self.sb_ok),
        ]
        return m
