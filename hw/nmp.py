"""Rank-level DIMM-NMP: one NME per DRAM rank, ranks of DIMMs driven by one host command port.

:class:`RankNMP` is one rank's buffer-chip engine: an :class:`coda.hw.nme.top.NME` whose memory is
the rank's DRAM through :class:`coda.hw.dram.word_memory.DRAMWordMemory` (word adapter + JEDEC-timed
controller). Two clockings: the NME on the DRAM command clock (``nme_clock=False``, the default:
no crossing), or on its own clock, meeting the controller at the burst port through two
:class:`amaranth.lib.fifo.AsyncFIFO` (``nme_clock=True``; :class:`RankNMP` has the details,
:func:`check_nme_mhz` validates a frequency, which is not part of the RTL).

:class:`DIMMNMP` holds ``dimms * ranks`` RankNMPs (global rank ``i = dimm * ranks + rank``)
behind one 64-bit command stream with a rank-select mask; all selected ranks run in lockstep
and ``done`` pulses when all of them are done (:class:`DIMMNMP` has the command port protocol).
:func:`dimm_verilog` writes its Verilog with the rank module emitted once; :func:`rank_verilog`
writes one rank's.
"""

from __future__ import annotations

import math

from amaranth import Cat, ClockSignal, DomainRenamer, Instance, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.wiring import In, Out

from coda.hw.dram.controller import STAT_BITS, STAT_NAMES, DRAMController
from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.hw.dram.word_memory import DRAMWordMemory, WordAdapter
from coda.hw.nme.isa import NMEConfig
from coda.hw.yosys import component_verilog

__all__ = ["RankNMP", "DIMMNMP", "rank_verilog", "dimm_verilog", "DRAM_PORTS", "dram_port_widths",
           "MAX_RANKS", "check_shape", "check_nme_mhz", "REQ_FIFO_DEPTH", "rsp_fifo_depth",
           "MIN_NME_MHZ", "CDC_BURSTS_IN_FLIGHT", "NMP_DEPTH", "DEFAULT_NME_MHZ",
           "default_nme_mhz", "index_bits"]

#: entries of a rank's burst-request AsyncFIFO (adapter -> controller) with ``nme_clock``:
#: covers the pointer round trip (write, two DRAM-clock synchroniser flops, read, two
#: NME-clock flops), so a burst per NME cycle is not throttled by the crossing
REQ_FIFO_DEPTH = 8

#: read bursts the NME-side word adapter may have in flight with ``nme_clock`` (the same-domain
#: DRAMWordMemory's adapter has 8): the crossing adds two synchronisers each way to the read
#: latency, so the window is doubled to keep a DRAM-bound stream at the same bandwidth
CDC_BURSTS_IN_FLIGHT = 16

#: lowest NME clock (MHz) the tools accept: far below any buffer-chip engine, it only keeps a
#: typo (``--nme-mhz 0.0001``) from running a cosimulation for days
MIN_NME_MHZ = 1.0

#: the NME clock (MHz) of the DRAM-timed DIMM-NMP by default (``coda run``): a buffer-chip
#: engine on its own clock, between two bounds. Upper: the DDR5 registering clock driver and
#: data buffer (JEDEC DDR5RCD / DDR5DB) run at the command clock, 2400 MHz for DDR5-4800, but
#: they only retime signals, while the NME runs bf16 / fp32 arithmetic. Lower: the
#: timing-closed NME places and routes at about 100 MHz on a Lattice ECP5 FPGA
#: (docs/synthesis.md), and an ASIC of the same logic is about 3 to 4 times faster (Kuon and
#: Rose, "Measuring the Gap Between FPGAs and ASICs", IEEE TCAD 26(2), 2007, abstract: the
#: critical-path delay ratio in one process). 1000 MHz is the clock of a shipped in-memory
#: engine of the same arithmetic: SK hynix's GDDR6-AiM reaches 1 TFLOPS with 512 bf16
#: multiply-accumulate units, i.e. 1 GHz, in a DRAM process whose transistors are slower than
#: a buffer chip's logic process (Kwon et al., "A 1ynm 1.25V 8Gb 16Gb/s/Pin GDDR6-Based
#: Accelerator-in-Memory Supporting 1TFLOPS MAC Operation ...", IEEE JSSC 58(1), 2023, from
#: ISSCC 2022). It is also about where an 8-lane NME (16 bytes per cycle) matches one
#: DDR5-4800 rank (16.9 GB/s, docs/nme.md, The NME's own clock): neither starves the other.
DEFAULT_NME_MHZ = 1000.0


