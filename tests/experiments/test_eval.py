"""`coda eval`: policies compared on held-out seeds, metrics from torchmetrics, refusals."""

import json

import pytest
import torch

from coda.cli import main
from coda.experiments.evaluate import motion_px, psnr_db, ssim
from coda.host.model.sample import video_psnr, video_ssim

KEYS = {"policy", "target_skip", "ops_skipped_fraction", "psnr_db", "ssim", "label_accuracy",
        "segments", "pcie_bytes"}


def test_metrics_agree_with_the_definitions():
    g = torch.Generator().manual_seed(0)
    ref = torch.rand(2, 1, 8, 32, 32, generator=g) * 2 - 1
    test = (ref + 0.05 * torch.randn(ref.shape, generator=g)).clamp(-1, 1)
    assert psnr_db(test, ref) == pytest.approx(video_psnr(test, ref), abs=1e-6)
    assert ssim(test, ref) == pytest.approx(video_ssim(test, ref), abs=0.01)
    assert psnr_db(ref, ref) == float("inf") and ssim(ref, ref) == pytest.approx(1.0)
    # a 4-pixel square moving 2 pixels per frame along a row
    v = -torch.ones(1, 1, 4, 16, 16)
    for f in range(4):
        v[0, 0, f, 4:8, 2 * f:2 * f + 4] = 1
    assert motion_px(v)[0] == pytest.approx(2.0)


def test_worst_quarter_is_the_lowest_quarter_of_the_videos():
    from coda.experiments.metrics import worst_quarter

    assert worst_quarter([3.0, 1.0, 2.0, 0.0, 5.0, 4.0, 7.0, 6.0]).tolist() == [3, 1]
    assert worst_quarter([2.0, 1.0, 1.0, 0.5, 9.0]).tolist() == [3]      # 5 // 4 = 1
    assert worst_quarter([5.0, 5.0, 5.0, 5.0]).tolist() == [0]           # ties: index order
    assert worst_quarter([7.0]).tolist() == [0]                          # at least one
    with pytest.raises(ValueError, match=r"psnr of shape \(0,\): expected one value per"):
        worst_quarter([])


@pytest.fixture(scope="module")
def profile_3(tmp_path_factory):
    d = tmp_path_factory.mktemp("prof")
    assert main(["profile", "--prompts", "3", "--seeds", "77", "--steps", "3",
                 "--out", str(d)]) == 0
    return d / "profile.npz"


