"""The ``rtl`` backend: NME programs executed by the Verilated NME, from plain Python.

:class:`RTLBackend` implements the :class:`coda.host.nme.backend.Backend` protocol. For each NME
configuration it builds the cosimulation once (:func:`coda.cosim.nme.build.build_sim`, cached on
disk) and starts simulator processes running the cocotb job server (:mod:`coda.cosim.nme.server`),
one per rank of the driver's jobs (up to ``max_sims``), which run in parallel; every program is
a request over a TCP socket on 127.0.0.1, run at full Verilator speed with no Python per clock.
Each simulator's memory is a file the host maps too (:mod:`coda.cosim.shared_mem`).

Results are bit-identical to :class:`coda.host.nme.backend.TorchBackend` for ``mem``, ``status`` and
``l1``; ``cycles`` are the RTL's measured clock cycles from the header being presented to
``done`` (inclusive). :class:`RTLBackend` has the memory images, timeouts and waveforms.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import socket
import struct
import subprocess
import time
import weakref
from pathlib import Path

import numpy as np

from coda.cosim import memfile
from coda.cosim.nme.build import (CosimRunError, SimBuild, build_sim, log_tail, sim_command,
                              sim_env)
from coda.cosim.shared_mem import SharedMemory, memory_path
from coda.hw.nme.executor import ExecResult
from coda.hw.nme.isa import NMEConfig, Program, Status
from coda.paths import owned_name, remove_orphans

__all__ = ["RTLBackend", "SessionOwner", "SimSession", "f32_from_bits", "program_cycle_limit",
           "sync_memory"]

SERVER_MODULE = "coda.cosim.nme.server"


def f32_from_bits(bits: int) -> float:
    """The fp32 value of a 32-bit pattern (a job's ``l1_bits``; bits above 32 ignored)."""
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFF_FFFF))[0]


def sync_memory(memory: SharedMemory, mem: np.ndarray) -> int:
    """Make the simulator's ``memory`` equal the image ``mem`` (uint16, its shape): nothing
    to do when ``mem`` is that memory's array, else the words that differ are copied in.
    Returns how many were. Both RTL backends load a caller's own image this way."""
    if mem is memory.mem:
        return 0
    changed = memfile.changed_words(mem, memory.mem)
    memory.mem[changed] = mem[changed]
    return int(changed.size)