def default_nme_mhz(std) -> float:
    """The default NME clock on the DRAM preset ``std`` (MHz): :data:`DEFAULT_NME_MHZ`, or
    the command clock ``1000 / tCK_ns`` where that is slower (an NME does not outrun the DRAM
    clock it serves, :func:`check_nme_mhz`; LPDDR5-6400's CK is 800 MHz). Raises
    ValueError for an unknown preset."""
    return min(DEFAULT_NME_MHZ, 1000.0 / get_standard(std).tCK_ns)


def rsp_fifo_depth() -> int:
    """Entries of a rank's read-burst AsyncFIFO (controller -> adapter) with ``nme_clock``:
    :data:`CDC_BURSTS_IN_FLIGHT`, the adapter's bound on read bursts awaiting data."""
    return CDC_BURSTS_IN_FLIGHT


def check_nme_mhz(nme_mhz, std) -> float | None:
    """``nme_mhz`` as a float (MHz of the NME clock), or None (same domain as the DRAM clock).

    Valid: a finite number with ``MIN_NME_MHZ <= nme_mhz <= 1000 / std.tCK_ns`` (the DRAM
    command clock, 2400 MHz for DDR5-4800): a buffer-chip NME does not outrun the DRAM clock
    it serves, and one NME cycle at most one tCK keeps the crossing's credits sized.

    Raises:
        ValueError: not a number, not finite, below MIN_NME_MHZ or above the DRAM clock
            (the message names the value and the bound). ValueError: unknown preset.
    """
    if nme_mhz is None:
        return None
    std = get_standard(std)
    try:
        f = float(nme_mhz)
    except (TypeError, ValueError):
        raise ValueError(f"nme_mhz={nme_mhz!r}: expected a number of MHz") from None
    dram_mhz = 1000.0 / std.tCK_ns
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"nme_mhz={nme_mhz!r}: expected a positive NME clock in MHz")
    if f < MIN_NME_MHZ:
        raise ValueError(f"nme_mhz={f:g}: expected at least {MIN_NME_MHZ:g} MHz")
    if f > dram_mhz * (1 + 1e-9):
        raise ValueError(f"nme_mhz={f:g}: the NME clock may not exceed the {std.name} command "
                         f"clock ({dram_mhz:.6g} MHz); omit it for the NME on the DRAM clock")
    return f

#: most ranks (dimms x ranks) one DIMM-NMP may have: a bound of this tool, not of JEDEC, so
#: that a typo (``--dimms 1000``) fails at once instead of elaborating for hours (an 8 x 8
#: system elaborates in seconds)
MAX_RANKS = 256

#: NME buffer depth (words per stream block) of the DIMM-NMP, where the NME alone defaults
#: to :attr:`coda.hw.nme.isa.NMEConfig.depth` (64): with long streams, 64 words lose part
#: of the rank's peak bandwidth to the read/write turnarounds of the short blocks, 256 words
#: far less (measured: :mod:`coda.cosim.nmp.measure`, ``coda bench``; docs/results.md, DRAM
#: utilisation of segment programs)
NMP_DEPTH = 256

#: DRAM-side members of a rank (``dram_`` + the controller's name), in/out direction.
DRAM_PORTS = ("cmd_kind", "cmd_bg", "cmd_ba", "cmd_row", "cmd_col", "cmd_wdata", "cmd_wmask",
              "rd_valid", "rd_data")


def index_bits(n: int) -> int:
    """Bits of an index over ``n`` items: ceil(log2(n)) (0 for one item)."""
    return (n - 1).bit_length()


