"""Cosimulation speed: build time, simulated NME cycles per second, per-job overhead.

``coda bench [--lanes 8] [--fmt bf16] [--mem-words 65536]`` (``make bench``)
builds (or reuses) the Verilated NME, then through :class:`~coda.cosim.rtl_backend.RTLBackend`:

- one big MOV/ADD program over three streams filling the memory: NME cycles / wall second of
  the job (the job includes loading the changed words and reading back the written ones, so it
  is a lower bound of the simulator's raw speed);
- many tiny programs on an unchanged image: wall time per job (the persistent simulator's
  overhead: socket round trip, file traffic, cocotb handshakes);
- ``two_ranks``: ``launches`` lockstep launches of the big program on two ranks' images through
  ``execute_many``, with one shared simulator (``max_sims=1``: each job reloads the other
  rank's image) and one simulator per rank (``max_sims=2``: images stay resident, the two run
  in parallel): wall seconds per launch and simulated cycles (both ranks) per wall second.

and of a whole DIMM-NMP (:func:`measure_nmp`, default 2 DIMMs x 2 ranks of DDR5-4800 through
:class:`~coda.cosim.nmp_backend.NMPRTLBackend`): simulated cycles (one cycle = one DRAM tCK =
one NME cycle) per wall second of a long residual add and of a 4-stream segment on every rank in
lockstep (``sim_cycles_per_s``: system cycles per wall second of the simulator's own run;
``rank_cycles_per_s``: the same times the number of ranks, i.e. NME cycles summed over the
system's NMEs), and the DRAM bandwidth utilisation each achieves, per rank:
``bytes moved by RD/WR / (cycles * burst_bytes / nBL)`` (the rank's peak bytes per cycle).
``--nmp-flags`` measures other Verilator/C++ option sets (:data:`coda.cosim.nmp_build.FLAG_SETS`,
one build each). The default NME depth of the DIMM-NMP is 256 words (4 KiB per stream block at
8 lanes): measured with 256 KiB streams, 64 words hold DDR5-4800 to 81 % of peak (read/write
turnarounds of the short blocks), 256 words reach 88 %.

The DRAM controller alone (:func:`bench_dram`, ``--skip-dram`` to leave it out): ``coda dram
replay`` of sequential 64 B reads (16 MiB), STREAM-add (2 MiB arrays) and 65,536 random 64 B
reads over 1 GiB (seed 0) on DDR4-3200 and DDR5-4800 (DDR5 also with same-bank refresh),
every command trace checked by
:mod:`coda.cosim.dram_check`; written to ``build/bench/dram.json``.

First (unless ``--sweep-lanes ''``) the design-space sweep :func:`sweep`: lanes x buffer depth
x NME clock (``--sweep-clocks``, MHz; ``dram``: the NME on the DRAM clock, no crossing) x DRAM
standard (``--sweep-drams``, default DDR5-4800 and DDR4-3200) of one DIMM-NMP rank: elements
per ns, NME and DRAM cycles, ns, GB/s and DRAM utilisation of the residual add and the 4-stream
segment, written to ``build/bench/dse.json`` (+ ``dse.png``, and two tables on stdout: every
point, and the knee per standard and clock, :func:`knees`, with elements/ns per area where
``make synth-sweep`` left areas, :func:`perf_per_area`); ``--sweep-only`` stops there.
``--sweep-units M,A,O`` (default ``0,0,0``, the combinational FP units) gives every point of
the sweep an NME with ``M`` register stages in each FPMul, ``A`` in each FPAdd and ``O``
operand stages after the buffers (:class:`~coda.hw.isa.NMEConfig` ``mul_latency``,
``add_latency``, ``operand_latency``; ``5,7,1``, the deepest units, is the NME that places
and routes on ECP5 at 99–101 MHz, ``4,5,1`` at 97–100 MHz): the sweep parameter ``units``, named in the tables' titles and in
``dse.json``. Every (lanes, depth, standard, units) is one Verilator build for all its clocks
(the clock is a plusarg) and one more for the same-domain NME (cached under
``build/cosim/``), so the first sweep takes a while; the points run through the sweep engine
(:mod:`coda.sweep`): tasks on a local Ray (``--workers``, default all CPUs), on a cluster
(``--address``) or a plain loop (``--sequential``), records in ``build/bench/dse/`` (a stopped
sweep resumes; ``coda sweep bench`` runs the same points).

Prints one JSON object; writes it to ``--out`` (default ``build/bench/cosim.json``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from coda.hw.isa import NMEConfig, Op, Program, RSrc, UOp
from coda.sweep import add_run_options
from coda.jsonout import json_text
from coda.paths import check_output_path


def measure(cfg: NMEConfig, tiny_jobs: int = 50, launches: int = 3) -> dict:
    """Numbers of the module docstring for ``cfg`` (seconds, cycles, cycles/s)."""
    from coda.cosim.build import build_sim
    from coda.cosim.rtl_backend import RTLBackend

    t0 = time.perf_counter()
    build = build_sim(cfg)
    out = {"cfg": {"lanes": cfg.lanes, "fmt": cfg.fmt, "depth": cfg.depth,
                   "mem_words": cfg.mem_words},
           "build_seconds_recorded": round(build.build_seconds, 1),
           "build_or_cache_seconds_now": round(time.perf_counter() - t0, 1)}
    rng = np.random.default_rng(7)
    mem = rng.integers(0, 1 << 16, size=(cfg.mem_words, cfg.lanes), dtype=np.uint16)
    wn = cfg.mem_words // 3 - 1
    big = Program(wn * cfg.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                   UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=wn),
                                   UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * wn)))
    tiny = Program(cfg.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                               UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * wn)))
    with RTLBackend() as rtl:
        t0 = time.perf_counter()
        rtl.execute(cfg, tiny, mem)
        out["simulator_start_seconds"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        res = rtl.execute(cfg, big, mem)
        dt = time.perf_counter() - t0
        out["big_program"] = {"elements": big.n_elems, "cycles": res.cycles,
                              "seconds": round(dt, 3), "cycles_per_s": round(res.cycles / dt)}
        mem = res.mem
        t0 = time.perf_counter()
        for _ in range(tiny_jobs):
            mem = rtl.execute(cfg, tiny, mem).mem
        per = (time.perf_counter() - t0) / tiny_jobs
        out["tiny_job"] = {"cycles": rtl.execute(cfg, tiny, mem).cycles,
                           "ms_per_job": round(per * 1e3, 2)}
    # two ranks in lockstep (the driver's execute_many): each launch runs the big program on
    # both ranks' images; one shared simulator (max_sims=1) reloads the other rank's image
    # every job, one simulator per rank keeps it resident and runs the two in parallel
    images = [mem, rng.integers(0, 1 << 16, size=mem.shape, dtype=np.uint16)]
    out["two_ranks"] = {}
    for sims in (1, 2):
        with RTLBackend(max_sims=sims) as rtl:
            imgs = [r.mem for r in rtl.execute_many(cfg, [(big, m) for m in images])]  # warm
            t0, cycles = time.perf_counter(), 0
            for _ in range(launches):
                res = rtl.execute_many(cfg, [(big, m) for m in imgs])
                imgs = [r.mem for r in res]
                cycles += sum(r.cycles for r in res)
            dt = time.perf_counter() - t0
        out["two_ranks"][f"max_sims={sims}"] = {
            "launches": launches, "seconds_per_launch": round(dt / launches, 3),
            "cycles_per_s": round(cycles / dt)}
    return out


def _segment_programs(cfg: NMEConfig, words: int) -> dict[str, Program]:
    """The long programs of :func:`measure_nmp`, ``words`` words per stream.

    residual_add: ``y = x + c`` (2 read streams, 1 write stream);
    segment4: ``y = (x + c0) + c1`` (3 read streams, 1 write stream).
    """
    n = words * cfg.lanes
    mov = UOp(Op.MOV, RSrc.MEM, d=0, addr=0)
    return {
        "residual_add": Program(n, (mov, UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=words),
                                    UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * words))),
        "segment4": Program(n, (mov, UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=words),
                                UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=2 * words),
                                UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=3 * words))),
    }


def measure_nmp(cfg: NMEConfig, dram: str = "DDR5-4800", dimms: int = 2, ranks: int = 2,
                flags: str | None = None, stream_words: int | None = None,
                nme_mhz: float | None = None) -> dict:
    """Speed and bandwidth of a ``dimms x ranks`` DIMM-NMP on long programs (see docstring).

    Args:
        stream_words: NME words per stream of each program (default: a quarter of the rank's
            ``cfg.mem_words``, minus one); ``4 * stream_words + 1 <= cfg.mem_words``.
        nme_mhz: the NMEs on their own clock of that many MHz (:mod:`coda.hw.nmp`); default
            None: on the DRAM clock.
    Returns a dict with the build time and, per program: cycles (NME cycles to the combined
    done), dram_cycles and ns of the same interval,
    wall seconds of the job (simulation + the job's file traffic, no image load), cycles per
    second, and per-rank DRAM utilisation, row hits/misses/conflicts and refreshes; and
    ``dram_commands`` / ``violations``: the DRAM commands every rank issued and the
    violations :mod:`coda.cosim.dram_check` finds in their logs.
    Raises AssertionError if the checker finds a violation.
    """
    import tempfile

    from coda.cosim import dram_check
    from coda.cosim.nmp_backend import NMPRTLBackend
    from coda.cosim.nmp_build import DEFAULT_FLAGS, build_nmp_sim
    from coda.hw.dram_standards import get_standard

    flags = flags or DEFAULT_FLAGS
    std = get_standard(dram)
    t0 = time.perf_counter()
    build = build_nmp_sim(cfg, std, dimms, ranks, flags=flags, nme_clock=nme_mhz is not None)
    out = {"system": f"{dimms}x{ranks} {std.name}", "flags": flags,
           "cfg": {"lanes": cfg.lanes, "depth": cfg.depth, "mem_words": cfg.mem_words,
                   "mul_latency": cfg.mul_latency, "add_latency": cfg.add_latency,
                   "operand_latency": cfg.operand_latency},
           "build_seconds_recorded": round(build.build_seconds, 1),
           "build_or_cache_seconds_now": round(time.perf_counter() - t0, 1),
           "peak_bytes_per_cycle": std.burst_bytes / std.nBL,
           "refresh_ceiling": round(std.refresh_ceiling, 4)}
    rng = np.random.default_rng(7)
    n = dimms * ranks
    # finite bf16 values (exponent field < 0xFF) so the datapath sees ordinary numbers
    mems = [((rng.integers(0, 1 << 16, size=(cfg.mem_words, cfg.lanes), dtype=np.uint16)
              & 0xBFFF) | 0x0400).astype(np.uint16) for _ in range(n)]
    words = cfg.mem_words // 4 - 1 if stream_words is None else int(stream_words)
    if not 1 <= words <= cfg.mem_words // 4 - 1:
        raise ValueError(f"stream_words={stream_words}: expected 1..{cfg.mem_words // 4 - 1} "
                         f"for mem_words={cfg.mem_words}")
    logs = Path(tempfile.mkdtemp(prefix="coda-nmp-cmds-"))
    with NMPRTLBackend(std.name, dimms, ranks, flags=flags, commands=logs / "cmds.csv",
                       nme_mhz=nme_mhz) as be:
        warm = Program(cfg.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                   UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=3 * words)))
        t0 = time.perf_counter()
        mems = [r.mem for r in be.execute_many(cfg, [(warm, m) for m in mems])]
        out["start_and_load_seconds"] = round(time.perf_counter() - t0, 2)
        for name, prog in _segment_programs(cfg, words).items():
            before = be.last.stats
            t0 = time.perf_counter()
            res = be.execute_many(cfg, [(prog, m) for m in mems])
            wall = time.perf_counter() - t0
            mems = [r.mem for r in res]
            last = be.last
            per_rank = []
            for b, a in zip(before, last.stats):
                d = {k: a[k] - b[k] for k in a}
                moved = (d["reads"] + d["writes"]) * std.burst_bytes
                per_rank.append({
                    "utilisation": round(moved / (last.dram_cycles * std.burst_bytes / std.nBL),
                                         4),
                    "gbps": round(moved / last.ns, 2),
                    "row_hits": d["row_hits"], "row_misses": d["row_misses"],
                    "row_conflicts": d["row_conflicts"], "refreshes": d["refreshes"]})
            out[name] = {"elements_per_rank": prog.n_elems, "cycles": last.cycles,
                         "dram_cycles": last.dram_cycles, "ns": round(last.ns, 1),
                         "nme_mhz": round(last.nme_mhz, 3),
                         "seconds": round(wall, 3),
                         "cycles_per_s": round(last.cycles / wall),
                         # the simulator's own run (feed, program, drain, dirty dump) only
                         "sim_wall_s": round(last.extra["sim_wall_s"], 3),
                         "sim_cycles_per_s": round(last.cycles / last.extra["sim_wall_s"]),
                         # the same run counted per NME: n ranks each run that many cycles
                         "rank_cycles_per_s": round(n * last.cycles / last.extra["sim_wall_s"]),
                         "cycles_per_element": round(last.cycles / prog.n_elems, 3),
                         "min_utilisation": min(r["utilisation"] for r in per_rank),
                         "ranks": per_rank}
    # the logs are complete once the simulator has ended (the with block closed it)
    violations, commands = [], 0
    for path in sorted(logs.glob("cmds.csv*")):
        commands += sum(1 for _ in path.open()) - 1
        violations += dram_check.check_file(std, path)
        path.unlink()
    logs.rmdir()
    out["dram_commands"], out["violations"] = commands, len(violations)
    assert not violations, "\n".join(map(str, violations[:20]))
    return out


PROGRAM_STREAMS = {"residual_add": 3, "segment4": 4}   # DRAM streams of _segment_programs
SWEEP_LANES = (1, 2, 4, 8, 16, 32)
SWEEP_DEPTHS = (256,)
SWEEP_DRAMS = ("DDR5-4800", "DDR4-3200")
#: NME clocks of the sweep in MHz; 0 = the same-domain NME (on the DRAM clock, no crossing)
SWEEP_CLOCKS = (0.0, 100.0, 200.0, 400.0, 800.0, 1200.0)
#: bytes per stream of the sweep's programs (64 KiB, 32,768 elements: a 1-lane point at
#: 100 MHz stays seconds of simulation; the 2 x 2 figures use :data:`NMP_STREAM_BYTES`)
SWEEP_STREAM_BYTES = 64 << 10
#: bytes per stream of the 2 x 2 DIMM-NMP figures of ``make bench``
NMP_STREAM_BYTES = 256 << 10
#: the knee rule's tolerance: the fewest lanes reaching this share of the best utilisation
KNEE_TOLERANCE = 0.95
#: NME units of the sweep, ``"M,A,O"``: FPMul / FPAdd / operand register stages
#: (:class:`~coda.hw.isa.NMEConfig` ``mul_latency``, ``add_latency``, ``operand_latency``);
#: ``0,0,0``: the combinational units, also the units of records and rows that name none
SWEEP_UNITS = "0,0,0"
#: dse.json format: 1 (no key; one standard, NME on the DRAM clock), 2 (standard and NME
#: clock per row, knees, areas), 3 (the NME units of the sweep and of every row and knee)
DSE_VERSION = 3
#: where :func:`synth_areas` looks for the synthesis sweep's reports (``make synth-sweep``)
SYNTH_ROOT = Path("build/synth/sweep")


def _mem_words(stream_words: int) -> int:
    """Rank memory (power of two, >= 1024 words) holding the 4 streams of segment4 (+1 word)."""
    return 1 << max(10, (4 * stream_words).bit_length())


def parse_clocks(text: str) -> list[float]:
    """``--sweep-clocks`` as MHz: comma-separated numbers, ``dram`` (or 0) for the
    same-domain NME. Raises ValueError naming a bad entry or an empty list."""
    out = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if tok.lower() in ("dram", "same", "0"):
            out.append(0.0)
            continue
        try:
            f = float(tok)
        except ValueError:
            raise ValueError(f"--sweep-clocks entry {tok!r}: expected MHz or 'dram'") from None
        if not f > 0 or f != f or f == float("inf"):
            raise ValueError(f"--sweep-clocks entry {tok!r}: expected a positive number of "
                             "MHz or 'dram'")
        out.append(f)
    if not out:
        raise ValueError("--sweep-clocks: expected at least one clock")
    return out


def parse_units(text: str, flag: str = "units") -> tuple[int, int, int]:
    """NME units ``"M,A,O"`` as ``(mul_latency, add_latency, operand_latency)``: register
    stages (NME cycles) in each FPMul, in each FPAdd, and between the buffers and the
    operand registers, each in the range :class:`~coda.hw.isa.NMEConfig` accepts.
    ``flag`` names the value's source in the error (``--sweep-units``, ``units``).
    Raises ValueError naming ``flag`` and the value for anything but three comma-separated
    ints in range."""
    from coda.hw.isa import MAX_ADD_LATENCY, MAX_MUL_LATENCY, MAX_OPERAND_LATENCY

    want = (f"expected M,A,O: three comma-separated ints, mul 0..{MAX_MUL_LATENCY}, "
            f"add 0..{MAX_ADD_LATENCY}, operand 0..{MAX_OPERAND_LATENCY}")
    toks = [t.strip() for t in str(text).split(",")]
    try:
        if len(toks) != 3:
            raise ValueError(f"{len(toks)} given")
        mul, add, opnd = (int(t) for t in toks)
        # NMEConfig's own range check of the three latencies
        NMEConfig(mul_latency=mul, add_latency=add, operand_latency=opnd)
    except ValueError as exc:
        raise ValueError(f"{flag} {text!r}: {want} ({exc})") from None
    return mul, add, opnd


def units_label(units: str | tuple | None) -> str:
    """The canonical ``"M,A,O"`` of NME units (a string as :func:`parse_units` reads it, or a
    ``(mul, add, operand)`` tuple); None or ``""``: :data:`SWEEP_UNITS` (a record of a sweep
    before units were a parameter). Raises ValueError like :func:`parse_units`."""
    if units is None or units == "":
        units = SWEEP_UNITS
    if not isinstance(units, str):
        units = ",".join(str(v) for v in units)
    return ",".join(map(str, parse_units(units)))


def config_units(cfg: dict) -> str:
    """The ``"M,A,O"`` NME units of a synthesis report's ``config`` (an
    :class:`~coda.hw.isa.NMEConfig` as a dict; absent latencies, as in reports from before
    the pipelined units: 0)."""
    return units_label(tuple(int(cfg.get(k) or 0) for k in
                             ("mul_latency", "add_latency", "operand_latency")))


def units_title(units: str | tuple | None) -> str:
    """``"NME units mul M / add A / operand O"`` (register stages) for table titles."""
    mul, add, opnd = parse_units(units_label(units))
    return f"NME units mul {mul} / add {add} / operand {opnd}"


def clock_label(nme_mhz: float | None) -> str:
    """``'dram'`` for the same-domain NME (None or 0), else the MHz as ``'%g'``."""
    return "dram" if not nme_mhz else f"{nme_mhz:g}"


def program_figures(m: dict, std) -> dict:
    """The figures of one program of a :func:`measure_nmp` result ``m`` on one rank of
    ``std``: ``elements`` (output elements per rank), ``cycles`` (NME cycles), ``dram_cycles``
    (tCK), ``ns``, ``elements_per_ns``, ``cycles_per_element`` / ``elements_per_cycle`` (NME
    cycles), ``utilisation`` (rank 0: DRAM bytes moved / peak bytes of the DRAM cycles, 0..1),
    ``gbps`` (rank 0, GB/s)."""
    r0 = m["ranks"][0]
    return {"elements": m["elements_per_rank"], "cycles": m["cycles"],
            "dram_cycles": m["dram_cycles"], "ns": m["ns"],
            "elements_per_ns": round(m["elements_per_rank"] / m["ns"], 5),
            "cycles_per_element": m["cycles_per_element"],
            "elements_per_cycle": round(m["elements_per_rank"] / m["cycles"], 4),
            "utilisation": r0["utilisation"], "gbps": r0["gbps"]}


def dse_point(params: dict, workdir: Path | None = None) -> dict:
    """One point of the design space: a 1 DIMM x 1 rank DIMM-NMP of ``params["dram"]`` with
    an NME of ``lanes`` lanes and ``depth`` words per stream block (``fmt``) on its own clock
    of ``nme_mhz`` MHz (0 or absent: on the DRAM clock, no crossing; that is a separate
    Verilator build, every other clock shares one build per lanes, depth, standard, units)
    and ``units`` (``"M,A,O"``, :func:`parse_units`; absent: ``0,0,0``) register stages in its
    FPMul / FPAdd / operand path (``NMEConfig.mul_latency`` / ``add_latency`` /
    ``operand_latency``), running
    the residual add and the 4-stream segment of :func:`_segment_programs` over
    ``stream_bytes`` bytes per stream. Returns, per program ``P`` in (residual_add,
    segment4), the figures of :func:`program_figures` as ``P.<name>`` (NME cycles, DRAM
    cycles, ns, elements per ns and per NME cycle, utilisation 0..1, GB/s per rank);
    ``nme_mhz_effective`` (the DRAM clock for the same-domain NME); ``timing``: simulated
    cycles per wall second and the build's seconds.
    Raises ValueError for a size the NME cannot take, a clock outside (0, DRAM clock] or
    units that are not three ints in range (all before any build)."""
    from coda.hw.dram_standards import get_standard
    from coda.hw.nmp import check_nme_mhz

    n_lanes, depth = int(params["lanes"]), int(params["depth"])
    if n_lanes < 1 or depth < 1:
        raise ValueError(f"lanes={n_lanes}, depth={depth}: expected >= 1")
    words = int(params["stream_bytes"]) // (2 * n_lanes)
    if words < 1:
        raise ValueError(f"stream_bytes={params['stream_bytes']}: expected at least one NME "
                         f"word ({2 * n_lanes} bytes at {n_lanes} lanes)")
    std = get_standard(params["dram"])
    raw = params.get("nme_mhz") or 0.0
    if raw < 0:
        raise ValueError(f"nme_mhz={raw!r}: expected a positive number of MHz, or 0 for the "
                         "NME on the DRAM clock")
    mhz = check_nme_mhz(raw, std) if raw else None
    # `coda sweep bench --param units=3,5,1` splits on the commas: say where the value goes
    try:
        mul, add, opnd = parse_units(units_label(params.get("units")))
    except ValueError as exc:
        raise ValueError(f"{exc}; with `coda sweep`, give units in a --grid TOML file "
                         "(units = [\"3,5,1\"]): --param splits on commas") from None
    cfg = NMEConfig(lanes=n_lanes, fmt=params["fmt"], depth=depth, mem_words=_mem_words(words),
                    mul_latency=mul, add_latency=add, operand_latency=opnd)
    r = measure_nmp(cfg, std.name, 1, 1, stream_words=words, nme_mhz=mhz)
    figures = {"nme_mhz_effective": round(mhz or 1000.0 / std.tCK_ns, 3)}
    timing = {"build_seconds": r["build_seconds_recorded"]}
    for prog in PROGRAM_STREAMS:
        figures.update({f"{prog}.{k}": v for k, v in program_figures(r[prog], std).items()})
        timing[f"{prog}.sim_cycles_per_s"] = r[prog]["sim_cycles_per_s"]
    figures["timing"] = timing
    return figures


def sweep_kind():
    """The ``bench`` sweep kind (coda.sweep.SweepKind): the DIMM-NMP design space, one
    :func:`dse_point` per (lanes, depth, fmt, dram, stream_bytes, nme_mhz, units)."""
    import coda.hw
    from coda.sweep import Param, SweepKind, sources_digest
    return SweepKind(
        name="bench", run=dse_point,
        version=sources_digest(Path(__file__).parent, Path(coda.hw.__file__).parent),
        description="DIMM-NMP design space: lanes x buffer depth x NME clock of one rank "
                    "(make bench)",
        params=(Param("lanes", int, 8), Param("depth", int, 256), Param("fmt", str, "bf16"),
                Param("dram", str, "DDR5-4800"), Param("stream_bytes", int, SWEEP_STREAM_BYTES),
                Param("nme_mhz", float, 0.0,
                      help="NME clock in MHz; 0: on the DRAM clock (no crossing)"),
                Param("units", str, SWEEP_UNITS,
                      help="NME units M,A,O: FPMul / FPAdd / operand register stages "
                           "(mul_latency, add_latency, operand_latency)")),
        headline=("residual_add.elements_per_ns", "residual_add.utilisation",
                  "segment4.elements_per_ns", "segment4.utilisation", "segment4.gbps"))


ROW_KEYS = ("elements", "cycles", "dram_cycles", "ns", "elements_per_ns", "cycles_per_element",
            "elements_per_cycle", "utilisation", "gbps")


def dse_rows(records: list[dict]) -> list[dict]:
    """The finished sweep records of :func:`sweep_kind` as the rows of ``dse.json``: one per
    (dram, units, nme_mhz, lanes, depth, program) with ``dram, units`` (``"M,A,O"``,
    :func:`units_label`), ``nme_mhz`` (None: on the DRAM clock), ``nme_mhz_effective, lanes,
    depth, program``, the :data:`ROW_KEYS` figures, ``sim_cycles_per_s, build_seconds``.
    Records of the first sweep (no ``nme_mhz`` parameter, no ns) are rows on the DRAM clock;
    the figures they lack (``dram_cycles``, ``ns``, ``elements_per_ns``) are derived from
    their NME cycles = DRAM cycles. Records without ``units`` (before units were a
    parameter) are the combinational NME, ``0,0,0``. Raises ValueError for an ok record
    whose units are not :func:`parse_units`'s."""
    from coda.hw.dram_standards import get_standard

    rows = []
    for rec in records:
        if rec["status"] != "ok":
            continue
        p, f, t = rec["params"], rec["figures"], rec.get("timing") or {}
        std = get_standard(p.get("dram", "DDR5-4800"))
        mhz = p.get("nme_mhz") or None
        for prog in PROGRAM_STREAMS:
            vals = {k: f.get(f"{prog}.{k}") for k in ROW_KEYS}
            if vals["ns"] is None:          # a version-1 record: NME cycle = tCK
                vals["dram_cycles"] = vals["cycles"]
                vals["ns"] = round(vals["cycles"] * std.tCK_ns, 1)
                vals["elements_per_ns"] = round(vals["elements"] / vals["ns"], 5)
            rows.append({"dram": std.name, "units": units_label(p.get("units")),
                         "nme_mhz": mhz,
                         "nme_mhz_effective": f.get("nme_mhz_effective",
                                                    round(1000.0 / std.tCK_ns, 3)),
                         "lanes": p["lanes"], "depth": p["depth"], "program": prog, **vals,
                         "sim_cycles_per_s": t.get(f"{prog}.sim_cycles_per_s"),
                         "build_seconds": t.get("build_seconds")})
    return rows


