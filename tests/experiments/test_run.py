"""End to end: `coda run` on the shipped model, cache segments through the Verilated NME."""

import json
from pathlib import Path

import pytest

from coda.cli import main


@pytest.fixture(scope="module")
def schedule_6(tmp_path_factory):
    """A 6-step profile of the shipped model and a schedule file of the shipped model that
    mixes reused and computed operators inside its steps (tests/mixed_schedule.py)."""
    from coda.host.cache.profile import model_hash
    from coda.host.cache.shipped import save_schedule
    from coda.host.model.dit import load_model
    from mixed_schedule import mixed_schedule

    d = tmp_path_factory.mktemp("sched")
    assert main(["profile", "--prompts", "3", "--seeds", "77", "--steps", "6",
                 "--out", str(d / "p")]) == 0
    model, _ = load_model()
    save_schedule(d / "s.json", mixed_schedule(6, len(model.transformer.transformer_blocks), 0.5),
                  {"model_hash": model_hash(model), "profile": str(d / "p" / "profile.npz"),
                   "target_skip": 0.5})
    return d


def _capture(monkeypatch) -> dict:
    """Record what ``coda run`` computes: every ``generate`` result (the full-compute videos
    first), each ``cached_generate``'s (videos, events) (the RTL run, then the torch run of
    every prompt, which checks it)
    and the NMP drivers (the RTL run's first)."""
    import coda.host.model.sample as sample
    import coda.experiments.run as run

    got = {"videos": [], "cached": [], "drivers": []}
    generate, cached_generate, make_driver = sample.generate, sample.cached_generate, run._driver

    def spy_generate(*args, **kwargs):
        got["videos"].append(generate(*args, **kwargs))
        return got["videos"][-1]

    def spy_cached_generate(*args, **kwargs):
        videos, stats = cached_generate(*args, **kwargs)
        got["cached"].append((videos, kwargs.get("events")))
        return videos, stats

    def spy_driver(*args, **kwargs):
        got["drivers"].append(make_driver(*args, **kwargs))
        return got["drivers"][-1]

    monkeypatch.setattr(sample, "generate", spy_generate)
    monkeypatch.setattr(sample, "cached_generate", spy_cached_generate)
    monkeypatch.setattr(run, "_driver", spy_driver)
    return got


def _gif_panels(path, scale: int = 4, gap: int = 2) -> list[list]:
    """The frames of a side_by_side_gif of one video as [[full, cached] pixels (uint8
    [H, W]) per frame], read back from the file at the written scale."""
    import numpy as np
    from PIL import Image

    frames = []
    with Image.open(path) as img:
        for k in range(img.n_frames):
            img.seek(k)
            px = np.array(img.convert("L"))[::scale, ::scale]
            w = (px.shape[1] - 2 * gap) // 2
            frames.append([px[:w, :w], px[:w, w + gap:2 * w + gap]])
    return frames


def _dra_schedule_that_always_falls_back(schedule_6, steps: int):
    """A copy of the mixed schedule with DRA's thresholds in the file: 0 at every probed
    step, so every probe falls back."""
    from coda.experiments.dra_calibration import save_step_dra
    from coda.host.cache.profile import model_hash
    from coda.host.cache.policies.dra import StepThresholds
    from coda.host.cache.schedule import BRANCHES
    from coda.host.cache.shipped import load_schedule
    from coda.host.model.dit import load_model

    model, _ = load_model()
    sched = load_schedule(schedule_6 / "s.json")
    first = sched.order()[0]
    probed = {s for s in range(steps) for b in BRANCHES if first in sched.reused(s, b)}
    assert probed
    dra_file = schedule_6 / "s_dra.json"
    dra_file.write_text((schedule_6 / "s.json").read_text())
    save_step_dra(dra_file, sched, StepThresholds(
        {s: 0.0 for s in probed}, steps, model_hash(model), sched.digest(), 1.0, 1.0))
    return dra_file


def _every_op(sched, prompts, steps: int) -> list[tuple]:
    """(step, branch, sample, layer, op) of every operator of the generation."""
    from coda.host.cache.schedule import BRANCHES

    return [(s, b, i, layer, op) for s in range(steps) for b in BRANCHES
            for i in range(len(prompts)) for layer, op in sched.order()]


def _check_quality(report, full, cached, prompts) -> None:
    """PSNR, SSIM of the cached videos against the full-compute ones (pixels in [-1, 1]),
    and the classifier's label accuracy on every frame of both."""
    import math

    import numpy as np
    from torchmetrics.functional.image import (peak_signal_noise_ratio,
                                                structural_similarity_index_measure)

    from coda.host.model.classifier import digit_classifier

    frames = lambda v: v.double().reshape(-1, 1, *v.shape[-2:])  # noqa: E731
    assert report["psnr_db"] == float(peak_signal_noise_ratio(frames(cached), frames(full),
                                                              data_range=2.0))
    mse = float(((cached.double() - full.double()) ** 2).mean())
    assert report["psnr_db"] == pytest.approx(10 * math.log10(2.0 ** 2 / mse), rel=1e-6)
    assert report["ssim"] == float(structural_similarity_index_measure(
        frames(cached), frames(full), data_range=2.0))
    assert 0 < report["ssim"] < 1
    # prompt adherence: the classifier's hits on every frame of the produced videos
    clf = digit_classifier()
    for key, videos in (("label_accuracy_full", full), ("label_accuracy_cached", cached)):
        hits = clf.predict_frames(videos) == np.array(prompts)[:, None]
        assert report[key] == float(hits.mean()), key


