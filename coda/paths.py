"""Output-path checks shared by every command (a base helper: it imports nothing of coda).

Commands check their output paths before any work, so a bad path costs nothing and leaves
no partial output.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["check_output_path"]


def check_output_path(path: str | os.PathLike, flag: str, *, folder: bool = False) -> Path:
    """Check, before any work, that an output file (``folder``: an output folder) can be
    created at ``path``.

    Returns ``Path(path)``. Raises ValueError naming ``flag`` when ``path`` is empty or
    ``-`` (no command writes these outputs to standard output; ``coda verilog -o -`` handles
    ``-`` itself), is an existing folder where a file is wanted, or has a file where a folder
    is needed (folders that do not exist yet are fine: the writer creates them), or when
    the file cannot be written or nothing can be created in the nearest existing folder
    (permissions, a read-only or pseudo file system)."""
    out = Path(path)
    what = "folder" if folder else "file"
    if str(path) in ("", "-"):
        raise ValueError(f"{flag} {str(path)!r}: expected a {what} path")
    if not folder and out.is_dir():
        raise ValueError(f"{flag} {path}: is a folder, expected a file path")
    for up in ((out,) if folder else ()) + tuple(out.parents):
        if up.exists() and not up.is_dir():
            raise ValueError(f"{flag} {path}: {up} is a file, expected a folder")
    if not folder and out.exists():
        if not os.access(out, os.W_OK):
            raise ValueError(f"{flag} {path}: cannot be written (permission denied)")
        return out
    # the nearest folder that exists must take a new entry: probed by making (and removing)
    # an empty folder there, which also catches read-only and pseudo file systems (/proc)
    # where permission bits say yes
    base = next(up for up in ((out,) if folder else ()) + tuple(out.absolute().parents)
                if up.exists())
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".coda-probe-", dir=base))
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot create it in {base} "
                         f"({exc.strerror or exc})") from None
    return out
