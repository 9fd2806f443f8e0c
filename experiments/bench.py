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
``--out`` (default ``build/bench/cosim.json``), and ends with the ``bench`` result record
(:func:`record_figures`, :func:`coda.results.record`: written only with ``CODA_RECORD_DIR``
set): the headline figures of the parts that ran, which parts did not, and ``dse.png``. It
takes the command's :class:`BenchConfig` (``CONFIG``; the CLI builds it from the command
line, a caller may build it directly). Each step in detail: ``docs/cli.md``, "coda bench".
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
           "configure", "main", "record_figures", "parts_not_run"]

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
    cosimulation speed, then the ``bench`` result record of what ran (:func:`_record`; none
    with ``--sweep-report-only``, which measures nothing); returns 0, or 1 when
    ``--sweep-report-only`` finds no records."""
    # every option is checked before any build (ValueError: ``coda: error:``, exit 2): the
    # values when the config was made, the output path here
    out = check_output_path(cfg.out, "--out")
    grid = _sweep_grid(cfg)
    knee_rows = None
    if grid["lanes"]:
        knee_rows = _design_space(cfg, grid)
        if knee_rows is None:
            return 1
        if cfg.sweep_report_only:       # nothing measured: no record
            return 0
        if cfg.sweep_only:
            _record(cfg, knee_rows, None, None)
            return 0
    dram_rows = None if cfg.skip_dram else bench_dram(out=out.with_name("dram.json"))
    result = _cosim_speed(cfg)
    if not cfg.skip_checks:
        result["checks"] = {"gpu_check_cpu": gpu_check_timing(out.with_name("gpu_check")),
                            "sweep_address_check": address_check_timing(),
                            "serving_1000": serving_timing()}
    text = json_text(result, indent=1)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, text + "\n")
    _record(cfg, knee_rows, dram_rows, result)
    return 0


# ----------------------------------------------------------------------------- the record
#: the programs of the design-space sweep and the DIMM-NMP as the record names them
_PROGRAMS = {"residual_add": "residual add", "segment4": "4-stream segment"}


def _value(d, *keys):
    """``d[k0][k1]...`` when every key is there and the value is a number, string or bool;
    else None (a part that did not measure it)."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, (bool, int, float, str)) else None


def _put(figures: dict, label: str, value) -> None:
    """``figures[label] = value`` unless ``value`` is None (not measured)."""
    if value is not None:
        figures[label] = value


def _knee_figures(figures: dict, knee_rows: list[dict], depths: bool) -> None:
    """The knee per (standard, NME clock, program) of :func:`coda.experiments.design_space.knees`:
    its lanes, its utilisation, its buffer depth (``depths``: more than one depth swept) and,
    where the rank is not DRAM-bound at that clock, the lanes to saturate it."""
    units = sorted({k["units"] for k in knee_rows if k.get("units")})
    if units:
        _put(figures, "design-space sweep: NME units (mul, add, operand stages)",
             "; ".join(units))
    if knee_rows:
        _put(figures, "design-space sweep: knee = fewest lanes within this share of the best "
                      "utilisation", knee_rows[0].get("tolerance"))
    for k in knee_rows:
        clock = "on the DRAM clock" if not k["nme_mhz"] else f"{k['nme_mhz']:g} MHz"
        at = (f"knee, {k['dram']} {clock}, {_PROGRAMS.get(k['program'], k['program'])}"
              + (f", units {k['units']}" if len(units) > 1 else ""))
        _put(figures, f"{at}: lanes", k["knee_lanes"])
        if depths:
            _put(figures, f"{at}: depth (words)", k["knee_depth"])
        _put(figures, f"{at}: DRAM utilisation", k["knee_utilisation"])
        _put(figures, f"{at}: DRAM-bound", k["saturated"])
        _put(figures, f"{at}: lanes to saturate (extrapolated)", k["lanes_to_saturate"])


def _dram_figures(figures: dict, dram_rows: list[dict]) -> None:
    """Per (standard, trace) of :func:`bench_dram`: GB/s, utilisation, the share of the ACT
    bound (random reads); the JEDEC violations of every trace together."""
    for r in dram_rows:
        at = f"DRAM controller, {r['standard']}, {r['trace']}"
        _put(figures, f"{at}: GB/s", _value(r, "gbps"))
        _put(figures, f"{at}: utilisation", _value(r, "utilisation"))
        _put(figures, f"{at}: share of the ACT bound", _value(r, "of_act_bound"))
    _put(figures, "DRAM controller: JEDEC violations, every trace",
         sum(r.get("violations", 0) for r in dram_rows))


