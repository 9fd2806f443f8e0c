"""How close the NME comes to one word per pass per cycle on a long stream: a compiled cache
operator's cycles from the cycle model (:func:`coda.hw.nme.cycles.model_cycles`, exact
against the RTL) against its ideal, ``passes x words`` (every pass takes one word per cycle,
nothing else costs time).

``coda pass-efficiency`` prints one row per (units, trail, depth): cycles, ideal cycles, their
ratio (words per pass per cycle, <= 1). ``--units M,A,O`` are the NME's ``mul_latency, add_latency,
operand_latency``, ``--trail-stores on|off|both`` its ``trail_stores``
(:class:`coda.hw.nme.isa.NMEConfig`); the NME has 8 lanes, bf16. :func:`main` takes the
command's :class:`PassEfficiencyConfig` (``CONFIG``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

from coda.hw.nme.isa import NMEConfig, Status
from coda.hw.nme.cycles import model_cycles
from coda.cosim.nme.units import COMBINATIONAL, parse_units
from coda.host.nme import compiler
from coda.jsonout import json_text
from coda.options import add_options, option
from coda.paths import check_output_path, write_file

__all__ = ["OPS", "efficiency", "PassEfficiencyConfig", "CONFIG", "configure", "main"]

#: Operators measured, and their input shapes from (tokens T, channels C).
OPS = {
    "gated_residual": lambda t, c: {"x": (t, c), "g": (c,), "c": (t, c)},
    "add": lambda t, c: {"a": (t * c,), "b": (t * c,)},          # the compiler's add is 1-D
}


def efficiency(op: str, tokens: int, channels: int, cfg: NMEConfig,
               mem_latency: int = 1) -> dict:
    """Cycles of ``op`` over a ``[tokens, channels]`` stream on an NME ``cfg`` with a memory
    that answers every read after ``mem_latency`` cycles, and its ideal.

    Returns ``{"cycles", "ideal", "ratio", "passes", "words"}``: NME cycles (int), ideal
    cycles ``passes * words`` (micro-ops x words of ``cfg.lanes`` elements), ``ideal /
    cycles`` (float, <= 1). Raises ValueError for an unknown ``op`` or shapes the compiler
    refuses (e.g. ``channels`` not a multiple of the lanes)."""
    if op not in OPS:
        raise ValueError(f"op={op!r}: expected one of {sorted(OPS)}")
    shapes = OPS[op](tokens, channels)
    # room for any stream; the compiler's layout (as the driver uses it) decides whether the
    # stores may trail later reads (coda.hw.nme.check.stores_may_trail)
    cfg = replace(cfg, mem_words=1 << 24)
    layout, _ = compiler.plan_layout(op, cfg, shapes)
    program = compiler.compile_op(op, cfg, shapes, layout)
    cycles = model_cycles(cfg, program, Status.OK, mem_latency)
    n_words = -(-program.n_elems // cfg.lanes)
    ideal = len(program.uops) * n_words
    return {"cycles": cycles, "ideal": ideal, "ratio": round(ideal / cycles, 4),
            "passes": len(program.uops), "words": n_words}


@dataclass(frozen=True)
class PassEfficiencyConfig:
    """Every option of ``coda pass-efficiency`` with its default (the one source of them).
    Checked when made: ``--units`` (:meth:`unit_stages`), ``--depths`` (:meth:`depth_list`);
    ValueError naming the option."""
    op: str = option("gated_residual", "operator", choices=tuple(sorted(OPS)))
    tokens: int = option(16384, "tokens T of the [T, C] stream")
    channels: int = option(64, "channels C of the [T, C] stream")
    depths: str = option("16,64,256", "comma-separated buffer depths", unit="words")
    units: tuple[str, ...] = option((COMBINATIONAL, "3,5,1"), "M,A,O per NME: mul, add and operand "
                          "latency (register stages)", nargs="+", metavar="M,A,O")
    latency: int = option(1, "memory read latency", unit="cycles")
    trail_stores: str = option("both", "NMEConfig.trail_stores: stores trail the next blocks' "
                               "reads (both: a row each)", choices=("on", "off", "both"))
    json: Path = option(None, "write the rows to this file", type=Path)

    def __post_init__(self):
        self.unit_stages()
        self.depth_list()

    def unit_stages(self) -> list[tuple[int, int, int]]:
        """``--units`` as (mul, add, operand) register stages, one per NME
        (:func:`coda.cosim.nme.units.parse_units`; ValueError naming ``--units``)."""
        return [parse_units(u, "--units") for u in self.units]

    def depth_list(self) -> list[int]:
        """``--depths`` as ints (ValueError naming ``--depths``)."""
        try:
            return [int(d) for d in self.depths.split(",") if d]
        except ValueError:
            raise ValueError(f"--depths {self.depths!r}: expected comma-separated ints") from None


#: the config of ``coda pass-efficiency``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = PassEfficiencyConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda pass-efficiency``: :class:`PassEfficiencyConfig`."""
    add_options(parser, PassEfficiencyConfig)


def main(cfg: PassEfficiencyConfig) -> int:
    """Print the table of ``cfg`` (the command's :class:`PassEfficiencyConfig`; and write
    ``--json``); returns 0. A bad option (``--units`` out of range, channels the lanes do not
    divide): ValueError, ``coda: error:``, exit 2."""
    units = cfg.unit_stages()
    out = None if cfg.json is None else check_output_path(cfg.json, "--json")
    depths = cfg.depth_list()
    rows = []
    trails = {"on": (True,), "off": (False,), "both": (False, True)}[cfg.trail_stores]
    for m, a, o in units:
        for trail in trails:
            for depth in depths:
                nme = NMEConfig(depth=depth, mul_latency=m, add_latency=a,
                                operand_latency=o, trail_stores=trail)
                rows.append({"units": f"{m},{a},{o}", "trail": "on" if trail else "off",
                             "depth": depth, **efficiency(cfg.op, cfg.tokens,
                                                          cfg.channels, nme, cfg.latency)})
    print(f"{cfg.op} [{cfg.tokens}, {cfg.channels}], 8 lanes bf16, memory latency "
          f"{cfg.latency}: units (mul,add,operand)  trail  depth  cycles  ideal  "
          "words/pass/cycle")
    for r in rows:
        print(f"  {r['units']:>7}  {r['trail']:>5}  {r['depth']:>5}  {r['cycles']:>9,}  "
              f"{r['ideal']:>9,}  {r['ratio']:.3f}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_file(out, json_text({"op": cfg.op, "tokens": cfg.tokens, "channels": cfg.channels,
                                   "rows": rows}, indent=1))
    return 0
