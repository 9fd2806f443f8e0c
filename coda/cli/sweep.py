"""``coda sweep KIND``: a parameter grid of one kind of work, every point a task on Ray.

``coda sweep sim --param model=wan2.1-14b,cogvideox-5b --param dimms=2,4 --out DIR`` runs the
Cartesian product of the ``--param`` lists (and/or of a ``--grid FILE.toml``) through
:mod:`coda.sweep` and prints a table of the points; records go to ``DIR/results.jsonl``.
Exit status: 0 every point ok, 1 some point failed (recorded), 2 bad input (nothing ran), 130
interrupted (finished points kept). Values are checked for their type before anything runs
and for their range by the point that uses them. The kinds (``synth``, ``bench``,
``schedule``, ``sim``; each declared by the module that owns the work, its parameters with
``coda sweep KIND --list``), the records and resuming: ``docs/sweeps.md``. :func:`main` takes
the command's :class:`SweepConfig` (``CONFIG``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from coda.options import add_options, option
from coda.sweep import RayOptions

__all__ = ["kinds", "SweepConfig", "CONFIG", "configure", "main"]


def kinds() -> dict:
    """The sweep kinds by name (coda.sweep.SweepKind)."""
    from coda.experiments.design_space import sweep_kind as bench
    from coda.experiments.search import sweep_kind as schedule
    from coda.host.system.sim import sweep_kind as sim
    from coda.host.system.serving import sweep_kind as serve
    return {k.name: k for k in (bench(), schedule(), sim(), serve())}


#: the kinds of ``coda sweep`` (the NME's synthesis grid is ``coda synth-sweep``'s: one command
#: per job, with its tables, bandwidth bound and plot)
KIND_NAMES = ("bench", "schedule", "sim", "serve")


@dataclass(frozen=True)
class SweepConfig(RayOptions):
    """Every option of ``coda sweep`` with its default (the one source of them; where its
    points run, :class:`coda.sweep.RayOptions`, as every sweep's; the parameters of each kind
    and their defaults: ``coda sweep KIND --list``). Checked when made: the kind (ValueError naming it)."""
    kind: str = option(None, f"one of {', '.join(KIND_NAMES)}", type=str, positional=True,
                       required=True, metavar="KIND")
    param: tuple[str, ...] = option((), "a parameter and its values (repeatable; the grid is "
                                    "the product)", type=str, action="append",
                                    metavar="NAME=V1,V2,...")
    grid: str = option(None, "TOML grid: NAME = value or NAME = [v1, v2, ...] per line",
                       type=str, metavar="FILE.toml")
    out: str = option(None, "sweep folder: results.jsonl, points/", type=str,
                      default_text="build/sweep/KIND")
    no_progress: bool = option(False, "no progress bar")
    list: bool = option(False, "print KIND's parameters and defaults, run nothing")

    def __post_init__(self):
        if self.kind not in KIND_NAMES:
            raise ValueError(f"sweep kind {self.kind!r}: expected one of "
                             f"{', '.join(KIND_NAMES)} (a kind's parameters: coda sweep KIND "
                             "--list)")


#: the config of ``coda sweep``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = SweepConfig


def configure(parser) -> None:
    """Options of ``coda sweep``: :class:`SweepConfig` (where its points run included)."""
    add_options(parser, SweepConfig)


def main(cfg: SweepConfig) -> int:
    """Run ``coda sweep`` of ``cfg`` (its :class:`SweepConfig`): the grid of ``--param`` and
    ``--grid`` checked before anything runs, every point a task (:func:`coda.sweep.run_sweep`),
    then the table. Returns 0 (every point ok, or ``--list``), 1 (some point failed), 130
    (interrupted); bad input: ValueError (``coda: error:``, exit 2)."""
    from coda.paths import check_output_path
    from coda.sweep import grid_points, load_grid, parse_param, run_sweep

    kind = kinds()[cfg.kind]
    if cfg.list:
        for p in kind.params:
            print(f"{p.name:12s} {p.type.__name__:6s} default {p.default!r}")
        return 0
    grid: dict[str, list] = {}
    if cfg.grid is not None:
        grid.update(load_grid(kind, cfg.grid))
    for text in cfg.param:
        name, values = parse_param(kind, text)
        if name in grid:
            raise ValueError(f"--param {text!r}: {name} is given twice")
        grid[name] = values
    points = grid_points(kind, grid)
    if cfg.workers is not None and cfg.workers < 1:
        raise ValueError(f"--workers {cfg.workers}: expected >= 1")
    out = check_output_path(f"build/sweep/{kind.name}" if cfg.out is None else cfg.out,
                            "--out", folder=True)
    try:
        records = run_sweep(kind, points, out, address=cfg.address, workers=cfg.workers,
                            sequential=cfg.sequential, progress=not cfg.no_progress)
    except KeyboardInterrupt:
        done = Path(out) / "results.jsonl"
        print("coda: interrupted; " + (f"the points finished so far are in {done} (a rerun "
                                       "resumes)" if done.exists() else "no point had finished"),
              file=sys.stderr)
        return 130
    _print_table(kind, grid, records)
    failed = sum(r["status"] != "ok" for r in records)
    print(f"{len(records) - failed} points ok, {failed} failed: {Path(out) / 'results.jsonl'}")
    return 1 if failed else 0


def _print_table(kind, grid: dict, records: list[dict]) -> None:
    """The points as a table: the parameters the grid varies, the first figures, status."""
    from rich.console import Console
    from rich.table import Table

    varied = [k for k, v in grid.items() if len(v) > 1] or list(grid)
    figures = list(kind.headline)
    if not figures:
        for r in records:
            figures += [k for k in r["figures"] if k not in figures]
        figures = figures[:8]
    t = Table(title=f"coda sweep {kind.name}")
    for col in [*varied, *figures, "status", "wall s", "host"]:
        t.add_column(col, justify="right")
    for r in records:
        cells = [str(r["params"].get(k)) for k in varied]
        cells += [_fmt(r["figures"].get(k)) for k in figures]
        cells += [r["status"] if r["status"] == "ok" else f"failed: {r['error'][:60]}",
                  "" if r.get("wall_s") is None else f"{r['wall_s']:.1f}", str(r.get("host"))]
        t.add_row(*cells)
    Console(width=200).print(t)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)