def row_units(row: dict) -> str:
    """The NME units ``"M,A,O"`` of a row of :func:`dse_rows` or :func:`knees` (a row of a
    ``dse.json`` before units: ``0,0,0``)."""
    return row.get("units") or SWEEP_UNITS


def best_rows(rows: list[dict]) -> list[dict]:
    """Per (dram, units, nme_mhz, program, lanes) the row of the best depth (the most
    elements per ns; ties: the smaller depth), sorted by those keys (same-domain clock
    first)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r.get("dram"), row_units(r), r.get("nme_mhz"), r["program"], r["lanes"])
        b = best.get(key)
        if b is None or (r["elements_per_ns"], -r["depth"]) > (b["elements_per_ns"], -b["depth"]):
            best[key] = r
    return [best[k] for k in sorted(best, key=lambda k: (k[0] or "", k[1], k[2] or 0.0,
                                                         k[3], k[4]))]


def knees(rows: list[dict], tolerance: float = KNEE_TOLERANCE) -> list[dict]:
    """The knee per (standard, NME units, NME clock, program), derived from the sweep's rows.

    Rule: over the best depth per lanes count (:func:`best_rows`), the knee is the fewest
    lanes whose DRAM utilisation is at least ``tolerance`` times the best utilisation at that
    clock (``best_utilisation``); more lanes add area, not bandwidth. A knee is only a
    saturated rank when that best is itself DRAM-bound: ``saturated`` is True when
    ``best_utilisation >= tolerance * rank_best`` with ``rank_best`` the best utilisation of
    the program on that standard with those units at any clock of the rows (so a sweep of
    one clock is its own ``rank_best``: saturated by definition). Otherwise the NME port
    (lanes x 2 B x f) is the limit at every lanes count swept, the knee is just the widest
    NME, and ``lanes_to_saturate`` extrapolates linearly from the widest point:
    ``ceil(lanes_max * tolerance * rank_best / utilisation(lanes_max))`` (None when
    saturated).

    Returns one dict per (dram, units, nme_mhz, program), sorted like :func:`best_rows`:
    ``dram, units, nme_mhz, nme_mhz_effective, program, knee_lanes, knee_depth,
    knee_utilisation, knee_elements_per_ns, best_utilisation, rank_best, saturated,
    lanes_to_saturate, tolerance``. Raises ValueError for a tolerance outside (0, 1].
    """
    import math

    if not 0 < tolerance <= 1:
        raise ValueError(f"tolerance={tolerance!r}: expected 0 < tolerance <= 1")
    best = best_rows(rows)
    rank_best: dict[tuple, float] = {}
    for r in best:
        k = (r.get("dram"), row_units(r), r["program"])
        rank_best[k] = max(rank_best.get(k, 0.0), r["utilisation"])
    groups: dict[tuple, list[dict]] = {}
    for r in best:
        groups.setdefault((r.get("dram"), row_units(r), r.get("nme_mhz"), r["program"]),
                          []).append(r)
    out = []
    for (dram, units, mhz, prog), pts in groups.items():
        top = max(p["utilisation"] for p in pts)
        knee = min((p for p in pts if p["utilisation"] >= tolerance * top),
                   key=lambda p: p["lanes"])
        rb = rank_best[(dram, units, prog)]
        saturated = top >= tolerance * rb
        widest = max(pts, key=lambda p: p["lanes"])
        out.append({"dram": dram, "units": units, "nme_mhz": mhz,
                    "nme_mhz_effective": knee.get("nme_mhz_effective"), "program": prog,
                    "knee_lanes": knee["lanes"], "knee_depth": knee["depth"],
                    "knee_utilisation": knee["utilisation"],
                    "knee_elements_per_ns": knee["elements_per_ns"],
                    "best_utilisation": top, "rank_best": rb, "saturated": saturated,
                    "lanes_to_saturate": None if saturated else math.ceil(
                        widest["lanes"] * tolerance * rb / widest["utilisation"]),
                    "tolerance": tolerance})
    return out


def synth_areas(root: Path = SYNTH_ROOT, fmt: str = "bf16",
                units: str | tuple = SWEEP_UNITS) -> dict[int, dict]:
    """Area per lanes count from the synthesis sweep's reports (``make synth-sweep``:
    ``root/points/*/report.json``) of format ``fmt`` and NME ``units`` ``"M,A,O"``
    (:func:`config_units`): ``{lanes: {"cells_total": yosys generic cells, "lut4": ECP5
    LUT4s, "fmax_mhz": ECP5 Fmax in MHz}}``, each key only where that target was
    synthesised (ECP5: of the seed with the best Fmax); ``{}`` when there are none (no
    synthesis sweep run yet). Raises ValueError for bad ``units``."""
    want = units_label(units)
    areas: dict[int, dict] = {}
    for path in sorted(Path(root).glob("points/*/report.json")):
        try:
            report = json.loads(path.read_text())
            cfg, target = report["config"], report["target"]
            res = report[target]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if cfg.get("fmt") != fmt or config_units(cfg) != want:
            continue
        a = areas.setdefault(int(cfg["lanes"]), {})
        if target == "generic" and res.get("cells_total"):
            a["cells_total"] = res["cells_total"]
        elif target == "ecp5" and res.get("lut4") and not fmax_below(res, a):
            a["lut4"] = res["lut4"]
            if res.get("fmax_mhz"):
                a["fmax_mhz"] = res["fmax_mhz"]
    return areas


