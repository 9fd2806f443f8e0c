"""Build the Verilated cosimulation of one NME configuration, once, and launch it.

The simulator is ``cosim/nme_top.sv`` (HDL clock, memory model, command feeder, job port) around
the NME's generated Verilog. A build is cached in ``build/cosim/<key>/`` where ``key`` hashes the
NME Verilog, the top, the flags and the harness parameters, so every test session and every
:class:`~coda.cosim.rtl_backend.RTLBackend` of the same configuration reuses one binary.

cocotb 2.1's Verilator runner always passes ``--public-flat-rw``, which makes every signal
VPI-visible and the model several times slower (../shared/DESIGN.md §6); :class:`LeanVerilator`
drops it: only the ``tb_*`` signals of the top are public (``/*verilator public_flat_rw*/``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coda.cosim.toolchain import build_dir, setup_verilator_env
from coda.hw.isa import NMEConfig

__all__ = ["SimBuild", "CosimBuildError", "CosimRunError", "LeanVerilator", "build_sim",
           "nme_verilog_cached",
           "sim_env", "sim_command", "run_cocotb", "log_tail", "TOP_SV", "TOP_NAME",
           "DUT_NAME", "RSP_DEPTH", "CMD_DEPTH"]

TOP_SV = Path(__file__).resolve().parent / "nme_top.sv"
TOP_NAME = "nme_tb_top"
DUT_NAME = "coda_nme"
RSP_DEPTH = 512   # read responses in flight the memory model holds (NME keeps far fewer)
CMD_DEPTH = 512   # command words per job: header + up to 255 micro-ops fits

# Amaranth's Verilog trips these lint warnings (fatal by default); they are style, not bugs:
# width changes in generated arithmetic, unused bits of flattened structs, Amaranth's
# comb-loop-free but multi-driven-looking processes.
LINT_FLAGS = [
    "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-WIDTH", "-Wno-UNOPTFLAT", "-Wno-UNUSEDSIGNAL",
    "-Wno-UNUSEDPARAM", "-Wno-UNDRIVEN", "-Wno-CASEINCOMPLETE", "-Wno-CASEOVERLAP",
    "-Wno-PINCONNECTEMPTY", "-Wno-DECLFILENAME", "-Wno-MULTIDRIVEN", "-Wno-LATCH",
    "-Wno-BLKSEQ", "-Wno-SYNCASYNCNET", "-Wno-PROCASSINIT", "-Wno-INITIALDLY", "-Wno-CMPCONST",
    "-Wno-VARHIDDEN", "-Wno-TIMESCALEMOD", "-Wno-ASCRANGE",
]
BUILD_FLAGS = ["--timing", "-O3", "--x-assign", "fast", "--x-initial", "fast",
               "-CFLAGS", "-std=c++20 -fcoroutines"] + LINT_FLAGS
# The wheel's verilated.mk was configured without the flag that includes a precompiled header
# (CFG_CXXFLAGS_PCH_I is empty), so designs big enough to be split into several C++ files fail to
# compile ("Vtop__pch.h.fast: linker input file not found"); GCC's flag is -include.
MAKE_FLAGS = ["CFG_CXXFLAGS_PCH_I=-include"]


class CosimBuildError(RuntimeError):
    """Generating or Verilating the cosimulation failed; the message ends with the log tail."""


class CosimRunError(RuntimeError):
    """The simulator died, hung or reported a protocol error; the message has its log tail."""


@dataclass(frozen=True)
class SimBuild:
    """A built cosimulation binary.

    Attributes:
        path: build folder holding the binary ``nme_tb_top`` and ``build.log``.
        key: hash of everything the binary depends on.
        lanes, mem_words: the memory geometry of the top (words of ``16*lanes`` bits).
        has_toggles: the NME exposes ``dbg_fu_toggles`` (operand-isolation measurement).
        build_seconds: wall time of the Verilator + C++ build that made it (s).
    """
    path: Path
    key: str
    lanes: int
    mem_words: int
    has_toggles: bool
    build_seconds: float

    @property
    def binary(self) -> Path:
        return self.path / TOP_NAME


def log_tail(path: Path, lines: int = 40) -> str:
    """Last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _toggle_width(verilog: str, name: str) -> int | None:
    """Width of the ``dbg_fu_toggles`` output of module ``name`` in ``verilog``, or None."""
    body = verilog.split(f"module {name}(", 1)
    if len(body) < 2:
        body = verilog.split(f"module {name} (", 1)
    if len(body) < 2:
        raise CosimBuildError(f"no module {name!r} in the generated Verilog")
    header = body[1].split("endmodule", 1)[0]
    m = re.search(r"output\s+(?:wire\s+|reg\s+|logic\s+)?(?:\[(\d+):0\]\s*)?dbg_fu_toggles\b",
                  header)
    if m is None:
        return None
    return int(m.group(1)) + 1 if m.group(1) else 1


