"""Interfaces between the units of the NME (:mod:`coda.hw.nme.top`): the micro-op word's fields,
the instruction memory's read port, the read-response and store streams, the phase-record
initialisation, and the sizes they share.

The streams are :mod:`amaranth.lib.stream` streams: a transfer is ``valid & ready`` and
``valid`` never waits on ``ready``.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from coda.hw.nme.isa import ADDR_BITS

__all__ = ["UopFields", "UopRead", "PhaseInit", "response_layout", "store_layout",
           "response_signature", "store_signature", "read_credits", "STORE_FIFO_DEPTH",
           "LaneTiming",
           "TAG_BITS", "PASS_BITS", "UOP_INDEX_BITS"]

#: Words of store results the NME can hold while the memory refuses requests (at least; a
#: deeper lane pipeline needs more, :attr:`LaneTiming.store_fifo_depth`); 8 covers the
#: issue-to-transfer round trip (6 cycles) so a store pass keeps one word per cycle.
STORE_FIFO_DEPTH = 8
#: Bits travelling with each read (INT8 half, GROUP element lane).
TAG_BITS = 7
#: Width of the pass counters of the issue and execution sides. The issue side is at most
#: about two blocks (2 * 255 passes) ahead, so 11 bits never alias.
PASS_BITS = 11
#: Width of a micro-op index (``n_uops`` <= 255).
UOP_INDEX_BITS = 8


@dataclass(frozen=True)
class LaneTiming:
    """Where things happen in the lane pipeline, as stage numbers: a word that enters in
    cycle ``t`` (its buffer read address presented) is in stage ``k`` in cycle ``t + k``,
    and a register "loads at stage k" at the end of that cycle. Derived from the register
    stages of the operand path and of the units (``NMEConfig.operand_latency``,
    ``mul_latency``, ``add_latency``); shared by the lane, the execution sequencer and the
    cycle model (:mod:`coda.hw.nme.cycles`).

    Attributes:
        mul_latency: register stages inside FPMul (0..:data:`~coda.hw.nme.isa.MAX_MUL_LATENCY`).
        add_latency: register stages inside every FPAdd (0..:data:`~coda.hw.nme.isa.MAX_ADD_LATENCY`).
        operand_latency: register stages between the block RAMs and the lanes' operand
            selection (0..:data:`~coda.hw.nme.isa.MAX_OPERAND_LATENCY`).
    """
    mul_latency: int = 0
    add_latency: int = 0
    operand_latency: int = 0

    @classmethod
    def of(cls, cfg) -> "LaneTiming":
        """The timing of an :class:`coda.hw.nme.isa.NMEConfig`."""
        return cls(cfg.mul_latency, cfg.add_latency, cfg.operand_latency)

    @property
    def lane(self) -> "LaneTiming":
        """The same units seen from a lane, whose stage 1 is its operands' arrival
        (:class:`coda.hw.nme.lane.NMELane` numbers its stages from there)."""
        return LaneTiming(self.mul_latency, self.add_latency)

    @property
    def operand_stage(self) -> int:
        """The lanes' operands (P, Q, R selected) are valid; their registers load."""
        return 1 + self.operand_latency

    @property
    def add_stage(self) -> int:
        """FPMul's result is valid; the FPAdd operands and the MOV/MUL bypass load."""
        return self.operand_stage + 1 + self.mul_latency

    @property
    def result_stage(self) -> int:
        """The lane's result ``y`` is valid; a buffer or the store FIFO writes it."""
        return self.operand_stage + 2 + self.mul_latency + self.add_latency

    @property
    def diff_stage(self) -> int:
        """L1: ``|f32(P) - f32(R)|`` is valid; the accumulator's operand register loads."""
        return self.operand_stage + 2 + self.add_latency

    @property
    def acc_stage(self) -> int:
        """L1: the accumulate writes the lane's accumulator."""
        return self.operand_stage + 3 + 2 * self.add_latency

    def drain_stage(self, l1: bool) -> int:
        """Last stage a pass waits to be empty before it ends: the result stage, or for an
        L1 pass also every stage before the accumulate (which ends with the pass)."""
        return max(self.result_stage, self.acc_stage - 1) if l1 else self.result_stage

    @property
    def l1_gap(self) -> int:
        """Cycles between the words of an L1 pass (the accumulate's recurrence)."""
        return self.add_latency + 1

    @property
    def sum_cycles_per_lane(self) -> int:
        """Cycles of each fp32 add of the lane sum (X_SUM)."""
        return self.add_latency + 1

    @property
    def store_fifo_depth(self) -> int:
        """Store FIFO words: a store credit is held from entry to the request's transfer,
        ``result_stage + 3`` cycles, so this many keep a store pass at one word per cycle."""
        return max(STORE_FIFO_DEPTH, self.result_stage + 3)