def fmax_below(res: dict, kept: dict) -> bool:
    """An ECP5 report ``res`` whose Fmax is below that of the one ``kept`` for the same
    configuration: several placer seeds of one netlist (``make synth-sweep --seed``) give the
    same area and different Fmax, and the best one counts."""
    return (res.get("fmax_mhz") or 0.0) < (kept.get("fmax_mhz") or 0.0)


def perf_per_area(rows: list[dict], areas: dict[int, dict]) -> list[dict]:
    """``rows`` (any dicts with ``lanes`` and ``elements_per_ns``) with performance per area
    where the lanes count has an area in ``areas`` (:func:`synth_areas`):
    ``per_kcell`` = elements/ns per 1,000 yosys generic cells, ``per_klut`` = elements/ns per
    1,000 ECP5 LUT4s (that is, G elements/s per 1k cells / LUT4s), plus ``cells_total`` /
    ``lut4``; absent keys where there is no area. Rows of :func:`knees` use
    ``knee_lanes`` / ``knee_elements_per_ns``."""
    out = []
    for r in rows:
        r = dict(r)
        lanes = r.get("lanes", r.get("knee_lanes"))
        e = r.get("elements_per_ns", r.get("knee_elements_per_ns"))
        a = areas.get(lanes, {})
        if a.get("cells_total"):
            r["cells_total"] = a["cells_total"]
            r["per_kcell"] = e / (a["cells_total"] / 1e3)
        if a.get("lut4"):
            r["lut4"] = a["lut4"]
            r["per_klut"] = e / (a["lut4"] / 1e3)
        out.append(r)
    return out


