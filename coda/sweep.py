"""The sweep engine: every point of a parameter grid a task on Ray, results in one table.

A base helper (it imports nothing of coda): a sweep *kind* (:class:`SweepKind`) is declared by
the module that owns the work — ``coda.synth.sweep`` (ECP5 / generic synthesis),
``coda.cosim.bench`` (the DIMM-NMP design space), ``coda.host.search`` (annealing restarts),
``coda.host.system.sim`` (the system model) — and run here, either

- on **Ray** (:func:`run_sweep`, default): ``ray.init()`` starts a local Ray on this machine
  (``workers`` CPUs) or, with ``address``, joins an existing cluster; each point is one task
  of ``kind.cpus`` CPUs; or
- **sequentially** in this process (``sequential=True``), the loop the same points ran in
  before; both give the same figures (tests/test_sweep.py checks it).

Results go to ``OUT/results.jsonl``, one JSON object per finished point, appended as each
point ends (an interrupted sweep keeps what it measured):
``{"kind", "key", "params", "status": "ok" | "failed", "figures", "error", "wall_s",
"host", "node_id", "pid", "mode"}``. ``key`` is a hash of the kind and the full parameter set
(defaults included); a point whose key already has an ``ok`` record is skipped on the next
run (resumable); failed points run again. A point's files (reports, schedules, builds) go
to ``OUT/points/<kind.folder(params)>/``. A failure (any exception of the point function,
or a Ray worker that dies) is recorded with its error, and the sweep goes on.

Grids: ``--param NAME=V1,V2,...`` (repeatable) and/or a TOML file whose top-level keys are
parameter names with a value or a list of values; the grid is their Cartesian product, in
the order given. Values are converted to the parameter's type before any task starts; an
unknown kind or parameter, a value of the wrong type, an empty grid and an address where no
Ray cluster answers are refused with one line (ValueError) before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["Param", "SweepKind", "sources_digest", "parse_param", "load_grid", "grid_points", "check_address",
           "run_sweep", "read_results", "point_key", "MAX_POINTS"]

#: A bound of this tool (a typo like lanes=1..100000 should not queue 10^5 tasks)
MAX_POINTS = 10_000


@dataclass(frozen=True)
class Param:
    """One sweep parameter: ``type`` is int, float, str or bool; ``default`` is used when the
    grid does not name it (None: the point function's own default)."""
    name: str
    type: type
    default: Any = None
    help: str = ""

    def convert(self, value: Any) -> Any:
        """``value`` (a string from ``--param`` or a TOML scalar) as this parameter's type.
        Raises ValueError naming the parameter and the value."""
        if isinstance(value, str) and self.type is not str:
            text = value.strip()
            try:
                if self.type is bool:
                    if text.lower() not in ("true", "false", "1", "0"):
                        raise ValueError
                    return text.lower() in ("true", "1")
                return self.type(text)
            except ValueError:
                raise ValueError(f"{self.name}={value!r}: expected {self.type.__name__}") from None
        ok = (isinstance(value, self.type) and not (self.type is int and isinstance(value, bool))
              or (self.type is float and isinstance(value, int) and not isinstance(value, bool)))
        if not ok:
            raise ValueError(f"{self.name}={value!r}: expected {self.type.__name__}")
        return self.type(value)


@dataclass(frozen=True)
class SweepKind:
    """A kind of sweep point, declared by the module that owns the work.

    ``run(params, workdir) -> dict`` computes one point: ``params`` holds every parameter of
    ``params`` (defaults filled in), ``workdir`` is the point's own folder (created). It
    returns the point's figures, a flat dict of JSON scalars that depend only on the
    parameters (no wall times: those go in ``timing`` under the key ``"timing"`` if wanted),
    and raises on failure. ``folder(params)`` names the point's folder (default: kind and
    key). ``cpus``: CPUs one point uses (its Ray task's ``num_cpus``). ``headline``: the
    figures a table of the sweep shows first. ``version``: a digest of the sources the
    figures depend on (:func:`sources_digest`); it is part of every point's key, so a
    changed design is measured again instead of reusing a stale record.
    """
    name: str
    run: Callable[[dict, Path], dict]
    params: tuple[Param, ...]
    description: str = ""
    cpus: float = 1.0
    folder: Callable[[dict], str] | None = None
    headline: tuple[str, ...] = ()
    version: str = ""

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise ValueError(f"parameter {name!r} of sweep kind {self.name!r}: expected one of "
                         f"{', '.join(p.name for p in self.params)}")

    def full(self, point: dict) -> dict:
        """``point`` with the defaults of the parameters it does not name."""
        return {p.name: point.get(p.name, p.default) for p in self.params}

    def folder_name(self, params: dict) -> str:
        return self.folder(params) if self.folder else f"{self.name}-{point_key(self, params)}"


def point_key(kind: SweepKind, params: dict) -> str:
    """Stable 12-hex-digit key of a point: the kind, its version and its full parameters."""
    text = json.dumps({"kind": kind.name, "version": kind.version,
                       "params": kind.full(params)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def sources_digest(*paths: str | os.PathLike) -> str:
    """SHA-256 (16 hex digits) of the files named and of every ``*.py`` under the folders
    named (names and bytes, sorted)."""
    digest = hashlib.sha256()
    for top in paths:
        top = Path(top).resolve()
        for path in [top] if top.is_file() else sorted(top.rglob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# ----------------------------------------------------------------------------- grids
def parse_param(kind: SweepKind, text: str) -> tuple[str, list]:
    """``"NAME=V1,V2,..."`` -> (name, converted values). Raises ValueError naming the bad
    part: no ``=``, an unknown name, an empty list or item, a value of the wrong type."""
    name, sep, values = str(text).partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"--param {text!r}: expected NAME=V1,V2,...")
    p = kind.param(name)
    items = [v.strip() for v in values.split(",")]
    if not values.strip() or any(v == "" for v in items):
        raise ValueError(f"--param {text!r}: expected a comma list of values with no empty item")
    return name, [p.convert(v) for v in items]


def load_grid(kind: SweepKind, path: str | os.PathLike) -> dict[str, list]:
    """Read a TOML grid: top-level ``name = value`` or ``name = [v1, v2, ...]``.
    Raises ValueError for unreadable TOML, an unknown name, a nested table or an empty list;
    OSError for a missing file."""
    text = Path(path).read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--grid {path}: not valid TOML ({exc})") from None
    grid = {}
    for name, value in data.items():
        p = kind.param(name)
        if isinstance(value, dict):
            raise ValueError(f"--grid {path}: {name} is a table, expected a value or a list")
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError(f"--grid {path}: {name} is an empty list")
        grid[name] = [p.convert(v) for v in values]
    return grid


def grid_points(kind: SweepKind, grid: dict[str, list]) -> list[dict]:
    """The Cartesian product of ``grid`` (in its order), each point with the defaults filled
    in, duplicates dropped. Raises ValueError for an empty grid or more than MAX_POINTS."""
    if not grid:
        raise ValueError(f"empty grid: give --param NAME=V1,V2,... or --grid FILE.toml "
                         f"(parameters of {kind.name}: {', '.join(p.name for p in kind.params)})")
    n = 1
    for values in grid.values():
        n *= len(values)
    if n > MAX_POINTS:
        raise ValueError(f"the grid has {n} points: expected at most {MAX_POINTS}")
    names = list(grid)
    points, seen = [], set()
    for combo in itertools.product(*(grid[k] for k in names)):
        full = kind.full(dict(zip(names, combo)))
        key = point_key(kind, full)
        if key not in seen:
            seen.add(key)
            points.append(full)
    return points


# ----------------------------------------------------------------------------- Ray
def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Refuse, before any task, an address where no Ray cluster answers: ``host:port`` or
    ``ray://host:port`` must accept a TCP connection within ``timeout_s`` seconds (``auto``
    is checked by ray.init itself). Raises ValueError naming the address."""
    if address == "auto":
        return
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--address {address!r}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ValueError(f"--address {address}: no Ray cluster answers there "
                         f"({exc.strerror or exc})") from None


def _run_point(kind: SweepKind, params: dict, workdir: str, mode: str) -> dict:
    """One point, in a Ray worker or in this process: never raises (a failure is a record)."""
    t0 = time.perf_counter()
    rec = {"kind": kind.name, "key": point_key(kind, params), "params": params,
           "status": "ok", "figures": {}, "error": None, "host": socket.gethostname(),
           "pid": os.getpid(), "mode": mode, "node_id": None}
    try:
        import ray
        if ray.is_initialized() and mode == "ray":
            rec["node_id"] = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    try:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        figures = kind.run(dict(params), Path(workdir))
        if not isinstance(figures, dict):
            raise TypeError(f"{kind.name} returned {type(figures).__name__}, expected a dict")
        rec["timing"] = figures.pop("timing", None)
        json.dumps([figures, rec["timing"]])    # a figure JSON cannot hold fails this point
        rec["figures"] = figures
    except Exception as exc:   # a point's failure is data of the sweep, not its end
        rec["status"] = "failed"
        rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        try:
            (Path(workdir) / "error.txt").write_text(traceback.format_exc())
        except OSError:
            pass
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    return rec


def read_results(out: str | os.PathLike) -> list[dict]:
    """Every record of ``OUT/results.jsonl`` in file order (a torn last line, left by a
    killed run, is ignored)."""
    path = Path(out) / "results.jsonl"
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return recs


def run_sweep(kind: SweepKind, points: list[dict], out: str | os.PathLike, *,
              address: str | None = None, workers: int | None = None,
              sequential: bool = False, progress: bool = True,
              log: Callable[[str], None] = print) -> list[dict]:
    """Run the points of ``kind`` not yet done under ``out``; return one record per point
    (the newest for each, in the order of ``points``), done now or before.

    ``workers``: CPUs of the local Ray (default: all of this machine's); ignored with
    ``address`` (the cluster's CPUs are used). Ray processes started here are shut down
    before returning, also on Ctrl-C or an error. Raises ValueError for an unreachable
    ``address`` or ``workers < 1`` (before any task)."""
    out = Path(out)
    if workers is not None and workers < 1:
        raise ValueError(f"--workers {workers}: expected >= 1")
    if address is not None and sequential:
        raise ValueError("--address and --sequential: give one of them")
    if address is not None:
        check_address(address)
    out.mkdir(parents=True, exist_ok=True)
    done = {r["key"] for r in read_results(out) if r.get("status") == "ok"}
    todo = [p for p in points if point_key(kind, p) not in done]
    if len(todo) < len(points):
        log(f"{len(points) - len(todo)} of {len(points)} points already done in "
            f"{out / 'results.jsonl'}: skipped")
    results_path = out / "results.jsonl"

    def record(rec: dict) -> None:
        with results_path.open("a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
        if rec["status"] != "ok":
            log(f"point {rec['params']} FAILED: {rec['error'][:300]}")

    workdir = {point_key(kind, p): str(out / "points" / kind.folder_name(p)) for p in todo}
    if todo and sequential:
        bar = _bar(len(todo), progress, f"{kind.name} (sequential)")
        for p in todo:
            record(_run_point(kind, p, workdir[point_key(kind, p)], "sequential"))
            bar.update(1)
        bar.close()
    elif todo:
        _run_on_ray(kind, todo, workdir, address, workers, progress, record)
    newest = {r["key"]: r for r in read_results(out)}
    return [newest[k] for k in (point_key(kind, p) for p in points) if k in newest]


def _bar(total: int, enabled: bool, desc: str):
    from tqdm import tqdm
    return tqdm(total=total, disable=not enabled, desc=desc, unit="point")


def _run_on_ray(kind, todo, workdir, address, workers, progress, record) -> None:
    import ray

    t0 = time.perf_counter()
    started_here = not ray.is_initialized()
    if started_here:
        kwargs = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            if address is None:
                # "local": a new Ray of our own even where `ray start` left one running
                ray.init(address="local", num_cpus=workers or os.cpu_count(), **kwargs)
            else:
                ray.init(address=address, **kwargs)
        except ConnectionError as exc:
            raise ValueError(f"--address {address}: no Ray cluster answers there "
                             f"({str(exc).splitlines()[0] if str(exc) else 'ConnectionError'})"
                             ) from None
    startup_s = time.perf_counter() - t0
    task = ray.remote(num_cpus=kind.cpus, max_retries=0)(_run_point)
    pending = {}
    try:
        for p in todo:
            key = point_key(kind, p)
            pending[task.remote(kind, p, workdir[key], "ray")] = p
        bar = _bar(len(todo), progress, f"{kind.name} on Ray ({startup_s:.1f} s start-up)")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            p = pending.pop(ref)
            try:
                rec = ray.get(ref)
            except Exception as exc:   # the worker died (killed, out of memory, ...)
                rec = {"kind": kind.name, "key": point_key(kind, p), "params": p,
                       "status": "failed", "figures": {}, "timing": None,
                       "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}",
                       "host": None, "pid": None, "node_id": None, "mode": "ray",
                       "wall_s": None}
            record(rec)
            bar.update(1)
        bar.close()
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
