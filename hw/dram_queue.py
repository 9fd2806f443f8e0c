"""Request queue of the rank memory controller: a circular buffer in RAMs.

Each entry holds a burst address, its bank (mapped once, at push) and a payload that only the
head's is ever read (the write data and mask of a write; the acceptance cycle of a read, for
the latency statistic). The scheduler reads the first ``look`` entries, the command issued
for an entry marks whether its bank needed an ACT or a PRE (the row hit/miss/conflict
statistic), a column command pops the head, and one content-addressable port compares an
address with every queued entry (the controller's read-after-write / write-after-read
hazards). Only the entries looked at are read each cycle, which keeps the Verilated model
fast (O(look) reads, plus the O(depth) address comparisons of the hazard port).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

__all__ = ["RequestQueue"]


class RequestQueue(wiring.Component):
    """A queue of ``depth`` requests.

    Parameters:
        depth: entries (>= 1); the RAMs have ``max(2, next power of two)`` slots.
        addr_bits, bank_bits: widths of an entry's burst address and bank index.
        look: entries the scheduler reads (``look`` >= 1; those past ``depth`` read as
            invalid zeros).
        payload_bits: width of the payload (>= 1).

    Members:
        push: In(1), push_addr: In(addr_bits), push_bank: In(bank_bits), push_payload:
            In(payload_bits): append an entry this cycle (the caller checks ``count``).
        count: Out(range(depth + 1)): entries queued.
        look: Out({valid, addr, bank}) x ``look``: entry ``i`` (0 = oldest).
        pop: In(1): remove the oldest entry (its column command issued this cycle).
        head_payload: Out(payload_bits): the oldest entry's payload.
        sel: In(range(max(look, 2))), sel_addr: Out(addr_bits), sel_bank: Out(bank_bits):
            entry ``sel`` (the one a row command is for).
        mark_act: In(1), mark_pre: In(1): an ACT / a PRE issued for entry ``sel``.
        head_act: Out(1), head_pre: Out(1): the oldest entry's bank needed an ACT / a PRE.
        match_addr: In(addr_bits), match: Out(1): some queued entry has this address.
    """

    def __init__(self, depth: int, addr_bits: int, bank_bits: int, *, look: int,
                 payload_bits: int):
        if depth < 1 or look < 1 or payload_bits < 1:
            raise ValueError(f"depth={depth}, look={look}, payload_bits={payload_bits}: "
                             f"expected >= 1 each")
        self.depth, self.look_n = depth, look
        self.slots = max(2, 1 << ceil_log2(depth))
        self.addr_bits, self.bank_bits = addr_bits, bank_bits
        entry = wiring.Signature({"valid": Out(1), "addr": Out(addr_bits),
                                  "bank": Out(bank_bits)})
        super().__init__({
            "push": In(1), "push_addr": In(addr_bits), "push_bank": In(bank_bits),
            "push_payload": In(payload_bits),
            "count": Out(range(depth + 1)), "look": Out(entry).array(look),
            "pop": In(1), "head_payload": Out(payload_bits),
            "sel": In(range(max(look, 2))), "sel_addr": Out(addr_bits),
            "sel_bank": Out(bank_bits), "mark_act": In(1), "mark_pre": In(1),
            "head_act": Out(1), "head_pre": Out(1),
            "match_addr": In(addr_bits), "match": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        A, slots = self.addr_bits, self.slots
        m.submodules.entries = mem = Memory(shape=unsigned(A + self.bank_bits), depth=slots,
                                            init=[])
        m.submodules.payloads = pay = Memory(shape=unsigned(len(self.push_payload)),
                                             depth=slots, init=[])

        def read(ram, index):
            """Data of a new combinational read port of ``ram`` at ``index``."""
            port = ram.read_port(domain="comb")
            m.d.comb += port.addr.eq(index)
            return port.data

        head, tail = Signal(range(slots)), Signal(range(slots))
        count = Signal(range(self.depth + 1))
        used = Signal(slots)     # slot holds an entry
        act = Signal(slots)      # its bank needed an ACT
        pre = Signal(slots)      # ... and a PRE
        m.d.comb += [self.count.eq(count), self.head_payload.eq(read(pay, head)),
                     self.head_act.eq(act.bit_select(head, 1)),
                     self.head_pre.eq(pre.bit_select(head, 1))]
        for i, e in enumerate(self.look):
            if i >= self.depth:
                m.d.comb += [e.valid.eq(0), e.addr.eq(0), e.bank.eq(0)]
                continue
            data = read(mem, head + i)
            m.d.comb += [e.valid.eq(count > i), e.addr.eq(data[:A]), e.bank.eq(data[A:])]
        sel = read(mem, head + self.sel)
        m.d.comb += [self.sel_addr.eq(sel[:A]), self.sel_bank.eq(sel[A:])]
        # the hazard port compares every slot's address
        hits = [used[k] & (read(mem, k)[:A] == self.match_addr) for k in range(slots)]
        match = Const(0)
        for hit in hits:
            match = match | hit
        m.d.comb += self.match.eq(match)

        entry_w, payload_w = mem.write_port(), pay.write_port()
        m.d.comb += [entry_w.addr.eq(tail), entry_w.en.eq(self.push),
                     entry_w.data.eq(Cat(self.push_addr, self.push_bank)),
                     payload_w.addr.eq(tail), payload_w.en.eq(self.push),
                     payload_w.data.eq(self.push_payload)]
        one = Const(1, slots)
        at_tail = Mux(self.push, (one << tail)[:slots], 0)
        at_head = Mux(self.pop, (one << head)[:slots], 0)
        at_sel = (one << (head + self.sel)[:len(head)])[:slots]
        m.d.sync += [
            used.eq((used & ~at_head) | at_tail),
            act.eq((act & ~at_tail) | Mux(self.mark_act, at_sel, 0)),
            pre.eq((pre & ~at_tail) | Mux(self.mark_pre, at_sel, 0)),
            head.eq(head + self.pop), tail.eq(tail + self.push),
            count.eq(count + self.push - self.pop),
        ]
        return m