def sweep(lanes=SWEEP_LANES, depths=SWEEP_DEPTHS, fmt: str = "bf16",
          dram: str | tuple | list = SWEEP_DRAMS, stream_bytes: int = SWEEP_STREAM_BYTES,
          out: Path | None = None, *, clocks=SWEEP_CLOCKS, workers: int | None = None,
          sequential: bool = False, address: str | None = None,
          tolerance: float = KNEE_TOLERANCE, synth_root: Path = SYNTH_ROOT,
          units: str | tuple = SWEEP_UNITS) -> list[dict]:
    """Design-space exploration of one rank: NME lanes x buffer depth (words per stream
    block) x NME clock (MHz; 0 = on the DRAM clock) x DRAM standard(s) ``dram``, every point
    with the NME units ``units`` (``"M,A,O"`` or a tuple: FPMul / FPAdd / operand register
    stages, :func:`parse_units`; default ``0,0,0``, the combinational units).

    Every point is a :func:`dse_point` run by :func:`coda.sweep.run_sweep`: a task on Ray
    (local, ``workers`` CPUs, or the cluster at ``address``) or, with ``sequential``, a loop
    in this process. A clock above a standard's DRAM clock is left out for that standard
    (said on stdout). The points are ordered build by build: every clock of one (standard,
    lanes, depth) runs on the same cached Verilator model under ``build/cosim/`` (the NME
    clock is a plusarg), the same-domain clock on a second one. One rank suffices: the ranks
    of a DIMM-NMP run the same program in lockstep, each on its own DRAM, so per-rank cycles
    and bandwidth are those of the whole system (measured: the 2 x 2 system at lanes 8 /
    depth 256 gives exactly the cycles and utilisation of the 1 x 1 row, 88.15 % / 88.42 %).

    Returns the rows of :func:`dse_rows`. Point records go to ``<out without .json>/`` (the
    engine's ``results.jsonl``: a stopped sweep resumes where it was); ``out`` (JSON, when
    given) gets ``{"version": 3, "drams", "dram" (the first), "clocks", "fmt",
    "stream_bytes", "units", "rows", "knees"`` (:func:`knees` at ``tolerance``, with perf/area),
    ``"areas"`` (:func:`synth_areas` of ``synth_root``, ``{}`` if none) ``}``.
    Raises ValueError for an empty lanes / depths / clocks / standards list, a clock
    below 0 or above every standard's DRAM clock, or bad ``units`` (before any point runs).
    """
    from coda.sweep import run_sweep

    drams = [dram] if isinstance(dram, str) else list(dram)
    lanes, depths, clocks = list(lanes), list(depths), [float(c) for c in clocks]
    for name, vals in (("lanes", lanes), ("depths", depths), ("clocks", clocks),
                       ("dram", drams)):
        if not vals:
            raise ValueError(f"sweep: {name} is empty, expected at least one value")
    from coda.hw.dram_standards import get_standard

    units = units_label(units)
    kind = sweep_kind()
    fastest = max(1000.0 / get_standard(s).tCK_ns for s in drams)
    for c in clocks:
        if c < 0 or c > fastest * (1 + 1e-9):
            raise ValueError(f"sweep: clock {c:g} MHz: expected 0 (on the DRAM clock) or up to "
                             f"the fastest standard's DRAM clock, {fastest:g} MHz")
    points = []
    for s in drams:
        top = 1000.0 / get_standard(s).tCK_ns
        over = [c for c in clocks if c > top * (1 + 1e-9)]
        if over:        # faster than this standard's DRAM clock: not a buffer-chip NME
            print(f"sweep: {s}: clocks {', '.join(f'{c:g}' for c in over)} MHz exceed its "
                  f"DRAM clock ({top:g} MHz), left out for it")
        points += [kind.full({"lanes": n, "depth": d, "fmt": fmt, "dram": s,
                              "stream_bytes": stream_bytes, "nme_mhz": c, "units": units})
                   for n in lanes for d in depths
                   for c in sorted(clocks, key=lambda c: (c == 0, c)) if c not in over]
    folder = (out.with_suffix("") if out else Path("build/bench/dse"))
    rows = dse_rows(run_sweep(kind, points, folder, workers=workers, sequential=sequential,
                              address=address))
    if out:
        write_dse(out, rows, drams, fmt, clocks, stream_bytes, tolerance, synth_root,
                  units=units)
    return rows


