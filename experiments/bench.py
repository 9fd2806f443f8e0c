"""``coda bench`` (``make bench``): the DIMM-NMP design-space sweep, the DRAM controller
alone, and the cosimulation's speed, in ``build/bench/``.

:func:`main` runs, in order and each skippable: the design-space sweep
(:func:`coda.experiments.design_space.sweep`, through the sweep engine :mod:`coda.sweep`;
``build/bench/dse.json``), the DRAM controller alone
(:func:`coda.cosim.dram.bench.bench_dram`), the NME cosimulation's speed on an ideal memory
(:func:`coda.cosim.nme.speed.measure`), cosimulated ``coda run`` generations on the ideal and
the DRAM-timed memory (against :data:`DRAM_SPEED_TARGET`), a whole DIMM-NMP
(:func:`coda.cosim.nmp.measure.measure_nmp`), and the speed of checks whose tests assert
behaviour only (:func:`gpu_check_timing`, :func:`address_check_timing`,
:func:`serving_timing`). It prints steps 3 to 6 as one JSON object and writes it to
``--out`` (default ``build/bench/cosim.json``). It takes the command's :class:`BenchConfig`
(``CONFIG``; the CLI builds it from the command line, a caller may build it directly). Each
step in detail: ``docs/cli.md``, "coda bench".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coda.experiments.design_space import (KNEE_TOLERANCE, SWEEP_CLOCKS, SWEEP_DEPTHS, SWEEP_DRAMS,
                                     SWEEP_LANES, SWEEP_STREAM_BYTES, SWEEP_UNITS, clock_label,
                                     knees, parse_clocks, recorded_rows, sweep, write_dse)
from coda.experiments.design_space_report import plot_sweep, print_knees, print_sweep
from coda.cosim.dram.bench import bench_dram
from coda.cosim.nme.speed import measure
from coda.cosim.nme.units import parse_units, units_label
from coda.cosim.nmp.measure import measure_nmp, mem_words
from coda.experiments.synth_area import SYNTH_ROOT, synth_areas
from coda.hw.dram.standards import DEFAULT_STANDARD
from coda.hw.nme.isa import NMEConfig
from coda.hw.nmp import NMP_DEPTH
from coda.jsonout import json_text
from coda.options import add_options, option
from coda.paths import check_output_path, write_file
from coda.sweep import RayOptions

__all__ = ["NMP_STREAM_BYTES", "GPU_CHECK_CPU_TARGET_S", "DRAM_SPEED_TARGET", "gpu_check_timing",
           "address_check_timing", "SERVING_TARGET_S", "serving_timing", "BenchConfig", "CONFIG",
           "configure", "main"]

#: bytes per stream of the 2 x 2 DIMM-NMP figures of ``make bench``
NMP_STREAM_BYTES = 256 << 10
#: the most the ideal-memory generation's cycles/s may be of the DRAM-timed one's (issue 60:
#: the DRAM-timed DIMM-NMP, ``coda run``'s default, within 1.5x of the ideal path's speed)
DRAM_SPEED_TARGET = 1.5
#: the memories ``--run-memories`` chooses from (``coda run --memory``)
RUN_MEMORIES = ("ideal", "dram")
#: seconds the GPU check's CPU run (:data:`coda.experiments.gpu_check.CPU_CHECK`) should take
#: at most on a small CPU-only machine, start to exit
GPU_CHECK_CPU_TARGET_S = 60.0
#: issue 62's bound on a 1,000-request serving simulation (coda serve), wall seconds
SERVING_TARGET_S = 60.0
GPU_CHECK_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@dataclass(frozen=True)
class BenchConfig(RayOptions):
    """Every option of ``coda bench`` with its default (the one source of them; where its
    points run: :class:`coda.sweep.RayOptions`, as every sweep's).

    Checked when made, before any build: ``--run-memories`` (:func:`_run_memories`) and the
    design-space options (:func:`_sweep_grid`); ValueError naming the option."""
    lanes: int = option(NMEConfig.lanes, "NME lanes of the NME-alone speed run")
    fmt: str = option(NMEConfig.fmt, "NME format", choices=("bf16", "fp16"))
    mem_words: int = option(NMEConfig.mem_words, "NME memory of the NME-alone run", unit="words")
    depth: int = option(NMEConfig.depth, "NME buffer depth of the NME-alone run", unit="words",
                        source="NMEConfig.depth")
    out: Path = option(Path("build/bench/cosim.json"), "the cosimulation speed JSON (dram.json "
                       "and dse.json go beside it)")
    nmp_dimms: int = option(2, "DIMMs of the DIMM-NMP")
    nmp_ranks: int = option(2, "ranks per DIMM of the DIMM-NMP")
    nmp_dram: str = option(DEFAULT_STANDARD, "DRAM standard of the DIMM-NMP")
    nmp_lanes: int = option(8, "NME lanes of the DIMM-NMP (8: 16 B per NME cycle, twice DDR5's "
                            "8 B/tCK)")
    nmp_depth: int = option(NMP_DEPTH, "NME buffer depth of the DIMM-NMP (words per stream "
                            "block)", unit="words", source="coda.hw.nmp.NMP_DEPTH: 88 % of "
                            "DDR5-4800's peak where 64 words reach 81 %")
    nmp_flags: str = option(None, "comma-separated FLAG_SETS keys to compare, or 'all'",
                            type=str, default_text="the backend's default set only")
    skip_nme: bool = option(False, "only the DIMM-NMP figures")
    run_prompts: str = option("0,1", "prompts of the cosimulated generations, the same on "
                              "every --run-memories ('' = none)")
    run_memories: str = option(",".join(RUN_MEMORIES), "memories of the cosimulated "
                               "generations (coda run --memory; dram: the DIMM-NMP of "
                               "--nmp-dram)")
    skip_dram: bool = option(False, "leave out the DRAM controller replays (build/bench/dram.json)")
    skip_checks: bool = option(False, "leave out the timings of the GPU check on the CPU and of "
                               "coda sweep's address check")
    sweep_lanes: str = option(",".join(map(str, SWEEP_LANES)), "lanes of the design-space "
                              "sweep ('' = no sweep)")
    sweep_depths: str = option(",".join(map(str, SWEEP_DEPTHS)), "buffer depths of the sweep",
                               unit="words")
    sweep_clocks: str = option(",".join(clock_label(c) for c in SWEEP_CLOCKS), "NME clocks of "
                               "the sweep in MHz, 'dram' for the NME on the DRAM clock (no "
                               "crossing); each at most the standard's DRAM clock")
    sweep_drams: str = option(",".join(SWEEP_DRAMS), "DRAM standards of the sweep")
    sweep_stream_bytes: int = option(SWEEP_STREAM_BYTES, "bytes per stream of the sweep's "
                                     "programs", unit="bytes")
    sweep_units: str = option(SWEEP_UNITS, "NME units of every sweep point: register stages in "
                              "each FPMul, each FPAdd, and after the buffers (NMEConfig "
                              "mul_latency, add_latency, operand_latency; 5,7,1, the default "
                              "NME's, places and routes on ECP5 at about 100 MHz; 0,0,0 is "
                              "combinational)",
                              metavar="M,A,O")
    knee_tolerance: float = option(KNEE_TOLERANCE, "the knee: fewest lanes within this share "
                                   "of the best utilisation")
    sweep_only: bool = option(False, "only the design-space sweep")
    sweep_report_only: bool = option(False, "measure nothing: tables, dse.json and dse.png of "
                                     "the sweep records already in build/bench/dse/ (any code "
                                     "version) matching the options")

    def __post_init__(self):
        _run_memories(self.run_memories)
        _sweep_grid(self)


#: the config of ``coda bench``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = BenchConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda bench``: :class:`BenchConfig` (where its points run included)."""
    add_options(parser, BenchConfig)


def main(cfg: BenchConfig) -> int:
    """Run ``coda bench`` of ``cfg`` (its :class:`BenchConfig`): the design-space sweep (unless
    ``--sweep-lanes ''``), then (unless ``--sweep-only``) the DRAM replays and the
    cosimulation speed; returns 0, or 1 when ``--sweep-report-only`` finds no records."""
    # every option is checked before any build (ValueError: ``coda: error:``, exit 2): the
    # values when the config was made, the output path here
    out = check_output_path(cfg.out, "--out")
    grid = _sweep_grid(cfg)
    if grid["lanes"]:
        if not _design_space(cfg, grid):
            return 1
        if cfg.sweep_only or cfg.sweep_report_only:
            return 0
    if not cfg.skip_dram:
        bench_dram(out=out.with_name("dram.json"))
    result = _cosim_speed(cfg)
    if not cfg.skip_checks:
        result["checks"] = {"gpu_check_cpu": gpu_check_timing(out.with_name("gpu_check")),
                            "sweep_address_check": address_check_timing(),
                            "serving_1000": serving_timing()}
    text = json_text(result, indent=1)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, text + "\n")
    return 0


