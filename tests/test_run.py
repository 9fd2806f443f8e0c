"""End to end: `coda run` on the shipped model, cache segments through the Verilated NME."""

import json

import pytest

from coda.cli import main


@pytest.fixture(scope="module")
def schedule_6(tmp_path_factory):
    """A 6-step profile of the shipped model and a schedule annealed on it."""
    d = tmp_path_factory.mktemp("sched")
    assert main(["profile", "--prompts", "3", "--seeds", "77", "--steps", "6",
                 "--out", str(d / "p")]) == 0
    assert main(["schedule", "search", "--profile", str(d / "p" / "profile.npz"),
                 "--skip", "0.5", "--out", str(d / "s.json"), "--moves", "4000"]) == 0
    return d


def test_coda_run_rtl_is_bit_identical_to_torch(tmp_path, schedule_6):
    """An annealed schedule with DRA's monitors (l1_distance on the NME) and fallbacks: the
    decisions depend on NME results, so equal bits also mean equal decisions."""
    rc = main(["run", "--out", str(tmp_path), "--steps", "6", "--policy", "coda+dra",
               "--schedule", str(schedule_6 / "s.json"),
               "--profile", str(schedule_6 / "p" / "profile.npz"),
               "--prompts", "3,8", "--threads", "1"])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["bit_exact_rtl_vs_torch"] is True
    assert report["policy"] == "coda+dra" and report["policy_params"]["margin"] == 1.0
    assert report["segments"] > 0 and report["nme_cycles"] > 0 and report["nme_programs"] > 0
    assert report["monitors"] > 0 and report["dra_fallbacks"] >= 0 and report["pcie_bytes"] > 0
    assert 0 < report["ops_skipped_fraction"] < 1
    assert report["sim_cycles_per_s"] > 0
    assert report["modelled"]["available"] is True
    for key in ("psnr_db", "ssim", "label_accuracy_full", "label_accuracy_cached", "wall_s"):
        assert isinstance(report[key], float)
    # segments ran on the simulators while the host computed the other CFG branch
    assert report["interleave"]["async_launches"] > 0 and report["interleave"]["overlap_s"] > 0
    # the generation replayed on the default platform; every segment's modelled NME time is
    # the cycles the cosimulation measured (ideal memory: the cycle model is exact)
    modelled = report["modelled"]
    assert set(modelled["systems"]) == set("abcdef")
    assert modelled["nme_check"]["max_rel_error"] == 0.0
    assert modelled["nme_check"]["segments"] == report["segments"]
    assert all(row["latency_s"] > 0 for row in modelled["systems"].values() if row["fits"])
    assert [p.split("/")[-1] for p in report["gifs"]] == ["3_0.gif", "8_1.gif"]
    assert all((tmp_path / name).stat().st_size > 0 for name in ("3_0.gif", "8_1.gif"))