def write_dse(out: Path, rows: list[dict], drams, fmt: str, clocks, stream_bytes: int,
              tolerance: float = KNEE_TOLERANCE, synth_root: Path = SYNTH_ROOT, *,
              units: str | tuple = SWEEP_UNITS) -> None:
    """Write ``dse.json`` (version :data:`DSE_VERSION`, keys of :func:`sweep`; ``units``: the
    sweep's NME units as ``"M,A,O"``) to ``out``. Raises ValueError for bad ``units``."""
    units = units_label(units)
    areas = synth_areas(synth_root, fmt, units)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json_text({
        "version": DSE_VERSION, "drams": list(drams), "dram": list(drams)[0], "fmt": fmt,
        "clocks": list(clocks), "stream_bytes": stream_bytes, "units": units, "rows": rows,
        "knees": perf_per_area(knees(rows, tolerance), areas),
        "areas": {str(k): v for k, v in sorted(areas.items())}}, indent=1) + "\n")


def recorded_rows(folder: Path, lanes=None, depths=None, fmt: str = "bf16", drams=None,
                  stream_bytes: int = SWEEP_STREAM_BYTES, clocks=None,
                  units: str | tuple | None = SWEEP_UNITS) -> list[dict]:
    """The :func:`dse_rows` of the ``ok`` records already in ``folder/results.jsonl``, of any
    sources version (the records of an earlier code state, also version-1 records without
    an NME clock: the NME on the DRAM clock), newest per parameter set; only those matching
    ``fmt``, ``stream_bytes``, ``units`` (the NME units ``"M,A,O"``, default ``0,0,0``; a
    record without units is ``0,0,0``; None: any units) and, where given, ``lanes``,
    ``depths``, ``drams``, ``clocks`` (MHz, 0 = on the DRAM clock). For
    ``--sweep-report-only``: tables, JSON and plot without measuring. Raises ValueError
    (coda.sweep.read_results) for a file that is not this engine's records of the ``bench``
    kind, or for bad ``units``."""
    from coda.sweep import read_results

    want = None if units is None else units_label(units)
    newest: dict[str, dict] = {}
    for rec in read_results(folder, sweep_kind()):
        p = rec["params"]
        if rec["status"] != "ok":
            continue
        rec_units = units_label(p.get("units"))
        if p.get("fmt", "bf16") != fmt \
                or p.get("stream_bytes") != stream_bytes \
                or (lanes is not None and p["lanes"] not in lanes) \
                or (depths is not None and p["depth"] not in depths) \
                or (drams is not None and p.get("dram", "DDR5-4800") not in drams) \
                or (clocks is not None and float(p.get("nme_mhz") or 0.0) not in clocks) \
                or (want is not None and rec_units != want):
            continue
        newest[json.dumps({**{k: p.get(k) for k in ("lanes", "depth", "fmt", "dram",
                                                    "stream_bytes", "nme_mhz")},
                           "units": rec_units}, sort_keys=True)] = rec
    return dse_rows(list(newest.values()))


