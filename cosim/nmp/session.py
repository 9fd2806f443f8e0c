"""One DIMM-NMP simulator process and what a job sends it.

:class:`NMPSession` starts the Verilated system with the cocotb job server
(:mod:`coda.cosim.nmp.server`) and talks to it over a socket (the transport of
:class:`coda.cosim.nme.rtl_backend.SimSession`); the ranks' DRAM devices keep their bursts in rank
memories the host maps too (:mod:`coda.cosim.shared_mem`, files named by
:func:`rank_memory_path`); :func:`command_stream` turns one program per rank into the
rank-masked command words of one job (micro-ops broadcast once to the ranks that run them),
and :func:`job_cycle_limit` bounds a job's simulated cycles.
"""

from __future__ import annotations

from pathlib import Path

from coda.cosim.nmp.build import TOP_NAME, NMPBuild, clock_plusargs
from coda.cosim.nme.rtl_backend import SimSession
from coda.cosim.shared_mem import SharedMemory
from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.hw.nme.isa import NMEConfig, Program

__all__ = ["NMPSession", "command_stream", "job_cycle_limit", "rank_memory_path", "SERVER_MODULE"]

#: the cocotb test module the simulator runs: the job server
SERVER_MODULE = "coda.cosim.nmp.server"


def rank_memory_path(prefix: str | Path, rank: int) -> Path:
    """The file of rank ``rank``'s memory: ``prefix`` with ``.<rank>`` appended (the name
    ``cosim/nmp/nmp_top.sv``'s device ``rank`` maps, given ``+MEM_SHM=prefix``)."""
    prefix = Path(prefix)
    return prefix.with_name(f"{prefix.name}.{int(rank)}")


class NMPSession(SimSession):
    """One simulator process of a DIMM-NMP build (transport of :class:`SimSession`).

    Args:
        build: the built system; workdir: folder for files and ``sim.log``.
        memory_prefix, memories: the ranks' memories, ``memories[k]`` in the file
            :func:`rank_memory_path` ``(memory_prefix, k)`` with the build's NME geometry and
            a burst map (kept by the caller, which creates them before the simulator starts).
        commands: path prefix of the DRAM command logs (``+dram_cmds``), or None for no log.
        nme_mhz: NME clock in MHz, required by (and only by) a build with ``nme_clock``; the
            DRAM clock is always the standard's tCK.
    Raises:
        ValueError: ``nme_mhz`` given to a same-domain build or missing for an
            ``nme_clock`` build; memories not one per rank, not at their files' names, or of
            another geometry than the build's, or without a burst map.
    """

    def __init__(self, build: NMPBuild, workdir: Path, *, memory_prefix: str | Path,
                 memories: list[SharedMemory], commands: Path | None = None,
                 nme_mhz: float | None = None,
                 start_timeout_s: float = 180.0, job_timeout_s: float = 1800.0):
        if build.nme_clock != (nme_mhz is not None):
            kind = "with" if build.nme_clock else "without"
            raise ValueError(f"nme_mhz={nme_mhz}: a build {kind} its own NME clock needs "
                             f"{'an' if build.nme_clock else 'no'} NME frequency")
        n = build.dimms * build.ranks
        if len(memories) != n:
            raise ValueError(f"{len(memories)} rank memories: the build has {n} ranks")
        for k, mem in enumerate(memories):
            want = rank_memory_path(memory_prefix, k)
            if (Path(mem.path) != want or (mem.words, mem.lanes) != (build.cfg.mem_words,
                                                                    build.cfg.lanes)
                    or not mem.burst_words):
                raise ValueError(f"rank memory {k}: {mem.path}, {mem.words} x {mem.lanes}, "
                                 f"burst map of {mem.burst_words} words per burst; expected "
                                 f"{want}, {build.cfg.mem_words} x {build.cfg.lanes} with one")
        self._prepare(build, workdir, job_timeout_s)
        self.memories = list(memories)
        w = self.workdir
        cmd = [str(build.binary), f"+MEM_SHM={Path(memory_prefix).resolve()}",
               f"+CMD_IN={w / 'cmd_in.hex'}", f"+RES_OUT={w / 'res_out.txt'}"]
        cmd += clock_plusargs(get_standard(build.std), nme_mhz)
        if commands is not None:
            cmd.append(f"+dram_cmds={Path(commands).resolve()}")
        self._start(SERVER_MODULE, {"COCOTB_TOPLEVEL": TOP_NAME}, cmd, start_timeout_s)


def command_stream(programs: list[Program | None]) -> list[tuple[int, int]]:
    """``[(rank mask, 64-bit word), ...]`` running ``programs[k]`` on rank ``k`` (None: rank
    ``k`` idles).

    Ranks whose micro-ops are equal form one group: one header per rank (or one broadcast
    header when their ``n_elems`` are equal too), then the micro-ops broadcast to the group.
    Raises ValueError for no programs.
    """
    if not any(p is not None for p in programs):
        raise ValueError("no programs: expected one per rank")
    groups: dict[tuple, list[int]] = {}
    for k, p in enumerate(programs):
        if p is not None:
            groups.setdefault(tuple(p.uops), []).append(k)
    out = []
    for uops, members in groups.items():
        words = {k: programs[k].words() for k in members}
        mask = sum(1 << k for k in members)
        if len({words[k][0] for k in members}) == 1:
            out.append((mask, words[members[0]][0]))
        else:
            out += [(1 << k, words[k][0]) for k in members]
        out += [(mask, w) for w in words[members[0]][1:]]
    return out


def job_cycle_limit(programs: list[Program], cfg: NMEConfig, std: DRAMStandard) -> int:
    """Watchdog (NME cycles): 64 cycles per word and pass (a row miss every access, refresh;
    counted in NME cycles, which are no shorter than DRAM cycles) plus 10^6 of slack."""
    work = max((len(p.uops) + 2) * -(-p.n_elems // cfg.lanes) for p in programs
               if p is not None)
    return min(64 * work + 1_000_000, (1 << 32) - 1)
