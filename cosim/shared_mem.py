"""The NME's rank memory in a file both the host and the Verilated simulator map.

The memory model of ``cosim/nme_top.sv`` keeps its words here, not in an HDL array: each read
and write of the NME is a DPI-C call (``cosim/shared_mem.cpp``) on the simulator's mapping of
the file, and the host writes and reads the same bytes as a numpy array. Nothing is loaded
into or dumped from the simulator between jobs: what the host writes (operands, cache
stores) is in the rank's memory for the next program, and what the NME writes is in the
host's array when the job ends. The simulator also lists the words the NME wrote since the
job started (a bitmap against repeats and a list of addresses), so a caller that gave its
own image learns which words changed without comparing whole images.

Layout of the file (this module defines it; the C++ side reads the offsets from the header,
so the two cannot disagree), little-endian:

====================  ================================================================
offset 0, 64 bytes    header: ``uint64`` magic ``"CODAMEM1"``, then ``uint32`` lanes,
                      words, ndirty, and ``uint64`` offsets of memory, bitmap, list
``mem_off``           the memory: uint16 ``[words, lanes]`` (element ``j`` of word ``w``
                      is bits ``[16j, 16j+16)`` of the ``16*lanes``-bit word)
``map_off``           dirty bitmap: uint8 ``[words]``, 1 if the word is in the list
``list_off``          dirty list: uint32 ``[words]``, the first ``ndirty`` addresses
                      written since the job started, in the order first written
====================  ================================================================

Where ``/dev/shm`` exists (Linux tmpfs) the backend's files live there, so the pages never go
to disk; elsewhere they are ordinary files in the simulator's work folder.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from pathlib import Path

import numpy as np

from coda.paths import owned_name, remove_orphans

__all__ = ["SharedMemory", "MAGIC", "HEADER_BYTES", "shm_folder", "memory_path", "remove_stale"]

MAGIC = b"CODAMEM1"
#: names of rank memory files: ``coda-mem-<pid>-<hex>`` (:func:`coda.paths.owned_name`)
MEMORY_PREFIX = "coda-mem"
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sIIIxxxxQQQ")     # magic, lanes, words, ndirty, pad, 3 offsets
_NDIRTY_OFFSET = 16                          # byte offset of ndirty in the header


def _align(n: int, to: int = 64) -> int:
    return -(-n // to) * to


def shm_folder() -> Path | None:
    """``/dev/shm`` where it is a writable folder (Linux), else None."""
    p = Path("/dev/shm")
    return p if p.is_dir() and os.access(p, os.W_OK) else None


class SharedMemory:
    """One rank's memory in a mapped file (see the module docstring for the layout).

    Use :meth:`create` (the host, before the simulator starts: a new zeroed memory) or
    :meth:`attach` (an existing file, e.g. inside the simulator's cocotb process).

    Attributes:
        path: the file. lanes, words: the geometry.
        mem: uint16 ``[words, lanes]``, a writable view of the mapped memory.
    Raises:
        ValueError: ``lanes`` outside 1..64 or ``words`` < 1 (create); a file whose header
            is not a CODA memory, or whose size does not match its header (attach).
        OSError: the file cannot be created, sized or mapped.
    """

    def __init__(self, path: Path, fh, mm: mmap.mmap, lanes: int, words: int, offs: tuple):
        self.path, self._fh, self._mm = Path(path), fh, mm
        self.lanes, self.words = lanes, words
        mem_off, map_off, list_off = offs
        self.mem = np.ndarray((words, lanes), np.uint16, buffer=mm, offset=mem_off)
        self._map = np.ndarray((words,), np.uint8, buffer=mm, offset=map_off)
        self._list = np.ndarray((words,), np.uint32, buffer=mm, offset=list_off)
        self._ndirty = np.ndarray((1,), np.uint32, buffer=mm, offset=_NDIRTY_OFFSET)

    @staticmethod
    def size(lanes: int, words: int) -> tuple[int, tuple[int, int, int]]:
        """(file bytes, (memory, bitmap, list offsets)) of a memory of this geometry."""
        mem_off = HEADER_BYTES
        map_off = _align(mem_off + 2 * lanes * words)
        list_off = _align(map_off + words)
        return _align(list_off + 4 * words, mmap.PAGESIZE), (mem_off, map_off, list_off)

    @classmethod
    def create(cls, path: str | os.PathLike, lanes: int, words: int) -> "SharedMemory":
        """A new zeroed memory in ``path`` (replacing any file there)."""
        if sys.byteorder != "little":
            raise OSError("the shared rank memory is little-endian: this host is not")
        if not 1 <= int(lanes) <= 64 or int(words) < 1:
            raise ValueError(f"lanes={lanes}, words={words}: expected lanes 1..64 and >= 1 word")
        lanes, words = int(lanes), int(words)
        nbytes, offs = cls.size(lanes, words)
        path = Path(path)
        path.unlink(missing_ok=True)
        fh = open(path, "w+b")
        try:
            fh.truncate(nbytes)               # a sparse file of zeros
            mm = mmap.mmap(fh.fileno(), nbytes)
        except OSError:
            fh.close()
            raise
        mm[:HEADER_BYTES] = _HEADER.pack(MAGIC, lanes, words, 0, *offs).ljust(HEADER_BYTES,
                                                                               b"\0")
        return cls(path, fh, mm, lanes, words, offs)

    @classmethod
    def attach(cls, path: str | os.PathLike) -> "SharedMemory":
        """The memory in the existing file ``path`` (its contents kept)."""
        fh = open(path, "r+b")
        try:
            head = fh.read(_HEADER.size)
            if len(head) < _HEADER.size or head[:8] != MAGIC:
                raise ValueError(f"{path}: not a CODA rank memory (no {MAGIC!r} header)")
            _, lanes, words, _, *offs = _HEADER.unpack(head)
            nbytes, expected = cls.size(lanes, words)
            if tuple(offs) != expected or os.fstat(fh.fileno()).st_size != nbytes:
                raise ValueError(f"{path}: size or offsets do not match its header "
                                 f"({lanes} lanes, {words} words)")
            mm = mmap.mmap(fh.fileno(), nbytes)
        except (OSError, ValueError):
            fh.close()
            raise
        return cls(path, fh, mm, lanes, words, tuple(offs))

    @property
    def ndirty(self) -> int:
        """Words the NME wrote since its current or last job started."""
        return int(self._ndirty[0])

    def dirty_addrs(self) -> np.ndarray:
        """Addresses of those words, int64 ascending."""
        return np.sort(self._list[:self.ndirty].astype(np.int64))

    def close(self, unlink: bool = False) -> None:
        """Let go of the mapping and the file; ``unlink``: also delete the file. Arrays taken
        from :attr:`mem` before stay valid: the mapping is unmapped when the last of them is
        gone (numpy keeps the mmap object as their base; closing it under them would leave
        them pointing at unmapped pages). Idempotent."""
        if self._mm is not None:
            self.mem = self._map = self._list = self._ndirty = None
            self._fh.close()
            self._mm = None
        if unlink:
            self.path.unlink(missing_ok=True)


def memory_path(fallback: str | os.PathLike | None = None) -> Path:
    """A fresh file name for a rank memory: in ``/dev/shm`` where there is one, else in
    ``fallback`` (default: the system's temporary folder). Unique per process and call."""
    import tempfile

    folder = shm_folder() or Path(fallback if fallback is not None else tempfile.gettempdir())
    remove_stale(folder)
    return folder / owned_name(MEMORY_PREFIX)


def remove_stale(folder: str | os.PathLike) -> list[Path]:
    """Delete the rank memory files in ``folder`` whose process is gone (a run killed by a
    signal it could not clean up after: SIGTERM, SIGKILL); returns them. The owner's pid is
    in the name (:func:`memory_path`; :func:`coda.paths.remove_orphans`, which also removes
    the simulators' work folders of such runs)."""
    return remove_orphans(folder, MEMORY_PREFIX)
