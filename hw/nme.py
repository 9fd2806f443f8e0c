"""The Near-Memory Engine: command intake, program check, strip-mined execution over streams.

The instruction set, the validation rules and the encodings are :mod:`coda.hw.isa` (binding);
this module is one implementation of it.

Organisation
------------
- **Intake**: the header then ``n_uops`` micro-op words go into the instruction memory
  (``imem_depth`` x 64 bits). All ``n_uops`` words are consumed even when there are more
  than ``imem_depth`` (they are dropped and the program is rejected with ``BAD_LENGTH``).
- **Check**: a walk over the micro-ops applies exactly :func:`coda.hw.isa.validate`, with a
  sequential divider for ``W = ceil(N / lanes)`` (only when ``lanes`` is not a power of two,
  32 cycles) and a sequential shift-add multiplier for the GROUP extent (<= 22 cycles). The
  GROUP rule ``addr + (W-1) // (param*L) + 1 > mem_words`` is evaluated as
  ``W - 1 >= (mem_words - addr) * param * L`` (same truth value for positive integers,
  no division). An ``nbuf``-bit mask of the buffers written so far (``d`` of each earlier
  non-store, non-L1 micro-op) rejects reads of unwritten buffers in the same cycle as the
  other operand rules. Nothing touches memory before the whole program is accepted.
- **Execution** (the ``seq`` FSM): for each block of ``depth`` words, for each micro-op,
  one *pass* over the block. A pass whose R operand comes from memory takes one response per
  cycle from the read-response FIFO; a pass with R from a buffer feeds one word per cycle;
  with ``store`` its results go through an 8-word FIFO to the memory request port, and words
  enter the pipeline only while that FIFO has room for them (credit count), so
  ``mem_req_ready`` back-pressure loses nothing. Passes drain the lane pipeline (3 cycles)
  before the next one starts, so buffer read-after-write needs no further check.
- **Issue** (the ``issue`` FSM): a second walk over (block, micro-op) that sends the read
  requests of every memory pass, up to ``max(depth, 3)`` words ahead of execution (credits
  of the response FIFO), so memory latency is paid about once per block rather than once per
  pass. Each read carries a tag (INT8 half, GROUP element lane) through a tag FIFO. Memory
  order is program order: the issue side does not pass a store pass until execution has
  sent its last store.
- **Stream phases**: each instruction slot has a phase record (next request address,
  CHAN/GROUP counter, GROUP lane) that the issue side carries from one block's pass to the
  next, so no division happens at run time.
- **Buffers**: ``nbuf`` memories of ``depth`` x ``16*lanes`` bits, one synchronous read port
  (all of P, Q, R read the same word index in a pass) and one write port each.
- **Reset**: the synchronous ``rst`` returns everything to idle. Read responses still in
  flight from before a reset are counted by a reset-less counter; they find no tag and are
  dropped, and a program's first read waits until none is outstanding.

Cycle cost (memory always ready, read latency ``lat``; :func:`coda.hw.nme_cycles.model_cycles`
is this model, checked exactly against Verilator counts): intake ``n_uops + 1``; check
``3 * n_uops + 3`` (32 more when ``lanes`` is not a power of two, ``bitlen(param*L) + 1``
more per scaled GROUP micro-op); execution ``2`` plus ``blen + 6`` per pass (``blen + 8``
for a store pass), plus ``3 + lat`` before the first word, plus ``6 + lat`` (``+ 1`` across
a block boundary) before the first read pass after each store pass, less the cycles buffer
passes in between give the issue side; ``L`` for the L1 sum; ``1`` for ``done``. Default
config, y = x + g*c over 1000 elements, 1-cycle memory: 587 cycles.
"""

from __future__ import annotations

from amaranth.hdl import (Array, Cat, ClockDomain, ClockSignal, Const, Module, Mux, ResetSignal,
                          Signal)
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .fp import FP32, FPAdd, Int8ToFP, fp_format
from .isa import ADDR_BITS, PARAM_BITS, NMEConfig, Op, RSrc, Status
from .lane import GATED_DOMAINS, RES_PROD, RES_R, RES_SUM, NMELane

__all__ = ["NME", "STORE_FIFO_DEPTH"]

#: Words of store results the NME can hold while the memory refuses requests; 8 covers the
#: issue-to-transfer round trip (about 6 cycles) so a store pass keeps one word per cycle.
STORE_FIFO_DEPTH = 8
#: Bits travelling with each read (INT8 half, GROUP element lane).
TAG_BITS = 7
#: Width of the pass counters of the issue and execution sides. The issue side is at most
#: about two blocks (2 * 255 passes) ahead, so 11 bits never alias.
PASS_BITS = 11


