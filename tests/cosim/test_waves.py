"""Waveforms on demand: the traced NME model is a separate cached build whose runs write FST
files with hierarchical signal names (a cocotb run, ``coda nme run --waves``); the default
model stays untraced; bad ``--waves`` input is refused before any work.

One traced build per session, cached on disk under ``build/cosim/waves-<key>/``: a small
NME (3 fp16 lanes, buffers of 5 words, trailing stores, gated lane clocks), one of the
cycle-model configurations of tests/hw/test_nme_cycles.py, whose untraced build it shares.
Its C++ is a third of the 8-lane NME's, so the traced build (Verilator's FST writer) costs
about half. The NME is the one :class:`~coda.cosim.nme.rtl_backend.RTLBackend` simulates (gated
lane clocks, its default), so the traced build is also the one ``coda nme run --backend rtl
--waves`` makes, and the untraced one the build of tests/hw/test_nme_cycles.py: a fresh
``build/`` Verilates this NME twice (traced, untraced) for every test here, not four times.
"""

from __future__ import annotations

import shutil
import struct

import pytest

from coda.cosim.nme.build import (LeanVerilator, build_sim, failure_report, run_cocotb,
                              sim_command, waves_requested)
from coda.cosim.fst import read_fst
from coda.cosim.toolchain import build_dir
from coda.hw.nme.isa import NMEConfig

BASE = NMEConfig(lanes=3, fmt="fp16", depth=5, mem_words=2048, trail_stores=True)

# name -> width: the testbench's job port and the NME's ports, units and a lane
SIGNALS = {
    "nme_tb_top.clk": 1, "nme_tb_top.rst": 1, "nme_tb_top.tb_req": 32, "nme_tb_top.tb_op": 3,
    "nme_tb_top.tb_ack": 32, "nme_tb_top.tb_cycles": 32, "nme_tb_top.jstate": 2,
    "nme_tb_top.dut.clk": 1, "nme_tb_top.dut.rst": 1, "nme_tb_top.dut.cmd_valid": 1,
    "nme_tb_top.dut.cmd_ready": 1, "nme_tb_top.dut.cmd_data": 64,
    "nme_tb_top.dut.mem_req_valid": 1, "nme_tb_top.dut.mem_req_ready": 1,
    "nme_tb_top.dut.mem_req_we": 1, "nme_tb_top.dut.mem_req_addr": 24,
    "nme_tb_top.dut.mem_req_wdata": 16 * BASE.lanes, "nme_tb_top.dut.mem_req_wmask": BASE.lanes,
    "nme_tb_top.dut.mem_rsp_valid": 1, "nme_tb_top.dut.mem_rsp_data": 16 * BASE.lanes,
    "nme_tb_top.dut.busy": 1, "nme_tb_top.dut.done": 1, "nme_tb_top.dut.status": 3,
    "nme_tb_top.dut.l1": 32,
}
UNIT_STATES = [f"nme_tb_top.dut.{u}.{u}_state" for u in ("intake", "check", "execute", "issue")]
LANE0 = "nme_tb_top.dut.execute.lane0."


#: the NME of RTLBackend (its default: gated lane clocks), whose builds the CLI's runs and
#: tests/hw/test_nme_cycles.py make too
GATED = {"clock_gating": True}


@pytest.fixture(scope="module")
def traced():
    return build_sim(BASE, waves=True, **GATED)


def _check_fst(path, min_cycles: int):
    """The FST at ``path`` is complete, spans at least ``min_cycles`` clocks (10 ns) and names
    the testbench's and the NME's signals hierarchically with their widths."""
    info = read_fst(path)
    assert info.timescale == -12 and info.n_time_steps >= 1
    assert info.end_time >= min_cycles * 10_000, (info.end_time, min_cycles)
    assert "Verilat" in info.writer
    wrong = {n: info.signals.get(n) for n, w in SIGNALS.items() if info.signals.get(n) != w}
    assert not wrong, f"missing or of another width: {wrong}"
    assert all(s in info.signals for s in UNIT_STATES)
    assert sum(n.startswith(LANE0) for n in info.signals) > 50
    return info