def _check_operator_events(report, events, sched, prompts, steps: int) -> None:
    """One event per step x branch x sample x operator; DRA reuses what the schedule reuses
    unless a monitor made it recompute (fallback); the fallbacks and the fraction of
    operators skipped reported from them."""
    from coda.host.cache.schedule import BRANCHES

    ops = events.of("op")
    every = _every_op(sched, prompts, steps)
    assert sorted((e.step, e.branch, e.sample, e.layer, e.op) for e in ops) == sorted(every)
    for e in ops:
        assert (e.reused or e.reason == "fallback") == (e.ref in sched.reused(e.step, e.branch))
    fallbacks = sum(e.reason == "fallback" for e in ops)
    planned = len(prompts) * sum(len(sched.reused(s, b)) for s in range(steps) for b in BRANCHES)
    assert report["dra_fallbacks"] == fallbacks > 0
    assert report["ops_skipped_fraction"] == (planned - fallbacks) / len(every)


def _check_segments(report, events, sched, model, prompts, steps: int) -> None:
    """Segments: the maximal runs of what was reused, per step, branch and sample."""
    from coda.host.cache.schedule import segment_runs

    ops, segs = events.of("op"), events.of("segment")
    every = _every_op(sched, prompts, steps)
    frames_n = model.config["data"]["frames"]
    runs = sorted((s, b, i, tuple(run)) for s, b, i in {k[:3] for k in every}
                  for run in segment_runs({e.ref for e in ops if e.reused
                                           and (e.step, e.branch, e.sample) == (s, b, i)},
                                          sched.num_layers, frames_n))
    assert report["segments"] == len(runs) > 0
    assert sorted((g.step, g.branch, g.sample, g.ops) for g in segs) == runs
    for g in segs:
        assert sorted(e.ref for e in ops if e.segment == g.segment) == sorted(g.ops)


def _check_dra_probes(report, events, sched, prompts, steps: int) -> None:
    """Step DRA's probes: the first operator, once per sample at every step the schedule
    reuses it, in the first branch that asks and reuses it (the batched call's rows are
    [uncond; cond]); with the file's thresholds of 0 each one falls back, for both branches:
    every operator of that step the schedule reuses is computed (reason "fallback"), and
    nothing else is."""
    ops, mons = events.of("op"), events.of("monitor")
    first = sched.order()[0]
    asks = {s: next((b for b in ("uncond", "cond") if first in sched.reused(s, b)), None)
            for s in range(steps)}
    assert sorted((m.step, m.branch, m.sample) for m in mons) == sorted(
        (s, b, i) for s, b in asks.items() if b is not None for i in range(len(prompts)))
    assert all((m.layer, m.op) == first for m in mons)
    fired = {(m.step, m.sample) for m in mons}
    for e in ops:
        assert (e.reason == "fallback") == ((e.step, e.sample) in fired
                                            and e.ref in sched.reused(e.step, e.branch)), e
    assert report["monitors"] == len(mons) > 0