def read_credits(cfg) -> int:
    """Entries of the read-response FIFO = reads the issue side may have ahead of execution
    (``cfg``: an :class:`coda.hw.nme.isa.NMEConfig`): ``max(depth, 3) + result_stage``. A block's
    worth, at least 3 because a SyncFIFOBuffered of depth 2 (one inner entry) refuses a write
    in the cycle after a write, and back-to-back responses (latency 1, depth 2) would be
    lost: the NME hung. Plus :attr:`LaneTiming.result_stage`: a store pass takes no reads,
    and its stores reach the memory port ``result_stage + 1`` cycles after its words enter,
    so that many more reads keep the port busy in between (a 4-pass gated residual at
    depth 16, mul 4 / add 5 / operand 1: 0.970 -> 1.000 words per pass per cycle)."""
    return max(cfg.depth, 3) + LaneTiming.of(cfg).result_stage


class UopFields:
    """Fields of a 64-bit micro-op word (a Value), per the :mod:`coda.hw.nme.isa` encoding:
    ``op`` [3:0], ``rsrc`` [6:4], ``store`` [7], ``d``/``p``/``q``/``r`` 4 bits each from
    bit 8, ``addr`` [47:24], ``param`` [63:48]."""

    def __init__(self, word):
        self.op, self.rsrc, self.store = word[0:4], word[4:7], word[7]
        self.d, self.p, self.q, self.r = word[8:12], word[12:16], word[16:20], word[20:24]
        self.addr, self.param = word[24:48], word[48:64]


#: A read port of the instruction memory, seen from its reader: ``addr`` (micro-op index,
#: 8 bits) presented in one cycle, ``data`` (the 64-bit micro-op word) in the next.
UopRead = wiring.Signature({"addr": Out(UOP_INDEX_BITS), "data": In(64)})

#: The check's initialisation of a reading micro-op's stream phase record (seen from the
#: check): ``en`` write this cycle, ``index`` the micro-op, ``addr`` its stream start
#: address (the CHAN/GROUP phase and the GROUP element lane start at 0), ``next`` the index
#: of the program's next micro-op that reads memory, ``wrap`` that one is in the next block
#: (``next`` is the program's first reading micro-op).
PhaseInit = wiring.Signature({"en": Out(1), "index": Out(UOP_INDEX_BITS),
                              "addr": Out(ADDR_BITS), "next": Out(UOP_INDEX_BITS),
                              "wrap": Out(1)})


def response_layout(lanes: int) -> data.StructLayout:
    """Payload of the read-response stream (issue side -> execution): ``data`` the memory
    word (``16 * lanes`` bits), ``half`` the INT8 half (parity of the word index) and
    ``elane`` the GROUP element lane the read was issued for (its tag)."""
    return data.StructLayout({"data": 16 * lanes, "half": 1, "elane": TAG_BITS - 1})


def store_layout(lanes: int) -> data.StructLayout:
    """Payload of the store stream (execution -> memory request register): word address
    ``addr`` (24 bits), ``data`` (``16 * lanes`` bits), per-element write enable ``mask``
    (``lanes`` bits; the tail lanes of the last word 0)."""
    return data.StructLayout({"addr": ADDR_BITS, "data": 16 * lanes, "mask": lanes})


def response_signature(lanes: int) -> stream.Signature:
    """The read-response stream, seen from the issue side (its source)."""
    return stream.Signature(response_layout(lanes))


def store_signature(lanes: int) -> stream.Signature:
    """The store stream, seen from execution (its source)."""
    return stream.Signature(store_layout(lanes))

