"""Cosimulation speed: build time, simulated NME cycles per second, per-job overhead.

``python -m coda.cosim.bench [--lanes 8] [--fmt bf16] [--mem-words 65536]`` (``make bench``)
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
of one DIMM-NMP rank, cycles per element and achieved bandwidth of the residual add and the
4-stream segment, written to ``build/bench/dse.json`` (+ ``dse.png``, and a table on stdout);
``--sweep-only`` stops there. Every point is its own Verilator build (cached under
``build/cosim/``), so the first sweep takes a while; the points run through the sweep engine
(:mod:`coda.sweep`): tasks on a local Ray (``--workers``, default all CPUs), on a cluster
(``--address``) or a plain loop (``--sequential``), records in ``build/bench/dse/`` (a
stopped sweep resumes; ``coda sweep bench`` runs the same points).

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
           "cfg": {"lanes": cfg.lanes, "depth": cfg.depth, "mem_words": cfg.mem_words},
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
SWEEP_DEPTHS = (16, 64, 256)
SWEEP_STREAM_BYTES = 256 << 10


def _mem_words(stream_words: int) -> int:
    """Rank memory (power of two, >= 1024 words) holding the 4 streams of segment4 (+1 word)."""
    return 1 << max(10, (4 * stream_words).bit_length())


def dse_point(params: dict, workdir: Path | None = None) -> dict:
    """One point of the design space: a 1 DIMM x 1 rank DIMM-NMP of ``params["dram"]`` with
    an NME of ``lanes`` lanes and ``depth`` words per stream block (``fmt``), running the
    residual add and the 4-stream segment of :func:`_segment_programs` over ``stream_bytes``
    bytes per stream. Returns, per program ``P`` in (residual_add, segment4): ``P.elements``,
    ``P.cycles`` (NME cycles = DRAM tCK), ``P.cycles_per_element``, ``P.elements_per_cycle``,
    ``P.utilisation`` (DRAM bytes moved / peak bytes of the cycles) and ``P.gbps`` (GB/s per
    rank); ``timing``: simulated cycles per wall second and the build's seconds.
    Raises ValueError for a size the NME cannot take."""
    n_lanes, depth = int(params["lanes"]), int(params["depth"])
    if n_lanes < 1 or depth < 1:
        raise ValueError(f"lanes={n_lanes}, depth={depth}: expected >= 1")
    words = int(params["stream_bytes"]) // (2 * n_lanes)
    if words < 1:
        raise ValueError(f"stream_bytes={params['stream_bytes']}: expected at least one NME "
                         f"word ({2 * n_lanes} bytes at {n_lanes} lanes)")
    cfg = NMEConfig(lanes=n_lanes, fmt=params["fmt"], depth=depth, mem_words=_mem_words(words))
    r = measure_nmp(cfg, params["dram"], 1, 1, stream_words=words)
    figures, timing = {}, {"build_seconds": r["build_seconds_recorded"]}
    for prog in PROGRAM_STREAMS:
        m = r[prog]
        figures.update({f"{prog}.elements": m["elements_per_rank"], f"{prog}.cycles": m["cycles"],
                        f"{prog}.cycles_per_element": m["cycles_per_element"],
                        f"{prog}.elements_per_cycle": round(1 / m["cycles_per_element"], 4),
                        f"{prog}.utilisation": m["ranks"][0]["utilisation"],
                        f"{prog}.gbps": m["ranks"][0]["gbps"]})
        timing[f"{prog}.sim_cycles_per_s"] = m["sim_cycles_per_s"]
    figures["timing"] = timing
    return figures


def sweep_kind():
    """The ``bench`` sweep kind (coda.sweep.SweepKind): the DIMM-NMP design space, one
    :func:`dse_point` per (lanes, depth, fmt, dram, stream_bytes)."""
    import coda.hw
    from coda.sweep import Param, SweepKind, sources_digest
    return SweepKind(
        name="bench", run=dse_point,
        version=sources_digest(Path(__file__).parent, Path(coda.hw.__file__).parent),
        description="DIMM-NMP design space: lanes x buffer depth of one rank (make bench)",
        params=(Param("lanes", int, 8), Param("depth", int, 256), Param("fmt", str, "bf16"),
                Param("dram", str, "DDR5-4800"), Param("stream_bytes", int, SWEEP_STREAM_BYTES)),
        headline=("residual_add.cycles_per_element", "residual_add.utilisation",
                  "segment4.cycles_per_element", "segment4.utilisation", "segment4.gbps"))


def dse_rows(records: list[dict]) -> list[dict]:
    """The finished sweep records of :func:`sweep_kind` as the rows of ``dse.json``: one per
    (lanes, depth, program) with ``lanes, depth, program, elements, cycles,
    cycles_per_element, elements_per_cycle, utilisation, gbps, sim_cycles_per_s,
    build_seconds``."""
    rows = []
    for rec in records:
        if rec["status"] != "ok":
            continue
        f, t = rec["figures"], rec.get("timing") or {}
        for prog in PROGRAM_STREAMS:
            rows.append({"lanes": rec["params"]["lanes"], "depth": rec["params"]["depth"],
                         "program": prog,
                         **{k: f[f"{prog}.{k}"] for k in ("elements", "cycles",
                                                          "cycles_per_element",
                                                          "elements_per_cycle",
                                                          "utilisation", "gbps")},
                         "sim_cycles_per_s": t.get(f"{prog}.sim_cycles_per_s"),
                         "build_seconds": t.get("build_seconds")})
    return rows


def sweep(lanes=SWEEP_LANES, depths=SWEEP_DEPTHS, fmt: str = "bf16", dram: str = "DDR5-4800",
          stream_bytes: int = SWEEP_STREAM_BYTES, out: Path | None = None, *,
          workers: int | None = None, sequential: bool = False,
          address: str | None = None) -> list[dict]:
    """Design-space exploration of one rank: NME lanes x buffer depth (words per stream block).

    Every (lanes, depth) point is a :func:`dse_point` run by :func:`coda.sweep.run_sweep`:
    a task on Ray (local, ``workers`` CPUs, or the cluster at ``address``) or, with
    ``sequential``, a loop in this process; each point builds (or reuses) its own Verilator
    model under ``build/cosim/``. One rank suffices: the ranks of a DIMM-NMP run the same
    program in lockstep, each on its own DRAM, so per-rank cycles and bandwidth are those of
    the whole system (measured: the 2 x 2 system at lanes 8 / depth 256 gives exactly the
    cycles and utilisation of the 1 x 1 row, 88.15 % / 88.42 %).

    Returns the rows of :func:`dse_rows`. Point records go to ``<out without .json>/`` (the
    engine's ``results.jsonl``: a stopped sweep resumes where it was); the rows to ``out``
    (JSON) when given.
    """
    from coda.sweep import run_sweep

    kind = sweep_kind()
    points = [kind.full({"lanes": n, "depth": d, "fmt": fmt, "dram": dram,
                         "stream_bytes": stream_bytes}) for n in lanes for d in depths]
    folder = (out.with_suffix("") if out else Path("build/bench/dse"))
    rows = dse_rows(run_sweep(kind, points, folder, workers=workers, sequential=sequential,
                              address=address))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"dram": dram, "fmt": fmt, "stream_bytes": stream_bytes,
                                   "rows": rows}, indent=1) + "\n")
    return rows


def print_sweep(rows: list[dict]) -> None:
    """The sweep as a rich table: one line per (lanes, depth), both programs side by side."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="DIMM-NMP design space (per rank)")
    for col in ("lanes", "depth", "add cyc/elem", "add util", "add GB/s",
                "seg4 cyc/elem", "seg4 util", "seg4 GB/s"):
        t.add_column(col, justify="right")
    by = {(r["lanes"], r["depth"], r["program"]): r for r in rows}
    for lanes, depth in sorted({(r["lanes"], r["depth"]) for r in rows}):
        cells = [str(lanes), str(depth)]
        for prog in ("residual_add", "segment4"):
            r = by.get((lanes, depth, prog))
            cells += ([f"{r['cycles_per_element']:.3f}", f"{100 * r['utilisation']:.1f} %",
                       f"{r['gbps']:.2f}"] if r else ["-"] * 3)
        t.add_row(*cells)
    Console().print(t)


def plot_sweep(rows: list[dict], path: Path, dram: str = "DDR5-4800") -> None:
    """Elements per cycle and DRAM utilisation against lanes, one line per depth (PNG), with
    the two ceilings: the NME memory port (one word of ``lanes`` elements per cycle, shared
    by the program's streams) and the rank's DRAM peak (2 bytes per element per stream)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from coda.hw.dram_standards import get_standard

    std = get_standard(dram)
    peak = std.burst_bytes / std.nBL   # bytes per cycle of one rank
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for col, prog in enumerate(("residual_add", "segment4")):
        for depth in sorted({r["depth"] for r in rows}):
            pts = sorted((r["lanes"], r) for r in rows if r["depth"] == depth and r["program"] == prog)
            if not pts:
                continue
            x = [p[0] for p in pts]
            axes[0, col].plot(x, [p[1]["elements_per_cycle"] for p in pts], "o-", label=f"depth {depth}")
            axes[1, col].plot(x, [100 * p[1]["utilisation"] for p in pts], "o-", label=f"depth {depth}")
        xs = sorted({r["lanes"] for r in rows})
        streams = PROGRAM_STREAMS[prog]
        axes[0, col].plot(xs, [x / streams for x in xs], "k:",
                          label=f"NME port bound (lanes / {streams} streams)")
        axes[0, col].axhline(peak / (2 * streams), color="r", linestyle="--",
                             label=f"DRAM peak / ({streams} x 2 B)")
        axes[0, col].set_title(prog)
        axes[0, col].set_ylabel("elements / cycle / rank")
        axes[1, col].set_ylabel(f"{dram} utilisation (%)")
        axes[1, col].set_xlabel("NME lanes")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        axes[0, col].set_yscale("log", base=2)
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
        out.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="coda.cosim.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--fmt", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--mem-words", type=int, default=1 << 16)
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("build/bench/cosim.json"))
    ap.add_argument("--nmp-dimms", type=int, default=2)
    ap.add_argument("--nmp-ranks", type=int, default=2)
    ap.add_argument("--nmp-dram", default="DDR5-4800")
    ap.add_argument("--nmp-lanes", type=int, default=8,
                    help="NME lanes of the DIMM-NMP (8: 16 B per NME cycle, twice DDR5's 8 B/tCK)")
    ap.add_argument("--nmp-depth", type=int, default=256,
                    help="NME buffer depth in words of the DIMM-NMP (words per stream block)")
    ap.add_argument("--nmp-flags", default=None,
                    help="comma-separated FLAG_SETS keys to compare, or 'all' (default: the "
                         "backend's default set only)")
    ap.add_argument("--skip-nme", action="store_true", help="only the DIMM-NMP figures")
    ap.add_argument("--skip-dram", action="store_true",
                    help="leave out the DRAM controller replays (build/bench/dram.json)")
    ap.add_argument("--sweep-lanes", default=",".join(map(str, SWEEP_LANES)),
                    help="lanes of the design-space sweep ('' = no sweep)")
    ap.add_argument("--sweep-depths", default=",".join(map(str, SWEEP_DEPTHS)))
    ap.add_argument("--sweep-only", action="store_true", help="only the lanes x depth sweep")
    add_run_options(ap, "sweep's points")
    args = ap.parse_args(argv)
    sweep_lanes = [int(v) for v in args.sweep_lanes.split(",") if v]
    sweep_depths = [int(v) for v in args.sweep_depths.split(",") if v]
    if sweep_lanes:
        sweep_json = args.out.with_name("dse.json")
        rows = sweep(sweep_lanes, sweep_depths, args.fmt, args.nmp_dram, out=sweep_json,
                     workers=args.workers, sequential=args.sequential, address=args.address)
        plot_sweep(rows, sweep_json.with_suffix(".png"), args.nmp_dram)
        print_sweep(rows)
        print(f"sweep: {sweep_json}, {sweep_json.with_suffix('.png')}")
        if args.sweep_only:
            return 0
    if not args.skip_dram:
        bench_dram(out=args.out.with_name("dram.json"))
    cfg = NMEConfig(lanes=args.lanes, fmt=args.fmt, mem_words=args.mem_words, depth=args.depth)
    result = {} if args.skip_nme else measure(cfg)
    from coda.cosim.nmp_build import FLAG_SETS
    flag_sets = ([None] if args.nmp_flags is None else
                 list(FLAG_SETS) if args.nmp_flags == "all" else args.nmp_flags.split(","))
    # the sweep's stream size (256 KiB per stream), so the 2 x 2 figures compare with its rows
    words = SWEEP_STREAM_BYTES // (2 * args.nmp_lanes)
    ncfg = NMEConfig(lanes=args.nmp_lanes, fmt=args.fmt, depth=args.nmp_depth,
                     mem_words=_mem_words(words))
    result["dimm_nmp"] = [measure_nmp(ncfg, args.nmp_dram, args.nmp_dimms, args.nmp_ranks, f,
                                      stream_words=words) for f in flag_sets]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
