"""Scheduler of the rank memory controller: which command issues this cycle.

Open-page policy over the active request queue (reads, or writes in write mode), of which it
sees the first ``lookahead`` entries, oldest first:

- refresh first: the refresh manager's PREA, then its REF; while a REF is pending nothing
  else starts;
- then the column command of the queue's *head* (RD, or WR in write mode) when its row is
  open and the timing table allows it (column commands issue in order, so read responses
  return in request order); a read waits while a queued write has its address
  (read-after-write: the controller then drains the writes);
- else a row command (ACT to a closed bank, PRE of a bank open on another row) for the
  oldest entry whose bank no older entry of the queue uses (so a row still needed by an
  older request is never closed) and that the timing table allows.

Like Ramulator 2's schedulers, it is a plug-in with a small interface: the entries it may
choose from in, questions to the timing table out, the command and the entry it chose out.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .dram_standards import DRAMStandard, get_standard
from .dram_timing import Cmd, column_query, row_query

__all__ = ["Scheduler", "queue_entry"]


def queue_entry(std: DRAMStandard) -> wiring.Signature:
    """One request queue entry as the scheduler sees it (from the queue's side): ``valid``,
    its ``bank`` (index in the rank), bank group ``bg`` and ``row``."""
    return wiring.Signature({
        "valid": Out(1), "bank": Out(ceil_log2(std.banks)),
        "bg": Out(ceil_log2(std.bank_groups)), "row": Out(ceil_log2(std.rows))})


class Scheduler(wiring.Component):
    """In-order column, oldest-first row-command scheduler (see the module docstring).

    Parameters:
        std: a :class:`DRAMStandard` or preset name.
        lookahead: entries of the active queue considered for ACT/PRE (>= 1).

    Members:
        look: In(:func:`queue_entry`) x ``lookahead``: the active queue's first entries
            (0 = the head; entries older than a valid one are valid).
        wmode: In(1): the active queue is the write queue.
        raw: In(1): the head read's address has a queued write.
        ref_pending: In(1), prea: In(1), ref: In(1): the refresh manager's state and wishes.
        rows: Out(:func:`coda.hw.dram_timing.row_query`) x ``lookahead``: the entries'
            banks asked of the timing table. col: Out(:func:`coda.hw.dram_timing.column_query`):
            the head's column command asked of it.
        kind: Out(3): the :class:`coda.hw.dram_timing.Cmd` to issue this cycle (NOP: none).
        sel: Out(range(max(lookahead, 2))): the entry of an ACT/PRE (0 for the others).
    """

    def __init__(self, std, lookahead: int):
        self.std = std = get_standard(std)
        if lookahead < 1:
            raise ValueError(f"lookahead={lookahead}: expected >= 1")
        self.lookahead = lookahead
        super().__init__({
            "look": In(queue_entry(std)).array(lookahead),
            "wmode": In(1), "raw": In(1),
            "ref_pending": In(1), "prea": In(1), "ref": In(1),
            "rows": Out(row_query(std)).array(lookahead), "col": Out(column_query(std)),
            "kind": Out(3), "sel": Out(range(max(lookahead, 2))),
        })

    def elaborate(self, platform):
        m = Module()
        look, rows, n = self.look, self.rows, self.lookahead
        for e, q in zip(look, rows):
            m.d.comb += [q.bank.eq(e.bank), q.bg.eq(e.bg), q.row.eq(e.row)]
        m.d.comb += [self.col.bank.eq(look[0].bank), self.col.bg.eq(look[0].bg)]

        # ---- column command candidate (the active queue's head)
        head_ok = (~self.ref_pending & look[0].valid & rows[0].opened & rows[0].row_hit
                   & self.col.col_ok)
        rd_go, wr_go = Signal(), Signal()
        m.d.comb += [rd_go.eq(head_ok & ~self.wmode & self.col.rd_ok & ~self.raw),
                     wr_go.eq(head_ok & self.wmode & self.col.wr_ok)]

        # ---- row command candidates (lookahead over the active queue)
        cand_act = [Signal(name=f"cand_act{i}") for i in range(n)]
        cand_pre = [Signal(name=f"cand_pre{i}") for i in range(n)]
        for i, (e, q) in enumerate(zip(look, rows)):
            front = e.valid   # entries older than a valid one are valid
            for j in range(i):
                front = front & (look[j].bank != e.bank)
            m.d.comb += [
                cand_act[i].eq(front & ~q.opened & q.act_ok & ~self.ref_pending),
                cand_pre[i].eq(front & q.opened & ~q.row_hit & q.pre_ok & ~self.ref_pending),
            ]

        # ---- choose one command
        with m.If(self.prea):
            m.d.comb += self.kind.eq(Cmd.PREA)
        with m.Elif(self.ref):
            m.d.comb += self.kind.eq(Cmd.REF)
        with m.Elif(rd_go):
            m.d.comb += self.kind.eq(Cmd.RD)
        with m.Elif(wr_go):
            m.d.comb += self.kind.eq(Cmd.WR)
        with m.Else():
            for i in reversed(range(n)):  # the oldest candidate wins (last assignment)
                with m.If(cand_act[i] | cand_pre[i]):
                    m.d.comb += [self.kind.eq(Mux(cand_act[i], Cmd.ACT, Cmd.PRE)),
                                 self.sel.eq(i)]
        return m