def by_units(rows: list[dict]) -> dict[str, list[dict]]:
    """``rows`` (of :func:`dse_rows` or :func:`knees`) split by their NME units
    (:func:`row_units`), in units order, each list in the order of ``rows``; ``{"0,0,0":
    []}`` for no rows (an empty table still has its title)."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(row_units(r), []).append(r)
    if not out:
        return {SWEEP_UNITS: []}
    return {u: out[u] for u in sorted(out, key=parse_units)}


def print_sweep(rows: list[dict]) -> None:
    """The sweep as rich tables, one per NME units (titled with them, :func:`units_title`):
    one line per (standard, NME clock, lanes, depth), both programs side by side: elements
    per ns, DRAM utilisation (%) and GB/s per rank."""
    from rich.console import Console
    from rich.table import Table

    for units, mine in by_units(rows).items():
        t = Table(title=f"DIMM-NMP design space (per rank), {units_title(units)}")
        for col in ("standard", "NME MHz", "lanes", "depth", "add elem/ns", "add util",
                    "add GB/s", "seg4 elem/ns", "seg4 util", "seg4 GB/s"):
            t.add_column(col, justify="right")
        by = {(r.get("dram"), r.get("nme_mhz"), r["lanes"], r["depth"], r["program"]): r
              for r in mine}
        for dram, mhz, lanes, depth in sorted({k[:4] for k in by},
                                              key=lambda k: (k[0] or "", k[1] or 0.0, k[2],
                                                             k[3])):
            cells = [dram or "-", clock_label(mhz), str(lanes), str(depth)]
            for prog in ("residual_add", "segment4"):
                r = by.get((dram, mhz, lanes, depth, prog))
                cells += ([f"{r['elements_per_ns']:.3f}", f"{100 * r['utilisation']:.1f} %",
                           f"{r['gbps']:.2f}"] if r else ["-"] * 3)
            t.add_row(*cells)
        Console(width=200).print(t)


def print_knees(knee_rows: list[dict], areas: dict[int, dict]) -> None:
    """The knee per (standard, clock, program) (:func:`knees`) with performance per area
    (:func:`perf_per_area`; says so when no synthesis results exist), one table per NME
    units (titled with them, :func:`units_title`)."""
    from rich.console import Console
    from rich.table import Table

    tol = knee_rows[0]["tolerance"] if knee_rows else KNEE_TOLERANCE
    c = Console(width=200)
    for units, mine in by_units(knee_rows).items():
        t = Table(title=f"knee per clock: fewest lanes within {100 * tol:.0f} % of the best "
                        f"utilisation at that clock, {units_title(units)}")
        for col in ("standard", "NME MHz", "program", "knee lanes", "depth", "util", "elem/ns",
                    "best util", "DRAM-bound", "lanes to saturate", "elem/ns per 1k cells",
                    "elem/ns per 1k LUT4"):
            t.add_column(col, justify="right")
        for k in perf_per_area(mine, areas):
            t.add_row(k["dram"] or "-", clock_label(k["nme_mhz"]), k["program"],
                      str(k["knee_lanes"]), str(k["knee_depth"]),
                      f"{100 * k['knee_utilisation']:.1f} %",
                      f"{k['knee_elements_per_ns']:.3f}",
                      f"{100 * k['best_utilisation']:.1f} %", "yes" if k["saturated"] else "no",
                      "-" if k["lanes_to_saturate"] is None else f">= {k['lanes_to_saturate']}",
                      f"{k['per_kcell']:.4f}" if "per_kcell" in k else "-",
                      f"{k['per_klut']:.4f}" if "per_klut" in k else "-")
        c.print(t)
    if not areas:
        c.print(f"perf/area: no synthesis results under {SYNTH_ROOT} (run `make synth-sweep`); "
                "area columns left empty")


def plot_sweep(rows: list[dict], path: Path, dram: str | None = None) -> None:
    """Per standard, elements per ns (upper) and DRAM utilisation in % (lower) against lanes,
    one line per NME clock (best depth per lanes, :func:`best_rows`), one column per program,
    with the rank's DRAM ceiling (peak GB/s / (2 B x streams)) on the elements-per-ns axes
    (PNG); the NME units in the figure's title (:func:`units_title`), and with rows of
    several units one line per units and clock, each labelled with its units. ``dram``:
    only that standard (default: every standard in ``rows``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from coda.hw.dram_standards import get_standard

    best = best_rows(rows)
    units_sets = list(by_units(best))
    stds = [dram] if dram else sorted({r.get("dram") or "DDR5-4800" for r in best})
    fig, axes = plt.subplots(2 * len(stds), 2, figsize=(10, 6 * len(stds)), sharex=True,
                             squeeze=False)
    for s, name in enumerate(stds):
        std = get_standard(name)
        for col, prog in enumerate(("residual_add", "segment4")):
            top, bottom = axes[2 * s, col], axes[2 * s + 1, col]
            mine = [r for r in best if (r.get("dram") or "DDR5-4800") == std.name
                    and r["program"] == prog]
            for units, mhz in sorted({(row_units(r), r.get("nme_mhz") or 0.0) for r in mine},
                                     key=lambda k: (parse_units(k[0]), k[1])):
                pts = sorted((r["lanes"], r) for r in mine if (r.get("nme_mhz") or 0.0) == mhz
                             and row_units(r) == units)
                label = ("same domain" if not mhz else f"{mhz:g} MHz")
                if len(units_sets) > 1:
                    label += f", units {units}"
                x = [p[0] for p in pts]
                top.plot(x, [p[1]["elements_per_ns"] for p in pts], "o-", label=label)
                bottom.plot(x, [100 * p[1]["utilisation"] for p in pts], "o-", label=label)
            streams = PROGRAM_STREAMS[prog]
            top.axhline(std.peak_gbps / (2 * streams), color="r", linestyle="--",
                        label=f"DRAM peak / ({streams} x 2 B)")
            top.set_title(f"{std.name} {prog}")
            top.set_ylabel("elements / ns / rank")
            bottom.set_ylabel(f"{std.name} utilisation (%)")
            bottom.set_xlabel("NME lanes")
            for ax in (top, bottom):
                ax.set_xscale("log", base=2)
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=7)
            top.set_yscale("log", base=2)
    fig.suptitle("; ".join(units_title(u) for u in units_sets), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: controller of the random-read row of :func:`bench_dram`: a 64-entry read queue, FR-FCFS over
#: all of it with up to 16 overtakes of the oldest, closed rows tracked for 16 banks (every
#: access a miss: the next ACT need not wait for a PRE). Measured on the 65,536 random reads
#: (share of the ACT bound, DDR4-3200 / DDR5-4800): queue and window 32 with 4 tracked banks
#: 91.2 % / 82.5 %, 48 with 16 banks - / 89.4 %, 64 with 16 banks 92.4 % / 90.7 %.
RANDOM_CONTROLLER = {"read_queue": 64, "lookahead": 64, "row_policy": "closed", "max_bypass": 16,
                     "policy_banks": 16}
DRAM_BENCH_STANDARDS = ("DDR4-3200", "DDR5-4800")


def bench_dram(standards=DRAM_BENCH_STANDARDS, out: Path | None = None) -> list[dict]:
    """The DRAM rows of ``make bench`` (module docstring): one dict per (standard, trace) with
    the replay's results, ``violations`` (checker), and for the random reads ``act_bound_gbps``
    and ``of_act_bound`` (:attr:`coda.hw.dram_standards.DRAMStandard.act_bound_gbps`).

    Raises AssertionError if a command trace breaks a JEDEC rule."""
    import tempfile

    from coda.cosim import dram_check, dram_replay
    from coda.hw.dram_standards import get_standard

    rows = []
    for name in standards:
        std = get_standard(name)
        traces = [("sequential 16 MiB", [(0, 0, a) for a in range(0, 16 << 20, 64)], None),
                  ("STREAM-add 2 MiB", dram_replay.stream_add_trace(std, 2 << 20), None),
                  ("random 65536 x 64 B / 1 GiB",
                   dram_replay.random_read_trace(std, 65536, 1 << 30, seed=0),
                   RANDOM_CONTROLLER)]
        if std.tRFCsb:      # DDR5: the same with same-bank refresh (REFsb)
            traces.append(("random, same-bank refresh", traces[-1][1],
                           {**RANDOM_CONTROLLER, "refresh": "same_bank"}))
        for label, reqs, ctrl in traces:
            with tempfile.TemporaryDirectory() as tmp:
                cmds = Path(tmp) / "cmds.csv"
                res = dram_replay.run_requests(std, reqs, commands=cmds, controller=ctrl)
                violations = dram_check.check_file(std, cmds)
            row = {"standard": name, "trace": label, "controller": ctrl or {},
                   "violations": len(violations),
                   **{k: res[k] for k in ("gbps", "utilisation", "peak_gbps", "dram_cycles",
                                          "row_hits", "row_misses", "row_conflicts",
                                          "refreshes", "sim_cycles_per_s")}}
            if label.startswith("random"):
                row["act_bound_gbps"] = std.act_bound_gbps
                row["of_act_bound"] = res["gbps"] / std.act_bound_gbps
            rows.append(row)
            assert not violations, "\n".join(map(str, violations[:20]))
            print(f"{name:10s} {label:28s} {res['gbps']:6.2f} GB/s ({100 * res['utilisation']:.1f} %)"
                  + (f", {100 * row['of_act_bound']:.1f} % of the ACT bound "
                     f"{std.act_bound_gbps:.2f} GB/s" if "of_act_bound" in row else "")
                  + f", {len(violations)} violations", flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json_text(rows, indent=1) + "\n")
    return rows


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda bench``."""
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--fmt", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--mem-words", type=int, default=1 << 16)
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("build/bench/cosim.json"))
    parser.add_argument("--nmp-dimms", type=int, default=2)
    parser.add_argument("--nmp-ranks", type=int, default=2)
    parser.add_argument("--nmp-dram", default="DDR5-4800")
    parser.add_argument("--nmp-lanes", type=int, default=8,
                        help="NME lanes of the DIMM-NMP (8: 16 B per NME cycle, twice DDR5's "
                             "8 B/tCK)")
    parser.add_argument("--nmp-depth", type=int, default=256,
                        help="NME buffer depth in words of the DIMM-NMP (words per stream "
                             "block)")
    parser.add_argument("--nmp-flags", default=None,
                        help="comma-separated FLAG_SETS keys to compare, or 'all' (default: the "
                             "backend's default set only)")
    parser.add_argument("--skip-nme", action="store_true", help="only the DIMM-NMP figures")
    parser.add_argument("--skip-dram", action="store_true",
                        help="leave out the DRAM controller replays (build/bench/dram.json)")
    parser.add_argument("--sweep-lanes", default=",".join(map(str, SWEEP_LANES)),
                        help="lanes of the design-space sweep ('' = no sweep)")
    parser.add_argument("--sweep-depths", default=",".join(map(str, SWEEP_DEPTHS)))
    parser.add_argument("--sweep-clocks",
                        default=",".join(clock_label(c) for c in SWEEP_CLOCKS),
                        help="NME clocks of the sweep in MHz, 'dram' for the NME on the DRAM "
                             "clock (no crossing); each at most the standard's DRAM clock")
    parser.add_argument("--sweep-drams", default=",".join(SWEEP_DRAMS),
                        help="DRAM standards of the sweep")
    parser.add_argument("--sweep-stream-bytes", type=int, default=SWEEP_STREAM_BYTES,
                        help="bytes per stream of the sweep's programs")
    parser.add_argument("--sweep-units", default=SWEEP_UNITS, metavar="M,A,O",
                        help="NME units of every sweep point: register stages in each FPMul, "
                             "each FPAdd, and after the buffers (NMEConfig mul_latency, "
                             "add_latency, operand_latency; default 0,0,0, combinational; 5,7,1 "
                             "places and routes on ECP5 at about 100 MHz)")
    parser.add_argument("--knee-tolerance", type=float, default=KNEE_TOLERANCE,
                        help="the knee: fewest lanes within this share of the best utilisation")
    parser.add_argument("--sweep-only", action="store_true", help="only the design-space sweep")
    parser.add_argument("--sweep-report-only", action="store_true",
                        help="measure nothing: tables, dse.json and dse.png of the sweep "
                             "records already in build/bench/dse/ (any code version) matching "
                             "the options")
    add_run_options(parser, "sweep's points")


def _ints(text: str, flag: str) -> list[int]:
    """The comma-separated ints of an option (``''``: none); ValueError naming it."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated ints") from None