def test_the_shipped_schedule_is_the_default_and_fits_the_shipped_model():
    from coda.host.model.dit import load_model
    from coda.host.profile import Profile, model_hash
    from coda.host.run import _policy
    from coda.host.search import SHIPPED_PROFILE, SHIPPED_SCHEDULE, load_schedule

    model, _ = load_model()
    sched = load_schedule(SHIPPED_SCHEDULE, model_id=model_hash(model), num_steps=50,
                          num_layers=4)
    assert abs(sched.ops_skipped_fraction() - 0.5) < 0.01
    Profile.load(SHIPPED_PROFILE).check_for(model_hash(model), 50, 4)

    class Args:
        policy = schedule = profile = interval = warmup = skip = None
        steps = 50
    name, policy = _policy(Args, model)
    assert name == "coda" and policy.schedule == sched


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "3,x"], "--prompts '3,x': 'x' is not an integer"),
    (["--prompts", "12"], "--prompts '12': 12 is out of range, expected distinct integers 0..9"),
    (["--prompts", "1,,2"], "--prompts '1,,2': an empty item"),
    (["--prompts", "1,1"], "--prompts '1,1': 1 given twice"),
    (["--prompts", "0-3,2"], "--prompts '0-3,2': 2 given twice"),
    (["--steps", "0"], "--steps 0: expected 1..1000"),
    (["--steps", "100000"], "--steps 100000: expected 1..1000 (at least 1; at most the model's "
                            "1000 training timesteps"),
    (["--guidance", "nan"], "--guidance nan: expected a finite CFG scale >= 0"),
    (["--guidance", "inf"], "--guidance inf: expected a finite CFG scale >= 0"),
    (["--guidance", "-1"], "--guidance -1.0: expected a finite CFG scale >= 0"),
    (["--seed", "-1"], "--seed -1: expected an integer 0..2147483645"),
    (["--seed", "99999999999"], "--seed 99999999999: expected an integer 0..2147483645"),
    # a range is one list: 4 videos take seeds 2147483646 .. 2147483649
    (["--prompts", "0-3", "--seed", "2147483646"], "--seed 2147483646: expected an integer "
                                                   "0..2147483644 (the run's 4 videos"),
    (["--ranks", "0"], "--ranks 0: expected >= 1"),
    (["--lanes", "0"], "--lanes 0: expected >= 1"),
    (["--interval", "0"], "--interval 0: expected >= 1"),
    (["--warmup", "0"], "--warmup 0: expected >= 1"),
    (["--threads", "0"], "--threads 0: expected >= 1"),
    (["--policy", "fora"], "--policy 'fora': unknown policy, expected one of coda"),
    (["--policy", ""], "--policy '': empty, expected one of coda"),
    (["--policy", "pab", "--skip", "1.2"], "--skip 1.2: expected a fraction in (0, 1)"),
    (["--policy", "pab", "--skip", "nan"], "--skip nan: expected a fraction in (0, 1)"),
    (["--policy", "uniform", "--skip", "0.3"], "--skip 0.3: a pab / teacache / magcache option"),
    (["--interval", "3", "--skip", "0.3"], "expected no --skip with --policy uniform"),
    (["--policy", "coda", "--skip", "0.3"], "expected no --skip with --policy coda"),
    (["--policy", "coda", "--schedule", "s.json", "--skip", "0.3"],
     "expected no --skip with --policy coda"),
    (["--policy", "coda+dra", "--skip", "0.3"], "expected no --skip with --policy coda+dra"),
    (["--policy", "uniform", "--profile", "p.npz"], "--profile p.npz: read by coda+dra / "
                                                    "teacache / magcache only"),
    (["--policy", "coda", "--profile", "p.npz"], "expected no --profile with --policy coda"),
    (["--steps", "4", "--warmup", "100"], "--warmup 100 with --steps 4: nothing would be "
                                          "cached"),
    (["--steps", "4", "--warmup", "3"], "expected --warmup 1..2 (--steps - 2)"),
    (["--steps", "1", "--interval", "2"], "--steps 1 with --policy uniform: nothing would be "
                                          "cached"),
    (["--interval", "1"], "--interval 1: recomputes every step, nothing would be cached"),
    (["--steps", "6"], "the shipped schedule is for 50 steps"),
    (["--policy", "teacache", "--steps", "6"], "the shipped profile is for 50 steps"),
    (["--policy", "coda", "--interval", "3"], "--interval/--warmup: options of --policy uniform"),
    (["--schedule", "missing.json"], "--schedule missing.json: cannot read it"),
    (["--policy", "magcache", "--profile", "missing.npz"], "missing.npz: no such file"),
])
def test_coda_run_rejects_bad_arguments(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert main(["run", "--out", str(out), "--backend", "torch", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err, err
    assert err.count("\n") == 1     # one line, no traceback
    assert not out.exists()          # refused before any file is written


def test_coda_run_refuses_a_truncated_or_non_finite_profile(tmp_path, capsys):
    """A profile that is not one (cut short, text, NaN measurements) is refused when read,
    before any generation, naming the file."""
    import numpy as np

    from coda.host.profile import Profile
    from coda.host.search import SHIPPED_PROFILE

    data = SHIPPED_PROFILE.read_bytes()
    (tmp_path / "half.npz").write_bytes(data[:len(data) // 2])
    prof = Profile.load(SHIPPED_PROFILE)
    prof.in_change[0, 5, 0, 1, 2] = np.nan
    prof.save(tmp_path / "nan")
    out = tmp_path / "out"
    base = ["run", "--out", str(out), "--backend", "torch", "--policy", "teacache"]
    assert main(base + ["--profile", str(tmp_path / "half.npz")]) == 2
    err = capsys.readouterr().err
    assert f"--profile {tmp_path / 'half.npz'}: not a profile written by coda profile" in err
    assert err.count("\n") == 1
    assert main(base + ["--profile", str(tmp_path / "nan" / "profile.npz")]) == 2
    err = capsys.readouterr().err
    assert "1 values of in_change are not finite and >= 0" in err and "step 5" in err
    assert not out.exists()


def test_coda_run_without_a_modelled_platform_still_reports(tmp_path):
    """--lanes 4: the system model has no DIMM-NMP measurement for 4 lanes at the driver's
    depth; the run completes and the report says why 'modelled' is missing (decided before
    the generation, not a late failure). Short runs default to a warmup that caches."""
    out = tmp_path / "o4"
    assert main(["run", "--steps", "4", "--interval", "2", "--lanes", "4", "--out", str(out),
                 "--threads", "1", "--backend", "torch", "--prompts", "1"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["modelled"]["available"] is False
    assert "no DIMM-NMP measurement for DDR5-4800 with 4 lanes, depth 64" in \
        report["modelled"]["reason"]
    assert report["policy_params"]["warmup"] == 2 and report["ops_skipped_fraction"] > 0
    assert (out / "1_0.gif").stat().st_size > 0


def test_modelled_availability_is_decided_from_the_flags():
    from coda.host.run import _modelled_unavailable

    class Args:
        lanes, dimms, ranks = 8, 1, 2
    assert _modelled_unavailable(Args, 64, "DDR5-4800") is None
    Args.lanes = 16
    assert "16 lanes, depth 64" in _modelled_unavailable(Args, 64, "DDR5-4800")


def test_coda_run_refuses_a_schedule_or_profile_for_another_model_or_step_count(
        tmp_path, capsys, schedule_6):
    sched = json.loads((schedule_6 / "s.json").read_text())
    sched["coda"]["model_hash"] = "0000000000000000"
    (tmp_path / "other.json").write_text(json.dumps(sched))
    out = tmp_path / "out"
    base = ["run", "--out", str(out), "--backend", "torch", "--steps", "6"]
    assert main(base + ["--schedule", str(tmp_path / "other.json")]) == 2
    assert "made for model '0000000000000000'" in capsys.readouterr().err
    assert main(base[:-1] + ["50", "--schedule", str(schedule_6 / "s.json")]) == 2
    assert "made for 6 steps, expected 50" in capsys.readouterr().err
    assert main(base[:-1] + ["50", "--policy", "teacache", "--profile",
                             str(schedule_6 / "p" / "profile.npz")]) == 2
    assert "made for 6 steps, expected 50" in capsys.readouterr().err
    assert not out.exists()


def test_coda_run_refuses_an_out_folder_that_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert main(["run", "--out", str(tmp_path / "f" / "out"), "--backend", "torch"]) == 2
    assert f"{tmp_path / 'f'} is a file, expected a folder" in capsys.readouterr().err
    assert main(["run", "--out", "", "--backend", "torch"]) == 2
    assert "--out '': expected a folder path" in capsys.readouterr().err


def test_coda_run_on_the_dram_timed_dimm_nmp(tmp_path):
    """--dram: every segment through the DIMM-NMP cosimulation (NMEs behind DDR5 controllers,
    ranks in lockstep), still bit-identical to the torch backend; --interval/--warmup
    select the uniform policy."""
    rc = main(["run", "--out", str(tmp_path), "--steps", "4", "--warmup", "2", "--interval", "2",
               "--prompts", "5", "--threads", "1", "--dram", "DDR5-4800"])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["bit_exact_rtl_vs_torch"] is True and report["dram"] == "DDR5-4800"
    assert report["segments"] > 0 and report["nme_cycles"] > 0
    assert report["policy"] == "uniform" and report["dra_fallbacks"] == 0


def test_coda_run_dram_needs_rtl_and_a_known_preset(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path), "--backend", "torch", "--dram", "DDR5-4800",
                 "--steps", "4", "--policy", "uniform"]) == 2
    assert "--dram DDR5-4800: DRAM timing needs --backend rtl" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path), "--dram", "DDR9", "--policy", "uniform"]) == 2
    assert "DDR9" in capsys.readouterr().err
