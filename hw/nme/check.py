"""The NME's program check: exactly :func:`coda.hw.nme.isa.validate`, before any memory access.

:class:`NMECheck` walks the header and the micro-ops (FSM ``check``: the lengths, ``W =
ceil(N / lanes)`` and the tail mask, then per micro-op the opcode, operand and address rules,
and the stream count), initialises each micro-op's stream phase record for the issue side, and
decides the *trailing-store* rule (output ``trail``): whether the reads of a later block may go
to memory before the stores of earlier blocks have left. :func:`stores_may_trail` is that rule
in Python (for the cycle model). The rules and the rejection are one cycle apart so that no
path runs from the micro-op word through the rules into the intake's ``status`` / ``l1``
registers; :class:`NMECheck` has the states and their cycles.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from coda.hw.nme.isa import ADDR_BITS, PARAM_BITS, NMEConfig, Op, RSrc, Status
from coda.hw.nme.iface import UOP_INDEX_BITS, PhaseInit, UopFields, UopRead

__all__ = ["NMECheck", "stores_may_trail"]


def stores_may_trail(uops, n_words: int) -> bool:
    """The NME's trailing-store rule: may the reads of block ``b + 1`` (and later) go to memory
    before the stores of blocks ``<= b`` have left? Only where no such read can meet such a
    store's address, so the order of memory requests changes no result. Sufficient and
    checked from a few registers (the check computes exactly this, :class:`NMECheck`'s
    ``trail``):

    - no micro-op reads memory after one that stores (within a block, reads come first);
    - for every store at word address ``s`` (words ``s .. s+W-1``), the plain (MEM) read
      streams all start at ``>= s`` (read word ``w`` at ``a + w >= s + w``: never a word that
      an earlier word's store wrote) or all end at ``<= s``; the other read streams (CHAN
      ``a .. a+param-1``, GROUP and INT8 within ``a .. a+W-1``) all end at ``<= s`` or all
      start at ``>= s + W``.

    Args:
        uops: the program's :class:`coda.hw.nme.isa.UOp` micro-ops (a validated program).
        n_words: ``W = ceil(n_elems / lanes)``.
    Returns:
        True when stores may trail (always True for a program without stores).
    """
    seen_store, ok = False, True
    mem_rng = other_rng = None                      # (lowest start, highest end)
    for u in uops:
        if u.store:
            seen_store = True
            s = u.addr
            if mem_rng is not None and not (mem_rng[0] >= s or mem_rng[1] <= s):
                ok = False
            if other_rng is not None and not (other_rng[1] <= s or other_rng[0] >= s + n_words):
                ok = False
        elif u.rsrc != RSrc.BUF:
            ok = ok and not seen_store
            end = u.addr + (u.param if u.rsrc == RSrc.CHAN else n_words)
            rng = mem_rng if u.rsrc == RSrc.MEM else other_rng
            rng = (u.addr, end) if rng is None else (min(rng[0], u.addr), max(rng[1], end))
            if u.rsrc == RSrc.MEM:
                mem_rng = rng
            else:
                other_rng = rng
    return ok


class NMECheck(wiring.Component):
    """Program check of one NME.

    Walk (FSM ``check``): ``V_LEN`` checks the header's lengths (``V_DIV``'s first cycle
    rejects them); ``V_DIV`` computes
    ``W = ceil(N / lanes)`` and the tail lane mask (a shift when ``lanes`` is a power of two, one
    cycle; otherwise a restoring divider, one quotient bit per cycle, 33 cycles); then per micro-op
    ``V_FETCH`` (read it from the instruction memory), ``V_CHECK`` (opcode, operand and address
    rules in one cycle, their outcome registered), ``V_DECIDE`` (reject, or go on to the next
    micro-op), for a scaled GROUP between them ``V_GROUP`` (a sequential shift-add multiplier for
    its extent, ``bitlen(param * lanes) + 1`` cycles) and ``V_NEXT``; and ``V_END`` the stream
    count. The rules and the rejection are one cycle apart so that no path runs from the micro-op
    word through the rules into the intake's ``status`` / ``l1`` registers.

    The GROUP rule ``addr + (W-1) // (param*L) + 1 > mem_words`` is evaluated as
    ``W - 1 >= (mem_words - addr) * param * L`` (the same truth value for positive integers, no
    division). An ``nbuf``-bit mask of the buffers written so far (``d`` of each earlier non-store,
    non-L1 micro-op) rejects reads of unwritten buffers in the same cycle as the other operand
    rules. ``V_CHECK`` also initialises each micro-op's stream phase record (its start address)
    for the issue side: each reading micro-op's record (its start address, and the index of the
    program's next reading micro-op) is written when the next one is checked, the last one's in
    ``V_END`` (it points to the first one, in the next block).

    ``V_CHECK``/``V_DECIDE`` also decide the *trailing-store* rule (:func:`stores_may_trail`, output
    ``trail``): whether the reads of a later block may go to memory before the stores of earlier
    blocks have left. Each micro-op's memory range is registered in ``V_CHECK``
    (:class:`_RangeRegs`) and compared with the read ranges so far in ``V_DECIDE``, so no compare
    follows the micro-op word in its cycle.

    Parameters:
        cfg: :class:`coda.hw.nme.isa.NMEConfig` (lanes, nbuf, imem_depth, max_streams,
            mem_words, max_elems).

    Members (L = ``cfg.lanes``):
        start: In(1): check the program whose header and micro-ops the intake holds
            (``V_LEN`` in the next cycle).
        n_uops: In(8), n_elems: In(32): the header's fields.
        uop: Out(:data:`coda.hw.nme.iface.UopRead`): the instruction memory's read port.
        n_words: Out(32): ``W = ceil(n_elems / L)`` (valid from the first ``V_FETCH``).
        tail_mask: Out(L): valid lanes of word ``W - 1``.
        has_l1: Out(1): the program has an L1 micro-op.
        phase_init: Out(:data:`coda.hw.nme.iface.PhaseInit`): each reading micro-op's
            stream start and the next reading micro-op.
        accept: Out(1): one-cycle pulse: the program may run (execution and the issue side
            start in the next cycle).
        reject: Out(1), status: Out(3): one-cycle pulse: the program is refused with
            :class:`coda.hw.nme.isa.Status` ``status``.
        busy: Out(1): checking (``V_*``).
        trail: Out(1): the accepted program's stores may trail later blocks' reads
            (:func:`stores_may_trail`, with ``cfg.trail_stores``; else 0); valid from
            ``accept`` until the next ``start``.
    """

    def __init__(self, cfg: NMEConfig):
        self.cfg = cfg
        super().__init__({
            "start": In(1), "n_uops": In(UOP_INDEX_BITS), "n_elems": In(32),
            "uop": Out(UopRead),
            "n_words": Out(32), "tail_mask": Out(cfg.lanes), "has_l1": Out(1),
            "phase_init": Out(PhaseInit),
            "accept": Out(1), "reject": Out(1), "status": Out(3), "busy": Out(1),
            "trail": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        r = self._registers(m)
        fsm = self._walk(m, r)
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m

    def _registers(self, m):
        """The check's registers: W, tail mask, program facts, divider, multiplier, limits."""
        cfg = self.cfg
        L = cfg.lanes
        n_words = Signal(32)                 # W = ceil(N / L)
        tail_mask = Signal(L)                # valid lanes of word W-1
        streams = Signal(9)
        has_l1 = Signal()
        written = Signal(cfg.nbuf)           # buffers an earlier micro-op wrote
        # the last reading micro-op so far (its phase record is written at the next one)
        prev_read, first_read = Signal(UOP_INDEX_BITS), Signal(UOP_INDEX_BITS)
        prev_addr, seen_read = Signal(ADDR_BITS), Signal()
        k = Signal(UOP_INDEX_BITS)           # micro-op index
        m.d.comb += [self.n_words.eq(n_words), self.tail_mask.eq(tail_mask),
                     self.has_l1.eq(has_l1), self.uop.addr.eq(k)]
        div_q = Signal(32)
        div_r = Signal(range(2 * L + 1))
        div_n = Signal(6)
        mul_acc = Signal(ADDR_BITS + 1 + PARAM_BITS + 7)
        mul_cand = Signal(ADDR_BITS + 1 + PARAM_BITS + 7)
        mul_plier = Signal(PARAM_BITS + 7)
        # mem_words - extent for the extents that depend on W only (valid from V_CHECK on:
        # W is written in V_DIV's last cycle)
        lim_mem, lim_int8 = Signal(signed(34)), Signal(signed(34))
        m.d.sync += [lim_mem.eq(cfg.mem_words - n_words),
                     lim_int8.eq(cfg.mem_words - ((n_words + 1) >> 1))]
        # k is the last micro-op (registered: k changes two cycles before it is used)
        k_last = Signal()
        m.d.sync += k_last.eq(k == self.n_uops - 1)
        flags = _CheckFlags()
        rng = _RangeRegs()
        if cfg.trail_stores:
            m.d.comb += self.trail.eq(rng.trail)
        bad_length = Signal()
        return SimpleNamespace(
            n_words=n_words, tail_mask=tail_mask, streams=streams, has_l1=has_l1,
            written=written, prev_read=prev_read, first_read=first_read, prev_addr=prev_addr,
            seen_read=seen_read, k=k, div_q=div_q, div_r=div_r, div_n=div_n, mul_acc=mul_acc,
            mul_cand=mul_cand, mul_plier=mul_plier, lim_mem=lim_mem, lim_int8=lim_int8,
            k_last=k_last, flags=flags, rng=rng, bad_length=bad_length)

    def _reject(self, m, code):
        """Refuse the program with ``code`` (the ``reject`` pulse) and go idle."""
        m.d.comb += [self.reject.eq(1), self.status.eq(code)]
        m.next = "IDLE"

    @staticmethod
    def _next_uop(m, r):
        """Go on to the next micro-op, or to ``V_END`` after the last."""
        m.d.sync += r.k.eq(r.k + 1)
        with m.If(r.k_last):
            m.next = "V_END"
        with m.Else():
            m.next = "V_FETCH"

    def _walk(self, m, r):
        """The walk, FSM ``check``: lengths, W, each micro-op's rules, the stream count."""
        cfg = self.cfg
        n_uops, n_elems = self.n_uops, self.n_elems
        k, flags, rng, seen_read = r.k, r.flags, r.rng, r.seen_read
        f = UopFields(self.uop.data)
        with m.FSM(name="check") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.next = "V_LEN"

            with m.State("V_LEN"):
                m.d.sync += [k.eq(0), r.streams.eq(0), r.has_l1.eq(0), r.written.eq(0),
                             seen_read.eq(0),
                             r.div_q.eq(n_elems), r.div_r.eq(0), r.div_n.eq(0)]
                rng.clear(m)
                # the length rules, registered: V_DIV's first cycle rejects
                m.d.sync += r.bad_length.eq((n_uops == 0) | (n_uops > cfg.imem_depth)
                                            | (n_elems == 0) | (n_elems > cfg.max_elems))
                m.next = "V_DIV"

            with m.State("V_DIV"):
                with m.If(r.bad_length):
                    self._reject(m, Status.BAD_LENGTH)
                with m.Else():
                    self._words_and_tail(m, n_elems, r.n_words, r.tail_mask, r.div_q, r.div_r,
                                         r.div_n, done_state="V_FETCH")

            with m.State("V_FETCH"):
                m.next = "V_CHECK"

            with m.State("V_CHECK"):
                self._check_uop(m, f, k, r.lim_mem, r.lim_int8, r.streams, r.has_l1, r.written,
                                flags, r.mul_acc, r.mul_cand, r.mul_plier)
                rng.load(m, f, r.n_words)
                with m.If(f.rsrc != RSrc.BUF):
                    # the previous reading micro-op's record: this one follows it
                    m.d.comb += [self.phase_init.en.eq(seen_read),
                                 self.phase_init.index.eq(r.prev_read),
                                 self.phase_init.addr.eq(r.prev_addr),
                                 self.phase_init.next.eq(k)]
                    m.d.sync += [r.prev_read.eq(k), r.prev_addr.eq(f.addr), seen_read.eq(1)]
                    with m.If(~seen_read):
                        m.d.sync += r.first_read.eq(k)
                m.next = "V_DECIDE"

            with m.State("V_DECIDE"):
                rng.update(m)
                # the registered outcome of V_CHECK, in validate's order
                with m.If(flags.bad_opcode):
                    self._reject(m, Status.BAD_OPCODE)
                with m.Elif(flags.bad_operand):
                    self._reject(m, Status.BAD_OPERAND)
                with m.Elif(flags.bad_addr):         # also GROUP with addr >= mem_words
                    self._reject(m, Status.BAD_ADDR)
                with m.Elif(flags.group_scaled):
                    m.next = "V_GROUP"
                with m.Else():
                    self._next_uop(m, r)

            with m.State("V_GROUP"):
                # shift-add: mul_acc = (mem_words - addr) * (param * L)
                with m.If(r.mul_plier == 0):
                    with m.If(r.n_words > r.mul_acc):        # W - 1 >= acc
                        self._reject(m, Status.BAD_ADDR)
                    with m.Else():
                        m.next = "V_NEXT"
                with m.Else():
                    with m.If(r.mul_plier[0]):
                        m.d.sync += r.mul_acc.eq(r.mul_acc + r.mul_cand)
                    m.d.sync += [r.mul_plier.eq(r.mul_plier >> 1),
                                 r.mul_cand.eq(r.mul_cand << 1)]

            with m.State("V_NEXT"):
                self._next_uop(m, r)

            with m.State("V_END"):
                # the last reading micro-op's record: the first one follows, a block later
                m.d.comb += [self.phase_init.en.eq(seen_read),
                             self.phase_init.index.eq(r.prev_read),
                             self.phase_init.addr.eq(r.prev_addr),
                             self.phase_init.next.eq(r.first_read), self.phase_init.wrap.eq(1)]
                with m.If(r.streams > cfg.max_streams):
                    self._reject(m, Status.TOO_MANY_STREAMS)
                with m.Else():
                    m.d.comb += self.accept.eq(1)
                    m.next = "IDLE"
        return fsm

    def _words_and_tail(self, m, n_elems, n_words, tail_mask, div_q, div_r, div_n, done_state):
        """W = ceil(N/L) and the tail lane mask: a shift for a power-of-two L, else a
        restoring divider (one quotient bit per cycle, 32 cycles)."""
        L = self.cfg.lanes
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

    def _check_uop(self, m, f, k, lim_mem, lim_int8, streams, has_l1, written, flags, mul_acc,
                   mul_cand, mul_plier):
        """One micro-op of :func:`coda.hw.nme.isa.validate` (opcode, operand, address rules),
        its outcome registered in ``flags`` (:class:`_CheckFlags`) for ``V_DECIDE``; also
        marks its ``d`` in the ``written``
        mask (nbuf bits) that the later micro-ops' reads are checked against, and loads the
        GROUP multiply's operands."""
        cfg = self.cfg
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
        # addr + extent > mem_words, as addr > mem_words - extent: the limits that depend on
        # W alone are registers (lim_mem, lim_int8), so one compare follows the word
        beyond = Signal()
        with m.If(store_f | (rsrc_f == RSrc.MEM)):
            m.d.comb += beyond.eq(addr_f > lim_mem)           # extent W
        with m.Elif(rsrc_f == RSrc.CHAN):
            m.d.comb += beyond.eq(addr_f + param_f > cfg.mem_words)
        with m.Elif(rsrc_f == RSrc.INT8):
            m.d.comb += beyond.eq(addr_f > lim_int8)          # extent ceil(W / 2)
        with m.Elif(rsrc_f == RSrc.GROUP):
            m.d.comb += beyond.eq(addr_f >= cfg.mem_words)    # scalar; scaled: V_GROUP
        with m.Else():
            m.d.comb += beyond.eq(addr_f > cfg.mem_words)
        bad_addr = is_mem & beyond

        m.d.sync += [streams.eq(streams + is_mem), has_l1.eq(has_l1 | is_l1),
                     written.eq(written | Cat(*[d_used & (d_f == b) for b in range(NB)])),
                     flags.bad_opcode.eq(bad_opcode), flags.bad_operand.eq(bad_operand),
                     flags.bad_addr.eq(bad_addr), flags.group_scaled.eq(group_scaled),
                     # the GROUP multiply's operands (used only if V_DECIDE goes to V_GROUP)
                     mul_acc.eq(0), mul_cand.eq(cfg.mem_words - addr_f),
                     mul_plier.eq(param_f * L)]


