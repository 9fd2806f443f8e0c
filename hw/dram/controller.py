"""Rank-local DRAM memory controller in Amaranth: the DRAM timing model of the DIMM-NMP.

One :class:`DRAMController` drives one rank (see :mod:`coda.hw.dram.standards` for what a
rank is per standard), or with ``ranks`` > 1 the ranks of one channel. It runs on the DRAM
command clock (one cycle = one tCK) and issues at most one command per cycle. As in Ramulator 2,
the controller is a frame around plug-in parts with small interfaces, each a component in its
own file: address mapping (:mod:`~.mapping`), request queues (:mod:`~.queue`), FR-FCFS scheduler
(:mod:`~.scheduler`), row policy (:mod:`~.rowpolicy`), refresh (:mod:`~.refresh`) and the JEDEC
timing table (:mod:`~.timing`); docs/dimm-nmp.md ("The controller's parts") tabulates them and
lists the known simplifications. The controller keeps what joins them (:class:`DRAMController`).

The command stream obeys the standard cycle by cycle *by construction* (the timing table);
:mod:`coda.cosim.dram.check` verifies it independently from the command log. The word port in
front of the controller is :mod:`~.word_memory`; :func:`dram_verilog` writes the Verilog.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out, connect
from amaranth.utils import ceil_log2

from coda.hw.dram.mapping import AddressMapping
from coda.hw.dram.queue import RequestQueue
from coda.hw.dram.refresh import AllBankRefresh, SameBankRefresh, check_postpone
from coda.hw.dram.rowpolicy import RowPolicy, check_row_policy
from coda.hw.dram.scheduler import Scheduler
from coda.hw.dram.standards import channel_banks, get_standard
from coda.hw.dram.timing import Cmd, TimingTable

__all__ = ["Cmd", "DRAMController", "check_controller", "dram_verilog", "STAT_NAMES", "STAT_BITS"]

# Statistics outputs of the controller, each ``stat_<name>``, 48 bits.
STAT_NAMES = ("reads", "writes", "row_hits", "row_misses", "row_conflicts", "read_latency",
              "cycles", "refreshes")
STAT_BITS = 48


def check_controller(std, *, read_queue: int = 16, write_queue: int = 32,
                     write_high: int | None = None, write_low: int | None = None,
                     lookahead: int = 8, max_bypass: int = 1, row_policy: str = "open",
                     row_timeout: int = 64, policy_banks: int = 4,
                     refresh: str = "all", refresh_postpone: int = 0, ranks: int = 1):
    """Check :class:`DRAMController`'s parameters without building one (same keywords).

    Returns ``(std, write_high, write_low)`` with the watermarks' defaults filled in.
    Raises ValueError naming the bad value (see :class:`DRAMController`).
    """
    std = get_standard(std)
    if read_queue < 1:
        raise ValueError(f"read_queue={read_queue}: expected >= 1")
    if write_queue < 2 or write_queue & (write_queue - 1):
        raise ValueError(f"write_queue={write_queue}: expected a power of two >= 2")
    write_high = write_queue * 3 // 4 if write_high is None else write_high
    write_low = write_queue // 4 if write_low is None else write_low
    if not 0 <= write_low < write_high <= write_queue:
        raise ValueError(f"write_low={write_low}, write_high={write_high}: expected "
                         f"0 <= low < high <= write_queue={write_queue}")
    if lookahead < 1:
        raise ValueError(f"lookahead={lookahead}: expected >= 1")
    if std.bank_groups < 2 or std.banks_per_group < 2:
        raise ValueError(f"{std.name}: expected >= 2 bank groups and banks per group")
    for same, other in (("tCCD_L", "tCCD_S"), ("write_to_read_l", "write_to_read_s"),
                        ("tCCD_L_WR", "tCCD_S"), ("tRRD_L", "tRRD_S")):
        if getattr(std, same) < getattr(std, other):
            raise ValueError(f"{std.name}: {same}={getattr(std, same)} < "
                             f"{other}={getattr(std, other)}; expected the same-bank-group "
                             f"constraint to be at least the other-group one")
    if max_bypass < 1:
        raise ValueError(f"max_bypass={max_bypass}: expected >= 1")
    if refresh not in ("all", "same_bank"):
        raise ValueError(f"refresh={refresh!r}: expected 'all' or 'same_bank'")
    if refresh == "same_bank" and not std.tRFCsb:
        raise ValueError(f"{std.name}: refresh='same_bank': the standard has no same-bank "
                         f"refresh (tRFCsb = 0); expected refresh='all'")
    if not isinstance(policy_banks, int) or policy_banks < 1:
        raise ValueError(f"policy_banks={policy_banks!r}: expected an int >= 1")
    check_row_policy(row_policy, row_timeout, policy_banks)
    check_postpone(std, refresh_postpone)
    if ranks not in (1, 2, 4) or isinstance(ranks, bool):
        raise ValueError(f"ranks={ranks!r}: expected 1, 2 or 4")
    if ranks > 1 and refresh != "all":
        raise ValueError(f"ranks={ranks}: refresh={refresh!r} is one rank only; expected "
                         f"refresh='all' with more ranks")
    return std, write_high, write_low


class DRAMController(wiring.Component):
    """FR-FCFS controller of one DRAM rank (one clock = one tCK).

    The controller itself keeps what joins its parts: separate read and write queues; writes
    buffered and drained in batches (write mode from ``write_high`` queued writes down to
    ``write_low``, or whenever no read waits), so a read/write mix pays one turnaround per batch;
    ordering hazards: a write whose address matches a queued read is not accepted until that
    read has issued (write-after-read), and a read (a write) whose address a queued write has is
    *flagged* at acceptance: it issues only as the oldest of its queue, the oldest read only once
    no queued write has its address, which drains the writes first (read-after-write,
    write-after-write). Reads are served out of order, so each takes a response tag at
    acceptance; the device's bursts (in RD order) are parked by tag in a small buffer and
    returned in request order (a burst that is the next one due passes straight through, with
    no added cycle). It also counts the statistics.

    With ``ranks`` R > 1 the mapping takes rank bits (between bank and row), the queues,
    scheduler and row policy see one rank of R times the banks
    (:func:`~.standards.channel_banks`), the timing table keeps every constraint per rank plus
    the data bus's rank switch (tRTRS), and each rank has its own all-bank refresh manager.

    A cycle reads the bank state only of the entries the scheduler looks at and writes only
    what the issued command changes, which keeps the Verilated model fast: a cycle costs
    O(lookahead^2) bank comparisons (FR-FCFS: which older entry uses the bank, which entry still
    hits it) plus the hazard comparisons against every queued address
    (O(read_queue + write_queue)), not O(banks x queue depth) counter and shift-register updates.

    Parameters:
        std: a :class:`DRAMStandard` or preset name.
        read_queue, write_queue: queue depths in bursts (write_queue a power of two).
        write_high, write_low: write-drain watermarks (default 3/4 and 1/4 of write_queue).
        lookahead: queue entries the scheduler chooses from (default 8).
        max_bypass: column commands that may overtake the oldest request before only its
            commands may issue (default 1: measured, the DIMM-NMP's streams keep their
            in-order utilisation, 16 cost the residual add 0.18 points; random traffic wants
            more, see :data:`coda.cosim.dram.bench.RANDOM_CONTROLLER`).
        row_policy: ``"open"`` (default), ``"closed"`` or ``"timeout"``
            (:mod:`coda.hw.dram.rowpolicy`); row_timeout: its cycles (default 64);
            policy_banks: banks it tracks at once (default 4).
        refresh: ``"all"`` (REF every tREFI, :class:`~.refresh.AllBankRefresh`) or
            ``"same_bank"`` (DDR5 REFsb, :class:`~.refresh.SameBankRefresh`).
        refresh_postpone: REFs that may be owed at once while requests are queued, then
            issued back to back (0 .. ``std.refresh_postpone``, JEDEC's limit; default 0: each
            REF as soon as it falls due; 1 behaves as 0), see :mod:`~.refresh`.
        ranks: ranks sharing this controller's channel (1, 2 or 4; default 1; more: only
            ``coda dram replay --ranks``, the DIMM-NMP has one controller per rank): the rank
            bits of the address (:mod:`~.mapping`: between bank and row), a bank state,
            timing table and all-bank refresh manager per rank (rank r's refresh staggered
            r * tREFI / ranks earlier), the data-bus rank switch (tRTRS), ``cmd_rank``.

    Ports (A = std.burst_addr_bits, D = 8 * std.burst_bytes):
        req_valid/req_ready/req_we/req_addr[A]/req_wdata[D]/req_wmask[D/8]: burst requests,
            a transfer is valid & ready (ready may depend on we/addr: hazards).
        rsp_valid/rsp_data[D]: read data, in read-request order, always accepted.
        cmd_kind[3] (:class:`Cmd`), cmd_bg, cmd_ba, cmd_row, cmd_col (device column of the
            first beat), cmd_wdata[D], cmd_wmask[D/8]: the command issued this cycle.
        rd_valid/rd_data[D]: the device's read burst, ``CL + nBL`` cycles after its RD.
        idle: no queued request and no read unanswered.
        stat_<name>[48] for name in :data:`STAT_NAMES`: column commands by kind, row
            hit/miss/conflict per request (classified by the commands its bank needed),
            total read latency (acceptance to data, cycles), cycles since reset, REF (or
            REFsb) commands.

    Raises:
        ValueError: bad queue or policy parameters, or a standard whose same-bank-group
            constraint is shorter than the other-group one (tCCD_L < tCCD_S...; no JEDEC
            preset).
    """

    def __init__(self, std, *, read_queue: int = 16, write_queue: int = 32,
                 write_high: int | None = None, write_low: int | None = None,
                 lookahead: int = 8, max_bypass: int = 1, row_policy: str = "open",
                 row_timeout: int = 64, policy_banks: int = 4,
                 refresh: str = "all", refresh_postpone: int = 0, ranks: int = 1):
        std, write_high, write_low = check_controller(
            std, read_queue=read_queue, write_queue=write_queue, write_high=write_high,
            write_low=write_low, lookahead=lookahead, max_bypass=max_bypass,
            row_policy=row_policy, row_timeout=row_timeout, policy_banks=policy_banks,
            refresh=refresh, refresh_postpone=refresh_postpone, ranks=ranks)
        self.std = std
        self.read_queue, self.write_queue = read_queue, write_queue
        self.write_high, self.write_low, self.lookahead = write_high, write_low, lookahead
        self.max_bypass, self.row_policy, self.row_timeout = max_bypass, row_policy, row_timeout
        self.policy_banks, self.refresh = policy_banks, refresh
        self.refresh_postpone, self.ranks = refresh_postpone, ranks
        self.n_close = check_row_policy(row_policy, row_timeout, policy_banks)
        self.n_look = max(min(lookahead, read_queue), min(lookahead, write_queue))
        # read responses: a tag per read, data parked until every older read is answered
        self.rob_depth = 2 << ceil_log2(read_queue)
        A, D = AddressMapping(std, ranks).addr_bits, 8 * std.burst_bytes
        members = {"cmd_rank": Out(ceil_log2(ranks))} if ranks > 1 else {}
        members |= {
            "req_valid": In(1), "req_ready": Out(1), "req_we": In(1), "req_addr": In(A),
            "req_wdata": In(D), "req_wmask": In(D // 8),
            "rsp_valid": Out(1), "rsp_data": Out(D),
            "cmd_kind": Out(3), "cmd_bg": Out(ceil_log2(std.bank_groups)),
            "cmd_ba": Out(ceil_log2(std.banks_per_group)),
            "cmd_row": Out(ceil_log2(std.rows)), "cmd_col": Out(ceil_log2(std.columns)),
            "cmd_wdata": Out(D), "cmd_wmask": Out(D // 8),
            "rd_valid": In(1), "rd_data": In(D),
            "idle": Out(1),
        }
        for name in STAT_NAMES:
            members[f"stat_{name}"] = Out(STAT_BITS)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        mapping = AddressMapping(self.std, self.ranks)
        cycle = self._cycle_counter(m)
        rq, wq, sched, policy, timing = self._parts(m, mapping)
        refresh = self._refresh(m, rq, wq, sched, timing)
        wmode, raw = self._write_mode(m, rq, wq)
        self._scheduler_inputs(m, mapping, rq, wq, sched, policy, timing, wmode, raw)
        self._refresh_inputs(m, rq, wq, sched, timing, refresh)
        cmd = self._command(m, mapping, rq, wq, sched, policy, timing, refresh, wmode)
        rob_tail, unanswered = self._read_order(m, rq, cmd)
        self._queue_updates(m, mapping, rq, wq, cmd, wmode, cycle, rob_tail, unanswered)
        self._statistics(m, rq, wq, cmd, cycle, unanswered)
        return m

    @staticmethod
    def _cycle_counter(m):
        """The cycle counter: cycles since reset (``stat_cycles``, the requests' stamps)."""
        cycle = Signal(STAT_BITS)           # cycles since reset (stat_cycles, request stamps)
        m.d.sync += cycle.eq(cycle + 1)
        return cycle

    def _parts(self, m, mapping):
        """The read and write queues, the scheduler, the row policy and the timing table."""
        std, NR = self.std, self.ranks
        cstd = channel_banks(std, NR)        # the queues', scheduler's and policy's view
        A, D = mapping.addr_bits, 8 * std.burst_bytes
        n_look = self.n_look
        bank_bits = ceil_log2(cstd.banks)
        tag_bits = ceil_log2(self.rob_depth)
        # the read queue's payload is the request's acceptance cycle (read latency) and its
        # response tag, the write queue's the write data and byte mask
        m.submodules.rq = rq = RequestQueue(self.read_queue, A, bank_bits, look=n_look,
                                            payload_bits=32 + tag_bits)
        m.submodules.wq = wq = RequestQueue(self.write_queue, A, bank_bits, look=n_look,
                                            payload_bits=D + D // 8, match_ports=2)
        m.submodules.scheduler = sched = Scheduler(cstd, n_look, max_bypass=self.max_bypass,
                                                   closes=self.n_close, ranks=NR)
        m.submodules.policy = policy = RowPolicy(cstd, self.row_policy,
                                                 timeout=self.row_timeout,
                                                 candidates=self.policy_banks)
        m.submodules.timing = timing = TimingTable(std, n_look + policy.n_close,
                                                   same_bank=self.refresh == "same_bank",
                                                   ranks=NR)
        return rq, wq, sched, policy, timing

    def _refresh(self, m, rq, wq, sched, timing):
        """The refresh managers: one per rank, else the rank's all-bank or same-bank one."""
        std, NR = self.std, self.ranks
        kind_is_ref = sched.kind == Cmd.REF
        if NR > 1:          # a refresh manager per rank, rank r's first REF r * tREFI / NR early
            refreshers = []
            for r in range(NR):
                rf = AllBankRefresh(std, self.refresh_postpone,
                                    first=std.tREFI - r * (std.tREFI // NR))
                m.submodules[f"refresh{r}"] = rf
                refreshers.append(rf)
                m.d.comb += [rf.issued.eq(kind_is_ref & (sched.ref_rank == r)),
                             rf.any_open.eq(timing.any_open[r]),
                             rf.prea_ok.eq(timing.prea_ok[r]), rf.ref_ok.eq(timing.ref_ok[r]),
                             rf.busy.eq((rq.count != 0) | (wq.count != 0))]
            m.d.comb += [sched.ref_pending.eq(Cat(rf.pending for rf in refreshers)),
                         sched.prea.eq(Cat(rf.prea for rf in refreshers)),
                         sched.ref.eq(Cat(rf.ref for rf in refreshers))]
            return None
        if self.refresh != "same_bank":
            m.submodules.refresh = refresh = AllBankRefresh(std, self.refresh_postpone)
            m.d.comb += refresh.issued.eq(kind_is_ref)
            return refresh
        m.submodules.sb_refresh = sbr = SameBankRefresh(std, self.refresh_postpone)
        m.d.comb += [timing.sb_ba.eq(sbr.ba), timing.sb_pre_bg.eq(sbr.pre_bg),
                     sbr.sb_open.eq(timing.sb_open), sbr.sb_pre_ok.eq(timing.sb_pre_ok),
                     sbr.sb_ok.eq(timing.sb_ok), sbr.issued.eq(sched.kind == Cmd.REFSB),
                     sched.sb_block.eq(sbr.block), sched.sb_ba.eq(sbr.ba),
                     sched.sb_pre.eq(sbr.pre), sched.refsb.eq(sbr.refsb)]
        return sbr

    def _write_mode(self, m, rq, wq):
        """Write mode (the watermarks) and the read-after-write hazard of the oldest read."""
        wmode = Signal()
        raw = Signal()
        m.d.comb += [wq.match_addr[0].eq(rq.look[0].addr),
                     raw.eq(rq.look[0].valid & wq.match[0])]
        with m.If(~wmode):
            with m.If((wq.count >= self.write_high) | ((rq.count == 0) & (wq.count > 0))
                      | raw):
                m.d.sync += wmode.eq(1)
        with m.Else():
            with m.If((wq.count == 0)
                      | ((wq.count <= self.write_low) & (rq.count > 0) & ~raw)):
                m.d.sync += wmode.eq(0)
        return wmode, raw

    @staticmethod
    def _scheduler_inputs(m, mapping, rq, wq, sched, policy, timing, wmode, raw):
        """The scheduler's view: the active queue's first entries, the timing table's rows."""
        for e, r, w in zip(sched.look, rq.look, wq.look):
            f = mapping.fields(Mux(wmode, w.addr, r.addr))
            m.d.comb += [e.valid.eq(Mux(wmode, w.valid, r.valid)),
                         e.flag.eq(Mux(wmode, w.flag, r.flag)),
                         e.bank.eq(Mux(wmode, w.bank, r.bank)), e.bg.eq(f.bg), e.row.eq(f.row)]
        for ask, answer in zip(sched.rows, timing.rows):
            connect(m, ask, answer)
        for want, close in zip(policy.close, sched.close):
            connect(m, want, close)
        m.d.comb += [
            sched.wmode.eq(wmode), sched.raw.eq(raw),
        ]

    def _refresh_inputs(self, m, rq, wq, sched, timing, refresh):
        """The one-rank refresh manager's inputs (idle time, bank state) and its requests."""
        same_bank = self.refresh == "same_bank"
        if self.refresh_postpone >= 2 and self.ranks == 1:   # postponed refresh waits for idle
            busy = (rq.count != 0) | (wq.count != 0)
            m.d.comb += refresh.busy.eq(busy)
        if not same_bank and self.ranks == 1:
            m.d.comb += [
                refresh.any_open.eq(timing.any_open), refresh.prea_ok.eq(timing.prea_ok),
                refresh.ref_ok.eq(timing.ref_ok),
                sched.ref_pending.eq(refresh.pending), sched.prea.eq(refresh.prea),
                sched.ref.eq(refresh.ref),
            ]

    def _command(self, m, mapping, rq, wq, sched, policy, timing, refresh, wmode):
        """The chosen command: its entry's fields, to the device, timing table and policy."""
        std, NR = self.std, self.ranks
        D = 8 * std.burst_bytes
        bank_bits = ceil_log2(channel_banks(std, NR).banks)
        kind, sel = sched.kind, sched.sel
        m.d.comb += [rq.sel.eq(sel), wq.sel.eq(sel)]
        is_act, is_pre = kind == Cmd.ACT, kind == Cmd.PRE
        is_rd, is_wr = kind == Cmd.RD, kind == Cmd.WR
        is_ref = kind.matches(Cmd.REF, Cmd.REFSB)
        entry_pre = is_pre & ~sched.policy_pre & ~sched.refresh_pre
        f = mapping.fields(Mux(wmode, wq.sel_addr, rq.sel_addr))
        bank = Mux(wmode, wq.sel_bank, rq.sel_bank)
        bg, ba, row = Signal.like(f.bg), Signal.like(f.ba), Signal.like(f.row)
        cbank = Signal(bank_bits)
        m.d.comb += [bg.eq(f.bg), ba.eq(f.ba), row.eq(f.row), cbank.eq(bank)]
        for k, c in enumerate(policy.close):
            with m.If(sched.policy_pre & (sched.sel_close == k)):
                m.d.comb += [bg.eq(c.bg), ba.eq(c.bank >> ceil_log2(std.bank_groups)),
                             row.eq(c.row), cbank.eq(c.bank)]
        if self.refresh == "same_bank":     # the same-bank refresh's PRE and REFsb: bank BA
            sbr = refresh                   # (of group pre_bg)
            with m.If(sched.refresh_pre | (kind == Cmd.REFSB)):
                m.d.comb += [bg.eq(Mux(kind == Cmd.REFSB, 0, sbr.pre_bg)), ba.eq(sbr.ba),
                             row.eq(0), cbank.eq(Cat(bg, sbr.ba))]
        rank_lo = ceil_log2(std.banks)
        if NR > 1:          # a PREA/REF names its rank in the flat bank index
            with m.If(kind.matches(Cmd.PREA, Cmd.REF)):
                m.d.comb += cbank.eq(Cat(Const(0, rank_lo), sched.ref_rank))
            m.d.comb += self.cmd_rank.eq(cbank[rank_lo:])
        m.d.comb += [
            self.cmd_kind.eq(kind), self.cmd_bg.eq(bg), self.cmd_ba.eq(ba),
            self.cmd_row.eq(row), self.cmd_col.eq(f.col << ceil_log2(std.burst_length)),
            self.cmd_wdata.eq(wq.sel_payload[:D]), self.cmd_wmask.eq(wq.sel_payload[D:]),
            timing.issue.kind.eq(kind), timing.issue.bank.eq(cbank),
            timing.issue.bg.eq(bg), timing.issue.row.eq(row),
            policy.issue.kind.eq(kind), policy.issue.bank.eq(cbank),
            policy.issue.bg.eq(bg), policy.issue.row.eq(row),
        ]
        return SimpleNamespace(is_act=is_act, is_rd=is_rd, is_wr=is_wr, is_ref=is_ref,
                               entry_pre=entry_pre)

    def _read_order(self, m, rq, cmd):
        """The read responses in request order: tags, the tag FIFO, the reorder buffer."""
        std = self.std
        D = 8 * std.burst_bytes
        R = self.rob_depth
        tag_bits = ceil_log2(R)
        # each read takes the next tag at acceptance; RDs (any order) send their tags through
        # a FIFO that the device's bursts (in RD order) pop; data waits in a tag-indexed
        # buffer until every older read has been answered
        rob_tail, rob_head = Signal(tag_bits + 1), Signal(tag_bits + 1)
        unanswered = Signal(tag_bits + 1)
        m.d.comb += unanswered.eq(rob_tail - rob_head)
        m.submodules.tags = tags = SyncFIFO(width=tag_bits,
                                            depth=std.read_latency // std.tCCD_S + 2)
        m.d.comb += [tags.w_en.eq(cmd.is_rd), tags.w_data.eq(rq.sel_payload[32:]),
                     tags.r_en.eq(self.rd_valid)]
        m.submodules.rob = rob = Memory(shape=unsigned(D), depth=R, init=[])
        rob_w = rob.write_port()
        rob_r = rob.read_port(domain="comb")
        ready = Signal(R)
        arrive_tag = tags.r_data
        head_tag = rob_head[:tag_bits]
        bypass = self.rd_valid & (arrive_tag == head_tag)
        deliver = bypass | ready.bit_select(head_tag, 1)
        m.d.comb += [rob_w.addr.eq(arrive_tag), rob_w.data.eq(self.rd_data),
                     rob_w.en.eq(self.rd_valid & ~bypass), rob_r.addr.eq(head_tag),
                     self.rsp_valid.eq(deliver),
                     self.rsp_data.eq(Mux(bypass, self.rd_data, rob_r.data))]
        one = Const(1, R)
        set_ready = Mux(self.rd_valid & ~bypass, (one << arrive_tag)[:R], 0)
        clr_ready = Mux(deliver, (one << head_tag)[:R], 0)
        m.d.sync += [ready.eq((ready | set_ready) & ~clr_ready),
                     rob_head.eq(rob_head + deliver)]
        return rob_tail, unanswered

    def _queue_updates(self, m, mapping, rq, wq, cmd, wmode, cycle, rob_tail, unanswered):
        """The queues' pushes (with the ordering hazards), pops and bank-state marks."""
        RQ, WQ, R = self.read_queue, self.write_queue, self.rob_depth
        tag_bits = ceil_log2(R)
        # Hazards: a write to the address of a queued read waits until that read has issued
        # (write-after-read); a read (write) whose address a queued write has is flagged: it
        # issues only as the oldest entry of its queue
        push = self.req_valid & self.req_ready
        m.d.comb += [rq.match_addr[0].eq(self.req_addr), wq.match_addr[1].eq(self.req_addr),
                     self.req_ready.eq(Mux(self.req_we, (wq.count < WQ) & ~rq.match[0],
                                           (rq.count < RQ) & (unanswered < R)))]
        m.d.sync += rob_tail.eq(rob_tail + (push & ~self.req_we))
        req_bank = mapping.fields(self.req_addr).bank
        for q, pop, push_q, active, payload in (
                (rq, cmd.is_rd, push & ~self.req_we, ~wmode,
                 Cat(cycle[:32], rob_tail[:tag_bits])),
                (wq, cmd.is_wr, push & self.req_we, wmode, Cat(self.req_wdata, self.req_wmask))):
            m.d.comb += [q.push.eq(push_q), q.push_addr.eq(self.req_addr),
                         q.push_bank.eq(req_bank), q.push_flag.eq(wq.match[1]),
                         q.push_payload.eq(payload), q.done.eq(pop),
                         q.mark_act.eq(cmd.is_act & active),
                         q.mark_pre.eq(cmd.entry_pre & active)]

    def _statistics(self, m, rq, wq, cmd, cycle, unanswered):
        """``idle`` and the statistics counters (``stat_*``)."""
        m.d.comb += self.idle.eq((rq.count == 0) & (wq.count == 0) & (unanswered == 0))
        stats = {n: Signal(STAT_BITS, name=f"st_{n}") for n in STAT_NAMES}
        is_rd, is_wr = cmd.is_rd, cmd.is_wr
        sel_act = Mux(is_rd, rq.sel_act, wq.sel_act)
        sel_pre = Mux(is_rd, rq.sel_pre, wq.sel_pre)
        col = is_rd | is_wr
        m.d.sync += [
            stats["reads"].eq(stats["reads"] + is_rd),
            stats["writes"].eq(stats["writes"] + is_wr),
            stats["row_hits"].eq(stats["row_hits"] + (col & ~sel_act & ~sel_pre)),
            stats["row_misses"].eq(stats["row_misses"] + (col & sel_act & ~sel_pre)),
            stats["row_conflicts"].eq(stats["row_conflicts"] + (col & sel_pre)),
            stats["refreshes"].eq(stats["refreshes"] + cmd.is_ref),
        ]
        with m.If(is_rd):
            m.d.sync += stats["read_latency"].eq(
                stats["read_latency"] + (cycle[:32] - rq.sel_payload[:32])[:32]
                + self.std.read_latency)
        m.d.comb += stats["cycles"].eq(cycle)
        for n in STAT_NAMES:
            m.d.comb += getattr(self, f"stat_{n}").eq(stats[n])


def dram_verilog(component: wiring.Component, name: str) -> str:
    """Verilog text of a DRAM component (:class:`DRAMController`,
    :class:`~.word_memory.DRAMWordMemory`)
    as module ``name`` with ports ``clk``, ``rst`` and the component's flat members.

    Raises:
        ValueError: ``name`` is not a Verilog identifier. FileNotFoundError: no yosys.
    """
    from coda.hw.yosys import component_verilog

    return component_verilog(component, name)
