"""The GPU check script (scripts/gpu_check.py) on the CPU at a tiny size: Wan 2.1 1.3B cut to
2 layers, 32x32 pixels x 5 frames (8 tokens), 3 steps. Its figures are measured (positive),
and consistent: the cached generation computes fewer operators than full compute, as many
fewer as coda sim's workload reuses; the version check refuses a missing package in one line;
the script finds the project without an installed package. How long the CPU run takes is
measured by ``coda bench`` (``checks.gpu_check_cpu``), not asserted here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coda.experiments.gpu_check import CPU_CHECK
from coda.host.system.gputable import GpuTimes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
TINY = list(CPU_CHECK)
#: a hang guard for the CPU run, far beyond its speed target (coda.experiments.bench)
HANG_S = 900


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    run = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--out", str(out)],
                         capture_output=True, text=True, env=_env(), timeout=HANG_S)
    assert run.returncode == 0, run.stderr[-3000:]
    return {"out": out, "stdout": run.stdout,
            "report": json.loads((out / "gpu_check.json").read_text())}


def test_the_check_runs_on_a_cpu(check):
    """The run completes (exit 0), prints the versions it found and its table, and writes the
    table, the report and the calibrated table."""
    assert "torch " in check["stdout"] and "diffusers 0.42.1" in check["stdout"]
    assert all((check["out"] / f).is_file()
               for f in ("gpu_check.json", "gpu_check.txt", "gpu_table.json"))
    text = (check["out"] / "gpu_check.txt").read_text()
    assert text in check["stdout"] and "full compute" in text and "cached" in text


def test_the_report_holds_measured_figures(check):
    rep = check["report"]
    for key in ("command", "date", "device", "timer", "model", "layers", "size", "steps",
                "policy", "platform", "full", "cached", "sim", "comparison", "speedup"):
        assert key in rep, key
    assert rep["timer"] == "perf_counter" and rep["device"]["type"] == "cpu"
    assert rep["size"]["video_tokens"] == 8 and rep["layers"] == 2 and rep["platform"] == "h200"
    full, cached = rep["full"], rep["cached"]
    assert full["seconds"] > 0 and full["per_step_s"] == pytest.approx(full["seconds"] / 3)
    assert cached["ran"] and cached["seconds"] > 0 and cached["backend"] == "device"
    assert cached["comparable_to_b"] and rep["comparison"][1]["comparable"]
    for kind in ("roofline", "calibrated"):
        assert rep["sim"][kind]["a"] > 0 and rep["sim"][kind]["b"] > 0
    table = GpuTimes.load(check["out"] / "gpu_table.json").table
    assert table["timer"] == "perf_counter" and table["model"] == rep["model"]
    rows = {r["system"]: r for r in rep["comparison"]}
    assert rows["a"]["measured_s"] == full["seconds"]
    assert rows["a"]["calibrated_error"] == pytest.approx(
        rep["sim"]["calibrated"]["a"] / full["seconds"] - 1)


def test_the_cached_generation_computes_fewer_operators(check):
    rep = check["report"]
    full, cached = rep["full"], rep["cached"]
    # 2 layers x 3 operators (attn, cross_attn, ffn) x 2 CFG passes x 3 steps
    assert full["op_executions"] == 2 * 3 * 2 * 3
    assert cached["ops_computed"] + cached["ops_reused"] == full["op_executions"]
    assert 0 < cached["ops_computed"] < full["op_executions"]
    assert cached["ops_reused"] == rep["sim"]["reused_ops"]        # the engine = the model
    assert cached["skipped_fraction"] == cached["ops_reused"] / full["op_executions"]
    assert 0 < cached["relative_l2_to_full"] < 0.1


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_missing_package_stops_the_check_with_one_line(capsys, tmp_path):
    mod = _load_script()
    mod.NEEDS = mod.NEEDS + (("no_such_package_for_coda", None),)
    assert mod.main(["--wheels", str(tmp_path), "--out", str(tmp_path / "o")]) == 3
    captured = capsys.readouterr()
    assert "no_such_package_for_coda: missing" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_check: error: no_such_package_for_coda")
    assert not (tmp_path / "o").exists()


def test_the_script_finds_the_project_without_an_installed_package():
    """On a GPU machine coda is not pip-installed: the script maps coda's sub-packages onto
    the checkout's folders (here the editable install's finder is removed first)."""
    code = ("import sys, importlib.util\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
            "for m in [m for m in sys.modules if m.startswith('__editable__')]:\n"
            "    del sys.modules[m]\n"
            f"spec = importlib.util.spec_from_file_location('s', {str(SCRIPT)!r})\n"
            "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
            "gc = mod.import_coda()\n"
            "import coda.host.system.sim as sim\n"
            "print(str(mod.ROOT) in list(sys.modules['coda'].__path__))\n"
            "print(gc.__file__); print(sim.__file__)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), cwd="/", timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.split()
    assert lines[-3] == "True"                  # coda.hw, coda.host, ... from the folders
    assert lines[-2] == str(ROOT / "experiments" / "gpu_check.py")
    assert lines[-1] == str(ROOT / "host" / "system" / "sim.py")
