"""Interfaces between the units of the NME (:mod:`coda.hw.nme`): the micro-op word's fields,
the instruction memory's read port, the read-response and store streams, the phase-record
initialisation, and the sizes they share.

The streams are :mod:`amaranth.lib.stream` streams: a transfer is ``valid & ready`` and
``valid`` never waits on ``ready``.
"""

from __future__ import annotations

from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .isa import ADDR_BITS

__all__ = ["UopFields", "UopRead", "PhaseInit", "response_layout", "store_layout",
           "response_signature", "store_signature", "read_credits", "STORE_FIFO_DEPTH",
           "TAG_BITS", "PASS_BITS", "UOP_INDEX_BITS"]

#: Words of store results the NME can hold while the memory refuses requests; 8 covers the
#: issue-to-transfer round trip (about 6 cycles) so a store pass keeps one word per cycle.
STORE_FIFO_DEPTH = 8
#: Bits travelling with each read (INT8 half, GROUP element lane).
TAG_BITS = 7
#: Width of the pass counters of the issue and execution sides. The issue side is at most
#: about two blocks (2 * 255 passes) ahead, so 11 bits never alias.
PASS_BITS = 11
#: Width of a micro-op index (``n_uops`` <= 255).
UOP_INDEX_BITS = 8


def read_credits(depth: int) -> int:
    """Entries of the read-response FIFO = reads the issue side may have ahead of execution:
    ``depth``, at least 3 because a SyncFIFOBuffered of depth 2 (one inner entry) refuses a
    write in the cycle after a write, and back-to-back responses (latency 1, depth 2) would be
    lost: the NME hung."""
    return max(depth, 3)


class UopFields:
    """Fields of a 64-bit micro-op word (a Value), per the :mod:`coda.hw.isa` encoding:
    ``op`` [3:0], ``rsrc`` [6:4], ``store`` [7], ``d``/``p``/``q``/``r`` 4 bits each from
    bit 8, ``addr`` [47:24], ``param`` [63:48]."""

    def __init__(self, word):
        self.op, self.rsrc, self.store = word[0:4], word[4:7], word[7]
        self.d, self.p, self.q, self.r = word[8:12], word[12:16], word[16:20], word[20:24]
        self.addr, self.param = word[24:48], word[48:64]


#: A read port of the instruction memory, seen from its reader: ``addr`` (micro-op index,
#: 8 bits) presented in one cycle, ``data`` (the 64-bit micro-op word) in the next.
UopRead = wiring.Signature({"addr": Out(UOP_INDEX_BITS), "data": In(64)})

#: The check's initialisation of a micro-op's stream phase record (seen from the check):
#: ``en`` write this cycle, ``index`` the micro-op, ``addr`` its stream start address (the
#: CHAN/GROUP phase and the GROUP element lane start at 0).
PhaseInit = wiring.Signature({"en": Out(1), "index": Out(UOP_INDEX_BITS),
                              "addr": Out(ADDR_BITS)})


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

