"""The rank memory file shared by the host and the simulator (coda.cosim.shared_mem): its
layout round-trips, a second mapping sees the first's writes, bad files are refused. The
simulator's side (DPI-C) is exercised by the RTL tests (tests/test_cosim_nme.py)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from coda.cosim.shared_mem import HEADER_BYTES, SharedMemory, memory_path, remove_stale


@settings(max_examples=20, deadline=None)
@given(lanes=st.integers(1, 64), words=st.integers(1, 3000))
def test_layout_fits_and_aligns(lanes, words):
    """The memory, bitmap and list do not overlap, fit the file and are 64-byte aligned; the
    file is whole pages."""
    nbytes, (mem_off, map_off, list_off) = SharedMemory.size(lanes, words)
    assert mem_off == HEADER_BYTES
    assert mem_off + 2 * lanes * words <= map_off < map_off + words <= list_off
    assert list_off + 4 * words <= nbytes and nbytes % mmap.PAGESIZE == 0
    assert map_off % 64 == 0 and list_off % 64 == 0


def test_two_mappings_share_words_and_dirty_list(tmp_path):
    """What one mapping writes the other reads; the dirty list (written here by hand, as the
    simulator writes it) comes back ascending and the count is the header's."""
    a = SharedMemory.create(tmp_path / "m", lanes=8, words=1000)
    b = SharedMemory.attach(tmp_path / "m")
    assert not a.mem.any() and (b.words, b.lanes) == (1000, 8)
    rng = np.random.default_rng(3)
    a.mem[:] = rng.integers(0, 1 << 16, size=a.mem.shape, dtype=np.uint16)
    assert np.array_equal(b.mem, a.mem)
    listed = np.array([17, 3, 999, 40], np.uint32)
    b._list[:4] = listed
    b._ndirty[0] = 4
    assert a.ndirty == 4 and a.dirty_addrs().tolist() == sorted(listed.tolist())
    view = b.mem
    b.close()
    assert np.array_equal(view, a.mem), "a view outlives close()"
    a.close(unlink=True)
    assert not (tmp_path / "m").exists()


def test_bad_files_and_geometries_are_refused(tmp_path):
    with pytest.raises(ValueError, match="lanes=0"):
        SharedMemory.create(tmp_path / "m", lanes=0, words=10)
    with pytest.raises(ValueError, match="words=0"):
        SharedMemory.create(tmp_path / "m", lanes=8, words=0)
    (tmp_path / "junk").write_bytes(b"x" * 4096)
    with pytest.raises(ValueError, match="not a CODA rank memory"):
        SharedMemory.attach(tmp_path / "junk")
    m = SharedMemory.create(tmp_path / "m", lanes=4, words=100)
    m.close()
    with open(tmp_path / "m", "r+b") as fh:      # a file cut short
        fh.truncate(HEADER_BYTES + 10)
    with pytest.raises(ValueError, match="do not match its header"):
        SharedMemory.attach(tmp_path / "m")


def test_memory_path_is_fresh(tmp_path):
    p, q = memory_path(tmp_path), memory_path(tmp_path)
    assert p != q and p.name.startswith("coda-mem-")


def test_files_of_dead_processes_are_removed(tmp_path):
    """A memory file whose process is gone (killed by SIGTERM / SIGKILL) is deleted when the
    next one is named; a live process's file and other files stay."""
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"coda-mem-{dead}-abc"
    live = tmp_path / f"coda-mem-{os.getpid()}-def"
    other = tmp_path / "coda-mem-notapid-x"
    for p in (stale, live, other):
        p.write_bytes(b"x")
    assert remove_stale(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()
