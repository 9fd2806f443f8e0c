"""Timing table of the rank memory controller: bank state and every JEDEC constraint.

Every bank and bank-group constraint is a timestamp: a command sets the earliest cycle at which
a dependent command may issue (``now + tXX``, keeping a later one already set), and the
dependent command waits until the free-running cycle counter ``now`` reaches it; tFAW (the four
latest ACTs) is a set of down-counters. So a command the table allows obeys the standard
cycle by cycle *by construction*; :mod:`coda.cosim.dram.check` verifies the command stream
independently from the command log. :class:`TimingTable` has how the state is stored.

This is the part of Ramulator 2's DRAM model (``check_ready`` / ``update_timing`` over the
timing constraints of the standard's table) that a scheduler consults; the standard itself is
data (:mod:`coda.hw.dram.standards`).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from coda.hw.dram.standards import DRAMStandard, channel_banks, get_standard

__all__ = ["Cmd", "TimingTable", "row_query", "issued_command", "STAMP_BITS"]

#: Width of the timestamps and of ``now`` (cycles): 2**48 cycles is days of DRAM time.
STAMP_BITS = 48


class Cmd:
    """Command codes (on the controller's ``cmd_kind`` and in the SV device's log)."""
    NOP, ACT, PRE, PREA, RD, WR, REF, REFSB = range(8)
    NAMES = {1: "ACT", 2: "PRE", 3: "PREA", 4: "RD", 5: "WR", 6: "REF", 7: "REFsb"}


def row_query(std: DRAMStandard) -> wiring.Signature:
    """Question about one bank, seen from the asker: ``bank`` (index in the rank), its bank
    group ``bg`` and a ``row``; answers ``opened`` (the bank has an open row), ``row_hit``
    (the open row, if any, is ``row``), ``act_ok`` (an ACT to it may issue now: tRC, tRP,
    tRRD_L/_S, tFAW, refresh recovery), ``pre_ok`` (a PRE may issue now: tRAS, tRTP, tWR),
    ``col_ok`` (tRCD since the bank's ACT) and ``rd_ok`` / ``wr_ok`` (a RD / WR to bank group
    ``bg`` may issue now: tCCD_L/_S, tWTR, tRTW, the write-to-write spacing)."""
    return wiring.Signature({
        "bank": Out(ceil_log2(std.banks)), "bg": Out(ceil_log2(std.bank_groups)),
        "row": Out(ceil_log2(std.rows)),
        "opened": In(1), "row_hit": In(1), "act_ok": In(1), "pre_ok": In(1),
        "col_ok": In(1), "rd_ok": In(1), "wr_ok": In(1)})


def issued_command(std: DRAMStandard) -> wiring.Signature:
    """The command issued this cycle, seen from the controller: ``kind`` (:class:`Cmd`),
    ``bank``, ``bg``, ``row`` (of ACT/PRE/RD/WR; ignored for NOP, PREA, REF)."""
    return wiring.Signature({
        "kind": Out(3), "bank": Out(ceil_log2(std.banks)), "bg": Out(ceil_log2(std.bank_groups)),
        "row": Out(ceil_log2(std.rows))})


class TimingTable(wiring.Component):
    """Bank state and timing constraints of one rank.

    Per-bank and per-bank-group timestamps and open rows live in small RAMs indexed by bank (group):
    a query reads the state of one bank, an issued command writes only the words it changes. A
    constraint a command puts on every *other* bank group (tCCD_S, tRRD_S, tWTR_S) is one shared
    timestamp; the group's own (the _L value) is at least as long, so max(own, shared) equals the
    per-group constraint. The timestamps and ``now`` are not reset: a controller reset forgets open
    rows, not the timing constraints the DRAM still obeys.

    Parameters:
        std: a :class:`DRAMStandard` or preset name (same-bank-group constraints at least
            the other-group ones, as :class:`coda.hw.dram.controller.DRAMController` checks).
        row_queries: how many banks may be asked about at once (the scheduler's lookahead
            and the row policy's candidates).

    Members:
        rows: In(:func:`row_query`) x ``row_queries``: per-bank questions (ACT, PRE, RD, WR).
        any_open: Out(1): some bank has an open row.
        prea_ok: Out(1): a PREA may issue now (every bank's tRAS/tRTP/tWR passed).
        ref_ok: Out(1): a REF may issue now (every bank's tRP/tRC, tRPab, the last tRFC).
        issue: In(:func:`issued_command`): the command issued this cycle updates the table
            (a REFsb gives its bank address as ``bank`` = BA x bank_groups).
        With ``same_bank`` (a standard with tRFCsb): sb_ba: In: a bank address BA;
        sb_open: Out(bank_groups): bank BA of each group is open; sb_pre_bg: In, sb_pre_ok:
        Out: a PRE of bank BA in that group may issue; sb_ok: Out: a REFsb of BA may issue
        (BA closed in every group, tRC/tRP of those banks, tRPab/tRFC, tRFCsb of the last
        REFsb of BA). A REFsb blocks ACTs to BA for tRFCsb, and REF/PREA for tRFCsb.

    With ``ranks`` R > 1 (the ranks of one channel; no ``same_bank``): ``bank`` in the queries
    and the issued command is the channel's flat index ``Cat(bg, ba, rank)`` (a PREA/REF gives
    its rank there); every constraint above is per rank (per (rank, bank group) for the
    bank-group ones; tRRD_S, tFAW, tRFC, tRPab per rank), and ``any_open``, ``prea_ok``,
    ``ref_ok`` are Out(R), one bit per rank. The ranks share the data bus: a column command
    puts on every *other* rank DRAMsim3's rank-switch constraints (``*_to_*_o`` in its
    ``timing.cc``: the burst gap ``tRTRS``): RD to RD and WR to WR nBL + tRTRS, RD to WR
    CL + nBL + tRTRS - CWL, WR to RD CWL + nBL + tRTRS - CL (at least 1).
    """

    def __init__(self, std, row_queries: int, *, same_bank: bool = False, ranks: int = 1):
        self.std = std = get_standard(std)
        if row_queries < 1:
            raise ValueError(f"row_queries={row_queries}: expected >= 1")
        if same_bank and not std.tRFCsb:
            raise ValueError(f"{std.name}: same-bank refresh: the standard has no REFsb "
                             f"(tRFCsb = 0)")
        if ranks not in (1, 2, 4) or (ranks > 1 and same_bank):
            raise ValueError(f"ranks={ranks}: expected 1, 2 or 4 (1 with same_bank)")
        self.row_queries, self.same_bank, self.ranks = row_queries, same_bank, ranks
        cstd = channel_banks(std, ranks)
        super().__init__({
            "rows": In(row_query(cstd)).array(row_queries),
            "any_open": Out(ranks), "prea_ok": Out(ranks), "ref_ok": Out(ranks),
            "issue": In(issued_command(cstd)),
            "sb_ba": In(range(std.banks_per_group)), "sb_open": Out(std.bank_groups),
            "sb_pre_bg": In(range(std.bank_groups)), "sb_pre_ok": Out(1), "sb_ok": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        now = Signal(STAMP_BITS, reset_less=True)   # time base of the constraint timestamps
        m.d.sync += now.eq(now + 1)
        tb = _Stamps(m, now)
        if self.ranks > 1:
            s = self._rank_state(tb)
            self._rank_answers(tb, s)
            self._rank_updates(tb, s)
        else:
            s = self._state(tb)
            self._answers(tb, s)
            self._updates(tb, s)
        return m

    # ---- one rank

    def _state(self, tb):
        """The rank's state: open rows, the timestamp RAMs and registers, the tFAW counters."""
        std, T = self.std, STAMP_BITS
        nbank, nbg = std.banks, std.bank_groups
        s = SimpleNamespace()
        # open rows and constraint timestamps, one RAM word per bank (group). A constraint
        # that a command puts on every bank (group) other than its own is a single "_any"
        # timestamp: with same-group values >= other-group values max(own, any) is the
        # per-group counter.
        s.is_open = Signal(nbank)
        s.open_row = tb.table(nbank, "open_row", ceil_log2(std.rows))
        s.act_at, s.pre_at, s.col_at = (tb.table(nbank, n, T)
                                        for n in ("act_at", "pre_at", "col_at"))
        s.rd_at, s.wr_at, s.rrd_at = (tb.table(nbg, n, T) for n in ("rd_at", "wr_at", "rrd_at"))
        # in the time base of `now`: kept over a reset, like the RAMs
        s.act_any, s.rd_any, s.wr_any, s.rrd_any = (Signal(T, name=n, reset_less=True) for n in
                                                    ("act_any", "rd_any", "wr_any", "rrd_any"))
        # latest ACT- / PRE-allowed stamp of any bank: all banks may ACT (REF) / PRE (PREA)
        s.act_all = Signal(T, reset_less=True)
        s.pre_all = Signal(T, reset_less=True)
        s.faw = [Signal(range(std.tFAW + 1), name=f"faw{k}") for k in range(4)]
        if self.same_bank:
            bpg = std.banks_per_group
            # per bank address BA: latest ACT/PRE-allowed stamp of its banks (REFsb needs
            # tRC/tRP of all of them), and the end of its last REFsb (tRFCsb)
            s.act_ba = [Signal(T, name=f"act_ba{k}", reset_less=True) for k in range(bpg)]
            s.sb_until = [Signal(T, name=f"sb_until{k}", reset_less=True) for k in range(bpg)]
            s.sb_any = Signal(T, reset_less=True)
            s.act_ba_a, s.sb_until_a = Array(s.act_ba), Array(s.sb_until)
        return s

    def _answers(self, tb, s):
        """The answers: each row query's bank state and allowed commands, PREA, REF, REFsb."""
        m, after, read = tb.m, tb.after, tb.read
        nbg = self.std.bank_groups
        bgb = ceil_log2(nbg)
        faw_ok = s.faw[3] == 0
        for q in self.rows:
            sb_free = after(s.sb_until_a[q.bank[bgb:]]) if self.same_bank else Const(1)
            m.d.comb += [
                q.opened.eq(s.is_open.bit_select(q.bank, 1)),
                q.row_hit.eq(read(s.open_row, q.bank) == q.row),
                q.act_ok.eq(after(read(s.act_at, q.bank)) & after(read(s.rrd_at, q.bg))
                            & after(s.act_any) & after(s.rrd_any) & faw_ok & sb_free),
                q.pre_ok.eq(after(read(s.pre_at, q.bank))),
                q.col_ok.eq(after(read(s.col_at, q.bank))),
                q.rd_ok.eq(after(read(s.rd_at, q.bg)) & after(s.rd_any)),
                q.wr_ok.eq(after(read(s.wr_at, q.bg)) & after(s.wr_any)),
            ]
        m.d.comb += [
            self.any_open.eq(s.is_open.any()),
        ]
        if self.same_bank:
            sb_open = Cat(s.is_open.bit_select(Cat(Const(g, bgb), self.sb_ba), 1)
                          for g in range(nbg))
            m.d.comb += [
                self.prea_ok.eq(after(s.pre_all) & after(s.sb_any)),
                self.ref_ok.eq(after(s.act_all) & after(s.sb_any)),
                self.sb_open.eq(sb_open),
                self.sb_pre_ok.eq(after(read(s.pre_at, Cat(self.sb_pre_bg, self.sb_ba)))),
                self.sb_ok.eq((sb_open == 0) & after(s.act_ba_a[self.sb_ba]) & after(s.act_any)
                              & after(s.sb_until_a[self.sb_ba])),
            ]
        else:
            m.d.comb += [self.prea_ok.eq(after(s.pre_all)), self.ref_ok.eq(after(s.act_all))]

    def _updates(self, tb, s):
        """The issued command's updates: timestamps (now + the constraint), open rows, tFAW."""
        std = self.std
        m, now, later, update = tb.m, tb.now, tb.later, tb.update
        nbank = std.banks
        act_any, act_all, pre_all, is_open, faw = s.act_any, s.act_all, s.pre_all, s.is_open, s.faw
        # (stamp = now + the constraint's cycles)
        kind, bank, bg = self.issue.kind, self.issue.bank, self.issue.bg
        is_act, is_pre = kind == Cmd.ACT, kind == Cmd.PRE
        is_rd, is_wr = kind == Cmd.RD, kind == Cmd.WR
        is_prea, is_ref = kind == Cmd.PREA, kind == Cmd.REF
        act_stamp = now + Mux(is_act, std.tRC, std.tRP)
        update(s.act_at, bank, is_act | is_pre, act_stamp)
        pre_stamp = now + Mux(is_act, std.tRAS, Mux(is_rd, std.tRTP, std.write_to_pre))
        update(s.pre_at, bank, is_act | is_rd | is_wr, pre_stamp)
        update(s.col_at, bank, is_act, now + std.tRCD, keep_later=False)
        update(s.rd_at, bg, is_rd | is_wr, now + Mux(is_rd, std.tCCD_L, std.write_to_read_l))
        update(s.wr_at, bg, is_wr, now + std.tCCD_L_WR, keep_later=False)
        update(s.rrd_at, bg, is_act, now + std.tRRD_L, keep_later=False)
        orow_w = s.open_row.write_port()
        m.d.comb += [orow_w.addr.eq(bank), orow_w.data.eq(self.issue.row), orow_w.en.eq(is_act)]
        all_stamp = now + Mux(is_prea, std.tRPab, std.tRFC)
        with m.If(is_prea | is_ref):
            m.d.sync += [act_any.eq(later(act_any, all_stamp)),
                         act_all.eq(later(act_all, all_stamp))]
        with m.If(is_act | is_pre):
            m.d.sync += act_all.eq(later(act_all, act_stamp))
        if self.same_bank:
            ba = bank[ceil_log2(std.bank_groups):]
            for k in range(std.banks_per_group):
                with m.If((is_act | is_pre) & (ba == k)):
                    m.d.sync += s.act_ba[k].eq(later(s.act_ba[k], act_stamp))
                with m.If((kind == Cmd.REFSB) & (ba == k)):
                    m.d.sync += s.sb_until[k].eq(now + std.tRFCsb)
            with m.If(kind == Cmd.REFSB):
                m.d.sync += s.sb_any.eq(now + std.tRFCsb)
        with m.If(is_act | is_rd | is_wr):
            m.d.sync += pre_all.eq(later(pre_all, pre_stamp))
        with m.If(is_rd | is_wr):
            m.d.sync += s.rd_any.eq(later(s.rd_any, now + Mux(is_rd, std.tCCD_S,
                                                              std.write_to_read_s)))
            m.d.sync += s.wr_any.eq(later(s.wr_any, now + Mux(is_rd, max(std.tRTW, std.tCCD_L),
                                                              std.tCCD_S)))
        with m.If(is_act):
            m.d.sync += [s.rrd_any.eq(now + std.tRRD_S),
                         is_open.eq(is_open | (Const(1, nbank) << bank)[:nbank])]
        with m.If(is_pre):
            m.d.sync += is_open.eq(is_open & ~(Const(1, nbank) << bank)[:nbank])
        with m.If(is_prea):
            m.d.sync += is_open.eq(0)
        # four-activate window: faw[k] = cycles until the (k+1)-th latest ACT leaves the window
        dec = [Mux(x == 0, 0, x - 1) for x in faw]
        with m.If(is_act):
            m.d.sync += [faw[0].eq(std.tFAW - 1)] + [faw[k].eq(dec[k - 1]) for k in range(1, 4)]
        with m.Else():
            m.d.sync += [faw[k].eq(dec[k]) for k in range(4)]

    # ---- R ranks sharing a channel (see the class docstring): the one-rank table's
    # constraints per rank, plus the rank-switch constraints of the data bus

    def _rank_of(self, bank):
        """The rank bits of the channel's flat bank index ``bank``."""
        std = self.std
        return bank[ceil_log2(std.bank_groups) + ceil_log2(std.banks_per_group):]

    def _group(self, bg, bank):
        """The (rank, bank group) index of the per-group tables."""
        return Cat(bg, self._rank_of(bank))

    def _rank_state(self, tb):
        """The ranks' state: open rows, timestamp RAMs, per-rank stamps and tFAW counters."""
        std, R, T = self.std, self.ranks, STAMP_BITS
        nbank, nbg = std.banks * R, std.bank_groups
        s = SimpleNamespace()
        s.is_open = Signal(nbank)
        s.open_row = tb.table(nbank, "open_row", ceil_log2(std.rows))
        s.act_at, s.pre_at, s.col_at = (tb.table(nbank, n, T)
                                        for n in ("act_at", "pre_at", "col_at"))
        s.rd_at, s.wr_at, s.rrd_at = (tb.table(nbg * R, n, T)
                                      for n in ("rd_at", "wr_at", "rrd_at"))

        def per_rank(name):
            return [Signal(T, name=f"{name}{r}", reset_less=True) for r in range(R)]

        s.act_any, s.rd_any, s.wr_any, s.rrd_any = (per_rank(n) for n in
                                                    ("act_any", "rd_any", "wr_any", "rrd_any"))
        s.act_all, s.pre_all = per_rank("act_all"), per_rank("pre_all")
        s.faw = [[Signal(range(std.tFAW + 1), name=f"faw{r}_{k}") for k in range(4)]
                 for r in range(R)]
        s.faw_ok = Signal(R)
        tb.m.d.comb += s.faw_ok.eq(Cat(f[3] == 0 for f in s.faw))
        return s

    def _rank_answers(self, tb, s):
        """The answers: each row query's bank state and allowed commands; PREA/REF per rank."""
        m, after, read, group = tb.m, tb.after, tb.read, self._group
        R, nb = self.ranks, self.std.banks
        act_any_a, rd_any_a, wr_any_a, rrd_any_a = (Array(x) for x in
                                                    (s.act_any, s.rd_any, s.wr_any, s.rrd_any))
        for q in self.rows:
            r = self._rank_of(q.bank)
            m.d.comb += [
                q.opened.eq(s.is_open.bit_select(q.bank, 1)),
                q.row_hit.eq(read(s.open_row, q.bank) == q.row),
                q.act_ok.eq(after(read(s.act_at, q.bank))
                            & after(read(s.rrd_at, group(q.bg, q.bank)))
                            & after(act_any_a[r]) & after(rrd_any_a[r])
                            & s.faw_ok.bit_select(r, 1)),
                q.pre_ok.eq(after(read(s.pre_at, q.bank))),
                q.col_ok.eq(after(read(s.col_at, q.bank))),
                q.rd_ok.eq(after(read(s.rd_at, group(q.bg, q.bank))) & after(rd_any_a[r])),
                q.wr_ok.eq(after(read(s.wr_at, group(q.bg, q.bank))) & after(wr_any_a[r])),
            ]
        m.d.comb += [
            self.any_open.eq(Cat(s.is_open[r * nb:(r + 1) * nb].any() for r in range(R))),
            self.prea_ok.eq(Cat(after(x) for x in s.pre_all)),
            self.ref_ok.eq(Cat(after(x) for x in s.act_all)),
        ]

    def _rank_updates(self, tb, s):
        """The issued command's updates: per-rank stamps, the data bus's rank switch, tFAW."""
        std, R = self.std, self.ranks
        m, now, later, update, group = tb.m, tb.now, tb.later, tb.update, self._group
        nb = std.banks
        nbank = nb * R
        act_any, rd_any, wr_any, rrd_any = s.act_any, s.rd_any, s.wr_any, s.rrd_any
        act_all, pre_all, faw, is_open = s.act_all, s.pre_all, s.faw, s.is_open
        kind, bank, bg = self.issue.kind, self.issue.bank, self.issue.bg
        ir = self._rank_of(bank)
        is_act, is_pre = kind == Cmd.ACT, kind == Cmd.PRE
        is_rd, is_wr = kind == Cmd.RD, kind == Cmd.WR
        is_prea, is_ref = kind == Cmd.PREA, kind == Cmd.REF
        act_stamp = now + Mux(is_act, std.tRC, std.tRP)
        update(s.act_at, bank, is_act | is_pre, act_stamp)
        pre_stamp = now + Mux(is_act, std.tRAS, Mux(is_rd, std.tRTP, std.write_to_pre))
        update(s.pre_at, bank, is_act | is_rd | is_wr, pre_stamp)
        update(s.col_at, bank, is_act, now + std.tRCD, keep_later=False)
        update(s.rd_at, group(bg, bank), is_rd | is_wr,
               now + Mux(is_rd, std.tCCD_L, std.write_to_read_l))
        update(s.wr_at, group(bg, bank), is_wr, now + std.tCCD_L_WR, keep_later=False)
        update(s.rrd_at, group(bg, bank), is_act, now + std.tRRD_L, keep_later=False)
        orow_w = s.open_row.write_port()
        m.d.comb += [orow_w.addr.eq(bank), orow_w.data.eq(self.issue.row), orow_w.en.eq(is_act)]
        all_stamp = now + Mux(is_prea, std.tRPab, std.tRFC)
        # data-bus rank switch (DRAMsim3 timing.cc read_to_read_o ... write_to_read_o)
        rr_o = std.nBL + std.tRTRS
        ww_o = std.nBL + std.tRTRS
        rw_o = std.CL + std.nBL + std.tRTRS - std.CWL
        wr_o = max(1, std.CWL + std.nBL + std.tRTRS - std.CL)
        dec = [[Mux(x == 0, 0, x - 1) for x in f] for f in faw]
        for r in range(R):
            mine = ir == r
            with m.If((is_prea | is_ref) & mine):
                m.d.sync += [act_any[r].eq(later(act_any[r], all_stamp)),
                             act_all[r].eq(later(act_all[r], all_stamp))]
            with m.If((is_act | is_pre) & mine):
                m.d.sync += act_all[r].eq(later(act_all[r], act_stamp))
            with m.If((is_act | is_rd | is_wr) & mine):
                m.d.sync += pre_all[r].eq(later(pre_all[r], pre_stamp))
            with m.If(is_rd | is_wr):
                m.d.sync += [
                    rd_any[r].eq(later(rd_any[r], now + Mux(
                        mine, Mux(is_rd, std.tCCD_S, std.write_to_read_s),
                        Mux(is_rd, rr_o, wr_o)))),
                    wr_any[r].eq(later(wr_any[r], now + Mux(
                        mine, Mux(is_rd, max(std.tRTW, std.tCCD_L), std.tCCD_S),
                        Mux(is_rd, rw_o, ww_o)))),
                ]
            with m.If(is_act & mine):
                m.d.sync += rrd_any[r].eq(now + std.tRRD_S)
                m.d.sync += [faw[r][0].eq(std.tFAW - 1)] + [faw[r][k].eq(dec[r][k - 1])
                                                            for k in range(1, 4)]
            with m.Else():
                m.d.sync += [faw[r][k].eq(dec[r][k]) for k in range(4)]
        one = Const(1, nbank)
        with m.If(is_act):
            m.d.sync += is_open.eq(is_open | (one << bank)[:nbank])
        with m.If(is_pre):
            m.d.sync += is_open.eq(is_open & ~(one << bank)[:nbank])
        with m.If(is_prea):
            m.d.sync += is_open.eq(Cat(Mux(ir == r, 0, is_open[r * nb:(r + 1) * nb])
                                       for r in range(R)))


class _Stamps:
    """The timing table's building blocks on module ``m`` with the time base ``now``."""

    def __init__(self, m, now):
        self.m, self.now = m, now

    def after(self, stamp):
        """The constraint whose earliest cycle is ``stamp`` allows a command now."""
        return self.now >= stamp

    @staticmethod
    def later(a, b):
        """The later of two stamps."""
        return Mux(a > b, a, b)

    def table(self, depth, name, shape):
        """A RAM of ``depth`` words of ``shape`` bits, submodule ``name``."""
        mem = Memory(shape=unsigned(shape), depth=depth, init=[])
        self.m.submodules[name] = mem
        return mem

    def read(self, mem, index):
        """Data of a new combinational read port of ``mem`` at ``index``."""
        port = mem.read_port(domain="comb")
        self.m.d.comb += port.addr.eq(index)
        return port.data

    def update(self, mem, index, en, stamp, keep_later=True):
        """A write port of ``mem`` writing ``stamp`` at ``index`` (keeping a later one)."""
        port = mem.write_port()
        self.m.d.comb += [port.addr.eq(index), port.en.eq(en),
                          port.data.eq(self.later(self.read(mem, index), stamp) if keep_later
                                       else stamp)]
