"""Rank-local DRAM memory controller in Amaranth: the DRAM timing model of the DIMM-NMP.

One :class:`DRAMController` drives one rank (see :mod:`coda.hw.dram_standards` for what a
rank is per standard). It runs on the DRAM command clock (one cycle = one tCK) and issues at
most one command per cycle. Every JEDEC constraint is a down-counter that a command loads and
that must read zero before a dependent command may issue, so the command stream obeys the
standard cycle by cycle *by construction*; :mod:`coda.cosim.dram_check` verifies it
independently from the command log.

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


class _Counter:
    """A saturating down-counter holding 'cycles until allowed - 1'; zero means allowed."""

    def __init__(self, max_value: int, name: str):
        self.sig = Signal(range(max(max_value, 2)), name=name)
        self.loads: list[tuple[object, int]] = []

    def load(self, cond, cycles: int):
        """When ``cond`` (a command issued this cycle), the next command may come ``cycles``
        cycles later (cycles >= 1)."""
        self.loads.append((cond, cycles))

    @property
    def ready(self):
        return self.sig == 0

    def elaborate(self, m: Module):
        dec = Mux(self.sig == 0, 0, self.sig - 1)
        nxt = dec
        for cond, cycles in self.loads:
            nxt = Mux(cond & (dec < cycles - 1), cycles - 1, nxt)
        m.d.sync += self.sig.eq(nxt)


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
        ValueError: bad queue parameters.
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

        cycle = Signal(STAT_BITS)
        m.d.sync += cycle.eq(cycle + 1)

        # ---- queues: metadata in shift registers (entry 0 = oldest), write data in a RAM
        def queue(depth, name, with_ts):
            q = {
                "addr": [Signal(A, name=f"{name}_addr{k}") for k in range(depth)],
                "act": [Signal(name=f"{name}_act{k}") for k in range(depth)],
                "pre": [Signal(name=f"{name}_pre{k}") for k in range(depth)],
                "count": Signal(range(depth + 1), name=f"{name}_count"),
                "depth": depth,
            }
            if with_ts:
                q["ts"] = [Signal(32, name=f"{name}_ts{k}") for k in range(depth)]
            q["fields"] = [_Fields(std, a) for a in q["addr"]]
            q["valid"] = [q["count"] > k for k in range(depth)]
            return q

        rq, wq = queue(RQ, "rq", True), queue(WQ, "wq", False)
        m.submodules.wdata = wmem = Memory(shape=unsigned(D + D // 8), depth=WQ, init=[])
        wmem_w = wmem.write_port()
        wmem_r = wmem.read_port(domain="comb")
        w_in = Signal(range(WQ))
        w_out = Signal(range(WQ))
        m.d.comb += wmem_r.addr.eq(w_out)

        # ---- bank / bank-group / rank state
        is_open = Signal(nbank)
        open_row = Array(Signal(_log2(std.rows), name=f"open_row{b}") for b in range(nbank))
        max_act = max(std.tRC, std.tRP, std.tRPab, std.tRFC)
        act_wait = [_Counter(max_act, f"act_wait{b}") for b in range(nbank)]
        pre_wait = [_Counter(max(std.tRAS, std.tRTP, std.write_to_pre), f"pre_wait{b}")
                    for b in range(nbank)]
        col_wait = [_Counter(std.tRCD, f"col_wait{b}") for b in range(nbank)]
        rd_wait = [_Counter(max(std.tCCD_L, std.write_to_read_l), f"rd_wait_bg{g}")
                   for g in range(nbg)]
        wr_wait = [_Counter(max(std.tCCD_L_WR, std.tRTW, std.tCCD_L), f"wr_wait_bg{g}")
                   for g in range(nbg)]
        rrd_wait = [_Counter(std.tRRD_L, f"rrd_wait_bg{g}") for g in range(nbg)]
        faw = [Signal(range(std.tFAW + 1), name=f"faw{k}") for k in range(4)]
        act_ok_bank = Signal(nbank)
        pre_ok_bank = Signal(nbank)
        col_ok_bank = Signal(nbank)
        rd_ok_bg = Signal(nbg)
        wr_ok_bg = Signal(nbg)
        faw_ok = faw[3] == 0
        for b in range(nbank):
            g = b % nbg
            m.d.comb += [
                act_ok_bank[b].eq(act_wait[b].ready & rrd_wait[g].ready & faw_ok),
                pre_ok_bank[b].eq(pre_wait[b].ready),
                col_ok_bank[b].eq(col_wait[b].ready),
            ]
        for g in range(nbg):
            m.d.comb += [rd_ok_bg[g].eq(rd_wait[g].ready), wr_ok_bg[g].eq(wr_wait[g].ready)]

        # ---- refresh timer
        ref_timer = Signal(range(std.tREFI), init=std.tREFI - 1)  # first REF after tREFI
        ref_pending = Signal()
        with m.If(ref_timer == 0):
            m.d.sync += [ref_timer.eq(std.tREFI - 1), ref_pending.eq(1)]
        with m.Else():
            m.d.sync += ref_timer.eq(ref_timer - 1)

        # ---- write mode and hazards
        wmode = Signal()
        head_r, head_w = rq["fields"][0], wq["fields"][0]
        raw = Signal()
        m.d.comb += raw.eq(rq["valid"][0] & _any(
            wq["valid"][k] & (wq["addr"][k] == rq["addr"][0]) for k in range(WQ)))
        with m.If(~wmode):
            with m.If((wq["count"] >= self.write_high) | ((rq["count"] == 0) & (wq["count"] > 0))
                      | raw):
                m.d.sync += wmode.eq(1)
        with m.Else():
            with m.If((wq["count"] == 0)
                      | ((wq["count"] <= self.write_low) & (rq["count"] > 0) & ~raw)):
                m.d.sync += wmode.eq(0)

        # ---- column command candidate (head of the active queue)
        def hit(f):
            return is_open.bit_select(f.bank, 1) & (open_row[f.bank] == f.row)

        rd_go = Signal()
        wr_go = Signal()
        m.d.comb += [
            rd_go.eq(~ref_pending & ~wmode & rq["valid"][0] & hit(head_r)
                     & col_ok_bank.bit_select(head_r.bank, 1) & rd_ok_bg.bit_select(head_r.bg, 1)
                     & ~raw),
            wr_go.eq(~ref_pending & wmode & wq["valid"][0] & hit(head_w)
                     & col_ok_bank.bit_select(head_w.bank, 1) & wr_ok_bg.bit_select(head_w.bg, 1)),
        ]

        # ---- row command candidates (lookahead over the active queue)
        def row_candidates(q):
            n = min(L, q["depth"])
            acts, pres = [], []
            for i in range(n):
                f = q["fields"][i]
                front = q["valid"][i]
                for j in range(i):
                    front = front & ~(q["valid"][j] & (q["fields"][j].bank == f.bank))
                opened = is_open.bit_select(f.bank, 1)
                need_act = front & ~opened
                need_pre = front & opened & (open_row[f.bank] != f.row)
                acts.append(need_act & act_ok_bank.bit_select(f.bank, 1))
                pres.append(need_pre & pre_ok_bank.bit_select(f.bank, 1))
            return acts, pres

        r_acts, r_pres = row_candidates(rq)
        w_acts, w_pres = row_candidates(wq)
        n_look = max(len(r_acts), len(w_acts))
        cand_act = [Signal(name=f"cand_act{i}") for i in range(n_look)]
        cand_pre = [Signal(name=f"cand_pre{i}") for i in range(n_look)]
        for i in range(n_look):
            ra = r_acts[i] if i < len(r_acts) else Const(0)
            rp = r_pres[i] if i < len(r_pres) else Const(0)
            wa = w_acts[i] if i < len(w_acts) else Const(0)
            wp = w_pres[i] if i < len(w_pres) else Const(0)
            m.d.comb += [cand_act[i].eq(Mux(wmode, wa, ra) & ~ref_pending),
                         cand_pre[i].eq(Mux(wmode, wp, rp) & ~ref_pending)]

        # ---- refresh commands
        any_open = is_open.any()
        prea_go = Signal()
        ref_go = Signal()
        m.d.comb += [
            prea_go.eq(ref_pending & any_open & pre_ok_bank.all()),
            ref_go.eq(ref_pending & ~any_open & Cat(a.ready for a in act_wait).all()),
        ]

        # ---- choose one command
        kind = Signal(3)
        sel = Signal(range(max(n_look, 2)))  # lookahead entry of a row command
        sel_addr = Signal(A)
        with m.If(prea_go):
            m.d.comb += kind.eq(Cmd.PREA)
        with m.Elif(ref_go):
            m.d.comb += kind.eq(Cmd.REF)
        with m.Elif(rd_go):
            m.d.comb += [kind.eq(Cmd.RD), sel_addr.eq(rq["addr"][0])]
        with m.Elif(wr_go):
            m.d.comb += [kind.eq(Cmd.WR), sel_addr.eq(wq["addr"][0])]
        with m.Else():
            for i in reversed(range(n_look)):  # the oldest candidate wins (last assignment)
                with m.If(cand_act[i] | cand_pre[i]):
                    m.d.comb += [kind.eq(Mux(cand_act[i], Cmd.ACT, Cmd.PRE)), sel.eq(i)]
            qaddr = Array(Mux(wmode, wq["addr"][i] if i < WQ else 0, rq["addr"][i] if i < RQ else 0)
                          for i in range(n_look))
            m.d.comb += sel_addr.eq(qaddr[sel])

        f = _Fields(std, sel_addr)
        is_act, is_pre = kind == Cmd.ACT, kind == Cmd.PRE
        is_rd, is_wr = kind == Cmd.RD, kind == Cmd.WR
        is_prea, is_ref = kind == Cmd.PREA, kind == Cmd.REF
        m.d.comb += [
            self.cmd_kind.eq(kind), self.cmd_bg.eq(f.bg), self.cmd_ba.eq(f.ba),
            self.cmd_row.eq(f.row), self.cmd_col.eq(f.col << _log2(std.burst_length)),
            self.cmd_wdata.eq(wmem_r.data[:D]), self.cmd_wmask.eq(wmem_r.data[D:]),
        ]

        # ---- state updates from the issued command
        for b in range(nbank):
            here = f.bank == b
            act_wait[b].load(is_act & here, std.tRC)
            act_wait[b].load(is_pre & here, std.tRP)
            act_wait[b].load(is_prea, std.tRPab)
            act_wait[b].load(is_ref, std.tRFC)
            pre_wait[b].load(is_act & here, std.tRAS)
            pre_wait[b].load(is_rd & here, std.tRTP)
            pre_wait[b].load(is_wr & here, std.write_to_pre)
            col_wait[b].load(is_act & here, std.tRCD)
            with m.If(is_act & here):
                m.d.sync += [is_open[b].eq(1), open_row[b].eq(f.row)]
            with m.If((is_pre & here) | is_prea):
                m.d.sync += is_open[b].eq(0)
        for g in range(nbg):
            same = f.bg == g
            rd_wait[g].load(is_rd & same, std.tCCD_L)
            rd_wait[g].load(is_rd & ~same, std.tCCD_S)
            rd_wait[g].load(is_wr & same, std.write_to_read_l)
            rd_wait[g].load(is_wr & ~same, std.write_to_read_s)
            wr_wait[g].load(is_wr & same, std.tCCD_L_WR)
            wr_wait[g].load(is_wr & ~same, std.tCCD_S)
            wr_wait[g].load(is_rd, max(std.tRTW, std.tCCD_L))
            rrd_wait[g].load(is_act & same, std.tRRD_L)
            rrd_wait[g].load(is_act & ~same, std.tRRD_S)
        for c in act_wait + pre_wait + col_wait + rd_wait + wr_wait + rrd_wait:
            c.elaborate(m)
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
        war = _any(rq["valid"][k] & (rq["addr"][k] == self.req_addr) for k in range(RQ))
        m.d.comb += self.req_ready.eq(Mux(self.req_we, (wq["count"] < WQ) & ~war,
                                          rq["count"] < RQ))
        self._update_queue(m, rq, is_rd, push & ~self.req_we, is_act | is_pre, ~wmode, sel,
                           is_act, cycle)
        self._update_queue(m, wq, is_wr, push & self.req_we, is_act | is_pre, wmode, sel,
                           is_act, cycle)
        m.d.comb += [wmem_w.addr.eq(w_in), wmem_w.data.eq(Cat(self.req_wdata, self.req_wmask)),
                     wmem_w.en.eq(push & self.req_we)]
        with m.If(push & self.req_we):
            m.d.sync += w_in.eq(w_in + 1)
        with m.If(is_wr):
            m.d.sync += w_out.eq(w_out + 1)

        # ---- responses, idle, statistics
        inflight = Signal(range(64))
        m.d.sync += inflight.eq(inflight + is_rd - self.rd_valid)
        m.d.comb += [self.rsp_valid.eq(self.rd_valid), self.rsp_data.eq(self.rd_data),
                     self.idle.eq((rq["count"] == 0) & (wq["count"] == 0) & (inflight == 0))]
        stats = {n: Signal(STAT_BITS, name=f"st_{n}") for n in STAT_NAMES}
        head_act = Mux(is_rd, rq["act"][0], wq["act"][0])
        head_pre = Mux(is_rd, rq["pre"][0], wq["pre"][0])
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
                stats["read_latency"] + (cycle[:32] - rq["ts"][0])[:32] + std.read_latency)
        m.d.comb += stats["cycles"].eq(cycle)
        for n in STAT_NAMES:
            m.d.comb += getattr(self, f"stat_{n}").eq(stats[n])
        return m

    def _update_queue(self, m, q, pop, push, row_cmd, active, sel, is_act, cycle):
        depth = q["depth"]
        # entry k takes entry k+1 on a pop (a pop is a column command: never a row command)
        for k in range(depth):
            with m.If(pop):
                if k + 1 < depth:
                    m.d.sync += [q["addr"][k].eq(q["addr"][k + 1]), q["act"][k].eq(q["act"][k + 1]),
                                 q["pre"][k].eq(q["pre"][k + 1])]
                    if "ts" in q:
                        m.d.sync += q["ts"][k].eq(q["ts"][k + 1])
            if k < self.lookahead:
                with m.If(row_cmd & active & (sel == k)):
                    with m.If(is_act):
                        m.d.sync += q["act"][k].eq(1)
                    with m.Else():
                        m.d.sync += q["pre"][k].eq(1)
            with m.If(push & (q["count"] - pop == k)):
                m.d.sync += [q["addr"][k].eq(self.req_addr), q["act"][k].eq(0), q["pre"][k].eq(0)]
                if "ts" in q:
                    m.d.sync += q["ts"][k].eq(cycle[:32])
        m.d.sync += q["count"].eq(q["count"] + push - pop)


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

    from .verilog import use_pinned_yosys

    if not name.isidentifier():
        raise ValueError(f"name={name!r}: expected a Verilog identifier")
    use_pinned_yosys()
    return verilog.convert(component, name=name, emit_src=False)
