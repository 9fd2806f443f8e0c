"""Timing table of the rank memory controller: bank state and every JEDEC constraint.

Every bank and bank-group constraint is a timestamp: a command sets the earliest cycle at which
a dependent command may issue (``now + tXX``, keeping a later one already set), and the
dependent command waits until the free-running cycle counter ``now`` reaches it; tFAW (the four
latest ACTs) is a set of down-counters. So a command the table allows obeys the standard
cycle by cycle *by construction*; :mod:`coda.cosim.dram_check` verifies the command stream
independently from the command log.

Per-bank and per-bank-group timestamps and open rows live in small RAMs indexed by bank (group):
a query reads the state of one bank, an issued command writes only the words it changes. A
constraint a command puts on every *other* bank group (tCCD_S, tRRD_S, tWTR_S) is one shared
timestamp; the group's own (the _L value) is at least as long, so max(own, shared) equals the
per-group constraint. The timestamps and ``now`` are not reset: a controller reset forgets open
rows, not the timing constraints the DRAM still obeys.

This is the part of Ramulator 2's DRAM model (``check_ready`` / ``update_timing`` over the
timing constraints of the standard's table) that a scheduler consults; the standard itself is
data (:mod:`coda.hw.dram_standards`).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .dram_standards import DRAMStandard, channel_banks, get_standard

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

    Parameters:
        std: a :class:`DRAMStandard` or preset name (same-bank-group constraints at least
            the other-group ones, as :class:`coda.hw.dram.DRAMController` checks).
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
        if self.ranks > 1:
            return self._elaborate_ranks()
        std = self.std
        m = Module()
        nbank, nbg, T = std.banks, std.bank_groups, STAMP_BITS

        now = Signal(T, reset_less=True)    # time base of the constraint timestamps
        m.d.sync += now.eq(now + 1)

        def after(stamp):
            """The constraint whose earliest cycle is ``stamp`` allows a command now."""
            return now >= stamp

        def later(a, b):
            return Mux(a > b, a, b)

        def table(depth, name, shape):
            mem = Memory(shape=unsigned(shape), depth=depth, init=[])
            m.submodules[name] = mem
            return mem

        def read(mem, index):
            """Data of a new combinational read port of ``mem`` at ``index``."""
            port = mem.read_port(domain="comb")
            m.d.comb += port.addr.eq(index)
            return port.data

        # open rows and constraint timestamps, one RAM word per bank (group). A constraint
        # that a command puts on every bank (group) other than its own is a single "_any"
        # timestamp: with same-group values >= other-group values max(own, any) is the
        # per-group counter.
        is_open = Signal(nbank)
        open_row = table(nbank, "open_row", ceil_log2(std.rows))
        act_at, pre_at, col_at = (table(nbank, n, T) for n in ("act_at", "pre_at", "col_at"))
        rd_at, wr_at, rrd_at = (table(nbg, n, T) for n in ("rd_at", "wr_at", "rrd_at"))
        # in the time base of `now`: kept over a reset, like the RAMs
        act_any, rd_any, wr_any, rrd_any = (Signal(T, name=n, reset_less=True) for n in
                                            ("act_any", "rd_any", "wr_any", "rrd_any"))
        # latest ACT- / PRE-allowed stamp of any bank: all banks may ACT (REF) / PRE (PREA)
        act_all = Signal(T, reset_less=True)
        pre_all = Signal(T, reset_less=True)
        faw = [Signal(range(std.tFAW + 1), name=f"faw{k}") for k in range(4)]
        faw_ok = faw[3] == 0
        bgb = ceil_log2(nbg)
        bpg = std.banks_per_group
        if self.same_bank:
            # per bank address BA: latest ACT/PRE-allowed stamp of its banks (REFsb needs
            # tRC/tRP of all of them), and the end of its last REFsb (tRFCsb)
            act_ba = [Signal(T, name=f"act_ba{k}", reset_less=True) for k in range(bpg)]
            sb_until = [Signal(T, name=f"sb_until{k}", reset_less=True) for k in range(bpg)]
            sb_any = Signal(T, reset_less=True)
            act_ba_a, sb_until_a = Array(act_ba), Array(sb_until)

        # ---- answers
        for q in self.rows:
            sb_free = after(sb_until_a[q.bank[bgb:]]) if self.same_bank else Const(1)
            m.d.comb += [
                q.opened.eq(is_open.bit_select(q.bank, 1)),
                q.row_hit.eq(read(open_row, q.bank) == q.row),
                q.act_ok.eq(after(read(act_at, q.bank)) & after(read(rrd_at, q.bg))
                            & after(act_any) & after(rrd_any) & faw_ok & sb_free),
                q.pre_ok.eq(after(read(pre_at, q.bank))),
                q.col_ok.eq(after(read(col_at, q.bank))),
                q.rd_ok.eq(after(read(rd_at, q.bg)) & after(rd_any)),
                q.wr_ok.eq(after(read(wr_at, q.bg)) & after(wr_any)),
            ]
        m.d.comb += [
            self.any_open.eq(is_open.any()),
        ]
        if self.same_bank:
            sb_open = Cat(is_open.bit_select(Cat(Const(g, bgb), self.sb_ba), 1)
                          for g in range(nbg))
            m.d.comb += [
                self.prea_ok.eq(after(pre_all) & after(sb_any)),
                self.ref_ok.eq(after(act_all) & after(sb_any)),
                self.sb_open.eq(sb_open),
                self.sb_pre_ok.eq(after(read(pre_at, Cat(self.sb_pre_bg, self.sb_ba)))),
                self.sb_ok.eq((sb_open == 0) & after(act_ba_a[self.sb_ba]) & after(act_any)
                              & after(sb_until_a[self.sb_ba])),
            ]
        else:
            m.d.comb += [self.prea_ok.eq(after(pre_all)), self.ref_ok.eq(after(act_all))]

        # ---- updates from the issued command (stamp = now + the constraint's cycles)
        kind, bank, bg = self.issue.kind, self.issue.bank, self.issue.bg
        is_act, is_pre = kind == Cmd.ACT, kind == Cmd.PRE
        is_rd, is_wr = kind == Cmd.RD, kind == Cmd.WR
        is_prea, is_ref = kind == Cmd.PREA, kind == Cmd.REF

        def update(mem, index, en, stamp, keep_later=True):
            port = mem.write_port()
            m.d.comb += [port.addr.eq(index), port.en.eq(en),
                         port.data.eq(later(read(mem, index), stamp) if keep_later else stamp)]

        act_stamp = now + Mux(is_act, std.tRC, std.tRP)
        update(act_at, bank, is_act | is_pre, act_stamp)
        pre_stamp = now + Mux(is_act, std.tRAS, Mux(is_rd, std.tRTP, std.write_to_pre))
        update(pre_at, bank, is_act | is_rd | is_wr, pre_stamp)
        update(col_at, bank, is_act, now + std.tRCD, keep_later=False)
        update(rd_at, bg, is_rd | is_wr, now + Mux(is_rd, std.tCCD_L, std.write_to_read_l))
        update(wr_at, bg, is_wr, now + std.tCCD_L_WR, keep_later=False)
        update(rrd_at, bg, is_act, now + std.tRRD_L, keep_later=False)
        orow_w = open_row.write_port()
        m.d.comb += [orow_w.addr.eq(bank), orow_w.data.eq(self.issue.row), orow_w.en.eq(is_act)]
        all_stamp = now + Mux(is_prea, std.tRPab, std.tRFC)
        with m.If(is_prea | is_ref):
            m.d.sync += [act_any.eq(later(act_any, all_stamp)),
                         act_all.eq(later(act_all, all_stamp))]
        with m.If(is_act | is_pre):
            m.d.sync += act_all.eq(later(act_all, act_stamp))
        if self.same_bank:
            ba = bank[bgb:]
            for k in range(bpg):
                with m.If((is_act | is_pre) & (ba == k)):
                    m.d.sync += act_ba[k].eq(later(act_ba[k], act_stamp))
                with m.If((kind == Cmd.REFSB) & (ba == k)):
                    m.d.sync += sb_until[k].eq(now + std.tRFCsb)
            with m.If(kind == Cmd.REFSB):
                m.d.sync += sb_any.eq(now + std.tRFCsb)
        with m.If(is_act | is_rd | is_wr):
            m.d.sync += pre_all.eq(later(pre_all, pre_stamp))
        with m.If(is_rd | is_wr):
            m.d.sync += rd_any.eq(later(rd_any, now + Mux(is_rd, std.tCCD_S,
                                                          std.write_to_read_s)))
            m.d.sync += wr_any.eq(later(wr_any, now + Mux(is_rd, max(std.tRTW, std.tCCD_L),
                                                          std.tCCD_S)))
        with m.If(is_act):
            m.d.sync += [rrd_any.eq(now + std.tRRD_S),
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
        return m

    def _elaborate_ranks(self):
        """The table of R ranks sharing a channel (see the class docstring): the one-rank
        table's constraints per rank, plus the rank-switch constraints of the data bus."""
        std, R = self.std, self.ranks
        m = Module()
        nb, nbg, T = std.banks, std.bank_groups, STAMP_BITS
        nbank = nb * R
        rank_lo = ceil_log2(nbg) + ceil_log2(std.banks_per_group)

        now = Signal(T, reset_less=True)
        m.d.sync += now.eq(now + 1)

        def after(stamp):
            return now >= stamp

        def later(a, b):
            return Mux(a > b, a, b)

        def table(depth, name, shape):
            mem = Memory(shape=unsigned(shape), depth=depth, init=[])
            m.submodules[name] = mem
            return mem

        def read(mem, index):
            port = mem.read_port(domain="comb")
            m.d.comb += port.addr.eq(index)
            return port.data

        def rank_of(bank):
            return bank[rank_lo:]

        def group(bg, bank):            # (rank, bank group) index of the per-group tables
            return Cat(bg, rank_of(bank))

        is_open = Signal(nbank)
        open_row = table(nbank, "open_row", ceil_log2(std.rows))
        act_at, pre_at, col_at = (table(nbank, n, T) for n in ("act_at", "pre_at", "col_at"))
        rd_at, wr_at, rrd_at = (table(nbg * R, n, T) for n in ("rd_at", "wr_at", "rrd_at"))

        def per_rank(name):
            return [Signal(T, name=f"{name}{r}", reset_less=True) for r in range(R)]

        act_any, rd_any, wr_any, rrd_any = (per_rank(n) for n in
                                            ("act_any", "rd_any", "wr_any", "rrd_any"))
        act_all, pre_all = per_rank("act_all"), per_rank("pre_all")
        faw = [[Signal(range(std.tFAW + 1), name=f"faw{r}_{k}") for k in range(4)]
               for r in range(R)]
        faw_ok = Signal(R)
        m.d.comb += faw_ok.eq(Cat(f[3] == 0 for f in faw))
        act_any_a, rd_any_a, wr_any_a, rrd_any_a = (Array(x) for x in
                                                    (act_any, rd_any, wr_any, rrd_any))

        for q in self.rows:
            r = rank_of(q.bank)
            m.d.comb += [
                q.opened.eq(is_open.bit_select(q.bank, 1)),
                q.row_hit.eq(read(open_row, q.bank) == q.row),
                q.act_ok.eq(after(read(act_at, q.bank)) & after(read(rrd_at, group(q.bg, q.bank)))
                            & after(act_any_a[r]) & after(rrd_any_a[r])
                            & faw_ok.bit_select(r, 1)),
                q.pre_ok.eq(after(read(pre_at, q.bank))),
                q.col_ok.eq(after(read(col_at, q.bank))),
                q.rd_ok.eq(after(read(rd_at, group(q.bg, q.bank))) & after(rd_any_a[r])),
                q.wr_ok.eq(after(read(wr_at, group(q.bg, q.bank))) & after(wr_any_a[r])),
            ]
        m.d.comb += [
            self.any_open.eq(Cat(is_open[r * nb:(r + 1) * nb].any() for r in range(R))),
            self.prea_ok.eq(Cat(after(x) for x in pre_all)),
            self.ref_ok.eq(Cat(after(x) for x in act_all)),
        ]

        kind, bank, bg = self.issue.kind, self.issue.bank, self.issue.bg
        ir = rank_of(bank)
        is_act, is_pre = kind == Cmd.ACT, kind == Cmd.PRE
        is_rd, is_wr = kind == Cmd.RD, kind == Cmd.WR
        is_prea, is_ref = kind == Cmd.PREA, kind == Cmd.REF

        def update(mem, index, en, stamp, keep_later=True):
            port = mem.write_port()
            m.d.comb += [port.addr.eq(index), port.en.eq(en),
                         port.data.eq(later(read(mem, index), stamp) if keep_later else stamp)]

        act_stamp = now + Mux(is_act, std.tRC, std.tRP)
        update(act_at, bank, is_act | is_pre, act_stamp)
        pre_stamp = now + Mux(is_act, std.tRAS, Mux(is_rd, std.tRTP, std.write_to_pre))
        update(pre_at, bank, is_act | is_rd | is_wr, pre_stamp)
        update(col_at, bank, is_act, now + std.tRCD, keep_later=False)
        update(rd_at, group(bg, bank), is_rd | is_wr,
               now + Mux(is_rd, std.tCCD_L, std.write_to_read_l))
        update(wr_at, group(bg, bank), is_wr, now + std.tCCD_L_WR, keep_later=False)
        update(rrd_at, group(bg, bank), is_act, now + std.tRRD_L, keep_later=False)
        orow_w = open_row.write_port()
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
        return m