class _RangeRegs:
    """The trailing-store rule (:func:`stores_may_trail`) in registers: ``V_CHECK`` registers
    the micro-op's range (:meth:`load`), ``V_DECIDE`` compares it with the read ranges so far
    and widens them (:meth:`update`); ``trail`` is the rule's outcome."""

    def __init__(self):
        end_bits = max(ADDR_BITS, 32) + 1
        self.addr = Signal(ADDR_BITS, name="rng_addr")      # the micro-op's start
        self.end = Signal(end_bits, name="rng_end")          # ... and end (exclusive)
        self.store, self.mem, self.other = (Signal(name=f"rng_{n}") for n in
                                            ("store", "mem", "other"))
        # the MEM read streams' lowest start and highest end, the other read streams'
        self.mem_any, self.other_any = Signal(name="rng_mem_any"), Signal(name="rng_other_any")
        self.mem_lo, self.other_lo = (Signal(ADDR_BITS, name=f"rng_{n}_lo") for n in
                                      ("mem", "other"))
        self.mem_hi, self.other_hi = (Signal(end_bits, name=f"rng_{n}_hi") for n in
                                      ("mem", "other"))
        self.seen_store = Signal(name="rng_seen_store")
        self.trail = Signal(name="rng_trail")

    def clear(self, m):
        m.d.sync += [self.mem_any.eq(0), self.other_any.eq(0), self.seen_store.eq(0),
                     self.trail.eq(1)]

    def load(self, m, f, n_words):
        """V_CHECK: the range of micro-op ``f`` (:class:`coda.hw.nme.iface.UopFields`)."""
        is_read = f.rsrc != RSrc.BUF
        m.d.sync += [self.addr.eq(f.addr),
                     self.end.eq(f.addr + Mux(f.rsrc == RSrc.CHAN, f.param, n_words)),
                     self.store.eq(f.store), self.mem.eq(is_read & (f.rsrc == RSrc.MEM)),
                     self.other.eq(is_read & (f.rsrc != RSrc.MEM))]

    def update(self, m):
        """V_DECIDE: a store against the reads so far; a read after a store, or widening."""
        a, e = self.addr, self.end
        mem_ok = ~self.mem_any | (self.mem_lo >= a) | (self.mem_hi <= a)
        other_ok = ~self.other_any | (self.other_hi <= a) | (self.other_lo >= e)
        with m.If(self.store):
            m.d.sync += self.seen_store.eq(1)
            with m.If(~mem_ok | ~other_ok):
                m.d.sync += self.trail.eq(0)
        for is_kind, any_, lo, hi in ((self.mem, self.mem_any, self.mem_lo, self.mem_hi),
                                      (self.other, self.other_any, self.other_lo,
                                       self.other_hi)):
            with m.If(is_kind):
                m.d.sync += [any_.eq(1), lo.eq(Mux(~any_ | (a < lo), a, lo)),
                             hi.eq(Mux(~any_ | (e > hi), e, hi))]
                with m.If(self.seen_store):
                    m.d.sync += self.trail.eq(0)


class _CheckFlags:
    """V_CHECK's outcome for one micro-op, registered for V_DECIDE (one bit each)."""

    def __init__(self):
        self.bad_opcode = Signal(name="chk_bad_opcode")
        self.bad_operand = Signal(name="chk_bad_operand")
        self.bad_addr = Signal(name="chk_bad_addr")
        self.group_scaled = Signal(name="chk_group_scaled")