def _ints(text: str, flag: str) -> list[int]:
    """The comma-separated ints of an option (``''``: none); ValueError naming it."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated ints") from None


def _sweep_grid(cfg: BenchConfig) -> dict:
    """The design-space options of ``cfg`` read and checked: ``lanes``, ``depths`` (ints),
    ``clocks`` (MHz, 0: on the DRAM clock), ``drams`` (names), ``units`` (``"M,A,O"``). Raises
    ValueError naming the option for a bad value, a knee tolerance outside (0, 1], no
    standard, or a clock faster than the fastest standard's DRAM clock (a clock faster only
    than a slower standard's is left out for that one: the sweep says so)."""
    grid = {"lanes": _ints(cfg.sweep_lanes, "--sweep-lanes"),
            "depths": _ints(cfg.sweep_depths, "--sweep-depths"),
            "clocks": parse_clocks(cfg.sweep_clocks),
            "drams": [v.strip() for v in cfg.sweep_drams.split(",") if v.strip()],
            "units": units_label(parse_units(cfg.sweep_units, "--sweep-units"))}
    if not 0 < cfg.knee_tolerance <= 1:
        raise ValueError(f"--knee-tolerance {cfg.knee_tolerance}: expected 0 < t <= 1")
    from coda.hw.dram.standards import get_standard
    from coda.hw.nmp import check_nme_mhz
    fastest = max((get_standard(s) for s in grid["drams"]), key=lambda s: -s.tCK_ns,
                  default=None)
    if fastest is None:
        raise ValueError("--sweep-drams: expected at least one standard")
    for c in grid["clocks"]:
        if c:
            check_nme_mhz(c, fastest)
    return grid


