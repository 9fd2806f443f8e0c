"""Build the Verilated cosimulation of one NME configuration, once, and launch it.

The simulator is ``cosim/nme/nme_top.sv`` (HDL clock, memory model, command feeder, job port) around
the NME's generated Verilog. A build (:func:`build_sim`) is cached in ``build/cosim/<key>/``
where ``key`` hashes the NME Verilog, the top, the flags and the harness parameters, so every
test session and every :class:`~coda.cosim.nme.rtl_backend.RTLBackend` of the same configuration
reuses one binary; :func:`run_cocotb` runs cocotb tests on it.

cocotb 2.1's Verilator runner always passes ``--public-flat-rw``, which makes every signal
VPI-visible and the model several times slower (docs/design.md, Toolchain facts);
:class:`LeanVerilator` drops it: only the ``tb_*`` signals of the top are public
(``/*verilator public_flat_rw*/``). ``build_sim(cfg, waves=True)`` is a separate, traced model
(FST waveforms; :func:`build_sim` has the details).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coda.cosim.shared_mem import MEM_CPP, SharedMemory
from coda.cosim.toolchain import build_dir, build_lock, cached_text, setup_verilator_env
from coda.hw.nme.isa import NMEConfig
from coda.jsonout import json_text

__all__ = ["SimBuild", "CosimBuildError", "CosimRunError", "LeanVerilator", "build_sim",
           "nme_verilog_cached",
           "sim_env", "sim_command", "run_cocotb", "failure_report", "log_tail", "waves_requested",
           "TOP_SV", "TOP_NAME", "DUT_NAME", "RSP_DEPTH", "CMD_DEPTH", "WAVES_FLAGS"]

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
# The traced model (build_sim(waves=True)): Verilator's FST writer, every level of the hierarchy.
# Signals whose names start with "_" (yosys temporaries) and arrays over 32 entries (the memory
# model, the command buffer) are left out by Verilator's defaults, which keeps files small.
WAVES_FLAGS = ["--trace-fst"]
#: The two functions of LZ4's stable API that Verilator's FST writer calls (lz4.h, LZ4 >= 1.7),
#: declared where the development header is missing; they link to the system's runtime liblz4.
LZ4_PROTOTYPES = """/* coda: lz4.h of the two LZ4 functions Verilator's FST writer uses (LZ4 stable API) */
#ifndef CODA_LZ4_H
#define CODA_LZ4_H
#ifdef __cplusplus
extern "C" {
#endif
int LZ4_compressBound(int inputSize);
int LZ4_compress_default(const char *src, char *dst, int srcSize, int dstCapacity);
#ifdef __cplusplus
}
#endif
#endif
"""


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
        waves: Verilated with FST tracing (:data:`WAVES_FLAGS`): runs can write waveforms.
    """
    path: Path
    key: str
    lanes: int
    mem_words: int
    has_toggles: bool
    build_seconds: float
    waves: bool = False

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
        """cocotb's Verilator runner without ``--public-flat-rw`` and with make flags; traced
        only when ``coda_waves`` says so (FST), never because of a ``WAVES`` variable."""

        coda_waves = False

        def _build_command(self):
            # cocotb's build() lets the WAVES environment variable override its argument, which
            # would put a traced binary under the untraced model's cache key
            self.waves = self.coda_waves
            cmds = super()._build_command()
            cmds[0] = ["--trace-fst" if a == "--trace" else a for a in cmds[0]
                       if a != "--public-flat-rw"]
            cmds[1] = cmds[1] + MAKE_FLAGS
            return cmds

    return _Lean


def LeanVerilator(waves: bool = False):
    """A cocotb Verilator runner that does not make every signal public (see module docstring);
    with ``waves`` its builds are traced to FST (``--trace-fst``, ``VM_TRACE=1``)."""
    runner = _load_verilator_runner()()
    runner.coda_waves = bool(waves)
    return runner


