"""Result files on a full disk: a write that fails names the file and leaves no truncated
file (the old one, if any, untouched); temporary files of killed writers are removed."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
import torch

from coda.cli import main
from full_disk import fill_disk


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    from coda.paths import write_file

    path = tmp_path / "report.json"
    path.write_text("old\n")
    fill_disk(monkeypatch, "report.json", room=3)
    with pytest.raises(OSError) as exc:
        write_file(path, "new and longer\n")
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(path)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_written_file_is_complete_with_the_usual_permissions(tmp_path):
    from coda.paths import atomic_write, write_file

    umask = os.umask(0o022)
    os.umask(umask)
    assert write_file(tmp_path / "a.json", "{}\n") == tmp_path / "a.json"
    assert (tmp_path / "a.json").read_text() == "{}\n"
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask
    (tmp_path / "b.bin").write_bytes(b"old")
    os.chmod(tmp_path / "b.bin", 0o640)
    with atomic_write(tmp_path / "b.bin") as fh:
        fh.write(b"new")
    assert (tmp_path / "b.bin").read_bytes() == b"new"
    assert (tmp_path / "b.bin").stat().st_mode & 0o777 == 0o640     # its mode is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.bin"]


def test_a_failed_writer_leaves_the_old_file(tmp_path):
    from coda.paths import atomic_write

    (tmp_path / "x.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_write(tmp_path / "x.txt", "w") as fh:
            fh.write("half")
            raise RuntimeError("boom")
    assert (tmp_path / "x.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]
    # an error about another file (one the writer reads) is left naming that file
    with pytest.raises(FileNotFoundError) as exc:
        with atomic_write(tmp_path / "x.txt", "w") as fh:
            fh.write((tmp_path / "missing.txt").read_text())
    assert exc.value.filename == str(tmp_path / "missing.txt")
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_the_temporary_file_of_a_killed_writer_is_removed(tmp_path):
    """A writer killed between writing and renaming leaves its temporary file; the next
    write of that file removes it (its process is gone), not a live writer's."""
    from coda.paths import write_file

    dead = tmp_path / f".report.json.tmp-{_dead_pid()}-0a1b"
    live = tmp_path / f".report.json.tmp-{os.getpid()}-2c3d"
    other = tmp_path / ".report.json.tmp-notapid-x"
    for p in (dead, live, other):
        p.write_text("half")
    write_file(tmp_path / "report.json", "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, other.name, "report.json"])


def test_nme_run_example_on_a_full_disk(tmp_path, monkeypatch, capsys):
    """The one-line error names the file; no truncated .npz is left, an old one stays."""
    path = tmp_path / "in.npz"
    fill_disk(monkeypatch, "in.npz")
    assert main(["nme", "run", "--op", "add", "--make-example", str(path)]) == 2
    assert capsys.readouterr().err == f"coda: error: {path}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []
    path.write_bytes(b"old")
    assert main(["nme", "run", "--op", "add", "--make-example", str(path)]) == 2
    assert path.read_bytes() == b"old" and list(tmp_path.iterdir()) == [path]


def test_verilog_on_a_full_disk(tmp_path, monkeypatch, capsys):
    """coda verilog -o: the error names the file, no truncated Verilog is left, an old file
    stays."""
    path = tmp_path / "nme.v"
    path.write_text("old")
    fill_disk(monkeypatch, "nme.v")
    assert main(["verilog", "--top", "nme", "--lanes", "1", "--depth", "16", "-o", str(path)]) == 2
    assert capsys.readouterr().err.endswith(f"coda: error: {path}: No space left on device\n")
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]


def test_a_gif_on_a_full_disk(tmp_path, monkeypatch):
    from coda.host.model.sample import side_by_side_gif

    video = torch.zeros(1, 1, 3, 8, 8)
    fill_disk(monkeypatch, "grid.gif", room=10)
    with pytest.raises(OSError) as exc:
        side_by_side_gif(tmp_path / "grid.gif", video, video)
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(tmp_path / "grid.gif")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_in_a_folder_that_takes_no_new_file_is_refused_up_front():
    """A result file is replaced by a new one beside it: an existing, writable file in a
    folder where nothing can be created (here a pseudo file system) is refused before any
    work, not after it."""
    from coda.paths import check_output_path

    assert os.access("/proc/self/comm", os.W_OK)
    with pytest.raises(ValueError, match=r"--out /proc/self/comm: cannot replace it in "
                                         r"/proc/self"):
        check_output_path("/proc/self/comm", "--out")