def _cosim_figures(figures: dict, result: dict) -> None:
    """The headline figures of ``--out``'s JSON (:func:`_cosim_speed` and the checks): the
    NME alone, the cosimulated generations and their ratio, the DIMM-NMP, the checks."""
    for label, keys in (("NME alone, one rank: NME cycles/s", ("one_rank", "cycles_per_s")),
                        ("NME alone, one rank: NME cycles/s of the simulator's own run",
                         ("one_rank", "sim_cycles_per_s")),
                        ("NME alone, own image: NME cycles/s", ("own_image", "cycles_per_s")),
                        ("NME alone, tiny job: ms per job", ("tiny_job", "ms_per_job")),
                        ("NME alone, simulator start (s)", ("simulator_start_seconds",))):
        _put(figures, label, _value(result, *keys))
    ranks = _value(result, "ceiling", "ranks")
    _put(figures, "NME alone, ceiling" + (f" ({ranks} ranks in lockstep)" if ranks else "")
         + ": NME cycles/s", _value(result, "ceiling", "cycles_per_s"))
    gen = result.get("rtl_generation") or {}
    for mem in RUN_MEMORIES:
        at = f"coda run --memory {mem}"
        for label, key in (("NME cycles/s", "sim_cycles_per_s"),
                           ("bit-exact RTL vs torch", "bit_exact_rtl_vs_torch"),
                           ("NME programs", "nme_programs"),
                           ("cached generation (s)", "cached_generation_s"),
                           ("wall (s)", "wall_s"),
                           ("ceiling / its NME cycles/s", "ceiling_ratio")):
            _put(figures, f"{at}: {label}", _value(gen, mem, key))
    for label, key in (("ratio", "ratio"), ("target", "target"),
                       ("within target", "within_target")):
        _put(figures, f"ideal-memory / DRAM-timed NME cycles/s: {label}",
             _value(gen, "ideal_over_dram", key))
    several = len(result.get("dimm_nmp") or []) > 1
    for m in result.get("dimm_nmp") or []:
        at = (f"DIMM-NMP {m.get('system', '')}, {_value(m, 'cfg', 'lanes')} lanes, depth "
              f"{_value(m, 'cfg', 'depth')}" + (f", {m.get('flags')}" if several else ""))
        for prog, name in _PROGRAMS.items():
            _put(figures, f"{at}, {name}: DRAM utilisation per rank (lowest)",
                 _value(m, prog, "min_utilisation"))
            _put(figures, f"{at}, {name}: NME cycles", _value(m, prog, "cycles"))
            _put(figures, f"{at}, {name}: NME cycles/s of the simulator's own run",
                 _value(m, prog, "sim_cycles_per_s"))
        _put(figures, f"{at}: refresh ceiling", _value(m, "refresh_ceiling"))
        _put(figures, f"{at}: JEDEC violations", _value(m, "violations"))
    checks = result.get("checks") or {}
    for at, check, keys in (
            ("GPU check on the CPU", "gpu_check_cpu",
             (("wall (s)", "wall_s"), ("target (s)", "target_s"),
              ("within target", "within_target"), ("full-compute generation (s)", "full_s"),
              ("cached generation (s)", "cached_s"))),
            ("serving check, 1,000 requests", "serving_1000",
             (("wall (s)", "wall_s"), ("target (s)", "target_s"),
              ("within target", "within_target"), ("service times (s)", "service_s"),
              ("serving simulation (s)", "serving_s"), ("p50 latency (s)", "p50_s"),
              ("p99 latency (s)", "p99_s")))):
        for label, key in keys:
            _put(figures, f"{at}: {label}", _value(checks, check, key))
    for case, label in (("not_a_gcs", "an address that is not a Ray GCS"),
                        ("silent", "a silent address")):
        _put(figures, f"coda sweep's address check, {label}: refused in (s)",
             _value(checks, "sweep_address_check", case, "seconds"))
    _put(figures, "coda sweep's address check: timeout (s)",
         _value(checks, "sweep_address_check", "timeout_s"))


