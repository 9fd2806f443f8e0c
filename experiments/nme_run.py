"""``coda nme run``: tensors from a .npz file through one cache operator on the NMP.

``coda nme run --op OP --fmt F --inputs IN.npz --out OUT.npz`` runs the operator on the
inputs (raw bf16/fp16 bit patterns) and writes its result; ``--make-example IN.npz`` writes a
deterministic random input file instead; ``--waves FILE.fst`` also writes the traced NME's
waveform. The file formats and what is printed: :func:`main`, which takes the command's
:class:`NMERunConfig` (``CONFIG``; the CLI builds it from the command line, a caller may build
it directly).
"""

from __future__ import annotations

import argparse
import sys
import time
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from coda.options import add_options, defaults, given, option
from coda.paths import atomic_write, check_output_path
from coda.hw.dram.standards import STANDARDS
from coda.hw.nme.isa import NMEConfig
from coda.hw.verilog import NMEPreset, NMEUnitsConfig, resolve_preset
from coda.host.nme import ops as ref
from coda.host.nme.backend import BACKENDS, get_backend
from coda.host.nme.bits import from_bits, to_bits, torch_dtype
from coda.host.model.sample import check_seed
from coda.host.nmp.driver import NMPCapacityError, NMPDriver, fit_mem_words

__all__ = ["NMERunConfig", "CONFIG", "configure", "main", "make_example", "read_inputs"]

# Smallest and largest rank memory the CLI picks when --mem-words is not given (words).
_MIN_MEM_WORDS = 1 << 10
_MAX_MEM_WORDS = 1 << 24


@dataclass(frozen=True)
class NMERunConfig(NMEUnitsConfig):
    """Every option of ``coda nme run`` with its default (the one source of them; the NME's
    units are :class:`coda.hw.verilog.NMEUnitsConfig`'s, inherited, as every NME command's).
    :meth:`check` checks the options before any work."""
    op: str = option(None, f"operator: {', '.join(ref.OPS)}", type=str, required=True)
    fmt: str = option(NMEConfig.fmt, "element format: bf16 or fp16", source="NMEConfig.fmt")
    inputs: str = option(None, "input .npz (see module doc)", type=str)
    out: str = option(None, "output .npz (y or l1)", type=str)
    backend: str = option("torch", f"one of {', '.join(BACKENDS)}")
    lanes: int = option(NMEConfig.lanes, "NME SIMD lanes (1..64)", source="NMEConfig.lanes")
    depth: int = option(NMEConfig.depth, "NME buffer depth", unit="words",
                        source="NMEConfig.depth")
    dimms: int = option(1, "DIMMs")
    ranks: int = option(1, "ranks per DIMM")
    dram: str = option(None, f"DRAM preset of the ranks ({', '.join(STANDARDS)}): with "
                       "--backend rtl, run the whole DIMM-NMP with DRAM timing "
                       "(coda.cosim.nmp.backend)", type=str,
                       default_text="one NME with an ideal memory")
    nme_mhz: float = option(None, "with --dram: the NMEs on their own clock of F MHz (1 .. the "
                            "DRAM command clock, 2400 for DDR5-4800) behind asynchronous "
                            "FIFOs; reports ns, NME and DRAM cycles", type=float, metavar="F",
                            default_text="NMEs on the DRAM clock")
    mem_words: int = option(None, "words per rank memory", type=int,
                            default_text="the smallest power of two in which the driver "
                            "places the operands and result")
    make_example: str = option(None, "write a random example input file for --op/--fmt and "
                               "exit", type=str, metavar="IN.npz")
    seed: int = option(0, "seed of --make-example")
    waves: str = option(None, "with --backend rtl: write the FST waveform of the run (the "
                        "traced NME model, built once and cached); ranks 2.. write "
                        "FILE-<n>.fst", type=str, metavar="FILE.fst")

    def check(self) -> NMEPreset:
        """Check the options before any work, in this order; returns the NME's preset
        (:func:`coda.hw.verilog.resolve_preset`). The format, ``--seed``, the units,
        ``--waves`` (a writable .fst path, only for a run on the NME RTL), ``--dimms`` /
        ``--ranks`` and the NME's geometry as a run checks them (NMEConfig), with the message
        naming the option (``--lanes 0: expected 1..64``); then the options that would do
        nothing (:func:`_check_unused`). Raises ValueError."""
        preset = _check_options(self)
        _check_unused(self)
        return preset


