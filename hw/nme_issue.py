"""The NME's issue side: read requests ahead of execution, read responses, the memory port.

The issue FSM (``issue``) walks (block, micro-op) like execution does and sends the read
requests of every pass whose R operand comes from memory, up to ``max(depth, 3) +
result_stage`` words ahead of execution (:func:`coda.hw.nme_iface.read_credits`: the entries
of the read-response FIFO), so memory latency is paid about once per block rather than once
per pass. Like execution it reads the next micro-op (and its stream phase record) while a
pass runs, and a read pass over a block of at least 3 words hands over to it as its last read
goes out, so back-to-back read passes send one read per cycle; any other pass takes 4 cycles
(I_RUN, I_END, I_FETCH, I_LOAD). Each read carries a tag (INT8 half, GROUP element lane)
through a tag FIFO that joins the response.

Memory order is program order where it matters: the issue side does not pass a store pass
until execution has sent its last store (execution's pass counter), unless the program's
stores may trail (``trail``, :func:`coda.hw.nme_check.stores_may_trail`: no later block's read
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
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .isa import ADDR_BITS, PARAM_BITS, NMEConfig, RSrc
from .nme_iface import (PASS_BITS, TAG_BITS, UOP_INDEX_BITS, PhaseInit, UopFields, UopRead,
                        read_credits, response_signature, store_signature)

__all__ = ["NMEIssue"]


class NMEIssue(wiring.Component):
    """Read issue, response FIFO and memory request register of one NME.

    Parameters:
        cfg: :class:`coda.hw.isa.NMEConfig` (lanes, depth, imem_depth).

    Members (L = ``cfg.lanes``):
        start: In(1): the program was accepted (the walk starts in the next cycle).
        trail: In(1): with ``start``: the program's stores may trail later reads.
        n_uops: In(8), n_words: In(32): the program's micro-ops and words.
        uop: Out(:data:`coda.hw.nme_iface.UopRead`): the instruction memory's read port.
        phase_init: In(:data:`coda.hw.nme_iface.PhaseInit`): the check's phase records.
        x_passes: In(11): passes execution has completed (mod 2**11).
        store: In(stream.Signature(store_layout(L))): execution's store words; taken when
            the request register is free (reads wait for them).
        store_done: Out(1): a store request transferred to the memory this cycle.
        rsp: Out(stream.Signature(response_layout(L))): read responses of this program, in
            order, with their tags.
        mem_req_valid: Out(1), mem_req_ready: In(1), mem_req_we: Out(1), mem_req_addr:
            Out(24), mem_req_wdata: Out(16*L), mem_req_wmask: Out(L): the NME's memory
            request port (:class:`coda.hw.nme.NME`); valid is a register output.
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
        cfg = self.cfg
        L, D, IM = cfg.lanes, cfg.depth, cfg.imem_depth
        RF = read_credits(cfg)
        m = Module()
        n_uops, n_words = self.n_uops, self.n_words

        # a phase record: next read address, CHAN/GROUP phase, GROUP element lane, and the
        # next reading micro-op (its index, and whether it is in the next block)
        slot_bits = ADDR_BITS + PARAM_BITS + 6 + UOP_INDEX_BITS + 1
        m.submodules.slots = slots = Memory(shape=slot_bits, depth=IM, init=[])
        slot_w, slot_r = slots.write_port(), slots.read_port()
        m.submodules.rsp_fifo = rsp_fifo = SyncFIFOBuffered(width=16 * L + TAG_BITS, depth=RF)
        m.submodules.tag_fifo = tag_fifo = SyncFIFO(width=TAG_BITS, depth=RF)

        # the walk over (block, micro-op)
        ik = Signal(UOP_INDEX_BITS)
        ibase = Signal(32)
        i_left = Signal(32)                  # W - ibase
        iblen = Signal(range(D + 1))
        # the next block's base and words left, registers (ibase, iblen hold still in a pass)
        ibase_nx, i_rest = Signal(32), Signal(32)
        m.d.sync += [ibase_nx.eq(ibase + iblen), i_rest.eq(i_left - iblen)]
        # a read pass over the block may hand over to the next micro-op as its last read
        # goes out: the next micro-op's fields are read from the third cycle of a pass on
        i_long = Signal()
        i_final = Signal()                   # the last block (i_left <= D, a register)
        i_rsrc, i_store = Signal(3), Signal()
        i_addr = Signal(ADDR_BITS)
        # the micro-op's param as param - 1 and param != 0 (registered at I_LOAD): no
        # subtractor in front of the phase compare of every read
        i_last_ph, i_param_nz = Signal(PARAM_BITS), Signal()
        icnt = Signal(range(D + 1))
        i_one = Signal()                     # the next read is the pass's last (a register)
        i_passes = Signal(PASS_BITS)
        fresh = Signal()                     # first pass of a program: wait for stale reads
        trail = Signal()                     # the program's stores may trail its reads
        ra = Signal(ADDR_BITS)               # next read address
        ph = Signal(PARAM_BITS)              # CHAN phase / GROUP count within a group
        elane = Signal(6)                    # GROUP element lane
        par_i = Signal()                     # parity of the word index (INT8 half)
        m.d.comb += [self.uop.addr.eq(ik), slot_r.addr.eq(ik), slot_w.addr.eq(ik)]
        # The walk visits every micro-op in order; where the stores may trail (``trail``)
        # only the micro-ops that read memory, each record naming the next one (``i_nx``;
        # ``i_wrap``: it is in the next block), as nothing else needs the issue side.
        i_nx, i_wrap = Signal(UOP_INDEX_BITS), Signal()
        # ik is the block's last micro-op the walk visits (registered: valid from the
        # second cycle after ik changed)
        i_last = Signal()
        m.d.sync += i_last.eq(Mux(trail, i_wrap, ik == n_uops - 1))
        ik_nx = Signal(UOP_INDEX_BITS)
        m.d.comb += ik_nx.eq(Mux(trail, i_nx, Mux(i_last, 0, ik + 1)))
        # the walk visits one micro-op: a hand-over keeps the stream phase registers (its
        # record is the one being written back)
        i_single = Signal()
        m.d.sync += i_single.eq(Mux(trail, i_nx == ik, n_uops == 1))
        # a hand-over's phase record is written in the next cycle, from registers (no path
        # from the stream advance into the record memory); the next read of that record is
        # at least 2 cycles later (a hand-over needs 3 reads, I_END comes after I_RUN)
        wb_en, wb_addr, wb_data = Signal(), Signal(UOP_INDEX_BITS), Signal(slot_bits)
        m.d.sync += wb_en.eq(0)
        with m.If(wb_en):
            m.d.comb += [slot_w.addr.eq(wb_addr), slot_w.en.eq(1), slot_w.data.eq(wb_data)]
        with m.If(self.phase_init.en):
            m.d.comb += [slot_w.addr.eq(self.phase_init.index), slot_w.en.eq(1),
                         slot_w.data.eq(Cat(self.phase_init.addr, Const(0, PARAM_BITS + 6),
                                            self.phase_init.next, self.phase_init.wrap))]

        # ---- memory request register
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

        # reads in flight survive a reset (the memory still answers them): count them
        outstanding = Signal(range(RF + 2), reset_less=True)
        m.d.sync += outstanding.eq(outstanding + read_xfer - self.mem_rsp_valid)
        # a response belongs to this program iff its tag is waiting (tags are reset)
        m.d.comb += [rsp_fifo.w_data.eq(Cat(self.mem_rsp_data, tag_fifo.r_data)),
                     rsp_fifo.w_en.eq(self.mem_rsp_valid & tag_fifo.r_rdy),
                     tag_fifo.r_en.eq(self.mem_rsp_valid),
                     self.rsp.valid.eq(rsp_fifo.r_rdy), self.rsp.payload.eq(rsp_fifo.r_data),
                     rsp_fifo.r_en.eq(self.rsp.ready)]
        rd_used = Signal(range(RF + 1))      # reads issued and not yet taken by execution
        # icnt < iblen, rd_used < RF and "this pass reads" as registers (set with what they
        # compare), so no compare is in front of issue_read
        i_more, rd_room, i_read = Signal(), Signal(init=1), Signal()
        issuing = Signal()                   # in I_RUN of a read pass
        issue_read = Signal()
        m.d.comb += [
            issue_read.eq(issuing & i_more & rd_room & req_free & ~self.store.valid),
            tag_fifo.w_data.eq(Cat(par_i, elane)),
            tag_fifo.w_en.eq(issue_read),
        ]
        rd_next = Signal.like(rd_used)
        m.d.comb += rd_next.eq(rd_used + issue_read - (self.rsp.valid & self.rsp.ready))
        m.d.sync += [rd_used.eq(rd_next), rd_room.eq(rd_next < RF)]
        ra_n, ph_n, elane_n = self._stream_advance(m, issue_read, i_rsrc, i_last_ph,
                                                   i_param_nz, i_addr, ra, ph, elane, par_i)

        # the head of execution's store stream, or else a read of the issue side
        m.d.comb += self.store.ready.eq(req_free)
        with m.If(req_free):
            m.d.sync += req_valid.eq(0)
            with m.If(self.store.valid):
                m.d.sync += [req_valid.eq(1), req_we.eq(1),
                             req_addr.eq(self.store.payload.addr),
                             req_wdata.eq(self.store.payload.data),
                             req_wmask.eq(self.store.payload.mask)]
            with m.Elif(issue_read):
                m.d.sync += [req_valid.eq(1), req_we.eq(0), req_addr.eq(ra),
                             icnt.eq(icnt + 1), i_more.eq(icnt + 1 < iblen),
                             i_one.eq(icnt + 2 == iblen)]

        # ---- the walk: read requests of every read pass, up to RF words ahead
        fi = UopFields(self.uop.data)

        def load_pass(words, block_base, phases):
            """Load the micro-op in ``fi`` (and, with ``phases``, its stream phase record)
            as the current pass over ``words`` words from ``block_base``."""
            m.d.sync += [i_rsrc.eq(fi.rsrc), i_store.eq(fi.store), i_addr.eq(fi.addr),
                         i_read.eq(fi.rsrc != RSrc.BUF), i_more.eq(words != 0),
                         i_one.eq(words == 1), icnt.eq(0), par_i.eq(block_base[0]),
                         i_last_ph.eq(fi.param - 1), i_param_nz.eq(fi.param != 0)]
            # (a record's next/wrap fields never change after the check)
            m.d.sync += Cat(i_nx, i_wrap).eq(slot_r.data[ADDR_BITS + PARAM_BITS + 6:])
            with m.If(phases):
                m.d.sync += [ra.eq(slot_r.data[0:ADDR_BITS]),
                             ph.eq(slot_r.data[ADDR_BITS:ADDR_BITS + PARAM_BITS]),
                             elane.eq(slot_r.data[ADDR_BITS + PARAM_BITS:][:6])]

        def block_flags(words, left):
            m.d.sync += [i_long.eq(words >= 3), i_final.eq(left <= D)]

        with m.FSM(name="issue"):
            with m.State("I_IDLE"):
                with m.If(self.start):
                    m.d.sync += [ibase.eq(0), i_left.eq(n_words), i_passes.eq(0), fresh.eq(1),
                                 trail.eq(self.trail)]
                    m.next = "I_BLOCK"

            with m.State("I_BLOCK"):
                words = Mux(i_left >= D, D, i_left)
                m.d.sync += [ik.eq(0), iblen.eq(words)]
                block_flags(words, i_left)
                m.next = "I_FETCH"

            with m.State("I_FETCH"):
                m.next = "I_LOAD"

            with m.State("I_LOAD"):
                load_pass(iblen, ibase, 1)
                with m.If(~fresh | (outstanding == 0)):
                    m.next = "I_RUN"

            with m.State("I_RUN"):
                m.d.comb += [issuing.eq(i_read), self.uop.addr.eq(ik_nx),
                             slot_r.addr.eq(ik_nx)]
                m.d.sync += fresh.eq(0)
                with m.If(i_read):
                    # the last read of a pass over a long enough block, not the walk's
                    # last pass: hand over to the next micro-op (its first read may go out
                    # in the next cycle); the stream phases after this read are written
                    # back
                    with m.If(issue_read & i_one & i_long & ~(i_last & i_final)):
                        m.d.sync += [wb_en.eq(1), wb_addr.eq(ik),
                                     wb_data.eq(Cat(ra_n, ph_n, elane_n, i_nx, i_wrap))]
                        m.d.sync += i_passes.eq(i_passes + 1)
                        with m.If(i_last):
                            words = Mux(i_rest >= D, D, i_rest)
                            m.d.sync += [ik.eq(0), ibase.eq(ibase_nx), i_left.eq(i_rest),
                                         iblen.eq(words)]
                            block_flags(words, i_rest)
                            load_pass(words, ibase_nx, ~i_single)
                        with m.Else():
                            load_pass(iblen, ibase, ~i_single)
                            m.d.sync += ik.eq(ik_nx)
                    with m.Elif(~i_more):
                        m.next = "I_END"
                with m.Elif(i_store):
                    # reads after a store pass go out only after its last store
                    with m.If(self.x_passes == (i_passes + 1)[:PASS_BITS]):
                        m.next = "I_END"
                with m.Else():
                    m.next = "I_END"

            with m.State("I_END"):
                m.d.comb += [slot_w.en.eq(1), slot_w.data.eq(Cat(ra, ph, elane, i_nx, i_wrap))]
                m.d.sync += [ik.eq(ik_nx), i_passes.eq(i_passes + 1)]
                with m.If(i_last):
                    m.d.sync += [ibase.eq(ibase_nx), i_left.eq(i_rest)]
                    with m.If(i_final):
                        m.next = "I_IDLE"
                    with m.Else():
                        m.next = "I_BLOCK"
                with m.Else():
                    m.next = "I_FETCH"
        return m

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
