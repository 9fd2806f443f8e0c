"""A full disk for one file name: every file opened for writing whose name contains ``match``
takes ``room`` bytes, then its writes fail with ENOSPC (``[Errno 28] No space left on
device``) as a full file system's do, the bytes that fitted already written.

It patches ``open`` (``builtins.open`` and ``io.open``, what pathlib, PIL, numpy and json
writers call), so it fails the same writes whatever writes them.
"""

from __future__ import annotations

import builtins
import errno
import io
import os


class _FullFile:
    """A real file object whose ``write`` stops at ``room`` bytes with ENOSPC."""

    def __init__(self, fh, room: int):
        self._fh, self._room = fh, room

    def write(self, data):
        if len(data) > self._room:
            self._fh.write(data[:self._room])
            self._room = 0
            self._fh.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._fh.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __iter__(self):
        return iter(self._fh)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def fill_disk(monkeypatch, match: str, room: int = 100) -> None:
    """From now on (until the test ends) files whose path contains ``match``, opened for
    writing, fail with ENOSPC after ``room`` bytes."""
    real_open = builtins.open

    def full_open(file, mode="r", *args, **kwargs):
        fh = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and match in os.fspath(file) and \
                any(m in mode for m in "wax+"):
            return _FullFile(fh, room)
        return fh

    monkeypatch.setattr(builtins, "open", full_open)
    monkeypatch.setattr(io, "open", full_open)
