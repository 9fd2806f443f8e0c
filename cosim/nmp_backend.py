"""The ``rtl`` backend of a whole DIMM-NMP: ranks with their DRAM timing, Verilated, in lockstep.

:class:`NMPRTLBackend` implements :class:`coda.host.nme.backend.Backend` for
:class:`coda.host.nmp.driver.NMPDriver`: ``execute_many(cfg, jobs)`` puts job ``k`` on rank ``k``
of a ``dimms x ranks`` system (:class:`coda.hw.nmp.DIMMNMP`, one JEDEC-timed DRAM controller and
one ``coda_dram_device`` per rank, ``cosim/nmp_top.sv``) and runs all ranks' programs in one
simulator job: per-rank header words (each rank its own ``n_elems``), then the micro-ops
broadcast once (rank-select mask), so the ranks start in the same cycle. Jobs whose micro-ops
differ are sent as separate broadcast groups in the same job. More jobs than ranks run in
batches of ``dimms * ranks``.

Memory images travel in bulk: a rank's image (uint16 ``[mem_words, lanes]``) is regrouped into
DRAM bursts placed at their device indexes (:mod:`coda.cosim.nmp_image`) and ``$readmemh``-ed
into the device; only bursts that differ from what the device holds are loaded, and only bursts
the ranks wrote come back. One simulator process per system
(:class:`coda.cosim.nmp_session.NMPSession`, running the cocotb job server
:mod:`coda.cosim.nmp_server`) stays up; between jobs no simulated time passes. The build is
:func:`coda.cosim.nmp_build.build_nmp_sim`.

Clocks: by default (``nme_mhz=None``) the NMEs run on the DRAM command clock, one NME cycle =
one tCK. With ``nme_mhz=F`` the system is built with the NMEs on their own clock behind
asynchronous FIFOs (:mod:`coda.hw.nmp`) and the simulator drives an NME clock of F MHz next to
the DRAM clock (one build serves every F). ``ExecResult.cycles`` of rank ``k`` counts NME
cycles from the first command word presented to that rank's done; :attr:`NMPRTLBackend.last`
has the whole job: ``cycles`` (NME) and ``dram_cycles`` of the same interval, ``ns`` =
``cycles`` NME periods, the combined done and the controller counters.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coda.cosim import memfile
from coda.cosim.build import CosimRunError, log_tail
from coda.cosim.nmp_build import (CMD_DEPTH, DEFAULT_FLAGS, FLAG_SETS, MAX_COSIM_RANKS,
                                  build_nmp_sim)
from coda.cosim.nmp_image import burst_index_map, to_bursts, words_per_burst, write_bursts
from coda.cosim.nmp_session import NMPSession, command_stream, cycle_limit
from coda.cosim.rtl_backend import SessionOwner
from coda.hw.dram.controller import STAT_NAMES
from coda.hw.dram.standards import get_standard
from coda.hw.nme.executor import ExecResult
from coda.hw.nme.isa import NMEConfig, Program, Status
from coda.hw.nmp import check_nme_mhz, check_shape
from coda.hw.dram.standards import DEFAULT_STANDARD

__all__ = ["NMPRTLBackend", "JobReport"]


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFF_FFFF))[0]


@dataclass
class JobReport:
    """One simulator job: combined ``cycles`` (NME clock cycles from the first command word to
    the combined done), ``error``, per-rank ``rank_cycles`` (NME cycles), ``status`` and
    controller counters ``stats[k][name]`` (cumulative since the simulator started),
    ``seconds`` of wall time; ``dram_cycles``: DRAM command-clock cycles of the same interval
    (= ``cycles`` with the NME on the DRAM clock); ``ns``: that interval in nanoseconds
    (``cycles`` x the NME period); ``nme_mhz``: the NME clock (MHz, the DRAM clock's when
    the NMEs share it)."""
    cycles: int
    error: bool
    rank_cycles: list[int]
    status: list[int]
    stats: list[dict]
    seconds: float
    n_commands: int = 0
    extra: dict = field(default_factory=dict)
    dram_cycles: int = 0
    ns: float = 0.0
    nme_mhz: float = 0.0

    def dram_utilisation(self, before: list[dict], std) -> list[float]:
        """Per rank: bytes read and written since the counters ``before`` (an earlier
        ``stats``) over the peak bytes of ``dram_cycles`` (burst_bytes per nBL tCK)."""
        return [(a["reads"] - b["reads"] + a["writes"] - b["writes"]) * std.nBL
                / max(1, self.dram_cycles) for a, b in zip(self.stats, before)]


class NMPRTLBackend(SessionOwner):
    """Backend running the ranks' programs on a Verilated DIMM-NMP with DRAM timing.

    Args:
        dram: DRAM preset name (``coda.hw.dram.standards.STANDARDS``).
        dimms, ranks: system shape (>= 1 each); ``execute_many`` maps job k to rank k.
        flags: Verilator option set (:data:`FLAG_SETS`).
        clock_gating: gated lane clocks in the ranks' NMEs (the default; same results and
            cycles, a faster model).
        commands: path prefix for the DRAM command logs (CSV per rank, see
            ``coda_dram_device``), written when the simulator ends (:meth:`close`); None: no log.
        keep_logs: keep the simulator work folder after :meth:`close` (``logs-<pid>-<hex>``
            beside the build, never removed by coda).
        nme_mhz: NME clock in MHz (:func:`coda.hw.nmp.check_nme_mhz`: 1 .. the DRAM command
            clock, 2400 for DDR5-4800), the NMEs then on their own clock behind AsyncFIFOs;
            None (default): the NMEs on the DRAM clock, no crossing.
    Raises:
        ValueError: bad preset, flags or ``nme_mhz``, or a shape outside
            1..:data:`MAX_COSIM_RANKS` ranks.
    """
    name = "rtl-nmp"

    def __init__(self, dram: str = DEFAULT_STANDARD, dimms: int = 1, ranks: int = 2, *,
                 flags: str = DEFAULT_FLAGS, clock_gating: bool = True,
                 commands: str | Path | None = None, keep_logs: bool = False,
                 job_timeout_s: float = 1800.0, nme_mhz: float | None = None):
        self.std = get_standard(dram)
        self.nme_mhz = check_nme_mhz(nme_mhz, self.std)
        check_shape(dimms, ranks, MAX_COSIM_RANKS)
        if flags not in FLAG_SETS:
            raise ValueError(f"flags={flags!r}: expected one of {', '.join(FLAG_SETS)}")
        self.dimms, self.ranks, self.n = int(dimms), int(ranks), int(dimms) * int(ranks)
        self.flags = flags
        self.clock_gating = bool(clock_gating)
        self.commands = None if commands is None else Path(commands)
        self.keep_logs = keep_logs
        self.job_timeout_s = job_timeout_s
        self.sessions: dict[NMEConfig, NMPSession] = {}
        self._shadow: dict[NMEConfig, list] = {}
        self.last: JobReport | None = None
        # cycles: NME cycles of the jobs; dram_cycles, ns: the same intervals in DRAM cycles
        # and nanoseconds
        self.stats = {"jobs": 0, "programs": 0, "cycles": 0, "dram_cycles": 0, "ns": 0.0,
                      "seconds": 0.0, "start_seconds": 0.0}
        self._track()

    def session(self, cfg: NMEConfig) -> NMPSession:
        """The simulator of ``cfg`` on this system, built and started on first use."""
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg of type {type(cfg).__name__}: expected NMEConfig")
        sess = self.sessions.get(cfg)
        if sess is None or sess.proc.poll() is not None:
            t0 = time.perf_counter()
            build = build_nmp_sim(cfg, self.std, self.dimms, self.ranks, flags=self.flags,
                                  clock_gating=self.clock_gating,
                                  nme_clock=self.nme_mhz is not None)
            workdir = self._workdir(build.path)
            sess = NMPSession(build, workdir, commands=self.commands, nme_mhz=self.nme_mhz,
                              job_timeout_s=self.job_timeout_s)
            self.sessions[cfg] = sess
            self._shadow[cfg] = [None] * self.n
            self.stats["start_seconds"] += time.perf_counter() - t0
        return sess

    # ------------------------------------------------------------------ Backend protocol
    def execute(self, cfg: NMEConfig, program: Program, mem: np.ndarray):
        """One program on rank 0 (the other ranks idle). Returns an ExecResult."""
        return self.execute_many(cfg, [(program, mem)])[0]

    def execute_many(self, cfg: NMEConfig, jobs: list[tuple[Program, np.ndarray]], *,
                     inplace: bool = False) -> list:
        """Run job ``k`` on rank ``k`` (batches of ``dimms*ranks`` jobs), all ranks of a batch
        in lockstep; returns one :class:`coda.host.nme.backend.ExecResult` per job, in order
        (``inplace`` is ignored: the images stay as given, the results are the ranks' memories).

        Raises:
            TypeError / ValueError: malformed images or programs.
            CosimBuildError / CosimRunError: the simulator could not be built / failed.
        """
        out = []
        for start in range(0, len(jobs), self.n):
            out += self._run_batch(cfg, jobs[start:start + self.n])
        return out

    def _run_batch(self, cfg, jobs):

        std = self.std
        wpb = words_per_burst(cfg, std)
        idx, inv = burst_index_map(cfg, std.name)
        images = [memfile.check_image(m, cfg.mem_words, cfg.lanes) for _, m in jobs]
        programs = [p for p, _ in jobs]
        stream = command_stream(programs)
        if len(stream) > CMD_DEPTH:
            raise ValueError(f"{len(stream)} command words: the cosimulation top holds "
                             f"{CMD_DEPTH}")
        sess = self.session(cfg)
        shadow = self._shadow[cfg]
        t0 = time.perf_counter()
        load_mask = 0
        for k, mem in enumerate(images):
            bursts = to_bursts(mem, wpb)
            prev = shadow[k]
            if prev is None:
                changed = np.arange(bursts.shape[0])
            else:
                changed = memfile.changed_words(bursts, prev)
            if changed.size:
                load_mask |= 1 << k
                write_bursts(sess.workdir / f"mem_in.hex.{k}", bursts, changed, idx)
            shadow[k] = None
        (sess.workdir / "cmd_in.hex").write_text(
            "".join(f"{(mask << 64) | w:x}\n" for mask, w in stream))
        answer = sess.request({"op": "run", "load_mask": load_mask, "ncmd": len(stream),
                               "max_cycles": cycle_limit(programs, cfg, std)},
                              timeout_s=self.job_timeout_s)
        if answer["timeout"] or answer["cmd_left"]:
            raise CosimRunError(f"DIMM-NMP job did not finish (timeout {answer['timeout']}, "
                                f"{answer['cmd_left']} command words not taken):\n"
                                + log_tail(sess.log))
        rows = [line.split() for line in (sess.workdir / "res_out.txt").read_text().splitlines()]
        results, stats, statuses, rcycles = [], [], [], []
        for k, mem in enumerate(images):
            vals = [int(v) for v in rows[k]]
            status_raw, l1_bits, cyc, ndirty = vals[1:5]
            stats.append(dict(zip(STAT_NAMES, vals[5:5 + len(STAT_NAMES)])))
            bursts = to_bursts(mem, wpb).copy()
            if ndirty:
                didx, data = memfile.read_sparse(sess.workdir / f"mem_out.hex.{k}",
                                                 wpb * cfg.lanes)
                if didx.size != ndirty:
                    raise CosimRunError(f"rank {k}: dirty dump has {didx.size} bursts, "
                                        f"expected {ndirty}")
                b = inv[didx]
                if (b < 0).any():
                    raise CosimRunError(f"rank {k}: writes outside the NME memory at device "
                                        f"index {didx[b < 0][:4].tolist()}")
                bursts[b] = data
            shadow[k] = bursts
            new = bursts.reshape(-1, cfg.lanes)[:cfg.mem_words].copy()
            try:
                status = Status(status_raw)
            except ValueError:
                raise CosimRunError(f"rank {k}: undefined status {status_raw}") from None
            statuses.append(status_raw)
            rcycles.append(cyc)
            results.append(ExecResult(new, status, _f32(l1_bits), cyc))
        dt = time.perf_counter() - t0
        nme_mhz = self.nme_mhz or 1000.0 / std.tCK_ns
        self.last = JobReport(answer["cycles"], bool(answer["error"]), rcycles, statuses,
                              stats, dt, len(stream), {"sim_ns": answer.get("sim_ns", 0),
                                                     "sim_wall_s": answer.get("sim_wall_s", 0.0)},
                              dram_cycles=answer["dram_cycles"],
                              ns=answer["cycles"] * 1000.0 / nme_mhz, nme_mhz=nme_mhz)
        self.stats["jobs"] += 1
        self.stats["programs"] += len(jobs)
        self.stats["cycles"] += answer["cycles"]
        self.stats["dram_cycles"] += self.last.dram_cycles
        self.stats["ns"] += self.last.ns
        self.stats["seconds"] += dt
        return results

    def rank_stats(self, cfg: NMEConfig) -> list[dict]:
        """Controller counters of every rank of the last job (cumulative, see JobReport)."""
        return [] if self.last is None else self.last.stats

    def close(self) -> None:
        """Stop the simulators (this flushes the command logs); idempotent."""
        super().close()
        self._shadow.clear()
