"""End to end: `coda run` on the shipped model, cache segments through the Verilated NME."""

import json

import pytest

from coda.cli import main


def test_coda_run_rtl_is_bit_identical_to_torch(tmp_path):
    rc = main(["run", "--out", str(tmp_path), "--steps", "6", "--warmup", "2", "--interval", "2",
               "--prompts", "3,8", "--threads", "1"])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["bit_exact_rtl_vs_torch"] is True
    assert report["segments"] > 0 and report["nme_cycles"] > 0 and report["nme_programs"] > 0
    assert 0 < report["ops_skipped_fraction"] < 1
    assert report["sim_cycles_per_s"] > 0
    for key in ("psnr_db", "ssim", "label_accuracy_full", "label_accuracy_cached", "wall_s"):
        assert isinstance(report[key], float)
    assert [p.split("/")[-1] for p in report["gifs"]] == ["3_0.gif", "8_1.gif"]
    assert all((tmp_path / name).stat().st_size > 0 for name in ("3_0.gif", "8_1.gif"))


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "3,x"], "expected comma-separated digits 0..9"),
    (["--prompts", "12"], "expected comma-separated digits 0..9"),
    (["--steps", "0"], "--steps 0: expected >= 1"),
    (["--ranks", "0"], "--ranks 0: expected >= 1"),
    (["--lanes", "0"], "--lanes 0: expected >= 1"),
    (["--interval", "0"], "--interval 0: expected >= 1"),
    (["--warmup", "0"], "--warmup 0: expected >= 1"),
    (["--threads", "0"], "--threads 0: expected >= 1"),
])
def test_coda_run_rejects_bad_arguments(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert main(["run", "--out", str(out), "--backend", "torch", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()          # refused before any file is written


def test_coda_run_refuses_an_out_folder_that_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert main(["run", "--out", str(tmp_path / "f" / "out"), "--backend", "torch"]) == 2
    assert f"{tmp_path / 'f'} is a file, expected a folder" in capsys.readouterr().err
    assert main(["run", "--out", "", "--backend", "torch"]) == 2
    assert "--out '': expected a folder path" in capsys.readouterr().err


def test_coda_run_on_the_dram_timed_dimm_nmp(tmp_path):
    """--dram: every segment through the DIMM-NMP cosimulation (NMEs behind DDR5 controllers,
    ranks in lockstep), still bit-identical to the torch backend."""
    rc = main(["run", "--out", str(tmp_path), "--steps", "4", "--warmup", "2", "--interval", "2",
               "--prompts", "5", "--threads", "1", "--dram", "DDR5-4800"])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["bit_exact_rtl_vs_torch"] is True and report["dram"] == "DDR5-4800"
    assert report["segments"] > 0 and report["nme_cycles"] > 0


def test_coda_run_dram_needs_rtl_and_a_known_preset(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path), "--backend", "torch", "--dram", "DDR5-4800",
                 "--steps", "1"]) == 2
    assert "--dram DDR5-4800: DRAM timing needs --backend rtl" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path), "--dram", "DDR9"]) == 2
    assert "DDR9" in capsys.readouterr().err