def waves_requested(env: dict | None = None) -> bool:
    """Whether the ``WAVES`` environment variable (of ``env``, default ``os.environ``) asks for
    waveforms, as cocotb reads it: ``1 yes y on true enable`` / ``0 no n off false disable`` or
    unset/empty (case-insensitive). Raises ValueError for any other value."""
    raw = (os.environ if env is None else env).get("WAVES", "")
    value = raw.strip().lower()
    if value in ("", "0", "no", "n", "off", "false", "disable"):
        return False
    if value in ("1", "yes", "y", "on", "true", "enable"):
        return True
    raise ValueError(f"WAVES={raw!r}: expected 1 (write FST waveforms) or 0")


@functools.lru_cache(maxsize=None)
def _system_lz4() -> bool:
    """True if the C++ compiler finds ``lz4.h`` and links ``-llz4`` (Debian: liblz4-dev)."""
    cxx = os.environ.get("CXX", "g++")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            res = subprocess.run(
                [cxx, "-x", "c++", "-", "-o", str(Path(tmp) / "a.out"), "-llz4"],
                input="#include <lz4.h>\nint main() { return LZ4_compressBound(1) > 0 ? 0 : 1; }\n",
                text=True, capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return res.returncode == 0


def _runtime_lz4() -> Path:
    """Path of the system's runtime LZ4 library (``liblz4.so.1``: Debian's liblz4-1, on every
    Debian/Ubuntu system). Raises CosimBuildError naming the package when there is none."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        listing = ""
    found = [line.split("=>")[-1].strip() for line in listing.splitlines()
             if line.strip().startswith("liblz4.so.1 ")]
    for path in found + sorted(str(p) for d in ("/usr/lib", "/usr/lib64", "/lib")
                               for p in Path(d).glob("**/liblz4.so.1")):
        if Path(path).is_file():
            return Path(path)
    raise CosimBuildError("a traced build (waveforms) needs LZ4 for Verilator's FST writer: "
                          "install liblz4-dev (or at least the runtime liblz4-1)")


def _waves_build_args(out: Path) -> tuple[list[str], str]:
    """Verilator arguments of a traced build in ``out`` and the LZ4 it uses: ``"system"``
    (lz4.h and -llz4 found), or ``"runtime"`` where only the runtime library is installed: a
    header declaring the two functions the FST writer calls (:data:`LZ4_PROTOTYPES`) and a
    link to the system's ``liblz4.so.1``."""
    if _system_lz4():
        return list(WAVES_FLAGS), "system"
    shim = out / "lz4-runtime"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "lz4.h").write_text(LZ4_PROTOTYPES)
    link = shim / "liblz4.so"
    link.unlink(missing_ok=True)
    link.symlink_to(_runtime_lz4())
    return list(WAVES_FLAGS) + ["-CFLAGS", f"-I{shim}", "-LDFLAGS", f"-L{shim}"], "runtime"


