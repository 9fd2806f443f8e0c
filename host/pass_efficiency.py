"""How close the NME comes to one word per pass per cycle on a long stream: a compiled cache
operator's cycles from the cycle model (:func:`coda.hw.nme_cycles.model_cycles`, exact
against the RTL) against its ideal, ``passes x words`` (every pass takes one word per cycle,
nothing else costs time).

Usage::

    python -m coda.host.pass_efficiency [--op gated_residual] [--tokens 16384] [--channels 64]
        [--depths 16,64,256] [--units 0,0,0 3,5,1] [--latency 1] [--trail-stores both]
        [--json FILE]

prints one row per (units, trail, depth): cycles, ideal cycles, their ratio (words per pass
per cycle, <= 1). ``--units M,A,O`` are the NME's ``mul_latency, add_latency,
operand_latency``, ``--trail-stores on|off|both`` its ``trail_stores``
(:class:`coda.hw.isa.NMEConfig`); the NME has 8 lanes, bf16.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from coda.hw.isa import NMEConfig, Status
from coda.hw.nme_cycles import model_cycles
from coda.cosim.bench import parse_units
from coda.host import compiler
from coda.jsonout import json_text

__all__ = ["OPS", "efficiency", "main"]

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
    # stores may trail later reads (coda.hw.nme_check.stores_may_trail)
    cfg = replace(cfg, mem_words=1 << 24)
    layout, _ = compiler.plan_layout(op, cfg, shapes)
    program = compiler.compile_op(op, cfg, shapes, layout)
    cycles = model_cycles(cfg, program, Status.OK, mem_latency)
    n_words = -(-program.n_elems // cfg.lanes)
    ideal = len(program.uops) * n_words
    return {"cycles": cycles, "ideal": ideal, "ratio": round(ideal / cycles, 4),
            "passes": len(program.uops), "words": n_words}


def _units(text: str) -> tuple[int, int, int]:
    """``--units M,A,O`` (:func:`coda.cosim.bench.parse_units`) for argparse."""
    try:
        return parse_units(text, "--units")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write ``--json``); returns 0, or 2 for a bad option."""
    ap = argparse.ArgumentParser(prog="python -m coda.host.pass_efficiency",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="gated_residual", choices=sorted(OPS))
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--depths", default="16,64,256", help="buffer depths in words")
    ap.add_argument("--units", type=_units, nargs="+", default=[(0, 0, 0), (3, 5, 1)],
                    help="M,A,O per NME: mul, add and operand latency")
    ap.add_argument("--latency", type=int, default=1, help="memory read latency (cycles)")
    ap.add_argument("--trail-stores", choices=("on", "off", "both"), default="both",
                    help="NMEConfig.trail_stores: stores trail the next blocks' reads "
                         "(default both: a row each)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows to this file")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        depths = [int(d) for d in args.depths.split(",") if d]
        rows = []
        trails = {"on": (True,), "off": (False,), "both": (False, True)}[args.trail_stores]
        for m, a, o in args.units:
            for trail in trails:
                for depth in depths:
                    cfg = NMEConfig(depth=depth, mul_latency=m, add_latency=a,
                                    operand_latency=o, trail_stores=trail)
                    rows.append({"units": f"{m},{a},{o}", "trail": "on" if trail else "off",
                                 "depth": depth, **efficiency(args.op, args.tokens,
                                                              args.channels, cfg, args.latency)})
    except ValueError as exc:
        print(f"pass_efficiency: {exc}", file=sys.stderr)
        return 2
    print(f"{args.op} [{args.tokens}, {args.channels}], 8 lanes bf16, memory latency "
          f"{args.latency}: units (mul,add,operand)  trail  depth  cycles  ideal  "
          "words/pass/cycle")
    for r in rows:
        print(f"  {r['units']:>7}  {r['trail']:>5}  {r['depth']:>5}  {r['cycles']:>9,}  "
              f"{r['ideal']:>9,}  {r['ratio']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json_text({"op": args.op, "tokens": args.tokens,
                                         "channels": args.channels, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
