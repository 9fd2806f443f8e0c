"""``coda dram replay``: memory traces on the DRAM timing model, Verilated, no Python per clock.

The Amaranth :class:`coda.hw.dram.controller.DRAMController` of one rank and the SV device of
``dram_top.sv`` are Verilated once per standard (cached under ``build/dram/``) with a C++
main that only toggles the clock; the trace is converted to a hex file that the SV trace
player streams in. :func:`replay` runs a trace file (DRAMsim3 or Ramulator format,
:func:`parse_trace`), :func:`run_requests` a list of requests (:func:`stream_add_trace`,
:func:`random_read_trace`), with ``ranks`` R > 1 on R ranks of one channel. Results: requests
served, DRAM cycles, achieved GB/s, row hits/misses/conflicts, average read latency
(:func:`replay` lists them). ``coda dram replay``'s :func:`main` takes its
:class:`DRAMReplayConfig` (``CONFIG``).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import re
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from coda.hw.dram.controller import DRAMController
from coda.hw.dram.rowpolicy import ROW_POLICIES
from coda.hw.dram.standards import DDR4_3200, DRAMStandard, STANDARDS, get_standard
from coda.hw.nme.isa import NMEConfig
from coda.jsonout import json_text
from coda.options import add_options, option
from coda.paths import remove_orphans

from coda.cosim.toolchain import build_dir, build_lock, setup_verilator_env

__all__ = ["parse_trace", "stream_add_trace", "random_read_trace", "build_model", "run_requests",
           "replay", "run_words",
           "parse_size", "DRAMReplayConfig", "CONFIG", "configure", "main", "verilator_params",
           "channel_addr_bits"]

_HERE = Path(__file__).resolve().parent
# every part of the controller (hw/dram/*.py: controller, mapping, queue, scheduler, refresh,
# timing table, standards) and this harness: a change of any rebuilds the model
_SOURCES = [_HERE / "dram_top.sv",
            *sorted((_HERE.parents[1] / "hw" / "dram").glob("*.py")), Path(__file__).resolve()]

_MAIN_CPP = r"""
#include <memory>
#include "verilated.h"
#include "V{top}.h"
// The clock is toggled here; the SV player/device do everything else.
int main(int argc, char** argv) {{
    auto ctx = std::make_unique<VerilatedContext>();
    ctx->commandArgs(argc, argv);
    auto top = std::make_unique<V{top}>(ctx.get());
    top->rst = 1;
    for (int i = 0; i < 4; ++i) {{ top->clk = 1; top->eval(); top->clk = 0; top->eval(); }}
    top->rst = 0;
    while (!ctx->gotFinish()) {{ top->clk = 1; top->eval(); top->clk = 0; top->eval(); }}
    top->final();
    return 0;
}}
"""

_DRAMSIM = re.compile(r"^\s*(0x[0-9a-fA-F]+|\d+)\s+(READ|WRITE|read|write)\s+(\d+)\s*$")
_LDST = re.compile(r"^\s*(LD|ST|ld|st)\s+(0x[0-9a-fA-F]+|\d+)\s*$")
_FORMATS = "'0xADDR READ|WRITE CYCLE' (DRAMsim3) or 'LD|ST ADDR' (Ramulator)"
MAX_LINE = 4096   # characters per trace line: a longer one is no trace (e.g. /dev/zero)


def _need_name(path, what: str) -> None:
    if not str(path):
        raise ValueError(f"{what} path '': expected a file name")


def parse_trace(path: str | Path) -> list[tuple[int, int, int]]:
    """Read a DRAMsim3 or Ramulator load/store trace, line by line.

    Trace formats (one request per line, ``#`` comments allowed):

    - DRAMsim3: ``0xADDR READ|WRITE CYCLE`` (byte address; CYCLE in DRAM cycles; the request is
      offered no earlier than CYCLE);
    - Ramulator load/store: ``LD|ST ADDR`` (byte address, offered back to back).

    Returns:
        ``[(cycle, we, byte_addr), ...]`` in file order (cycle 0 for load/store traces).
    Raises:
        FileNotFoundError: no such file. ValueError: empty path; a line in neither format or
        longer than :data:`MAX_LINE` (named, quoted up to 60 characters); no request at all.
    """
    _need_name(path, "trace")
    out = []
    with open(path, "rb") as fh:
        for n, raw in enumerate(iter(lambda: fh.readline(MAX_LINE + 2), b""), 1):
            if len(raw.rstrip(b"\r\n")) > MAX_LINE:
                raise ValueError(f"{path}:{n}: line longer than {MAX_LINE} characters; "
                                 f"expected {_FORMATS} lines")
            try:
                line = raw.decode("ascii")
            except UnicodeDecodeError:
                raise ValueError(f"{path}:{n}: not a text trace (non-ASCII bytes); "
                                 f"expected {_FORMATS} lines") from None
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            if (mt := _DRAMSIM.match(text)):
                out.append((int(mt[3]), int(mt[2].upper() == "WRITE"), int(mt[1], 0)))
            elif (mt := _LDST.match(text)):
                out.append((0, int(mt[1].upper() == "ST"), int(mt[2], 0)))
            else:
                quoted = text if len(text) <= 60 else text[:60] + "..."
                raise ValueError(f"{path}:{n}: {quoted!r}: expected {_FORMATS}")
    if not out:
        raise ValueError(f"{path}: empty trace: expected at least one request")
    return out


def parse_size(text: str) -> int:
    """'2MiB', '512KiB', '4096' -> bytes. Raises ValueError on anything else."""
    mt = re.fullmatch(r"\s*(\d+)\s*(KiB|MiB|GiB|K|M|G|B)?\s*", str(text))
    if not mt:
        raise ValueError(f"size {text!r}: expected e.g. 2MiB, 512KiB or a byte count")
    unit = {None: 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
            "G": 1 << 30, "GiB": 1 << 30}[mt[2]]
    return int(mt[1]) * unit


def stream_add_trace(std: DRAMStandard | str, array_bytes: int) -> list[tuple[int, int, int]]:
    """STREAM add ``c[i] = a[i] + b[i]`` as a burst-granular trace.

    Arrays a, b, c of ``array_bytes`` each, contiguous from byte 0; per burst ``i``: read a,
    read b, write c, offered back to back. Returns ``[(0, we, byte_addr), ...]``.
    Raises ValueError if ``array_bytes`` is not a positive multiple of the burst size.
    """
    std = get_standard(std)
    bb = std.burst_bytes
    _stream_add_requests(std, array_bytes)   # checks the size
    out = []
    for off in range(0, array_bytes, bb):
        out += [(0, 0, off), (0, 0, array_bytes + off), (0, 1, 2 * array_bytes + off)]
    return out


def random_read_trace(std: DRAMStandard | str, n: int, span_bytes: int,
                      seed: int = 0) -> list[tuple[int, int, int]]:
    """``n`` one-burst reads at uniformly random burst-aligned byte addresses in
    ``[0, span_bytes)`` (``random.Random(seed)``), offered back to back.

    Returns ``[(0, 0, byte_addr), ...]``. Raises ValueError: ``n`` < 1, or ``span_bytes`` not
    a positive multiple of the burst size.
    """
    import random

    std = get_standard(std)
    bb = std.burst_bytes
    if n < 1:
        raise ValueError(f"n={n}: expected >= 1 reads")
    if span_bytes <= 0 or span_bytes % bb:
        raise ValueError(f"span_bytes={span_bytes}: expected a positive multiple of {bb}")
    rng = random.Random(seed)
    return [(0, 0, rng.randrange(span_bytes // bb) * bb) for _ in range(n)]


def _stream_add_requests(std: DRAMStandard, array_bytes: int) -> int:
    """Requests of :func:`stream_add_trace` (3 per burst), without building them."""
    bb = std.burst_bytes
    if array_bytes <= 0 or array_bytes % bb:
        raise ValueError(f"array_bytes={array_bytes}: expected a positive multiple of {bb}")
    return 3 * (array_bytes // bb)


def verilator_params(std: DRAMStandard, store_bits: int = 12) -> dict[str, int]:
    """Parameters of the SV device/tops for ``std`` (Verilator ``-G``)."""
    log2 = lambda n: (n - 1).bit_length()  # noqa: E731
    return {"BG_BITS": log2(std.bank_groups), "BA_BITS": log2(std.banks_per_group),
            "ROW_BITS": log2(std.rows), "COL_BITS": log2(std.columns),
            "BL_BITS": log2(std.burst_length), "DATA_BITS": 8 * std.burst_bytes,
            "RL": std.read_latency, "STORE_BITS": store_bits}


def build_model(std: DRAMStandard | str, top: str = "replay", lanes: int = NMEConfig.lanes,
                store_bits: int = 12, quiet: bool = True,
                controller: dict | None = None) -> Path:
    """Verilate (once; cached by source hash and parameters) and return the executable.

    Args:
        top: ``"replay"`` (burst trace player) or ``"word"`` (NME word-port player around
            WordAdapter + controller, ``lanes`` elements per word).
        controller: keyword arguments of :class:`coda.hw.dram.controller.DRAMController` (queue depths,
            ``lookahead``, ``row_policy``...; None: its defaults).
    Raises:
        ValueError: unknown top. subprocess.CalledProcessError: Verilator failed.
    """
    from coda.hw.dram.controller import DRAMController, check_controller, dram_verilog
    from coda.hw.dram.word_memory import DRAMWordMemory

    std = get_standard(std)
    _, write_high, write_low = check_controller(std, **(controller or {}))  # fails before a build
    if top not in ("replay", "word"):
        raise ValueError(f"top={top!r}: expected 'replay' or 'word'")
    params = verilator_params(std, store_bits)
    ranks = (controller or {}).get("ranks", 1)
    defines = []
    if top == "replay":
        params["ADDR_BITS"] = std.burst_addr_bits
        if ranks > 1:        # the ranks of one channel: rank bits, cmd_rank to the device
            params["ADDR_BITS"] += (ranks - 1).bit_length()
            params["RANK_BITS"] = (ranks - 1).bit_length()
            defines.append("-DCODA_RANKS")
        sv_top = "coda_dram_replay_top"
    else:
        if ranks > 1:
            raise ValueError(f"ranks={ranks}: the word-port model has one rank")
        params.update(WORD_BITS=16 * lanes, LANES=lanes)
        sv_top = "coda_dram_word_top"
    digest = hashlib.sha256()
    for src in _SOURCES:
        digest.update(src.read_bytes())
    controller = dict(controller or {})
    # the key holds every option, defaults filled in: options equal to the defaults, given or
    # not, are the same controller and share one build
    options = inspect.signature(check_controller).bind(std, **controller)
    options.apply_defaults()
    full = dict(options.arguments, write_high=write_high, write_low=write_low)
    full.pop("std")
    digest.update(repr((std, top, params, sorted(full.items()))).encode())
    key = digest.hexdigest()[:16]
    out = build_dir("dram", f"{top}_{std.name}_{key}")
    exe = out / "obj" / f"V{sv_top}"
    with build_lock(out / ".lock"):
        if exe.exists():
            return exe
        if top == "replay":
            text = dram_verilog(DRAMController(std, **controller), "coda_dram_ctrl")
        else:
            text = dram_verilog(DRAMWordMemory(std, lanes, **controller), "coda_dram_words")
        (out / "gen.v").write_text(text)
        (out / "main.cpp").write_text(_MAIN_CPP.format(top=sv_top))
        env = setup_verilator_env(dict(os.environ))
        cmd = ["verilator", "--cc", "--exe", "--build", "-O3", "--x-assign", "fast",
               "--x-initial", "fast", "--noassert", "-Wno-fatal", "-Wno-lint", "-Wno-style",
               "-Wno-MULTIDRIVEN", "-Wno-UNOPTFLAT",
               "--top-module", sv_top, "-Mdir", str(out / "obj"), "-j", "1",
               # the wheel's verilated.mk leaves the PCH include flag empty
               "-MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include", "-MAKEFLAGS", "OPT_FAST=-O2",
               "-MAKEFLAGS", "OPT_SLOW=-O1",
               "-o", f"V{sv_top}"]
        cmd += [f"-G{k}={v}" for k, v in params.items()] + defines
        cmd += [str(out / "gen.v"), str(_HERE / "dram_top.sv"), str(out / "main.cpp")]
        res = subprocess.run(["nice", "-n", "5", *cmd], env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr[-4000:])
        return exe


SIM_CYCLES_PER_S = 4e6          # the DDR5-4800 model's speed here (docs/results.md)
MAX_DEFAULT_CYCLE = 200_000_000  # ~1 min of simulation at that speed


def run_requests(std: DRAMStandard | str, requests: list[tuple[int, int, int]], *,
                 commands: str | Path | None = None, max_cycles: int | None = None,
                 controller: dict | None = None) -> dict:
    """Replay ``[(cycle, we, byte_addr), ...]`` on the Verilated model of ``std`` (its
    controller built with the keyword arguments ``controller``, see :func:`build_model`).

    ``max_cycles`` None bounds the run at the last request's cycle + 1,000 cycles per request
    + 100,000 (far above any JEDEC service time incl. refresh), so a run always ends.
    The command trace is written to ``commands`` only when the run succeeded.

    Returns the result dict (see :func:`replay`), plus ``build_s`` and ``sim_s`` (wall s).
    Raises:
        ValueError: empty trace; ``max_cycles`` < 1; a run that needs more than ``max_cycles``
            (default :data:`MAX_DEFAULT_CYCLE`) by its request count alone, or, without
            ``max_cycles``, has a request later than :data:`MAX_DEFAULT_CYCLE` (a long run: the
            model ticks every cycle); the run hit ``max_cycles``; an incomplete command trace.
            OSError: ``commands`` cannot be written.
    """
    std = get_standard(std)
    if not requests:
        raise ValueError("empty trace: expected at least one request")
    max_cycles = _cycle_bound(std, len(requests), max(c for c, _, _ in requests), max_cycles)
    created = commands is not None and _claim_output(commands, "commands")
    try:
        t0 = time.perf_counter()
        exe = build_model(std, controller=controller)
        build_s = time.perf_counter() - t0
        mask = (1 << channel_addr_bits(std, controller)) - 1
        with _run_folder() as tmp:
            hexf, stats, cmds = (Path(tmp) / n for n in ("trace.hex", "stats.txt", "cmds.csv"))
            with open(hexf, "w") as fh:
                fh.writelines(f"{c:x} {w:x} {(a // std.burst_bytes) & mask:x}\n"
                              for c, w, a in requests)
            args = [str(exe), f"+trace={hexf}", f"+stats={stats}"]
            if commands is not None:
                args.append(f"+dram_cmds={cmds}")
            args.append(f"+max_cycles={max_cycles}")
            t1 = time.perf_counter()
            subprocess.run(args, check=True, capture_output=True, text=True)
            sim_s = time.perf_counter() - t1
            raw = {k: int(v) for k, v in (ln.split("=", 1) for ln in stats.read_text().split())}
            if raw["timed_out"]:
                raise ValueError(f"replay stopped at max_cycles={max_cycles} before the trace "
                                 f"finished")
            if commands is not None:
                _copy_command_trace(cmds, commands, raw)
    except BaseException:
        if created:
            _discard(commands)
        raise
    return _results(std, raw, build_s, sim_s)


def _run_folder() -> tempfile.TemporaryDirectory:
    """A temporary folder for one run of a DRAM model, ``build/dram/runs/run-<pid>-...``
    (removed when the run ends), after removing those of processes that are gone (runs
    killed before their clean-up: :func:`coda.paths.remove_orphans`)."""
    runs = build_dir("dram", "runs")
    remove_orphans(runs, "run")
    return tempfile.TemporaryDirectory(prefix=f"run-{os.getpid()}-", dir=runs)


def channel_addr_bits(std: DRAMStandard, controller: dict | None = None) -> int:
    """Burst address bits of the replayed channel: the rank's, plus the rank bits of
    ``controller["ranks"]`` (:class:`coda.hw.dram.mapping.AddressMapping`)."""
    return std.burst_addr_bits + ((controller or {}).get("ranks", 1) - 1).bit_length()


def _cycle_bound(std: DRAMStandard, n: int, last: int, max_cycles: int | None) -> int:
    """The ``+max_cycles`` of a run of ``n`` requests, the last offered at cycle ``last``.

    Raises ValueError (see :func:`run_requests`) for a bound below 1 and a run that could not
    finish within the bound: every request moves one burst over the rank's data bus, which
    takes ``nBL`` cycles, so ``n * nBL`` cycles is a lower bound of any run.
    """
    if max_cycles is not None and int(max_cycles) < 1:
        raise ValueError(f"max_cycles={max_cycles}: expected >= 1 DRAM cycles")

    def speed(cycles):
        sec = cycles / SIM_CYCLES_PER_S
        took = f"{sec / 3600:.3g} h" if sec >= 3600 else f"{sec / 60:.3g} min"
        return (f"at least {took} of simulation (the model ticks every cycle, "
                f"~{SIM_CYCLES_PER_S / 1e6:.0f} M cycles/s)")

    need = n * std.nBL
    bound = MAX_DEFAULT_CYCLE if max_cycles is None else int(max_cycles)
    if need > bound:
        what = f"max_cycles={bound}" if max_cycles is not None else f"the default bound {bound}"
        raise ValueError(f"{n} requests need at least {need} DRAM cycles ({std.nBL} per burst), "
                         f"more than {what}: {speed(need)}; pass --max-cycles above {need} "
                         f"to run it, or a smaller trace or size")
    if max_cycles is None:
        if last > MAX_DEFAULT_CYCLE:
            raise ValueError(f"a request at cycle {last}: later than {MAX_DEFAULT_CYCLE} DRAM "
                             f"cycles: {speed(last)}; pass --max-cycles to run it anyway")
        return last + 1000 * n + 100_000
    return int(max_cycles)


def _claim_output(path: str | Path, what: str) -> bool:
    """Check up front that ``path`` can be written, without truncating it (creates it empty
    and its folder if missing). Returns whether it was created here (to remove on failure).
    Raises ValueError (empty path) or OSError naming the path (a directory, read-only...)."""
    _need_name(path, what)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    existed = os.path.lexists(path)
    open(path, "a").close()
    return not existed


def _discard(path: str | Path) -> None:
    """Remove a partial or empty output file; never a device, pipe, link or directory."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.remove(path)
    except OSError:
        pass


def _write_output(path: str | Path, chunks) -> None:
    """Write the byte strings ``chunks`` to ``path``; a failed write (e.g. a full disk) leaves
    no partial file and raises OSError naming ``path``."""
    try:
        with open(path, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
    except OSError as exc:
        _discard(path)
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def _copy_command_trace(src: Path, dst: str | Path, raw: dict) -> None:
    """Copy the model's command trace to ``dst``, checking it is complete: the model's file
    writes fail silently, so its lines are counted against the statistics (a lower bound:
    the header, one line per RD, WR and REF, an ACT per row miss and a PRE per conflict)."""
    need = 1 + sum(raw[k] for k in ("reads", "writes", "refreshes", "row_misses",
                                    "row_conflicts"))
    lines = 0

    def chunks():
        nonlocal lines
        with open(src, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                lines += chunk.count(b"\n")
                yield chunk

    _write_output(dst, chunks())
    if lines < need:
        _discard(dst)
        raise ValueError(f"{dst}: the model wrote {lines} command lines, expected at least "
                         f"{need} (could it write under {src.parent.parent}?)")


def run_words(std: DRAMStandard | str, lanes: int, ops: list[tuple[int, int, int, int]], *,
              commands: str | Path | None = None, controller: dict | None = None) -> list[int]:
    """Run NME word-port requests through WordAdapter + controller + device (Verilated).

    Args:
        ops: ``[(we, word_addr, wdata, wmask), ...]`` offered back to back in order;
            ``wdata`` a ``16*lanes``-bit int, ``wmask`` an ``lanes``-bit element mask.
    Returns:
        The read responses' words (ints), in order.
    """
    std = get_standard(std)
    exe = build_model(std, top="word", lanes=lanes, controller=controller)
    with _run_folder() as tmp:
        words, rsp = Path(tmp) / "words.hex", Path(tmp) / "rsp.hex"
        with open(words, "w") as fh:
            fh.writelines(f"{w:x} {a:x} {d:x} {k:x}\n" for w, a, d, k in ops)
        args = [str(exe), f"+words={words}", f"+rsp={rsp}"]
        if commands:
            args.append(f"+dram_cmds={Path(commands).resolve()}")
        subprocess.run(args, check=True, capture_output=True, text=True)
        return [int(x, 16) for x in rsp.read_text().split()]


def _results(std: DRAMStandard, raw: dict, build_s: float, sim_s: float) -> dict:
    cycles = raw["cycles"]
    served = raw["reads"] + raw["writes"]
    gbps = served * std.burst_bytes / (cycles * std.tCK_ns) if cycles else 0.0
    lat = raw["read_latency"] / raw["reads"] if raw["reads"] else 0.0
    return {
        "standard": std.name, "requests": served, "reads": raw["reads"],
        "writes": raw["writes"], "dram_cycles": cycles, "time_ns": cycles * std.tCK_ns,
        "bytes": served * std.burst_bytes, "gbps": gbps, "peak_gbps": std.peak_gbps,
        "utilisation": gbps / std.peak_gbps, "row_hits": raw["row_hits"],
        "row_misses": raw["row_misses"], "row_conflicts": raw["row_conflicts"],
        "row_hit_rate": raw["row_hits"] / served if served else 0.0,
        "avg_read_latency_cycles": lat, "avg_read_latency_ns": lat * std.tCK_ns,
        "refreshes": raw["refreshes"], "build_s": build_s, "sim_s": sim_s,
        "sim_cycles_per_s": cycles / sim_s if sim_s else 0.0,
    }


def replay(std: DRAMStandard | str, trace: str | Path, **kw) -> dict:
    """Replay a trace file (see :func:`parse_trace`); keywords as :func:`run_requests`.

    Byte addresses map to bursts of ``std.burst_bytes`` (the low bits select bytes inside the
    burst and are dropped; addresses beyond the rank, or the channel's ranks, wrap). With
    ``--ranks`` R > 1 the controller drives R ranks sharing one channel (command and data bus):
    rank bits between bank and row (:mod:`coda.hw.dram.mapping`), per-rank bank state, tRRD/tFAW
    and refresh, tRTRS between the bursts of two ranks; the command log's ``rank`` column names
    the rank. Results: requests served, DRAM cycles, achieved GB/s (bytes moved by RD/WR /
    (cycles * tCK)), row hits/misses/conflicts, average read latency (front-port acceptance to
    data, cycles and ns).

    Returns a dict: standard, requests (served), reads, writes, dram_cycles, time_ns, bytes,
    gbps, peak_gbps, utilisation, row_hits, row_misses, row_conflicts, row_hit_rate,
    avg_read_latency_cycles, avg_read_latency_ns, refreshes, build_s, sim_s,
    sim_cycles_per_s.
    """
    return run_requests(std, parse_trace(trace), **kw)


#: the controller options of ``coda dram replay`` and their defaults, read off
#: :class:`coda.hw.dram.controller.DRAMController`: an option left at its default is not passed, so the
#: default model is one cached build
CONTROLLER_DEFAULTS = {
    name: inspect.signature(DRAMController).parameters[name].default
    for name in ("row_policy", "row_timeout", "lookahead", "read_queue", "refresh", "ranks",
                 "refresh_postpone", "policy_banks", "max_bypass")}


_CTRL = "DRAMController's default"


@dataclass(frozen=True)
class DRAMReplayConfig:
    """Every option of ``coda dram replay`` with its default (the one source of them; the
    controller's from :data:`CONTROLLER_DEFAULTS`, i.e. :class:`DRAMController`'s own).

    Checked when made, before any build: the standard, the controller options
    (:func:`controller_options`), exactly one trace source (``--trace``, ``--stream-add``,
    ``--random-reads``), the generated trace's size and ``--span``, and that it fits
    ``--max-cycles``; ValueError naming the bad value. The ``--trace`` file is read by
    :func:`main`."""
    standard: str = option(DDR4_3200.name, f"DRAM preset, one of {', '.join(STANDARDS)}")
    trace: str = option(None, "DRAMsim3 (0xADDR READ|WRITE CYCLE) or LD|ST ADDR trace",
                        type=str, exclusive="source", required=True)
    stream_add: str = option(None, "generate a STREAM-add trace with arrays of SIZE (e.g. "
                             "2MiB)", type=str, metavar="SIZE", exclusive="source",
                             required=True)
    random_reads: int = option(None, "generate N one-burst reads at random addresses in "
                               "--span", type=int, metavar="N", exclusive="source",
                               required=True)
    span: str = option("1GiB", "address range of --random-reads", unit="bytes")
    seed: int = option(0, "seed of --random-reads")
    commands: str = option(None, "write the DRAM command trace CSV here", type=str)
    json: str = option(None, "write the results as JSON here", type=str)
    max_cycles: int = option(None, "stop (as an error) after this many DRAM cycles", type=int,
                             default_text="no limit")
    row_policy: str = option(CONTROLLER_DEFAULTS["row_policy"], "row policy of the controller",
                             choices=ROW_POLICIES, source=_CTRL)
    row_timeout: int = option(CONTROLLER_DEFAULTS["row_timeout"], "cycles after a bank's last "
                              "access before the timeout policy closes it", unit="DRAM cycles",
                              source=_CTRL)
    lookahead: int = option(CONTROLLER_DEFAULTS["lookahead"], "queue entries the FR-FCFS "
                            "scheduler chooses from", source=_CTRL)
    read_queue: int = option(CONTROLLER_DEFAULTS["read_queue"], "read queue depth",
                             unit="bursts", source=_CTRL)
    refresh: str = option(CONTROLLER_DEFAULTS["refresh"], "all-bank REF, or DDR5 same-bank "
                          "REFsb", choices=("all", "same_bank"), source=_CTRL)
    ranks: int = option(CONTROLLER_DEFAULTS["ranks"], "ranks sharing the channel's command and "
                        "data bus", choices=(1, 2, 4), source=_CTRL)
    refresh_postpone: int = option(CONTROLLER_DEFAULTS["refresh_postpone"], "REFs the "
                                   "controller may owe while requests are queued, then issued "
                                   "back to back (0 up to the standard's JEDEC limit: DDR4 8, "
                                   "DDR5 4; 0: each REF when due)", metavar="N", unit="REFs",
                                   source=_CTRL)
    policy_banks: int = option(CONTROLLER_DEFAULTS["policy_banks"], "banks the closed/timeout "
                               "row policy tracks at once", source=_CTRL)
    max_bypass: int = option(CONTROLLER_DEFAULTS["max_bypass"], "column commands that may "
                             "overtake the oldest request before only its commands issue",
                             source=_CTRL)

    def __post_init__(self):
        std = get_standard(self.standard)
        controller_options(self)
        sources = [s for s in ("trace", "stream_add", "random_reads")
                   if getattr(self, s) is not None]
        if len(sources) != 1:
            raise ValueError(f"trace sources {sources or 'none'}: expected one of --trace, "
                             "--stream-add, --random-reads")
        if self.random_reads is not None:
            parse_size(self.span)
            _cycle_bound(std, max(self.random_reads, 1), 0, self.max_cycles)
        elif self.stream_add is not None:
            # refuse a run too long for its size before building its (maybe huge) request list
            _cycle_bound(std, _stream_add_requests(std, parse_size(self.stream_add)), 0,
                         self.max_cycles)


#: the config of ``coda dram replay``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = DRAMReplayConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda dram replay``: :class:`DRAMReplayConfig`."""
    add_options(parser, DRAMReplayConfig)


def controller_options(cfg) -> dict:
    """The :class:`coda.hw.dram.controller.DRAMController` keywords of the options of ``cfg`` (a
    :class:`DRAMReplayConfig`; only those differing from the controller's defaults, so the
    default model is one cached build).

    Raises ValueError naming a bad value (checked here, before any build)."""
    from coda.hw.dram.controller import check_controller
    opts = {k: getattr(cfg, k) for k, d in CONTROLLER_DEFAULTS.items()
            if getattr(cfg, k) != d}
    check_controller(cfg.standard, **opts)     # raises on a bad value, naming it
    return opts


def main(cfg: DRAMReplayConfig) -> int:
    """Run ``coda dram replay`` of ``cfg`` (its :class:`DRAMReplayConfig`, checked when made):
    read or generate the trace, replay it (:func:`run_requests`), print the results (and
    write ``--json``, ``--commands``); returns 0. ValueError for a bad trace file, OSError
    for an unreadable one or an output that cannot be written (``coda: error:``, exit 2)."""
    std = get_standard(cfg.standard)
    controller = controller_options(cfg)
    if cfg.trace is not None:
        requests = parse_trace(cfg.trace)
        source = str(cfg.trace)
    elif cfg.random_reads is not None:
        requests = random_read_trace(std, cfg.random_reads, parse_size(cfg.span), cfg.seed)
        source = f"random-reads {cfg.random_reads} over {cfg.span} (seed {cfg.seed})"
    else:
        requests = stream_add_trace(std, parse_size(cfg.stream_add))
        source = f"stream-add {cfg.stream_add}"
    created = cfg.json is not None and _claim_output(cfg.json, "json")
    try:
        res = run_requests(std, requests, commands=cfg.commands, max_cycles=cfg.max_cycles,
                           controller=controller)
    except BaseException:
        if created:
            _discard(cfg.json)
        raise
    res["trace"] = source
    res["controller"] = controller
    ns = res["time_ns"]
    span = f"{ns:.1f} ns" if ns < 1e3 else f"{ns / 1e3:.1f} us"   # short runs: ns, not 0.0 us
    print(f"{std.name}" + (f" x {cfg.ranks} ranks" if cfg.ranks > 1 else "") + f"  {source}")
    print(f"  requests served    {res['requests']} ({res['reads']} RD, {res['writes']} WR)")
    print(f"  DRAM cycles        {res['dram_cycles']} ({span})")
    print(f"  bandwidth          {res['gbps']:.2f} GB/s of {res['peak_gbps']:.1f} "
          f"({100 * res['utilisation']:.1f} %)")
    print(f"  row hits/miss/conf {res['row_hits']} / {res['row_misses']} / "
          f"{res['row_conflicts']} (hit rate {100 * res['row_hit_rate']:.1f} %)")
    print(f"  avg read latency   {res['avg_read_latency_cycles']:.1f} cycles = "
          f"{res['avg_read_latency_ns']:.1f} ns")
    print(f"  refreshes          {res['refreshes']}")
    print(f"  simulation         {res['sim_s']:.2f} s ({res['sim_cycles_per_s'] / 1e6:.2f} M "
          f"cycles/s), model build {res['build_s']:.1f} s")
    if cfg.json is not None:
        _write_output(cfg.json, [(json_text(res, indent=2) + "\n").encode()])
    return 0