def _hw_sources_digest() -> str:
    """Hash of the hardware description (every .py file under hw/) and the Amaranth version."""
    import amaranth

    import coda.hw
    digest = hashlib.sha256(amaranth.__version__.encode())
    hw = Path(coda.hw.__file__).resolve().parent
    for path in sorted(hw.rglob("*.py")):
        digest.update(str(path.relative_to(hw)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def nme_verilog_cached(cfg: NMEConfig, measure_toggles: bool = False,
                       clock_gating: bool = False) -> str:
    """``coda.hw.verilog.nme_verilog(cfg, "coda_nme", measure_toggles=..., clock_gating=...)``,
    cached in ``build/cosim/verilog/``.

    Elaborating the NME takes tens of seconds; the cache key is the configuration and the
    hash of every ``hw/*.py`` source, so any change of the hardware regenerates it. It is
    generated under a lock (:func:`~coda.cosim.toolchain.build_lock`): the generated names
    depend on what the process elaborated before, so two processes (``make test``'s workers)
    that each generated the same configuration would get two texts, hence two Verilator
    builds of one NME; with the lock the second reads the first's file.
    Raises CosimBuildError if generation fails.
    """
    parts = [asdict(cfg), measure_toggles, _hw_sources_digest()] if measure_toggles else \
        [asdict(cfg), _hw_sources_digest()]
    if clock_gating:     # only then: the ungated NME keeps the key it always had
        parts.append({"clock_gating": True})
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    path = build_dir("cosim", "verilog") / f"{key[:20]}.v"

    def make() -> str:
        try:
            from coda.hw.verilog import nme_verilog
            return nme_verilog(cfg, DUT_NAME, measure_toggles=measure_toggles,
                               clock_gating=clock_gating)
        except Exception as exc:  # the message must say which config failed and why
            raise CosimBuildError(f"generating the NME Verilog for {cfg} failed: {exc!r}") \
                from exc
    return cached_text(path, make)


def build_sim(cfg: NMEConfig, *, verilog: str | None = None, force: bool = False,
              measure_toggles: bool = False, waves: bool = False,
              clock_gating: bool = False) -> SimBuild:
    """Build (or reuse) the cosimulation of the NME ``cfg``.

    Waveforms: ``build_sim(cfg, waves=True)`` is a separate model, Verilated with ``--trace-fst``
    and cached under ``build/cosim/waves-<key>/`` (its key hashes the trace flags too, so the
    default model, key and speed are those of an untraced build); :func:`sim_command` /
    :func:`run_cocotb` with ``waves=FILE.fst`` make it write an FST file of the whole run (every
    signal of the top and of the NME, hierarchical names, 1 ps resolution) that GTKWave and Surfer
    open. :func:`waves_requested` reads the ``WAVES`` environment variable the tests honour.

    Args:
        cfg: the NME configuration; ``cfg.lanes`` and ``cfg.mem_words`` size the memory model.
        verilog: Verilog text of a module named ``coda_nme`` with the NME port contract; default
            ``coda.hw.verilog.nme_verilog(cfg, "coda_nme")``.
        force: rebuild even if a cached build exists.
        measure_toggles: with the default Verilog, the NME with its simulation-only FU toggle
            counter (``dbg_fu_toggles``; the job answers' ``toggles``, else 0).
        waves: the traced model (FST, :data:`WAVES_FLAGS`): a separate build, cached under
            ``build/cosim/waves-<key>/`` (about 1.5x the default's build time); runs of it write
            waveforms when :func:`sim_command` / :func:`run_cocotb` are given a file, and run
            slower than the default model even without one.
        clock_gating: with the default Verilog, the NME with gated lane clocks
            (:class:`coda.hw.nme.top.NME`): the same bits and cycles, and Verilator evaluates
            a lane's registers only in the cycles they may load (about 1.5x the simulated
            cycles per second of the ungated NME: docs/results.md, Cosimulation speed).
    Returns:
        The :class:`SimBuild`. A cache hit costs only the Verilog generation and a hash.
    Raises:
        CosimBuildError: Verilog generation or the Verilator/C++ build failed (with log tail).
    """
    if not isinstance(cfg, NMEConfig):
        raise TypeError(f"cfg of type {type(cfg).__name__}: expected coda.hw.nme.isa.NMEConfig")
    if verilog is None:
        verilog = nme_verilog_cached(cfg, measure_toggles, clock_gating)
    tog_w = _toggle_width(verilog, DUT_NAME)
    params = {"LANES": cfg.lanes, "MEM_WORDS": cfg.mem_words, "RSP_DEPTH": RSP_DEPTH,
              "CMD_DEPTH": CMD_DEPTH, "TOG_W": tog_w or 64}
    defines = {"NME_MODULE": DUT_NAME}
    if tog_w:
        defines["HAS_DBG_FU_TOGGLES"] = 1
    import cocotb
    import verilator as _vwheel
    digest = hashlib.sha256()
    for part in (verilog, TOP_SV.read_text(), MEM_CPP.read_text(),
                 json.dumps([params, defines, BUILD_FLAGS,
                 MAKE_FLAGS, cocotb.__version__, getattr(_vwheel, "__version__", "?")])):
        digest.update(part.encode())
    waves = bool(waves)
    if waves:   # only then: the default model keeps the key (and cached binary) it always had
        lz4 = "system" if _system_lz4() else "runtime"
        digest.update(json.dumps({"waves": WAVES_FLAGS, "lz4": lz4}).encode())
    key = digest.hexdigest()[:16]
    out = build_dir("cosim", f"waves-{key}" if waves else key)
    with build_lock(out / ".lock"):
        stamp = out / "build.json"
        if stamp.exists() and not force and (out / TOP_NAME).exists():
            meta = json.loads(stamp.read_text())
            return SimBuild(out, key, cfg.lanes, cfg.mem_words, bool(tog_w), meta["build_seconds"],
                            waves)
        stamp.unlink(missing_ok=True)
        (out / f"{DUT_NAME}.v").write_text(verilog)
        setup_verilator_env()
        runner = LeanVerilator(waves)
        build_args = list(BUILD_FLAGS) + [str(MEM_CPP)]
        if waves:
            extra, _ = _waves_build_args(out)
            build_args += extra
        t0 = time.perf_counter()
        try:
            runner.build(sources=[out / f"{DUT_NAME}.v", TOP_SV], hdl_toplevel=TOP_NAME,
                         build_args=build_args, parameters=params, defines=defines,
                         build_dir=out, always=True, log_file=out / "build.log",
                         timescale=("1ns", "1ps"), waves=waves)
        except (RuntimeError, subprocess.CalledProcessError, SystemExit) as exc:
            raise CosimBuildError(f"Verilator build of {cfg} in {out} failed ({exc}):\n"
                                  + log_tail(out / "build.log")) from None
        seconds = time.perf_counter() - t0
        build = SimBuild(out, key, cfg.lanes, cfg.mem_words, bool(tog_w), seconds, waves)
        meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(build).items()}
        meta["cfg"] = {k: v for k, v in asdict(cfg).items()}
        stamp.write_text(json_text(meta, indent=1))
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
    # cocotb applies pytest's assertion rewriting to every module imported after its hook
    # ("*.py" by default: torch, sympy, ... 805 modules for tests/cocotb_nme.py), and where
    # bytecode is not written (PYTHONDONTWRITEBYTECODE) it compiles each of them again at every
    # simulator start: 25 s of each start here. Only the test module's own file is rewritten.
    env.setdefault("COCOTB_REWRITE_ASSERTION_FILES", f"{test_module.rsplit('.', 1)[-1]}.py")
    env["COCOTB_RANDOM_SEED"] = str(seed)
    env["COCOTB_TRUST_INERTIAL_WRITES"] = "1"
    env["COCOTB_ANSI_OUTPUT"] = "0"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def _check_waves_file(build: SimBuild, waves) -> Path:
    """``waves`` as an absolute path the traced ``build`` can write its FST to. Raises
    ValueError when the build is not traced or the path is not a file path ending in .fst."""
    if not build.waves:
        raise ValueError(f"waves={str(waves)!r}: the simulator in {build.path} is not traced; "
                         f"build it with build_sim(..., waves=True)")
    path = Path(waves)
    if path.suffix != ".fst" or path.is_dir():
        raise ValueError(f"waves={str(waves)!r}: expected an .fst file path")
    return path.resolve()


def sim_command(build: SimBuild, workdir: Path, *, waves: str | os.PathLike | None = None,
                memory: str | os.PathLike | None = None) -> list[str]:
    """Command line of the simulator with the top's file plusargs pointing into ``workdir``.

    ``memory``: the file of the top's memory (:class:`coda.cosim.shared_mem.SharedMemory`,
    created by the caller before the simulator starts); default ``workdir/mem.shm``.

    With ``waves`` (an ``.fst`` path; the build must have ``waves=True``) the simulator writes
    the FST waveform of the whole run there (complete once the process has ended; folders are
    created). Raises ValueError for ``waves`` on an untraced build or a path not ending in .fst.
    """
    workdir = Path(workdir).resolve()   # the simulator runs there: relative paths would nest
    memory = workdir / "mem.shm" if memory is None else Path(memory).resolve()
    cmd = [str(build.binary), f"+MEM_SHM={memory}", f"+CMD_IN={workdir / 'cmd_in.hex'}"]
    if waves is not None:
        path = _check_waves_file(build, waves)   # absolute: the simulator runs in workdir
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)             # no stale waveform if the run dies at start
        cmd += ["--trace", "--trace-file", str(path)]
    return cmd