def _check_nme_work(report, events, driver) -> None:
    """NME work: a program per 8 terms of a segment, one per monitor; the cycles the driver
    counted are the events' cycles."""
    from coda.host.nme.ops import MAX_SEGMENT_TERMS

    segs, mons = events.of("segment"), events.of("monitor")
    assert report["nme_programs"] == (sum(-(-len(g.ops) // MAX_SEGMENT_TERMS) for g in segs)
                                      + len(mons)) == driver.stats["programs"]
    assert report["nme_cycles"] == sum(g.nme_cycles for g in segs + mons) > 0


def _check_host_link_bytes(report, events, driver) -> None:
    """Host-link bytes: every [T, C] tensor of 16-bit elements that crossed it (stored
    outputs, kept inputs, each sum segment's z up, the slot of zeros a sample's segments in a
    CFG branch read as x, written once per generation, monitor inputs), the K gate vectors of
    each segment to every rank, and the command words the driver sent."""
    ops, segs, mons = events.of("op"), events.of("segment"), events.of("monitor")
    (t, c), = {(e.tokens, e.channels) for e in ops}
    stores, kept = sum(e.stored_bytes > 0 for e in ops), sum(e.kept_bytes > 0 for e in ops)
    assert all(e.stored_bytes in (0, 2 * t * c) and e.kept_bytes in (0, 2 * t * c) for e in ops)
    zero_slots = len({(g.generation, g.branch, g.sample) for g in segs})
    tensors = stores + kept + len(segs) + zero_slots + len(mons)
    gates = sum(len(g.ops) for g in segs) * driver.n_ranks
    assert report["pcie_bytes"] == (2 * t * c * tensors + 2 * c * gates
                                    + driver.stats["cmd_bytes"])
    assert report["pcie_bytes"] == (driver.stats["bytes_written"] + driver.stats["bytes_read"]
                                    + driver.stats["cmd_bytes"])


def _check_interleave(report, driver) -> None:
    """Segments ran on the simulators while the host computed the other CFG branch."""
    assert report["interleave"]["async_launches"] == driver.stats["programs"]
    assert report["interleave"]["overlap_s"] > 0


def _check_modelled_platform(report) -> None:
    """The generation replayed on the default platform; every segment's modelled NME time is
    the cycles the cosimulation measured (ideal memory: the cycle model is exact)."""
    modelled = report["modelled"]
    assert modelled["available"] is True and set(modelled["systems"]) == set("abcdef")
    assert modelled["nme_check"]["max_rel_error"] == 0.0
    assert modelled["nme_check"]["segments"] == report["segments"]
    assert all(row["latency_s"] > 0 for row in modelled["systems"].values() if row["fits"])


def _check_gifs(report, out, full, cached) -> None:
    """The GIFs: per frame, the full-compute | cached pixels of the videos the run computed."""
    import numpy as np
    import torch

    assert [p.split("/")[-1] for p in report["gifs"]] == ["3_0.gif", "8_1.gif"]
    pixels = lambda v: ((v.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()  # noqa: E731
    for i, name in enumerate(("3_0.gif", "8_1.gif")):
        panels = _gif_panels(out / name)
        assert len(panels) == full.shape[2]
        for k, (left, right) in enumerate(panels):
            assert np.array_equal(left, pixels(full[i, 0, k]))
            assert np.array_equal(right, pixels(cached[i, 0, k]))


def test_coda_run_rtl_is_bit_identical_to_torch(tmp_path, schedule_6, monkeypatch):
    """A mixed schedule with DRA's monitors (l1_distance on the NME) and fallbacks: the
    decisions depend on NME results, so equal bits also mean equal decisions. Every figure of
    the report is derived again here from what the run computed (its videos, its operator
    events, its driver) and from the schedule."""
    import torch

    from coda.host.cache.profile import model_hash
    from coda.host.cache.shipped import load_schedule
    from coda.host.model.dit import load_model

    prompts, steps = [3, 8], 6
    dra_file = _dra_schedule_that_always_falls_back(schedule_6, steps)
    got = _capture(monkeypatch)
    rc = main(["run", "--out", str(tmp_path), "--steps", str(steps), "--policy", "coda+dra",
               "--schedule", str(dra_file),
               "--profile", str(schedule_6 / "p" / "profile.npz"),
               "--prompts", ",".join(map(str, prompts)), "--threads", "1",
               "--memory", "ideal"])    # the cycle model is exact on the ideal memory
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["policy"] == "coda+dra" and report["policy_params"]["margin"] == 1.0
    full = got["videos"][0]
    (cached, events), (reference, _) = got["cached"]
    driver = got["drivers"][0]
    assert full.shape == cached.shape and full.shape[0] == len(prompts)
    bit_exact = torch.equal(reference.view(torch.int32), cached.view(torch.int32))
    assert report["bit_exact_rtl_vs_torch"] is bit_exact is True

    _check_quality(report, full, cached, prompts)
    model, _ = load_model()
    sched = load_schedule(schedule_6 / "s.json", model_id=model_hash(model), num_steps=steps,
                          num_layers=len(model.transformer.transformer_blocks))
    _check_operator_events(report, events, sched, prompts, steps)
    _check_segments(report, events, sched, model, prompts, steps)
    _check_dra_probes(report, events, sched, prompts, steps)
    _check_nme_work(report, events, driver)
    _check_host_link_bytes(report, events, driver)
    assert report["sim_cycles_per_s"] > 0 and report["wall_s"] > 0
    _check_interleave(report, driver)
    _check_modelled_platform(report)
    _check_gifs(report, tmp_path, full, cached)


def test_the_shipped_schedule_is_the_default_and_fits_the_shipped_model():
    from coda.host.model.dit import load_model
    from coda.host.cache.profile import Profile, model_hash
    from coda.experiments.run import RunConfig, _policy
    from coda.host.cache.shipped import SHIPPED_PROFILE, SHIPPED_SCHEDULE, load_schedule

    model, _ = load_model()
    sched = load_schedule(SHIPPED_SCHEDULE, model_id=model_hash(model), num_steps=50,
                          num_layers=4)
    assert abs(sched.ops_skipped_fraction() - 0.5) < 0.01
    Profile.load(SHIPPED_PROFILE).check_for(model_hash(model), 50, 4)

    cfg = RunConfig(policy=None, schedule=None, profile=None, interval=None, warmup=None,
                    skip=None, steps=50, cache="reuse", model="digits")
    name, policy = _policy(cfg, model)
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
    # the default prompts are 0-9: 10 videos take seeds --seed .. --seed + 9 <= 2^31 - 1
    (["--seed", "-1"], f"--seed -1: expected an integer 0..{2 ** 31 - 1 - 9}"),
    (["--seed", "99999999999"], f"--seed 99999999999: expected an integer 0..{2 ** 31 - 1 - 9}"),
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
    (["--policy", "uniform", "--skip", "0.3"], "--skip 0.3: a pab / teacache / magcache / "
                                                "fbcache / lemica option"),
    (["--interval", "3", "--skip", "0.3"], "expected no --skip with --policy uniform"),
    (["--policy", "coda", "--skip", "0.3"], "expected no --skip with --policy coda"),
    (["--policy", "coda", "--schedule", "s.json", "--skip", "0.3"],
     "expected no --skip with --policy coda"),
    (["--policy", "coda+dra", "--skip", "0.3"], "expected no --skip with --policy coda+dra"),
    (["--policy", "uniform", "--profile", "p.npz"], "--profile p.npz: read by coda+dra / "
                                                    "teacache / magcache / fbcache / lemica only"),
    (["--policy", "coda", "--profile", "p.npz"], "expected no --profile with --policy coda"),
    (["--steps", "4", "--warmup", "100"], "--warmup 100 with --steps 4: nothing would be "
                                          "cached"),
    (["--steps", "4", "--warmup", "3"], "expected --warmup 1..2 (--steps - 2)"),
    (["--steps", "1", "--interval", "2"], "--steps 1 with --policy uniform: nothing would be "
                                          "cached"),
    (["--interval", "1"], "--interval 1: recomputes every step, nothing would be cached"),
    # every policy, not only uniform: a run too short to cache anything is refused
    (["--policy", "pab", "--steps", "2"], "--steps 2 with --policy pab: nothing would be "
                                          "cached"),
    (["--policy", "teacache", "--steps", "2"], "--steps 2 with --policy teacache: nothing"),
    (["--policy", "magcache", "--steps", "1"], "--steps 1 with --policy magcache: nothing"),
    # a coda schedule says itself what it reuses (one for 2 steps may reuse step 1)
    (["--policy", "coda+dra", "--steps", "2"], "--policy coda+dra --steps 2: the shipped "
                                               "profile is for 50 steps"),
    (["--steps", "6"], "the shipped schedule is for 50 steps"),
    (["--policy", "teacache", "--steps", "6"], "the shipped profile is for 50 steps"),
    (["--policy", "coda", "--interval", "3"], "--interval/--warmup: options of --policy uniform"),
    (["--schedule", "missing.json"], "--schedule missing.json: cannot read it"),
    (["--policy", "magcache", "--profile", "missing.npz"], "missing.npz: no such file"),
    (["--rtl-videos", "2"], "--rtl-videos 2: an option of --backend rtl"),
    # an option that does nothing with the chosen backend is refused, not ignored (also
    # when given at its default value): a device cache has no NME, only rtl has DRAM timing
    (["--backend", "device", "--preset", "timing-closed"],
     "--preset timing-closed: no NME runs with --backend device (its cache segments are "
     "torch ops in --device memory), expected no --preset with --backend device"),
    (["--backend", "device", "--mul-latency", "2"], "--mul-latency 2: no NME runs with "
                                                    "--backend device"),
    (["--backend", "device", "--add-latency", "0"], "expected no --add-latency with "
                                                    "--backend device"),
    (["--backend", "device", "--operand-latency", "1"], "expected no --operand-latency"),
    (["--backend", "device", "--trail-stores", "on"], "--trail-stores on: no NME runs"),
    (["--backend", "device", "--lanes", "8"], "--lanes 8: no NME runs with --backend device"),
    (["--backend", "device", "--dram", "DDR5-4800"],
     "--dram DDR5-4800: DRAM timing needs --backend rtl (got --backend device)"),
    (["--dram", "DDR5-4800", "--nme-mhz", "100"],
     "--dram DDR5-4800: DRAM timing needs --backend rtl (got --backend torch)"),
    (["--nme-mhz", "100"], "--nme-mhz 100: only with --dram"),
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

    from coda.host.cache.profile import Profile
    from coda.host.cache.shipped import SHIPPED_PROFILE

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
    assert report["policy_params"]["warmup"] == 2
    uniform = _uniform_schedule(interval=2, warmup=2, steps=4)
    assert report["ops_skipped_fraction"] == uniform.ops_skipped_fraction() > 0
    assert (out / "1_0.gif").stat().st_size > 0


def _uniform_schedule(interval: int, warmup: int, steps: int):
    """The schedule the uniform policy follows on the shipped model."""
    from coda.host.model.dit import load_model
    from coda.host.cache.policies import get_policy

    model, _ = load_model()
    return get_policy("uniform", interval=interval, warmup=warmup).build(
        steps, len(model.transformer.transformer_blocks))


def test_modelled_availability_is_decided_from_the_flags():
    from coda.experiments.run import RunConfig, _modelled_unavailable

    cfg = RunConfig(lanes=8, dimms=1, ranks=2)
    assert _modelled_unavailable(cfg, 64, "DDR5-4800") is None
    cfg = RunConfig(lanes=16, dimms=1, ranks=2)
    assert "16 lanes, depth 64" in _modelled_unavailable(cfg, 64, "DDR5-4800")


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
    # a folder nothing can be created in (a pseudo file system; root's permission bits say
    # yes) is refused before the model loads, naming the flag
    assert main(["run", "--out", "/proc/coda-out", "--backend", "torch"]) == 2
    assert "--out /proc/coda-out: cannot create it in /proc" in capsys.readouterr().err


def test_coda_run_on_the_dram_timed_dimm_nmp(tmp_path, monkeypatch):
    """--dram: every segment through the DIMM-NMP cosimulation (NMEs behind DDR5 controllers,
    ranks in lockstep), still bit-identical to the torch backend; --interval/--warmup
    select the uniform policy."""
    import torch

    from coda.host.model.dit import load_model

    got = _capture(monkeypatch)
    rc = main(["run", "--out", str(tmp_path), "--steps", "4", "--warmup", "2", "--interval", "2",
               "--prompts", "5", "--threads", "1", "--dram", "DDR5-4800", "--dram-log"])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    # DRAM energy: the command logs priced per command and power state; the controllers'
    # counters give the same RD/WR and REF energy, a background at least the logged one
    # (every bank open while the rank runs), and ACTs from the row misses and conflicts,
    # classified when a request arrives: a refresh before it is served can close the row of
    # a request counted as a hit, so the log holds up to one more ACT per bank and refresh
    from coda.hw.dram.power import command_energy
    from coda.hw.dram.standards import get_standard

    energy = report["rtl"]["dram_energy"]
    logged, counted = energy["split_j"], energy["counters_split_j"]
    for part in ("read_write", "refresh"):
        assert counted[part] == pytest.approx(logged[part], rel=1e-12) and logged[part] > 0
    assert counted["background"] >= logged["background"] > 0
    e = command_energy(get_standard("DDR5-4800"))
    refreshes = sum(r["refreshes"] for r in energy["ranks"].values())
    assert 0 < logged["act_pre"] - counted["act_pre"] <= refreshes * e.banks * e.act_pre_pj * 1e-12 \
        or counted["act_pre"] == pytest.approx(logged["act_pre"], rel=1e-12)
    assert all(Path(p).is_file() for p in energy["logs"])
    (cached, events), (reference, _) = got["cached"]
    assert report["bit_exact_rtl_vs_torch"] is torch.equal(cached.view(torch.int32),
                                                           reference.view(torch.int32)) is True
    assert report["dram"] == "DDR5-4800" and report["policy"] == "uniform"
    # what the uniform schedule implies for one video
    uniform = _uniform_schedule(interval=2, warmup=2, steps=4)
    frames = load_model()[0].config["data"]["frames"]
    assert report["ops_skipped_fraction"] == uniform.ops_skipped_fraction()
    assert report["segments"] == uniform.segment_count(frames) == len(events.of("segment")) > 0
    assert report["dra_fallbacks"] == report["monitors"] == 0
    # the cycles the DRAM-timed NMEs took, as the segment events recorded them
    assert report["nme_cycles"] == sum(g.nme_cycles for g in events.of("segment")) > 0


def test_coda_run_checks_the_first_prompts_on_the_rtl_and_shows_all_in_a_grid(tmp_path,
                                                                              monkeypatch,
                                                                              capsys):
    """--rtl-videos 1 of 3 prompts: the first prompt runs through the RTL; all three are
    generated cached on torch, once, for the report and the grid, and the RTL video is
    checked against row 0 of that run (a video does not depend on its batch)."""
    import numpy as np
    import torch

    got = _capture(monkeypatch)
    rc = main(["run", "--out", str(tmp_path), "--steps", "4", "--warmup", "2", "--interval", "2",
               "--prompts", "2,5,6", "--rtl-videos", "1", "--threads", "1",
               "--memory", "ideal"])    # the cycle model is exact on the ideal memory
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    full = got["videos"][0]
    (rtl, rtl_events), (cached, events) = got["cached"]
    assert rtl.shape[0] == 1 and cached.shape == full.shape
    same = lambda a, b: torch.equal(a.view(torch.int32), b.view(torch.int32))  # noqa: E731
    assert report["bit_exact_rtl_vs_torch"] is same(rtl, cached[:1]) is True
    assert report["rtl"]["prompts"] == [2]
    assert "1 of 3: digits 2" in capsys.readouterr().out      # the summary table's row
    assert report["rtl"]["nme_cycles"] == sum(g.nme_cycles for g in rtl_events.of("segment")) > 0
    # the cosimulation's CFG interleaving, and its own replay checked against its cycles
    assert report["interleave"]["async_launches"] == got["drivers"][0].stats["programs"] > 0
    check = report["rtl"]["modelled"]["nme_check"]
    assert check["max_rel_error"] == 0.0 and check["segments"] == len(rtl_events.of("segment"))
    assert report["segments"] == len(events.of("segment")) == 3 * len(rtl_events.of("segment"))
    assert report["nme_cycles"] == sum(g.nme_cycles for g in events.of("segment"))
    # the grid: three full | cached pairs in one row, at scale 3
    from PIL import Image
    with Image.open(tmp_path / "grid.gif") as img:
        assert img.n_frames == full.shape[2] and img.size == (3 * 2 * 34 * 3, 34 * 3)
        img.seek(2)
        px = np.array(img.convert("L"))[::3, ::3]
    pixels = lambda v: ((v.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()  # noqa: E731
    for i in range(3):
        assert np.array_equal(px[:32, 68 * i:68 * i + 32], pixels(full[i, 0, 2]))
        assert np.array_equal(px[:32, 68 * i + 34:68 * i + 66], pixels(cached[i, 0, 2]))
    assert report["grid_gif"] == str(tmp_path / "grid.gif")


@pytest.mark.parametrize("name", ["grid.gif", "report.json"])
def test_coda_run_on_a_full_disk_names_the_file(tmp_path, monkeypatch, capsys, name):
    """A write that fails (here: no space left) is one line naming the file; the file is
    not left truncated, an old one stays as it was."""
    from full_disk import fill_disk

    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_bytes(b"old")
    fill_disk(monkeypatch, name)
    assert main(["run", "--steps", "4", "--interval", "2", "--out", str(out), "--threads",
                 "1", "--backend", "torch", "--prompts", "1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"coda: error: {out / name}: No space left on device", err
    assert (out / name).read_bytes() == b"old"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_coda_run_rtl_videos_must_be_among_the_prompts(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--out", str(out), "--prompts", "1,2", "--rtl-videos", "3"]) == 2
    assert "--rtl-videos 3: expected 1..2 (the number of --prompts)" in capsys.readouterr().err
    assert not out.exists()


def test_coda_run_dram_needs_rtl_and_a_known_preset(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path), "--backend", "torch", "--dram", "DDR5-4800",
                 "--steps", "4", "--policy", "uniform"]) == 2
    assert "--dram DDR5-4800: DRAM timing needs --backend rtl" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path), "--dram", "DDR9", "--policy", "uniform"]) == 2
    assert "DDR9" in capsys.readouterr().err


# the DRAM-timed variant (a DIMM-NMP build of its own) in `make verify-long`: the segment
# programs it runs are bit-exact on the DRAM-timed DIMM-NMP in tests/cosim/test_cosim_nmp.py,
# and `coda run` on it end to end in test_coda_run_on_the_dram_timed_dimm_nmp
@pytest.mark.parametrize("dram", [None, pytest.param("DDR5-4800", marks=pytest.mark.slow)])
def test_coda_run_forecast_on_the_rtl_is_bit_identical_to_torch(tmp_path, schedule_6,
                                                                 monkeypatch, dram):
    """--cache forecast: the alphas calibrated on the profile's videos (its prompt 3, seed 77)
    for the uniform schedule, forecast segments of two terms per reused operator through the
    Verilated NMEs (ideal memory, and DRAM-timed) give the torch backend's bits."""
    import torch

    got = _capture(monkeypatch)
    rc = main(["run", "--out", str(tmp_path), "--steps", "6", "--interval", "2",
               "--warmup", "1", "--prompts", "5", "--threads", "1", "--cache", "forecast",
               "--profile", str(schedule_6 / "p" / "profile.npz")]
              + (["--dram", dram] if dram else ["--memory", "ideal"]))
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    (cached, events), (reference, _) = got["cached"][-2:]
    assert report["bit_exact_rtl_vs_torch"] is torch.equal(cached.view(torch.int32),
                                                           reference.view(torch.int32)) is True
    assert report["cache"] == "forecast" and report["forecast"]["videos"] == 1
    assert "calibrated on" in report["forecast"]["source"]
    # forecast terms: two per reused operator where the table has a non-zero alpha
    segs = events.of("segment")
    assert segs and any(s.terms > len(s.ops) for s in segs)
    assert all(len(s.ops) <= s.terms <= 2 * len(s.ops) for s in segs)


def test_coda_run_forecast_refuses_a_dynamic_policy(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path), "--policy", "teacache",
                 "--cache", "forecast"]) == 2
    assert ("--cache forecast with --policy teacache: expected a static policy"
            in capsys.readouterr().err)


# the DRAM-timed variant (a DIMM-NMP build of its own) in `make verify-long`: the segment
# programs it runs are bit-exact on the DRAM-timed DIMM-NMP in tests/cosim/test_cosim_nmp.py,
# and `coda run` on it end to end in test_coda_run_on_the_dram_timed_dimm_nmp
@pytest.mark.parametrize("dram", [None, pytest.param("DDR5-4800", marks=pytest.mark.slow)])
def test_coda_run_int8_on_the_rtl_is_bit_identical_to_torch(tmp_path, schedule_6,
                                                             monkeypatch, dram):
    """--cache-format int8: outputs quantised on the host (G = 48, the default for the
    shipped model's 96 channels), segments dequantising them on the Verilated NMEs (ideal
    memory, and DRAM-timed), a program per 7 int8 terms, give the torch backend's bits; the
    stored bytes are 0.5 + 1/48 of the 16-bit entries' (to whole words per rank tile)."""
    import torch

    from coda.host.nme.compiler import segment_terms
    from coda.hw.nme.isa import NMEConfig

    got = _capture(monkeypatch)
    rc = main(["run", "--out", str(tmp_path), "--steps", "6", "--policy", "coda",
               "--schedule", str(schedule_6 / "s.json"), "--prompts", "5", "--threads", "1",
               "--cache-format", "int8"]
              + (["--dram", dram] if dram else ["--memory", "ideal"]))
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    (cached, events), (reference, _) = got["cached"][-2:]
    assert report["bit_exact_rtl_vs_torch"] is torch.equal(cached.view(torch.int32),
                                                           reference.view(torch.int32)) is True
    assert report["cache_format"] == "int8" and report["cache_group"] == 48
    segs, ops = events.of("segment"), events.of("op")
    k = segment_terms(NMEConfig(), "segment_int8")
    assert segs and sum(s.programs for s in segs) == sum(-(-s.terms // k) for s in segs)
    stored = [e for e in ops if e.stored_bytes]
    per_rank = 96 * 512 // 2                 # elements of a rank's tile of one slot
    int8_words = per_rank // 16 + -(-per_rank // 48 // 8)
    assert stored and all(e.stored_bytes == 2 * int8_words * 16 for e in stored)
    assert 0.50 <= int8_words / (per_rank // 8) <= 0.53


def test_coda_run_int8_refuses_a_group_that_does_not_divide_the_channels(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path), "--policy", "uniform", "--cache-format",
                 "int8", "--cache-group", "64"]) == 2
    assert "cache_group G=64 for C=96 channels" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path), "--policy", "uniform",
                 "--cache-group", "48"]) == 2
    assert "--cache-group 48: an int8 option" in capsys.readouterr().err


