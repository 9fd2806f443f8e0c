"""Rank-local DRAM memory controller in Amaranth: the DRAM timing model of the DIMM-NMP.

One :class:`DRAMController` drives one rank (see :mod:`coda.hw.dram_standards` for what a
rank is per standard). It runs on the DRAM command clock (one cycle = one tCK) and issues at
most one command per cycle. Every bank and bank-group constraint is a timestamp: a command sets
the earliest cycle at which a dependent command may issue (``now + tXX``, keeping a later one
already set), and the dependent command waits until the free-running cycle counter ``now``
reaches it; tFAW (the four latest ACTs) and the refresh interval are down-counters. So the
command stream obeys the standard cycle by cycle *by construction*; :mod:`coda.cosim.dram_check`
verifies it independently from the command log.

Per-bank and per-bank-group timestamps and open rows live in small RAMs indexed by bank, and
the request queues are circular buffers in RAMs: a cycle reads the bank state only of the
entries the scheduler looks at and writes only what the issued command changes, which keeps
the Verilated model fast: a cycle costs O(lookahead^2) bank comparisons plus the hazard
comparisons against every queued address (O(read_queue + write_queue)), not
O(banks x queue depth) counter and shift-register updates. A constraint a command puts on every
*other* bank group (tCCD_S, tRRD_S, tWTR_S) is one shared timestamp; the group's own (the _L
value) is at least as long, so max(own, shared) equals the per-group constraint. The timestamps
and ``now`` are not reset: a controller reset forgets queued requests and open rows, not the
timing constraints the DRAM still obeys.

Address mapping (burst address ``a``, one burst = ``std.burst_bytes``), LSB first::

    [ bank group | column burst | bank | row ]

consecutive bursts rotate through the bank groups (so a stream pays tCCD_S, not tCCD_L),
then walk a row; the bank index is permuted with the row (Zhang et al., MICRO-33 2000,
permutation-based page interleaving): ``bank = bank_field XOR fold(row)`` where ``fold``
XORs the row's ``log2(banks_per_group)``-bit chunks. Streams a power-of-two distance apart
(STREAM's arrays) thus open rows in different banks instead of conflicting in one.

Scheduling: open-page policy; separate read and write queues, each issued *in order* for
column commands (so read responses return in request order, no reorder buffer), with
*row-command lookahead*: ACT/PRE may be issued for any of the first ``lookahead`` entries of
the active queue whose bank no older entry of that queue uses (a row still needed by an older
request is never closed). Column commands have priority over row commands. Writes are
buffered and drained in batches (write mode from ``write_high`` queued writes down to
``write_low``, or whenever no read waits); a read whose address has a queued write drains the
writes first (read-after-write), and a write whose address matches a queued read is not
accepted until that read has issued (write-after-read). Refresh: every tREFI cycles a REF
becomes pending; new commands stop, PREA closes the open banks once tRAS/tRTP/tWR allow, and
REF issues once tRPab/tRC allow; nothing else issues for tRFC.

Known simplifications: DDR5's two-cycle ACT/RD/WR command encoding and LPDDR5's
WCK-sync and two-part ACT are modelled as one command slot per tCK; no power-down; no
per-bank refresh.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .dram_standards import DRAMStandard, get_standard

__all__ = ["Cmd", "DRAMController", "WordAdapter", "DRAMWordMemory", "map_burst_address", "dram_verilog",
           "STAT_NAMES", "NME_ADDR_BITS"]

NME_ADDR_BITS = 24  # coda.hw.isa.ADDR_BITS: the NME's word address width


class Cmd:
    """Command codes on ``cmd_kind`` (and in the SV device's log)."""
    NOP, ACT, PRE, PREA, RD, WR, REF = range(7)
    NAMES = {1: "ACT", 2: "PRE", 3: "PREA", 4: "RD", 5: "WR", 6: "REF"}


# Statistics outputs of the controller, each ``stat_<name>``, 48 bits.
STAT_NAMES = ("reads", "writes", "row_hits", "row_misses", "row_conflicts", "read_latency",
              "cycles", "refreshes")
STAT_BITS = 48


def _log2(n: int) -> int:
    return (n - 1).bit_length()


def _fold(row: int, row_bits: int, chunk: int) -> int:
    out = 0
    for lo in range(0, row_bits, chunk):
        out ^= (row >> lo) & ((1 << chunk) - 1)
    return out


def map_burst_address(std: DRAMStandard | str, addr: int) -> tuple[int, int, int, int]:
    """Python model of the controller's address mapping.

    Args:
        std: the DRAM standard; addr: burst address (bytes // std.burst_bytes),
            ``0 <= addr < 2**std.burst_addr_bits``.
    Returns:
        ``(bankgroup, bank, row, column)`` with ``column`` the device column of the burst's
        first beat (column burst * BL).
    Raises:
        ValueError: address out of the rank.
    """
    std = get_standard(std)
    if not 0 <= addr < (1 << std.burst_addr_bits):
        raise ValueError(f"burst address {addr}: expected 0..{(1 << std.burst_addr_bits) - 1}")
    gb, cb, bb = _log2(std.bank_groups), _log2(std.bursts_per_row), _log2(std.banks_per_group)
    rb = _log2(std.rows)
    bg = addr & ((1 << gb) - 1)
    col = (addr >> gb) & ((1 << cb) - 1)
    ba = (addr >> (gb + cb)) & ((1 << bb) - 1)
    row = (addr >> (gb + cb + bb)) & ((1 << rb) - 1)
    return bg, ba ^ _fold(row, rb, bb), row, col * std.burst_length


class _Fields:
    """Amaranth expressions of the mapped fields of a burst address (see module docstring)."""

    def __init__(self, std: DRAMStandard, addr):
        gb, cb, bb = _log2(std.bank_groups), _log2(std.bursts_per_row), _log2(std.banks_per_group)
        rb = _log2(std.rows)
        self.bg = addr[0:gb]
        self.col = addr[gb:gb + cb]
        self.row = addr[gb + cb + bb:gb + cb + bb + rb]
        fold = addr[gb + cb:gb + cb + bb]
        for lo in range(0, rb, bb):
            fold = fold ^ self.row[lo:min(lo + bb, rb)]
        self.ba = fold[:bb]
        self.bank = Cat(self.bg, self.ba)  # bank index = ba * bank_groups + bg


class DRAMController(wiring.Component):
    """In-order-with-lookahead, open-page controller of one DRAM rank (one clock = one tCK).

    Parameters:
        std: a :class:`DRAMStandard` or preset name.
        read_queue, write_queue: queue depths in bursts (write_queue a power of two).
        write_high, write_low: write-drain watermarks (default 3/4 and 1/4 of write_queue).
        lookahead: queue entries considered for ACT/PRE (default 8).

    Ports (A = std.burst_addr_bits, D = 8 * std.burst_bytes):
        req_valid/req_ready/req_we/req_addr[A]/req_wdata[D]/req_wmask[D/8]: burst requests,
            a transfer is valid & ready (ready may depend on we/addr: hazards).
        rsp_valid/rsp_data[D]: read data, in read-request order, always accepted.
        cmd_kind[3] (:class:`Cmd`), cmd_bg, cmd_ba, cmd_row, cmd_col (device column of the
            first beat), cmd_wdata[D], cmd_wmask[D/8]: the command issued this cycle.
        rd_valid/rd_data[D]: the device's read burst, ``CL + nBL`` cycles after its RD.
        idle: no queued request and no read in flight.
        stat_<name>[48] for name in :data:`STAT_NAMES`: column commands by kind, row
            hit/miss/conflict per request (classified by the commands its bank needed),
            total read latency (acceptance to response, cycles), cycles since reset, REFs.

    Raises:
        ValueError: bad queue parameters, or a standard whose same-bank-group constraint is
            shorter than the other-group one (tCCD_L < tCCD_S...; no JEDEC preset).
    """

    def __init__(self, std, *, read_queue: int = 16, write_queue: int = 32,
                 write_high: int | None = None, write_low: int | None = None,
                 lookahead: int = 8):
        std = get_standard(std)
        if read_queue < 1:
            raise ValueError(f"read_queue={read_queue}: expected >= 1")
        if write_queue < 2 or write_queue & (write_queue - 1):
            raise ValueError(f"write_queue={write_queue}: expected a power of two >= 2")
        write_high = write_queue * 3 // 4 if write_high is None else write_high
        write_low = write_queue // 4 if write_low is None else write_low
        if not 0 <= write_low < write_high <= write_queue:
            raise ValueError(f"write_low={write_low}, write_high={write_high}: expected "
                             f"0 <= low < high <= write_queue={write_queue}")
        if lookahead < 1:
            raise ValueError(f"lookahead={lookahead}: expected >= 1")
        if std.bank_groups < 2 or std.banks_per_group < 2:
            raise ValueError(f"{std.name}: expected >= 2 bank groups and banks per group")
        for same, other in (("tCCD_L", "tCCD_S"), ("write_to_read_l", "write_to_read_s"),
                            ("tCCD_L_WR", "tCCD_S"), ("tRRD_L", "tRRD_S")):
            if getattr(std, same) < getattr(std, other):
                raise ValueError(f"{std.name}: {same}={getattr(std, same)} < "
                                 f"{other}={getattr(std, other)}; expected the same-bank-group "
                                 f"constraint to be at least the other-group one")
        self.std = std
        self.read_queue, self.write_queue = read_queue, write_queue
        self.write_high, self.write_low, self.lookahead = write_high, write_low, lookahead
        A, D = std.burst_addr_bits, 8 * std.burst_bytes
        members = {
            "req_valid": In(1), "req_ready": Out(1), "req_we": In(1), "req_addr": In(A),
            "req_wdata": In(D), "req_wmask": In(D // 8),
            "rsp_valid": Out(1), "rsp_data": Out(D),
            "cmd_kind": Out(3), "cmd_bg": Out(_log2(std.bank_groups)),
            "cmd_ba": Out(_log2(std.banks_per_group)), "cmd_row": Out(_log2(std.rows)),
            "cmd_col": Out(_log2(std.columns)), "cmd_wdata": Out(D), "cmd_wmask": Out(D // 8),
            "rd_valid": In(1), "rd_data": In(D),
            "idle": Out(1),
        }
        for name in STAT_NAMES:
            members[f"stat_{name}"] = Out(STAT_BITS)
        super().__init__(members)

    # ------------------------------------------------------------------------------------
    def elaborate(self, platform):
        std = self.std
        m = Module()
        A, D = std.burst_addr_bits, 8 * std.burst_bytes
        nbank, nbg = std.banks, std.bank_groups
        RQ, WQ, L = self.read_queue, self.write_queue, self.lookahead
        gb = _log2(nbg)
        T = STAT_BITS

        cycle = Signal(T)                   # cycles since reset (stat_cycles, request stamps)
        now = Signal(T, reset_less=True)    # time base of the constraint timestamps
        m.d.sync += [cycle.eq(cycle + 1), now.eq(now + 1)]

        def after(stamp):
            """The constraint whose earliest cycle is ``stamp`` allows a command now."""
            return now >= stamp

        def later(a, b):
            return Mux(a > b, a, b)

        def table(depth, name, shape):
            mem = Memory(shape=unsigned(shape), depth=depth, init=[])
            m.submodules[name] = mem
            return mem

        def read(mem, index):
            """Data of a new combinational read port of ``mem`` at ``index``."""
            port = mem.read_port(domain="comb")
            m.d.comb += port.addr.eq(index)
            return port.data

        # ---- queues: circular buffers in RAMs (bank index stored at push), write data RAM
        def queue(depth, name, with_ts):
            slots = max(2, 1 << _log2(depth))
            mem = table(slots, f"{name}_entries", A + _log2(nbank))
            q = {"mem": mem, "wr": mem.write_port(), "depth": depth, "slots": slots,
                 "head": Signal(range(slots), name=f"{name}_head"),
                 "tail": Signal(range(slots), name=f"{name}_tail"),
                 "count": Signal(range(depth + 1), name=f"{name}_count"),
                 "used": Signal(slots, name=f"{name}_used"),     # slot holds an entry
                 "act": Signal(slots, name=f"{name}_act"),       # its bank needed an ACT
                 "pre": Signal(slots, name=f"{name}_pre")}       # ... and a PRE
            if with_ts:
                ts = table(slots, f"{name}_stamps", 32)
                q["ts_wr"], q["ts"] = ts.write_port(), read(ts, q["head"])
            return q

        def entry(q, index):
            """(valid, addr, bank) of the queue's entry ``index`` (0 = oldest)."""
            if index >= q["depth"]:
                return Const(0), Const(0, A), Const(0, _log2(nbank))
            data = read(q["mem"], q["head"] + index)
            return q["count"] > index, data[:A], data[A:]

        def slot_addr(q, k):
            """(holds an entry, its address) of physical slot ``k`` (for the hazard CAMs)."""
            return q["used"][k], read(q["mem"], k)[:A]

        rq, wq = queue(RQ, "rq", True), queue(WQ, "wq", False)
        m.submodules.wdata = wmem = Memory(shape=unsigned(D + D // 8), depth=WQ, init=[])
        wmem_w = wmem.write_port()
        wmem_r = wmem.read_port(domain="comb")
        m.d.comb += wmem_r.addr.eq(wq["head"])

        # ---- bank / bank-group state: open rows and constraint timestamps, one RAM word per
        # bank (group); a command updates one word. A constraint that a command puts on every
        # bank (group) other than its own is a single "_any" timestamp: with same-group values
        # >= other-group values (checked in __init__) max(own, any) is the per-group counter.
        is_open = Signal(nbank)
        open_row = table(nbank, "open_row", _log2(std.rows))
        act_at, pre_at, col_at = (table(nbank, n, T) for n in ("act_at", "pre_at", "col_at"))
        rd_at, wr_at, rrd_at = (table(nbg, n, T) for n in ("rd_at", "wr_at", "rrd_at"))
        # in the time base of `now`: kept over a reset, like the RAMs
        act_any, rd_any, wr_any, rrd_any = (Signal(T, name=n, reset_less=True) for n in
                                            ("act_any", "rd_any", "wr_any", "rrd_any"))
        # latest ACT- / PRE-allowed stamp of any bank: all banks may ACT (REF) / PRE (PREA)
        act_all = Signal(T, reset_less=True)
        pre_all = Signal(T, reset_less=True)
        faw = [Signal(range(std.tFAW + 1), name=f"faw{k}") for k in range(4)]
        faw_ok = faw[3] == 0

        # ---- refresh timer
        ref_timer = Signal(range(std.tREFI), init=std.tREFI - 1)  # first REF after tREFI
        ref_pending = Signal()
        with m.If(ref_timer == 0):
            m.d.sync += [ref_timer.eq(std.tREFI - 1), ref_pending.eq(1)]
        with m.Else():
            m.d.sync += ref_timer.eq(ref_timer - 1)

        # ---- write mode and hazards (the CAM compares every queued address)
        wmode = Signal()
        r0 = entry(rq, 0)
        r0_valid, r0_addr = r0[0], r0[1]
        raw = Signal()
        w_slots = [slot_addr(wq, k) for k in range(wq["slots"])]
        r_slots = [slot_addr(rq, k) for k in range(rq["slots"])]
        m.d.comb += raw.eq(r0_valid & _any(u & (a == r0_addr) for u, a in w_slots))
        with m.If(~wmode):
            with m.If((wq["count"] >= self.write_high) | ((rq["count"] == 0) & (wq["count"] > 0))
                      | raw):
                m.d.sync += wmode.eq(1)
        with m.Else():
            with m.If((wq["count"] == 0)
                      | ((wq["count"] <= self.write_low) & (rq["count"] > 0) & ~raw)):
                m.d.sync += wmode.eq(0)

        # ---- the active queue's first `lookahead` entries
        n_look = max(min(L, RQ), min(L, WQ))
        look = []
        for i in range(n_look):
            rv, ra, rb = entry(rq, i) if i > 0 else r0
            wv, wa, wb = entry(wq, i)
            look.append((Mux(wmode, wv, rv), _Fields(std, Mux(wmode, wa, ra)), Mux(wmode, wb, rb)))

        # ---- column command candidate (the active queue's head)
        v0, f0, b0 = look[0]
        hit0 = is_open.bit_select(b0, 1) & (read(open_row, b0) == f0.row)
        col_ok0 = after(read(col_at, b0))
        rd_go = Signal()
        wr_go = Signal()
        m.d.comb += [
            rd_go.eq(~ref_pending & ~wmode & v0 & hit0 & col_ok0
                     & after(read(rd_at, f0.bg)) & after(rd_any) & ~raw),
            wr_go.eq(~ref_pending & wmode & v0 & hit0 & col_ok0
                     & after(read(wr_at, f0.bg)) & after(wr_any)),
        ]

        # ---- row command candidates (lookahead over the active queue)
        act_common = after(act_any) & after(rrd_any) & faw_ok & ~ref_pending
        cand_act = [Signal(name=f"cand_act{i}") for i in range(n_look)]
        cand_pre = [Signal(name=f"cand_pre{i}") for i in range(n_look)]
        for i, (v, f, b) in enumerate(look):
            front = v   # entries older than a valid one are valid
            for j in range(i):
                front = front & (look[j][2] != b)
            opened = is_open.bit_select(b, 1)
            m.d.comb += [
                cand_act[i].eq(front & ~opened & after(read(act_at, b))
                               & after(read(rrd_at, f.bg)) & act_common),
                cand_pre[i].eq(front & opened & (read(open_row, b) != f.row)
                               & after(read(pre_at, b)) & ~ref_pending),
            ]

        # ---- refresh commands
        any_open = is_open.any()
        prea_go = Signal()
        ref_go = Signal()
        m.d.comb += [
            prea_go.eq(ref_pending & any_open & after(pre_all)),
            ref_go.eq(ref_pending & ~any_open & after(act_all)),
        ]

        # ---- choose one command
        kind = Signal(3)
        sel = Signal(range(max(n_look, 2)))  # lookahead entry of the command (0: RD/WR)
        with m.If(prea_go):
            m.d.comb += kind.eq(Cmd.PREA)
        with m.Elif(ref_go):
            m.d.comb += kind.eq(Cmd.REF)
        with m.Elif(rd_go):
            m.d.comb += kind.eq(Cmd.RD)
        with m.Elif(wr_go):
            m.d.comb += kind.eq(Cmd.WR)
        with m.Else():
            for i in reversed(range(n_look)):  # the oldest candidate wins (last assignment)
                with m.If(cand_act[i] | cand_pre[i]):
                    m.d.comb += [kind.eq(Mux(cand_act[i], Cmd.ACT, Cmd.PRE)), sel.eq(i)]
        r_sel = read(rq["mem"], rq["head"] + sel)
        w_sel = read(wq["mem"], wq["head"] + sel)
        sel_entry = Mux(kind.matches(Cmd.PREA, Cmd.REF), 0, Mux(wmode, w_sel, r_sel))
        f = _Fields(std, sel_entry[:A])
        bank = sel_entry[A:]
        is_act, is_pre = kind == Cmd.ACT, kind == Cmd.PRE
        is_rd, is_wr = kind == Cmd.RD, kind == Cmd.WR
        is_prea, is_ref = kind == Cmd.PREA, kind == Cmd.REF
        m.d.comb += [
            self.cmd_kind.eq(kind), self.cmd_bg.eq(f.bg), self.cmd_ba.eq(f.ba),
            self.cmd_row.eq(f.row), self.cmd_col.eq(f.col << _log2(std.burst_length)),
            self.cmd_wdata.eq(wmem_r.data[:D]), self.cmd_wmask.eq(wmem_r.data[D:]),
        ]

        # ---- state updates from the issued command (stamp = now + the constraint's cycles)
        def update(mem, index, en, stamp, keep_later=True):
            port = mem.write_port()
            m.d.comb += [port.addr.eq(index), port.en.eq(en),
                         port.data.eq(later(read(mem, index), stamp) if keep_later else stamp)]

        act_stamp = now + Mux(is_act, std.tRC, std.tRP)
        update(act_at, bank, is_act | is_pre, act_stamp)
        pre_stamp = now + Mux(is_act, std.tRAS, Mux(is_rd, std.tRTP, std.write_to_pre))
        update(pre_at, bank, is_act | is_rd | is_wr, pre_stamp)
        update(col_at, bank, is_act, now + std.tRCD, keep_later=False)
        update(rd_at, f.bg, is_rd | is_wr, now + Mux(is_rd, std.tCCD_L, std.write_to_read_l))
        update(wr_at, f.bg, is_wr, now + std.tCCD_L_WR, keep_later=False)
        update(rrd_at, f.bg, is_act, now + std.tRRD_L, keep_later=False)
        orow_w = open_row.write_port()
        m.d.comb += [orow_w.addr.eq(bank), orow_w.data.eq(f.row), orow_w.en.eq(is_act)]
        all_stamp = now + Mux(is_prea, std.tRPab, std.tRFC)
        with m.If(is_prea | is_ref):
            m.d.sync += [act_any.eq(later(act_any, all_stamp)),
                         act_all.eq(later(act_all, all_stamp))]
        with m.If(is_act | is_pre):
            m.d.sync += act_all.eq(later(act_all, act_stamp))
        with m.If(is_act | is_rd | is_wr):
            m.d.sync += pre_all.eq(later(pre_all, pre_stamp))
        with m.If(is_rd | is_wr):
            m.d.sync += rd_any.eq(later(rd_any, now + Mux(is_rd, std.tCCD_S,
                                                          std.write_to_read_s)))
            m.d.sync += wr_any.eq(later(wr_any, now + Mux(is_rd, max(std.tRTW, std.tCCD_L),
                                                          std.tCCD_S)))
        with m.If(is_act):
            m.d.sync += [rrd_any.eq(now + std.tRRD_S),
                         is_open.eq(is_open | (Const(1, nbank) << bank)[:nbank])]
        with m.If(is_pre):
            m.d.sync += is_open.eq(is_open & ~(Const(1, nbank) << bank)[:nbank])
        with m.If(is_prea):
            m.d.sync += is_open.eq(0)
        # four-activate window: faw[k] = cycles until the (k+1)-th latest ACT leaves the window
        dec = [Mux(x == 0, 0, x - 1) for x in faw]
        with m.If(is_act):
            m.d.sync += [faw[0].eq(std.tFAW - 1)] + [faw[k].eq(dec[k - 1]) for k in range(1, 4)]
        with m.Else():
            m.d.sync += [faw[k].eq(dec[k]) for k in range(4)]
        with m.If(is_ref):
            m.d.sync += ref_pending.eq(0)
            with m.If(ref_timer == 0):  # a new interval elapsed in the same cycle: keep it
                m.d.sync += ref_pending.eq(1)

        # ---- queue updates
        push = self.req_valid & self.req_ready
        war = _any(u & (a == self.req_addr) for u, a in r_slots)
        m.d.comb += self.req_ready.eq(Mux(self.req_we, (wq["count"] < WQ) & ~war,
                                          rq["count"] < RQ))
        req_bank = _Fields(std, self.req_addr).bank
        row_cmd = is_act | is_pre
        for q, pop, push_q, active in ((rq, is_rd, push & ~self.req_we, ~wmode),
                                       (wq, is_wr, push & self.req_we, wmode)):
            slots = q["slots"]
            one = Const(1, slots)
            m.d.comb += [q["wr"].addr.eq(q["tail"]), q["wr"].en.eq(push_q),
                         q["wr"].data.eq(Cat(self.req_addr, req_bank))]
            if "ts_wr" in q:
                m.d.comb += [q["ts_wr"].addr.eq(q["tail"]), q["ts_wr"].en.eq(push_q),
                             q["ts_wr"].data.eq(cycle[:32])]
            at_tail = Mux(push_q, (one << q["tail"])[:slots], 0)
            at_head = Mux(pop, (one << q["head"])[:slots], 0)
            at_sel = Mux(row_cmd & active, (one << (q["head"] + sel)[:len(q["head"])])[:slots], 0)
            m.d.sync += [
                q["used"].eq((q["used"] & ~at_head) | at_tail),
                q["act"].eq((q["act"] & ~at_tail) | Mux(is_act, at_sel, 0)),
                q["pre"].eq((q["pre"] & ~at_tail) | Mux(is_pre, at_sel, 0)),
                q["head"].eq(q["head"] + pop), q["tail"].eq(q["tail"] + push_q),
                q["count"].eq(q["count"] + push_q - pop),
            ]
        m.d.comb += [wmem_w.addr.eq(wq["tail"]),
                     wmem_w.data.eq(Cat(self.req_wdata, self.req_wmask)),
                     wmem_w.en.eq(push & self.req_we)]

        # ---- responses, idle, statistics
        inflight = Signal(range(64))
        m.d.sync += inflight.eq(inflight + is_rd - self.rd_valid)
        m.d.comb += [self.rsp_valid.eq(self.rd_valid), self.rsp_data.eq(self.rd_data),
                     self.idle.eq((rq["count"] == 0) & (wq["count"] == 0) & (inflight == 0))]
        stats = {n: Signal(STAT_BITS, name=f"st_{n}") for n in STAT_NAMES}
        head_act = Mux(is_rd, rq["act"].bit_select(rq["head"], 1),
                       wq["act"].bit_select(wq["head"], 1))
        head_pre = Mux(is_rd, rq["pre"].bit_select(rq["head"], 1),
                       wq["pre"].bit_select(wq["head"], 1))
        col = is_rd | is_wr
        m.d.sync += [
            stats["reads"].eq(stats["reads"] + is_rd),
            stats["writes"].eq(stats["writes"] + is_wr),
            stats["row_hits"].eq(stats["row_hits"] + (col & ~head_act & ~head_pre)),
            stats["row_misses"].eq(stats["row_misses"] + (col & head_act & ~head_pre)),
            stats["row_conflicts"].eq(stats["row_conflicts"] + (col & head_pre)),
            stats["refreshes"].eq(stats["refreshes"] + is_ref),
        ]
        with m.If(is_rd):
            m.d.sync += stats["read_latency"].eq(
                stats["read_latency"] + (cycle[:32] - rq["ts"])[:32] + std.read_latency)
        m.d.comb += stats["cycles"].eq(cycle)
        for n in STAT_NAMES:
            m.d.comb += getattr(self, f"stat_{n}").eq(stats[n])
        return m


def _any(terms):
    out = Const(0)
    for t in terms:
        out = out | t
    return out



class WordAdapter(wiring.Component):
    """Between the NME's word port and a controller's burst port.

    Words are ``16 * lanes`` bits (``2 * lanes`` bytes) at word addresses; word ``w`` is at
    byte ``w * 2 * lanes`` of the rank. ``2 * lanes`` must divide ``burst_bytes`` or be a
    multiple of it (lanes a power of two for 64-byte bursts).

    Word <= burst: a read whose burst is the one the previous read fetched (and no write to
    it came between) is served from the line buffer without a new burst read; writes merge
    into one pending burst with a byte mask, flushed when a write leaves that burst, a read
    touches it, or a cycle passes without a request. Word > burst: each word is
    ``2*lanes/burst_bytes`` consecutive bursts, read and reassembled in order.

    NME side (contract of :mod:`coda.hw.nme`): ``mem_req_valid``, ``mem_req_ready``,
    ``mem_req_we``, ``mem_req_addr[24]``, ``mem_req_wdata[16L]``, ``mem_req_wmask[L]``
    (per-element write enable), ``mem_rsp_valid``, ``mem_rsp_data[16L]`` (in order, always
    accepted). Burst side: ``bus_req_*`` / ``bus_rsp_*`` matching :class:`DRAMController`'s
    ``req_*`` / ``rsp_*``. ``idle``: nothing pending or in flight here.

    Raises:
        ValueError: lanes out of 1..64 or word size incompatible with the burst size.
    """

    def __init__(self, lanes: int, burst_bytes: int, burst_addr_bits: int, *,
                 max_bursts_in_flight: int = 8, max_words_in_flight: int = 32):
        if not 1 <= lanes <= 64:
            raise ValueError(f"lanes={lanes}: expected 1..64")
        word_bytes = 2 * lanes
        if burst_bytes % word_bytes and word_bytes % burst_bytes:
            raise ValueError(f"lanes={lanes}: a {word_bytes}-byte word must divide or be a "
                             f"multiple of the {burst_bytes}-byte burst")
        self.lanes, self.word_bytes, self.burst_bytes = lanes, word_bytes, burst_bytes
        self.words_per_burst = max(1, burst_bytes // word_bytes)
        self.bursts_per_word = max(1, word_bytes // burst_bytes)
        if (self.words_per_burst & (self.words_per_burst - 1)
                or self.bursts_per_word & (self.bursts_per_word - 1)):
            raise ValueError(f"lanes={lanes}: words per burst must be a power of two")
        self.max_bursts, self.max_words = max_bursts_in_flight, max_words_in_flight
        D = 8 * burst_bytes
        super().__init__({
            "mem_req_valid": In(1), "mem_req_ready": Out(1), "mem_req_we": In(1),
            "mem_req_addr": In(NME_ADDR_BITS), "mem_req_wdata": In(16 * lanes),
            "mem_req_wmask": In(lanes),
            "mem_rsp_valid": Out(1), "mem_rsp_data": Out(16 * lanes),
            "bus_req_valid": Out(1), "bus_req_ready": In(1), "bus_req_we": Out(1),
            "bus_req_addr": Out(burst_addr_bits), "bus_req_wdata": Out(D),
            "bus_req_wmask": Out(D // 8),
            "bus_rsp_valid": In(1), "bus_rsp_data": In(D),
            "idle": Out(1),
        })

    def _byte_mask(self, wmask):
        return Cat(Cat(b, b) for b in wmask)

    def elaborate(self, platform):
        if self.bursts_per_word > 1:
            return self._elaborate_wide()
        return self._elaborate_narrow()

    def _elaborate_narrow(self):
        m = Module()
        W, wpb, D = self.word_bytes, self.words_per_burst, 8 * self.burst_bytes
        ob = _log2(wpb)
        tag = self.mem_req_addr[ob:]
        off = self.mem_req_addr[:ob] if ob else Const(0, 1)

        # pending write burst
        p_valid, p_tag = Signal(), Signal(len(self.bus_req_addr))
        p_data, p_mask = Signal(D), Signal(D // 8)
        # read line reuse
        r_valid, r_tag = Signal(), Signal(len(self.bus_req_addr))
        m.submodules.order = order = SyncFIFO(width=1 + max(ob, 1), depth=self.max_words)
        m.submodules.bursts = bursts = SyncFIFO(width=D, depth=self.max_bursts)
        outstanding = Signal(range(self.max_bursts + 1))

        req = self.mem_req_valid
        is_w, is_r = req & self.mem_req_we, req & ~self.mem_req_we
        same_p = p_valid & (p_tag == tag)
        reuse = r_valid & (r_tag == tag)
        flush = Signal()      # send the pending write burst this cycle
        rd_burst = Signal()   # send a read burst for this request this cycle
        accept = Signal()
        m.d.comb += [
            flush.eq(p_valid & (~req | (is_w & ~same_p) | (is_r & same_p))),
            rd_burst.eq(is_r & ~same_p & ~reuse & order.w_rdy
                        & (outstanding < self.max_bursts)),
            self.bus_req_valid.eq(flush | rd_burst),
            self.bus_req_we.eq(flush),
            self.bus_req_addr.eq(Mux(flush, p_tag, tag)),
            self.bus_req_wdata.eq(p_data), self.bus_req_wmask.eq(p_mask),
        ]
        sent = self.bus_req_valid & self.bus_req_ready
        m.d.comb += accept.eq(
            (is_w & (same_p | ~p_valid | sent))
            | (is_r & ~same_p & order.w_rdy
               & (reuse | (rd_burst & self.bus_req_ready))))
        m.d.comb += self.mem_req_ready.eq(accept)

        # write merging: a new burst starts from this word only, a same-burst word merges
        bmask = self._byte_mask(self.mem_req_wmask)
        with m.If(flush & sent):
            m.d.sync += [p_valid.eq(0), p_mask.eq(0)]
        with m.If(accept & is_w):
            m.d.sync += [p_valid.eq(1), p_tag.eq(tag)]
            base_mask = Mux(same_p, p_mask, 0)
            for o in range(wpb):
                with m.If(off == o):
                    for j in range(self.lanes):
                        lo = o * W * 8 + 16 * j
                        with m.If(self.mem_req_wmask[j]):
                            m.d.sync += p_data[lo:lo + 16].eq(self.mem_req_wdata[16 * j:16 * j + 16])
                    m.d.sync += p_mask.eq(base_mask | (bmask << (o * W)))
            with m.If(r_tag == tag):
                m.d.sync += r_valid.eq(0)
        with m.If(accept & is_r):
            m.d.sync += [r_valid.eq(1), r_tag.eq(tag)]

        # responses: order FIFO says whether the next word needs a fresh burst
        m.d.comb += [order.w_en.eq(accept & is_r),
                     order.w_data.eq(Cat(off, ~reuse)),
                     bursts.w_en.eq(self.bus_rsp_valid), bursts.w_data.eq(self.bus_rsp_data)]
        line = Signal(D)
        h_off = order.r_data[:max(ob, 1)]
        h_new = order.r_data[max(ob, 1)]
        go = order.r_rdy & (~h_new | bursts.r_rdy)
        src = Mux(h_new, bursts.r_data, line)
        words = Array(src[o * W * 8:(o + 1) * W * 8] for o in range(wpb))
        m.d.comb += [order.r_en.eq(go), bursts.r_en.eq(go & h_new)]
        m.d.sync += [self.mem_rsp_valid.eq(go),
                     self.mem_rsp_data.eq(words[h_off] if wpb > 1 else src)]
        with m.If(go & h_new):
            m.d.sync += line.eq(bursts.r_data)
        m.d.sync += outstanding.eq(outstanding + (rd_burst & self.bus_req_ready) - (go & h_new))
        m.d.comb += self.idle.eq(~p_valid & ~order.r_rdy & (outstanding == 0) & ~self.mem_rsp_valid)
        return m

    def _elaborate_wide(self):
        m = Module()
        k = self.bursts_per_word
        D = 8 * self.burst_bytes
        part = Signal(range(k))
        base = Cat(Const(0, _log2(k)), self.mem_req_addr)
        bmask = self._byte_mask(self.mem_req_wmask)
        parts_d = Array(self.mem_req_wdata[i * D:(i + 1) * D] for i in range(k))
        parts_m = Array(bmask[i * D // 8:(i + 1) * D // 8] for i in range(k))
        inflight = Signal(range(self.max_bursts + 1))
        can = self.mem_req_we | (inflight < self.max_bursts)
        m.d.comb += [
            self.bus_req_valid.eq(self.mem_req_valid & can),
            self.bus_req_we.eq(self.mem_req_we),
            self.bus_req_addr.eq(base | part),
            self.bus_req_wdata.eq(parts_d[part]), self.bus_req_wmask.eq(parts_m[part]),
        ]
        sent = self.bus_req_valid & self.bus_req_ready
        last = part == k - 1
        m.d.comb += self.mem_req_ready.eq(sent & last)
        with m.If(sent):
            m.d.sync += part.eq(Mux(last, 0, part + 1))
        # reassembly: bursts arrive in order, lowest part first
        got = Signal(range(k))
        acc = Signal(16 * self.lanes)
        m.d.sync += self.mem_rsp_valid.eq(0)
        with m.If(self.bus_rsp_valid):
            m.d.sync += acc.eq(Cat(acc[D:], self.bus_rsp_data))
            m.d.sync += got.eq(Mux(got == k - 1, 0, got + 1))
            with m.If(got == k - 1):
                m.d.sync += [self.mem_rsp_valid.eq(1),
                             self.mem_rsp_data.eq(Cat(acc[D:], self.bus_rsp_data))]
        m.d.sync += inflight.eq(inflight + (sent & ~self.mem_req_we) - self.bus_rsp_valid)
        m.d.comb += self.idle.eq((inflight == 0) & (part == 0) & ~self.mem_rsp_valid)
        return m


class DRAMWordMemory(wiring.Component):
    """An NME's rank memory: :class:`WordAdapter` + :class:`DRAMController` in one module.

    Ports: the NME side of :class:`WordAdapter` (``mem_req_*``, ``mem_rsp_*``), the DRAM
    side of :class:`DRAMController` (``cmd_*``, ``rd_valid``, ``rd_data``), ``idle`` (adapter
    and controller both idle: every write is in the device) and ``stat_*``.
    """

    def __init__(self, std, lanes: int, **controller_kw):
        self.std = get_standard(std)
        self.ctrl = DRAMController(self.std, **controller_kw)
        self.adapter = WordAdapter(lanes, self.std.burst_bytes, self.std.burst_addr_bits)
        members = {}
        for name, member in self.adapter.signature.members.items():
            if name.startswith("mem_"):
                members[name] = member
        for name, member in self.ctrl.signature.members.items():
            if name.startswith(("cmd_", "rd_", "stat_")):
                members[name] = member
        members["idle"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.adapter = a = self.adapter
        m.submodules.ctrl = c = self.ctrl
        for name in self.signature.members:
            if name.startswith("mem_req_") and name != "mem_req_ready":
                m.d.comb += getattr(a, name).eq(getattr(self, name))
            elif name in ("mem_req_ready", "mem_rsp_valid", "mem_rsp_data"):
                m.d.comb += getattr(self, name).eq(getattr(a, name))
            elif name.startswith(("cmd_", "stat_")):
                m.d.comb += getattr(self, name).eq(getattr(c, name))
            elif name.startswith("rd_"):
                m.d.comb += getattr(c, name).eq(getattr(self, name))
        m.d.comb += [
            c.req_valid.eq(a.bus_req_valid), a.bus_req_ready.eq(c.req_ready),
            c.req_we.eq(a.bus_req_we), c.req_addr.eq(a.bus_req_addr),
            c.req_wdata.eq(a.bus_req_wdata), c.req_wmask.eq(a.bus_req_wmask),
            a.bus_rsp_valid.eq(c.rsp_valid), a.bus_rsp_data.eq(c.rsp_data),
            self.idle.eq(a.idle & c.idle),
        ]
        return m


def dram_verilog(component: wiring.Component, name: str) -> str:
    """Verilog text of a DRAM component (:class:`DRAMController`, :class:`DRAMWordMemory`)
    as module ``name`` with ports ``clk``, ``rst`` and the component's flat members.

    Raises:
        ValueError: ``name`` is not a Verilog identifier. FileNotFoundError: no yosys.
    """
    from amaranth.back import verilog

    from .yosys import use_pinned_yosys

    if not name.isidentifier():
        raise ValueError(f"name={name!r}: expected a Verilog identifier")
    use_pinned_yosys()
    return verilog.convert(component, name=name, emit_src=False)