def run_cocotb(build: SimBuild, test_module: str, workdir: Path, *, testcase: str | None = None,
               seed: int = 0, extra_env: dict | None = None, timeout_s: float = 900.0,
               waves: str | os.PathLike | None = None) -> dict:
    """Run cocotb tests of ``test_module`` on ``build`` and return their tally.

    Args:
        build: the simulator.
        test_module: dotted module holding ``@cocotb.test`` functions.
        workdir: folder for hex files, the log and the results XML (created).
        testcase: regular expression selecting test names (default all).
        seed: COCOTB_RANDOM_SEED.
        extra_env: more environment variables (test parameters).
        timeout_s: wall-clock limit (s); the simulator is killed past it.
        waves: an ``.fst`` file for the waveform of the run (all selected tests, one after
            the other in simulated time; the build must be traced, ``build_sim(waves=True)``).
    Returns:
        ``{"tests": n, "failed": k, "log": path, "results": path, "seconds": wall time,
        "returncode": exit status, "waves": the FST path or None}``.
    Raises:
        CosimRunError: the simulator timed out or left no results (with the log tail).
        ValueError: ``waves`` on an untraced build, or not an .fst path.
    """
    from cocotb_tools.check_results import get_results

    workdir = Path(workdir).resolve()   # the simulator runs there: relative paths would nest
    workdir.mkdir(parents=True, exist_ok=True)
    results = workdir / "results.xml"
    results.unlink(missing_ok=True)
    extra = dict(extra_env or {})
    extra["COCOTB_RESULTS_FILE"] = str(results)
    if testcase:
        extra["COCOTB_TEST_FILTER"] = testcase
    env = sim_env(test_module, seed=seed, extra=extra)
    log = workdir / "sim.log"
    command = sim_command(build, workdir, waves=waves)
    waves = Path(command[-1]) if waves is not None else None
    t0 = time.perf_counter()
    memory = SharedMemory.create(workdir / "mem.shm", build.lanes, build.mem_words)
    try:
        with open(log, "w") as fh:
            proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=fh,
                                    stderr=subprocess.STDOUT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise CosimRunError(f"cocotb run of {test_module} exceeded {timeout_s} s:\n"
                                    + log_tail(log)) from None
    finally:
        memory.close(unlink=True)
    try:
        ntests, nfailed = get_results(results)
    except RuntimeError as exc:
        raise CosimRunError(f"no cocotb results from {test_module} (exit {proc.returncode}): "
                            f"{exc}\n" + log_tail(log)) from None
    return {"tests": ntests, "failed": nfailed, "log": log, "results": results,
            "seconds": time.perf_counter() - t0, "returncode": proc.returncode, "waves": waves}


def _failed_tests(results: Path) -> list[str]:
    """Names of the failed test cases in a cocotb results XML ([] if it cannot be read)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(results).getroot()
    except (OSError, ET.ParseError):
        return []
    return [case.get("name", "?") for case in root.iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None]


def failure_report(tally: dict, lines: int = 80) -> str:
    """What a test prints when cocotb tests of a :func:`run_cocotb` tally failed: how many and
    which, the log, the FST waveform of the run (or how to get one: ``WAVES=1`` /
    ``pytest --waves``), then the last ``lines`` lines of the log."""
    names = _failed_tests(Path(tally["results"]))
    waves = tally.get("waves")
    where = (f"waveform {waves}" if waves else
             "no waveform: rerun with WAVES=1 or pytest --waves for one")
    return (f"{tally['failed']} of {tally['tests']} cocotb tests failed"
            + (f" ({', '.join(names)})" if names else "")
            + f"; log {tally['log']}; {where}:\n{log_tail(tally['log'], lines)}")
