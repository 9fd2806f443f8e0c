"""The NME's issue side: read requests ahead of execution, read responses, the memory port.

:class:`NMEIssue` walks (block, micro-op) like execution does and sends the read requests of
every pass whose R operand comes from memory up to ``max(depth, 3) + result_stage`` words ahead
of execution (:func:`coda.hw.nme.iface.read_credits`), so memory latency is paid about once per
block rather than once per pass. Memory order is program order where it matters: it holds at a
store pass until execution has sent its last store, unless the program's stores may trail
(:func:`coda.hw.nme.check.stores_may_trail`). It also owns the memory request register (stores
first) and the tag FIFO that joins each read's response; :class:`NMEIssue` has the walk, the
stream phase records and the reset behaviour.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from coda.hw.nme.isa import ADDR_BITS, PARAM_BITS, NMEConfig, RSrc
from coda.hw.nme.iface import (PASS_BITS, TAG_BITS, UOP_INDEX_BITS, PhaseInit, UopFields, UopRead,
                        read_credits, response_signature, store_signature)

__all__ = ["NMEIssue"]

#: Bits of a phase record: next read address, CHAN/GROUP phase, GROUP element lane, and the
#: next reading micro-op (its index, and whether it is in the next block).
_SLOT_BITS = ADDR_BITS + PARAM_BITS + 6 + UOP_INDEX_BITS + 1


class NMEIssue(wiring.Component):
    """Read issue, response FIFO and memory request register of one NME.

    The issue FSM (``issue``) walks (block, micro-op) like execution does and sends the read
    requests of every pass whose R operand comes from memory, up to ``max(depth, 3) +
    result_stage`` words ahead of execution (:func:`coda.hw.nme.iface.read_credits`: the entries
    of the read-response FIFO), so memory latency is paid about once per block rather than once
    per pass. Like execution it reads the next micro-op (and its stream phase record) while a
    pass runs, and a read pass over a block of at least 3 words hands over to it as its last read
    goes out, so back-to-back read passes send one read per cycle; any other pass takes 4 cycles
    (I_RUN, I_END, I_FETCH, I_LOAD). Each read carries a tag (INT8 half, GROUP element lane)
    through a tag FIFO that joins the response.

    Memory order is program order where it matters: the issue side does not pass a store pass
    until execution has sent its last store (execution's pass counter), unless the program's
    stores may trail (``trail``, :func:`coda.hw.nme.check.stores_may_trail`: no later block's read
    can meet an earlier block's store). Then the walk visits only the micro-ops that read memory
    (each one's phase record names the next one, and whether it is in the next block), so the
    next block's reads go out while the stores trail, and read passes hand over to each other
    across the passes without reads and across blocks.

    Stream phases: each instruction slot has a phase record (next request address, CHAN/GROUP
    counter, GROUP element lane, the next reading micro-op), initialised by the check and carried
    by the issue side from one block's pass to the next, so no division happens at run time.

    The memory request register takes the store at the head of execution's store stream or else
    a read of the issue side (stores first: a store pass then never waits for the memory port,
    and reads go out in the cycles between its stores). Reads in flight survive a reset (the
    memory still answers them): a reset-less counter tracks them, their responses find no tag
    and are dropped, and a program's first read waits until none is outstanding.

    Parameters:
        cfg: :class:`coda.hw.nme.isa.NMEConfig` (lanes, depth, imem_depth).

    Members (L = ``cfg.lanes``):
        start: In(1): the program was accepted (the walk starts in the next cycle).
        trail: In(1): with ``start``: the program's stores may trail later reads.
        n_uops: In(8), n_words: In(32): the program's micro-ops and words.
        uop: Out(:data:`coda.hw.nme.iface.UopRead`): the instruction memory's read port.
        phase_init: In(:data:`coda.hw.nme.iface.PhaseInit`): the check's phase records.
        x_passes: In(11): passes execution has completed (mod 2**11).
        store: In(stream.Signature(store_layout(L))): execution's store words; taken when
            the request register is free (reads wait for them).
        store_done: Out(1): a store request transferred to the memory this cycle.
        rsp: Out(stream.Signature(response_layout(L))): read responses of this program, in
            order, with their tags.
        mem_req_valid: Out(1), mem_req_ready: In(1), mem_req_we: Out(1), mem_req_addr:
            Out(24), mem_req_wdata: Out(16*L), mem_req_wmask: Out(L): the NME's memory
            request port (:class:`coda.hw.nme.top.NME`); valid is a register output.
        mem_rsp_valid: In(1), mem_rsp_data: In(16*L): read data, one per read, in order.
    """

    def __init__(self, cfg: NMEConfig):
        self.cfg = cfg
        L = cfg.lanes
        super().__init__({
            "start": In(1), "trail": In(1), "n_uops": In(UOP_INDEX_BITS), "n_words": In(32),
            "uop": Out(UopRead), "phase_init": In(PhaseInit), "x_passes": In(PASS_BITS),
            "store": In(store_signature(L)), "store_done": Out(1),
            "rsp": Out(response_signature(L)),
            "mem_req_valid": Out(1), "mem_req_ready": In(1), "mem_req_we": Out(1),
            "mem_req_addr": Out(ADDR_BITS), "mem_req_wdata": Out(16 * L),
            "mem_req_wmask": Out(L),
            "mem_rsp_valid": In(1), "mem_rsp_data": In(16 * L),
        })

    def elaborate(self, platform):
        m = Module()
        slot_w, slot_r, rsp_fifo, tag_fifo = self._storage(m)
        w = self._walk_registers(m, slot_w, slot_r)
        wb = self._record_writes(m, slot_w)
        req = self._request_register(m)
        outstanding = self._responses(m, req, rsp_fifo, tag_fifo)
        issue_read, advanced = self._read_issue(m, w, req, tag_fifo)
        self._request_select(m, w, req, issue_read)
        self._walk(m, w, wb, slot_w, slot_r, issue_read, advanced, outstanding)
        return m

    def _storage(self, m):
        """The stream phase records (a RAM, one slot per micro-op), the response and tag FIFOs."""
        L, IM = self.cfg.lanes, self.cfg.imem_depth
        RF = read_credits(self.cfg)
        m.submodules.slots = slots = Memory(shape=_SLOT_BITS, depth=IM, init=[])
        slot_ports = slots.write_port(), slots.read_port()     # (unnamed: $signature__*)
        m.submodules.rsp_fifo = rsp_fifo = SyncFIFOBuffered(width=16 * L + TAG_BITS, depth=RF)
        m.submodules.tag_fifo = tag_fifo = SyncFIFO(width=TAG_BITS, depth=RF)
        return (*slot_ports, rsp_fifo, tag_fifo)

    def _walk_registers(self, m, slot_w, slot_r):
        """The walk's registers: block, micro-op (and the next one), pass, stream phases."""
        D = self.cfg.depth
        n_uops = self.n_uops
        w = SimpleNamespace()
        # the walk over (block, micro-op)
        w.ik = Signal(UOP_INDEX_BITS)
        w.ibase = Signal(32)
        w.i_left = Signal(32)                # W - ibase
        w.iblen = Signal(range(D + 1))
        # the next block's base and words left, registers (ibase, iblen hold still in a pass)
        w.ibase_nx, w.i_rest = Signal(32), Signal(32, name="i_rest")
        m.d.sync += [w.ibase_nx.eq(w.ibase + w.iblen), w.i_rest.eq(w.i_left - w.iblen)]
        # a read pass over the block may hand over to the next micro-op as its last read
        # goes out: the next micro-op's fields are read from the third cycle of a pass on
        w.i_long = Signal()
        w.i_final = Signal()                 # the last block (i_left <= D, a register)
        w.i_rsrc, w.i_store = Signal(3), Signal()
        w.i_addr = Signal(ADDR_BITS)
        # the micro-op's param as param - 1 and param != 0 (registered at I_LOAD): no
        # subtractor in front of the phase compare of every read
        w.i_last_ph, w.i_param_nz = Signal(PARAM_BITS), Signal()
        w.icnt = Signal(range(D + 1))
        w.i_one = Signal()                   # the next read is the pass's last (a register)
        w.i_passes = Signal(PASS_BITS)
        w.fresh = Signal()                   # first pass of a program: wait for stale reads
        w.trail = Signal()                   # the program's stores may trail its reads
        w.ra = Signal(ADDR_BITS)             # next read address
        w.ph = Signal(PARAM_BITS)            # CHAN phase / GROUP count within a group
        w.elane = Signal(6)                  # GROUP element lane
        w.par_i = Signal()                   # parity of the word index (INT8 half)
        m.d.comb += [self.uop.addr.eq(w.ik), slot_r.addr.eq(w.ik), slot_w.addr.eq(w.ik)]
        # The walk visits every micro-op in order; where the stores may trail (``trail``)
        # only the micro-ops that read memory, each record naming the next one (``i_nx``;
        # ``i_wrap``: it is in the next block), as nothing else needs the issue side.
        w.i_nx, w.i_wrap = Signal(UOP_INDEX_BITS), Signal()
        # ik is the block's last micro-op the walk visits (registered: valid from the
        # second cycle after ik changed)
        w.i_last = Signal()
        m.d.sync += w.i_last.eq(Mux(w.trail, w.i_wrap, w.ik == n_uops - 1))
        w.ik_nx = Signal(UOP_INDEX_BITS)
        m.d.comb += w.ik_nx.eq(Mux(w.trail, w.i_nx, Mux(w.i_last, 0, w.ik + 1)))
        # the walk visits one micro-op: a hand-over keeps the stream phase registers (its
        # record is the one being written back)
        w.i_single = Signal()
        m.d.sync += w.i_single.eq(Mux(w.trail, w.i_nx == w.ik, n_uops == 1))
        return w

    def _record_writes(self, m, slot_w):
        """The phase records' writes: a hand-over's write-back register, the check's records."""
        # a hand-over's phase record is written in the next cycle, from registers (no path
        # from the stream advance into the record memory); the next read of that record is
        # at least 2 cycles later (a hand-over needs 3 reads, I_END comes after I_RUN)
        wb_en, wb_addr, wb_data = Signal(), Signal(UOP_INDEX_BITS), Signal(_SLOT_BITS)
        m.d.sync += wb_en.eq(0)
        with m.If(wb_en):
            m.d.comb += [slot_w.addr.eq(wb_addr), slot_w.en.eq(1), slot_w.data.eq(wb_data)]
        with m.If(self.phase_init.en):
            m.d.comb += [slot_w.addr.eq(self.phase_init.index), slot_w.en.eq(1),
                         slot_w.data.eq(Cat(self.phase_init.addr, Const(0, PARAM_BITS + 6),
                                            self.phase_init.next, self.phase_init.wrap))]
        return SimpleNamespace(en=wb_en, addr=wb_addr, data=wb_data)

    def _request_register(self, m):
        """The memory request register on the ``mem_req_*`` port, and its transfers."""
        L = self.cfg.lanes
        req_valid, req_we = Signal(), Signal()
        req_addr = Signal(ADDR_BITS)
        req_wdata, req_wmask = Signal(16 * L), Signal(L)
        m.d.comb += [self.mem_req_valid.eq(req_valid), self.mem_req_we.eq(req_we),
                     self.mem_req_addr.eq(req_addr), self.mem_req_wdata.eq(req_wdata),
                     self.mem_req_wmask.eq(req_wmask)]
        req_free = Signal()
        m.d.comb += req_free.eq(~req_valid | self.mem_req_ready)
        read_xfer = Signal()
        m.d.comb += [read_xfer.eq(req_valid & self.mem_req_ready & ~req_we),
                     self.store_done.eq(req_valid & self.mem_req_ready & req_we)]
        return SimpleNamespace(valid=req_valid, we=req_we, addr=req_addr, wdata=req_wdata,
                               wmask=req_wmask, free=req_free, read_xfer=read_xfer)

    def _responses(self, m, req, rsp_fifo, tag_fifo):
        """The reads in flight (reset-less count) and the responses of this program, tagged."""
        RF = read_credits(self.cfg)
        # reads in flight survive a reset (the memory still answers them): count them
        outstanding = Signal(range(RF + 2), reset_less=True)
        m.d.sync += outstanding.eq(outstanding + req.read_xfer - self.mem_rsp_valid)
        # a response belongs to this program iff its tag is waiting (tags are reset)
        m.d.comb += [rsp_fifo.w_data.eq(Cat(self.mem_rsp_data, tag_fifo.r_data)),
                     rsp_fifo.w_en.eq(self.mem_rsp_valid & tag_fifo.r_rdy),
                     tag_fifo.r_en.eq(self.mem_rsp_valid),
                     self.rsp.valid.eq(rsp_fifo.r_rdy), self.rsp.payload.eq(rsp_fifo.r_data),
                     rsp_fifo.r_en.eq(self.rsp.ready)]
        return outstanding

    def _read_issue(self, m, w, req, tag_fifo):
        """A read's issue (read credits, its tag) and the stream advance after it."""
        RF = read_credits(self.cfg)
        rd_used = Signal(range(RF + 1))      # reads issued and not yet taken by execution
        # icnt < iblen, rd_used < RF and "this pass reads" as registers (set with what they
        # compare), so no compare is in front of issue_read
        w.i_more, w.rd_room, w.i_read = Signal(), Signal(init=1), Signal()
        w.issuing = Signal()                 # in I_RUN of a read pass
        issue_read = Signal()
        m.d.comb += [
            issue_read.eq(w.issuing & w.i_more & w.rd_room & req.free & ~self.store.valid),
            tag_fifo.w_data.eq(Cat(w.par_i, w.elane)),
            tag_fifo.w_en.eq(issue_read),
        ]
        rd_next = Signal.like(rd_used)
        m.d.comb += rd_next.eq(rd_used + issue_read - (self.rsp.valid & self.rsp.ready))
        m.d.sync += [rd_used.eq(rd_next), w.rd_room.eq(rd_next < RF)]
        advanced = self._stream_advance(m, issue_read, w.i_rsrc, w.i_last_ph, w.i_param_nz,
                                        w.i_addr, w.ra, w.ph, w.elane, w.par_i)
        return issue_read, advanced

    def _request_select(self, m, w, req, issue_read):
        """The request register's load: the head of execution's store stream, else a read."""
        m.d.comb += self.store.ready.eq(req.free)
        with m.If(req.free):
            m.d.sync += req.valid.eq(0)
            with m.If(self.store.valid):
                m.d.sync += [req.valid.eq(1), req.we.eq(1),
                             req.addr.eq(self.store.payload.addr),
                             req.wdata.eq(self.store.payload.data),
                             req.wmask.eq(self.store.payload.mask)]
            with m.Elif(issue_read):
                m.d.sync += [req.valid.eq(1), req.we.eq(0), req.addr.eq(w.ra),
                             w.icnt.eq(w.icnt + 1), w.i_more.eq(w.icnt + 1 < w.iblen),
                             w.i_one.eq(w.icnt + 2 == w.iblen)]

    @staticmethod
    def _load_pass(m, w, fi, slot_r, words, block_base, phases):
        """Load the micro-op in ``fi`` (and, with ``phases``, its stream phase record)
        as the current pass over ``words`` words from ``block_base``."""
        m.d.sync += [w.i_rsrc.eq(fi.rsrc), w.i_store.eq(fi.store), w.i_addr.eq(fi.addr),
                     w.i_read.eq(fi.rsrc != RSrc.BUF), w.i_more.eq(words != 0),
                     w.i_one.eq(words == 1), w.icnt.eq(0), w.par_i.eq(block_base[0]),
                     w.i_last_ph.eq(fi.param - 1), w.i_param_nz.eq(fi.param != 0)]
        # (a record's next/wrap fields never change after the check)
        m.d.sync += Cat(w.i_nx, w.i_wrap).eq(slot_r.data[ADDR_BITS + PARAM_BITS + 6:])
        with m.If(phases):
            m.d.sync += [w.ra.eq(slot_r.data[0:ADDR_BITS]),
                         w.ph.eq(slot_r.data[ADDR_BITS:ADDR_BITS + PARAM_BITS]),
                         w.elane.eq(slot_r.data[ADDR_BITS + PARAM_BITS:][:6])]

    def _block_flags(self, m, w, words, left):
        """The block's flags: long enough to hand over (3 words), the last block."""
        m.d.sync += [w.i_long.eq(words >= 3), w.i_final.eq(left <= self.cfg.depth)]

    def _walk(self, m, w, wb, slot_w, slot_r, issue_read, advanced, outstanding):
        """The walk, FSM ``issue``: read requests of every read pass, up to RF words ahead."""
        D = self.cfg.depth
        ik, iblen = w.ik, w.iblen
        ra_n, ph_n, elane_n = advanced
        fi = UopFields(self.uop.data)
        with m.FSM(name="issue"):
            with m.State("I_IDLE"):
                with m.If(self.start):
                    m.d.sync += [w.ibase.eq(0), w.i_left.eq(self.n_words), w.i_passes.eq(0),
                                 w.fresh.eq(1), w.trail.eq(self.trail)]
                    m.next = "I_BLOCK"

            with m.State("I_BLOCK"):
                words = Mux(w.i_left >= D, D, w.i_left)
                m.d.sync += [ik.eq(0), iblen.eq(words)]
                self._block_flags(m, w, words, w.i_left)
                m.next = "I_FETCH"

            with m.State("I_FETCH"):
                m.next = "I_LOAD"

            with m.State("I_LOAD"):
                self._load_pass(m, w, fi, slot_r, iblen, w.ibase, 1)
                with m.If(~w.fresh | (outstanding == 0)):
                    m.next = "I_RUN"

            with m.State("I_RUN"):
                m.d.comb += [w.issuing.eq(w.i_read), self.uop.addr.eq(w.ik_nx),
                             slot_r.addr.eq(w.ik_nx)]
                m.d.sync += w.fresh.eq(0)
                with m.If(w.i_read):
                    # the last read of a pass over a long enough block, not the walk's
                    # last pass: hand over to the next micro-op (its first read may go out
                    # in the next cycle); the stream phases after this read are written
                    # back
                    with m.If(issue_read & w.i_one & w.i_long & ~(w.i_last & w.i_final)):
                        m.d.sync += [wb.en.eq(1), wb.addr.eq(ik),
                                     wb.data.eq(Cat(ra_n, ph_n, elane_n, w.i_nx, w.i_wrap))]
                        m.d.sync += w.i_passes.eq(w.i_passes + 1)
                        with m.If(w.i_last):
                            words = Mux(w.i_rest >= D, D, w.i_rest)
                            m.d.sync += [ik.eq(0), w.ibase.eq(w.ibase_nx),
                                         w.i_left.eq(w.i_rest), iblen.eq(words)]
                            self._block_flags(m, w, words, w.i_rest)
                            self._load_pass(m, w, fi, slot_r, words, w.ibase_nx, ~w.i_single)
                        with m.Else():
                            self._load_pass(m, w, fi, slot_r, iblen, w.ibase, ~w.i_single)
                            m.d.sync += ik.eq(w.ik_nx)
                    with m.Elif(~w.i_more):
                        m.next = "I_END"
                with m.Elif(w.i_store):
                    # reads after a store pass go out only after its last store
                    with m.If(self.x_passes == (w.i_passes + 1)[:PASS_BITS]):
                        m.next = "I_END"
                with m.Else():
                    m.next = "I_END"

            with m.State("I_END"):
                m.d.comb += [slot_w.en.eq(1),
                             slot_w.data.eq(Cat(w.ra, w.ph, w.elane, w.i_nx, w.i_wrap))]
                m.d.sync += [ik.eq(w.ik_nx), w.i_passes.eq(w.i_passes + 1)]
                with m.If(w.i_last):
                    m.d.sync += [w.ibase.eq(w.ibase_nx), w.i_left.eq(w.i_rest)]
                    with m.If(w.i_final):
                        m.next = "I_IDLE"
                    with m.Else():
                        m.next = "I_BLOCK"
                with m.Else():
                    m.next = "I_FETCH"

    def _stream_advance(self, m, issue, rsrc, last_ph, param_nz, addr, ra, ph, elane, par_i):
        """Next read address and CHAN/GROUP/INT8 phase after issuing one read (``last_ph`` =
        param - 1: the phase's last value; ``param_nz``: param != 0); loaded when ``issue``.
        Returns the next values of ``(ra, ph, elane)`` (combinational)."""
        L = self.cfg.lanes
        ra_n, ph_n, elane_n = Signal.like(ra), Signal.like(ph), Signal.like(elane)
        m.d.comb += [ra_n.eq(ra), ph_n.eq(ph), elane_n.eq(elane)]
        with m.Switch(rsrc):
            with m.Case(RSrc.MEM):
                m.d.comb += ra_n.eq(ra + 1)
            with m.Case(RSrc.CHAN):
                with m.If(ph == last_ph):
                    m.d.comb += [ph_n.eq(0), ra_n.eq(addr)]
                with m.Else():
                    m.d.comb += [ph_n.eq(ph + 1), ra_n.eq(ra + 1)]
            with m.Case(RSrc.INT8):
                with m.If(par_i):
                    m.d.comb += ra_n.eq(ra + 1)
            with m.Case(RSrc.GROUP):
                with m.If(param_nz & (ph == last_ph)):
                    m.d.comb += ph_n.eq(0)
                    with m.If(elane == L - 1):
                        m.d.comb += [elane_n.eq(0), ra_n.eq(ra + 1)]
                    with m.Else():
                        m.d.comb += elane_n.eq(elane + 1)
                with m.Elif(param_nz):
                    m.d.comb += ph_n.eq(ph + 1)
        with m.If(issue):
            m.d.sync += [par_i.eq(~par_i), ra.eq(ra_n), ph.eq(ph_n), elane.eq(elane_n)]
        return ra_n, ph_n, elane_n
