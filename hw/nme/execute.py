"""The NME's execution: strip-mined passes over the buffers and streams, through the lanes.

:class:`NMEExec` is the sequencer (FSM ``execute``: for each block of ``depth`` words, for each
micro-op, one *pass* over the block) and the datapath (``nbuf`` buffers, the operand selection,
the lanes of :class:`coda.hw.nme.lane.NMELane`, the store FIFO, the L1 sum). Every word carries
its pass's controls down the pipeline (:data:`PASS_CONTROL`), so a pass hands over to the next
in the cycle its last word enters unless it must drain the lanes first; :class:`NMEExec` has the
sequence, the store path, the hand-over rule and the datapath. docs/nme.md ("Passes overlap")
explains the read-after-write argument.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import (Array, Cat, ClockDomain, ClockSignal, Const, Module, Mux, ResetSignal,
                          Signal)
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from coda.hw.nme.fp import FP32, FPAdd, Int8ToFP, fp_format
from coda.hw.nme.isa import ADDR_BITS, NMEConfig, Op, RSrc
from coda.hw.nme.lane import GATED_DOMAINS, RES_PROD, RES_R, RES_SUM, NMELane
from coda.hw.nme.iface import (PASS_BITS, UOP_INDEX_BITS, LaneTiming, UopFields, UopRead,
                        response_signature, store_signature)

__all__ = ["NMEExec", "PASS_CONTROL", "sum_tree"]

#: A pass's controls, decoded from its micro-op at a word's entry, as they travel down the
#: pipeline with the word: the operand selection's (R's source, the buffers read as P, Q,
#: R), the lanes' (FPMul used, its ``a`` from Q; FPAdd used, its ``b`` the product,
#: subtract; L1; the result selection) and the result stage's (write buffer ``d``, or the
#: store FIFO).
PASS_CONTROL = data.StructLayout({
    "rsrc": 3, "p": 4, "q": 4, "r": 4,
    "op_mul": 1, "mul_a_q": 1, "op_add": 1, "add_b_mul": 1, "sub": 1, "op_l1": 1,
    "res_sel": 2, "write_buf": 1, "store": 1, "d": 4})


class NMEExec(wiring.Component):
    """Execution sequencer and datapath of one NME.

    Sequencer (FSM ``execute``): for each block of ``depth`` words (``X_BLOCK``), for each micro-op
    (``X_FETCH``/``X_LOAD``), one *pass* over the block (``X_RUN``, then ``X_END``). A pass whose R
    operand comes from memory takes one read response per cycle from the issue side's response
    stream; a pass with R from a buffer feeds one word per cycle; with ``store`` its results go
    through an 8-word FIFO to the memory request register (the store stream; each word's address
    and last-word flag go into a FIFO of their own as it enters), and words enter the pipeline
    only while that FIFO has room for them (a credit count), so ``mem_req_ready`` back-pressure
    loses nothing (the FIFO holds ``LaneTiming.store_fifo_depth`` words: 8, more for a deep lane
    pipeline). Every word carries its pass's controls down the pipeline
    (:data:`PASS_CONTROL`), so a pass may start while the previous one's words are still in the
    lanes: the next micro-op is read while a pass runs, and the pass hands over to it in the
    cycle its last word enters (the next pass's first word may enter in the next cycle), unless
    it stores and the program's stores may not trail its reads (``trail``; then the issue side
    waits for its last store: memory order), accumulates L1, is the program's last, or its block
    is not longer than the pipeline (``LaneTiming.result_stage`` words); those drain the lanes
    first (``LaneTiming.drain_stage``; and the stores that trail) and end through ``X_END``,
    ``X_LOAD``. That is the buffer read-after-write rule: the next pass's word ``i`` enters at
    least ``blen`` cycles after this pass's word ``i``, which is written ``result_stage < blen``
    cycles after it entered. An L1 pass takes one word every ``LaneTiming.l1_gap`` cycles (the
    accumulate's recurrence). After the last block, ``X_SUM`` adds the lanes' L1 accumulators in
    order 0..L-1 in fp32 when the program has an L1 micro-op, ``add_latency + 1`` cycles per
    lane.

    Datapath: ``nbuf`` buffers of ``depth`` x ``16*lanes`` bits (one synchronous read port, as all
    of P, Q, R read the same word index in a pass, and one write port each); stage 1 selects each
    lane's P, Q, R (buffer word, memory word, per-group element, int8 converted) — stage 2 with
    ``NMEConfig.operand_latency`` 1, where stage 1 only registers every block-RAM output; the
    lanes (:class:`coda.hw.nme.lane.NMELane`) are the stages after it up to the result stage, which
    writes a buffer or the store FIFO. With clock gating every lane register group has its own
    gated clock (:meth:`_clock_gates`).

    Parameters:
        cfg: :class:`coda.hw.nme.isa.NMEConfig` (lanes, fmt, depth, nbuf, operand_isolation).
        clock_gating: clock the lanes' register groups through clock gates (with operand
            isolation only; ignored without it); see :class:`coda.hw.nme.top.NME`.
        measure_toggles: count the FU operand registers' bit toggles (``toggles``; shadow
            registers in every lane: simulation only, not part of the synthesised NME).

    Members (L = ``cfg.lanes``):
        start: In(1): the program was accepted: start the first block (``X_BLOCK``) and
            clear the lanes' L1 accumulators in the next cycle.
        n_uops: In(8), n_words: In(32), tail_mask: In(L), has_l1: In(1), trail: In(1): the
            program (from the intake and the check; ``trail``:
            :func:`coda.hw.nme.check.stores_may_trail`, latched at ``start``).
        uop: Out(:data:`coda.hw.nme.iface.UopRead`): the instruction memory's read port.
        rsp: In(stream.Signature(response_layout(L))): read responses, one word per cycle.
        store: Out(stream.Signature(store_layout(L))): store words with address and mask.
        store_done: In(1): a store request left the NME (returns a store FIFO credit).
        passes: Out(11): passes completed in this program (mod 2**11; the issue side holds
            at a store pass until execution has completed it).
        finish: Out(1): one-cycle pulse at the end of the program; l1: Out(32): fp32 bits of
            the L1 sum in that cycle (0 without an L1 micro-op).
        busy: Out(1): executing (``X_*``).
        toggles: Out(32), with ``measure_toggles`` only: saturating count of bit toggles of
            all FU operand registers of all lanes since reset.

    Raises:
        TypeError: ``cfg`` is not an :class:`NMEConfig`.
    """

    def __init__(self, cfg: NMEConfig, *, clock_gating: bool = False,
                 measure_toggles: bool = False):
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg={cfg!r}: expected a coda.hw.nme.isa.NMEConfig")
        self.cfg = cfg
        self.clock_gating = bool(clock_gating) and cfg.operand_isolation
        self.measure_toggles = bool(measure_toggles)
        L = cfg.lanes
        members = {
            "start": In(1), "n_uops": In(UOP_INDEX_BITS), "n_words": In(32),
            "tail_mask": In(L), "has_l1": In(1), "trail": In(1),
            "uop": Out(UopRead), "rsp": In(response_signature(L)),
            "store": Out(store_signature(L)), "store_done": In(1),
            "passes": Out(PASS_BITS), "finish": Out(1), "l1": Out(32), "busy": Out(1),
        }
        if self.measure_toggles:
            members["toggles"] = Out(32)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        timing = LaneTiming.of(self.cfg)
        buf_rd, buf_wr, fifo, afifo, lanes = self._storage(m, timing)
        r = self._pass_registers(m, timing)
        p = self._pipeline_control(m, r, timing, buf_rd)
        self._lane_controls(m, r, p, timing, lanes, buf_rd)
        self._writeback(m, p, timing, lanes, buf_wr, fifo)
        self._store_stream(m, r, p, fifo, afifo)
        self._word_counters(m, r, p, timing)
        s = self._l1_sum(m, timing, lanes)
        fsm = self._sequencer(m, r, p, s, timing, lanes)
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        if self.measure_toggles:
            m.d.comb += self.toggles.eq(self._toggle_counter(m, lanes))
        return m

    def _storage(self, m, timing):
        """The ``nbuf`` buffers (block RAMs), the store FIFO and its address FIFO, the lanes."""
        cfg = self.cfg
        L, D, NB = cfg.lanes, cfg.depth, cfg.nbuf
        fmt = fp_format(cfg.fmt)
        fifo_depth = timing.store_fifo_depth
        buf_rd, buf_wr = [], []
        for b in range(NB):
            mem = Memory(shape=16 * L, depth=D, init=[])
            m.submodules[f"buf{b}"] = mem
            buf_rd.append(mem.read_port())
            buf_wr.append(mem.write_port())
        m.submodules.store_fifo = fifo = SyncFIFO(width=16 * L, depth=fifo_depth)
        # each store word's address and "last word of the program" flag, pushed as it enters
        # (a store pass may hand over while its stores are still in the lanes)
        m.submodules.store_addr_fifo = afifo = SyncFIFO(width=ADDR_BITS + 1, depth=fifo_depth)
        lanes = []
        for j in range(L):
            lane = NMELane(fmt, cfg.operand_isolation, gated=self.clock_gating,
                           measure_toggles=self.measure_toggles, timing=timing)
            m.submodules[f"lane{j}"] = lane
            lanes.append(lane)
        return buf_rd, buf_wr, fifo, afifo, lanes

    def _pass_registers(self, m, timing):
        """The sequencer's registers: micro-op index, current pass, block, word counters."""
        D = self.cfg.depth
        fifo_depth = timing.store_fifo_depth
        r = SimpleNamespace()
        # current micro-op, block, pass counters
        r.k = Signal(UOP_INDEX_BITS)         # micro-op index
        r.cur_op, r.cur_rsrc, r.cur_store = Signal(4), Signal(3), Signal()
        r.cur_d, r.cur_p, r.cur_q, r.cur_r = Signal(4), Signal(4), Signal(4), Signal(4)
        # R comes from memory (the response stream); an L1 pass: registers loaded with the
        # micro-op (X_LOAD), so no decode of it is in front of ``enter``
        r.read_pass, r.is_l1 = Signal(), Signal()
        r.base = Signal(32)
        # words from the block's start to the end: x_left = W - base; x_rest = W - base - blen
        # (the next block's x_left), a register: base and blen hold still from X_LOAD to X_END
        r.x_left, r.x_rest = Signal(32), Signal(32)
        r.blen = Signal(range(D + 1))
        # the block is longer than the pipeline up to the result stage (set with blen): a
        # pass over it may hand over to the next one as its last word enters (see X_RUN)
        r.long_block = Signal()
        assert timing.result_stage >= 3, \
            "a hand-over needs the next micro-op read 3 cycles into a pass"
        # base + blen (the next block's base), a register like x_rest
        r.base_nx = Signal(32)
        m.d.sync += [r.x_rest.eq(r.x_left - r.blen), r.base_nx.eq(r.base + r.blen)]
        r.last_block = Signal()
        r.i_cnt = Signal(range(D + 1))       # words entered (BUF pass)
        r.j_cnt = Signal(range(D + 1))       # responses taken (read pass)
        # i_cnt < blen, j_cnt < blen as registers (set with the counters: blen holds still
        # from X_LOAD to X_END), so no compare is in front of ``enter``
        r.i_more, r.j_more = Signal(), Signal()
        # the next word to enter is the pass's last (a register, set with the counters)
        r.w_last = Signal()
        r.st_addr = Signal(ADDR_BITS)        # the next entering store word's address
        r.trail = Signal()                   # the program's stores may trail its reads
        r.x_passes = Signal(PASS_BITS)       # passes completed
        r.used = Signal(range(fifo_depth + 1))       # store credits in use
        r.room = Signal(init=1)                      # used < fifo_depth (a register)
        m.d.comb += [self.uop.addr.eq(r.k), self.passes.eq(r.x_passes)]
        # k is the last micro-op (registered: valid from the second cycle after k changed)
        r.k_last = Signal()
        m.d.sync += r.k_last.eq(r.k == self.n_uops - 1)
        # the next micro-op's index (read during X_RUN: its fields wait in ``f`` for the
        # hand-over, from the third cycle of a pass on)
        r.k_nx = Signal(UOP_INDEX_BITS)
        m.d.comb += r.k_nx.eq(Mux(r.k_last, 0, r.k + 1))
        return r

    def _is_long(self, words, timing):
        """A block of ``words`` is longer than the pipeline up to the result stage."""
        n_res = timing.result_stage
        return (words > n_res) if self.cfg.depth > n_res else Const(0)

    def _pipeline_control(self, m, r, timing, buf_rd):
        """Pipeline control: word entry, each stage's valid bit, index, controls, last flag."""
        idx_w = max(1, ceil_log2(self.cfg.depth))
        n_res = timing.result_stage
        run = Signal()                       # in X_RUN
        enter = Signal()                     # a word enters stage 0 this cycle
        gap_ok = Const(1, 1)                 # L1 words come every l1_gap cycles
        if timing.l1_gap > 1:
            gap = Signal(range(timing.l1_gap))
            gap_zero = Signal(init=1)        # gap == 0, a register
            gap_ok = ~r.is_l1 | gap_zero
            with m.If(enter & r.is_l1):
                m.d.sync += [gap.eq(timing.l1_gap - 1), gap_zero.eq(0)]
            with m.Elif(gap != 0):
                m.d.sync += [gap.eq(gap - 1), gap_zero.eq(gap == 1)]
        idx0 = Signal(idx_w)
        last1 = Signal()
        # the lanes' accumulators clear in the cycle after the program's acceptance (X_BLOCK;
        # registered: the check's decision does not fan out to every lane)
        acc_clear = Signal()
        m.d.sync += acc_clear.eq(self.start)
        m.d.comb += [
            enter.eq(run & gap_ok & Mux(r.read_pass, self.rsp.valid & r.j_more,
                                        r.i_more & (~r.cur_store | r.room))),
            self.rsp.ready.eq(enter & r.read_pass),
            idx0.eq(Mux(r.read_pass, r.j_cnt, r.i_cnt)),
        ]
        for rp in buf_rd:
            m.d.comb += rp.addr.eq(idx0)
        # valid bits of every stage (vs[k]) and the word index up to the result stage
        n_l1 = timing.drain_stage(l1=True)
        vs, idxs = [enter], [idx0]
        for st in range(1, max(n_res, n_l1, timing.acc_stage) + 1):
            v = Signal(name=f"v{st}")
            m.d.sync += v.eq(vs[-1])
            vs.append(v)
        for st in range(1, n_res + 1):
            ix = Signal(idx_w, name=f"idx{st}")
            m.d.sync += ix.eq(idxs[-1])
            idxs.append(ix)
        # the pass's controls, decoded from the micro-op at a word's entry and delayed with
        # it (ctls[k]: of the word in stage k), so that a pass may start while the previous
        # one's words are still in the lanes
        ctls = [self._decode_pass(m, r)]
        for st in range(1, n_res + 1):
            c = Signal(PASS_CONTROL, name=f"ctl{st}")
            m.d.sync += c.eq(ctls[-1])
            ctls.append(c)
        m.d.sync += last1.eq(r.last_block & (idx0 == r.blen - 1))
        last_op = last1                      # ... and it is the program's last word
        for st in range(2, timing.operand_stage + 1):
            last_k = Signal(name=f"last{st}")
            m.d.sync += last_k.eq(last_op)
            last_op = last_k
        # the pass ends with its pipeline empty up to the result stage; an L1 pass also up to
        # the stage before the accumulate, which happens in the cycle the pass ends (X_SUM
        # starts two cycles later)
        pipe_empty = Signal()
        m.d.comb += pipe_empty.eq(~Cat(*vs[:n_res + 1]).any()
                                  & (~r.is_l1 | ~Cat(*vs[:n_l1 + 1]).any()))
        return SimpleNamespace(run=run, enter=enter, idx0=idx0, acc_clear=acc_clear, vs=vs,
                               idxs=idxs, ctls=ctls, v_op=vs[timing.operand_stage],
                               last_op=last_op, pipe_empty=pipe_empty)

    def _decode_pass(self, m, r):
        """The current pass's controls (:data:`PASS_CONTROL`) for the word entering."""
        cur_op = r.cur_op
        ctl0 = Signal(PASS_CONTROL)
        m.d.comb += [
            ctl0.rsrc.eq(r.cur_rsrc), ctl0.p.eq(r.cur_p), ctl0.q.eq(r.cur_q),
            ctl0.r.eq(r.cur_r),
            ctl0.op_mul.eq((cur_op == Op.MUL) | (cur_op == Op.MAC)),
            ctl0.mul_a_q.eq(cur_op == Op.MAC),
            ctl0.op_add.eq((cur_op == Op.ADD) | (cur_op == Op.SUB) | (cur_op == Op.MAC)),
            ctl0.add_b_mul.eq(cur_op == Op.MAC),
            ctl0.sub.eq(cur_op == Op.SUB),
            ctl0.op_l1.eq(r.is_l1),
            ctl0.res_sel.eq(Mux(cur_op == Op.MOV, RES_R,
                                Mux(cur_op == Op.MUL, RES_PROD, RES_SUM))),
            ctl0.write_buf.eq(~r.cur_store & ~r.is_l1),
            ctl0.store.eq(r.cur_store),
            ctl0.d.eq(r.cur_d),
        ]
        return ctl0

    def _lane_controls(self, m, r, p, timing, lanes, buf_rd):
        """The lanes' operands and controls, by stage; with clock gating their clock gates."""
        vs, ctls = p.vs, p.ctls
        # the response stream's head, registered every cycle (no enable: ``enter`` does not
        # fan out to it): stage 1 reads it only after a word entered (v1), and then it is
        # that word
        head1 = Signal.like(self.rsp.payload, name="head1")
        m.d.sync += head1.eq(self.rsp.payload)
        ka, kw = timing.add_stage, timing.operand_stage + 1   # kw: the L1 operands load
        c_op, c_add, c_l1 = ctls[timing.operand_stage], ctls[ka], ctls[kw]
        self._lanes_operands(m, lanes, buf_rd, head1, p.last_op, self.tail_mask, p.v_op, c_op,
                             p.acc_clear)
        for lane in lanes:
            m.d.comb += [
                lane.op_mul.eq(c_op.op_mul), lane.mul_a_q.eq(c_op.mul_a_q),
                lane.op_add.eq(c_add.op_add), lane.add_b_mul.eq(c_add.add_b_mul),
                lane.sub.eq(c_add.sub), lane.res_sel.eq(c_add.res_sel),
                lane.op_l1.eq(c_l1.op_l1),
            ]
        if self.clock_gating:
            kd, kc = timing.diff_stage, timing.acc_stage
            # words of an L1 pass, by stage (the L1 path runs on into the next pass)
            l1s = [p.enter & r.is_l1]
            for st in range(1, kc + 1):
                lvs = Signal(name=f"l1v{st}")
                m.d.sync += lvs.eq(l1s[-1])
                l1s.append(lvs)
            self._clock_gates(m, (p.v_op, p.v_op & ctls[timing.operand_stage].op_mul,
                                  vs[ka] & ctls[ka].op_add, vs[ka], vs[kw] & ctls[kw].op_l1,
                                  l1s[kd], l1s[kc] | p.acc_clear))

    def _writeback(self, m, p, timing, lanes, buf_wr, fifo):
        """The result stage: the lanes' results to buffer ``d`` or into the store FIFO."""
        n_res = timing.result_stage
        result = Signal(16 * self.cfg.lanes)
        m.d.comb += result.eq(Cat(*[lane.y for lane in lanes]))
        c_res = p.ctls[n_res]
        for b, wp in enumerate(buf_wr):
            m.d.comb += [wp.addr.eq(p.idxs[n_res]), wp.data.eq(result),
                         wp.en.eq(p.vs[n_res] & c_res.write_buf & (c_res.d == b))]
        m.d.comb += [fifo.w_data.eq(result), fifo.w_en.eq(p.vs[n_res] & c_res.store)]

    def _store_stream(self, m, r, p, fifo, afifo):
        """The store stream (the store FIFOs' heads, tail lanes masked), the store address."""
        L = self.cfg.lanes
        m.d.comb += [
            afifo.w_data.eq(Cat(r.st_addr, r.last_block & r.w_last)),
            afifo.w_en.eq(p.enter & r.cur_store),
            self.store.valid.eq(fifo.r_rdy),
            self.store.payload.addr.eq(afifo.r_data[:ADDR_BITS]),
            self.store.payload.data.eq(fifo.r_data),
            self.store.payload.mask.eq(Mux(afifo.r_data[ADDR_BITS], self.tail_mask,
                                           Const((1 << L) - 1, L))),
            fifo.r_en.eq(self.store.valid & self.store.ready),
            afifo.r_en.eq(self.store.valid & self.store.ready),
        ]
        with m.If(p.enter & r.cur_store):
            m.d.sync += r.st_addr.eq(r.st_addr + 1)

    def _word_counters(self, m, r, p, timing):
        """The pass's word counters (their compares registered), the store credits in use."""
        enter, idx0, blen = p.enter, p.idx0, r.blen
        with m.If(enter & ~r.read_pass):
            m.d.sync += [r.i_cnt.eq(r.i_cnt + 1), r.i_more.eq(r.i_cnt + 1 < blen)]
        with m.If(enter & r.read_pass):
            m.d.sync += [r.j_cnt.eq(r.j_cnt + 1), r.j_more.eq(r.j_cnt + 1 < blen)]
        with m.If(enter):
            m.d.sync += r.w_last.eq(idx0 + 2 == blen)
        used_next = Signal.like(r.used)
        m.d.comb += used_next.eq(r.used + (enter & r.cur_store) - self.store_done)
        m.d.sync += [r.used.eq(used_next), r.room.eq(used_next < timing.store_fifo_depth)]

    @staticmethod
    def _l1_sum(m, timing, lanes):
        """The L1 sum's fp32 adder and registers (running sum, lane, cycle, next lane's)."""
        L = len(lanes)
        sum_acc = Signal(32)
        sum_j = Signal(range(L))
        sum_wait = Signal(range(timing.sum_cycles_per_lane))   # cycles into one lane's add
        m.submodules.l1_sum = l1_add = FPAdd(FP32, timing.add_latency)
        # the accumulator of lane sum_j, registered (loaded when the previous add ends, so
        # the lane multiplexer is not in front of the adder)
        sum_b = Signal(32)
        next_j = Signal(range(L))
        m.d.comb += next_j.eq(Mux(sum_j == L - 1, 0, sum_j + 1))
        next_acc = Array([lane.acc for lane in lanes])[next_j]
        m.d.comb += [l1_add.a.eq(sum_acc), l1_add.b.eq(sum_b), l1_add.sub.eq(0)]
        return SimpleNamespace(acc=sum_acc, j=sum_j, wait=sum_wait, add=l1_add, b=sum_b,
                               next_acc=next_acc)

    def _load_pass(self, m, r, f, words, store_base):
        """Load the micro-op in ``f`` as the current pass over a block of ``words`` words
        whose stores start at ``store_base`` (overrides the counters' updates of this
        cycle)."""
        m.d.sync += [r.cur_op.eq(f.op), r.cur_rsrc.eq(f.rsrc), r.cur_store.eq(f.store),
                     r.read_pass.eq(f.rsrc != RSrc.BUF), r.is_l1.eq(f.op == Op.L1),
                     r.cur_d.eq(f.d), r.cur_p.eq(f.p), r.cur_q.eq(f.q), r.cur_r.eq(f.r),
                     r.st_addr.eq(f.addr + store_base),
                     r.i_cnt.eq(0), r.j_cnt.eq(0),
                     r.i_more.eq(words != 0), r.j_more.eq(words != 0), r.w_last.eq(words == 1)]

    def _next_block(self, m, r, timing):
        """Advance to the next block (its base, length, flags) and its first micro-op;
        returns the next block's length."""
        D = self.cfg.depth
        left = r.x_rest
        words = Mux(left >= D, D, left)
        m.d.sync += [r.k.eq(0), r.base.eq(r.base_nx), r.x_left.eq(left), r.blen.eq(words),
                     r.last_block.eq(left <= D), r.long_block.eq(self._is_long(left, timing))]
        return words

    def _finish(self, m, l1_bits=0):
        """The end of the program: the ``finish`` pulse with the L1 sum's bits."""
        m.d.comb += [self.finish.eq(1), self.l1.eq(l1_bits)]
        m.next = "IDLE"

    def _sequencer(self, m, r, p, s, timing, lanes):
        """The sequencer, FSM ``execute``: blocks, micro-ops, passes, the L1 sum; returned."""
        D, L = self.cfg.depth, self.cfg.lanes
        k, blen, x_left = r.k, r.blen, r.x_left
        f = UopFields(self.uop.data)
        with m.FSM(name="execute") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [r.base.eq(0), x_left.eq(self.n_words), r.x_passes.eq(0),
                                 r.trail.eq(self.trail)]
                    m.next = "X_BLOCK"

            with m.State("X_BLOCK"):
                m.d.sync += [k.eq(0), blen.eq(Mux(x_left >= D, D, x_left)),
                             r.last_block.eq(x_left <= D),
                             r.long_block.eq(self._is_long(x_left, timing))]
                m.next = "X_FETCH"

            with m.State("X_FETCH"):
                m.next = "X_LOAD"

            with m.State("X_LOAD"):
                self._load_pass(m, r, f, blen, r.base)
                m.next = "X_RUN"

            with m.State("X_RUN"):
                m.d.comb += [p.run.eq(1), self.uop.addr.eq(r.k_nx)]
                # A pass that neither stores (unless the stores may trail) nor accumulates
                # L1, is not the program's last and runs over a block longer than the
                # pipeline hands over to the next
                # micro-op (read meanwhile) as its last word enters: the next pass's words
                # enter from the next cycle on, behind this pass's in the lanes. The next
                # pass's word i enters at least blen cycles after this pass's word i, which
                # is written result_stage < blen cycles after its entry: the buffer
                # read-after-write rule. Any other pass ends when its last word entered, its
                # words (and those before) left the lanes and a store pass's last request
                # left (X_END, X_LOAD).
                overlap = ((~r.cur_store | r.trail) & ~r.is_l1 & r.long_block
                           & ~(r.last_block & r.k_last))
                with m.If(p.enter & r.w_last & overlap):
                    m.d.sync += r.x_passes.eq(r.x_passes + 1)
                    with m.If(r.k_last):
                        self._load_pass(m, r, f, self._next_block(m, r, timing), r.base_nx)
                    with m.Else():
                        self._load_pass(m, r, f, blen, r.base)
                        m.d.sync += k.eq(k + 1)
                with m.Elif(Mux(r.read_pass, ~r.j_more, ~r.i_more) & (r.used == 0)
                            & p.pipe_empty):
                    m.next = "X_END"

            with m.State("X_END"):
                # the next micro-op is read now, so X_LOAD follows directly
                m.d.sync += r.x_passes.eq(r.x_passes + 1)
                with m.If(r.k_last):
                    m.d.comb += self.uop.addr.eq(0)
                    self._next_block(m, r, timing)
                    with m.If(~r.last_block):
                        m.next = "X_LOAD"
                    with m.Elif(self.has_l1):
                        m.d.sync += [s.acc.eq(0), s.j.eq(0), s.wait.eq(0),
                                     s.b.eq(lanes[0].acc)]
                        m.next = "X_SUM"
                    with m.Else():
                        self._finish(m)
                with m.Else():
                    m.d.comb += self.uop.addr.eq(k + 1)
                    m.d.sync += k.eq(k + 1)
                    m.next = "X_LOAD"

            with m.State("X_SUM"):
                # lanes summed in order 0..L-1 in fp32 (ISA), starting from +0; each add
                # takes sum_cycles_per_lane cycles (its operands stay put meanwhile)
                with m.If(s.wait == timing.sum_cycles_per_lane - 1):
                    m.d.sync += [s.acc.eq(s.add.y), s.j.eq(s.j + 1), s.wait.eq(0),
                                 s.b.eq(s.next_acc)]
                    with m.If(s.j == L - 1):
                        self._finish(m, s.add.y)
                with m.Else():
                    m.d.sync += s.wait.eq(s.wait + 1)
        return fsm

    def _lanes_operands(self, m, lanes, buf_rd, head, last_op, tail_mask, v_op, ctl,
                        acc_clear):
        """The operands of every lane (P, Q, R selection, in stage
        ``LaneTiming.operand_stage``), their valid and lane-mask bits, the accumulator clear.
        The selection reads ``ctl``, the controls of the word in that stage (passes overlap).

        R from memory comes from ``head``, the registered response (data, INT8 half, GROUP
        element lane): the word's element, the GROUP element, or the int8 converted (both
        halves converted, the half chosen after). With ``operand_latency`` 1 every buffer's
        block-RAM output and the response's elements load a register first (every cycle: no
        enable fans out to them), the int8 conversions have a register stage inside
        (:class:`coda.hw.nme.fp.Int8ToFP` latency 1), and the selection works in stage 2."""
        L = self.cfg.lanes
        fmt = fp_format(self.cfg.fmt)
        late = self.cfg.operand_latency == 1
        words = []
        for b, rp in enumerate(buf_rd):
            if late:
                word = Signal.like(rp.data, name=f"buf{b}_q")
                m.d.sync += word.eq(rp.data)
                words.append(word)
            else:
                words.append(rp.data)
        rd = Array(words)
        p_word, q_word, r_word = rd[ctl.p], rd[ctl.q], rd[ctl.r]
        data = head.data
        group_elem = data.word_select(head.elane, 16)
        half = head.half
        if late:
            # stage 1 registers what the selection of stage 2 picks from: each lane's
            # element, the GROUP element, the half
            data = Signal.like(head.data, name="head2_data")
            group_q = Signal(16, name="head2_group")
            half = Signal(name="head2_half")
            m.d.sync += [data.eq(head.data), group_q.eq(group_elem), half.eq(head.half)]
            group_elem = group_q
        for j, lane in enumerate(lanes):
            # both int8 halves converted (across stages 1 and 2 with ``late``), the half
            # chosen after (it arrives late)
            conv_lo = Int8ToFP(fmt, latency=int(late))
            conv_hi = Int8ToFP(fmt, latency=int(late))
            m.submodules[f"int8_{j}"] = conv_lo
            m.submodules[f"int8_hi_{j}"] = conv_hi
            m.d.comb += [conv_lo.a.eq(head.data[8 * j:8 * j + 8]),
                         conv_hi.a.eq(head.data[8 * (L + j):8 * (L + j) + 8])]
            int8_lo, int8_hi = conv_lo.y, conv_hi.y
            r_mem = Signal(16, name=f"r_mem_lane{j}")
            with m.Switch(ctl.rsrc):
                with m.Case(RSrc.GROUP):
                    m.d.comb += r_mem.eq(group_elem)
                with m.Case(RSrc.INT8):
                    m.d.comb += r_mem.eq(Mux(half, int8_hi, int8_lo))
                with m.Default():
                    m.d.comb += r_mem.eq(data[16 * j:16 * j + 16])
            r_val = Signal(16, name=f"r_lane{j}")
            m.d.comb += r_val.eq(Mux(ctl.rsrc == RSrc.BUF, r_word[16 * j:16 * j + 16], r_mem))
            m.d.comb += [
                lane.p.eq(p_word[16 * j:16 * j + 16]), lane.q.eq(q_word[16 * j:16 * j + 16]),
                lane.r.eq(r_val), lane.v1.eq(v_op), lane.m1.eq(~last_op | tail_mask[j]),
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
        """The lanes' toggle counts summed (registered), then a saturating accumulate."""
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
