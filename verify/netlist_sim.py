"""Netlist equivalence by simulation: the synthesised gate-level NME against the RTL and torch.

:func:`netlist_verilog` synthesises the NME with yosys' technology-independent flow into plain
Verilog of yosys' internal gates (no cell library needed); :class:`NetlistBackend` runs programs
on that netlist inside the same cosimulation top and job server as the RTL (a full
:class:`coda.host.nme.backend.Backend`); :func:`check_equivalence` runs one batch of programs
(:func:`equivalence_jobs`) on torch, the RTL and the netlist and compares them, netlist vs RTL
bit for bit and cycle for cycle. Its docstring has the method step by step.

Simulation is evidence, not proof: it shows equivalence on the stimuli run, nothing more.
``coda netlist check``'s :func:`main` takes its :class:`NetlistCheckConfig` (``CONFIG``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coda.cosim.nme.build import DUT_NAME, build_sim
from coda.cosim.nme.rtl_backend import RTLBackend, SimSession, program_cycle_limit
from coda.cosim.toolchain import build_dir, build_lock
from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, UOp
from coda.host.nme import ops as ref
from coda.host.nme.interp import run_program
from coda.synth.flow import nme_source
from coda.synth.stimuli import op_case
from coda.synth.yosys_synth import synth_generic
from coda.jsonout import json_text
from coda.options import add_options, option
from coda.paths import check_output_path, write_file

__all__ = ["Job", "netlist_verilog", "NetlistBackend", "equivalence_jobs", "check_equivalence",
           "EquivalenceReport", "run_cocotb_subset", "COCOTB_SUBSET", "NetlistCheckConfig",
           "CONFIG", "configure", "main"]

#: where the NME's cocotb tests live (``tests/cocotb_nme.py``: they compare the RTL with the
#: torch reference of coda.host, so they sit above every layer, with the other tests)
TESTS_DIR = Path(__file__).resolve().parents[1] / "tests"
#: the cosim's cocotb tests of the NME (tests/cocotb_nme.py) run on the netlist:
#: FP edge cases, operators, masked tails, bad commands, reset in the middle of a program
COCOTB_SUBSET = "test_fp_edge_cases|test_operators|test_tails|test_bad_commands|test_reset_mid_program"


@dataclass
class Job:
    """One program on one memory image, with the memory model's stimulus.

    Attributes:
        name: label in reports. program: the program. mem: uint16 ``[mem_words, lanes]``.
        latency: read latency (cycles, 1..255). req_stall, rsp_stall: per-cycle probabilities
        that the memory refuses a request / withholds a due response. seed: stall generator.
    """
    name: str
    program: Program
    mem: np.ndarray
    latency: int = 1
    req_stall: float = 0.0
    rsp_stall: float = 0.0
    seed: int = 1


def netlist_verilog(cfg: NMEConfig, *, timeout_s: float | None = None) -> tuple[str, dict]:
    """Gate-level netlist of the NME ``cfg`` (module ``coda_nme``) and its synthesis summary.

    Cached in ``build/synth/netlist/<hash of the RTL>/`` (``netlist.v``, ``report.json``).

    Returns:
        (netlist Verilog text, ``{"cells_total", "ff", "logic_depth", "cells", "yosys_s",
        "path"}``).
    Raises:
        coda.synth.tools.SynthError if yosys fails.
    """
    rtl = nme_source(cfg, name=DUT_NAME)
    key = hashlib.sha256(rtl.encode()).hexdigest()[:16]
    out = build_dir("synth", "netlist", key)
    stamp = out / "report.json"
    with build_lock(out / ".lock"):
        if stamp.exists() and (out / "netlist.v").exists():
            return (out / "netlist.v").read_text(), json.loads(stamp.read_text())
        (out / f"{DUT_NAME}.v").write_text(rtl)
        result = synth_generic(out / f"{DUT_NAME}.v", DUT_NAME, out, timeout_s)
        summary = {k: result[k] for k in ("cells_total", "ff", "logic_depth", "cells", "yosys_s")}
        summary["path"] = str(out / "netlist.v")
        write_file(stamp, json_text(summary, indent=1))
        return (out / "netlist.v").read_text(), summary


class NetlistBackend(RTLBackend):
    """:class:`RTLBackend` whose simulator runs the yosys gate-level netlist of the NME.

    Same arguments and results as :class:`coda.cosim.nme.rtl_backend.RTLBackend`; ``name`` is
    ``"netlist"``. The first program of a configuration pays the synthesis (tens of seconds)
    and the Verilator build of the flat netlist.
    """
    name = "netlist"

    def build(self, cfg: NMEConfig):
        """The Verilated gate-level netlist of ``cfg`` (synthesised on first use)."""
        return build_sim(cfg, verilog=netlist_verilog(cfg)[0])


# --------------------------------------------------------------------------------------------
# stimuli

def _bad_programs(cfg: NMEConfig) -> list[tuple[str, Program]]:
    """One program per error status of the ISA (each rejected before touching memory)."""
    n = 4 * cfg.lanes
    end = cfg.mem_words
    mov = UOp(Op.MOV, RSrc.MEM, addr=0)
    store = UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=64)
    too_many = tuple(UOp(Op.MOV, RSrc.MEM, addr=0) for _ in range(cfg.max_streams + 1))
    return [
        # undefined codes encode fine (4-bit op, 3-bit rsrc fields) and must be rejected
        ("bad_opcode", Program(n, (mov, UOp(0xE, RSrc.MEM, addr=0), store))),
        ("bad_rsrc", Program(n, (UOp(Op.MOV, 7, addr=0), store))),
        ("bad_addr", Program(n, (UOp(Op.MOV, RSrc.MEM, addr=end - 1), store))),
        ("bad_store_addr", Program(n, (mov, UOp(Op.MOV, RSrc.BUF, store=True, addr=end - 2)))),
        ("bad_length_zero", Program(0, (mov, store))),
        ("bad_length_big", Program(cfg.max_elems + 1, (mov, store))),
        ("bad_buffer", Program(n, (UOp(Op.MOV, RSrc.MEM, d=cfg.nbuf, addr=0), store))),
        ("bad_chan_param", Program(n, (UOp(Op.MOV, RSrc.CHAN, addr=0, param=0), store))),
        ("bad_store_src", Program(n, (mov, UOp(Op.MOV, RSrc.MEM, store=True, addr=64)))),
        ("too_many_streams", Program(n, too_many)) if len(too_many) <= cfg.imem_depth
        else ("too_many_streams", Program(n, too_many[:cfg.imem_depth])),
    ]


def equivalence_jobs(cfg: NMEConfig, seed: int = 0) -> list[Job]:
    """The batch of :func:`check_equivalence`, deterministic in ``seed``.

    - every cache operator on "mixed" operands (all float classes), with streams of several
      blocks of ``cfg.depth`` words and, for the 1-D operators, a masked tail;
    - gated_residual and segment again under memory stalls and a read latency of 7 cycles;
    - one program per error status (memory must stay untouched).
    """
    lanes = cfg.lanes
    channels = 2 * lanes                               # CHAN needs C % lanes == 0
    tokens = max(3, (2 * cfg.depth + 3) // 2)          # > 1 block of words for every stream
    jobs = []
    for i, op in enumerate(ref.OPS):
        one_d = op in ("add", "sub", "mul", "l1_distance")
        t, c = (tokens, channels + (1 if lanes > 1 else 0)) if one_d else (tokens, channels)
        case = op_case(op, cfg, t, c, kind="mixed", seed=seed + 17 * i)
        jobs.append(Job(op, case.program, case.mem))
    for j, op in enumerate(("gated_residual", "segment")):
        case = op_case(op, cfg, tokens, channels, kind="mixed", seed=seed + 1000 + j)
        jobs.append(Job(f"{op}_stalls", case.program, case.mem, latency=7, req_stall=0.3,
                        rsp_stall=0.3, seed=seed + 5 + j))
    gen = np.random.default_rng(seed + 99)
    base = gen.integers(0, 1 << 16, size=(cfg.mem_words, lanes), dtype=np.int32).astype(np.uint16)
    for name, program in _bad_programs(cfg):
        jobs.append(Job(name, program, base))
    return jobs


# --------------------------------------------------------------------------------------------
# comparison

@dataclass
class EquivalenceReport:
    """Outcome of :func:`check_equivalence`.

    Attributes:
        cfg: the NME parameters. jobs: number of programs. mismatches: one line per difference
        (empty means equivalent on every job). netlist: synthesis summary of the netlist.
        rtl_s, netlist_s: wall seconds of the two simulators (build included), torch_s of the
        interpreter. cycles: total NME cycles of the batch.
    """
    cfg: dict
    jobs: int
    mismatches: list[str] = field(default_factory=list)
    netlist: dict = field(default_factory=dict)
    rtl_s: float = 0.0
    netlist_s: float = 0.0
    torch_s: float = 0.0
    cycles: int = 0
    per_job: list[dict] = field(default_factory=list)

    @property
    def equivalent(self) -> bool:
        return not self.mismatches


def _f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _same_l1(a: int, b: int) -> bool:
    nan = lambda bits: (bits >> 23) & 0xFF == 0xFF and bits & 0x7F_FFFF  # noqa: E731
    return a == b or bool(nan(a) and nan(b))


def _run_session(session: SimSession, cfg: NMEConfig, job: Job) -> tuple[dict, np.ndarray]:
    stall = max(job.req_stall, job.rsp_stall)
    return session.run(job.program.words(), job.mem, latency=job.latency,
                       req_stall=job.req_stall, rsp_stall=job.rsp_stall, seed=job.seed,
                       max_cycles=program_cycle_limit(cfg, job.program, job.latency, stall))


def check_equivalence(cfg: NMEConfig, jobs: list[Job] | None = None, *,
                      seed: int = 0) -> EquivalenceReport:
    """Run ``jobs`` (default :func:`equivalence_jobs`) on torch, RTL and netlist; compare.

    Method:

    1. The NME's Verilog (``coda.hw.verilog.nme_verilog(cfg, "coda_nme")``) goes through yosys'
       technology-independent synthesis (:func:`coda.synth.yosys_synth.synth_generic`:
       ``synth -flatten``, ``write_verilog -noattr``). The netlist is plain Verilog of yosys'
       internal gates (``$_AND_``, ``$_MUX_``, ``$_DFF_*`` written as expressions and ``always``
       blocks), so no cell library (simcells.v) is needed; memories are mapped to flip-flops
       by ``memory_map``.
    2. The cosimulation top of :mod:`coda.cosim` (HDL clock, memory model with latency and random
       stalls, job server) is built around the netlist instead of the RTL
       (:func:`coda.cosim.nme.build.build_sim` with ``verilog=netlist``), and the same job server
       (:class:`coda.cosim.nme.rtl_backend.SimSession`) runs programs on it: :class:`NetlistBackend`
       is a full :class:`coda.host.nme.backend.Backend`.
    3. :func:`check_equivalence` runs one batch of programs (every cache operator on operands that
       hit every float class, masked tails, several blocks, memory stalls, every kind of bad
       command) on the torch interpreter, the RTL and the netlist, and compares: netlist vs RTL
       everything bit for bit and cycle for cycle (memory image, status, ``l1`` bits, cycles,
       FU toggles, read and write requests); both vs torch the memory image, status and ``l1``
       bits (NaN ``l1`` by class).

    Raises:
        CosimBuildError / CosimRunError if a simulator cannot be built or faults (a protocol
        fault of the netlist, e.g. a hang, is itself a failed equivalence and is raised).
    """
    jobs = equivalence_jobs(cfg, seed) if jobs is None else jobs
    report = EquivalenceReport(cfg=cfg.__dict__.copy(), jobs=len(jobs))
    t0 = time.perf_counter()
    golden = [run_program(cfg, job.program, job.mem) for job in jobs]
    report.torch_s = round(time.perf_counter() - t0, 2)
    answers = {}
    for label, backend in (("rtl", RTLBackend()), ("netlist", NetlistBackend())):
        t0 = time.perf_counter()
        try:
            session = backend.session(cfg)
            answers[label] = [_run_session(session, cfg, job) for job in jobs]
        finally:
            backend.close()
        setattr(report, f"{label}_s", round(time.perf_counter() - t0, 2))
    report.netlist = netlist_verilog(cfg)[1]
    for job, gold, (rtl, rtl_mem), (net, net_mem) in zip(jobs, golden, answers["rtl"],
                                                         answers["netlist"]):
        report.cycles += rtl["cycles"]
        report.per_job.append({"job": job.name, "status": int(gold.status),
                               "cycles": rtl["cycles"], "toggles": rtl["toggles"]})
        for key in ("status", "l1_bits", "cycles", "toggles", "nreads", "nwrites"):
            if rtl[key] != net[key]:
                report.mismatches.append(f"{job.name}: netlist {key}={net[key]} rtl {rtl[key]}")
        if not np.array_equal(rtl_mem, net_mem):
            bad = np.argwhere(rtl_mem != net_mem)[:3].tolist()
            report.mismatches.append(f"{job.name}: netlist memory differs from rtl at {bad}")
        for label, answer, mem in (("rtl", rtl, rtl_mem), ("netlist", net, net_mem)):
            if answer["status"] != int(gold.status):
                report.mismatches.append(f"{job.name}: {label} status {answer['status']} "
                                         f"torch {int(gold.status)}")
            if not _same_l1(answer["l1_bits"], _f32_bits(gold.l1)):
                report.mismatches.append(f"{job.name}: {label} l1 bits {answer['l1_bits']:#x} "
                                         f"torch {_f32_bits(gold.l1):#x}")
            if not np.array_equal(mem, gold.mem):
                bad = np.argwhere(mem != gold.mem)[:3].tolist()
                report.mismatches.append(f"{job.name}: {label} memory differs from torch at {bad}")
    return report


def run_cocotb_subset(cfg: NMEConfig, testcase: str = COCOTB_SUBSET, *,
                      module: str = "cocotb_nme", seed: int = 0,
                      timeout_s: float = 1800.0) -> dict:
    """Run cocotb tests of the NME (``module``, names matching ``testcase``) on the netlist.

    The tests compare against the torch reference themselves; this only swaps the Verilog
    source of the cosimulation build for the gate-level netlist.

    Returns:
        :func:`coda.cosim.nme.build.run_cocotb`'s tally ``{"tests", "failed", "log", ...}``.
    Raises:
        CosimBuildError / CosimRunError as :func:`coda.cosim.nme.build.run_cocotb`.
    """
    from coda.cosim.nme.build import run_cocotb

    if str(TESTS_DIR) not in sys.path:   # the simulator's Python path is this one's
        sys.path.append(str(TESTS_DIR))
    build = build_sim(cfg, verilog=netlist_verilog(cfg)[0])
    env = {"CODA_COSIM_CFG": json.dumps(dataclasses.asdict(cfg)),
           "CODA_COSIM_LANES": str(cfg.lanes), "CODA_COSIM_MEM_WORDS": str(cfg.mem_words)}
    workdir = build_dir("synth", "netlist_cocotb", build.key)
    return run_cocotb(build, module, workdir, testcase=testcase, seed=seed, extra_env=env,
                      timeout_s=timeout_s)


@dataclass(frozen=True)
class NetlistCheckConfig:
    """Every option of ``coda netlist check`` with its default (the one source of them; a
    small NME by default: the gate-level simulation is slow). Checked when made: the NME's
    sizes (:meth:`nme`); ValueError naming the bad value."""
    lanes: int = option(2, "SIMD lanes")
    fmt: str = option(NMEConfig.fmt, "element format", choices=("bf16", "fp16"),
                      source="NMEConfig.fmt")
    depth: int = option(16, "buffer depth", unit="words")
    mem_words: int = option(4096, "rank-local memory size", unit="words")
    operand_isolation: str = option("on" if NMEConfig.operand_isolation else "off",
                                    "gate FU operand registers of idle lanes/units",
                                    choices=("on", "off"), source="NMEConfig.operand_isolation")
    seed: int = option(0, "seed of the equivalence jobs (and of the cocotb subset)")
    out: Path = option(None, "report folder", type=Path, default_text="build/synth/netlist_sim")
    cocotb: bool = option(False, f"also run the cosim cocotb tests {COCOTB_SUBSET!r} on the "
                          "netlist")

    def __post_init__(self):
        self.nme()

    def nme(self) -> NMEConfig:
        """The NME checked: lanes, format, depth, memory, operand isolation (ValueError from
        NMEConfig for a bad size)."""
        return NMEConfig(lanes=self.lanes, fmt=self.fmt, depth=self.depth,
                         mem_words=self.mem_words,
                         operand_isolation=self.operand_isolation == "on")


#: the config of ``coda netlist check``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = NetlistCheckConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda netlist check``: :class:`NetlistCheckConfig`."""
    add_options(parser, NetlistCheckConfig)