def test_default_model_is_not_traced(traced, tmp_path, monkeypatch):
    """The default model keeps its own key, folder and untraced binary (also under WAVES=1);
    only the traced one has Verilator's FST writer; a waveform needs the traced model."""
    monkeypatch.setenv("WAVES", "1")
    default = build_sim(BASE, **GATED)   # cached by tests/hw/test_nme_cycles.py
    assert traced.waves and not default.waves
    assert traced.key != default.key and traced.path.name == f"waves-{traced.key}"
    assert default.path.name == default.key
    assert "VM_TRACE = 0" in (default.path / "Vtop_classes.mk").read_text()
    assert "VM_TRACE_FST = 1" in (traced.path / "Vtop_classes.mk").read_text()
    with pytest.raises(ValueError, match="not traced"):
        sim_command(default, tmp_path, waves=tmp_path / "w.fst")
    with pytest.raises(ValueError, match=r"\.fst"):
        sim_command(traced, tmp_path, waves=tmp_path / "w.vcd")
    assert "--trace" not in sim_command(traced, tmp_path)


def test_runner_ignores_waves_variable(tmp_path, monkeypatch):
    """cocotb's build() lets WAVES override its argument; the project's runners do not (an
    untraced key must hold an untraced binary)."""
    from coda.cosim.nmp.build import _runner

    (tmp_path / "t.v").write_text("module t; endmodule\n")
    monkeypatch.setenv("WAVES", "1")
    for runner, fst in ((LeanVerilator(), False), (_runner([]), False),
                        (LeanVerilator(waves=True), True)):
        cmds = []
        runner._execute = lambda c, cwd: cmds.extend(c)
        runner.build(sources=[tmp_path / "t.v"], hdl_toplevel="t", build_dir=tmp_path / "b",
                     always=True)
        assert ("--trace-fst" in cmds[0]) == fst and "--trace" not in cmds[0]
        assert f"VM_TRACE={int(fst)}" in cmds[1]


def test_waves_requested(monkeypatch):
    assert not waves_requested({}) and not waves_requested({"WAVES": "0"})
    assert waves_requested({"WAVES": "1"}) and waves_requested({"WAVES": "True"})
    with pytest.raises(ValueError, match="WAVES='maybe'"):
        waves_requested({"WAVES": "maybe"})


def test_cocotb_run_writes_fst_and_failure_names_it(traced):
    """A cocotb run on the traced model writes a valid FST; a failing test's report names it."""
    waves = build_dir("waves", "test_waves") / "nme_tb_top.fst"
    workdir = build_dir("cosim", "pytest", "waves")
    env = {"CODA_COSIM_LANES": str(BASE.lanes), "CODA_COSIM_MEM_WORDS": str(BASE.mem_words),
           "CODA_WAVES_BREAK": "1"}
    tally = run_cocotb(traced, "cocotb_waves", workdir, seed=1, extra_env=env, waves=waves,
                       timeout_s=600)
    assert tally["tests"] == 2 and tally["failed"] == 1, failure_report(tally)
    assert tally["waves"] == waves.resolve()
    report = failure_report(tally)
    assert report.startswith("1 of 2 cocotb tests failed (test_copy_wrong_expectation)")
    assert f"waveform {waves.resolve()}" in report
    info = _check_fst(waves, min_cycles=2 * 20)
    print(f"\nFST {waves}: {waves.stat().st_size} bytes, {len(info.signals)} signals, "
          f"{info.end_time / 1e3:.0f} ns, {tally['seconds']:.1f} s")
    tally["waves"] = None
    assert "rerun with WAVES=1 or pytest --waves" in failure_report(tally)