def test_coda_eval_writes_the_pareto_rows(tmp_path, profile_3):
    out = tmp_path / "e"
    assert main(["eval", "--policy",
                 "uniform,pab,teacache,magcache,fbcache,lemica,coda,coda-lat,coda+dra",
                 "--skip", "0.3", "--prompts", "3,5", "--seeds", "5", "--steps", "3",
                 "--profile", str(profile_3), "--workers", "0", "--out", str(out)]) == 0
    rows = json.loads((out / "pareto.json").read_text())
    assert [r["policy"] for r in rows] == ["uniform", "pab", "teacache", "magcache", "fbcache",
                                           "lemica", "coda", "coda-lat", "coda+dra"]
    for r in rows:
        assert KEYS <= set(r) and r["target_skip"] == 0.3 and r["videos"] == 2
        assert 0 <= r["ops_skipped_fraction"] < 1 and 0 <= r["label_accuracy"] <= 1
        assert r["pcie_bytes"] > 0
    coda = next(r for r in rows if r["policy"] == "coda")
    # whole-step plans of 3 steps (cooldown 1) reuse step 1 or nothing, with or without the
    # constant cross attention at steps 1-2: 1/3 is the closest to 0.3 (0, 2/15, 6/15 else)
    assert coda["ops_skipped_fraction"] == pytest.approx(1 / 3) and coda["segments"] > 0
    # coda-lat: searched within uniform's modelled latency at the skip, and counted against
    from coda.experiments.search import within_budget
    lat, uni = (next(r for r in rows if r["policy"] == p) for p in ("coda-lat", "uniform"))
    assert within_budget(lat["modelled"]["latency_s"], uni["modelled"]["latency_s"])
    assert all(("coda_lat_wins" in r) == (r["policy"] != "coda-lat") for r in rows)
    assert all(("coda_wins" in r) == (r["policy"] != "coda") for r in rows)
    dra = next(r for r in rows if r["policy"] == "coda+dra")
    # DRA's default probe, the second difference of the model's output, needs three steps
    # before the probed one; the 3-step plans reuse step 1 only: nothing to probe, nothing on
    # the NMEs
    assert dra["monitors"] == 0 and dra["monitor_nme_cycles"] == 0 and dra["fallbacks"] == 0
    # the probe chosen on the profile's one video, with the table it gave
    from coda.host.cache.policies.dra import DEFAULT_PROBES, StepThresholds
    probes = json.loads((out / "dra_probes.json").read_text())
    assert list(probes) == ["skip 0.3"] and probes["skip 0.3"]["videos"] == [[3, 77]]
    chosen = probes["skip 0.3"]
    assert chosen["probe"] in DEFAULT_PROBES and set(chosen["probes"]) == set(DEFAULT_PROBES)
    assert StepThresholds.from_dict(chosen["table"]).probe == chosen["probe"]
    assert (out / "pareto.png").stat().st_size > 1000
    # every policy has a modelled system-f latency: a dynamic one's the mean over its videos
    # of the schedule each followed (its recorded events)
    from coda.host.cache.policies import POLICIES
    for r in rows:
        how = r["modelled"]["from"]
        static = hasattr(POLICIES[r["policy"]], "build")     # a schedule it builds
        assert how == ("schedule" if static else "events"), r["policy"]
        if how == "events":
            per = r["modelled"]["per_video_latency_s"]
            assert len(per) == 2 and r["modelled"]["latency_s"] == pytest.approx(sum(per) / 2)
        assert 0 <= r["flops_skipped_fraction"] <= r["ops_skipped_fraction"] or \
            r["policy"] not in ("uniform", "coda")
    # whole steps reused: every operator of the step, so the same fraction of FLOPs
    assert coda["flops_skipped_fraction"] == pytest.approx(1 / 3)
    # the table lists the rows by modelled latency, fastest first
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 2 + len(rows)
    listed = [line.split(" | ")[0].lstrip("| ") for line in table[2:]]
    latencies = [float(line.split(" | ")[2]) for line in table[2:]]
    assert sorted(listed) == sorted(r["policy"] for r in rows) and latencies == sorted(latencies)
    corner = json.loads((out / "corner_cases.json").read_text())
    assert {c["set"] for c in corner} == {"worst-static-psnr", "fastest-motion", "all"}
    videos = json.loads((out / "videos.json").read_text())["videos"]
    assert [v["seed"] for v in videos] == [5, 5] and "coda+dra@0.3" in videos[0]