class _UopFields:
    """Fields of a micro-op word (a Value), per the :mod:`coda.hw.isa` encoding."""

    def __init__(self, word):
        self.op, self.rsrc, self.store = word[0:4], word[4:7], word[7]
        self.d, self.p, self.q, self.r = word[8:12], word[12:16], word[16:20], word[20:24]
        self.addr, self.param = word[24:48], word[48:64]


_fields = _UopFields


class NME(wiring.Component):
    """One Near-Memory Engine (clock domain ``sync``; Verilog ports ``clk``, ``rst``).

    Parameters:
        cfg: :class:`coda.hw.isa.NMEConfig` (lanes L, fmt, depth, nbuf, imem_depth,
            max_streams, mem_words, max_elems, operand_isolation).
        clock_gating: clock the lanes' data registers through clock gates (with operand
            isolation only; ignored without it). Each register group of a lane gets a gated
            clock (:data:`coda.hw.lane.GATED_DOMAINS`) that runs in the cycles in which the
            group may load (the FPMul operands when a word is in stage 1 and the micro-op
            multiplies, and so on; the accumulator also on a clear; every group during
            reset, which must span a falling clock edge). A gate is the usual latch-and-AND
            cell made of a falling-edge flip-flop that samples the enable in the middle of the
            cycle and an AND with the clock. Results and timing are identical to the ungated
            NME; the lanes' logic only switches (and a Verilated model only evaluates it) when
            a group works. amaranth.sim would see the gated clocks a delta cycle late (a
            race), so simulate a gated NME with Verilator.

    Members (L = ``cfg.lanes``):
        cmd_valid: In(1), cmd_ready: Out(1), cmd_data: In(64): command words (header, then
            micro-ops, :mod:`coda.hw.isa` encodings); a word transfers on valid & ready.
        mem_req_valid: Out(1), mem_req_ready: In(1): one memory request per valid & ready;
            valid is a register output and never waits on ready.
        mem_req_we: Out(1): 1 write, 0 read. mem_req_addr: Out(24): word address.
        mem_req_wdata: Out(16*L): word to write. mem_req_wmask: Out(L): per-element write
            enable (tail lanes 0).
        mem_rsp_valid: In(1), mem_rsp_data: In(16*L): read data, one per read, in order,
            latency >= 1 cycle, always accepted.
        busy: Out(1): from the accepted header until (not including) the ``done`` cycle.
        done: Out(1): one-cycle pulse at the end of every program (good or bad).
        status: Out(3): :class:`coda.hw.isa.Status` of the last program.
        l1: Out(32): fp32 bits of the last program's L1 sum (0 if it had no L1 op / failed).
        dbg_fu_toggles: Out(32): saturating count of bit toggles of all FU operand
            registers of all lanes since reset (for the operand-isolation measurement).

    Raises:
        TypeError: ``cfg`` is not an :class:`NMEConfig`.
    """

    def __init__(self, cfg: NMEConfig, clock_gating: bool = False):
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg={cfg!r}: expected a coda.hw.isa.NMEConfig")
        self.cfg = cfg
        self.clock_gating = bool(clock_gating) and cfg.operand_isolation
        lanes = cfg.lanes
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(64),
            "mem_req_valid": Out(1), "mem_req_ready": In(1), "mem_req_we": Out(1),
            "mem_req_addr": Out(ADDR_BITS), "mem_req_wdata": Out(16 * lanes),
            "mem_req_wmask": Out(lanes),
            "mem_rsp_valid": In(1), "mem_rsp_data": In(16 * lanes),
            "busy": Out(1), "done": Out(1), "status": Out(3), "l1": Out(32),
            "dbg_fu_toggles": Out(32),
        })

    # ------------------------------------------------------------------------------------
    def elaborate(self, platform):
        cfg = self.cfg
        L, D, NB, IM = cfg.lanes, cfg.depth, cfg.nbuf, cfg.imem_depth
        # read-response FIFO and read credits: up to `depth` reads ahead, at least 3 because a
        # SyncFIFOBuffered of depth 2 (one inner entry) refuses a write in the cycle after a
        # write, and back-to-back responses (latency 1, depth 2) would be lost: the NME hung
        RF = max(D, 3)
        m = Module()
        fmt = fp_format(cfg.fmt)

        # ---- storage ----------------------------------------------------------------------
        m.submodules.imem = imem = Memory(shape=64, depth=IM, init=[])
        imem_w, imem_x, imem_i = imem.write_port(), imem.read_port(), imem.read_port()
        slot_bits = ADDR_BITS + PARAM_BITS + 6
        m.submodules.slots = slots = Memory(shape=slot_bits, depth=IM, init=[])
        slot_w, slot_r = slots.write_port(), slots.read_port()
        buf_rd, buf_wr = [], []
        for b in range(NB):
            mem = Memory(shape=16 * L, depth=D, init=[])
            m.submodules[f"buf{b}"] = mem
            buf_rd.append(mem.read_port())
            buf_wr.append(mem.write_port())
        m.submodules.store_fifo = fifo = SyncFIFO(width=16 * L, depth=STORE_FIFO_DEPTH)
        m.submodules.rsp_fifo = rsp_fifo = SyncFIFOBuffered(width=16 * L + TAG_BITS, depth=RF)
        m.submodules.tag_fifo = tag_fifo = SyncFIFO(width=TAG_BITS, depth=RF)

        lanes = []
        for j in range(L):
            lane = NMELane(fmt, cfg.operand_isolation, gated=self.clock_gating)
            m.submodules[f"lane{j}"] = lane
            lanes.append(lane)

        # ---- program registers -------------------------------------------------------------
        n_uops = Signal(8)
        n_elems = Signal(32)
        n_words = Signal(32)                 # W = ceil(N / L)
        tail_mask = Signal(L)                # valid lanes of word W-1
        ld_cnt = Signal(8)
        streams = Signal(9)
        has_l1 = Signal()
        written = Signal(NB)                 # check: buffers an earlier micro-op wrote
        status_r = Signal(3)
        l1_r = Signal(32)
        m.d.comb += [self.status.eq(status_r), self.l1.eq(l1_r)]

        # execution side: current micro-op, block, pass counters
        k = Signal(8)                        # micro-op index (check and execution)
        cur_op, cur_rsrc, cur_store = Signal(4), Signal(3), Signal()
        cur_d, cur_p, cur_q, cur_r = Signal(4), Signal(4), Signal(4), Signal(4)
        read_pass = Signal()                 # R comes from memory (through rsp_fifo)
        m.d.comb += read_pass.eq(cur_rsrc != RSrc.BUF)
        base = Signal(32)
        blen = Signal(range(D + 1))
        last_block = Signal()
        idx_w = max(1, ceil_log2(D))
        i_cnt = Signal(range(D + 1))         # words entered (BUF pass)
        j_cnt = Signal(range(D + 1))         # responses taken (read pass)
        s_cnt = Signal(range(D + 1))         # stores requested (store pass)
        st_addr = Signal(ADDR_BITS)
        x_passes = Signal(PASS_BITS)         # passes completed

        # issue side: its own walk over (block, micro-op), ahead of execution
        ik = Signal(8)
        ibase = Signal(32)
        iblen = Signal(range(D + 1))
        i_rsrc, i_store = Signal(3), Signal()
        i_addr, i_param = Signal(ADDR_BITS), Signal(PARAM_BITS)
        icnt = Signal(range(D + 1))
        i_passes = Signal(PASS_BITS)
        fresh = Signal()                     # first pass of a program: wait for stale reads
        ra = Signal(ADDR_BITS)               # next read address
        ph = Signal(PARAM_BITS)              # CHAN phase / GROUP count within a group
        elane = Signal(6)                    # GROUP element lane
        par_i = Signal()                     # parity of the word index (INT8 half)
        m.d.comb += [imem_x.addr.eq(k), imem_i.addr.eq(ik), slot_r.addr.eq(ik),
                     slot_w.addr.eq(ik)]

        # ---- memory request register -------------------------------------------------------
        req_valid, req_we = Signal(), Signal()
        req_addr = Signal(ADDR_BITS)
        req_wdata, req_wmask = Signal(16 * L), Signal(L)
        m.d.comb += [self.mem_req_valid.eq(req_valid), self.mem_req_we.eq(req_we),
                     self.mem_req_addr.eq(req_addr), self.mem_req_wdata.eq(req_wdata),
                     self.mem_req_wmask.eq(req_wmask)]
        req_free = Signal()
        m.d.comb += req_free.eq(~req_valid | self.mem_req_ready)
        read_xfer, store_xfer = Signal(), Signal()
        m.d.comb += [read_xfer.eq(req_valid & self.mem_req_ready & ~req_we),
                     store_xfer.eq(req_valid & self.mem_req_ready & req_we)]

        # reads in flight survive a reset (the memory still answers them): count them
        outstanding = Signal(range(RF + 2), reset_less=True)
        m.d.sync += outstanding.eq(outstanding + read_xfer - self.mem_rsp_valid)
        # a response belongs to this program iff its tag is waiting (tags are reset)
        m.d.comb += [rsp_fifo.w_data.eq(Cat(self.mem_rsp_data, tag_fifo.r_data)),
                     rsp_fifo.w_en.eq(self.mem_rsp_valid & tag_fifo.r_rdy),
                     tag_fifo.r_en.eq(self.mem_rsp_valid)]
        rd_used = Signal(range(RF + 1))      # reads issued and not yet taken by execution
        used = Signal(range(STORE_FIFO_DEPTH + 1))   # store credits in use

        # ---- pipeline control --------------------------------------------------------------
        run = Signal()                       # execution in X_RUN
        issuing = Signal()                   # issue side in I_RUN of a read pass
        issue_read = Signal()
        enter = Signal()                     # a word enters stage 0 this cycle
        idx0 = Signal(idx_w)
        v1, v2, v3 = Signal(), Signal(), Signal()
        idx1, idx2, idx3 = Signal(idx_w), Signal(idx_w), Signal(idx_w)
        last1 = Signal()
        half1 = Signal()
        elane1 = Signal(6)
        rsp1 = Signal(16 * L)
        acc_clear = Signal()

        m.d.comb += [
            issue_read.eq(issuing & (icnt < iblen) & (rd_used < RF) & req_free),
            enter.eq(run & Mux(read_pass, rsp_fifo.r_rdy & (j_cnt < blen),
                               (i_cnt < blen) & (~cur_store | (used < STORE_FIFO_DEPTH)))),
            rsp_fifo.r_en.eq(enter & read_pass),
            idx0.eq(Mux(read_pass, j_cnt, i_cnt)),
            tag_fifo.w_data.eq(Cat(par_i, elane)),
            tag_fifo.w_en.eq(issue_read),
        ]
        for rp in buf_rd:
            m.d.comb += rp.addr.eq(idx0)
        m.d.sync += [v1.eq(enter), idx1.eq(idx0), idx2.eq(idx1), idx3.eq(idx2),
                     v2.eq(v1), v3.eq(v2),
                     last1.eq(last_block & (idx0 == blen - 1))]
        with m.If(enter & read_pass):
            m.d.sync += [rsp1.eq(rsp_fifo.r_data[:16 * L]),
                         half1.eq(rsp_fifo.r_data[16 * L]),
                         elane1.eq(rsp_fifo.r_data[16 * L + 1:])]
        # the L1 accumulate (stage 4) may still run: X_SUM starts two cycles later
        pipe_empty = Signal()
        m.d.comb += pipe_empty.eq(~enter & ~v1 & ~v2 & ~v3)
        m.d.sync += rd_used.eq(rd_used + issue_read - (enter & read_pass))

        self._stream_advance(m, cfg, issue_read, i_rsrc, i_param, i_addr, ra, ph, elane, par_i)
        self._lanes_stage1(m, cfg, lanes, buf_rd, rsp1, half1, elane1, last1, tail_mask, v1,
                           cur_op, cur_rsrc, cur_p, cur_q, cur_r, acc_clear)
        if self.clock_gating:
            ctl = lanes[0]   # the per-pass controls, the same for every lane
            v4 = Signal()    # an L1 element may be in the lanes' stage 4
            m.d.sync += v4.eq(v3 & ctl.op_l1)
            self._clock_gates(m, (v1, v1 & ctl.op_mul, v2 & ctl.op_add, v2, v2 & ctl.op_l1,
                                  v3 & ctl.op_l1, v4 | acc_clear))

        # stage 3: buffer write or store FIFO
        result = Signal(16 * L)
        m.d.comb += result.eq(Cat(*[lane.y for lane in lanes]))
        writes_buf = Signal()
        m.d.comb += writes_buf.eq(~cur_store & (cur_op != Op.L1))
        for b, wp in enumerate(buf_wr):
            m.d.comb += [wp.addr.eq(idx3), wp.data.eq(result),
                         wp.en.eq(v3 & writes_buf & (cur_d == b))]
        m.d.comb += [fifo.w_data.eq(result), fifo.w_en.eq(v3 & cur_store)]

        # ---- request register: reads of the issue side, or the store FIFO's head -----------
        store_last = Signal()
        m.d.comb += store_last.eq(last_block & (s_cnt == blen - 1))
        with m.If(req_free):
            m.d.sync += req_valid.eq(0)
            with m.If(issue_read):
                m.d.sync += [req_valid.eq(1), req_we.eq(0), req_addr.eq(ra),
                             icnt.eq(icnt + 1)]
            with m.Elif(run & cur_store & fifo.r_rdy):
                m.d.comb += fifo.r_en.eq(1)
                m.d.sync += [req_valid.eq(1), req_we.eq(1), req_addr.eq(st_addr),
                             req_wdata.eq(fifo.r_data),
                             req_wmask.eq(Mux(store_last, tail_mask, Const((1 << L) - 1, L))),
                             st_addr.eq(st_addr + 1), s_cnt.eq(s_cnt + 1)]
        with m.If(enter & ~read_pass):
            m.d.sync += i_cnt.eq(i_cnt + 1)
        with m.If(enter & read_pass):
            m.d.sync += j_cnt.eq(j_cnt + 1)
        m.d.sync += used.eq(used + (enter & cur_store) - store_xfer)

        # ---- check and execution sequencer --------------------------------------------------
        div_q = Signal(32)
        div_r = Signal(range(2 * L + 1))
        div_n = Signal(6)
        mul_acc = Signal(ADDR_BITS + 1 + PARAM_BITS + 7)
        mul_cand = Signal(ADDR_BITS + 1 + PARAM_BITS + 7)
        mul_plier = Signal(PARAM_BITS + 7)
        sum_acc = Signal(32)
        sum_j = Signal(range(L))
        m.submodules.l1_sum = l1_add = FPAdd(FP32)
        acc_sel = Array([lane.acc for lane in lanes])[sum_j]
        m.d.comb += [l1_add.a.eq(sum_acc), l1_add.b.eq(acc_sel), l1_add.sub.eq(0)]
        iss_start = Signal()

        f = _fields(imem_x.data)

        def finish(code, l1_bits=0):
            m.d.sync += [status_r.eq(code), l1_r.eq(l1_bits)]
            m.next = "FINISH"

        with m.FSM(name="seq") as fsm:
            with m.State("IDLE"):
                m.d.comb += self.cmd_ready.eq(1)
                with m.If(self.cmd_valid):
                    m.d.sync += [n_uops.eq(self.cmd_data[0:8]), n_elems.eq(self.cmd_data[8:40]),
                                 ld_cnt.eq(0)]
                    with m.If(self.cmd_data[0:8] == 0):
                        m.next = "V_LEN"
                    with m.Else():
                        m.next = "LOAD"

            with m.State("LOAD"):
                m.d.comb += self.cmd_ready.eq(1)
                with m.If(self.cmd_valid):
                    m.d.comb += [imem_w.addr.eq(ld_cnt), imem_w.data.eq(self.cmd_data),
                                 imem_w.en.eq(ld_cnt < IM)]
                    m.d.sync += ld_cnt.eq(ld_cnt + 1)
                    with m.If(ld_cnt == n_uops - 1):
                        m.next = "V_LEN"

            with m.State("V_LEN"):
                m.d.sync += [k.eq(0), streams.eq(0), has_l1.eq(0), written.eq(0),
                             div_q.eq(n_elems), div_r.eq(0), div_n.eq(0)]
                with m.If((n_uops == 0) | (n_uops > IM) | (n_elems == 0)
                          | (n_elems > cfg.max_elems)):
                    finish(Status.BAD_LENGTH)
                with m.Else():
                    m.next = "V_DIV"

            with m.State("V_DIV"):
                self._words_and_tail(m, cfg, n_elems, n_words, tail_mask, div_q, div_r, div_n,
                                     done_state="V_FETCH")

            with m.State("V_FETCH"):
                m.next = "V_CHECK"

            with m.State("V_CHECK"):
                m.d.comb += slot_w.addr.eq(k)
                self._check_uop(m, cfg, f, n_words, streams, has_l1, written, slot_w, finish,
                                mul_acc, mul_cand, mul_plier)

            with m.State("V_GROUP"):
                # shift-add: mul_acc = (mem_words - addr) * (param * L)
                with m.If(mul_plier == 0):
                    with m.If(n_words - 1 >= mul_acc):
                        finish(Status.BAD_ADDR)
                    with m.Else():
                        m.next = "V_NEXT"
                with m.Else():
                    with m.If(mul_plier[0]):
                        m.d.sync += mul_acc.eq(mul_acc + mul_cand)
                    m.d.sync += [mul_plier.eq(mul_plier >> 1), mul_cand.eq(mul_cand << 1)]

            with m.State("V_NEXT"):
                m.d.sync += k.eq(k + 1)
                with m.If(k == n_uops - 1):
                    m.next = "V_END"
                with m.Else():
                    m.next = "V_FETCH"

            with m.State("V_END"):
                with m.If(streams > cfg.max_streams):
                    finish(Status.TOO_MANY_STREAMS)
                with m.Else():
                    m.d.comb += [acc_clear.eq(1), iss_start.eq(1)]
                    m.d.sync += [base.eq(0), x_passes.eq(0)]
                    m.next = "X_BLOCK"

            with m.State("X_BLOCK"):
                left = n_words - base
                m.d.sync += [k.eq(0), blen.eq(Mux(left >= D, D, left)),
                             last_block.eq(left <= D)]
                m.next = "X_FETCH"

            with m.State("X_FETCH"):
                m.next = "X_LOAD"

            with m.State("X_LOAD"):
                m.d.sync += [cur_op.eq(f.op), cur_rsrc.eq(f.rsrc), cur_store.eq(f.store),
                             cur_d.eq(f.d), cur_p.eq(f.p), cur_q.eq(f.q), cur_r.eq(f.r),
                             st_addr.eq(f.addr + base),
                             i_cnt.eq(0), j_cnt.eq(0), s_cnt.eq(0)]
                m.next = "X_RUN"

            with m.State("X_RUN"):
                m.d.comb += run.eq(1)
                with m.If(Mux(read_pass, j_cnt == blen, (i_cnt == blen) & (used == 0))
                          & pipe_empty):
                    m.next = "X_END"

            with m.State("X_END"):
                # the next micro-op is read now, so X_LOAD follows directly
                m.d.sync += x_passes.eq(x_passes + 1)
                with m.If(k == n_uops - 1):
                    left = n_words - (base + blen)
                    m.d.comb += imem_x.addr.eq(0)
                    m.d.sync += [k.eq(0), base.eq(base + blen),
                                 blen.eq(Mux(left >= D, D, left)), last_block.eq(left <= D)]
                    with m.If(~last_block):
                        m.next = "X_LOAD"
                    with m.Elif(has_l1):
                        m.d.sync += [sum_acc.eq(0), sum_j.eq(0)]
                        m.next = "X_SUM"
                    with m.Else():
                        finish(Status.OK)
                with m.Else():
                    m.d.comb += imem_x.addr.eq(k + 1)
                    m.d.sync += k.eq(k + 1)
                    m.next = "X_LOAD"

            with m.State("X_SUM"):
                # lanes summed in order 0..L-1 in fp32 (ISA), starting from +0
                m.d.sync += [sum_acc.eq(l1_add.y), sum_j.eq(sum_j + 1)]
                with m.If(sum_j == L - 1):
                    finish(Status.OK, l1_add.y)

            with m.State("FINISH"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"

        # ---- issue side: read requests of every read pass, up to RF words ahead ------------
        fi = _fields(imem_i.data)
        with m.FSM(name="issue"):
            with m.State("I_IDLE"):
                with m.If(iss_start):
                    m.d.sync += [ibase.eq(0), i_passes.eq(0), fresh.eq(1)]
                    m.next = "I_BLOCK"

            with m.State("I_BLOCK"):
                left = n_words - ibase
                m.d.sync += [ik.eq(0), iblen.eq(Mux(left >= D, D, left))]
                m.next = "I_FETCH"

            with m.State("I_FETCH"):
                m.next = "I_LOAD"

            with m.State("I_LOAD"):
                m.d.sync += [i_rsrc.eq(fi.rsrc), i_store.eq(fi.store), i_addr.eq(fi.addr),
                             i_param.eq(fi.param), icnt.eq(0), par_i.eq(ibase[0]),
                             ra.eq(slot_r.data[0:ADDR_BITS]),
                             ph.eq(slot_r.data[ADDR_BITS:ADDR_BITS + PARAM_BITS]),
                             elane.eq(slot_r.data[ADDR_BITS + PARAM_BITS:])]
                with m.If(~fresh | (outstanding == 0)):
                    m.next = "I_RUN"

            with m.State("I_RUN"):
                m.d.comb += issuing.eq(i_rsrc != RSrc.BUF)
                m.d.sync += fresh.eq(0)
                with m.If(i_rsrc != RSrc.BUF):
                    with m.If(icnt == iblen):
                        m.next = "I_END"
                with m.Elif(i_store):
                    # reads after a store pass go out only after its last store
                    with m.If(x_passes == (i_passes + 1)[:PASS_BITS]):
                        m.next = "I_END"
                with m.Else():
                    m.next = "I_END"

            with m.State("I_END"):
                m.d.comb += [slot_w.en.eq(1), slot_w.data.eq(Cat(ra, ph, elane))]
                m.d.sync += [ik.eq(ik + 1), i_passes.eq(i_passes + 1)]
                with m.If(ik == n_uops - 1):
                    m.d.sync += ibase.eq(ibase + iblen)
                    with m.If(n_words - ibase <= D):
                        m.next = "I_IDLE"
                    with m.Else():
                        m.next = "I_BLOCK"
                with m.Else():
                    m.next = "I_FETCH"

        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") & ~fsm.ongoing("FINISH"))
        m.d.comb += self.dbg_fu_toggles.eq(self._toggle_counter(m, lanes))
        return m

    # ------------------------------------------------------------------------------------
    @staticmethod
    def _words_and_tail(m, cfg, n_elems, n_words, tail_mask, div_q, div_r, div_n, done_state):
        """W = ceil(N/L) and the tail lane mask: a shift for a power-of-two L, else a
        restoring divider (one quotient bit per cycle, 32 cycles)."""
        L = cfg.lanes
        if L & (L - 1) == 0:
            sh = ceil_log2(L)
            rem = n_elems[:sh] if sh else Const(0, 1)
            m.d.sync += [n_words.eq((n_elems + (L - 1)) >> sh),
                         tail_mask.eq(Cat(*[(rem == 0) | (rem > j) for j in range(L)]))]
            m.next = done_state
            return
        with m.If(div_n == 32):
            m.d.sync += [n_words.eq(div_q + (div_r != 0)),
                         tail_mask.eq(Cat(*[(div_r == 0) | (div_r > j) for j in range(L)]))]
            m.next = done_state
        with m.Else():
            trial = Cat(div_q[31], div_r)    # (rem << 1) | next dividend bit
            fits = trial >= L
            m.d.sync += [div_r.eq(Mux(fits, trial - L, trial)),
                         div_q.eq(Cat(fits, div_q[:31])), div_n.eq(div_n + 1)]

    @staticmethod
    def _check_uop(m, cfg, f, n_words, streams, has_l1, written, slot_w, finish, mul_acc,
                   mul_cand, mul_plier):
        """One micro-op of :func:`coda.hw.isa.validate` (opcode, operand, address order);
        also initialises the micro-op's stream phase record and marks its ``d`` in the
        ``written`` mask (nbuf bits) that the later micro-ops' reads are checked against."""
        NB, L = cfg.nbuf, cfg.lanes
        op_f, rsrc_f, store_f, addr_f, param_f = f.op, f.rsrc, f.store, f.addr, f.param
        d_f, p_f, q_f, r_f = f.d, f.p, f.q, f.r
        bad_opcode = (op_f > max(Op)) | (rsrc_f > max(RSrc))
        is_l1 = op_f == Op.L1
        d_used = ~store_f & ~is_l1
        p_used = (op_f >= Op.ADD) & (op_f <= Op.L1)
        q_used = op_f == Op.MAC
        r_used = rsrc_f == RSrc.BUF
        bad_buf = ((d_used & (d_f >= NB)) | (p_used & (p_f >= NB)) | (q_used & (q_f >= NB))
                   | (r_used & (r_f >= NB)))

        def unwritten(idx):
            # an index >= NB matches no bit: it is already bad_buf
            return ~Cat(*[written[b] & (idx == b) for b in range(NB)]).any()

        bad_read = ((p_used & unwritten(p_f)) | (q_used & unwritten(q_f))
                    | (r_used & unwritten(r_f)))
        bad_operand = (bad_buf | (store_f & ((rsrc_f != RSrc.BUF) | is_l1))
                       | ((rsrc_f == RSrc.CHAN) & (param_f == 0)) | bad_read)
        is_mem = store_f | (rsrc_f != RSrc.BUF)
        group_scaled = (rsrc_f == RSrc.GROUP) & (param_f != 0)
        extent = Signal(33)
        with m.If(store_f | (rsrc_f == RSrc.MEM)):
            m.d.comb += extent.eq(n_words)
        with m.Elif(rsrc_f == RSrc.CHAN):
            m.d.comb += extent.eq(param_f)
        with m.Elif(rsrc_f == RSrc.INT8):
            m.d.comb += extent.eq((n_words + 1) >> 1)
        with m.Elif(rsrc_f == RSrc.GROUP):
            m.d.comb += extent.eq(1)         # scalar; the scaled case is V_GROUP
        bad_addr = is_mem & (addr_f + extent > cfg.mem_words)

        m.d.comb += [slot_w.en.eq(1), slot_w.data.eq(Cat(addr_f, Const(0, PARAM_BITS + 6)))]
        m.d.sync += [streams.eq(streams + is_mem), has_l1.eq(has_l1 | is_l1),
                     written.eq(written | Cat(*[d_used & (d_f == b) for b in range(NB)]))]
        with m.If(bad_opcode):
            finish(Status.BAD_OPCODE)
        with m.Elif(bad_operand):
            finish(Status.BAD_OPERAND)
        with m.Elif(bad_addr):               # also GROUP with addr >= mem_words
            finish(Status.BAD_ADDR)
        with m.Elif(group_scaled):
            m.d.sync += [mul_acc.eq(0), mul_cand.eq(cfg.mem_words - addr_f),
                         mul_plier.eq(param_f * L)]
            m.next = "V_GROUP"
        with m.Else():
            m.next = "V_NEXT"

    @staticmethod
    def _stream_advance(m, cfg, issue, rsrc, param, addr, ra, ph, elane, par_i):
        """Next read address and CHAN/GROUP/INT8 phase after issuing one read."""
        L = cfg.lanes
        with m.If(issue):
            m.d.sync += par_i.eq(~par_i)
            with m.Switch(rsrc):
                with m.Case(RSrc.MEM):
                    m.d.sync += ra.eq(ra + 1)
                with m.Case(RSrc.CHAN):
                    with m.If(ph == param - 1):
                        m.d.sync += [ph.eq(0), ra.eq(addr)]
                    with m.Else():
                        m.d.sync += [ph.eq(ph + 1), ra.eq(ra + 1)]
                with m.Case(RSrc.INT8):
                    with m.If(par_i):
                        m.d.sync += ra.eq(ra + 1)
                with m.Case(RSrc.GROUP):
                    with m.If((param != 0) & (ph == param - 1)):
                        m.d.sync += ph.eq(0)
                        with m.If(elane == L - 1):
                            m.d.sync += [elane.eq(0), ra.eq(ra + 1)]
                        with m.Else():
                            m.d.sync += elane.eq(elane + 1)
                    with m.Elif(param != 0):
                        m.d.sync += ph.eq(ph + 1)

    @staticmethod
    def _lanes_stage1(m, cfg, lanes, buf_rd, rsp1, half1, elane1, last1, tail_mask, v1,
                      cur_op, cur_rsrc, cur_p, cur_q, cur_r, acc_clear):
        """Stage-1 operands of every lane (P, Q, R selection) and the per-pass controls."""
        L = cfg.lanes
        fmt = fp_format(cfg.fmt)
        rd = Array([rp.data for rp in buf_rd])
        p_word, q_word, r_word = rd[cur_p], rd[cur_q], rd[cur_r]
        group_elem = rsp1.word_select(elane1, 16)
        for j, lane in enumerate(lanes):
            conv = Int8ToFP(fmt)
            m.submodules[f"int8_{j}"] = conv
            m.d.comb += conv.a.eq(Mux(half1, rsp1[8 * (L + j):8 * (L + j) + 8],
                                      rsp1[8 * j:8 * j + 8]))
            r_val = Signal(16, name=f"r_lane{j}")
            with m.Switch(cur_rsrc):
                with m.Case(RSrc.BUF):
                    m.d.comb += r_val.eq(r_word[16 * j:16 * j + 16])
                with m.Case(RSrc.GROUP):
                    m.d.comb += r_val.eq(group_elem)
                with m.Case(RSrc.INT8):
                    m.d.comb += r_val.eq(conv.y)
                with m.Default():
                    m.d.comb += r_val.eq(rsp1[16 * j:16 * j + 16])
            m.d.comb += [
                lane.p.eq(p_word[16 * j:16 * j + 16]), lane.q.eq(q_word[16 * j:16 * j + 16]),
                lane.r.eq(r_val), lane.v1.eq(v1), lane.m1.eq(~last1 | tail_mask[j]),
                lane.op_mul.eq((cur_op == Op.MUL) | (cur_op == Op.MAC)),
                lane.mul_a_q.eq(cur_op == Op.MAC),
                lane.op_add.eq((cur_op == Op.ADD) | (cur_op == Op.SUB) | (cur_op == Op.MAC)),
                lane.add_b_mul.eq(cur_op == Op.MAC),
                lane.sub.eq(cur_op == Op.SUB),
                lane.op_l1.eq(cur_op == Op.L1),
                lane.res_sel.eq(Mux(cur_op == Op.MOV, RES_R,
                                    Mux(cur_op == Op.MUL, RES_PROD, RES_SUM))),
                lane.acc_clear.eq(acc_clear),
            ]

    @staticmethod
    def _clock_gates(m, enables):
        """One clock gate per lane domain of :data:`GATED_DOMAINS`: the domain's clock is
        ``clk & gate`` where ``gate`` samples ``enable | rst`` on the falling edge (so it is
        stable while ``clk`` is high: no glitch), and the domain shares the NME's reset."""
        # the domains' clock and reset go through nets named clk / rst: without them the
        # NME's ports, once it is a submodule (the DIMM-NMP rank), take an alias's name
        # (lane_gate_clk, lane_s2_rst)
        clk, rst = Signal(name="clk"), Signal(name="rst")
        m.d.comb += [clk.eq(ClockSignal("sync")), rst.eq(ResetSignal("sync"))]
        m.domains.lane_gate = ClockDomain("lane_gate", clk_edge="neg", reset_less=True,
                                          local=True)
        m.d.comb += ClockSignal("lane_gate").eq(clk)
        for name, enable in zip(GATED_DOMAINS, enables):
            m.domains += ClockDomain(name, local=True)
            gate = Signal(name=f"{name}_gate", init=1)
            m.d.lane_gate += gate.eq(enable | rst)
            m.d.comb += [ClockSignal(name).eq(clk & gate), ResetSignal(name).eq(rst)]

    @staticmethod
    def _toggle_counter(m, lanes):
        """dbg_fu_toggles: lane counts summed (registered), then a saturating accumulate."""
        total = Signal(16)
        m.d.sync += total.eq(sum_tree([lane.toggles for lane in lanes]))
        count = Signal(32)
        nxt = Signal(33)
        m.d.comb += nxt.eq(count + total)
        m.d.sync += count.eq(Mux(nxt[32], 0xFFFF_FFFF, nxt[:32]))
        return count


def sum_tree(values):
    """Balanced adder tree over ``values`` (unsigned)."""
    level = list(values)
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]