def _load_verilator_runner():
    from cocotb_tools.runner import Verilator

    class _Lean(Verilator):
        """cocotb's Verilator runner without ``--public-flat-rw`` and with make flags."""

        def _build_command(self):
            cmds = super()._build_command()
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            cmds[1] = cmds[1] + MAKE_FLAGS
            return cmds

    return _Lean


def LeanVerilator():
    """A cocotb Verilator runner that does not make every signal public (see module docstring)."""
    return _load_verilator_runner()()


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _hw_sources_digest() -> str:
    """Hash of the hardware description (every hw/*.py) and the Amaranth version."""
    import amaranth

    import coda.hw
    digest = hashlib.sha256(amaranth.__version__.encode())
    for path in sorted(Path(coda.hw.__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def nme_verilog_cached(cfg: NMEConfig, measure_toggles: bool = False) -> str:
    """``coda.hw.verilog.nme_verilog(cfg, "coda_nme", measure_toggles=...)``, cached in
    ``build/cosim/verilog/``.

    Elaborating the NME takes tens of seconds; the cache key is the configuration and the
    hash of every ``hw/*.py`` source, so any change of the hardware regenerates it.
    Raises CosimBuildError if generation fails.
    """
    key = hashlib.sha256(json.dumps([asdict(cfg), measure_toggles, _hw_sources_digest()]
                                    if measure_toggles else [asdict(cfg), _hw_sources_digest()]
                                    ).encode()).hexdigest()
    path = build_dir("cosim", "verilog") / f"{key[:20]}.v"
    if path.exists():
        return path.read_text()
    try:
        from coda.hw.verilog import nme_verilog
        verilog = nme_verilog(cfg, DUT_NAME, measure_toggles=measure_toggles)
    except Exception as exc:  # the message must say which config failed and why
        raise CosimBuildError(f"generating the NME Verilog for {cfg} failed: {exc!r}") from exc
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(verilog)
    tmp.replace(path)
    return verilog


def build_sim(cfg: NMEConfig, *, verilog: str | None = None, force: bool = False,
              measure_toggles: bool = False) -> SimBuild:
    """Build (or reuse) the cosimulation of the NME ``cfg``.

    Args:
        cfg: the NME configuration; ``cfg.lanes`` and ``cfg.mem_words`` size the memory model.
        verilog: Verilog text of a module named ``coda_nme`` with the NME port contract; default
            ``coda.hw.verilog.nme_verilog(cfg, "coda_nme")``.
        force: rebuild even if a cached build exists.
        measure_toggles: with the default Verilog, the NME with its simulation-only FU toggle
            counter (``dbg_fu_toggles``; the job answers' ``toggles``, else 0).
    Returns:
        The :class:`SimBuild`. A cache hit costs only the Verilog generation and a hash.
    Raises:
        CosimBuildError: Verilog generation or the Verilator/C++ build failed (with log tail).
    """
    if not isinstance(cfg, NMEConfig):
        raise TypeError(f"cfg of type {type(cfg).__name__}: expected coda.hw.isa.NMEConfig")
    if verilog is None:
        verilog = nme_verilog_cached(cfg, measure_toggles)
    tog_w = _toggle_width(verilog, DUT_NAME)
    params = {"LANES": cfg.lanes, "MEM_WORDS": cfg.mem_words, "RSP_DEPTH": RSP_DEPTH,
              "CMD_DEPTH": CMD_DEPTH, "TOG_W": tog_w or 64}
    defines = {"NME_MODULE": DUT_NAME}
    if tog_w:
        defines["HAS_DBG_FU_TOGGLES"] = 1
    import cocotb
    import verilator as _vwheel
    digest = hashlib.sha256()
    for part in (verilog, TOP_SV.read_text(), json.dumps([params, defines, BUILD_FLAGS,
                 MAKE_FLAGS, cocotb.__version__, getattr(_vwheel, "__version__", "?")])):
        digest.update(part.encode())
    key = digest.hexdigest()[:16]
    out = build_dir("cosim", key)
    with _locked(out / ".lock"):
        stamp = out / "build.json"
        if stamp.exists() and not force and (out / TOP_NAME).exists():
            meta = json.loads(stamp.read_text())
            return SimBuild(out, key, cfg.lanes, cfg.mem_words, bool(tog_w), meta["build_seconds"])
        stamp.unlink(missing_ok=True)
        (out / f"{DUT_NAME}.v").write_text(verilog)
        setup_verilator_env()
        runner = LeanVerilator()
        t0 = time.perf_counter()
        try:
            runner.build(sources=[out / f"{DUT_NAME}.v", TOP_SV], hdl_toplevel=TOP_NAME,
                         build_args=BUILD_FLAGS, parameters=params, defines=defines,
                         build_dir=out, always=True, log_file=out / "build.log",
                         timescale=("1ns", "1ps"))
        except (RuntimeError, subprocess.CalledProcessError, SystemExit) as exc:
            raise CosimBuildError(f"Verilator build of {cfg} in {out} failed ({exc}):\n"
                                  + log_tail(out / "build.log")) from None
        seconds = time.perf_counter() - t0
        build = SimBuild(out, key, cfg.lanes, cfg.mem_words, bool(tog_w), seconds)
        meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(build).items()}
        meta["cfg"] = {k: v for k, v in asdict(cfg).items()}
        stamp.write_text(json.dumps(meta, indent=1))
        return build


def sim_env(test_module: str, *, seed: int = 0, extra: dict | None = None) -> dict[str, str]:
    """Environment for running the simulator binary with cocotb tests from ``test_module``.

    Mirrors what cocotb's runner sets for a test run (GPI entry points, libpython, the Python
    path of this interpreter) so the binary can be started directly with :mod:`subprocess`.
    """
    import cocotb_tools.config
    import find_libpython

    env = dict(os.environ)
    setup_verilator_env(env)
    libpython = env.get("LIBPYTHON_LOC") or find_libpython.find_libpython()
    if libpython is None:
        raise CosimBuildError("libpython not found: cocotb cannot embed Python in the simulator")
    env["PATH"] = env["PATH"] + os.pathsep + str(cocotb_tools.config.libs_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYGPI_PYTHON_BIN"] = sys.executable
    env["GPI_USERS"] = ";".join([libpython, cocotb_tools.config.pygpi_entry_point()])
    env["COCOTB_TOPLEVEL"] = TOP_NAME
    env["TOPLEVEL_LANG"] = "verilog"
    env["COCOTB_TEST_MODULES"] = test_module
    env["COCOTB_RANDOM_SEED"] = str(seed)
    env["COCOTB_TRUST_INERTIAL_WRITES"] = "1"
    env["COCOTB_ANSI_OUTPUT"] = "0"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def sim_command(build: SimBuild, workdir: Path) -> list[str]:
    """Command line of the simulator with the top's file plusargs pointing into ``workdir``."""
    workdir = Path(workdir)
    return [str(build.binary), f"+MEM_IN={workdir / 'mem_in.hex'}",
            f"+MEM_OUT={workdir / 'mem_out.hex'}", f"+CMD_IN={workdir / 'cmd_in.hex'}"]


def run_cocotb(build: SimBuild, test_module: str, workdir: Path, *, testcase: str | None = None,
               seed: int = 0, extra_env: dict | None = None, timeout_s: float = 900.0) -> dict:
    """Run cocotb tests of ``test_module`` on ``build`` and return their tally.

    Args:
        build: the simulator.
        test_module: dotted module holding ``@cocotb.test`` functions.
        workdir: folder for hex files, the log and the results XML (created).
        testcase: regular expression selecting test names (default all).
        seed: COCOTB_RANDOM_SEED.
        extra_env: more environment variables (test parameters).
        timeout_s: wall-clock limit (s); the simulator is killed past it.
    Returns:
        ``{"tests": n, "failed": k, "log": path, "results": path, "seconds": wall time}``.
    Raises:
        CosimRunError: the simulator timed out or left no results (with the log tail).
    """
    from cocotb_tools.check_results import get_results

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    results = workdir / "results.xml"
    results.unlink(missing_ok=True)
    extra = dict(extra_env or {})
    extra["COCOTB_RESULTS_FILE"] = str(results)
    if testcase:
        extra["COCOTB_TEST_FILTER"] = testcase
    env = sim_env(test_module, seed=seed, extra=extra)
    log = workdir / "sim.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(sim_command(build, workdir), cwd=workdir, env=env, stdout=fh,
                                stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise CosimRunError(f"cocotb run of {test_module} exceeded {timeout_s} s:\n"
                                + log_tail(log)) from None
    try:
        ntests, nfailed = get_results(results)
    except RuntimeError as exc:
        raise CosimRunError(f"no cocotb results from {test_module} (exit {proc.returncode}): "
                            f"{exc}\n" + log_tail(log)) from None
    return {"tests": ntests, "failed": nfailed, "log": log, "results": results,
            "seconds": time.perf_counter() - t0, "returncode": proc.returncode}