def _design_space(cfg: BenchConfig, grid: dict) -> bool:
    """The design-space sweep of ``grid`` (:func:`_sweep_grid`) measured (or with
    ``--sweep-report-only`` the records already there), ``dse.json``, ``dse.png`` and the two
    tables; False (said on stdout) when ``--sweep-report-only`` finds no records."""
    sweep_json = Path(cfg.out).with_name("dse.json")
    t0 = time.perf_counter()
    if cfg.sweep_report_only:
        rows = recorded_rows(sweep_json.with_suffix(""), grid["lanes"], grid["depths"],
                             cfg.fmt, grid["drams"], cfg.sweep_stream_bytes, grid["clocks"],
                             units=grid["units"])
        if not rows:
            print(f"no sweep records matching the options (units {grid['units']}) in "
                  f"{sweep_json.with_suffix('')}")
            return False
        write_dse(sweep_json, rows, grid["drams"], cfg.fmt, grid["clocks"],
                  cfg.sweep_stream_bytes, cfg.knee_tolerance, units=grid["units"])
    else:
        rows = sweep(grid["lanes"], grid["depths"], cfg.fmt, grid["drams"],
                     cfg.sweep_stream_bytes, out=sweep_json, clocks=grid["clocks"],
                     workers=cfg.workers, sequential=cfg.sequential,
                     address=cfg.address, tolerance=cfg.knee_tolerance,
                     units=grid["units"])
    plot_sweep(rows, sweep_json.with_suffix(".png"))
    print_sweep(rows)
    print_knees(knees(rows, cfg.knee_tolerance), synth_areas(SYNTH_ROOT, cfg.fmt,
                                                              grid["units"]))
    print(f"sweep: {sweep_json}, {sweep_json.with_suffix('.png')} "
          f"({time.perf_counter() - t0:.0f} s)")
    return True