def test_coda_schedule_dra_writes_the_block_coda_run_reads(tmp_path, capsys, schedule_6,
                                                          monkeypatch):
    """coda schedule dra: the table calibrate_default_dra chooses on the profile's videos,
    stored as the file's "dra" block (other blocks kept); coda run reads that block."""
    from coda.experiments.dra_calibration import calibrate_default_dra, load_step_dra
    from coda.host.cache.profile import Profile, model_hash
    from coda.experiments.rollouts import torch_driver
    from coda.host.cache.shipped import load_schedule
    from coda.host.model.dit import load_model

    path, profile = tmp_path / "s.json", schedule_6 / "p" / "profile.npz"
    path.write_text((schedule_6 / "s.json").read_text())
    assert main(["schedule", "dra", "--schedule", str(path), "--profile", str(profile)]) == 0
    assert f"{path}: probe '" in capsys.readouterr().out
    model, _ = load_model()
    sched, table = load_step_dra(path, model_id=model_hash(model), num_steps=6)
    assert sched == load_schedule(schedule_6 / "s.json")
    want, report = calibrate_default_dra(
        model, sched, Profile.load(profile), num_steps=6, guidance_scale=table.guidance_scale,
        driver_factory=lambda n: torch_driver(model, n, inputs=True))
    assert table == want and table.probe == report["probe"]
    kept = json.loads((schedule_6 / "s.json").read_text())
    assert json.loads(path.read_text())["coda"] == kept["coda"]
    # coda run: the block's table, not a calibration of its own (which would call this)
    import coda.experiments.dra_calibration as dc

    def refuse(*args, **kwargs):
        raise AssertionError("coda run calibrated instead of reading the \"dra\" block")
    monkeypatch.setattr(dc, "calibrate_default_dra", refuse)
    assert main(["run", "--out", str(tmp_path / "out"), "--steps", "6", "--backend", "torch",
                 "--policy", "coda+dra", "--schedule", str(path), "--profile", str(profile),
                 "--prompts", "3", "--threads", "1"]) == 0
    params = json.loads((tmp_path / "out" / "report.json").read_text())["policy_params"]
    assert params["probe"] == table.probe and params["budget"] == table.budget
    assert main(["schedule", "dra", "--schedule", str(path), "--threads", "0"]) == 2
    assert "--threads 0: expected >= 1" in capsys.readouterr().err
    assert main(["schedule", "dra", "--schedule", str(path)]) == 2     # the shipped profile
    assert "made for 50 steps, expected 6" in capsys.readouterr().err


