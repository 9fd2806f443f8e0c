"""The sweep engine: every point of a parameter grid a task on Ray, results in one table.

A base helper (it imports only coda's other base helpers, coda.jsonout and coda.lists): a sweep
*kind* (:class:`SweepKind`) is declared by the module that owns the work
(``coda.experiments.area_sweep``, ``coda.experiments.design_space``,
``coda.experiments.search``, ``coda.host.system.sim``) and run here by :func:`run_sweep`, on
Ray (a local Ray with ``workers`` CPUs or, with ``address``, an existing cluster; each point
one task of ``kind.cpus`` CPUs) or sequentially in this process (``sequential=True``; the same
figures). Results go to ``OUT/results.jsonl``, one JSON object per finished point, appended
as each point ends; a point whose key already has an ``ok`` record is skipped on the next run,
failed points run again, and a failing point is recorded with its error while the sweep goes
on. The records, the grids and the refusals: ``docs/sweeps.md``.
"""

from __future__ import annotations

import hashlib
import fcntl
import itertools
import json
import math
import os
import signal
import socket
import threading
import time
import tomllib
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from coda.jsonout import json_text
from coda.lists import no_duplicates
from coda.options import option

__all__ = ["Param", "SweepKind", "sources_digest", "RayOptions", "parse_param", "load_grid", "grid_points", "check_address",
           "run_sweep", "read_results", "point_key", "MAX_POINTS"]

#: Bounds of this tool (a typo like lanes=1..100000 should not queue 10^5 tasks)
MAX_POINTS = 10_000
MAX_WORKERS = 1024


@dataclass(frozen=True)
class Param:
    """One sweep parameter: ``type`` is int, float, str or bool; ``default`` is used when the
    grid does not name it (None: the point function's own default)."""
    name: str
    type: type
    default: Any = None
    help: str = ""

    def convert(self, value: Any, *, text: bool = True) -> Any:
        """``value`` as this parameter's type: a string from ``--param`` (``text``) or a TOML
        scalar (``text=False``: a string is a string, not a number). Floats must be finite.
        Raises ValueError naming the parameter and the value."""
        given = value
        if isinstance(value, str) and self.type is not str and text:
            raw = value.strip()
            try:
                if self.type is bool:
                    if raw.lower() not in ("true", "false", "1", "0"):
                        raise ValueError
                    return raw.lower() in ("true", "1")
                value = self.type(raw)
            except ValueError:
                raise ValueError(f"{self.name}={value!r}: expected {self.type.__name__}") from None
        ok = (isinstance(value, self.type) and not (self.type is int and isinstance(value, bool))
              or (self.type is float and isinstance(value, int) and not isinstance(value, bool)))
        if not ok:
            raise ValueError(f"{self.name}={value!r}: expected {self.type.__name__}")
        if self.type is float and not math.isfinite(value):
            raise ValueError(f"{self.name}={given!r}: expected a finite number")
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


@dataclass(frozen=True)
class RayOptions:
    """Where a sweep's points run (the configs of ``coda sweep``, ``coda bench``, ``coda
    synth-sweep`` and ``coda mutation`` derive from it; :func:`run_sweep` checks them)."""
    workers: int = option(None, "CPUs of the local Ray running the points", type=int,
                          default_text="all")
    sequential: bool = option(False, "run the points one after another in this process, "
                              "no Ray")
    address: str = option(None, "run the points on the Ray cluster at HOST:PORT (or auto) "
                          "instead of a local Ray", type=str, default_text="a local Ray")


# ----------------------------------------------------------------------------- grids
def parse_param(kind: SweepKind, text: str) -> tuple[str, list]:
    """``"NAME=V1,V2,..."`` -> (name, converted values). Raises ValueError naming the bad
    part: no ``=``, an unknown name, an empty list or item, a value of the wrong type, a
    value given twice (:func:`coda.lists.no_duplicates`, the rule of every list option)."""
    name, sep, values = str(text).partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"--param {text!r}: expected NAME=V1,V2,...")
    p = kind.param(name)
    items = [v.strip() for v in values.split(",")]
    if not values.strip() or any(v == "" for v in items):
        raise ValueError(f"--param {text!r}: expected a comma list of values with no empty item")
    if any("=" in v for v in items):
        raise ValueError(f"--param {text!r}: a value holds '=' (a value with commas, like "
                         f"intervals=a=1,b=2?): give such values in a --grid TOML file")
    converted = [p.convert(v) for v in items]
    no_duplicates(converted, text, "--param", "distinct values")   # the rule of every list
    return name, converted