def main(args: argparse.Namespace) -> int:
    """Run ``coda bench``: the design-space sweep (unless ``--sweep-lanes ''``), then (unless
    ``--sweep-only``) the DRAM replays and the cosimulation speed; returns 0, or 1 when
    ``--sweep-report-only`` finds no records."""
    # every option is checked before any build (ValueError: ``coda: error:``, exit 2)
    check_output_path(args.out, "--out")
    sweep_lanes = _ints(args.sweep_lanes, "--sweep-lanes")
    sweep_depths = _ints(args.sweep_depths, "--sweep-depths")
    sweep_clocks = parse_clocks(args.sweep_clocks)
    sweep_drams = [v.strip() for v in args.sweep_drams.split(",") if v.strip()]
    sweep_units = units_label(parse_units(args.sweep_units, "--sweep-units"))
    if not 0 < args.knee_tolerance <= 1:
        raise ValueError(f"--knee-tolerance {args.knee_tolerance}: expected 0 < t <= 1")
    from coda.hw.dram_standards import get_standard
    from coda.hw.nmp import check_nme_mhz
    # every clock must suit at least one standard (the fastest); faster than a slower
    # standard's DRAM clock: left out for that one (sweep says so)
    fastest = max((get_standard(s) for s in sweep_drams), key=lambda s: -s.tCK_ns,
                  default=None)
    if fastest is None:
        raise ValueError("--sweep-drams: expected at least one standard")
    for c in sweep_clocks:
        if c:
            check_nme_mhz(c, fastest)
    if sweep_lanes:
        sweep_json = args.out.with_name("dse.json")
        t0 = time.perf_counter()
        if args.sweep_report_only:
            rows = recorded_rows(sweep_json.with_suffix(""), sweep_lanes, sweep_depths,
                                 args.fmt, sweep_drams, args.sweep_stream_bytes, sweep_clocks,
                                 units=sweep_units)
            if not rows:
                print(f"no sweep records matching the options (units {sweep_units}) in "
                      f"{sweep_json.with_suffix('')}")
                return 1
            write_dse(sweep_json, rows, sweep_drams, args.fmt, sweep_clocks,
                      args.sweep_stream_bytes, args.knee_tolerance, units=sweep_units)
        else:
            rows = sweep(sweep_lanes, sweep_depths, args.fmt, sweep_drams,
                         args.sweep_stream_bytes, out=sweep_json, clocks=sweep_clocks,
                         workers=args.workers, sequential=args.sequential,
                         address=args.address, tolerance=args.knee_tolerance,
                         units=sweep_units)
        plot_sweep(rows, sweep_json.with_suffix(".png"))
        print_sweep(rows)
        print_knees(knees(rows, args.knee_tolerance), synth_areas(SYNTH_ROOT, args.fmt,
                                                                  sweep_units))
        print(f"sweep: {sweep_json}, {sweep_json.with_suffix('.png')} "
              f"({time.perf_counter() - t0:.0f} s)")
        if args.sweep_only or args.sweep_report_only:
            return 0
    if not args.skip_dram:
        bench_dram(out=args.out.with_name("dram.json"))
    cfg = NMEConfig(lanes=args.lanes, fmt=args.fmt, mem_words=args.mem_words, depth=args.depth)
    result = {} if args.skip_nme else measure(cfg)
    from coda.cosim.nmp_build import FLAG_SETS
    flag_sets = ([None] if args.nmp_flags is None else
                 list(FLAG_SETS) if args.nmp_flags == "all" else args.nmp_flags.split(","))
    # 256 KiB per stream (the 2 x 2 and NME-clock figures of docs/results.md)
    words = NMP_STREAM_BYTES // (2 * args.nmp_lanes)
    ncfg = NMEConfig(lanes=args.nmp_lanes, fmt=args.fmt, depth=args.nmp_depth,
                     mem_words=_mem_words(words))
    result["dimm_nmp"] = [measure_nmp(ncfg, args.nmp_dram, args.nmp_dimms, args.nmp_ranks, f,
                                      stream_words=words) for f in flag_sets]
    text = json_text(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0
