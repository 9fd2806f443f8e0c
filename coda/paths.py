"""Output paths and result files shared by every command (a base helper: it imports
nothing of coda).

Commands check their output paths before any work (:func:`check_output_path`), so a bad
path costs nothing and leaves no partial output. They write each result file through
:func:`atomic_write` / :func:`write_file`: into a temporary file beside it, renamed over it
once complete, so a write that fails (a full disk) leaves no truncated file, the old one if
any untouched, and its error names the file.

Files and folders a process owns for the time it runs (simulator work folders, rank memory
files, the temporary files of :func:`atomic_write`) carry its pid in their names,
``<prefix>-<pid>-...``; :func:`remove_orphans` deletes those whose process is gone (killed
by a signal it could not clean up after: SIGTERM, SIGKILL), as the next owner of the folder
starts.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterator

__all__ = ["check_output_path", "atomic_write", "write_file", "save_figure", "owned_name",
           "remove_orphans"]


def check_output_path(path: str | os.PathLike, flag: str, *, folder: bool = False) -> Path:
    """Check, before any work, that an output file (``folder``: an output folder) can be
    created at ``path``.

    Returns ``Path(path)``. Raises ValueError naming ``flag`` when ``path`` is empty or
    ``-`` (no command writes these outputs to standard output; ``coda verilog -o -`` handles
    ``-`` itself), is an existing folder where a file is wanted, or has a file where a folder
    is needed (folders that do not exist yet are fine: the writer creates them), or when
    the file cannot be written or nothing can be created in the nearest existing folder
    (permissions, a read-only or pseudo file system; also for an existing file, which
    :func:`atomic_write` replaces with a new one)."""
    out = Path(path)
    what = "folder" if folder else "file"
    if str(path) in ("", "-"):
        raise ValueError(f"{flag} {str(path)!r}: expected a {what} path")
    if not folder and out.is_dir():
        raise ValueError(f"{flag} {path}: is a folder, expected a file path")
    for up in ((out,) if folder else ()) + tuple(out.parents):
        if up.exists() and not up.is_dir():
            raise ValueError(f"{flag} {path}: {up} is a file, expected a folder")
    replace = not folder and out.exists()
    if replace and not os.access(out, os.W_OK):
        raise ValueError(f"{flag} {path}: cannot be written (permission denied)")
    # the nearest folder that exists must take a new entry (an existing file is replaced by
    # a new one, atomic_write): probed by making (and removing) an empty folder there, which
    # also catches read-only and pseudo file systems (/proc) where permission bits say yes
    base = next(up for up in ((out,) if folder else ()) + tuple(out.absolute().parents)
                if up.exists())
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".coda-probe-", dir=base))
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot {'replace' if replace else 'create'} it in "
                         f"{base} ({exc.strerror or exc})") from None
    return out


def owned_name(prefix: str) -> str:
    """A fresh name ``<prefix>-<pid>-<random hex>`` for a file or folder this process owns
    while it runs (:func:`remove_orphans` deletes it once the process is gone)."""
    return f"{prefix}-{os.getpid()}-{secrets.token_hex(6)}"


def remove_orphans(folder: str | os.PathLike, prefix: str) -> list[Path]:
    """Delete the entries of ``folder`` named ``<prefix>-<pid>-...`` (files, and folders
    with what they hold) whose process ``pid`` no longer exists; returns them. Entries of
    live processes (also other users'), names without a pid and a missing ``folder`` are
    left alone. A pid is only known on this machine: owners on other machines sharing the
    folder are not told apart."""
    removed = []
    try:
        entries = list(Path(folder).glob(f"{glob.escape(prefix)}-*-*"))
    except OSError:
        return removed
    for path in entries:
        pid = path.name[len(prefix) + 1:].split("-", 1)[0]
        if not pid.isdigit() or int(pid) <= 0:
            continue                      # not one of ours
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
        except (PermissionError, OverflowError):
            pass                          # alive, another user's (or no pid of this system)
    return removed


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Write the file ``path`` as a whole or not at all: yields a file object open for
    writing (``mode`` ``"wb"`` or ``"w"``, text as UTF-8) on a temporary file in the same
    folder, ``.<name>.tmp-<pid>-<hex>``, which replaces ``path`` (:func:`os.replace`) when
    the block ends without an error. An existing ``path`` keeps its permission bits (a new
    one gets the usual ``0o666`` less the umask); a symbolic link is written through.

    On any error the temporary file is removed and ``path`` stays as it was. Raises OSError
    naming ``path`` (``exc.filename``; ``[Errno 28] No space left on device`` for a full
    disk) when the temporary file cannot be created, written or renamed, ValueError for
    another ``mode``, and whatever the block raises otherwise."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write mode {mode!r}: expected 'wb' or 'w'")
    target = Path(path)
    if target.is_symlink():
        target = target.resolve()
    prefix = f".{target.name}.tmp"
    remove_orphans(target.parent, prefix)   # left by writers killed before their rename
    tmp = target.parent / owned_name(prefix)
    try:
        try:
            with open(tmp, "x" + mode[1:], **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
                yield fh
            if target.exists():
                os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
            os.replace(tmp, target)
        except OSError as exc:
            if exc.filename not in (None, str(tmp)):
                raise                 # about another file (one the writer read): as it is
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_file(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` (str: as UTF-8 text; bytes) to the file ``path`` through
    :func:`atomic_write`: the whole file or, on any error, no change. Returns
    ``Path(path)``. Raises OSError naming ``path`` (e.g. a full disk)."""
    with atomic_write(path, "w" if isinstance(data, str) else "wb") as fh:
        fh.write(data)
    return Path(path)


def save_figure(fig, path: str | os.PathLike, **kwargs) -> Path:
    """Save the matplotlib figure ``fig`` (``fig.savefig(..., **kwargs)``, e.g. ``dpi``) to
    ``path`` through :func:`atomic_write`, in the format its suffix names (PNG without one).
    Returns ``Path(path)``. Raises OSError naming ``path`` when it cannot be written."""
    with atomic_write(path) as fh:
        fig.savefig(fh, format=Path(path).suffix.lstrip(".") or "png", **kwargs)
    return Path(path)