def program_cycle_limit(cfg: NMEConfig, program: Program, latency: int, stall: float) -> int:
    """Watchdog limit (cycles) for one program: a generous multiple of the work it implies.

    Each micro-op passes over every word; each pass may wait ``latency`` cycles per block and
    stalls stretch every memory cycle by ``1/(1-stall)``. Beyond 16x that plus 10^5 cycles of
    slack the NME is considered hung.
    """
    n_words = -(-max(program.n_elems, 1) // cfg.lanes)
    blocks = -(-n_words // cfg.depth)
    work = (len(program.uops) + 2) * (n_words + blocks * (latency + 8)) + 4 * cfg.lanes
    limit = int(16 * work / max(1e-3, (1.0 - stall)) ** 2) + 100_000
    return min(limit, (1 << 32) - 1)


class SimSession:
    """One persistent simulator process for one NME configuration.

    Args:
        build: the built cosimulation.
        workdir: folder for the hex files and ``sim.log`` (created).
        start_timeout_s: wall limit for the simulator to start and connect (s).
        job_timeout_s: wall limit for one request (s).
        waves: an ``.fst`` file where the simulator writes the waveform of its whole life
            (the build must be traced; complete once :meth:`close` returns).
        memory: the simulator's memory (a :class:`SharedMemory` of the build's geometry, kept
            by the caller, e.g. a rank image); default: a new zeroed one of its own, deleted
            by :meth:`close`.
    Raises:
        CosimRunError: the simulator did not start or connect in time (with its log tail).
        ValueError: ``waves`` with an untraced build, or not an .fst path.
    """

    def __init__(self, build: SimBuild, workdir: Path, *, start_timeout_s: float = 120.0,
                 job_timeout_s: float = 600.0, waves: str | os.PathLike | None = None,
                 memory: SharedMemory | None = None):
        self._prepare(build, workdir, job_timeout_s)
        if memory is not None and (memory.words, memory.lanes) != (build.mem_words, build.lanes):
            raise ValueError(f"memory of {memory.words} words x {memory.lanes} lanes: the build "
                             f"has {build.mem_words} x {build.lanes}")
        self._own_memory = memory is None
        self.memory = memory if memory is not None else SharedMemory.create(
            memory_path(self.workdir), build.lanes, build.mem_words)
        command = sim_command(build, self.workdir, waves=waves, memory=self.memory.path)
        self.waves = Path(command[-1]) if waves is not None else None
        self._start(SERVER_MODULE, {"CODA_COSIM_LANES": str(build.lanes),
                                    "CODA_COSIM_MEM_WORDS": str(build.mem_words)},
                    command, start_timeout_s)

    def _prepare(self, build, workdir: Path, job_timeout_s: float) -> None:
        self.build = build
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.job_timeout_s = job_timeout_s
        self.waves: Path | None = None       # the FST file this simulator writes, if any
        self.log = self.workdir / "sim.log"
        self.memory: SharedMemory | None = None
        self._own_memory = False
        self.jobs = 0
        self.seconds = 0.0
        self._pending: tuple | None = None   # (words, shared, t0) of a submitted program

    def _start(self, server_module: str, extra_env: dict, command: list[str],
               start_timeout_s: float) -> None:
        """Start ``command`` (a simulator running the job server ``server_module``), accept
        its connection on a fresh loopback port and check its hello token. Raises
        CosimRunError if it does not connect or answer in ``start_timeout_s``."""
        token = secrets.token_hex(8)
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.5)
        env = sim_env(server_module, extra={
            "CODA_COSIM_PORT": str(listener.getsockname()[1]), "CODA_COSIM_TOKEN": token,
            "COCOTB_RESULTS_FILE": str(self.workdir / "results.xml"), **extra_env})
        self._logfh = open(self.log, "w")
        self.proc = subprocess.Popen(command, cwd=self.workdir, env=env, stdout=self._logfh,
                                     stderr=subprocess.STDOUT)
        try:
            self.sock = self._accept(listener, start_timeout_s)
        finally:
            listener.close()
        self.sock.settimeout(0.5)
        self._rbuf = b""
        hello = self._read_line(start_timeout_s)
        if hello.get("hello") != token:
            self.kill()
            raise CosimRunError(f"simulator answered {hello!r}, not the expected hello")

    # ------------------------------------------------------------------ transport
    def _accept(self, listener: socket.socket, timeout_s: float) -> socket.socket:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                conn, _ = listener.accept()
                return conn
            except (TimeoutError, socket.timeout):
                if self.proc.poll() is not None:
                    raise CosimRunError(self._died("while starting"))
        self.kill()
        raise CosimRunError(f"simulator did not connect within {timeout_s} s:\n"
                            + log_tail(self.log))

    def _died(self, when: str) -> str:
        self._logfh.flush()
        return (f"simulator {self.build.binary} exited with code {self.proc.returncode} "
                f"{when}; log {self.log}:\n" + log_tail(self.log))

    def _read_line(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._rbuf:
            if time.monotonic() > deadline:
                self.kill()
                raise CosimRunError(f"no answer from the simulator within {timeout_s} s "
                                    f"(killed):\n" + log_tail(self.log))
            try:
                chunk = self.sock.recv(1 << 16)
            except (TimeoutError, socket.timeout):
                if self.proc.poll() is not None:
                    raise CosimRunError(self._died("during a request"))
                continue
            if not chunk:
                self.proc.wait(timeout=10)
                raise CosimRunError(self._died("and closed the connection"))
            self._rbuf += chunk
        line, self._rbuf = self._rbuf.split(b"\n", 1)
        return json.loads(line)

    def _send(self, req: dict) -> None:
        if self.proc.poll() is not None:
            raise CosimRunError(self._died("before a request"))
        self.sock.sendall((json.dumps(req) + "\n").encode())

    def _answer(self, op: str, timeout_s: float | None = None) -> dict:
        answer = self._read_line(self.job_timeout_s if timeout_s is None else timeout_s)
        if not answer.get("ok"):
            raise CosimRunError(f"simulator refused {op!r}: {answer.get('error')}")
        return answer

    def request(self, req: dict, timeout_s: float | None = None) -> dict:
        """Send one request and return the answer. Raises CosimRunError on any failure."""
        self._send(req)
        return self._answer(req.get("op"), timeout_s)

    # ------------------------------------------------------------------ jobs
    def sync_memory(self, mem: np.ndarray) -> int:
        """Make the simulator's memory equal ``mem``: nothing to do when ``mem`` is that
        memory (:attr:`memory`), else the words that differ are copied in. Returns how many
        were (:func:`sync_memory`)."""
        return sync_memory(self.memory, mem)

    def submit(self, words: list[int], mem: np.ndarray, *, latency: int, req_stall: float,
               rsp_stall: float, seed: int, max_cycles: int) -> None:
        """Start command ``words`` on image ``mem`` without waiting; :meth:`collect` ends it.
        Several sessions' programs thus run in parallel (one simulator process each). When
        ``mem`` is the simulator's own memory the caller may go on writing words the program
        does not touch (other cache slots) while it runs, as a host writes rank memory
        while the NME works; an image of the caller's own is copied in first."""
        if self._pending is not None:
            raise CosimRunError("submit while a program is pending: collect it first")
        t0 = time.perf_counter()
        self.sync_memory(mem)
        self._send({"op": "run", "words": [f"{w:x}" for w in words],
                    "latency": latency, "req_stall": req_stall, "rsp_stall": rsp_stall,
                    "seed": seed, "max_cycles": max_cycles})
        self._pending = (words, mem is self.memory.mem, t0)

    @property
    def pending(self) -> bool:
        """A submitted program has not been collected yet."""
        return self._pending is not None

    def collect(self) -> tuple[dict, np.ndarray]:
        """Wait for the pending program; (the server's answer, the image after, read-only)."""
        if self._pending is None:
            raise CosimRunError("collect without a submitted program")
        words, shared, t0 = self._pending
        self._pending = None
        answer = self._answer("run")
        if answer["ndirty"] != self.memory.ndirty:
            raise CosimRunError(f"the top counted {answer['ndirty']} words written, the memory "
                                f"lists {self.memory.ndirty}")
        if answer["timeout"] or answer["aborted"] or answer["faults"]:
            raise CosimRunError(f"NME protocol fault {answer['faults']} (timeout "
                                f"{answer['timeout']}, aborted {answer['aborted']}) on program "
                                f"{[hex(w) for w in words]}:\n" + log_tail(self.log))
        if shared:
            out = self.memory.mem      # the caller's own array: the NME wrote into it
        else:
            out = self.memory.mem.copy()
            out.flags.writeable = False
        self.jobs += 1
        self.seconds += time.perf_counter() - t0
        return answer, out

    def run(self, words: list[int], mem: np.ndarray, **kw) -> tuple[dict, np.ndarray]:
        """Run command ``words`` on image ``mem`` (keywords of :meth:`submit`); (the server's
        answer, the image after)."""
        self.submit(words, mem, **kw)
        return self.collect()

    def dump(self) -> np.ndarray:
        """A copy of the simulator's whole memory (uint16 ``[mem_words, lanes]``)."""
        return self.memory.mem.copy()

    # ------------------------------------------------------------------ shutdown
    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the simulator to quit; kill it if it does not within ``timeout_s`` (at least
        300 s for one writing a waveform: its FST file is finished as it exits)."""
        if self.waves is not None:
            timeout_s = max(timeout_s, 300.0)
        if self.proc.poll() is None:
            try:
                self.sock.sendall(b'{"op": "quit"}\n')
                self.proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        try:
            self.sock.close()
        except OSError:
            pass
        self._logfh.close()
        if self._own_memory and self.memory is not None:
            self.memory.close(unlink=True)

    def kill(self) -> None:
        """Stop the simulator process at once."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


_LIVE: "weakref.WeakSet[SessionOwner]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for backend in list(_LIVE):
        backend.close()


#: a simulator's work folder in its build's folder: ``run-<pid>-<hex>``, removed when its
#: backend closes, or, left by a killed run, when the next simulator of any build starts
#: (:func:`coda.paths.remove_orphans`); ``logs-<pid>-<hex>`` with ``keep_logs`` (kept)
RUN_PREFIX, LOGS_PREFIX = "run", "logs"


class SessionOwner:
    """Owner of persistent simulator sessions (``self.sessions``: key -> session with
    ``close()`` and ``workdir``; ``self.keep_logs``): stops them on :meth:`close`, at the end
    of a ``with`` block, on garbage collection and at interpreter exit (once :meth:`_track`
    has registered it). Base of both RTL backends."""

    sessions: dict
    keep_logs: bool

    def _workdir(self, parent: Path) -> Path:
        """A fresh work folder name for a simulator of the build in ``parent``
        (:data:`RUN_PREFIX`, or :data:`LOGS_PREFIX` with ``keep_logs``), after removing the
        run folders whose process is gone (runs killed before their clean-up) there and in
        the other builds beside it (``build/cosim/*``)."""
        parent = Path(parent)
        for build in {parent, *(p for p in parent.parent.iterdir() if p.is_dir())}:
            remove_orphans(build, RUN_PREFIX)
        return parent / owned_name(LOGS_PREFIX if self.keep_logs else RUN_PREFIX)

    def _track(self) -> None:
        """Close this owner's simulators at interpreter exit if nobody did before."""
        _LIVE.add(self)

    def close(self) -> None:
        """Stop every simulator this backend started (idempotent; flushes their logs)."""
        for sess in self.sessions.values():
            sess.close()
            if not self.keep_logs:
                shutil.rmtree(sess.workdir, ignore_errors=True)
        self.sessions.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class RTLBackend(SessionOwner):
    """Backend running programs on the Verilated NME (persistent simulators per config, one
    per rank of a lockstep launch).

    Each simulator's memory is a file the host maps too (:mod:`coda.cosim.shared_mem`). A caller
    that keeps its rank images in these memories (:meth:`RTLBackend.rank_image`, as
    :class:`coda.host.nmp.driver.NMPDriver` does) moves nothing at all between jobs: what it writes
    is what the NME reads and what the NME writes is in its array when the job ends. An image of
    the caller's own is compared with the memory and only the words that differ are copied in;
    its result is a copy of the memory after the job.

    Every wait has a timeout; a simulator that dies, hangs or fails to build raises
    :class:`~coda.cosim.nme.build.CosimRunError` / :class:`~coda.cosim.nme.build.CosimBuildError` with the
    tail of its log. Simulators are stopped by :meth:`RTLBackend.close` (also at interpreter exit).

    ``RTLBackend(waves="run.fst")`` runs the traced model instead (``build_sim(waves=True)``) and
    each simulator writes the FST waveform of everything it ran, complete once :meth:`close` has
    stopped it (``coda nme run --waves``).

    Args:
        latency: memory read latency in cycles (1..255).
        req_stall, rsp_stall: probabilities (0 <= p < 1) that the memory refuses a request /
            withholds a due response in a cycle (pseudo-random, in HDL).
        seed: seed of the stall generator (the same seed gives the same stalls).
        job_timeout_s: wall limit of one program (s); start_timeout_s: of a simulator start.
        keep_logs: keep the simulators' work folders (logs, hex files) after :meth:`close`
            (``logs-<pid>-<hex>`` beside the build, never removed by coda).
        max_sims: simulator processes per configuration (1..64) that :meth:`execute_many`
            spreads its jobs over (one per rank of the driver).
        clock_gating: simulate NMEs with gated lane clocks (the default, as the DIMM-NMP's
            cosimulation: the same bits and cycles, a faster model; :func:`build_sim`);
            False: the ungated NME.
        measure_toggles: simulate NMEs with the simulation-only FU toggle counter
            (``stats["toggles"]``; 0 without it).
        waves: an ``.fst`` file: run the traced model (a separate cached build) and write
            each simulator's FST waveform, the first simulator's to ``waves``, the n-th's
            (n >= 1, other ranks or configurations) to ``<stem>-<n>.fst`` beside it; the files
            are complete after :meth:`close`, listed in ``wave_files``. Default: no waveform,
            the untraced (faster) model.
    Raises:
        ValueError: a parameter out of range, ``waves`` not an .fst file path.

    ``stats``: ``programs``, ``cycles`` (summed over jobs), ``seconds`` (wall time from each
    launch to its collection, less simulator builds and starts: an upper bound of the time
    the simulators ran when the caller computes between :meth:`submit_many` and
    :meth:`collect`), ``sim_seconds`` (the simulators' own wall time running programs,
    summed over jobs: what is left of ``seconds`` x simulators is per-job overhead and
    waiting), ``starts``, ``start_seconds``, ``toggles``.
    """
    name = "rtl"

    def __init__(self, *, latency: int = 1, req_stall: float = 0.0, rsp_stall: float = 0.0,
                 seed: int = 1, job_timeout_s: float = 600.0, start_timeout_s: float = 180.0,
                 keep_logs: bool = False, max_sims: int = 8, measure_toggles: bool = False,
                 clock_gating: bool = True,
                 waves: str | os.PathLike | None = None):
        if not 1 <= int(latency) <= 255:
            raise ValueError(f"latency={latency}: expected 1..255 cycles")
        for nm, p in (("req_stall", req_stall), ("rsp_stall", rsp_stall)):
            if not 0.0 <= float(p) < 1.0:
                raise ValueError(f"{nm}={p}: expected a probability in [0, 1)")
        if not 0 <= int(seed) < (1 << 32):
            raise ValueError(f"seed={seed}: expected 0..2**32-1")
        if job_timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError(f"timeouts {job_timeout_s}, {start_timeout_s}: expected > 0 s")
        if not 1 <= int(max_sims) <= 64:
            raise ValueError(f"max_sims={max_sims}: expected 1..64 simulator processes")
        if waves is not None:
            wpath = Path(waves)
            if str(waves) in ("", "-") or wpath.suffix != ".fst" or wpath.is_dir():
                raise ValueError(f"waves={str(waves)!r}: expected an .fst file path")
        self.waves = None if waves is None else Path(waves).resolve()
        self.wave_files: list[Path] = []
        self.max_sims = int(max_sims)
        self.measure_toggles = bool(measure_toggles)
        self.clock_gating = bool(clock_gating)
        self.latency = int(latency)
        self.req_stall = float(req_stall)
        self.rsp_stall = float(rsp_stall)
        self.seed = int(seed)
        self.job_timeout_s = float(job_timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.keep_logs = keep_logs
        self.sessions: dict[tuple, SimSession] = {}
        self._rank_memories: dict[tuple[NMEConfig, int], SharedMemory] = {}
        self._rank_of: dict[int, tuple[NMEConfig, int]] = {}   # id(array) -> its (cfg, rank)
        self.stats = {"programs": 0, "cycles": 0, "seconds": 0.0, "starts": 0,
                      "start_seconds": 0.0, "toggles": 0, "sim_seconds": 0.0}
        self._track()

    def build(self, cfg: NMEConfig):
        """The Verilated model this backend runs for ``cfg`` (subclasses swap the Verilog)."""
        return build_sim(cfg, measure_toggles=self.measure_toggles,
                         clock_gating=self.clock_gating,
                         waves=self.waves is not None)

    def _next_wave_file(self) -> Path | None:
        """Where the next simulator started writes its waveform (None: no waveforms)."""
        if self.waves is None:
            return None
        n = len(self.wave_files)
        path = self.waves if n == 0 else self.waves.with_name(f"{self.waves.stem}-{n}.fst")
        self.wave_files.append(path)
        return path

    def session(self, cfg: NMEConfig, slot: int = 0) -> SimSession:
        """Simulator ``slot`` of ``cfg`` (0 .. max_sims-1), built and started on first use,
        with a memory of its own (the images of :meth:`rank_image` have their own
        simulators)."""
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg of type {type(cfg).__name__}: expected NMEConfig")
        if not 0 <= slot < self.max_sims:
            raise ValueError(f"slot={slot}: expected 0..{self.max_sims - 1}")
        return self._session((cfg, slot), cfg, None)

    def _session(self, key, cfg: NMEConfig, memory: SharedMemory | None) -> SimSession:
        """The simulator of ``key``, (re)started on first use or after it died."""
        sess = self.sessions.get(key)
        if sess is None or sess.proc.poll() is not None:
            t0 = time.perf_counter()
            build = self.build(cfg)
            workdir = self._workdir(build.path)
            if sess is not None:
                sess.close()
            sess = SimSession(build, workdir, start_timeout_s=self.start_timeout_s,
                              job_timeout_s=self.job_timeout_s, waves=self._next_wave_file(),
                              memory=memory)
            self.sessions[key] = sess
            self.stats["starts"] += 1
            self.stats["start_seconds"] += time.perf_counter() - t0
        return sess

    def rank_image(self, cfg: NMEConfig, rank: int) -> np.ndarray:
        """The memory of rank ``rank`` (>= 0) for ``cfg``: uint16 ``[cfg.mem_words,
        cfg.lanes]``, zeroed when first asked for, mapped by the simulator that will run the
        rank's programs (its own, started on the rank's first job). A caller that keeps its
        rank image in this array and passes it back as the job's image moves no words
        between jobs (:class:`coda.host.nmp.driver.NMPDriver` does). The same array on every
        call until :meth:`close`. Raises TypeError / ValueError for a bad ``cfg`` / ``rank``."""
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg of type {type(cfg).__name__}: expected NMEConfig")
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank={rank!r}: expected an int >= 0")
        memory = self._rank_memories.get((cfg, rank))
        if memory is None:
            memory = SharedMemory.create(memory_path(), cfg.lanes, cfg.mem_words)
            self._rank_memories[cfg, rank] = memory
            self._rank_of[id(memory.mem)] = (cfg, rank)
        return memory.mem

    def _job_session(self, cfg: NMEConfig, mem: np.ndarray, foreign: int) -> SimSession:
        """The simulator of a job on image ``mem``: its rank's when ``mem`` is a
        :meth:`rank_image` of ``cfg``, else foreign slot ``foreign``."""
        owner = self._rank_of.get(id(mem))
        if owner is not None and owner[0] == cfg and self._rank_memories[owner].mem is mem:
            return self._session((cfg, "rank", owner[1]), cfg, self._rank_memories[owner])
        return self.session(cfg, foreign)

    def close(self) -> None:
        """Stop every simulator and delete the rank memories' files (arrays still held by a
        caller stay readable; a later job on them copies them in as images of its own)."""
        super().close()
        for memory in self._rank_memories.values():
            memory.close(unlink=True)
        self._rank_memories.clear()
        self._rank_of.clear()

    def execute(self, cfg: NMEConfig, program: Program, mem: np.ndarray):
        """Run ``program`` on a copy of ``mem`` (uint16 ``[cfg.mem_words, cfg.lanes]``) on
        simulator 0 of ``cfg``.

        Returns:
            :class:`coda.host.nme.backend.ExecResult` (``cycles``: measured RTL clock cycles;
            ``mem`` read-only, the record of the simulator's memory: copy it to change it).
        Raises:
            TypeError / ValueError: malformed image, or program fields that do not encode.
            CosimBuildError / CosimRunError: the simulator could not be built / failed.
        """
        return self.execute_many(cfg, [(program, mem)])[0]

    def execute_many(self, cfg: NMEConfig, jobs: list[tuple[Program, np.ndarray]], *,
                     inplace: bool = False) -> list:
        """Run each (program, image) job; results in job order (``inplace`` is ignored: the
        images stay as given, the results are the simulators' memories).

        Job ``i`` runs on simulator ``i % max_sims`` of ``cfg``, up to ``max_sims`` at a time
        in parallel processes. Why: the driver passes one job per rank, so each rank's memory
        image stays resident in its own simulator (only the words the host changed are loaded)
        and the ranks' programs overlap on a multi-core machine, as they run in lockstep in the
        modelled system. Bits do not depend on the placement. Errors as :meth:`execute`.
        """
        results = []
        for wave in range(0, len(jobs), self.max_sims):
            results += self.collect(self.submit_many(cfg, jobs[wave:wave + self.max_sims]))
        return results

    def submit_many(self, cfg: NMEConfig, jobs: list[tuple[Program, np.ndarray]]):
        """Start up to ``max_sims`` (program, image) jobs on their simulators and return at
        once; :meth:`collect` waits for them. The simulators run in their own processes, so
        the caller computes meanwhile (the other CFG branch). Errors as :meth:`execute`
        (ValueError for more jobs than ``max_sims``)."""
        if len(jobs) > self.max_sims:
            raise ValueError(f"{len(jobs)} jobs at once: expected at most max_sims="
                             f"{self.max_sims} (use execute_many)")
        starts_s = self.stats["start_seconds"]
        stall = max(self.req_stall, self.rsp_stall)
        prepared = []
        for program, mem in jobs:
            mem = memfile.check_image(mem, cfg.mem_words, cfg.lanes)
            prepared.append((program.words(), mem,
                             program_cycle_limit(cfg, program, self.latency, stall)))
        sessions, foreign = [], 0
        for _, mem, _ in prepared:
            sessions.append(self._job_session(cfg, mem, foreign))
            foreign += sessions[-1].memory.mem is not mem
        if len({id(s) for s in sessions}) < len(sessions):
            raise ValueError("two jobs of one launch on the same rank image: expected one "
                             "job per rank")
        error = None
        for sess, (words, mem, limit) in zip(sessions, prepared):
            try:
                sess.submit(words, mem, latency=self.latency, req_stall=self.req_stall,
                            rsp_stall=self.rsp_stall, seed=self.seed, max_cycles=limit)
            except CosimRunError as exc:
                error = exc
                break
        # in flight from here (simulator starts excluded) until collect() returns
        handle = (sessions, error, time.perf_counter() - (self.stats["start_seconds"] - starts_s))
        if error is not None:
            self.collect(handle)      # collects what was submitted, then raises
        return handle

    def collect(self, handle) -> list[ExecResult]:
        """Wait for the jobs of :meth:`submit_many`; results in job order. Every submitted
        job is collected (none stays pending) before an error is raised."""
        sessions, error, t_submit = handle
        done, errors = [], [error] if error is not None else []
        for sess in sessions:
            if sess.pending:
                try:
                    done.append(sess.collect())
                except CosimRunError as exc:
                    errors.append(exc)
        self.stats["seconds"] += time.perf_counter() - t_submit
        if errors:
            raise errors[0]
        results = []
        for answer, out in done:
            try:
                status = Status(answer["status"])
            except ValueError:
                raise CosimRunError(f"NME reported undefined status "
                                    f"{answer['status']}") from None
            self.stats["programs"] += 1
            self.stats["cycles"] += answer["cycles"]
            self.stats["toggles"] += answer["toggles"]
            self.stats["sim_seconds"] += answer.get("sim_wall_s", 0.0)
            results.append(ExecResult(out, status, f32_from_bits(answer["l1_bits"]),
                                      int(answer["cycles"])))
        return results