def dram_port_widths(std: DRAMStandard) -> dict[str, int]:
    """Bit widths of one rank's DRAM device port (``dram_<name>``) for ``std``."""
    D = 8 * std.burst_bytes
    return {"cmd_kind": 3, "cmd_bg": index_bits(std.bank_groups),
            "cmd_ba": index_bits(std.banks_per_group), "cmd_row": index_bits(std.rows),
            "cmd_col": index_bits(std.columns), "cmd_wdata": D,
            "cmd_wmask": D // 8, "rd_valid": 1, "rd_data": D}


def check_shape(dimms, ranks, max_ranks: int = MAX_RANKS) -> tuple[int, int]:
    """``(int(dimms), int(ranks))`` of a DIMM-NMP; ValueError unless both are >= 1 and
    ``dimms * ranks <= max_ranks`` (default :data:`MAX_RANKS`; a simulator may allow fewer)."""
    dimms, ranks = int(dimms), int(ranks)
    if dimms < 1 or ranks < 1:
        raise ValueError(f"dimms={dimms}, ranks={ranks}: expected >= 1 each")
    if dimms * ranks > max_ranks:
        raise ValueError(f"dimms={dimms} x ranks={ranks} = {dimms * ranks} ranks: "
                         f"expected at most {max_ranks}")
    return dimms, ranks


def _check_system(cfg, std, dimms, ranks) -> DRAMStandard:
    """:func:`_check` plus the system shape (:func:`check_shape`)."""
    check_shape(dimms, ranks)
    return _check(cfg, std)


def _check(cfg, std) -> DRAMStandard:
    if not isinstance(cfg, NMEConfig):
        raise TypeError(f"cfg of type {type(cfg).__name__}: expected coda.hw.nme.isa.NMEConfig")
    std = get_standard(std)
    word_bytes = 2 * cfg.lanes
    if std.burst_bytes % word_bytes:
        raise ValueError(f"lanes={cfg.lanes}: a {word_bytes}-byte NME word must divide the "
                         f"{std.burst_bytes}-byte {std.name} burst (lanes <= "
                         f"{std.burst_bytes // 2}, a power of two)")
    if cfg.mem_words * word_bytes > std.rank_bytes:
        raise ValueError(f"mem_words={cfg.mem_words}: {cfg.mem_words * word_bytes} bytes exceed "
                         f"the {std.rank_bytes}-byte {std.name} rank")
    return std


def _rank_members(cfg: NMEConfig, std: DRAMStandard) -> dict:
    members = {"cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(64),
               "busy": Out(1), "done": Out(1), "status": Out(3), "l1": Out(32),
               "mem_idle": Out(1)}
    for name, width in dram_port_widths(std).items():
        members[f"dram_{name}"] = (In if name.startswith("rd_") else Out)(width)
    for name in STAT_NAMES:
        members[f"stat_{name}"] = Out(STAT_BITS)
    return members


class RankNMP(wiring.Component):
    """One rank: NME + word adapter + DRAM controller, on the DRAM command clock or with the
    NME on its own clock (``nme_clock``).

    * **same domain** (``nme_clock=False``, the default): the NME and the controller share the
      DRAM command clock (domain ``sync``; one NME cycle = one tCK of the standard), so every NME
      access is timed by the controller with no crossing.
    * **own NME clock** (``nme_clock=True``): the NME and its word adapter
      (:class:`coda.hw.dram.word_memory.WordAdapter`: words into whole bursts, write merging,
      read-line reuse) run in domain ``nme`` (Verilog ports ``nme_clk``/``nme_rst``) at the NME's
      frequency; the JEDEC-timed :class:`coda.hw.dram.controller.DRAMController` stays on the DRAM
      command clock (``sync``: ``clk``/``rst``). They meet at the burst port through two
      :class:`amaranth.lib.fifo.AsyncFIFO` (Gray-coded pointers, two-flop synchronisers): burst
      requests ``{we, burst addr, data, byte mask}`` (``nme`` -> ``sync``,
      :data:`REQ_FIFO_DEPTH` entries) and read bursts (``sync`` -> ``nme``,
      :func:`rsp_fifo_depth` entries). Crossing whole bursts keeps the adapter's write merging
      intact (it sees the NME's requests at the NME's rate, as on one clock; behind the crossing
      it would see gaps and flush every word as its own masked burst) and crosses once per
      burst, not per word. The controller's read data has no back-pressure; the adapter admits
      at most ``max_bursts_in_flight`` read bursts until their data is back, and the response
      FIFO holds that many, so it can never overflow. The command port, ``busy``, ``done``,
      ``status`` and ``l1`` are the NME's own signals and live in the ``nme`` domain: nothing of
      them crosses, because the host's command words are consumed only by the NMEs and one
      DIMMNMP's ranks share one NME clock, so the broadcast ready and the combined done stay
      synchronous logic (a DRAM-clocked command port would need a third FIFO and a pulse
      synchroniser per rank for no gain: a program is a few words). ``mem_idle`` and ``stat_*``
      are DRAM-domain outputs, sampled by the host only when the system is quiescent. The
      frequency is not part of the RTL (the same Verilog serves every NME clock); it is a
      property of the clock driven into ``nme_clk`` (the cosimulation's ``--nme-mhz``),
      validated by :func:`check_nme_mhz`.

    Args:
        cfg: the NME configuration (``2*lanes`` bytes per word must divide the burst).
        std: DRAM standard or preset name (:mod:`coda.hw.dram.standards`).
        clock_gating: gate the NME lanes' clocks (:class:`coda.hw.nme.top.NME`; default on: the
            lanes sit idle while the rank waits on DRAM, and the Verilated model skips them;
            simulate a gated rank with Verilator: ``amaranth.sim`` races on gated clocks).
        nme_clock: the NME in its own domain ``nme`` (extra Verilog ports ``nme_clk``,
            ``nme_rst``), crossing to the controller through AsyncFIFOs; default False: the
            NME on the DRAM clock, no crossing (the same cycles as before this option).
        controller_kw: passed to :class:`coda.hw.dram.controller.DRAMController` (queue sizes...).

    Ports (domain ``nme`` with ``nme_clock``: the command port, busy, done, status, l1;
    always the DRAM domain ``sync``: dram_*, stat_*, mem_idle):
    ``cmd_valid/cmd_ready/cmd_data[64]``, ``busy``, ``done``, ``status[3]``, ``l1[32]`` (the
    NME's, see :mod:`coda.hw.nme.top`); ``dram_cmd_*`` / ``dram_rd_valid`` / ``dram_rd_data`` (the
    controller's device port, to a DRAM device model); ``stat_<name>[48]`` controller
    counters (:data:`coda.hw.dram.controller.STAT_NAMES`); ``mem_idle`` (no access pending in the memory).

    Raises:
        TypeError: cfg is not an NMEConfig. ValueError: word/burst sizes incompatible or
        ``mem_words`` larger than the rank.
    """

    def __init__(self, cfg: NMEConfig, std, *, clock_gating: bool = True,
                 nme_clock: bool = False, **controller_kw):
        self.std = _check(cfg, std)
        self.cfg = cfg
        self.clock_gating = clock_gating
        self.nme_clock = bool(nme_clock)
        self.controller_kw = controller_kw
        super().__init__(_rank_members(cfg, self.std))

    def elaborate(self, platform):
        from coda.hw.nme.top import NME

        m = Module()
        nme = NME(self.cfg, clock_gating=self.clock_gating)
        if self.nme_clock:
            mem, words = self._crossing(m, nme)
        else:
            m.submodules.nme = nme
            m.submodules.mem = mem = words = DRAMWordMemory(self.std, self.cfg.lanes,
                                                            **self.controller_kw)
            m.d.comb += self.mem_idle.eq(mem.idle)
        m.d.comb += [   # the NME's command port out, its word port on the word memory
            nme.cmd_valid.eq(self.cmd_valid), self.cmd_ready.eq(nme.cmd_ready),
            nme.cmd_data.eq(self.cmd_data),
            self.busy.eq(nme.busy), self.done.eq(nme.done), self.status.eq(nme.status),
            self.l1.eq(nme.l1),
            words.mem_req_valid.eq(nme.mem_req_valid), nme.mem_req_ready.eq(words.mem_req_ready),
            words.mem_req_we.eq(nme.mem_req_we), words.mem_req_addr.eq(nme.mem_req_addr),
            words.mem_req_wdata.eq(nme.mem_req_wdata), words.mem_req_wmask.eq(nme.mem_req_wmask),
            nme.mem_rsp_valid.eq(words.mem_rsp_valid), nme.mem_rsp_data.eq(words.mem_rsp_data),
        ]
        for name in DRAM_PORTS:
            if name.startswith("rd_"):
                m.d.comb += getattr(mem, name).eq(getattr(self, f"dram_{name}"))
            else:
                m.d.comb += getattr(self, f"dram_{name}").eq(getattr(mem, name))
        for name in STAT_NAMES:
            m.d.comb += getattr(self, f"stat_{name}").eq(getattr(mem, f"stat_{name}"))
        return m

    def _crossing(self, m: Module, nme):
        """NME + adapter in domain ``nme``, controller in ``sync``, burst AsyncFIFOs between
        (:class:`RankNMP`). Returns the controller (its cmd_*/rd_*/stat_* ports) and the adapter
        (the word port that :meth:`elaborate` connects the NME to)."""
        std = self.std
        m.submodules.nme = DomainRenamer("nme")(nme)
        adapter = WordAdapter(self.cfg.lanes, std.burst_bytes, std.burst_addr_bits,
                              max_bursts_in_flight=CDC_BURSTS_IN_FLIGHT)
        m.submodules.adapter = DomainRenamer("nme")(adapter)
        m.submodules.ctrl = c = DRAMController(std, **self.controller_kw)
        D = 8 * std.burst_bytes
        AB = len(adapter.bus_req_addr)
        m.submodules.req_fifo = req = AsyncFIFO(width=1 + AB + D + D // 8,
                                                depth=REQ_FIFO_DEPTH,
                                                w_domain="nme", r_domain="sync")
        m.submodules.rsp_fifo = rsp = AsyncFIFO(width=D, depth=rsp_fifo_depth(),
                                                w_domain="sync", r_domain="nme")
        a_idle = Signal(init=1)
        m.submodules.idle_cdc = FFSynchronizer(adapter.idle, a_idle, o_domain="sync", init=1)
        # NME side (domain nme): the adapter's bursts into the FIFO
        m.d.comb += [
            req.w_en.eq(adapter.bus_req_valid), adapter.bus_req_ready.eq(req.w_rdy),
            req.w_data.eq(Cat(adapter.bus_req_we, adapter.bus_req_addr, adapter.bus_req_wdata,
                              adapter.bus_req_wmask)),
            rsp.r_en.eq(1),   # the adapter takes read data without back-pressure
            adapter.bus_rsp_valid.eq(rsp.r_rdy), adapter.bus_rsp_data.eq(rsp.r_data),
        ]
        # DRAM side (domain sync)
        we, addr, wdata, wmask = Signal(1), Signal(AB), Signal(D), Signal(D // 8)
        m.d.comb += [
            Cat(we, addr, wdata, wmask).eq(req.r_data),
            c.req_valid.eq(req.r_rdy), req.r_en.eq(c.req_ready),
            c.req_we.eq(we), c.req_addr.eq(addr), c.req_wdata.eq(wdata), c.req_wmask.eq(wmask),
            rsp.w_en.eq(c.rsp_valid), rsp.w_data.eq(c.rsp_data),
            # no burst waiting at the FIFO's read side, none in the controller, and the
            # adapter idle (two flops late); a burst written in the last NME cycles may still
            # be in a pointer synchroniser, so sample mem_idle a few cycles of both clocks
            # after the NME's done (the cosimulation top does)
            self.mem_idle.eq(c.idle & ~req.r_rdy & a_idle),
        ]
        return c, adapter


class DIMMNMP(wiring.Component):
    """``dimms * ranks`` RankNMPs behind one host command port.

    Command port (per-rank lengths): the host drives one 64-bit command stream
    (``cmd_valid``/``cmd_ready``/``cmd_data``, the ISA words of :mod:`coda.hw.nme.isa`) plus a
    rank-select mask ``cmd_ranks[N]``, like the chip selects of a DIMM bus: a word goes to every
    rank whose mask bit is set and transfers when *all* selected ranks are ready (one broadcast
    beat). A program with per-rank ``n_elems`` (uneven tiles) is sent as one header word per rank
    (mask = that rank only, its own ``n_elems``) followed by the micro-op words once, broadcast
    (mask = all ranks). An NME checks a program only after its last micro-op, so all ranks start
    in the same cycle and run in lockstep. Equal lengths need a single broadcast header. Ranks
    may also receive different programs (masks of disjoint rank sets).

    Completion: a rank *participates* once it has taken a command word since the last ``done``.
    ``done`` pulses one cycle after every participating rank's NME has pulsed its own done;
    ``error`` (held until the next ``done``) is 1 if any participating rank ended with a status
    other than OK; ``rank_status[3*i+2:3*i]`` / ``rank_l1[32*i+31:32*i]`` are each NME's status /
    L1 outputs; ``rank_done[i]`` is each NME's done pulse; ``busy`` is any NME busy.

    Args:
        cfg, std: as :class:`RankNMP`; dimms, ranks: DIMMs and ranks per DIMM (>= 1 each).
        rank_module: if given, each rank is an ``Instance`` of that Verilog module name (for
            :func:`dimm_verilog`, which supplies the module); default: RankNMP submodules.
        clock_gating: gated lane clocks in the RankNMP submodules (default off, so that the
            design simulates with ``amaranth.sim``, which races on gated clocks; the Verilog
            of :func:`dimm_verilog` has them on by default).
        nme_clock: every rank's NME on the shared clock domain ``nme`` (RankNMP's
            ``nme_clock``); the command port, its broadcast ready and the combined
            done/error/status then live in ``nme`` too (Verilog ports ``nme_clk``,
            ``nme_rst``), the DRAM ports, stat_* and mem_idle in ``sync`` (``clk``, ``rst``).

    Ports (N = dimms * ranks; per-rank fields concatenated, rank 0 in the low bits):
        cmd_valid, cmd_ready, cmd_data[64], cmd_ranks[N] (rank-select mask of the word);
        busy, done, error, rank_done[N], rank_busy[N], rank_status[3N], rank_l1[32N],
        mem_idle[N]; dram_<port>[N * width] for the device ports of :data:`DRAM_PORTS`;
        stat_<name>[48N].

    Raises:
        ValueError: dimms or ranks < 1, more than :data:`MAX_RANKS` ranks in all, or as
            RankNMP.
    """

    def __init__(self, cfg: NMEConfig, std, dimms: int = 1, ranks: int = 1, *,
                 rank_module: str | None = None, clock_gating: bool = False,
                 nme_clock: bool = False, **controller_kw):
        self.std = _check_system(cfg, std, dimms, ranks)
        self.nme_clock = bool(nme_clock)
        self.cfg, self.dimms, self.ranks = cfg, int(dimms), int(ranks)
        self.n = self.dimms * self.ranks
        self.rank_module = rank_module
        self.clock_gating = clock_gating
        self.controller_kw = controller_kw
        n = self.n
        members = {"cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(64),
                   "cmd_ranks": In(n), "busy": Out(1), "done": Out(1), "error": Out(1),
                   "rank_done": Out(n), "rank_busy": Out(n), "rank_status": Out(3 * n),
                   "rank_l1": Out(32 * n), "mem_idle": Out(n)}
        for name, width in dram_port_widths(self.std).items():
            members[f"dram_{name}"] = (In if name.startswith("rd_") else Out)(width * n)
        for name in STAT_NAMES:
            members[f"stat_{name}"] = Out(STAT_BITS * n)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.n
        widths = dram_port_widths(self.std)
        ranks = []
        for i in range(n):
            port = {nm: Signal(mb.shape, name=f"r{i}_{nm}")
                    for nm, mb in _rank_members(self.cfg, self.std).items()}
            if self.rank_module is None:
                r = RankNMP(self.cfg, self.std, clock_gating=self.clock_gating,
                            nme_clock=self.nme_clock, **self.controller_kw)
                m.submodules[f"rank{i}"] = r
                for nm, mb in _rank_members(self.cfg, self.std).items():
                    if mb.flow == wiring.In:
                        m.d.comb += getattr(r, nm).eq(port[nm])
                    else:
                        m.d.comb += port[nm].eq(getattr(r, nm))
            else:
                conns = {}
                for nm, mb in _rank_members(self.cfg, self.std).items():
                    conns[("i_" if mb.flow == wiring.In else "o_") + nm] = port[nm]
                if self.nme_clock:
                    conns.update(i_nme_clk=ClockSignal("nme"), i_nme_rst=ResetSignal("nme"))
                m.submodules[f"rank{i}"] = Instance(self.rank_module, i_clk=ClockSignal("sync"),
                                                    i_rst=ResetSignal("sync"), **conns)
            ranks.append(port)

        # ---- broadcast command port: a word transfers when every selected rank is ready
        sel_ready = Signal(n)
        for i, p in enumerate(ranks):
            m.d.comb += sel_ready[i].eq(~self.cmd_ranks[i] | p["cmd_ready"])
        all_ready = sel_ready.all() & self.cmd_ranks.any()
        m.d.comb += self.cmd_ready.eq(all_ready)
        for i, p in enumerate(ranks):
            m.d.comb += [p["cmd_valid"].eq(self.cmd_valid & self.cmd_ranks[i] & all_ready),
                         p["cmd_data"].eq(self.cmd_data)]

        # ---- completion: participating ranks, combined done / error
        joined = Signal(n)      # took a command word since the last done
        finished = Signal(n)    # its NME pulsed done since then
        failed = Signal()       # a finished rank reported an error status
        error_r = Signal()
        took = Cat(p["cmd_valid"] & p["cmd_ready"] for p in ranks)
        ended = Cat(p["done"] for p in ranks)
        bad = Cat(p["done"] & (p["status"] != 0) for p in ranks)
        joined_now = joined | took
        finished_now = finished | ended
        all_done = joined_now.any() & ((joined_now & ~finished_now) == 0) & ended.any()
        cmd_domain = m.d.nme if self.nme_clock else m.d.sync   # the NMEs' clock
        with m.If(all_done):
            cmd_domain += [joined.eq(0), finished.eq(0), failed.eq(0),
                           self.done.eq(1), error_r.eq(failed | bad.any())]
        with m.Else():
            cmd_domain += [joined.eq(joined_now), finished.eq(finished_now),
                           failed.eq(failed | bad.any()), self.done.eq(0)]
        m.d.comb += [
            self.error.eq(error_r),
            self.busy.eq(Cat(p["busy"] for p in ranks).any()),
            self.rank_done.eq(ended), self.rank_busy.eq(Cat(p["busy"] for p in ranks)),
            self.rank_status.eq(Cat(p["status"] for p in ranks)),
            self.rank_l1.eq(Cat(p["l1"] for p in ranks)),
            self.mem_idle.eq(Cat(p["mem_idle"] for p in ranks)),
        ]
        for name, width in widths.items():
            if name.startswith("rd_"):
                for i, p in enumerate(ranks):
                    m.d.comb += p[f"dram_{name}"].eq(
                        getattr(self, f"dram_{name}")[width * i:width * (i + 1)])
            else:
                m.d.comb += getattr(self, f"dram_{name}").eq(Cat(p[f"dram_{name}"] for p in ranks))
        for name in STAT_NAMES:
            m.d.comb += getattr(self, f"stat_{name}").eq(Cat(p[f"stat_{name}"] for p in ranks))
        return m


def _domains(nme_clock: bool) -> tuple[str, ...]:
    """The clock domains of a RankNMP / DIMMNMP top, in the order of their Verilog ports."""
    return ("sync", "nme") if nme_clock else ("sync",)


def rank_verilog(cfg: NMEConfig, std, name: str = "rank_nmp", *, clock_gating: bool = True,
                 nme_clock: bool = False, **controller_kw) -> str:
    """Verilog of one :class:`RankNMP` as module ``name`` (ports ``clk``, ``rst`` + members;
    with ``nme_clock`` also ``nme_clk``, ``nme_rst``).

    Raises:
        ValueError: ``name`` not an identifier, or as RankNMP. FileNotFoundError: no yosys.
    """
    if not name.isidentifier():
        raise ValueError(f"name={name!r}: expected a Verilog identifier")
    return component_verilog(RankNMP(cfg, std, clock_gating=clock_gating, nme_clock=nme_clock,
                                     **controller_kw), name, domains=_domains(nme_clock))


def dimm_verilog(cfg: NMEConfig, std, dimms: int = 1, ranks: int = 1, name: str = "dimm_nmp",
                 *, clock_gating: bool = True, nme_clock: bool = False,
                 **controller_kw) -> str:
    """Verilog of a :class:`DIMMNMP`: module ``name`` instantiating ``dimms * ranks`` copies of
    module ``<name>_rank`` (one :class:`RankNMP`, emitted once in the same text;
    ``clock_gating`` and ``nme_clock`` as RankNMP: with ``nme_clock`` the module has the
    clock inputs ``clk``/``rst`` (DRAM command clock) and ``nme_clk``/``nme_rst`` (NME)).

    The per-rank DRAM ports of ``name`` are concatenated vectors, rank 0 in the low bits.
    Emitting the rank once means Verilator compiles one rank and elaboration costs one NME, not
    ``dimms * ranks``.

    Raises:
        ValueError: bad name, dimms/ranks < 1, more than :data:`MAX_RANKS` ranks, or as
            RankNMP. FileNotFoundError: no yosys.
    """
    if not name.isidentifier():
        raise ValueError(f"name={name!r}: expected a Verilog identifier")
    _check_system(cfg, std, dimms, ranks)   # before any Elaboratable exists (none left unused)
    top = DIMMNMP(cfg, std, dimms, ranks, rank_module=f"{name}_rank", nme_clock=nme_clock,
                  **controller_kw)
    rank = rank_verilog(cfg, std, f"{name}_rank", clock_gating=clock_gating,
                        nme_clock=nme_clock, **controller_kw)
    return rank + "\n" + component_verilog(top, name, domains=_domains(nme_clock))