def test_coda_schedule_forecast_writes_the_calibrated_alphas(tmp_path, capsys, schedule_6):
    """coda schedule forecast: calibrate_forecast's table on the profile's videos, stored as
    the file's "forecast" block; a file of another step count is refused, naming it."""
    from coda.experiments.forecast_calibration import calibrate_forecast, load_forecast
    from coda.host.model.sample import DEFAULT_GUIDANCE
    from coda.host.cache.profile import Profile, model_hash
    from coda.experiments.rollouts import torch_driver
    from coda.host.model.dit import load_model

    path, profile = tmp_path / "s.json", schedule_6 / "p" / "profile.npz"
    path.write_text((schedule_6 / "s.json").read_text())
    assert main(["schedule", "forecast", "--schedule", str(path), "--profile",
                 str(profile)]) == 0
    assert f"{path}: forecast alphas at " in capsys.readouterr().out
    model, _ = load_model()
    sched, table = load_forecast(path, model_id=model_hash(model), num_steps=6)
    prof = Profile.load(profile)
    want = calibrate_forecast(model, {"s": sched}, prof.meta["prompts"], prof.meta["seeds"],
                              num_steps=6, guidance_scale=DEFAULT_GUIDANCE,
                              driver_factory=lambda n: torch_driver(model, n))["s"]
    assert table == want
    other = json.loads(path.read_text())
    other["num_steps"] = 8
    (tmp_path / "o.json").write_text(json.dumps(other))
    assert main(["schedule", "forecast", "--schedule", str(path), str(tmp_path / "o.json"),
                 "--profile", str(profile)]) == 2
    assert "o.json" in capsys.readouterr().err