def load_grid(kind: SweepKind, path: str | os.PathLike) -> dict[str, list]:
    """Read a TOML grid: top-level ``name = value`` or ``name = [v1, v2, ...]``.
    Raises ValueError for unreadable TOML, an unknown name, a nested table, an empty list or
    a value listed twice; OSError for a missing file."""
    if str(path) == "":
        raise ValueError("--grid '': expected a TOML file path")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--grid {path}: not a UTF-8 text file") from None
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
        grid[name] = [p.convert(v, text=False) for v in values]
        no_duplicates(grid[name], values, f"--grid {path}: {name} =", "distinct values")
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
    """Refuse, before any task, an address where no Ray cluster answers: ``HOST:PORT`` must
    accept a TCP connection and answer the HTTP/2 preface as a gRPC server (Ray's GCS) does
    within ``timeout_s`` seconds (``auto`` is checked by ray.init itself). Raises ValueError
    naming the address."""
    if address == "auto":
        return
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not host or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise ValueError(f"--address {address!r}: expected HOST:PORT (the head node's GCS "
                         f"address, as `ray start --head` prints it) or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            # a Ray GCS is a gRPC server: it answers the HTTP/2 preface with a SETTINGS frame
            sock.settimeout(timeout_s)
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            head = b""
            while len(head) < 9:
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError as exc:
        raise ValueError(f"--address {address}: no Ray cluster answers there "
                         f"({exc.strerror or exc})") from None
    if len(head) < 9 or head[3] != 4:
        raise ValueError(f"--address {address}: something answers there, but not a Ray "
                         f"cluster's GCS (no gRPC / HTTP/2 reply)")


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
        # a figure JSON cannot hold (an object, NaN, infinity) fails this point
        json.dumps([figures, rec["timing"]], allow_nan=False)
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


def read_results(out: str | os.PathLike, kind: SweepKind | None = None) -> list[dict]:
    """Every record of ``OUT/results.jsonl`` in file order. A torn last line (left by a
    killed run) is ignored. Raises ValueError naming the file and line for anything else that
    is not a record of this engine (of ``kind``, when given)."""
    path = Path(out) / "results.jsonl"
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a UTF-8 text file, expected coda sweep records") from None
    recs = []
    for i, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                continue
            raise ValueError(f"{path} line {i}: not JSON, expected a coda sweep record "
                             "(use another --out)") from None
        if not isinstance(rec, dict) or not {"kind", "key", "status", "params"} <= set(rec):
            raise ValueError(f"{path} line {i}: not a coda sweep record (expected an object "
                             "with kind, key, status, params; use another --out)")
        if kind is not None and rec["kind"] != kind.name:
            raise ValueError(f"{path} holds records of sweep kind {rec['kind']!r}, this sweep "
                             f"is {kind.name!r}: use another --out")
        recs.append(rec)
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
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers {workers}: expected 1..{MAX_WORKERS}")
    if address is not None and sequential:
        raise ValueError("--address and --sequential: give one of them")
    if workers is not None and sequential:
        raise ValueError("--workers and --sequential: give one of them")
    if address is not None:
        check_address(address)
    done = {r["key"] for r in read_results(out, kind) if r.get("status") == "ok"}
    todo = [p for p in points if point_key(kind, p) not in done]
    if len(todo) < len(points):
        log(f"{len(points) - len(todo)} of {len(points)} points already done in "
            f"{out / 'results.jsonl'}: skipped")
    results_path = out / "results.jsonl"

    def record(rec: dict) -> None:
        out.mkdir(parents=True, exist_ok=True)
        if results_path.exists():     # drop a torn last line (a killed writer's) first
            data = results_path.read_bytes()
            if data and not data.endswith(b"\n"):
                with results_path.open("r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)
        with results_path.open("a") as f:
            f.write(json_text(rec, sort_keys=True) + "\n")
        if rec["status"] != "ok":
            log(f"point {rec['params']} FAILED: {rec['error'][:300]}")

    workdir = {point_key(kind, p): str(out.resolve() / "points" / kind.folder_name(p))
               for p in todo}
    with _exclusive(out, bool(todo)):
        if todo and sequential:
            bar = _bar(len(todo), progress, f"{kind.name} (sequential)")
            for p in todo:
                record(_run_point(kind, p, workdir[point_key(kind, p)], "sequential"))
                bar.update(1)
            bar.close()
        elif todo:
            _run_on_ray(kind, todo, workdir, address, workers, progress, record)
    newest = {r["key"]: r for r in read_results(out, kind)}
    return [newest[k] for k in (point_key(kind, p) for p in points) if k in newest]


class _exclusive:
    """Hold ``OUT/.lock`` while a sweep writes there (a second sweep on the same folder is
    refused instead of running every point twice)."""

    def __init__(self, out: Path, needed: bool):
        self.out, self.needed, self.fh = out, needed, None

    def __enter__(self):
        if self.needed:
            self.out.mkdir(parents=True, exist_ok=True)
            self.fh = open(self.out / ".lock", "w")
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.fh.close()
                raise ValueError(f"--out {self.out}: another sweep is writing there") from None
        return self

    def __exit__(self, *exc):
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            (self.out / ".lock").unlink(missing_ok=True)
            if not any(self.out.iterdir()):      # nothing ran (Ray did not start): no folder
                self.out.rmdir()


def _bar(total: int, enabled: bool, desc: str):
    from tqdm import tqdm
    return tqdm(total=total, disable=not enabled, desc=desc, unit="point")


def _run_on_ray(kind, todo, workdir, address, workers, progress, record) -> None:
    import ray

    t0 = time.perf_counter()
    started_here = not ray.is_initialized()
    main = threading.current_thread() is threading.main_thread()
    if started_here:
        kwargs = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        # Ctrl-C / SIGTERM / SIGHUP wait until Ray has started (one arriving mid-start-up
        # crashed the driver and orphaned Ray's processes); the processes Ray starts inherit
        # the mask and so ignore a terminal's Ctrl-C: this command shuts them down itself
        if main:
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            if address is None:
                # "local": a new Ray of our own even where `ray start` left one running
                ray.init(address="local", num_cpus=workers or os.cpu_count(), **kwargs)
            else:
                ray.init(address=address, **kwargs)
        except (ConnectionError, ImportError, RuntimeError) as exc:
            if main:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"--address {address}: no Ray cluster could be joined there "
                             f"({first})") from None
    previous = {}
    if main:       # SIGTERM / SIGHUP end the sweep as Ctrl-C does (Ray's handler aborts)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _interrupt)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
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
        if main:
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)   # a second Ctrl-C waits
        try:
            for ref in pending:
                ray.cancel(ref, force=True)
            if started_here:
                ray.shutdown()
        finally:
            if main:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)