#: the config of ``coda nme run``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = NMERunConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``coda nme run`` to ``parser``: :class:`NMERunConfig`, the NME's
    units included."""
    add_options(parser, NMERunConfig)


def _fail(msg: str) -> int:
    print(f"coda: error: {msg}", file=sys.stderr)   # the prefix of coda.cli's errors
    return 2


def main(cfg: NMERunConfig) -> int:
    """Run the command of ``cfg`` (its :class:`NMERunConfig`); returns the exit status (0 ok, 2
    bad input). Options (:meth:`NMERunConfig.check`) and output path are checked before any
    work; nothing is written when the command fails.

    IN.npz holds the operator's inputs under their reference names (:mod:`coda.host.nme.ops`:
    ``a``, ``b``, ``s``, ``x``, ``g``, ``c``, ``u``, ``q``, ``scale``, and ``group`` = G for
    dequant_int8): floating-point inputs as uint16 arrays of raw bf16/fp16 bit patterns, ``q`` as
    int8, ``group`` as an integer scalar. OUT.npz receives ``y`` (uint16 bit patterns) or, for
    l1_distance, ``l1`` (a float32 scalar). stdout gets the NME configuration (``--preset``
    and latencies, :func:`coda.hw.verilog.resolve_preset`) and a one-line summary. Bad files, keys,
    dtypes or shapes print one clear error line and exit with status 2.

    ``--make-example`` writes a deterministic random input file for ``--op`` / ``--fmt`` (shapes
    with a masked tail and a token count that splits unevenly over ranks) instead of running.

    ``--waves FILE.fst`` (with ``--backend rtl``, without ``--dram``) runs the traced NME model (a
    separate cached Verilator build, ``coda.cosim.nme.build.build_sim(waves=True)``) and writes the FST
    waveform of the run to FILE.fst (GTKWave, Surfer); with several ranks, rank simulator n >= 1
    writes ``FILE-<n>.fst``. The summary line then ends with ``waves=`` and the files.
    """
    try:
        preset = cfg.check()
        if cfg.make_example is not None:
            path = _check_out(cfg.make_example, "--make-example")
            if path.suffix != ".npz":
                raise ValueError(f"--make-example {cfg.make_example}: expected a file name "
                                 f"ending in .npz")
            make_example(path, cfg.op, cfg.fmt, cfg.lanes, cfg.seed)
            print(f"wrote example inputs of {cfg.op} ({cfg.fmt}) to {path}")
            return 0
        if not cfg.inputs or not cfg.out:
            raise ValueError("--inputs IN.npz and --out OUT.npz are required "
                             "(or --make-example IN.npz)")
        return _run(cfg, preset)
    except (ValueError, KeyError, FileNotFoundError, NMPCapacityError, RuntimeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        return _fail(str(msg))


def _check_options(cfg: NMERunConfig) -> NMEPreset:
    """The format and geometry options, checked as a run checks them (NMEConfig), with the
    message naming the option: ``--lanes 0: expected 1..64``. Returns the NME's preset."""
    torch_dtype(cfg.fmt)
    check_seed(cfg.seed)     # --make-example's seed: the range of every command's seeds
    preset = resolve_preset(cfg)
    _check_waves(cfg)
    if cfg.dimms < 1 or cfg.ranks < 1:
        raise ValueError(f"--dimms {cfg.dimms} --ranks {cfg.ranks}: expected >= 1 each")
    mem_words = _MAX_MEM_WORDS if cfg.mem_words is None else cfg.mem_words
    try:
        _config(cfg, preset, mem_words)
    except ValueError as exc:   # NMEConfig's messages read "field=value: expected ..."
        field, _, rest = str(exc).partition("=")
        raise ValueError(f"--{field.replace('_', '-')} {rest}") from None
    return preset


