"""One DIMM-NMP simulator process and what a job sends it.

:class:`NMPSession` starts the Verilated system with the cocotb job server
(:mod:`coda.cosim.nmp_server`) and talks to it over a socket (the transport of
:class:`coda.cosim.rtl_backend.SimSession`); :func:`command_stream` turns one program per rank
into the rank-masked command words of one job (micro-ops broadcast once to the ranks that run
them), and :func:`cycle_limit` bounds a job's simulated cycles.
"""

from __future__ import annotations

from pathlib import Path

from coda.cosim.nmp_build import TOP_NAME, NMPBuild, clock_plusargs
from coda.cosim.rtl_backend import SimSession
from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.hw.nme.isa import NMEConfig, Program

__all__ = ["NMPSession", "command_stream", "cycle_limit", "SERVER_MODULE"]

#: the cocotb test module the simulator runs: the job server
SERVER_MODULE = "coda.cosim.nmp_server"


class NMPSession(SimSession):
    """One simulator process of a DIMM-NMP build (transport of :class:`SimSession`).

    Args:
        build: the built system; workdir: folder for files and ``sim.log``.
        commands: path prefix of the DRAM command logs (``+dram_cmds``), or None for no log.
        nme_mhz: NME clock in MHz, required by (and only by) a build with ``nme_clock``; the
            DRAM clock is always the standard's tCK.
    Raises:
        ValueError: ``nme_mhz`` given to a same-domain build or missing for an
            ``nme_clock`` build.
    """

    def __init__(self, build: NMPBuild, workdir: Path, *, commands: Path | None = None,
                 nme_mhz: float | None = None,
                 start_timeout_s: float = 180.0, job_timeout_s: float = 1800.0):
        if build.nme_clock != (nme_mhz is not None):
            kind = "with" if build.nme_clock else "without"
            raise ValueError(f"nme_mhz={nme_mhz}: a build {kind} its own NME clock needs "
                             f"{'an' if build.nme_clock else 'no'} NME frequency")
        self._prepare(build, workdir, job_timeout_s)
        w = self.workdir
        cmd = [str(build.binary), f"+MEM_IN={w / 'mem_in.hex'}", f"+MEM_OUT={w / 'mem_out.hex'}",
               f"+CMD_IN={w / 'cmd_in.hex'}", f"+RES_OUT={w / 'res_out.txt'}"]
        cmd += clock_plusargs(get_standard(build.std), nme_mhz)
        if commands is not None:
            cmd.append(f"+dram_cmds={Path(commands).resolve()}")
        self._start(SERVER_MODULE, {"COCOTB_TOPLEVEL": TOP_NAME}, cmd, start_timeout_s)


def command_stream(programs: list[Program]) -> list[tuple[int, int]]:
    """``[(rank mask, 64-bit word), ...]`` running ``programs[k]`` on rank ``k``.

    Ranks whose micro-ops are equal form one group: one header per rank (or one broadcast
    header when their ``n_elems`` are equal too), then the micro-ops broadcast to the group.
    Raises ValueError for no programs.
    """
    if not programs:
        raise ValueError("no programs: expected one per rank")
    groups: dict[tuple, list[int]] = {}
    for k, p in enumerate(programs):
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


def cycle_limit(programs: list[Program], cfg: NMEConfig, std: DRAMStandard) -> int:
    """Watchdog (NME cycles): 64 cycles per word and pass (a row miss every access, refresh;
    counted in NME cycles, which are no shorter than DRAM cycles) plus 10^6 of slack."""
    work = max((len(p.uops) + 2) * -(-p.n_elems // cfg.lanes) for p in programs)
    return min(64 * work + 1_000_000, (1 << 32) - 1)