def test_nme_run_writes_fst(traced, tmp_path, capsys):
    """``coda nme run --backend rtl --waves FILE.fst`` writes the waveform of its run (the
    traced build of the fixture: same configuration)."""
    from coda.cli import main

    inputs, out, waves = tmp_path / "in.npz", tmp_path / "out.npz", tmp_path / "w" / "run.fst"
    geometry = ["--lanes", "3", "--fmt", "fp16", "--depth", "5", "--mem-words", "2048",
                "--trail-stores", "on"]
    assert main(["nme", "run", "--op", "gated_residual", "--make-example", str(inputs)]
                + geometry) == 0
    rc = main(["nme", "run", "--op", "gated_residual", "--inputs", str(inputs), "--out", str(out),
               "--backend", "rtl", "--waves", str(waves)] + geometry)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = captured.out.strip().splitlines()[-1]
    assert summary.endswith(f"waves={waves.resolve()}") and out.exists()
    cycles = int(summary.split("nme_cycles=")[1].split()[0])
    _check_fst(waves, min_cycles=cycles)


@pytest.mark.parametrize("extra, why", [
    (["--backend", "torch", "--waves", "{tmp}/w.fst"], "expected --backend rtl"),
    (["--waves", "{tmp}/w.fst"], "expected --backend rtl"),
    (["--backend", "rtl", "--dram", "DDR5-4800", "--waves", "{tmp}/w.fst"], "--dram"),
    (["--backend", "rtl", "--waves", "{tmp}/w.vcd"], "ending in .fst"),
    (["--backend", "rtl", "--waves", "{tmp}"], "is a folder"),
    (["--backend", "rtl", "--waves", "{tmp}/in.npz/w.fst"], "is a file, expected a folder"),
    (["--backend", "rtl", "--waves", "-"], "expected a file path"),
])
def test_nme_run_refuses_bad_waves(extra, why, tmp_path, capsys):
    """Bad --waves: one line ``coda: error: ...``, exit status 2, nothing written."""
    from coda.cli import main

    inputs, out = tmp_path / "in.npz", tmp_path / "out.npz"
    assert main(["nme", "run", "--op", "add", "--make-example", str(inputs)]) == 0
    before = sorted(tmp_path.rglob("*"))
    capsys.readouterr()
    rc = main(["nme", "run", "--op", "add", "--inputs", str(inputs), "--out", str(out)]
              + [a.format(tmp=tmp_path) for a in extra])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("coda: error: --waves") and why in err, err
    assert sorted(tmp_path.rglob("*")) == before


def test_nme_run_refuses_waves_with_make_example(tmp_path, capsys):
    from coda.cli import main

    rc = main(["nme", "run", "--op", "add", "--make-example", str(tmp_path / "in.npz"),
               "--backend", "rtl", "--waves", str(tmp_path / "w.fst")])
    assert rc == 2 and "--make-example runs nothing" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_rtl_backend_refuses_bad_waves():
    from coda.cosim.nme.rtl_backend import RTLBackend

    for bad in ("run.vcd", "", "-"):
        with pytest.raises(ValueError, match="expected an .fst file path"):
            RTLBackend(waves=bad)


def test_read_fst_refuses_what_is_not_a_whole_fst(traced, tmp_path):
    """Not an FST, a truncated FST (a killed writer's), a missing file: clear errors."""
    with pytest.raises(FileNotFoundError):
        read_fst(tmp_path / "none.fst")
    (tmp_path / "text.fst").write_text("$date today $end\n")
    with pytest.raises(ValueError, match="text.fst' is not a readable FST waveform"):
        read_fst(tmp_path / "text.fst")
    good = build_dir("waves", "test_waves") / "nme_tb_top.fst"
    if not good.exists():
        pytest.skip("needs the FST of test_cocotb_run_writes_fst_and_failure_names_it")
    cut = tmp_path / "cut.fst"
    shutil.copyfile(good, cut)
    with open(cut, "r+b") as fh:
        fh.truncate(good.stat().st_size - 100)
    with pytest.raises(ValueError, match="cut.fst' is not a readable FST waveform"):
        read_fst(cut)
