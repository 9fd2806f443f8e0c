"""The rank memory file shared by the host and the simulator (coda.cosim.shared_mem): its
layout round-trips, a second mapping sees the first's writes, bad files are refused. The
simulator's side (DPI-C) is exercised by the RTL tests (tests/cosim/test_cosim_nme.py)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

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


def _dead_pid() -> str:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _run_folders(parent):
    """A run folder of a dead process, one of this process and two that are not run
    folders of a process (a name without a pid, a kept log folder)."""
    dead = _dead_pid()
    folders = {"stale": parent / f"run-{dead}-7f-0", "live": parent / f"run-{os.getpid()}-1-0",
               "other": parent / "run-notapid-0", "kept": parent / f"logs-{dead}-7f-0"}
    for f in folders.values():
        f.mkdir(parents=True)
        (f / "sim.log").write_text("log")
    return folders


@pytest.mark.parametrize("backend", ["rtl", "nmp"])
def test_simulator_run_folders_of_dead_processes_are_removed(backend, tmp_path, monkeypatch):
    """A simulator's work folder (``build/cosim/<model>/run-<pid>-...``) that a killed run
    left is removed when the next simulator starts, of that model or another, as the memory
    files are; a live process's folder and other folders stay. The backend removes its own
    on close."""
    import types

    from coda.cosim.nmp import backend as nmp_backend

    from coda.cosim.nme import rtl_backend
    from coda.hw.nme.isa import NMEConfig

    folders = _run_folders(tmp_path / "cosim" / "model")
    other_model = _run_folders(tmp_path / "cosim" / "other")
    started = []

    class Session:
        def __init__(self, build, workdir, **kw):
            self.workdir, self.proc = workdir, types.SimpleNamespace(poll=lambda: None)
            workdir.mkdir()
            started.append(workdir)

        def close(self):
            pass

    build = types.SimpleNamespace(path=tmp_path / "cosim" / "model")
    if backend == "rtl":
        monkeypatch.setattr(rtl_backend, "SimSession", Session)
        owner = rtl_backend.RTLBackend()
        monkeypatch.setattr(owner, "build", lambda cfg: build)
    else:
        monkeypatch.setattr(nmp_backend, "NMPSession", Session)
        monkeypatch.setattr(nmp_backend, "build_nmp_sim", lambda *a, **kw: build)
        owner = nmp_backend.NMPRTLBackend("DDR5-4800")
    owner.session(NMEConfig())
    for made in (folders, other_model):
        assert not made["stale"].exists()
        assert all(made[k].exists() for k in ("live", "other", "kept"))
    assert len(started) == 1 and started[0].name.startswith(f"run-{os.getpid()}-")
    owner.close()
    assert not started[0].exists()


def test_dram_replay_run_folders_of_dead_processes_are_removed(tmp_path, monkeypatch):
    """The DRAM model's run folders (``build/dram/runs/run-<pid>-...``) likewise."""
    from coda.cosim.dram import replay as dram_replay

    folders = _run_folders(tmp_path)
    used = []

    def fake_run(args, **kw):
        rsp = Path(next(a for a in args if a.startswith("+rsp="))[5:])
        used.append(rsp.parent.name)
        rsp.write_text("2a\n")

    monkeypatch.setattr(dram_replay, "build_model", lambda *a, **kw: "model")
    monkeypatch.setattr(dram_replay, "build_dir", lambda *parts: tmp_path)
    monkeypatch.setattr(dram_replay.subprocess, "run", fake_run)
    assert dram_replay.run_words("DDR5-4800", 8, [(0, 0, 0, 0)]) == [0x2a]
    assert not folders["stale"].exists()
    assert all(folders[k].exists() for k in ("live", "other", "kept"))
    assert used[0].startswith(f"run-{os.getpid()}-") and not (tmp_path / used[0]).exists()


def test_burst_map_of_a_dram_device_memory(tmp_path):
    """A memory a DIMM-NMP's DRAM device maps carries its burst map (device index -> burst
    of the NME image, -1 for none) after the dirty list; attach reads it back, the image
    keeps the NME's [words, lanes] layout, and a map that does not describe the memory's
    bursts is refused, naming it."""
    inv = np.array([-1, 2, 0, -1, 1], np.int64)      # 10 words of 4 per burst: 3 bursts
    m = SharedMemory.create(tmp_path / "m", lanes=4, words=10, burst_map=inv, burst_words=4)
    a = SharedMemory.attach(tmp_path / "m")
    assert (a.words, a.lanes, a.burst_words) == (10, 4, 4)
    assert a.burst_map.tolist() == inv.tolist() and a.nstray == 0
    nbytes, (_, _, list_off) = SharedMemory.size(4, 10, inv.size)
    assert os.path.getsize(tmp_path / "m") == nbytes
    # the map sits after the dirty list, 64-byte aligned, inside the file
    offset = a.burst_map.__array_interface__["data"][0] - a.mem.__array_interface__["data"][0]
    assert offset + HEADER_BYTES >= list_off + 4 * 10 and (offset + HEADER_BYTES) % 64 == 0
    assert offset + HEADER_BYTES + 4 * inv.size <= nbytes
    m.mem[:] = 7
    assert (a.mem == 7).all()
    plain = SharedMemory.create(tmp_path / "p", lanes=4, words=10)
    assert plain.burst_words == 0 and plain.burst_map.size == 0
    for bad, kw, match in (
            ("past", {"burst_map": np.array([3, 0]), "burst_words": 4}, "each a burst 0..2"),
            ("twice", {"burst_map": np.array([1, 1]), "burst_words": 4}, "held once"),
            ("below", {"burst_map": np.array([-2, 0]), "burst_words": 4}, "or -1"),
            ("2d", {"burst_map": np.zeros((2, 2), int), "burst_words": 4}, r"shape \(2, 2\)"),
            ("words", {"burst_map": np.array([0]), "burst_words": 0}, "burst_words=0"),
            ("nomap", {"burst_words": 4}, "expected a burst_map")):
        with pytest.raises(ValueError, match=match):
            SharedMemory.create(tmp_path / bad, lanes=4, words=10, **kw)