def parts_not_run(cfg: BenchConfig) -> list[str]:
    """The parts of ``coda bench`` that ``cfg`` leaves out, each with the option that did."""
    swept = bool(_sweep_grid(cfg)["lanes"])
    if swept and (cfg.sweep_only or cfg.sweep_report_only):
        return ["DRAM controller replays, NME cosimulation speed, coda run generations, "
                "DIMM-NMP, check timings (--sweep-" + ("only" if cfg.sweep_only else
                                                       "report-only") + ")"]
    out = [] if swept else ["design-space sweep (--sweep-lanes '')"]
    if cfg.skip_dram:
        out.append("DRAM controller replays (--skip-dram)")
    memories = _run_memories(cfg.run_memories) if cfg.run_prompts else []
    if cfg.skip_nme:
        out.append("NME cosimulation speed and coda run generations (--skip-nme)")
    elif not memories:
        out.append("coda run generations (--run-prompts '' or --run-memories '')")
    else:
        out += [f"coda run --memory {m} (--run-memories {cfg.run_memories})"
                for m in RUN_MEMORIES if m not in memories]
    if cfg.skip_checks:
        out.append("GPU check, address check and serving timings (--skip-checks)")
    return out


def record_figures(cfg: BenchConfig, knee_rows: list[dict] | None, dram_rows: list[dict] | None,
                   result: dict | None) -> dict:
    """The figures of the ``bench`` record, from what this run measured: ``parts not run``
    (:func:`parts_not_run`, or ``none``), the knees of the design-space sweep (``knee_rows``,
    :func:`coda.experiments.design_space.knees`; None: not run), the DRAM replays
    (``dram_rows``, :func:`bench_dram`'s ``dram.json``; None: not run) and ``--out``'s JSON
    (``result``; None: not run). Values are those of the JSON files, unchanged."""
    figures = {"parts not run": "; ".join(parts_not_run(cfg)) or "none"}
    if knee_rows is not None:
        _knee_figures(figures, knee_rows, len(_sweep_grid(cfg)["depths"]) > 1)
    if dram_rows is not None:
        _dram_figures(figures, dram_rows)
    if result is not None:
        _cosim_figures(figures, result)
    return figures


def _record(cfg: BenchConfig, knee_rows: list[dict] | None, dram_rows: list[dict] | None,
            result: dict | None) -> None:
    """The ``bench`` result record (:func:`coda.results.record`: written only with
    ``CODA_RECORD_DIR`` set): :func:`record_figures` and, when the sweep ran, ``dse.png``."""
    from coda.results import record

    ran = ([f"design-space sweep ({len(knee_rows)} knees)"] if knee_rows is not None else []) + (
        ["DRAM controller replays"] if dram_rows is not None else []) + (
        ["cosimulation speed"] if result is not None else [])
    pictures = ({} if knee_rows is None else
                {"elements per ns and DRAM utilisation against NME lanes, per standard, "
                 "program and NME clock (best depth per lanes)":
                 Path(cfg.out).with_name("dse.png")})
    record("bench", "coda bench: " + ", ".join(ran),
           record_figures(cfg, knee_rows, dram_rows, result), pictures=pictures)


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


def _design_space(cfg: BenchConfig, grid: dict) -> list[dict] | None:
    """The design-space sweep of ``grid`` (:func:`_sweep_grid`) measured (or with
    ``--sweep-report-only`` the records already there), ``dse.json``, ``dse.png`` and the two
    tables. Returns the knees (:func:`coda.experiments.design_space.knees`, those of
    ``dse.json``), or None (said on stdout) when ``--sweep-report-only`` finds no records."""
    sweep_json = Path(cfg.out).with_name("dse.json")
    t0 = time.perf_counter()
    if cfg.sweep_report_only:
        rows = recorded_rows(sweep_json.with_suffix(""), grid["lanes"], grid["depths"],
                             cfg.fmt, grid["drams"], cfg.sweep_stream_bytes, grid["clocks"],
                             units=grid["units"])
        if not rows:
            print(f"no sweep records matching the options (units {grid['units']}) in "
                  f"{sweep_json.with_suffix('')}")
            return None
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
    knee_rows = knees(rows, cfg.knee_tolerance)
    print_knees(knee_rows, synth_areas(SYNTH_ROOT, cfg.fmt, grid["units"]))
    print(f"sweep: {sweep_json}, {sweep_json.with_suffix('.png')} "
          f"({time.perf_counter() - t0:.0f} s)")
    return knee_rows


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