#: the options of a run (its files, where it runs): with --make-example, which runs nothing,
#: they would do nothing and are refused (the NME's geometry and units are checked as a
#: run checks them, so one set of those flags serves both commands)
_RUN_OPTIONS = ("inputs", "out", "backend", "dram", "nme_mhz")


def _check_unused(cfg: NMERunConfig) -> None:
    """Refuse an option given on the command line (also at its default value) that would do
    nothing, instead of ignoring it: with ``--make-example`` (it writes inputs and runs
    nothing) the options of a run, :data:`_RUN_OPTIONS`; ``--seed`` without
    ``--make-example``. Raises ValueError naming the option."""
    default = defaults(NMERunConfig)
    if cfg.make_example is not None:
        for name in _RUN_OPTIONS:
            if given(cfg, name, default[name]):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {getattr(cfg, name)}: --make-example writes example "
                                 f"inputs and runs nothing, expected no {flag} with "
                                 "--make-example")
    elif given(cfg, "seed", default["seed"]):
        raise ValueError(f"--seed {cfg.seed}: the seed of --make-example's inputs, expected no "
                         "--seed without --make-example")


def _config(cfg: NMERunConfig, preset: NMEPreset, mem_words: int) -> NMEConfig:
    """The NME of the options: lanes, format, depth, the units' and operand path's register
    stages (``preset``, of ``--preset``, ``--mul-latency``, ``--add-latency``,
    ``--operand-latency``), whether stores trail (``--trail-stores``), ``mem_words``."""
    return NMEConfig(lanes=cfg.lanes, fmt=cfg.fmt, depth=cfg.depth, mem_words=mem_words,
                     trail_stores=cfg.trail_stores == "on", **preset.units())


def _check_waves(cfg: NMERunConfig) -> None:
    """``--waves``: only for a run on the NME RTL (``--backend rtl``, no ``--dram``, no
    ``--make-example``) and a writable file path ending in .fst; ValueError otherwise."""
    waves = cfg.waves
    if waves is None:
        return
    if cfg.make_example is not None:
        raise ValueError(f"--waves {waves}: --make-example runs nothing to record")
    if cfg.backend != "rtl":
        raise ValueError(f"--waves {waves}: waveforms come from the RTL simulator, "
                         f"expected --backend rtl (got --backend {cfg.backend})")
    if cfg.dram is not None:
        raise ValueError(f"--waves {waves}: not available with --dram (the DIMM-NMP "
                         f"cosimulation); waveforms are of the NME on an ideal memory")
    if check_output_path(waves, "--waves").suffix != ".fst":
        raise ValueError(f"--waves {waves}: expected a file name ending in .fst")


def _check_out(path: str, flag: str) -> Path:
    """``Path(path)`` if an output .npz file can be created there (coda.cli's check, and no
    "-": an .npz file cannot go to stdout); ValueError naming ``flag`` otherwise."""
    if path == "-":
        raise ValueError(f"{flag} -: an .npz file cannot go to stdout, expected a file path")
    return check_output_path(path, flag)


