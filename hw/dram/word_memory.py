"""The NME's word port on a rank's DRAM: :class:`WordAdapter` (NME words into the
controller's bursts: write merging, read-line reuse, wide words as consecutive bursts) and
:class:`DRAMWordMemory`, an NME's rank memory (the adapter in front of a
:class:`~.controller.DRAMController`, one module with the NME's memory port on one side and
the DRAM command / read-data ports on the other). :mod:`coda.hw.nmp` puts one per rank.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from coda.hw.dram.controller import DRAMController
from coda.hw.dram.standards import get_standard

__all__ = ["WordAdapter", "DRAMWordMemory", "NME_ADDR_BITS"]

NME_ADDR_BITS = 24  # coda.hw.nme.isa.ADDR_BITS: the NME's word address width

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

    NME side (contract of :mod:`coda.hw.nme.top`): ``mem_req_valid``, ``mem_req_ready``,
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