def test_coda_run_cosimulates_the_dram_timed_dimm_nmp_by_default():
    """With no memory option coda run's rtl backend is the DRAM-timed DIMM-NMP: DDR5-4800
    (the system model's preset) with the NMEs on their own clock of DEFAULT_NME_MHZ, capped
    at a slower standard's command clock (LPDDR5-6400: CK = 800 MHz, tCK = 1.25 ns);
    --memory ideal and the other backends cosimulate no DRAM."""
    import argparse

    from coda.experiments import run
    from coda.hw.dram.standards import DEFAULT_STANDARD
    from coda.hw.nmp import DEFAULT_NME_MHZ
    from coda.options import from_args

    def resolved(*argv):
        """(the NMEs' clock, the cosimulated DRAM) of the command line ``argv``; the config
        itself is not changed (its --dram stays what was given)."""
        parser = argparse.ArgumentParser()
        run.configure(parser)
        cfg = from_args(run.RunConfig, parser.parse_args(["--out", "o", *argv]))
        given_dram = cfg.dram
        result = run._resolve_memory(cfg)
        assert cfg.dram == given_dram
        return result

    assert DEFAULT_STANDARD == "DDR5-4800" and DEFAULT_NME_MHZ == 1000.0
    assert resolved() == (1000.0, "DDR5-4800")
    assert resolved("--dram", "lpddr5-6400") == (1000.0 / 1.25, "LPDDR5-6400")
    assert resolved("--nme-mhz", "2400") == (2400.0, "DDR5-4800")
    assert resolved("--dram", "DDR4-3200", "--nme-mhz", "400") == (400.0, "DDR4-3200")
    assert resolved("--memory", "ideal") == (None, None)
    assert resolved("--backend", "torch") == (None, None)


