"""The ``rtl`` backend of a whole DIMM-NMP: ranks with their DRAM timing, Verilated, in lockstep.

:class:`NMPRTLBackend` implements :class:`coda.host.nme.backend.Backend` for
:class:`coda.host.nmp.driver.NMPDriver`: ``execute_many(cfg, jobs)`` puts job ``k`` on rank ``k``
of a ``dimms x ranks`` system (:class:`coda.hw.nmp.DIMMNMP`, one JEDEC-timed DRAM controller and
one ``coda_dram_device`` per rank, ``cosim/nmp/nmp_top.sv``) and runs all ranks' programs in one
simulator job: per-rank header words (each rank its own ``n_elems``), then the micro-ops
broadcast once (rank-select mask), so the ranks start in the same cycle. Jobs whose micro-ops
differ are sent as separate broadcast groups in the same job. More jobs than ranks run in
batches of ``dimms * ranks``. Every rank's DRAM device keeps its bursts in a rank memory the
host maps too (:mod:`coda.cosim.shared_mem`), and the NMEs may run on their own clock
(``nme_mhz``); :class:`NMPRTLBackend` has both, :class:`JobReport` what a job reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coda.cosim import memfile
from coda.cosim.nme.build import CosimRunError, log_tail
from coda.cosim.nmp.build import (CMD_DEPTH, DEFAULT_FLAGS, FLAG_SETS, MAX_COSIM_RANKS,
                                  build_nmp_sim)
from coda.cosim.nmp.image import burst_index_map, words_per_burst
from coda.cosim.nmp.session import NMPSession, command_stream, job_cycle_limit, rank_memory_path
from coda.cosim.nme.rtl_backend import SessionOwner, f32_from_bits, sync_memory
from coda.cosim.shared_mem import SharedMemory, memory_path
from coda.hw.dram.controller import STAT_NAMES
from coda.hw.dram.standards import get_standard
from coda.hw.nme.executor import ExecResult
from coda.hw.nme.isa import NMEConfig, Program, Status
from coda.hw.nmp import check_nme_mhz, check_shape
from coda.hw.dram.standards import DEFAULT_STANDARD

__all__ = ["NMPRTLBackend", "JobReport"]


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

    Memory: every rank's DRAM device keeps its bursts in a rank memory the host maps too (the
    scheme of the ideal-memory backend, :mod:`coda.cosim.shared_mem`): the file holds the NME's
    image (uint16 ``[mem_words, lanes]``) and a burst map from the device's indexes to the
    image's bursts (:mod:`coda.cosim.nmp.image`). A caller that keeps its rank images in these
    memories (:meth:`NMPRTLBackend.rank_image`, as :class:`coda.host.nmp.driver.NMPDriver` does)
    moves nothing between jobs: what it writes is what the DRAM holds, what the ranks write is in
    its arrays when the job ends; a job on such an image runs on the image's rank. An image of
    the caller's own is compared with the memory of the rank it runs on and only the words that
    differ are copied in; its result is a copy of that memory after the job. One simulator
    process per system
    (:class:`coda.cosim.nmp.session.NMPSession`, running the cocotb job server
    :mod:`coda.cosim.nmp.server`) stays up; between jobs no simulated time passes. The build is
    :func:`coda.cosim.nmp.build.build_nmp_sim`.

    Clocks: by default (``nme_mhz=None``) the NMEs run on the DRAM command clock, one NME cycle =
    one tCK. With ``nme_mhz=F`` the system is built with the NMEs on their own clock behind
    asynchronous FIFOs (:mod:`coda.hw.nmp`) and the simulator drives an NME clock of F MHz next to
    the DRAM clock (one build serves every F). ``ExecResult.cycles`` of rank ``k`` counts NME
    cycles from the first command word presented to that rank's done; :attr:`NMPRTLBackend.last`
    has the whole job: ``cycles`` (NME) and ``dram_cycles`` of the same interval, ``ns`` =
    ``cycles`` NME periods, the combined done and the controller counters.

    Args:
        dram: DRAM preset name (``coda.hw.dram.standards.STANDARDS``).
        dimms, ranks: system shape (>= 1 each); ``execute_many`` maps job k to rank k, or a
            job on a :meth:`rank_image` to that image's rank.
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

    ``stats``: ``jobs``, ``programs``, ``cycles`` (NME cycles of each job to the combined
    done, summed over jobs), ``rank_cycles`` (each job's NME cycles summed over its ranks,
    counted as :class:`coda.cosim.nme.rtl_backend.RTLBackend` counts its ``cycles``: one NME
    cycle per rank), ``dram_cycles`` and ``ns`` (the jobs' intervals in DRAM cycles and
    nanoseconds), ``seconds`` (wall time from each launch to its collection, less simulator
    starts), ``sim_seconds`` (the simulator's own run of the jobs), ``start_seconds``.
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
        # per NME configuration: the file prefix and the ranks' memories (created with the
        # first session or rank image, kept across simulator restarts until close())
        self._memories: dict[NMEConfig, tuple[Path, list[SharedMemory]]] = {}
        self._handed: dict[NMEConfig, set[int]] = {}     # ranks whose rank_image was taken
        self._pending = False
        self.last: JobReport | None = None
        self.stats = {"jobs": 0, "programs": 0, "cycles": 0, "rank_cycles": 0,
                      "dram_cycles": 0, "ns": 0.0, "seconds": 0.0, "sim_seconds": 0.0,
                      "start_seconds": 0.0}
        self._track()

    def _rank_memories(self, cfg: NMEConfig) -> tuple[Path, list[SharedMemory]]:
        """(file prefix, the ranks' memories) of ``cfg``: zeroed, with the burst map of
        ``cfg`` on this standard, created on first use."""
        found = self._memories.get(cfg)
        if found is None:
            wpb = words_per_burst(cfg, self.std)
            _, inv = burst_index_map(cfg, self.std.name)
            prefix = memory_path()
            found = (prefix, [SharedMemory.create(rank_memory_path(prefix, k), cfg.lanes,
                                                  cfg.mem_words, burst_map=inv, burst_words=wpb)
                              for k in range(self.n)])
            self._memories[cfg] = found
        return found

    def rank_image(self, cfg: NMEConfig, rank: int) -> np.ndarray:
        """The memory of rank ``rank`` (0 .. dimms*ranks-1) for ``cfg``: uint16
        ``[cfg.mem_words, cfg.lanes]``, zeroed when first asked for, the bursts its DRAM
        device reads and writes. A job on it runs on rank ``rank`` and moves no words; the
        same array on every call until :meth:`close`. Raises TypeError / ValueError for a
        bad ``cfg`` / ``rank``."""
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg of type {type(cfg).__name__}: expected NMEConfig")
        if not isinstance(rank, int) or not 0 <= rank < self.n:
            raise ValueError(f"rank={rank!r}: expected an int 0..{self.n - 1} (the system's "
                             "ranks)")
        self._handed.setdefault(cfg, set()).add(rank)
        return self._rank_memories(cfg)[1][rank].mem

    def session(self, cfg: NMEConfig) -> NMPSession:
        """The simulator of ``cfg`` on this system, built and started on first use (or
        again after it died; the rank memories keep their contents)."""
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg of type {type(cfg).__name__}: expected NMEConfig")
        sess = self.sessions.get(cfg)
        if sess is None or sess.proc.poll() is not None:
            t0 = time.perf_counter()
            build = build_nmp_sim(cfg, self.std, self.dimms, self.ranks, flags=self.flags,
                                  clock_gating=self.clock_gating,
                                  nme_clock=self.nme_mhz is not None)
            workdir = self._workdir(build.path)
            if sess is not None:
                sess.close()
            prefix, memories = self._rank_memories(cfg)
            sess = NMPSession(build, workdir, memory_prefix=prefix, memories=memories,
                              commands=self.commands, nme_mhz=self.nme_mhz,
                              job_timeout_s=self.job_timeout_s)
            self.sessions[cfg] = sess
            self.stats["start_seconds"] += time.perf_counter() - t0
        return sess

    # ------------------------------------------------------------------ Backend protocol
    def execute(self, cfg: NMEConfig, program: Program, mem: np.ndarray):
        """One program on rank 0, or on the rank of a :meth:`rank_image` (the other ranks
        idle). Returns an ExecResult."""
        return self.execute_many(cfg, [(program, mem)])[0]

    def execute_many(self, cfg: NMEConfig, jobs: list[tuple[Program, np.ndarray]], *,
                     inplace: bool = False) -> list:
        """Run the jobs in batches of ``dimms*ranks``, all ranks of a batch in lockstep (job
        ``k`` of a batch on rank ``k``, a job on a :meth:`rank_image` on its rank); returns
        one :class:`coda.host.nme.backend.ExecResult` per job, in order (``inplace`` is
        ignored: a result's ``mem`` is its rank's memory, read-only for an image of the
        caller's own).

        Raises:
            TypeError / ValueError: malformed images or programs, or two jobs of a batch on
                one rank image.
            CosimBuildError / CosimRunError: the simulator could not be built / failed.
        """
        out = []
        for start in range(0, len(jobs), self.n):
            out += self.collect(self.submit_many(cfg, jobs[start:start + self.n]))
        return out

    def _placement(self, cfg: NMEConfig, images: list[np.ndarray]) -> list[int]:
        """The rank of each job: its image's when the image is a rank memory of ``cfg``, else
        the job's index, or the next rank no other job of the batch takes."""
        memories = self._rank_memories(cfg)[1]
        owner = {id(m.mem): k for k, m in enumerate(memories)}
        owned = [owner.get(id(img)) for img in images]
        taken = {k for k in owned if k is not None}
        if len(taken) < sum(k is not None for k in owned):
            raise ValueError("two jobs of one launch on the same rank image: expected one "
                             "job per rank")
        ranks, used = [], set(taken)
        for i, k in enumerate(owned):
            if k is None:
                k = i if i not in used else min(set(range(self.n)) - used)
                used.add(k)
            ranks.append(k)
        return ranks

    def submit_many(self, cfg: NMEConfig, jobs: list[tuple[Program, np.ndarray]]):
        """Start up to ``dimms*ranks`` (program, image) jobs in lockstep and return at once;
        :meth:`collect` waits for them. The simulator runs in its own process, so the caller
        computes meanwhile (the other CFG branch), and may write words of its rank images
        the programs do not touch. Errors as :meth:`execute_many` (ValueError for more jobs
        than ranks or while a launch is pending)."""
        if len(jobs) > self.n:
            raise ValueError(f"{len(jobs)} jobs at once: expected at most dimms*ranks={self.n} "
                             "(use execute_many)")
        if self._pending:
            raise ValueError("submit_many while a launch is pending: collect it first")
        images = [memfile.check_image(m, cfg.mem_words, cfg.lanes) for _, m in jobs]
        ranks = self._placement(cfg, images)
        programs: list[Program | None] = [None] * self.n
        for k, (program, _) in zip(ranks, jobs):
            programs[k] = program
        stream = command_stream(programs)
        if len(stream) > CMD_DEPTH:
            raise ValueError(f"{len(stream)} command words: the cosimulation top holds "
                             f"{CMD_DEPTH}")
        sess = self.session(cfg)
        t0 = time.perf_counter()
        shared, saved = [], {}
        for k, img in zip(ranks, images):
            memory = sess.memories[k]
            shared.append(img is memory.mem)
            if not shared[-1] and k in self._handed.get(cfg, ()):
                saved[k] = memory.mem.copy()   # the caller's rank image, put back by collect
            sync_memory(memory, img)
        (sess.workdir / "cmd_in.hex").write_text(
            "".join(f"{(mask << 64) | w:x}\n" for mask, w in stream))
        sess._send({"op": "run", "ncmd": len(stream),
                    "max_cycles": job_cycle_limit(programs, cfg, self.std)})
        self._pending = True
        return (cfg, sess, ranks, shared, saved, len(stream), t0)

    def collect(self, handle) -> list:
        """Wait for the jobs of :meth:`submit_many`; their ExecResults in job order. A rank
        memory the caller holds (:meth:`rank_image`) that ran an image of the caller's own
        is given its contents back."""
        cfg, sess, ranks, shared, saved, n_commands, t0 = handle
        try:
            answer = sess._answer("run", self.job_timeout_s)
            results, rcycles, statuses, stats = self._results(sess, ranks, shared, answer)
        finally:
            self._pending = False
            for k, image in saved.items():
                sync_memory(sess.memories[k], image)
        dt = time.perf_counter() - t0
        nme_mhz = self.nme_mhz or 1000.0 / self.std.tCK_ns
        self.last = JobReport(answer["cycles"], bool(answer["error"]), rcycles, statuses,
                              stats, dt, n_commands, {"sim_ns": answer.get("sim_ns", 0),
                                                      "sim_wall_s": answer.get("sim_wall_s", 0.0)},
                              dram_cycles=answer["dram_cycles"],
                              ns=answer["cycles"] * 1000.0 / nme_mhz, nme_mhz=nme_mhz)
        self.stats["jobs"] += 1
        self.stats["programs"] += len(results)
        self.stats["cycles"] += answer["cycles"]
        self.stats["rank_cycles"] += sum(rcycles)
        self.stats["dram_cycles"] += self.last.dram_cycles
        self.stats["ns"] += self.last.ns
        self.stats["seconds"] += dt
        self.stats["sim_seconds"] += answer.get("sim_wall_s", 0.0)
        return results

    @staticmethod
    def _results(sess: NMPSession, ranks: list[int], shared: list[bool], answer: dict):
        """(ExecResults, NME cycles, raw statuses, controller counters) of a job's ranks from
        the server's ``answer`` and the top's result file; a result's ``mem`` is its rank's
        memory (``shared``) or a read-only copy of it. Raises CosimRunError for a job that
        did not finish, a write outside the memory, a count of written words the memory does
        not list, or an undefined status."""
        if answer["timeout"] or answer["cmd_left"]:
            raise CosimRunError(f"DIMM-NMP job did not finish (timeout {answer['timeout']}, "
                                f"{answer['cmd_left']} command words not taken):\n"
                                + log_tail(sess.log))
        rows = [line.split() for line in (sess.workdir / "res_out.txt").read_text().splitlines()]
        results, rcycles, statuses, stats = [], [], [], []
        for k, own in zip(ranks, shared):
            vals = [int(v) for v in rows[k]]
            status_raw, l1_bits, cyc, ndirty = vals[1:5]
            memory = sess.memories[k]
            if memory.nstray:
                raise CosimRunError(f"rank {k}: {memory.nstray} burst writes outside the NME "
                                    "memory (device indexes that hold no burst)")
            if ndirty != memory.ndirty:
                raise CosimRunError(f"rank {k}: the top counted {ndirty} words written, the "
                                    f"memory lists {memory.ndirty}")
            stats.append(dict(zip(STAT_NAMES, vals[5:5 + len(STAT_NAMES)])))
            try:
                status = Status(status_raw)
            except ValueError:
                raise CosimRunError(f"rank {k}: undefined status {status_raw}") from None
            if own:
                new = memory.mem       # the caller's own array: the ranks wrote into it
            else:
                new = memory.mem.copy()
                new.flags.writeable = False
            statuses.append(status_raw)
            rcycles.append(cyc)
            results.append(ExecResult(new, status, f32_from_bits(l1_bits), cyc))
        return results, rcycles, statuses, stats

    def rank_stats(self, cfg: NMEConfig) -> list[dict]:
        """Controller counters of the ranks of the last job's jobs (cumulative, see
        JobReport)."""
        return [] if self.last is None else self.last.stats

    def close(self) -> None:
        """Stop the simulators (this flushes the command logs) and delete the rank memories'
        files (arrays still held by a caller stay readable); idempotent."""
        super().close()
        for _, memories in self._memories.values():
            for memory in memories:
                memory.close(unlink=True)
        self._memories.clear()
        self._handed.clear()
        self._pending = False