def main(cfg: NetlistCheckConfig) -> int:
    """``coda netlist check`` of ``cfg`` (its :class:`NetlistCheckConfig`): check one
    configuration, write a JSON report.

    Returns 0 when the netlist is equivalent on every job, 1 otherwise. Bad options:
    ValueError before any build (``coda: error:``, exit 2).
    """
    nme = cfg.nme()
    if cfg.out is not None:
        check_output_path(cfg.out, "--out", folder=True)
    report = check_equivalence(nme, seed=cfg.seed)
    out = Path(cfg.out) if cfg.out is not None else build_dir("synth", "netlist_sim")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"equivalence_l{nme.lanes}_{nme.fmt}.json"
    data = dict(report.__dict__, equivalent=report.equivalent)
    write_file(path, json_text(data, indent=1, default=str) + "\n")
    print(f"netlist of {nme}: {report.netlist.get('cells_total')} cells, "
          f"{report.jobs} jobs, {report.cycles} cycles; rtl {report.rtl_s} s, "
          f"netlist {report.netlist_s} s (builds included)")
    print("EQUIVALENT" if report.equivalent else "MISMATCH:\n  " + "\n  ".join(report.mismatches))
    ok = report.equivalent
    if cfg.cocotb:
        tally = run_cocotb_subset(nme, seed=cfg.seed)
        data["cocotb"] = {k: str(v) for k, v in tally.items()}
        print(f"cocotb subset on the netlist: {tally['tests']} tests, {tally['failed']} failed "
              f"({tally['seconds']:.0f} s, log {tally['log']})")
        ok = ok and tally["failed"] == 0 and tally["tests"] > 0
        write_file(path, json_text(data, indent=1, default=str) + "\n")
    print(f"report: {path}")
    return 0 if ok else 1
