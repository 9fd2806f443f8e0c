"""The Near-Memory Engine: command intake, program check, strip-mined execution over streams.

The instruction set, the validation rules and the encodings are :mod:`coda.hw.nme.isa` (binding);
this module is one implementation of it. :class:`NME` only wires four units, each a component
with its own file: :class:`~.intake.NMEIntake` (command words, ``status``/``l1``, ``done``),
:class:`~.check.NMECheck` (exactly :func:`coda.hw.nme.isa.validate`, before any memory access),
:class:`~.execute.NMEExec` (the passes through the buffers and lanes, stores, the L1 sum) and
:class:`~.issue.NMEIssue` (reads issued ahead of execution, the memory request register).
docs/nme.md ("Structure") describes each unit; their interfaces (the micro-op fields, the
instruction memory's read port, the response and store streams) are in :mod:`coda.hw.nme.iface`.

A program goes intake -> check -> execution and issue side in one-cycle hand-overs;
:class:`NME` has them, the reset behaviour and the cycle cost
(:func:`coda.hw.nme.cycles.model_cycles` models it exactly).
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect

from coda.hw.nme.isa import ADDR_BITS, NMEConfig
from coda.hw.nme.check import NMECheck
from coda.hw.nme.execute import NMEExec
from coda.hw.nme.iface import STORE_FIFO_DEPTH
from coda.hw.nme.intake import NMEIntake
from coda.hw.nme.issue import NMEIssue

__all__ = ["NME", "STORE_FIFO_DEPTH"]


class NME(wiring.Component):
    """One Near-Memory Engine (clock domain ``sync``; Verilog ports ``clk``, ``rst``).

    A program goes intake -> check (``loaded``) -> execution and issue side (``accept``) or back
    to the intake (``reject``); execution's ``finish`` ends it. Each hand-over is a one-cycle
    pulse after which the next unit starts in the next cycle, so the units together run the
    single sequence ``IDLE, LOAD, V_LEN .. V_END, X_BLOCK .. X_SUM, done`` cycle for cycle.

    Reset: the synchronous ``rst`` returns everything to idle. Read responses still in flight
    from before a reset are counted by a reset-less counter; they find no tag and are dropped,
    and a program's first read waits until none is outstanding.

    Cycle cost (memory always ready, read latency ``lat``;
    :func:`coda.hw.nme.cycles.model_cycles` is this model, checked exactly against Verilator
    counts): intake ``n_uops + 1``; check ``3 * n_uops + 3`` (32 more when ``lanes`` is not a
    power of two, ``bitlen(param*L) + 2`` more per scaled GROUP micro-op); execution ``2`` plus
    per pass ``blen`` when it hands over to the next pass as its last word enters (no store, no
    L1, not the last pass, ``blen >`` the result stage), else ``blen + 3`` plus the drain
    (``3 + operand_latency + lm + la`` with ``lm = cfg.mul_latency``, ``la = cfg.add_latency``;
    a store pass 2 more; an L1 pass takes one word per ``la + 1`` cycles and drains to the stage
    before its accumulate), plus the waits for read responses (``3 + lat`` before the first
    word; after each store pass, where the issue side held; where the issue side, which hands
    over from a read pass of ``blen >= 3`` at its last read and spends 4 cycles on any other
    pass, falls behind); ``L (la + 1)`` for the L1 sum; ``1`` for ``done``. Combinational units
    (mul, add and operand latency 0), y = x + g*c over 1000 elements, 1-cycle memory: 551
    cycles.

    Parameters:
        cfg: :class:`coda.hw.nme.isa.NMEConfig` (lanes L, fmt, depth, nbuf, imem_depth,
            max_streams, mem_words, max_elems, operand_isolation, mul_latency, add_latency,
            operand_latency).
        clock_gating: clock the lanes' data registers through clock gates (with operand
            isolation only; ignored without it). Each register group of a lane gets a gated
            clock (:data:`coda.hw.nme.lane.GATED_DOMAINS`) that runs in the cycles in which the
            group may load (the FPMul operands when a word is in stage 1 and the micro-op
            multiplies, and so on; the accumulator also on a clear; every group during
            reset, which must span a falling clock edge). A gate is the usual latch-and-AND
            cell made of a falling-edge flip-flop that samples the enable in the middle of the
            cycle and an AND with the clock. Results and timing are identical to the ungated
            NME; the lanes' logic only switches (and a Verilated model only evaluates it) when
            a group works. amaranth.sim would see the gated clocks a delta cycle late (a
            race), so simulate a gated NME with Verilator.
        measure_toggles: add ``dbg_fu_toggles`` and the lanes' shadow registers that count
            FU operand toggles (the operand-isolation measurement of a simulation). Off by
            default: measurement logic is not part of the NME that is synthesised or built
            into a system; results and cycles are the same either way.

    Members (L = ``cfg.lanes``):
        cmd_valid: In(1), cmd_ready: Out(1), cmd_data: In(64): command words (header, then
            micro-ops, :mod:`coda.hw.nme.isa` encodings); a word transfers on valid & ready.
        mem_req_valid: Out(1), mem_req_ready: In(1): one memory request per valid & ready;
            valid is a register output and never waits on ready.
        mem_req_we: Out(1): 1 write, 0 read. mem_req_addr: Out(24): word address.
        mem_req_wdata: Out(16*L): word to write. mem_req_wmask: Out(L): per-element write
            enable (tail lanes 0).
        mem_rsp_valid: In(1), mem_rsp_data: In(16*L): read data, one per read, in order,
            latency >= 1 cycle, always accepted.
        busy: Out(1): from the accepted header until (not including) the ``done`` cycle.
        done: Out(1): one-cycle pulse at the end of every program (good or bad).
        status: Out(3): :class:`coda.hw.nme.isa.Status` of the last program.
        l1: Out(32): fp32 bits of the last program's L1 sum (0 if it had no L1 op / failed).
        dbg_fu_toggles: Out(32), with ``measure_toggles`` only: saturating count of bit
            toggles of all FU operand registers of all lanes since reset.

    Raises:
        TypeError: ``cfg`` is not an :class:`NMEConfig`.
    """

    def __init__(self, cfg: NMEConfig, clock_gating: bool = False, *,
                 measure_toggles: bool = False):
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg={cfg!r}: expected a coda.hw.nme.isa.NMEConfig")
        self.cfg = cfg
        self.clock_gating = bool(clock_gating) and cfg.operand_isolation
        self.measure_toggles = bool(measure_toggles)
        lanes = cfg.lanes
        members = {
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(64),
            "mem_req_valid": Out(1), "mem_req_ready": In(1), "mem_req_we": Out(1),
            "mem_req_addr": Out(ADDR_BITS), "mem_req_wdata": Out(16 * lanes),
            "mem_req_wmask": Out(lanes),
            "mem_rsp_valid": In(1), "mem_rsp_data": In(16 * lanes),
            "busy": Out(1), "done": Out(1), "status": Out(3), "l1": Out(32),
        }
        if self.measure_toggles:
            members["dbg_fu_toggles"] = Out(32)
        super().__init__(members)

    def elaborate(self, platform):
        cfg = self.cfg
        m = Module()
        m.submodules.intake = intake = NMEIntake(cfg)
        m.submodules.check = check = NMECheck(cfg)
        m.submodules.execute = ex = NMEExec(cfg, clock_gating=self.clock_gating,
                                            measure_toggles=self.measure_toggles)
        m.submodules.issue = issue = NMEIssue(cfg)

        # host side: commands in, the program's result out
        m.d.comb += [
            intake.cmd.valid.eq(self.cmd_valid), self.cmd_ready.eq(intake.cmd.ready),
            intake.cmd.payload.eq(self.cmd_data),
            self.done.eq(intake.done), self.status.eq(intake.status), self.l1.eq(intake.l1),
            self.busy.eq(intake.busy | check.busy | ex.busy),
        ]
        # the program: intake -> check -> execution and issue side, results back to the intake
        m.d.comb += [
            check.start.eq(intake.loaded),
            check.n_uops.eq(intake.n_uops), check.n_elems.eq(intake.n_elems),
            ex.start.eq(check.accept), issue.start.eq(check.accept),
            ex.n_uops.eq(intake.n_uops), issue.n_uops.eq(intake.n_uops),
            ex.n_words.eq(check.n_words), issue.n_words.eq(check.n_words),
            ex.tail_mask.eq(check.tail_mask), ex.has_l1.eq(check.has_l1),
            ex.trail.eq(check.trail), issue.trail.eq(check.trail),
            intake.reject.eq(check.reject), intake.reject_status.eq(check.status),
            intake.finish.eq(ex.finish), intake.finish_l1.eq(ex.l1),
        ]
        # the instruction memory: one read port for the check and execution (never both
        # at work), one for the issue side
        m.d.comb += [
            intake.x.addr.eq(Mux(ex.busy, ex.uop.addr, check.uop.addr)),
            check.uop.data.eq(intake.x.data), ex.uop.data.eq(intake.x.data),
        ]
        connect(m, issue.uop, intake.i)
        connect(m, check.phase_init, issue.phase_init)
        # execution <-> issue side: responses, stores, progress
        connect(m, issue.rsp, ex.rsp)
        connect(m, ex.store, issue.store)
        m.d.comb += [ex.store_done.eq(issue.store_done), issue.x_passes.eq(ex.passes)]
        # the memory port
        m.d.comb += [
            self.mem_req_valid.eq(issue.mem_req_valid), issue.mem_req_ready.eq(self.mem_req_ready),
            self.mem_req_we.eq(issue.mem_req_we), self.mem_req_addr.eq(issue.mem_req_addr),
            self.mem_req_wdata.eq(issue.mem_req_wdata), self.mem_req_wmask.eq(issue.mem_req_wmask),
            issue.mem_rsp_valid.eq(self.mem_rsp_valid), issue.mem_rsp_data.eq(self.mem_rsp_data),
        ]
        if self.measure_toggles:
            m.d.comb += self.dbg_fu_toggles.eq(ex.toggles)
        return m