def _run(cfg: NMERunConfig, preset: NMEPreset) -> int:
    """Run the operator of ``cfg`` on the NME of ``preset``'s units (the options checked):
    read the inputs, run, write the output and print the summary; returns 0."""
    spec = ref.get_op(cfg.op)
    out = _check_out(cfg.out, "--out")
    inputs = read_inputs(cfg.inputs, cfg.op, cfg.fmt)
    tensors = {n: inputs[n] for n in spec.inputs}
    params = {n: inputs[n] for n in spec.params}
    meta = {n: torch.empty_like(t, device="meta") for n, t in tensors.items()}
    spec(**meta, **params)  # shape errors before any memory is sized
    waves = cfg.waves
    nme_mhz = cfg.nme_mhz
    if nme_mhz is not None and cfg.dram is None:
        raise ValueError(f"--nme-mhz {nme_mhz:g}: only with --dram (the NME's own clock meets "
                         f"the DRAM controller's; an ideal memory has no clock)")
    backend = get_backend(cfg.backend, dram=cfg.dram, dimms=cfg.dimms, ranks=cfg.ranks,
                          **({"waves": waves} if waves else {}),
                          **({"nme_mhz": nme_mhz} if nme_mhz is not None else {}))
    try:
        nme = _config(cfg, preset, cfg.mem_words or _MAX_MEM_WORDS)
        if not cfg.mem_words:   # sized by the placement the driver makes
            nme = replace(nme, mem_words=fit_mem_words(
                backend, nme, cfg.op, {n: tuple(t.shape) for n, t in tensors.items()},
                params.get("group"), cfg.dimms, cfg.ranks, min_words=_MIN_MEM_WORDS,
                max_words=_MAX_MEM_WORDS))
        driver = NMPDriver(backend, nme, dimms=cfg.dimms, ranks=cfg.ranks)
        start = time.perf_counter()
        result = driver.run_op(cfg.op, **tensors, **params)
        wall = time.perf_counter() - start
    finally:
        if waves:
            backend.close()   # the simulators finish their FST files as they exit
    out.parent.mkdir(parents=True, exist_ok=True)
    arrays = ({"l1": np.float32(result)} if spec.output == "l1" else {"y": to_bits(result)})
    with atomic_write(out) as fh:   # a file object: numpy keeps the name (no ".npz" appended)
        np.savez(fh, **arrays)
    shown = f"l1={result:.6g}" if spec.output == "l1" else f"y{list(result.shape)}"
    first = tensors[spec.inputs[0]]
    timing = ""
    last = getattr(backend, "last", None)
    if cfg.dram and last is not None:   # the DIMM-NMP's last job: both clocks
        timing = (f"nme_mhz={last.nme_mhz:.6g} ns={last.ns:.1f} job_nme_cycles={last.cycles} "
                  f"dram_cycles={last.dram_cycles} ")
    print(preset.describe())    # the top of the output: which NME ran
    print(f"{cfg.op} {cfg.fmt} {spec.inputs[0]}{list(first.shape)} -> {shown} "
          f"backend={cfg.backend} dimms={cfg.dimms} ranks={cfg.ranks} lanes={cfg.lanes} "
          f"{'dram=' + cfg.dram + ' ' if cfg.dram else ''}{timing}"
          f"nme_cycles={driver.stats['nme_cycles']} programs={driver.stats['rank_programs']} "
          f"wall={wall * 1e3:.1f} ms -> {out}"
          + (f" waves={','.join(str(p) for p in backend.wave_files)}" if waves else ""))
    return 0


