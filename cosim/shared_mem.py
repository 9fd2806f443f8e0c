"""The NME's rank memory in a file both the host and the Verilated simulator map.

The memory model of ``cosim/nme/nme_top.sv`` (an NME on an ideal memory) and the DRAM device of
each rank of the DIMM-NMP (``coda_dram_device`` in ``cosim/dram/dram_top.sv``, built with
``CODA_DRAM_SHM`` by :mod:`coda.cosim.nmp.build`) keep their words here, not in an HDL array:
each read and write of the NME (a word) or of the DRAM device (a burst) is a DPI-C call
(``cosim/shared_mem.cpp``) on the simulator's mapping of the file, and the host writes and
reads the same bytes as a numpy array (:class:`SharedMemory`, which has the file layout and the
DRAM burst map). Nothing is loaded into or dumped from the simulator between jobs, and the
simulator lists the words the NME wrote since the job started, so a caller that gave its own
image learns which words changed without comparing whole images.

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

__all__ = ["SharedMemory", "MAGIC", "HEADER_BYTES", "MEM_CPP", "shm_folder", "memory_path",
           "remove_stale"]

#: DPI-C side of these memories (``shared_mem.cpp``), compiled into every NME model
#: (:mod:`coda.cosim.nme.build`) and every DIMM-NMP model (:mod:`coda.cosim.nmp.build`)
MEM_CPP = Path(__file__).resolve().parent / "shared_mem.cpp"
MAGIC = b"CODAMEM1"
#: names of rank memory files: ``coda-mem-<pid>-<hex>`` (:func:`coda.paths.owned_name`)
MEMORY_PREFIX = "coda-mem"
HEADER_BYTES = 64
#: magic, lanes, words, ndirty, nstray, 3 offsets; burst_words, nidx, the map's offset
_HEADER = struct.Struct("<8sIIIIQQQIIQ")
_NDIRTY_OFFSET = 16                          # byte offset of ndirty in the header
_NSTRAY_OFFSET = 20                          # byte offset of nstray


def _align(n: int, to: int = 64) -> int:
    return -(-n // to) * to


def shm_folder() -> Path | None:
    """``/dev/shm`` where it is a writable folder (Linux), else None."""
    p = Path("/dev/shm")
    return p if p.is_dir() and os.access(p, os.W_OK) else None


class SharedMemory:
    """One rank's memory in a mapped file.

    Nothing is loaded into or dumped from the simulator between jobs: what the host writes
    (operands, cache stores) is in the rank's memory for the next program, and what the NME
    writes is in the host's array when the job ends. The simulator also lists the words the NME
    wrote since the job started (a bitmap against repeats and a list of addresses).

    A DRAM device addresses bursts, not words: its index is the low bits of ``{row, bank, bank
    group, column burst}`` (:mod:`coda.cosim.nmp.image`), so a memory made for one carries a
    burst map (``create(..., burst_map=, burst_words=)``): for every device index the burst
    ``b`` it holds (words ``[b * burst_words, (b + 1) * burst_words)`` of the memory) or -1. The
    memory itself stays the NME's image, ``[words, lanes]``, so the host sees the same array
    whichever memory the NMEs run on. A burst write to an index that holds no burst is not
    stored; the header counts it (``nstray``, emptied with the dirty list).

    Layout of the file (this module defines it; the C++ side reads the offsets from the header,
    so the two cannot disagree), little-endian:

    ====================  ================================================================
    offset 0, 64 bytes    header: ``uint64`` magic ``"CODAMEM1"``, then ``uint32`` lanes,
                          words, ndirty, nstray, ``uint64`` offsets of memory, bitmap, list,
                          ``uint32`` burst_words, nidx and the ``uint64`` offset of the map
    ``mem_off``           the memory: uint16 ``[words, lanes]`` (element ``j`` of word ``w``
                          is bits ``[16j, 16j+16)`` of the ``16*lanes``-bit word)
    ``map_off``           dirty bitmap: uint8 ``[words]``, 1 if the word is in the list
    ``list_off``          dirty list: uint32 ``[words]``, the first ``ndirty`` addresses
                          written since the job started, in the order first written
    ``idx_off``           burst map: int32 ``[nidx]`` (``nidx`` 0: a word memory)
    ====================  ================================================================

    Use :meth:`create` (the host, before the simulator starts: a new zeroed memory) or
    :meth:`attach` (an existing file, e.g. inside the simulator's cocotb process).

    Attributes:
        path: the file. lanes, words: the geometry.
        mem: uint16 ``[words, lanes]``, a writable view of the mapped memory.
        burst_words: words per DRAM burst of a memory with a burst map (0: none).
        burst_map: int32 ``[nidx]``, the burst at each DRAM device index or -1 (empty: none).
    Raises:
        ValueError: ``lanes`` outside 1..64 or ``words`` < 1, a burst map that is not int
            ``[nidx]`` of bursts in range or that holds a burst twice, ``burst_words`` < 1
            with a map (create); a file whose header is not a CODA memory, or whose size
            does not match its header (attach).
        OSError: the file cannot be created, sized or mapped.
    """

    def __init__(self, path: Path, fh, mm: mmap.mmap, lanes: int, words: int, offs: tuple,
                 burst_words: int = 0, nidx: int = 0):
        self.path, self._fh, self._mm = Path(path), fh, mm
        self.lanes, self.words = lanes, words
        mem_off, map_off, list_off = offs
        self.mem = np.ndarray((words, lanes), np.uint16, buffer=mm, offset=mem_off)
        self._map = np.ndarray((words,), np.uint8, buffer=mm, offset=map_off)
        self._list = np.ndarray((words,), np.uint32, buffer=mm, offset=list_off)
        self._ndirty = np.ndarray((1,), np.uint32, buffer=mm, offset=_NDIRTY_OFFSET)
        self._nstray = np.ndarray((1,), np.uint32, buffer=mm, offset=_NSTRAY_OFFSET)
        self.burst_words = burst_words
        self.burst_map = np.ndarray((nidx,), np.int32, buffer=mm,
                                    offset=self._idx_offset(lanes, words))

    @staticmethod
    def size(lanes: int, words: int, nidx: int = 0) -> tuple[int, tuple[int, int, int]]:
        """(file bytes, (memory, bitmap, list offsets)) of a memory of this geometry with a
        burst map of ``nidx`` device indexes (0: none)."""
        mem_off = HEADER_BYTES
        map_off = _align(mem_off + 2 * lanes * words)
        list_off = _align(map_off + words)
        idx_off = _align(list_off + 4 * words)
        return _align(idx_off + 4 * nidx, mmap.PAGESIZE), (mem_off, map_off, list_off)

    @staticmethod
    def _idx_offset(lanes: int, words: int) -> int:
        """Byte offset of the burst map (after the list, 64-byte aligned)."""
        return _align(SharedMemory.size(lanes, words)[1][2] + 4 * words)

    @classmethod
    def create(cls, path: str | os.PathLike, lanes: int, words: int, *,
               burst_map: np.ndarray | None = None, burst_words: int = 0) -> "SharedMemory":
        """A new zeroed memory in ``path`` (replacing any file there); with ``burst_map``
        (ints ``[nidx]``: the burst at each DRAM device index, -1 for none) and
        ``burst_words`` (words per burst), one a DRAM device can map
        (:mod:`coda.cosim.nmp.image`)."""
        if sys.byteorder != "little":
            raise OSError("the shared rank memory is little-endian: this host is not")
        if not 1 <= int(lanes) <= 64 or int(words) < 1:
            raise ValueError(f"lanes={lanes}, words={words}: expected lanes 1..64 and >= 1 word")
        lanes, words = int(lanes), int(words)
        nidx = 0
        if burst_map is not None:
            bmap = np.asarray(burst_map)
            if int(burst_words) < 1:
                raise ValueError(f"burst_words={burst_words}: expected >= 1 with a burst map")
            n_bursts = -(-words // int(burst_words))
            held = bmap[bmap >= 0] if bmap.ndim == 1 else bmap
            if (bmap.ndim != 1 or bmap.size == 0 or not np.issubdtype(bmap.dtype, np.integer)
                    or (bmap < -1).any() or (held >= n_bursts).any()
                    or np.unique(held).size != held.size):
                raise ValueError(f"burst_map of shape {bmap.shape}, dtype {bmap.dtype}: "
                                 f"expected ints [nidx], each a burst 0..{n_bursts - 1} held "
                                 "once or -1")
            nidx = int(bmap.size)
        elif burst_words:
            raise ValueError(f"burst_words={burst_words}: expected a burst_map with it")
        nbytes, offs = cls.size(lanes, words, nidx)
        path = Path(path)
        path.unlink(missing_ok=True)
        fh = open(path, "w+b")
        try:
            fh.truncate(nbytes)               # a sparse file of zeros
            mm = mmap.mmap(fh.fileno(), nbytes)
        except OSError:
            fh.close()
            raise
        mm[:HEADER_BYTES] = _HEADER.pack(MAGIC, lanes, words, 0, 0, *offs, int(burst_words),
                                         nidx, cls._idx_offset(lanes, words))
        memory = cls(path, fh, mm, lanes, words, offs, int(burst_words), nidx)
        if nidx:
            memory.burst_map[:] = bmap
        return memory

    @classmethod
    def attach(cls, path: str | os.PathLike) -> "SharedMemory":
        """The memory in the existing file ``path`` (its contents kept)."""
        fh = open(path, "r+b")
        try:
            head = fh.read(_HEADER.size)
            if len(head) < _HEADER.size or head[:8] != MAGIC:
                raise ValueError(f"{path}: not a CODA rank memory (no {MAGIC!r} header)")
            _, lanes, words, _, _, *offs, burst_words, nidx, idx_off = _HEADER.unpack(head)
            nbytes, expected = cls.size(lanes, words, nidx)
            if (tuple(offs) != expected or idx_off != cls._idx_offset(lanes, words)
                    or os.fstat(fh.fileno()).st_size != nbytes):
                raise ValueError(f"{path}: size or offsets do not match its header "
                                 f"({lanes} lanes, {words} words)")
            mm = mmap.mmap(fh.fileno(), nbytes)
        except (OSError, ValueError):
            fh.close()
            raise
        return cls(path, fh, mm, lanes, words, tuple(offs), burst_words, nidx)

    @property
    def nstray(self) -> int:
        """Burst writes since the job started to device indexes that hold no burst."""
        return int(self._nstray[0])

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
            self._nstray = self.burst_map = None
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