@pytest.mark.parametrize("argv, message", [
    (["--memory", "ideal", "--dram", "DDR5-4800"],
     "--dram DDR5-4800: the DRAM preset of --memory dram, expected no --dram with --memory "
     "ideal"),
    (["--memory", "ideal", "--nme-mhz", "500"],
     "--nme-mhz 500: only with --dram timing (--backend rtl --memory dram: the NME's own clock "
     "meets the DRAM controller's; an ideal memory has no clock)"),
    (["--backend", "torch", "--memory", "dram"],
     "--memory dram: the NMEs' rank memory of --backend rtl, expected no --memory with "
     "--backend torch"),
    (["--backend", "device", "--memory", "ideal"], "expected no --memory with --backend device"),
    (["--nme-mhz", "3000"], "nme_mhz=3000: the NME clock may not exceed the DDR5-4800 command "
                            "clock (2400 MHz)"),
    (["--dram", "LPDDR5-6400", "--nme-mhz", "1000"],
     "nme_mhz=1000: the NME clock may not exceed the LPDDR5-6400 command clock (800 MHz)"),
])
def test_coda_run_refuses_clashing_memory_options(tmp_path, capsys, argv, message):
    """Options of the DRAM-timed memory that the chosen memory or backend would ignore, and
    clocks beyond the standard's, are refused before any work, in one line naming them."""
    out = tmp_path / "out"
    assert main(["run", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err, err
    assert err.count("\n") == 1
    assert not out.exists()