def _cosim_speed(cfg: BenchConfig) -> dict:
    """The JSON of ``--out``: the NME's cosimulation speed (:func:`measure`, unless
    ``--skip-nme``) and ``dimm_nmp``: :func:`measure_nmp` of the ``--nmp-*`` system with
    :data:`NMP_STREAM_BYTES` per stream, once per ``--nmp-flags`` set."""
    nme = NMEConfig(lanes=cfg.lanes, fmt=cfg.fmt, mem_words=cfg.mem_words, depth=cfg.depth)
    result = {} if cfg.skip_nme else measure(nme)
    if not cfg.skip_nme:
        result["rtl_generation"] = _rtl_generations(cfg, result["ceiling"])
    from coda.cosim.nmp.build import FLAG_SETS
    flag_sets = ([None] if cfg.nmp_flags is None else
                 list(FLAG_SETS) if cfg.nmp_flags == "all" else cfg.nmp_flags.split(","))
    # 256 KiB per stream (the 2 x 2 and NME-clock figures of docs/results.md)
    words = NMP_STREAM_BYTES // (2 * cfg.nmp_lanes)
    ncfg = NMEConfig(lanes=cfg.nmp_lanes, fmt=cfg.fmt, depth=cfg.nmp_depth,
                     mem_words=mem_words(words))
    result["dimm_nmp"] = [measure_nmp(ncfg, cfg.nmp_dram, cfg.nmp_dimms, cfg.nmp_ranks, f,
                                      stream_words=words) for f in flag_sets]
    return result


