"""Speed and DRAM bandwidth of a whole DIMM-NMP cosimulation on long programs.

:func:`measure_nmp` (default 2 DIMMs x 2 ranks of DDR5-4800 through
:class:`~coda.cosim.nmp.backend.NMPRTLBackend`): simulated cycles (one cycle = one DRAM tCK =
one NME cycle) per wall second of a long residual add and of a 4-stream segment on every rank in
lockstep (``sim_cycles_per_s``: system cycles per wall second of the simulator's own run;
``rank_cycles_per_s``: the same times the number of ranks, i.e. NME cycles summed over the
system's NMEs), and the DRAM bandwidth utilisation each achieves, per rank:
``bytes moved by RD/WR / (cycles * burst_bytes / nBL)`` (the rank's peak bytes per cycle).
Every rank's DRAM command log is checked by :mod:`coda.cosim.dram.check`. The NME depth is
:data:`coda.hw.nmp.NMP_DEPTH` (why: docs/results.md, "DRAM utilisation of segment programs").

``coda bench`` reports it for the 2 x 2 system (:mod:`coda.experiments.bench`); every point of the
design-space sweep is one 1 x 1 run (:func:`coda.experiments.design_space.dse_point`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, UOp
from coda.hw.dram.standards import DEFAULT_STANDARD

__all__ = ["PROGRAM_STREAMS", "segment_programs", "mem_words", "measure_nmp"]

#: DRAM streams of each program of :func:`segment_programs`
PROGRAM_STREAMS = {"residual_add": 3, "segment4": 4}


def segment_programs(cfg: NMEConfig, words: int) -> dict[str, Program]:
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


def mem_words(stream_words: int) -> int:
    """Rank memory (power of two, >= 1024 words) holding the 4 streams of segment4 (+1 word)."""
    return 1 << max(10, (4 * stream_words).bit_length())


def measure_nmp(cfg: NMEConfig, dram: str = DEFAULT_STANDARD, dimms: int = 2, ranks: int = 2,
                flags: str | None = None, stream_words: int | None = None,
                nme_mhz: float | None = None) -> dict:
    """Speed and bandwidth of a ``dimms x ranks`` DIMM-NMP on long programs (the figures of the
    module docstring).

    Args:
        stream_words: NME words per stream of each program (default: a quarter of the rank's
            ``cfg.mem_words``, minus one); ``4 * stream_words + 1 <= cfg.mem_words``.
        nme_mhz: the NMEs on their own clock of that many MHz (:mod:`coda.hw.nmp`); default
            None: on the DRAM clock.
    Returns a dict with the build time and, per program: cycles (NME cycles to the combined
    done), dram_cycles and ns of the same interval, wall seconds of the job (simulation and
    its command and result files; the images are shared), cycles per second, and per-rank
    DRAM utilisation, row hits/misses/conflicts and refreshes; and
    ``dram_commands`` / ``violations``: the DRAM commands every rank issued and the
    violations :mod:`coda.cosim.dram.check` finds in their logs.
    Raises AssertionError if the checker finds a violation.
    """
    import tempfile

    from coda.cosim.nmp.backend import NMPRTLBackend
    from coda.cosim.nmp.build import DEFAULT_FLAGS, build_nmp_sim
    from coda.hw.dram.standards import get_standard

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
        for name, prog in segment_programs(cfg, words).items():
            mems, out[name] = _run_program(be, cfg, prog, mems, std)
    # the logs are complete once the simulator has ended (the with block closed it)
    out["dram_commands"], violations = _check_command_logs(std, logs)
    out["violations"] = len(violations)
    assert not violations, "\n".join(map(str, violations[:20]))
    return out


def _run_program(be, cfg: NMEConfig, prog: Program, mems: list, std) -> tuple[list, dict]:
    """Run ``prog`` on every rank's image ``mems`` in lockstep on the open DIMM-NMP backend
    ``be``; returns the ranks' new images and the program's figures of :func:`measure_nmp`
    (the DRAM statistics of this job: the backend's counters after it less those before)."""
    before = be.last.stats
    t0 = time.perf_counter()
    res = be.execute_many(cfg, [(prog, m) for m in mems])
    wall = time.perf_counter() - t0
    last = be.last
    per_rank = []
    for b, a in zip(before, last.stats):
        d = {k: a[k] - b[k] for k in a}
        moved = (d["reads"] + d["writes"]) * std.burst_bytes
        per_rank.append({
            "utilisation": round(moved / (last.dram_cycles * std.burst_bytes / std.nBL), 4),
            "gbps": round(moved / last.ns, 2),
            "row_hits": d["row_hits"], "row_misses": d["row_misses"],
            "row_conflicts": d["row_conflicts"], "refreshes": d["refreshes"]})
    n = len(mems)
    return [r.mem for r in res], {
        "elements_per_rank": prog.n_elems, "cycles": last.cycles,
        "dram_cycles": last.dram_cycles, "ns": round(last.ns, 1),
        "nme_mhz": round(last.nme_mhz, 3),
        "seconds": round(wall, 3),
        "cycles_per_s": round(last.cycles / wall),
        # the simulator's own run (feed, program, drain, results) only
        "sim_wall_s": round(last.extra["sim_wall_s"], 3),
        "sim_cycles_per_s": round(last.cycles / last.extra["sim_wall_s"]),
        # the same run counted per NME: n ranks each run that many cycles
        "rank_cycles_per_s": round(n * last.cycles / last.extra["sim_wall_s"]),
        "cycles_per_element": round(last.cycles / prog.n_elems, 3),
        "min_utilisation": min(r["utilisation"] for r in per_rank),
        "ranks": per_rank}


def _check_command_logs(std, logs: Path) -> tuple[int, list]:
    """The DRAM commands in the ranks' logs ``logs/cmds.csv*`` and the violations
    :mod:`coda.cosim.dram.check` finds in them; removes the logs and their folder."""
    from coda.cosim.dram import check as dram_check

    violations, commands = [], 0
    for path in sorted(logs.glob("cmds.csv*")):
        commands += sum(1 for _ in path.open()) - 1
        violations += dram_check.check_file(std, path)
        path.unlink()
    logs.rmdir()
    return commands, violations
