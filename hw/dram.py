"""Rank-local DRAM memory controller in Amaranth: the DRAM timing model of the DIMM-NMP.

One :class:`DRAMController` drives one rank (see :mod:`coda.hw.dram_standards` for what a
rank is per standard). It runs on the DRAM command clock (one cycle = one tCK) and issues at
most one command per cycle. As in Ramulator 2, the controller is a frame around plug-in parts
with small interfaces, each a component in its own file:

==========================================  ===================================================
part                                        what it does
==========================================  ===================================================
:class:`~.dram_mapping.AddressMapping`      burst address -> bank group, bank, row, column
                                            (bank groups rotate fastest, permutation-based
                                            bank interleaving)
:class:`~.dram_queue.RequestQueue`          the read and the write queue (circular buffers in
                                            RAMs, a hazard comparison port)
:class:`~.dram_scheduler.Scheduler`         the command of this cycle: refresh, then the
                                            head's column command, then the oldest allowed
                                            ACT/PRE within ``lookahead`` entries
:class:`~.dram_refresh.AllBankRefresh`      a REF every tREFI, after a PREA closes the banks
:class:`~.dram_timing.TimingTable`          open rows and every JEDEC constraint as
                                            timestamps: what may issue now, updated by what
                                            issued
==========================================  ===================================================

The controller itself keeps the policy that joins them: open-page; separate read and write
queues, each issued *in order* for column commands (so read responses return in request
order, no reorder buffer); writes buffered and drained in batches (write mode from
``write_high`` queued writes down to ``write_low``, or whenever no read waits); a read whose
address has a queued write drains the writes first (read-after-write), and a write whose
address matches a queued read is not accepted until that read has issued (write-after-read).
It also counts the statistics. The command stream obeys the standard cycle by cycle *by
construction* (the timing table); :mod:`coda.cosim.dram_check` verifies it independently from
the command log.

A cycle reads the bank state only of the entries the scheduler looks at and writes only what
the issued command changes, which keeps the Verilated model fast: a cycle costs
O(lookahead^2) bank comparisons plus the hazard comparisons against every queued address
(O(read_queue + write_queue)), not O(banks x queue depth) counter and shift-register updates.

Known simplifications: DDR5's two-cycle ACT/RD/WR command encoding and LPDDR5's
WCK-sync and two-part ACT are modelled as one command slot per tCK; no power-down; no
per-bank refresh.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out, connect
from amaranth.utils import ceil_log2

from .dram_mapping import AddressMapping
from .dram_queue import RequestQueue
from .dram_refresh import AllBankRefresh
from .dram_scheduler import Scheduler
from .dram_standards import get_standard
from .dram_timing import Cmd, TimingTable

__all__ = ["Cmd", "DRAMController", "WordAdapter", "DRAMWordMemory", "dram_verilog",
           "STAT_NAMES", "STAT_BITS", "NME_ADDR_BITS"]

NME_ADDR_BITS = 24  # coda.hw.isa.ADDR_BITS: the NME's word address width

# Statistics outputs of the controller, each ``stat_<name>``, 48 bits.
STAT_NAMES = ("reads", "writes", "row_hits", "row_misses", "row_conflicts", "read_latency",
              "cycles", "refreshes")
STAT_BITS = 48


class DRAMController(wiring.Component):
    """In-order-with-lookahead, open-page controller of one DRAM rank (one clock = one tCK).

    Parameters:
        std: a :class:`DRAMStandard` or preset name.
        read_queue, write_queue: queue depths in bursts (write_queue a power of two).
        write_high, write_low: write-drain watermarks (default 3/4 and 1/4 of write_queue).
        lookahead: queue entries considered for ACT/PRE (default 8).

    Ports (A = std.burst_addr_bits, D = 8 * std.burst_bytes):
        req_valid/req_ready/req_we/req_addr[A]/req_wdata[D]/req_wmask[D/8]: burst requests,
            a transfer is valid & ready (ready may depend on we/addr: hazards).
        rsp_valid/rsp_data[D]: read data, in read-request order, always accepted.
        cmd_kind[3] (:class:`Cmd`), cmd_bg, cmd_ba, cmd_row, cmd_col (device column of the
            first beat), cmd_wdata[D], cmd_wmask[D/8]: the command issued this cycle.
        rd_valid/rd_data[D]: the device's read burst, ``CL + nBL`` cycles after its RD.
        idle: no queued request and no read in flight.
        stat_<name>[48] for name in :data:`STAT_NAMES`: column commands by kind, row
            hit/miss/conflict per request (classified by the commands its bank needed),
            total read latency (acceptance to response, cycles), cycles since reset, REFs.

    Raises:
        ValueError: bad queue parameters, or a standard whose same-bank-group constraint is
            shorter than the other-group one (tCCD_L < tCCD_S...; no JEDEC preset).
    """

    def __init__(self, std, *, read_queue: int = 16, write_queue: int = 32,
                 write_high: int | None = None, write_low: int | None = None,
                 lookahead: int = 8):
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
        self.std = std
        self.read_queue, self.write_queue = read_queue, write_queue
        self.write_high, self.write_low, self.lookahead = write_high, write_low, lookahead
        A, D = std.burst_addr_bits, 8 * std.burst_bytes
        members = {
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
        std = self.std
        m = Module()
        A, D = std.burst_addr_bits, 8 * std.burst_bytes
        RQ, WQ, L = self.read_queue, self.write_queue, self.lookahead
        n_look = max(min(L, RQ), min(L, WQ))
        mapping = AddressMapping(std)
        bank_bits = ceil_log2(std.banks)

        cycle = Signal(STAT_BITS)           # cycles since reset (stat_cycles, request stamps)
        m.d.sync += cycle.eq(cycle + 1)

        # the read queue's payload is the request's acceptance cycle (read latency), the
        # write queue's the write data and byte mask
        m.submodules.rq = rq = RequestQueue(RQ, A, bank_bits, look=n_look, payload_bits=32)
        m.submodules.wq = wq = RequestQueue(WQ, A, bank_bits, look=n_look,
                                            payload_bits=D + D // 8)
        m.submodules.timing = timing = TimingTable(std, n_look)
        m.submodules.scheduler = sched = Scheduler(std, n_look)
        m.submodules.refresh = refresh = AllBankRefresh(std)

        # ---- write mode and the read-after-write hazard (the head read vs queued writes)
        wmode = Signal()
        raw = Signal()
        m.d.comb += [wq.match_addr.eq(rq.look[0].addr), raw.eq(rq.look[0].valid & wq.match)]
        with m.If(~wmode):
            with m.If((wq.count >= self.write_high) | ((rq.count == 0) & (wq.count > 0))
                      | raw):
                m.d.sync += wmode.eq(1)
        with m.Else():
            with m.If((wq.count == 0)
                      | ((wq.count <= self.write_low) & (rq.count > 0) & ~raw)):
                m.d.sync += wmode.eq(0)

        # ---- the scheduler sees the active queue's first entries, asks the timing table
        for e, r, w in zip(sched.look, rq.look, wq.look):
            f = mapping.fields(Mux(wmode, w.addr, r.addr))
            m.d.comb += [e.valid.eq(Mux(wmode, w.valid, r.valid)),
                         e.bank.eq(Mux(wmode, w.bank, r.bank)), e.bg.eq(f.bg), e.row.eq(f.row)]
        for ask, answer in zip(sched.rows, timing.rows):
            connect(m, ask, answer)
        connect(m, sched.col, timing.col)
        m.d.comb += [
            sched.wmode.eq(wmode), sched.raw.eq(raw),
            refresh.any_open.eq(timing.any_open), refresh.prea_ok.eq(timing.prea_ok),
            refresh.ref_ok.eq(timing.ref_ok),
            sched.ref_pending.eq(refresh.pending), sched.prea.eq(refresh.prea),
            sched.ref.eq(refresh.ref),
        ]

        # ---- the chosen command: its entry's fields, to the device and the timing table
        kind, sel = sched.kind, sched.sel
        m.d.comb += [rq.sel.eq(sel), wq.sel.eq(sel)]
        sel_entry = Mux(kind.matches(Cmd.PREA, Cmd.REF), 0,
                        Mux(wmode, Cat(wq.sel_addr, wq.sel_bank), Cat(rq.sel_addr, rq.sel_bank)))
        f = mapping.fields(sel_entry[:A])
        bank = sel_entry[A:]
        is_act, is_pre = kind == Cmd.ACT, kind == Cmd.PRE
        is_rd, is_wr = kind == Cmd.RD, kind == Cmd.WR
        is_ref = kind == Cmd.REF
        m.d.comb += [
            self.cmd_kind.eq(kind), self.cmd_bg.eq(f.bg), self.cmd_ba.eq(f.ba),
            self.cmd_row.eq(f.row), self.cmd_col.eq(f.col << ceil_log2(std.burst_length)),
            self.cmd_wdata.eq(wq.head_payload[:D]), self.cmd_wmask.eq(wq.head_payload[D:]),
            timing.issue.kind.eq(kind), timing.issue.bank.eq(bank),
            timing.issue.bg.eq(f.bg), timing.issue.row.eq(f.row),
            refresh.issued.eq(is_ref),
        ]

        # ---- queue updates; a write to the address of a queued read waits (write-after-read)
        push = self.req_valid & self.req_ready
        m.d.comb += [rq.match_addr.eq(self.req_addr),
                     self.req_ready.eq(Mux(self.req_we, (wq.count < WQ) & ~rq.match,
                                           rq.count < RQ))]
        req_bank = mapping.fields(self.req_addr).bank
        for q, pop, push_q, active, payload in (
                (rq, is_rd, push & ~self.req_we, ~wmode, cycle[:32]),
                (wq, is_wr, push & self.req_we, wmode, Cat(self.req_wdata, self.req_wmask))):
            m.d.comb += [q.push.eq(push_q), q.push_addr.eq(self.req_addr),
                         q.push_bank.eq(req_bank), q.push_payload.eq(payload), q.pop.eq(pop),
                         q.mark_act.eq(is_act & active), q.mark_pre.eq(is_pre & active)]

        # ---- responses, idle, statistics
        inflight = Signal(range(64))
        m.d.sync += inflight.eq(inflight + is_rd - self.rd_valid)
        m.d.comb += [self.rsp_valid.eq(self.rd_valid), self.rsp_data.eq(self.rd_data),
                     self.idle.eq((rq.count == 0) & (wq.count == 0) & (inflight == 0))]
        stats = {n: Signal(STAT_BITS, name=f"st_{n}") for n in STAT_NAMES}
        head_act = Mux(is_rd, rq.head_act, wq.head_act)
        head_pre = Mux(is_rd, rq.head_pre, wq.head_pre)
        col = is_rd | is_wr
        m.d.sync += [
            stats["reads"].eq(stats["reads"] + is_rd),
            stats["writes"].eq(stats["writes"] + is_wr),
            stats["row_hits"].eq(stats["row_hits"] + (col & ~head_act & ~head_pre)),
            stats["row_misses"].eq(stats["row_misses"] + (col & head_act & ~head_pre)),
            stats["row_conflicts"].eq(stats["row_conflicts"] + (col & head_pre)),
            stats["refreshes"].eq(stats["refreshes"] + is_ref),
        ]
        with m.If(is_rd):
            m.d.sync += stats["read_latency"].eq(
                stats["read_latency"] + (cycle[:32] - rq.head_payload)[:32] + std.read_latency)
        m.d.comb += stats["cycles"].eq(cycle)
        for n in STAT_NAMES:
            m.d.comb += getattr(self, f"stat_{n}").eq(stats[n])
        return m


class WordAdapter(wiring.Component):
    """Between the NME's word port and a controller's burst port.

    Words are ``16 * lanes`` bits (``2 * lanes`` bytes) at word addresses; word ``w`` is at
    byte ``w * 2 * lanes`` of the rank. ``2 * lanes`` must divide ``burst_bytes`` or be a
    multiple of it (lanes a power of two for 64-byte bursts).

    Word <= burst: a read whose burst is the one the previous read fetched (and no write to
    it came between) is served from the line buffer without a new burst read; writes merge
    into one pending burst with a byte mask, flushed when a write leaves that burst, a read
    touches it, or a cycle passes without a request. Word > burst: each word is
    ``2*lanes/burst_bytes`` consecutive bursts, read and reassembled in order.

    NME side (contract of :mod:`coda.hw.nme`): ``mem_req_valid``, ``mem_req_ready``,
    ``mem_req_we``, ``mem_req_addr[24]``, ``mem_req_wdata[16L]``, ``mem_req_wmask[L]``
    (per-element write enable), ``mem_rsp_valid``, ``mem_rsp_data[16L]`` (in order, always
    accepted). Burst side: ``bus_req_*`` / ``bus_rsp_*`` matching :class:`DRAMController`'s
    ``req_*`` / ``rsp_*``. ``idle``: nothing pending or in flight here.

    Raises:
        ValueError: lanes out of 1..64 or word size incompatible with the burst size.
    """

    def __init__(self, lanes: int, burst_bytes: int, burst_addr_bits: int, *,
                 max_bursts_in_flight: int = 8, max_words_in_flight: int = 32):
        if not 1 <= lanes <= 64:
            raise ValueError(f"lanes={lanes}: expected 1..64")
        word_bytes = 2 * lanes
        if burst_bytes % word_bytes and word_bytes % burst_bytes:
            raise ValueError(f"lanes={lanes}: a {word_bytes}-byte word must divide or be a "
                             f"multiple of the {burst_bytes}-byte burst")
        self.lanes, self.word_bytes, self.burst_bytes = lanes, word_bytes, burst_bytes
        self.words_per_burst = max(1, burst_bytes // word_bytes)
        self.bursts_per_word = max(1, word_bytes // burst_bytes)
        if (self.words_per_burst & (self.words_per_burst - 1)
                or self.bursts_per_word & (self.bursts_per_word - 1)):
            raise ValueError(f"lanes={lanes}: words per burst must be a power of two")
        self.max_bursts, self.max_words = max_bursts_in_flight, max_words_in_flight
        D = 8 * burst_bytes
        super().__init__({
            "mem_req_valid": In(1), "mem_req_ready": Out(1), "mem_req_we": In(1),
            "mem_req_addr": In(NME_ADDR_BITS), "mem_req_wdata": In(16 * lanes),
            "mem_req_wmask": In(lanes),
            "mem_rsp_valid": Out(1), "mem_rsp_data": Out(16 * lanes),
            "bus_req_valid": Out(1), "bus_req_ready": In(1), "bus_req_we": Out(1),
            "bus_req_addr": Out(burst_addr_bits), "bus_req_wdata": Out(D),
            "bus_req_wmask": Out(D // 8),
            "bus_rsp_valid": In(1), "bus_rsp_data": In(D),
            "idle": Out(1),
        })

    def _byte_mask(self, wmask):
        return Cat(Cat(b, b) for b in wmask)

    def elaborate(self, platform):
        if self.bursts_per_word > 1:
            return self._elaborate_wide()
        return self._elaborate_narrow()

    def _elaborate_narrow(self):
        m = Module()
        W, wpb, D = self.word_bytes, self.words_per_burst, 8 * self.burst_bytes
        ob = ceil_log2(wpb)
        tag = self.mem_req_addr[ob:]
        off = self.mem_req_addr[:ob] if ob else Const(0, 1)

        # pending write burst
        p_valid, p_tag = Signal(), Signal(len(self.bus_req_addr))
        p_data, p_mask = Signal(D), Signal(D // 8)
        # read line reuse
        r_valid, r_tag = Signal(), Signal(len(self.bus_req_addr))
        m.submodules.order = order = SyncFIFO(width=1 + max(ob, 1), depth=self.max_words)
        m.submodules.bursts = bursts = SyncFIFO(width=D, depth=self.max_bursts)
        outstanding = Signal(range(self.max_bursts + 1))

        req = self.mem_req_valid
        is_w, is_r = req & self.mem_req_we, req & ~self.mem_req_we
        same_p = p_valid & (p_tag == tag)
        reuse = r_valid & (r_tag == tag)
        flush = Signal()      # send the pending write burst this cycle
        rd_burst = Signal()   # send a read burst for this request this cycle
        accept = Signal()
        m.d.comb += [
            flush.eq(p_valid & (~req | (is_w & ~same_p) | (is_r & same_p))),
            rd_burst.eq(is_r & ~same_p & ~reuse & order.w_rdy
                        & (outstanding < self.max_bursts)),
            self.bus_req_valid.eq(flush | rd_burst),
            self.bus_req_we.eq(flush),
            self.bus_req_addr.eq(Mux(flush, p_tag, tag)),
            self.bus_req_wdata.eq(p_data), self.bus_req_wmask.eq(p_mask),
        ]
        sent = self.bus_req_valid & self.bus_req_ready
        m.d.comb += accept.eq(
            (is_w & (same_p | ~p_valid | sent))
            | (is_r & ~same_p & order.w_rdy
               & (reuse | (rd_burst & self.bus_req_ready))))
        m.d.comb += self.mem_req_ready.eq(accept)

        # write merging: a new burst starts from this word only, a same-burst word merges
        bmask = self._byte_mask(self.mem_req_wmask)
        with m.If(flush & sent):
            m.d.sync += [p_valid.eq(0), p_mask.eq(0)]
        with m.If(accept & is_w):
            m.d.sync += [p_valid.eq(1), p_tag.eq(tag)]
            base_mask = Mux(same_p, p_mask, 0)
            for o in range(wpb):
                with m.If(off == o):
                    for j in range(self.lanes):
                        lo = o * W * 8 + 16 * j
                        with m.If(self.mem_req_wmask[j]):
                            m.d.sync += p_data[lo:lo + 16].eq(self.mem_req_wdata[16 * j:16 * j + 16])
                    m.d.sync += p_mask.eq(base_mask | (bmask << (o * W)))
            with m.If(r_tag == tag):
                m.d.sync += r_valid.eq(0)
        with m.If(accept & is_r):
            m.d.sync += [r_valid.eq(1), r_tag.eq(tag)]

        # responses: order FIFO says whether the next word needs a fresh burst
        m.d.comb += [order.w_en.eq(accept & is_r),
                     order.w_data.eq(Cat(off, ~reuse)),
                     bursts.w_en.eq(self.bus_rsp_valid), bursts.w_data.eq(self.bus_rsp_data)]
        line = Signal(D)
        h_off = order.r_data[:max(ob, 1)]
        h_new = order.r_data[max(ob, 1)]
        go = order.r_rdy & (~h_new | bursts.r_rdy)
        src = Mux(h_new, bursts.r_data, line)
        words = Array(src[o * W * 8:(o + 1) * W * 8] for o in range(wpb))
        m.d.comb += [order.r_en.eq(go), bursts.r_en.eq(go & h_new)]
        m.d.sync += [self.mem_rsp_valid.eq(go),
                     self.mem_rsp_data.eq(words[h_off] if wpb > 1 else src)]
        with m.If(go & h_new):
            m.d.sync += line.eq(bursts.r_data)
        m.d.sync += outstanding.eq(outstanding + (rd_burst & self.bus_req_ready) - (go & h_new))
        m.d.comb += self.idle.eq(~p_valid & ~order.r_rdy & (outstanding == 0) & ~self.mem_rsp_valid)
        return m

    def _elaborate_wide(self):
        m = Module()
        k = self.bursts_per_word
        D = 8 * self.burst_bytes
        part = Signal(range(k))
        base = Cat(Const(0, ceil_log2(k)), self.mem_req_addr)
        bmask = self._byte_mask(self.mem_req_wmask)
        parts_d = Array(self.mem_req_wdata[i * D:(i + 1) * D] for i in range(k))
        parts_m = Array(bmask[i * D // 8:(i + 1) * D // 8] for i in range(k))
        inflight = Signal(range(self.max_bursts + 1))
        can = self.mem_req_we | (inflight < self.max_bursts)
        m.d.comb += [
            self.bus_req_valid.eq(self.mem_req_valid & can),
            self.bus_req_we.eq(self.mem_req_we),
            self.bus_req_addr.eq(base | part),
            self.bus_req_wdata.eq(parts_d[part]), self.bus_req_wmask.eq(parts_m[part]),
        ]
        sent = self.bus_req_valid & self.bus_req_ready
        last = part == k - 1
        m.d.comb += self.mem_req_ready.eq(sent & last)
        with m.If(sent):
            m.d.sync += part.eq(Mux(last, 0, part + 1))
        # reassembly: bursts arrive in order, lowest part first
        got = Signal(range(k))
        acc = Signal(16 * self.lanes)
        m.d.sync += self.mem_rsp_valid.eq(0)
        with m.If(self.bus_rsp_valid):
            m.d.sync += acc.eq(Cat(acc[D:], self.bus_rsp_data))
            m.d.sync += got.eq(Mux(got == k - 1, 0, got + 1))
            with m.If(got == k - 1):
                m.d.sync += [self.mem_rsp_valid.eq(1),
                             self.mem_rsp_data.eq(Cat(acc[D:], self.bus_rsp_data))]
        m.d.sync += inflight.eq(inflight + (sent & ~self.mem_req_we) - self.bus_rsp_valid)
        m.d.comb += self.idle.eq((inflight == 0) & (part == 0) & ~self.mem_rsp_valid)
        return m


class DRAMWordMemory(wiring.Component):
    """An NME's rank memory: :class:`WordAdapter` + :class:`DRAMController` in one module.

    Ports: the NME side of :class:`WordAdapter` (``mem_req_*``, ``mem_rsp_*``), the DRAM
    side of :class:`DRAMController` (``cmd_*``, ``rd_valid``, ``rd_data``), ``idle`` (adapter
    and controller both idle: every write is in the device) and ``stat_*``.
    """

    def __init__(self, std, lanes: int, **controller_kw):
        self.std = get_standard(std)
        self.ctrl = DRAMController(self.std, **controller_kw)
        self.adapter = WordAdapter(lanes, self.std.burst_bytes, self.std.burst_addr_bits)
        members = {}
        for name, member in self.adapter.signature.members.items():
            if name.startswith("mem_"):
                members[name] = member
        for name, member in self.ctrl.signature.members.items():
            if name.startswith(("cmd_", "rd_", "stat_")):
                members[name] = member
        members["idle"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.adapter = a = self.adapter
        m.submodules.ctrl = c = self.ctrl
        for name in self.signature.members:
            if name.startswith("mem_req_") and name != "mem_req_ready":
                m.d.comb += getattr(a, name).eq(getattr(self, name))
            elif name in ("mem_req_ready", "mem_rsp_valid", "mem_rsp_data"):
                m.d.comb += getattr(self, name).eq(getattr(a, name))
            elif name.startswith(("cmd_", "stat_")):
                m.d.comb += getattr(self, name).eq(getattr(c, name))
            elif name.startswith("rd_"):
                m.d.comb += getattr(c, name).eq(getattr(self, name))
        m.d.comb += [
            c.req_valid.eq(a.bus_req_valid), a.bus_req_ready.eq(c.req_ready),
            c.req_we.eq(a.bus_req_we), c.req_addr.eq(a.bus_req_addr),
            c.req_wdata.eq(a.bus_req_wdata), c.req_wmask.eq(a.bus_req_wmask),
            a.bus_rsp_valid.eq(c.rsp_valid), a.bus_rsp_data.eq(c.rsp_data),
            self.idle.eq(a.idle & c.idle),
        ]
        return m


def dram_verilog(component: wiring.Component, name: str) -> str:
    """Verilog text of a DRAM component (:class:`DRAMController`, :class:`DRAMWordMemory`)
    as module ``name`` with ports ``clk``, ``rst`` and the component's flat members.

    Raises:
        ValueError: ``name`` is not a Verilog identifier. FileNotFoundError: no yosys.
    """
    from amaranth.back import verilog

    from .yosys import use_pinned_yosys

    if not name.isidentifier():
        raise ValueError(f"name={name!r}: expected a Verilog identifier")
    use_pinned_yosys()
    return verilog.convert(component, name=name, emit_src=False)
