"""The NME's host side: command intake into the instruction memory, and the program's result.

A program is a header word then ``n_uops`` micro-op words (:mod:`coda.hw.nme.isa`). The intake
takes the header in ``IDLE``, writes the micro-op words into the instruction memory
(``imem_depth`` x 64 bits) in ``LOAD``, one per cycle, and then hands the program to the check
(``loaded``) and waits (``WAIT``) until the program has finished. All ``n_uops`` words are
consumed even when there are more than ``imem_depth`` (the extra ones are dropped; the check
rejects the program with ``BAD_LENGTH``), so the command stream stays in step.

The check's rejection or execution's finish sets ``status`` and ``l1`` and makes ``done`` pulse
in the next cycle; in the cycle after the pulse the intake takes the next header.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from coda.hw.nme.isa import NMEConfig, Status
from coda.hw.nme.iface import UOP_INDEX_BITS, UopRead

__all__ = ["NMEIntake"]


class NMEIntake(wiring.Component):
    """Command intake, instruction memory and result registers of one NME.

    Parameters:
        cfg: :class:`coda.hw.nme.isa.NMEConfig` (``imem_depth`` sizes the instruction memory).

    Members:
        cmd: In(stream.Signature(64)): command words; ``ready`` in ``IDLE`` and ``LOAD``.
        n_uops: Out(8), n_elems: Out(32): the header's fields (registers, valid from the
            cycle after the header).
        loaded: Out(1): one-cycle pulse when the program's last word is taken (the check
            starts in the next cycle).
        busy: Out(1): taking micro-op words (``LOAD``).
        x, i: In(:data:`coda.hw.nme.iface.UopRead`): the two read ports of the instruction
            memory (synchronous: ``data`` is the word at the previous cycle's ``addr``); ``x``
            serves the check and execution, ``i`` the issue side.
        reject: In(1), reject_status: In(3): the check refused the program with this status.
        finish: In(1), finish_l1: In(32): execution finished, with this L1 sum (fp32 bits).
        done: Out(1): one-cycle pulse in the cycle after ``reject`` or ``finish``.
        status: Out(3): :class:`coda.hw.nme.isa.Status` of the last program.
        l1: Out(32): fp32 bits of the last program's L1 sum (0 when rejected).
    """

    def __init__(self, cfg: NMEConfig):
        self.cfg = cfg
        super().__init__({
            "cmd": In(stream.Signature(64)),
            "n_uops": Out(UOP_INDEX_BITS), "n_elems": Out(32), "loaded": Out(1),
            "busy": Out(1), "x": In(UopRead), "i": In(UopRead),
            "reject": In(1), "reject_status": In(3), "finish": In(1), "finish_l1": In(32),
            "done": Out(1), "status": Out(3), "l1": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        IM = self.cfg.imem_depth
        m.submodules.imem = imem = Memory(shape=64, depth=IM, init=[])
        imem_w, imem_x, imem_i = imem.write_port(), imem.read_port(), imem.read_port()
        m.d.comb += [imem_x.addr.eq(self.x.addr), self.x.data.eq(imem_x.data),
                     imem_i.addr.eq(self.i.addr), self.i.data.eq(imem_i.data)]

        n_uops, n_elems = Signal(UOP_INDEX_BITS), Signal(32)
        ld_cnt = Signal(UOP_INDEX_BITS)
        m.d.comb += [self.n_uops.eq(n_uops), self.n_elems.eq(n_elems)]
        header = self.cmd.payload
        with m.FSM(name="intake"):
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += [n_uops.eq(header[0:8]), n_elems.eq(header[8:40]),
                                 ld_cnt.eq(0)]
                    with m.If(header[0:8] == 0):
                        m.d.comb += self.loaded.eq(1)
                        m.next = "WAIT"
                    with m.Else():
                        m.next = "LOAD"

            with m.State("LOAD"):
                m.d.comb += [self.cmd.ready.eq(1), self.busy.eq(1)]
                with m.If(self.cmd.valid):
                    m.d.comb += [imem_w.addr.eq(ld_cnt), imem_w.data.eq(self.cmd.payload),
                                 imem_w.en.eq(ld_cnt < IM)]
                    m.d.sync += ld_cnt.eq(ld_cnt + 1)
                    with m.If(ld_cnt == n_uops - 1):
                        m.d.comb += self.loaded.eq(1)
                        m.next = "WAIT"

            with m.State("WAIT"):
                with m.If(self.done):
                    m.next = "IDLE"

        # ---- the result of the program: the check's rejection or execution's finish
        # l1 is the last finish's sum, shown only after a finish (``ok``): a rejection
        # (the check's decision, late in its cycle) loads 4 registers, not 36
        done, status, l1, ok = Signal(), Signal(3), Signal(32), Signal()
        m.d.comb += [self.done.eq(done), self.status.eq(status), self.l1.eq(Mux(ok, l1, 0))]
        m.d.sync += done.eq(self.reject | self.finish)
        with m.If(self.reject):
            m.d.sync += [status.eq(self.reject_status), ok.eq(0)]
        with m.Elif(self.finish):
            m.d.sync += [status.eq(Status.OK), ok.eq(1)]
        with m.If(self.finish):
            m.d.sync += l1.eq(self.finish_l1)
        return m
