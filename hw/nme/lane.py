"""One SIMD lane of the NME: FPMul then FPAdd in series, and the fp32 |a-b| accumulator.

:class:`NMELane` is a pipeline fed by the NME's stage-1 operands ``p``, ``q``, ``r`` (one
element each, format bit patterns): 3 stages plus the accumulator's with combinational units,
more with pipelined ones (:class:`coda.hw.nme.iface.LaneTiming`). Each ``+ - *`` is one
IEEE-754 operation of :mod:`coda.hw.nme.fp` (two roundings for MAC, as the ISA requires).
Operand isolation, the toggle counters and the clock gates (:data:`GATED_DOMAINS`) change
which registers load or switch, never the lane's outputs; :class:`NMELane` has the stage
table and the details.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from coda.hw.nme.fp import FP32, FPAdd, FPFormat, FPMul, FPWiden
from coda.hw.nme.iface import LaneTiming

__all__ = ["NMELane", "RES_R", "RES_PROD", "RES_SUM", "popcount", "GATED_DOMAINS"]

#: Clock domains of a gated lane's registers, one per group that loads together: stage-2
#: operands (P, R), FPMul operands, FPAdd operands, the stage-3 bypass, the L1 subtractor's
#: operands, its result (stage 4) and the accumulator.
GATED_DOMAINS = ("lane_s2", "lane_mul", "lane_add", "lane_s3", "lane_l1", "lane_s4", "lane_acc")

# y selection (``res_sel``): which stage-3 value is the lane's result.
RES_R = 0      # MOV
RES_PROD = 1   # MUL
RES_SUM = 2    # ADD, SUB, MAC


def popcount(value) -> "Value":
    """Number of 1 bits of ``value`` as a balanced adder tree (width grows by 1 per level)."""
    bits = [value[i] for i in range(len(value))]
    if not bits:
        return Const(0, 1)
    level = [b.as_unsigned() for b in bits]
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


class NMELane(wiring.Component):
    """One lane's datapath.

    The lane is a pipeline fed by the NME's stage-1 operands ``p``, ``q``, ``r`` (one element
    each, format bit patterns). With combinational units (``mul_latency = add_latency = 0``) it
    has 3 stages plus the accumulator's:

    ====== ==================================================================================
    stage  what happens
    ====== ==================================================================================
    S1     operands arrive; the FPMul operand registers load (MUL: P, R; MAC: Q, R)
    S2     ``prod = FPMul(mul_a, mul_b)``; the FPAdd operand registers load
           (ADD/SUB: P, R; MAC: P, prod) and the L1 subtractor's widened operands load
    S3     ``sum = FPAdd(add_a, add_b, sub)``; ``y`` is valid (MOV: R, MUL: prod, else sum);
           L1: ``|f32(P) - f32(R)|`` loads the accumulator's operand register
    S4     L1: ``acc += |d|`` (fp32)
    ====== ==================================================================================

    Pipelined units (:class:`coda.hw.nme.iface.LaneTiming`, from ``NMEConfig.mul_latency`` =
    ``lm`` and ``add_latency`` = ``la``) stretch it: the product is valid in stage ``2 + lm``
    (P and R wait beside FPMul in delay registers), ``y`` in ``3 + lm + la`` (the MOV/MUL
    bypass waits beside FPAdd), ``|d|`` in ``3 + la`` and the accumulate writes in ``4 + 2 la``.
    The accumulate is a recurrence through FPAdd, so the NME feeds an L1 pass one word every
    ``la + 1`` cycles. The words of an L1 pass carry their own valid bit down the L1 path (it
    runs on after the pass's result stage, into the next pass).

    Each ``+ - *`` is one IEEE-754 operation of :mod:`coda.hw.nme.fp` (two roundings for MAC, as the
    ISA requires). With operand isolation the operand registers of a functional unit load only
    when the lane holds a valid element and the current micro-op uses that unit; without it they
    load every cycle. With ``measure_toggles`` (a simulation-only option: the shadow registers are
    not part of the synthesised lane), ``toggles`` counts the bits of those registers that changed
    in the previous cycle (from shadow copies, so the count sits beside the datapath, not on it).

    Clock gating (``gated=True``, with operand isolation only): the data registers are clocked by
    the gated clocks :data:`GATED_DOMAINS` that the NME provides (see :class:`coda.hw.nme.top.NME`),
    one per register group, each running only in cycles in which its group may load (the FPMul
    operands when a stage-1 word is valid and the micro-op multiplies, and so on); the valid bits
    stay on the free-running clock, and FPAdd's ``sub`` is registered with its operands (as
    without gating) so that every functional unit's inputs come from one gated clock. Every
    register loads under the same condition as without gating, so the lane's outputs
    (``toggles`` included: the shadow registers stay on the free-running clock) are identical
    cycle by cycle. A functional unit's logic thus only switches in the cycles it works, and a
    Verilated model only evaluates it then.

    Parameters:
        fmt: element format (:class:`coda.hw.nme.fp.FPFormat`, 16 bits wide).
        operand_isolation: gate the FU operand registers (see above).
        gated: clock the data registers from :data:`GATED_DOMAINS` (with operand isolation
            only; ignored without it).
        measure_toggles: add the ``toggles`` output and its shadow registers (simulation only).
        timing: :class:`coda.hw.nme.iface.LaneTiming`: the register stages of FPMul and of
            the FPAdds (default: combinational units); the lane counts its stages from its
            operands' arrival, so ``timing.operand_latency`` (the NME's, in front of the
            lane) does not change it.

    Members (each control is read in the stage of the word it belongs to: the NME delays
    them with the words, so a pass may follow another without draining the lane):
        op_mul, mul_a_q: In(1), read in S1: the op uses FPMul; its ``a`` is Q (MAC) rather
            than P.
        op_add, add_b_mul, sub: In(1), read in the add stage (``timing.add_stage``, S2
            with combinational units): the op uses FPAdd; its ``b`` is the product (MAC)
            rather than R; subtract (SUB).
        op_l1: In(1), read in S2: the op accumulates ``|f32(P) - f32(R)|``.
        res_sel: In(2), read in the add stage: ``RES_R``, ``RES_PROD`` or ``RES_SUM``.
        v1: In(1): a word is in stage 1; m1: In(1): this lane of it is valid (not tail-masked).
        p, q, r: In(16): stage-1 operands.
        y: Out(16): the result (valid ``timing.result_stage - 1`` cycles after ``v1``: 2
            with combinational units).
        acc_clear: In(1): set the accumulator to +0 (program start).
        acc: Out(32): fp32 accumulator bits.
        toggles: Out(8), with ``measure_toggles`` only: operand-register bit toggles seen in
            the previous cycle (<= 160).

    Raises:
        TypeError: ``fmt`` is not an FPFormat, or ``timing`` not a LaneTiming.
        ValueError: a format that is not 16 bits wide; a latency out of range.
    """

    def __init__(self, fmt: FPFormat, operand_isolation: bool = True, gated: bool = False,
                 measure_toggles: bool = False, timing: LaneTiming = LaneTiming()):
        if not isinstance(fmt, FPFormat):
            raise TypeError(f"fmt={fmt!r}: expected a coda.hw.nme.fp.FPFormat")
        self.fmt = fmt
        if fmt.width != 16:
            raise ValueError(f"fmt={fmt.name}: expected a 16-bit element format (bf16, fp16)")
        self.operand_isolation = bool(operand_isolation)
        # without operand isolation the operand registers load every cycle: no clock may stop
        self.gated = bool(gated) and self.operand_isolation
        self.measure_toggles = bool(measure_toggles)
        if not isinstance(timing, LaneTiming):
            raise TypeError(f"timing={timing!r}: expected a coda.hw.nme.iface.LaneTiming")
        self.timing = timing.lane   # stages counted from the operands' arrival (stage 1)
        members = {
            "op_mul": In(1), "mul_a_q": In(1), "op_add": In(1), "add_b_mul": In(1),
            "sub": In(1), "op_l1": In(1), "res_sel": In(2),
            "v1": In(1), "m1": In(1), "p": In(16), "q": In(16), "r": In(16),
            "y": Out(16), "acc_clear": In(1), "acc": Out(32),
        }
        if self.measure_toggles:
            members["toggles"] = Out(8)
        super().__init__(members)

    def _load_when(self, valid, lane_ok, used):
        """Load enable of an FU operand register: always, or only when it does useful work."""
        return (valid & lane_ok & used) if self.operand_isolation else Const(1, 1)

    def elaborate(self, platform):
        m = Module()
        fmt = self.fmt
        t = self.timing
        lm, la = t.mul_latency, t.add_latency
        m.submodules.mul = mul = FPMul(fmt, lm)
        m.submodules.add = add = FPAdd(fmt, la)
        m.submodules.widen_p = widen_p = FPWiden(fmt, FP32)
        m.submodules.widen_r = widen_r = FPWiden(fmt, FP32)
        m.submodules.diff = diff = FPAdd(FP32, la)
        m.submodules.accum = accum = FPAdd(FP32, la)

        d2, dmul, dadd, d3, dl1, d4, dacc = (GATED_DOMAINS if self.gated
                                             else ("sync",) * len(GATED_DOMAINS))

        # valid and lane-mask bits of every stage: vs[k], ms[k] (stage 1 = the inputs)
        last = max(t.result_stage, t.acc_stage)
        vs, ms = [None, self.v1], [None, self.m1]
        for k in range(2, last + 1):
            v, mk = Signal(name=f"v{k}"), Signal(name=f"m{k}")
            m.d.sync += [v.eq(vs[-1]), mk.eq(ms[-1])]
            vs.append(v)
            ms.append(mk)

        # S1 -> S2
        mul_a, mul_b = Signal(16), Signal(16)
        p2, r2 = Signal(16), Signal(16)
        with m.If(self._load_when(self.v1, self.m1, self.op_mul)):
            m.d[dmul] += [mul_a.eq(Mux(self.mul_a_q, self.q, self.p)), mul_b.eq(self.r)]
        with m.If(self.v1):
            m.d[d2] += [p2.eq(self.p), r2.eq(self.r)]
        m.d.comb += [mul.a.eq(mul_a), mul.b.eq(mul_b)]

        # P and R wait beside FPMul's stages: pk, rk are P, R in stage add_stage
        pk, rk = p2, r2
        for k in range(3, t.add_stage + 1):
            pn, rn = Signal(16, name=f"p{k}"), Signal(16, name=f"r{k}")
            with m.If(vs[k - 1]):
                m.d.sync += [pn.eq(pk), rn.eq(rk)]
            pk, rk = pn, rn

        # add_stage -> add_stage + 1: FPAdd operands, the MOV/MUL bypass
        ks = t.add_stage
        add_a, add_b, add_sub = Signal(16), Signal(16), Signal()
        bypass = Signal(16, name=f"bypass{ks + 1}")
        take_sum = Signal(name=f"take_sum{ks + 1}")     # y is FPAdd's result
        with m.If(self._load_when(vs[ks], ms[ks], self.op_add)):
            m.d[dadd] += [add_a.eq(pk), add_b.eq(Mux(self.add_b_mul, mul.y, rk)),
                          add_sub.eq(self.sub)]
        with m.If(vs[ks]):
            m.d[d3] += [bypass.eq(Mux(self.res_sel == RES_PROD, mul.y, rk)),
                        take_sum.eq(self.res_sel == RES_SUM)]
        # the bypass and the result selection wait beside FPAdd's stages
        for k in range(ks + 2, t.result_stage + 1):
            bn, tn = Signal(16, name=f"bypass{k}"), Signal(name=f"take_sum{k}")
            with m.If(vs[k - 1]):
                m.d.sync += [bn.eq(bypass), tn.eq(take_sum)]
            bypass, take_sum = bn, tn
        m.d.comb += [add.a.eq(add_a), add.b.eq(add_b), add.sub.eq(add_sub)]
        m.d.comb += self.y.eq(Mux(take_sum, add.y, bypass))

        # L1, S2 -> S3: the widened operands. The L1 path runs past the result stage, into
        # the next pass, so its words carry their own valid bit (lv[k]: a valid, unmasked
        # word of an L1 pass in stage k), not the current micro-op's.
        lv = {2: Signal(name="l1v2")}
        m.d.comb += lv[2].eq(vs[2] & ms[2] & self.op_l1)
        for k in range(3, t.acc_stage + 1):
            lv[k] = Signal(name=f"l1v{k}")
            m.d.sync += lv[k].eq(lv[k - 1])
        l1_a, l1_b = Signal(32), Signal(32)
        m.d.comb += [widen_p.a.eq(p2), widen_r.a.eq(r2)]
        with m.If(self._load_when(vs[2], ms[2], self.op_l1)):
            m.d[dl1] += [l1_a.eq(widen_p.y), l1_b.eq(widen_r.y)]

        # diff_stage -> diff_stage + 1: |f32(P) - f32(R)|, the sign bit cleared (|NaN| stays
        # a NaN)
        m.d.comb += [diff.a.eq(l1_a), diff.b.eq(l1_b), diff.sub.eq(1)]
        l1_d = Signal(32)
        kd = t.diff_stage
        with m.If(self._load_when(lv[kd], 1, 1)):
            m.d[d4] += l1_d.eq(Cat(diff.y[:31], Const(0, 1)))

        # acc_stage: the accumulator (its words come every l1_gap cycles, so the sum of the
        # previous word is in ``acc`` before the next one enters FPAdd)
        acc = Signal(32)
        m.d.comb += [accum.a.eq(acc), accum.b.eq(l1_d), accum.sub.eq(0), self.acc.eq(acc)]
        with m.If(self.acc_clear):
            m.d[dacc] += acc.eq(0)
        with m.Elif(lv[t.acc_stage]):
            m.d[dacc] += acc.eq(accum.y)

        if self.measure_toggles:
            self._count_toggles(m, [mul_a, mul_b, add_a, add_b, l1_a, l1_b, l1_d])
        return m

    def _count_toggles(self, m, regs):
        """Shadow each operand register one cycle late; count differing bits (registered)."""
        flips = []
        for reg in regs:
            shadow = Signal.like(reg, name=f"{reg.name}_prev")
            m.d.sync += shadow.eq(reg)
            flips.append(reg ^ shadow)
        m.d.sync += self.toggles.eq(popcount(Cat(*flips)))