def read_inputs(path: str | Path, op: str, fmt: str) -> dict:
    """Load the inputs of ``op`` from a .npz file: float inputs as ``fmt`` tensors (from
    uint16 bit patterns), ``q`` as an int8 tensor, ``group`` as an int.

    Raises FileNotFoundError, or ValueError naming the file and what is wrong with it (not
    an .npz archive of arrays, missing key, bad dtype) and what was expected.
    """
    spec = ref.get_op(op)
    torch_dtype(fmt)
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"inputs file {str(path)!r} is a folder, expected an .npz file")
    if not path.is_file():
        raise FileNotFoundError(f"inputs file {str(path)!r} does not exist")
    arrays = _load_npz(path)
    needed = spec.inputs + spec.params
    missing = [n for n in needed if n not in arrays]
    if missing:
        raise ValueError(f"{str(path)!r} has no array {missing[0]!r}: op {op} needs "
                         f"{list(needed)}, the file has {sorted(arrays)}")
    out: dict = {}
    for name in spec.inputs:
        arr = arrays[name]
        if name == "q":
            if arr.dtype != np.int8:
                raise ValueError(f"array 'q' has dtype {arr.dtype}, expected int8")
            out[name] = torch.from_numpy(arr.copy())
        else:
            if arr.dtype != np.uint16:
                raise ValueError(f"array {name!r} has dtype {arr.dtype}, expected uint16 "
                                 f"(raw {fmt} bit patterns)")
            out[name] = from_bits(arr, fmt)
    for name in spec.params:
        arr = arrays[name]
        if arr.shape != () or arr.dtype.kind not in "iu":
            raise ValueError(f"array {name!r} is {arr.dtype} of shape {arr.shape}, "
                             f"expected an integer scalar")
        out[name] = int(arr)
    return out


def _load_npz(path: Path) -> dict:
    """The arrays of an .npz file (a zip archive of .npy arrays, loaded without pickle)."""
    def bad(why) -> ValueError:
        return ValueError(f"{str(path)!r} is not a readable .npz file ({why})")

    if not zipfile.is_zipfile(path):   # else np.load tries .npy, then pickle
        raise bad("not a zip archive")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise bad(exc) from None
    for name, arr in arrays.items():
        if not isinstance(arr, np.ndarray):   # np.load gives other members as bytes
            raise bad(f"member {name!r} is not a .npy array")
    return arrays


def make_example(path: str | Path, op: str, fmt: str = "bf16", lanes: int = NMEConfig.lanes,
                 seed: int = 0) -> Path:
    """Write a runnable example input file for ``op``: T = 37 tokens (uneven over ranks),
    C = 4 * lanes channels, N = T*C + 5 elements for flat operators (a masked tail), K = 3
    segment terms, group G = 2 * lanes; values normal(0, 1) rounded to ``fmt`` (scales and
    gates uniform in [0, 1)); deterministic for a given ``seed``. Returns the path, written
    under exactly that name, whole or not at all (:func:`coda.paths.atomic_write`). Raises
    OSError naming the path when it cannot be written (e.g. a full disk).
    """
    spec = ref.get_op(op)
    dtype = torch_dtype(fmt)
    NMEConfig(lanes=int(lanes), fmt=fmt)   # lanes / fmt as an NME accepts them
    gen = torch.Generator().manual_seed(int(seed))
    t, c, k, group = 37, 4 * int(lanes), 3, 2 * int(lanes)
    n = t * c + 5

    def normal(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    def unit(*shape):
        return torch.rand(*shape, generator=gen).to(dtype)

    if op in ("add", "sub", "mul", "l1_distance"):
        arrays = {"a": normal(n), "b": normal(n)}
    elif op == "scale":
        arrays = {"a": normal(t, c), "s": unit(c)}
    elif op == "gated_residual":
        arrays = {"x": normal(t, c), "g": unit(c), "c": normal(t, c)}
    elif op == "segment":
        arrays = {"x": normal(t, c), "g": unit(k, c), "c": normal(k, t, c)}
    elif op == "cfg_combine":
        arrays = {"u": normal(t, c), "c": normal(t, c), "s": torch.tensor(7.5, dtype=dtype)}
    else:  # dequant_int8
        q = torch.randint(-128, 128, (t, c), generator=gen, dtype=torch.int8)
        arrays = {"q": q, "scale": unit(t, c // group) / 64}
    assert set(arrays) == set(spec.inputs)
    out = {name: (v.numpy() if v.dtype == torch.int8 else to_bits(v)) for name, v in arrays.items()}
    if spec.params:
        out["group"] = np.int64(group)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as fh:   # a file object: numpy keeps the name (no ".npz" appended)
        np.savez(fh, **out)
    return path
