"""Scheduler of the rank memory controller: which command issues this cycle (FR-FCFS).

:class:`Scheduler`: first-ready, first-come-first-served (Rixner et al., ISCA 2000) over the
first ``lookahead`` entries of the active request queue (reads, or writes in write mode), oldest
first: refresh, then the oldest ready column command (row hits first), then the oldest allowed
row command, then the row policy's PRE; a starvation cap (``max_bypass``) on how often the oldest
entry is overtaken. Its docstring has the exact rules.

Like Ramulator 2's schedulers, it is a plug-in with a small interface: the entries it may
choose from in, questions to the timing table out, the command and the entry it chose out.
Reads may thus be served out of order: the controller returns their data in request order.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.hw.dram.timing import Cmd, row_query

__all__ = ["Scheduler", "queue_entry", "close_request"]


def queue_entry(std: DRAMStandard) -> wiring.Signature:
    """One request queue entry as the scheduler sees it (from the queue's side): ``valid``,
    its ``bank`` (index in the rank), bank group ``bg``, ``row`` and the ordering ``flag``
    (issue only as the oldest entry)."""
    return wiring.Signature({
        "valid": Out(1), "bank": Out(ceil_log2(std.banks)),
        "bg": Out(ceil_log2(std.bank_groups)), "row": Out(ceil_log2(std.rows)),
        "flag": Out(1)})


def close_request(std: DRAMStandard) -> wiring.Signature:
    """The row policy's wish, from the policy's side: close ``bank`` (bank group ``bg``)
    whose open row is ``row`` (``valid``: the wish holds this cycle)."""
    return wiring.Signature({
        "valid": Out(1), "bank": Out(ceil_log2(std.banks)),
        "bg": Out(ceil_log2(std.bank_groups)), "row": Out(ceil_log2(std.rows))})


class Scheduler(wiring.Component):
    """FR-FCFS scheduler with a bypass cap.

    First-ready, first-come-first-served (Rixner et al., ISCA 2000) over the first ``lookahead``
    entries of the active request queue (reads, or writes in write mode), oldest first:

    - refresh first: the refresh manager's PREA, then its REF; while a REF is pending nothing
      else starts;
    - then the *oldest ready column command*: a RD (WR in write mode) of an entry whose row is
      open and that the timing table allows now (row hits first, then age). An entry carrying
      the controller's ordering ``flag`` (a read whose address had a queued write, a write whose
      address had one: read-after-write / write-after-write) issues only as the oldest entry,
      and the oldest read only while no queued write has its address (``raw``; the controller
      then drains the writes);
    - else the oldest row command (ACT to a closed bank; PRE of a bank open on another row) of an
      entry whose bank no older entry uses (a row still needed by an older request is never
      closed) and, for a PRE, whose bank's open row no entry that could issue now still hits;
    - else a PRE asked for by the row policy (:mod:`coda.hw.dram.rowpolicy`) for a bank no
      entry in the window uses.

    Starvation cap: when ``max_bypass`` column commands have issued for younger entries while the
    oldest one waited, only the oldest entry's column command may issue until it is served, and
    the hit protection of its bank is lifted (row commands keep their oldest-first order, so the
    oldest entry's ACT/PRE goes first whenever the timing table allows it).

    Parameters:
        std: a :class:`DRAMStandard` or preset name.
        lookahead: entries of the active queue it chooses from (>= 1).
        max_bypass: column commands that may overtake the oldest entry before only its
            commands may issue (>= 1).
        closes: row-policy close requests it takes (>= 0).
        ranks: ranks of the channel (1, 2 or 4; ``std`` then the channel's view,
            :func:`coda.hw.dram.standards.channel_banks`: the rank is the top bits of an
            entry's ``bank``). With R > 1 the refresh wishes are per rank (``ref_pending``,
            ``prea``, ``ref``: In(R)): a refreshing rank's entries wait, the other ranks' go
            on (an oldest entry waiting for its rank's refresh is overtaken without counting
            against ``max_bypass``); the lowest rank's PREA/REF goes first, its rank on
            ``ref_rank``.

    Members:
        look: In(:func:`queue_entry`) x ``lookahead``: the active queue's first entries
            (0 = the oldest slot; ``valid`` 0 for a hole or past the tail).
        close: In(:func:`close_request`) x ``closes``: the row policy's PRE wishes.
        wmode: In(1): the active queue is the write queue.
        raw: In(1): entry 0 (a read) has an address of a queued write.
        ref_pending: In(1), prea: In(1), ref: In(1): the all-bank refresh manager's state and
            wishes.
        sb_block: In(1), sb_ba: In, sb_pre: In(1), refsb: In(1): the same-bank refresh
            manager's (entries of bank address ``sb_ba`` held while ``sb_block``; its PRE and
            REFsb wishes, issued before any request's command).
        refresh_pre: Out(1): the command is the same-bank refresh manager's PRE.
        rows: Out(:func:`coda.hw.dram.timing.row_query`) x ``lookahead + closes``: the
            entries' banks, then the close requests' banks, asked of the timing table.
        kind: Out(3): the :class:`coda.hw.dram.timing.Cmd` to issue this cycle (NOP: none).
        sel: Out(range(max(lookahead, 2))): the entry of an ACT/PRE/RD/WR (0 otherwise).
        policy_pre: Out(1): the command is a PRE of the row policy (``sel_close`` says whose).
        sel_close: Out(range(max(closes, 2))).
        ref_rank: Out(range(ranks)) (only with ranks > 1): the rank of a PREA/REF.
    """

    def __init__(self, std, lookahead: int, *, max_bypass: int = 16, closes: int = 0,
                 ranks: int = 1):
        self.std = std = get_standard(std)
        self.ranks = ranks
        if lookahead < 1:
            raise ValueError(f"lookahead={lookahead}: expected >= 1")
        if max_bypass < 1:
            raise ValueError(f"max_bypass={max_bypass}: expected >= 1")
        if closes < 0:
            raise ValueError(f"closes={closes}: expected >= 0")
        self.lookahead, self.max_bypass, self.closes = lookahead, max_bypass, closes
        extra = {"ref_rank": Out(range(ranks))} if ranks > 1 else {}
        super().__init__(extra | {
            "look": In(queue_entry(std)).array(lookahead),
            "close": In(close_request(std)).array(closes),
            "wmode": In(1), "raw": In(1),
            "ref_pending": In(ranks), "prea": In(ranks), "ref": In(ranks),
            "sb_block": In(1), "sb_ba": In(range(std.banks_per_group)), "sb_pre": In(1),
            "refsb": In(1), "refresh_pre": Out(1),
            "rows": Out(row_query(std)).array(lookahead + closes),
            "kind": Out(3), "sel": Out(range(max(lookahead, 2))),
            "policy_pre": Out(1), "sel_close": Out(range(max(closes, 2))),
        })

    def elaborate(self, platform):
        m = Module()
        look, n = self.look, self.lookahead
        rows, crows = self.rows[:n], self.rows[n:]
        for e, q in zip(look, rows):
            m.d.comb += [q.bank.eq(e.bank), q.bg.eq(e.bg), q.row.eq(e.row)]
        for c, q in zip(self.close, crows):
            m.d.comb += [q.bank.eq(c.bank), q.bg.eq(c.bg), q.row.eq(c.row)]

        # ---- the bypass cap: column commands that overtook entry 0 since it became oldest
        bypass = Signal(range(self.max_bypass + 1))
        capped = Signal()
        m.d.comb += capped.eq(bypass >= self.max_bypass)
        bank_bits = ceil_log2(self.std.banks)
        rank_bits = ceil_log2(self.ranks)

        free0 = ~self.ref_pending

        def free_for(bank):
            """No refresh pending in the rank of ``bank`` (one rank: none pending)."""
            if self.ranks == 1:
                return free0
            return ~self.ref_pending.bit_select(bank[bank_bits - rank_bits:], 1)

        # ---- per entry: hit, column command ready, row commands allowed
        hit = [Signal(name=f"hit{i}") for i in range(n)]
        eligible = [Signal(name=f"elig{i}") for i in range(n)]   # may issue in this order
        cand_col = [Signal(name=f"cand_col{i}") for i in range(n)]
        cand_act = [Signal(name=f"cand_act{i}") for i in range(n)]
        cand_pre = [Signal(name=f"cand_pre{i}") for i in range(n)]
        bgb = ceil_log2(self.std.bank_groups)
        held_sb = [self.sb_block & (e.bank[bgb:] == self.sb_ba) for e in look]
        for i, (e, q) in enumerate(zip(look, rows)):
            free = free_for(e.bank)
            order_ok = (self.wmode | ~self.raw) if i == 0 else ~e.flag
            m.d.comb += [
                hit[i].eq(e.valid & q.opened & q.row_hit),
                eligible[i].eq(e.valid & order_ok & (Const(i == 0) | ~capped) & ~held_sb[i]),
                cand_col[i].eq(eligible[i] & hit[i] & q.col_ok & free
                               & Mux(self.wmode, q.wr_ok, q.rd_ok)),
            ]
        for i, (e, q) in enumerate(zip(look, rows)):
            front = e.valid
            for j in range(i):
                front = front & (~look[j].valid | (look[j].bank != e.bank))
            # a row that an entry able to issue still hits stays open (unless capped)
            held = Const(0)
            for k in range(n):
                if k != i:
                    held = held | (eligible[k] & hit[k] & (look[k].bank == e.bank))
            free = free_for(e.bank)
            m.d.comb += [
                cand_act[i].eq(front & ~q.opened & q.act_ok & free & ~held_sb[i]),
                cand_pre[i].eq(front & q.opened & ~q.row_hit & q.pre_ok & free
                               & (~held | (capped & Const(i == 0)))),
            ]
        # ---- row-policy closes: a bank no window entry uses, still open on that row
        cand_close = []
        for c, q in zip(self.close, crows):
            unused = Const(1)
            for e in look:
                unused = unused & (~e.valid | (e.bank != c.bank))
            cand_close.append(c.valid & unused & q.opened & q.row_hit & q.pre_ok
                              & free_for(c.bank) & ~capped)

        # ---- choose one command
        any_col = Const(0)
        for x in cand_col:
            any_col = any_col | x
        if self.ranks == 1:
            with m.If(self.prea):
                m.d.comb += self.kind.eq(Cmd.PREA)
            with m.Elif(self.ref):
                m.d.comb += self.kind.eq(Cmd.REF)
        else:
            with m.If((self.prea | self.ref).any()):
                for r in reversed(range(self.ranks)):      # the lowest rank's wish wins
                    with m.If(self.prea[r] | self.ref[r]):
                        m.d.comb += [self.kind.eq(Mux(self.prea[r], Cmd.PREA, Cmd.REF)),
                                     self.ref_rank.eq(r)]
        with m.Elif(self.refsb):
            m.d.comb += self.kind.eq(Cmd.REFSB)
        with m.Elif(self.sb_pre):
            m.d.comb += [self.kind.eq(Cmd.PRE), self.refresh_pre.eq(1)]
        with m.Elif(any_col):
            for i in reversed(range(n)):  # the oldest ready column command wins
                with m.If(cand_col[i]):
                    m.d.comb += [self.kind.eq(Mux(self.wmode, Cmd.WR, Cmd.RD)), self.sel.eq(i)]
        with m.Else():
            for k in reversed(range(len(cand_close))):   # lowest priority: policy closes
                with m.If(cand_close[k]):
                    m.d.comb += [self.kind.eq(Cmd.PRE), self.policy_pre.eq(1),
                                 self.sel_close.eq(k)]
            for i in reversed(range(n)):  # the oldest row command wins (last assignment)
                with m.If(cand_act[i] | cand_pre[i]):
                    m.d.comb += [self.kind.eq(Mux(cand_act[i], Cmd.ACT, Cmd.PRE)),
                                 self.sel.eq(i), self.policy_pre.eq(0)]

        # ---- bypass counter update
        col = self.kind.matches(Cmd.RD, Cmd.WR)
        last_wmode = Signal()
        m.d.sync += last_wmode.eq(self.wmode)
        # (an oldest entry held for a same-bank refresh, or with ranks for its rank's
        # refresh, is overtaken without counting: else the other ranks would stop too)
        held0 = held_sb[0] if self.ranks == 1 else held_sb[0] | ~free_for(look[0].bank)
        with m.If(~look[0].valid | held0 | (self.wmode != last_wmode)
                  | (col & (self.sel == 0))):
            m.d.sync += bypass.eq(0)
        with m.Elif(col & ~capped):
            m.d.sync += bypass.eq(bypass + 1)
        return m
