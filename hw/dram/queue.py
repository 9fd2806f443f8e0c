"""Request queue of the rank memory controller: a circular buffer in RAMs whose entries may
leave out of order.

Each entry holds a burst address, its bank (mapped once, at push), a ``flag`` bit given at
push (the controller's ordering hazard: such an entry may only issue as the oldest) and a
payload read only for the entry a command is chosen for (the write data and mask of a write;
the acceptance cycle and response tag of a read). The scheduler reads the first ``look``
entries; a column command for entry ``sel`` marks it *done*: it is no longer looked at (a
hole) and the head moves past done entries one per cycle, freeing their slots. The command
issued for an entry marks whether its bank needed an ACT or a PRE (the row
hit/miss/conflict statistic). Content-addressable ports compare an address with every queued,
not-done entry (the controller's read-after-write / write-after-read / write-after-write
hazards). Only the entries looked at are read each cycle, which keeps the Verilated model
fast (O(look) reads, plus the O(depth) address comparisons of each hazard port).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

__all__ = ["RequestQueue"]


class RequestQueue(wiring.Component):
    """A queue of ``depth`` requests (column commands may take them out of order).

    Parameters:
        depth: entries (>= 1); the RAMs have ``max(2, next power of two)`` slots. Done
            entries still count until the head passes them.
        addr_bits, bank_bits: widths of an entry's burst address and bank index.
        look: entries the scheduler reads (``look`` >= 1; those past ``depth`` read as
            invalid zeros).
        payload_bits: width of the payload (>= 1).
        match_ports: number of address-comparison ports (>= 1).

    Members:
        push: In(1), push_addr: In(addr_bits), push_bank: In(bank_bits), push_flag: In(1),
            push_payload: In(payload_bits): append an entry this cycle (the caller checks
            ``count``).
        count: Out(range(depth + 1)): slots in use (entries and holes from the head on).
        look: Out({valid, addr, bank, flag}) x ``look``: entry ``i`` (0 = oldest slot);
            ``valid`` is 0 for a hole (an entry already served) and past the tail.
        sel: In(range(max(look, 2))), sel_addr: Out(addr_bits), sel_bank: Out(bank_bits),
            sel_payload: Out(payload_bits): entry ``sel`` (the one this cycle's command is for).
        done: In(1): the column command of entry ``sel`` issued this cycle.
        mark_act: In(1), mark_pre: In(1): an ACT / a PRE issued for entry ``sel``.
        sel_act: Out(1), sel_pre: Out(1): entry ``sel``'s bank needed an ACT / a PRE.
        match_addr: In(addr_bits) x ``match_ports``, match: Out(1) x ``match_ports``: some
            queued, not yet served entry has this address.
    """

    def __init__(self, depth: int, addr_bits: int, bank_bits: int, *, look: int,
                 payload_bits: int, match_ports: int = 1):
        if depth < 1 or look < 1 or payload_bits < 1 or match_ports < 1:
            raise ValueError(f"depth={depth}, look={look}, payload_bits={payload_bits}, "
                             f"match_ports={match_ports}: expected >= 1 each")
        self.depth, self.look_n = depth, look
        self.slots = max(2, 1 << ceil_log2(depth))
        self.addr_bits, self.bank_bits = addr_bits, bank_bits
        entry = wiring.Signature({"valid": Out(1), "addr": Out(addr_bits),
                                  "bank": Out(bank_bits), "flag": Out(1)})
        super().__init__({
            "push": In(1), "push_addr": In(addr_bits), "push_bank": In(bank_bits),
            "push_flag": In(1), "push_payload": In(payload_bits),
            "count": Out(range(depth + 1)), "look": Out(entry).array(look),
            "sel": In(range(max(look, 2))), "sel_addr": Out(addr_bits),
            "sel_bank": Out(bank_bits), "sel_payload": Out(payload_bits),
            "done": In(1), "mark_act": In(1), "mark_pre": In(1),
            "sel_act": Out(1), "sel_pre": Out(1),
            "match_addr": In(addr_bits).array(match_ports), "match": Out(1).array(match_ports),
        })

    def elaborate(self, platform):
        m = Module()
        A, B, slots = self.addr_bits, self.bank_bits, self.slots
        m.submodules.entries = mem = Memory(shape=unsigned(A + B + 1), depth=slots, init=[])
        m.submodules.payloads = pay = Memory(shape=unsigned(len(self.push_payload)),
                                             depth=slots, init=[])

        def read(ram, index):
            """Data of a new combinational read port of ``ram`` at ``index``."""
            port = ram.read_port(domain="comb")
            m.d.comb += port.addr.eq(index)
            return port.data

        head, tail = Signal(range(slots)), Signal(range(slots))
        count = Signal(range(self.depth + 1))
        used = Signal(slots)     # slot holds an entry not yet served
        done = Signal(slots)     # slot holds an entry already served (a hole before the head)
        act = Signal(slots)      # its bank needed an ACT
        pre = Signal(slots)      # ... and a PRE
        sel_slot = (head + self.sel)[:len(head)]
        m.d.comb += [self.count.eq(count), self.sel_payload.eq(read(pay, sel_slot)),
                     self.sel_act.eq(act.bit_select(sel_slot, 1)),
                     self.sel_pre.eq(pre.bit_select(sel_slot, 1))]
        for i, e in enumerate(self.look):
            if i >= self.depth:
                m.d.comb += [e.valid.eq(0), e.addr.eq(0), e.bank.eq(0), e.flag.eq(0)]
                continue
            slot = (head + i)[:len(head)]
            data = read(mem, slot)
            m.d.comb += [e.valid.eq((count > i) & ~done.bit_select(slot, 1)),
                         e.addr.eq(data[:A]), e.bank.eq(data[A:A + B]), e.flag.eq(data[A + B])]
        sel = read(mem, sel_slot)
        m.d.comb += [self.sel_addr.eq(sel[:A]), self.sel_bank.eq(sel[A:A + B])]
        # the hazard ports compare every unserved slot's address
        stored = [read(mem, k)[:A] for k in range(slots)]
        for addr, out in zip(self.match_addr, self.match):
            match = Const(0)
            for k in range(slots):
                match = match | (used[k] & (stored[k] == addr))
            m.d.comb += out.eq(match)

        entry_w, payload_w = mem.write_port(), pay.write_port()
        m.d.comb += [entry_w.addr.eq(tail), entry_w.en.eq(self.push),
                     entry_w.data.eq(Cat(self.push_addr, self.push_bank, self.push_flag)),
                     payload_w.addr.eq(tail), payload_w.en.eq(self.push),
                     payload_w.data.eq(self.push_payload)]
        one = Const(1, slots)
        at_sel = (one << sel_slot)[:slots]
        served = Mux(self.done, at_sel, 0)
        done_now = done | served
        # the head moves past a served entry (served earlier, or in this cycle)
        pop = (count > 0) & done_now.bit_select(head, 1)
        at_tail = Mux(self.push, (one << tail)[:slots], 0)
        at_head = Mux(pop, (one << head)[:slots], 0)
        m.d.sync += [
            used.eq((used & ~served) | at_tail),
            done.eq(done_now & ~at_head & ~at_tail),
            act.eq((act & ~at_tail) | Mux(self.mark_act, at_sel, 0)),
            pre.eq((pre & ~at_tail) | Mux(self.mark_pre, at_sel, 0)),
            head.eq(head + pop), tail.eq(tail + self.push),
            count.eq(count + self.push - pop),
        ]
        return m