def _run_memories(text: str) -> list[str]:
    """The memories of ``--run-memories`` (comma-separated, of :data:`RUN_MEMORIES`).
    Raises ValueError naming the option and the bad value."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    for name in names:
        if name not in RUN_MEMORIES:
            raise ValueError(f"--run-memories {text!r}: {name!r} is not a memory, expected "
                             f"some of {', '.join(RUN_MEMORIES)}")
    return names


def _rtl_generations(cfg: BenchConfig, ceiling: dict) -> dict:
    """Step 4 (``docs/cli.md``, "coda bench"): ``coda run`` of ``--run-prompts`` on every memory of
    ``--run-memories``, every prompt through the RTL; their cosimulation figures, the ideal
    run's ``ceiling_ratio`` (ceiling cycles/s over its own) and, with both,
    ``ideal_over_dram`` against :data:`DRAM_SPEED_TARGET`."""
    from coda.experiments import run as coda_run

    out = {"ceiling_cycles_per_s": ceiling["cycles_per_s"]}
    prompts = cfg.run_prompts
    for name in _run_memories(cfg.run_memories) if prompts else []:
        folder = Path(cfg.out).with_name(f"run-{name}")
        argv = ["--out", str(folder), "--prompts", prompts, "--memory", name] + (
            ["--dram", cfg.nmp_dram] if name == "dram" else [])
        run_cfg = coda_run.RunConfig(out=str(folder), prompts=prompts, memory=name,
                                     **({"dram": cfg.nmp_dram} if name == "dram" else {}))
        t0 = time.perf_counter()
        coda_run.main(run_cfg)
        report = json.loads((folder / "report.json").read_text())
        out[name] = {"command": "coda run " + " ".join(argv), "dram": report["dram"],
                     "nme_mhz": report["nme_mhz"], "prompts": report["rtl"]["prompts"],
                     "bit_exact_rtl_vs_torch": report["bit_exact_rtl_vs_torch"],
                     "nme_programs": report["rtl"]["nme_programs"],
                     "sim_cycles_per_s": round(report["sim_cycles_per_s"]),
                     "cached_generation_s": round(report["rtl"]["cached_generation_s"], 1),
                     "wall_s": round(time.perf_counter() - t0, 1)}
    if "ideal" in out:
        out["ideal"]["ceiling_ratio"] = round(ceiling["cycles_per_s"]
                                              / out["ideal"]["sim_cycles_per_s"], 3)
    if "ideal" in out and "dram" in out:
        ratio = out["ideal"]["sim_cycles_per_s"] / out["dram"]["sim_cycles_per_s"]
        out["ideal_over_dram"] = {"ratio": round(ratio, 3), "target": DRAM_SPEED_TARGET,
                                  "within_target": ratio <= DRAM_SPEED_TARGET}
    return out


def gpu_check_timing(out: Path) -> dict:
    """``scripts/gpu_check.py`` on this machine's CPU at the size of its test
    (:data:`coda.experiments.gpu_check.CPU_CHECK`, one thread), its output in ``out``: the wall
    seconds from start to exit (imports included) against :data:`GPU_CHECK_CPU_TARGET_S`, and
    the check's own timed generations. Raises RuntimeError (its exit status and stderr's tail)
    when the check fails."""
    from coda.experiments.gpu_check import CPU_CHECK

    argv = [*CPU_CHECK, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, str(GPU_CHECK_SCRIPT), *argv], capture_output=True,
                         text=True, env=env)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"scripts/gpu_check.py failed (exit {run.returncode}): "
                           f"{run.stderr[-2000:]}")
    rep = json.loads((Path(out) / "gpu_check.json").read_text())
    return {"command": "scripts/gpu_check.py " + " ".join(argv), "wall_s": round(wall, 2),
            "target_s": GPU_CHECK_CPU_TARGET_S, "within_target": wall < GPU_CHECK_CPU_TARGET_S,
            "full_s": rep["full"]["seconds"], "cached_s": rep["cached"]["seconds"]}


def serving_timing(requests: int = 1000) -> dict:
    """Wall seconds of ``coda serve``'s default run cut to one rate and policy with
    ``requests`` requests (:func:`coda.host.system.serving.serve_curve`: the classes'
    service times, shapes from the cache under ``build/system/shapes``, and the SimPy
    simulation), against :data:`SERVING_TARGET_S`."""
    from coda.host.system.serving import ServeConfig, serve_curve

    cfg = ServeConfig(requests=requests, rates="20", policy="fcfs")
    t0 = time.perf_counter()
    res = serve_curve(cfg)
    wall = time.perf_counter() - t0
    return {"command": f"coda serve --requests {requests} --rates 20 --policy fcfs",
            "wall_s": round(wall, 2), **res["wall_s"], "target_s": SERVING_TARGET_S,
            "within_target": wall <= SERVING_TARGET_S,
            "p50_s": res["runs"][0]["p50_s"], "p99_s": res["runs"][0]["p99_s"]}


@contextmanager
def _local_server(answer: bytes | None):
    """A TCP server on 127.0.0.1 for one connection: reads the client's first bytes, then sends
    ``answer`` and closes, or (None) says nothing until the client closes. Yields the port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.recv(100)
            if answer is not None:
                conn.sendall(answer)
            else:
                while conn.recv(100):
                    pass
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()


def address_check_timing(timeout_s: float = 5.0) -> dict:
    """Seconds :func:`coda.sweep.check_address` (with ``timeout_s``) takes to refuse a local
    address that answers as an HTTP/1 server does (``not_a_gcs``: should be far below the
    timeout, refused by the answer) and one that accepts and says nothing (``silent``: the
    timeout), each with the error it gave."""
    from coda.sweep import check_address

    out = {"timeout_s": timeout_s}
    for case, answer in (("not_a_gcs", b"HTTP/1.1 400 Bad Request\r\n\r\n"), ("silent", None)):
        with _local_server(answer) as port:
            t0 = time.perf_counter()
            try:
                check_address(f"127.0.0.1:{port}", timeout_s=timeout_s)
                error = None
            except ValueError as exc:
                error = str(exc)
            out[case] = {"seconds": round(time.perf_counter() - t0, 6), "error": error}
    return out