@pytest.mark.parametrize("argv, message", [
    (["--policy", "uniform,fora"], "--policy 'fora': unknown value, expected a comma-separated "
                                   "list of uniform, pab"),
    (["--policy", "uniform,,coda"], "--policy 'uniform,,coda': an empty item"),
    (["--policy", "uniform,uniform"], "--policy 'uniform,uniform': 'uniform' given twice"),
    (["--policy", ""], "--policy '': empty"),
    (["--skip", "0.5,1"], "--skip 1.0: expected fractions in (0, 1)"),
    (["--skip", "0"], "--skip 0.0: expected fractions in (0, 1)"),
    (["--skip", "nan"], "--skip nan: expected fractions in (0, 1)"),
    (["--skip", "0.3,,0.5"], "--skip '0.3,,0.5': an empty item"),
    (["--skip", "0.3,0.5,0.3"], "--skip '0.3,0.5,0.3': 0.3 given twice"),
    (["--prompts", "1,,2"], "--prompts '1,,2': an empty item"),
    (["--guidance", "nan"], "--guidance nan: expected a finite CFG scale >= 0"),
    (["--guidance", "inf"], "--guidance inf: expected a finite CFG scale >= 0"),
    (["--guidance", "-2"], "--guidance -2.0: expected a finite CFG scale >= 0"),
    (["--steps", "100000"], "--steps 100000: expected 1..1000"),
    (["--steps", "6"], "made for 50 steps, expected 6"),
    (["--seeds", "100"], "--seeds 100: seeds [100] were profiled"),
    (["--seeds", "99-101"], "--seeds 99-101: seeds [100, 101] were profiled"),
    (["--profile", "nowhere.npz"], "nowhere.npz: no such file"),
    # too short for any policy to cache anything: refused before any generation
    (["--policy", "uniform", "--skip", "0.3", "--steps", "1"],
     "--steps 1 with --policy uniform: nothing would be cached"),
    (["--policy", "uniform", "--skip", "0.3", "--steps", "2"],
     "--steps 2 with --policy uniform: nothing would be cached"),
    (["--policy", "coda,pab", "--steps", "2"], "--steps 2 with --policy pab: nothing would be "
                                              "cached"),
    # a given --profile is checked even when no policy reads it
    (["--policy", "uniform", "--profile", "nowhere.npz"], "--profile nowhere.npz: no such file"),
    (["--policy", "uniform,pab", "--profile", "text.npz"],
     "--profile text.npz: not a profile written by coda profile"),
    (["--policy", "uniform", "--profile", "half.npz"],
     "--profile half.npz: not a profile written by coda profile"),
    # the search's bound, for every skip, before any search
    (["--policy", "coda", "--skip", "0.5,0.99"], "--skip 0.99: whole-step plans of 50 steps "
                                                 "(the last 1 computed) reach 0.000..0.960, or "
                                                 "0.196..0.964 with cross_attn reused at every "
                                                 "step"),
    (["--workers", "-1"], "--workers -1: expected >= 0"),
])
def test_coda_eval_refuses_bad_input(tmp_path, capsys, monkeypatch, argv, message):
    from coda.host.cache.shipped import SHIPPED_PROFILE
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.npz").write_text("not a profile\n")
    data = SHIPPED_PROFILE.read_bytes()
    (tmp_path / "half.npz").write_bytes(data[:len(data) // 2])
    out = tmp_path / "e"
    assert main(["eval", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err and not out.exists(), err
    assert err.count("\n") == 1


def test_coda_eval_refuses_seeds_of_a_given_profile_even_for_uniform(tmp_path, capsys,
                                                                     profile_3):
    out = tmp_path / "e"
    assert main(["eval", "--policy", "uniform", "--seeds", "76-77", "--steps", "3",
                 "--profile", str(profile_3), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--seeds 76-77: seeds [77] were profiled" in err and "has seeds [77]" in err
    assert main(["eval", "--policy", "uniform", "--seeds", "5", "--steps", "4",
                 "--profile", str(profile_3), "--out", str(out)]) == 2
    assert "made for 3 steps, expected 4" in capsys.readouterr().err
    assert not out.exists()


def test_coda_eval_at_the_largest_skip(tmp_path, profile_3):
    """3 steps, cooldown 1: only step 1 can reuse, a third of the executions; the coda
    schedule at that bound is every operator of step 1."""
    out = tmp_path / "e"
    assert main(["eval", "--policy", "coda", "--skip", str(1 / 3), "--prompts", "3",
                 "--seeds", "5", "--steps", "3", "--profile", str(profile_3), "--workers", "0",
                 "--out", str(out)]) == 0
    rows = json.loads((out / "pareto.json").read_text())
    assert rows[0]["ops_skipped_fraction"] == pytest.approx(1 / 3)


def test_coda_eval_int8_rows(tmp_path):
    """--cache-format bf16,int8: a row NAME and NAME+int8 per policy; the int8 row stores
    0.5 + 1/48 of the bf16 row's bytes (G = 48 on the shipped model's 96 channels)."""
    out = tmp_path / "e"
    assert main(["eval", "--policy", "uniform", "--cache-format", "bf16,int8", "--skip", "0.5",
                 "--steps", "6", "--prompts", "3", "--seeds", "0", "--batch", "1",
                 "--out", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads((out / "pareto.json").read_text())}
    assert set(rows) == {"uniform", "uniform+int8"}
    assert rows["uniform"]["cache_format"] == "bf16" and rows["uniform+int8"]["cache_format"] == "int8"
    ratio = rows["uniform+int8"]["stored_bytes"] / rows["uniform"]["stored_bytes"]
    assert ratio == pytest.approx((1536 + 64) / 3072)
    assert rows["uniform+int8"]["ops_skipped_fraction"] == rows["uniform"]["ops_skipped_fraction"]


@pytest.mark.parametrize("argv, message", [
    (["--cache-format", "int8", "--cache-group", "64"], "cache_group G=64 for C=96 channels"),
    (["--cache-group", "48"], "--cache-group 48: an int8 option"),
    (["--cache-format", "fp8"], "--cache-format"),
])
def test_coda_eval_refuses_a_bad_cache_format(tmp_path, capsys, argv, message):
    out = tmp_path / "e"
    assert main(["eval", "--policy", "uniform", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err and not out.exists(), err
