"""The whole-step schedule search: its space, the exact stand-in DP, the rollout judge and the
``coda schedule search`` command on a short profile of the shipped model; the proxy's step
weights, uniform reuse for a skip and schedule files that cannot be read."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.cli import main
from coda.host.cache.profile import Profile
from coda.host.cache.policies import uniform_for_skip
from coda.host.cache.schedule import BRANCHES, OP_TYPES, ScheduleError
from coda.host.cache.shipped import load_schedule
from coda.host.cache.weights import step_weights
from coda.experiments.step_plans import stand_in_cost
from coda.experiments.search import (StepPlan, constant_op_types, plan_by_dp, refined_plans,
                                     reused_steps_for, step_change, uniform_plan)

SHAPE = {"frames": 8, "tokens_per_frame": 64, "hidden": 96, "heads": 4, "ffn_inner": 384,
         "cond_tokens": 1, "layers": 2}


def synthetic_profile(steps=12, layers=2, videos=2, seed=0) -> Profile:
    """Output changes that fall over the steps; cross attention constant; FFNs change most."""
    rng = np.random.default_rng(seed)
    shape = (videos, steps, 2, layers, 5)
    base = np.array([0.3, 0.0, 0.6, 0.2, 0.5])[None, None, None, None, :]
    decay = np.linspace(1.0, 0.1, steps)[None, :, None, None, None]
    out = (base * decay * (1 + 0.2 * rng.random(shape))).astype(np.float32)
    out[:, 0] = np.nan
    inp = (0.5 * decay * (1 + 0.2 * rng.random(shape))).astype(np.float32) * np.ones(shape)
    inp[:, 0] = np.nan
    meta = {"model_hash": "synthetic", "shape": dict(SHAPE, layers=layers), "seeds": [100],
            "guidance_scale": 3.0}
    return Profile(out, inp.astype(np.float32), np.ones(shape, np.float32),
                   2 * np.ones(shape, np.float32), meta)


def _brute_force(change, weight, count, cooldown, gamma, max_run):
    """The cheapest plan by enumerating every set of reused steps."""
    s_n = len(change)
    cum = np.cumsum(change)
    w = np.asarray(weight, np.float64) ** gamma
    best = None
    for reused in itertools.combinations(range(1, s_n - cooldown), count):
        run, ok, cost, last_c = 0, True, 0.0, 0
        for s in range(1, s_n):
            if s in reused:
                run += 1
                cost += w[s] * (cum[s] - cum[last_c])
            else:
                run, last_c = 0, s
            ok &= run <= max_run
        if ok and (best is None or cost < best - 1e-12):
            best = cost
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(4, 10), st.data())
def test_the_dp_finds_the_cheapest_plan(steps, data):
    change = np.array([0.0] + data.draw(st.lists(st.floats(0, 1), min_size=steps - 1,
                                                 max_size=steps - 1)))
    weight = np.array(data.draw(st.lists(st.floats(0.01, 5), min_size=steps, max_size=steps)))
    cooldown = data.draw(st.integers(1, 2))
    count = data.draw(st.integers(0, steps - 1 - cooldown))
    gamma = data.draw(st.sampled_from([0.0, 1.0, 2.0]))
    max_run = data.draw(st.integers(1, 4))
    expected = _brute_force(change, weight, count, cooldown, gamma, max_run)
    if expected is None:
        with pytest.raises(ValueError, match="no plan reuses"):
            plan_by_dp(change, weight, count, cooldown=cooldown, gamma=gamma, max_run=max_run)
        return
    reused, cost = plan_by_dp(change, weight, count, cooldown=cooldown, gamma=gamma,
                              max_run=max_run)
    assert len(reused) == count and cost == pytest.approx(expected, abs=1e-9)
    assert not reused & set(range(steps - cooldown, steps)) and 0 not in reused
    # the plan's own cost is the reported one
    assert _brute_cost(change, weight, reused, gamma) == pytest.approx(cost, abs=1e-9)


def _brute_cost(change, weight, reused, gamma):
    cum, w, c, cost = np.cumsum(change), np.asarray(weight) ** gamma, 0, 0.0
    for s in range(1, len(change)):
        if s in reused:
            cost += w[s] * (cum[s] - cum[c])
        else:
            c = s
    return cost


def test_a_plan_is_a_schedule_of_whole_steps():
    plan = StepPlan(10, 2, {3, 4, 7}, ("cross_attn",))
    sched = plan.schedule()
    every = {(layer, op) for layer in range(2) for op in OP_TYPES}
    for step in range(10):
        for branch in BRANCHES:
            want = every if step in (3, 4, 7) else (
                {r for r in every if r[1] == "cross_attn"} if step else set())
            assert sched.reused(step, branch) == want
    assert sched.ops_skipped_fraction() == pytest.approx(plan.skip_fraction())
    assert plan.skip_fraction() == pytest.approx((3 * 5 + 6 * 1) / 50)
    with pytest.raises(ScheduleError, match="reused steps \\[0\\]"):
        StepPlan(10, 2, {0})
    with pytest.raises(ScheduleError, match="always-reused types \\['x'\\]"):
        StepPlan(10, 2, {1}, ("x",))


def test_operators_refreshed_inside_a_reused_step():
    """The second level of the space: refreshed operators are computed at their step (both
    branches), counted out of the skip, named by describe(); only reused steps, operators of
    the model and types not reused at every step can be refreshed."""
    refresh = {(4, (1, "spatial_attn")), (4, (0, "temporal_ffn"))}
    plan = StepPlan(10, 2, {3, 4, 7}, ("cross_attn",), refresh=refresh)
    sched = plan.schedule()
    every = {(layer, op) for layer in range(2) for op in OP_TYPES}
    for branch in BRANCHES:
        assert sched.reused(4, branch) == every - {r for _, r in refresh}
        assert sched.reused(3, branch) == sched.reused(7, branch) == every
    assert plan.skip_fraction() == pytest.approx((3 * 10 + 6 * 2 - 2) / (10 * 10))
    assert sched.ops_skipped_fraction() == pytest.approx(plan.skip_fraction())
    assert plan.describe().endswith("refresh[4:0.temporal_ffn,4:1.spatial_attn]")
    assert plan.refreshed(4) == {r for _, r in refresh} and plan.refreshed(3) == frozenset()
    for bad in [(5, (0, "spatial_attn")), (4, (2, "spatial_attn")), (4, (0, "cross_attn"))]:
        with pytest.raises(ScheduleError, match="refreshed operators"):
            StepPlan(10, 2, {3, 4, 7}, ("cross_attn",), refresh={bad})


def test_the_stand_in_cost_is_the_dp_cost():
    prof = synthetic_profile(steps=12)
    change, w = step_change(prof), np.linspace(2.0, 0.5, 12)
    for gamma, run in [(1.0, 3), (2.0, 5), (0.5, 2)]:
        reused, cost = plan_by_dp(change, w, 5, gamma=gamma, max_run=run)
        assert stand_in_cost(StepPlan(12, 2, reused), change, w, gamma) == pytest.approx(cost)


def test_refined_plans_compute_what_fits_in_the_step_the_stand_in_values_most():
    from coda.host.cache.weights import step_weights

    prof = synthetic_profile(steps=12, layers=4)
    always = ("cross_attn",)
    plan = StepPlan(12, 4, {2, 3, 4, 5, 7, 8, 9}, always, "base")
    change, (_, w) = step_change(prof, always), step_weights(prof)
    base = stand_in_cost(plan, change, w)
    drops = {s: base - stand_in_cost(plan, change, w, computed=frozenset([s]))
             for s in plan.reused}
    step = max(sorted(drops), key=drops.get)
    assert drops[step] > 0
    assert refined_plans(plan, prof, lambda p: False) == []
    for most in (4, 8, 15):         # operators the skip leaves room for
        floor = plan.skip_fraction() - most / (12 * 20)
        got = refined_plans(plan, prof, lambda p: p.skip_fraction() >= floor - 1e-12,
                            gammas=(1.0,))
        assert got and all({s for s, _ in q.refresh} == {step} for q in got)
        assert all(q.reused == plan.reused and q.always == always for q in got)
        layers = {q.label.split(" + ")[1]: {r for _, r in q.refresh} for q in got}
        n = min(3, most // 4)       # 4 fresh operators per layer: the largest range that fits
        assert layers[f"refresh step {step} last {n} layers"] == {
            (lay, op) for lay in range(4 - n, 4) for op in OP_TYPES if op not in always}
        assert layers[f"refresh step {step} first {n} layers"] == {
            (lay, op) for lay in range(n) for op in OP_TYPES if op not in always}
        m = min(3, most // 4)       # 4 operators of each type; FFNs change most, then spatial
        typed = next(v for k, v in layers.items() if "layers" not in k)
        assert {op for _, op in typed} == set(
            ["spatial_ffn", "temporal_ffn", "spatial_attn", "temporal_attn"][:m])
    # one step per gamma: with a decaying sensitivity a steeper weighting picks an earlier
    # step, each with its families
    prof.sensitivity = np.geomspace(20.0, 0.1, 12)
    w = step_weights(prof)[1]
    step = max(sorted(plan.reused), key=lambda s: stand_in_cost(plan, change, w) -
               stand_in_cost(plan, change, w, computed=frozenset([s])))
    early = max(sorted(plan.reused), key=lambda s: stand_in_cost(plan, change, w, 8.0) -
                stand_in_cost(plan, change, w, 8.0, frozenset([s])))
    both = refined_plans(plan, prof, lambda p: True, gammas=(1.0, 8.0))
    assert early < step and {s for q in both for s, _ in q.refresh} == {step, early}
    assert len(both) == 3 * len({step, early})


def test_counts_and_uniform_plans():
    # with cross attention always reused, 0.5 of 50 steps x 5 types needs (125 - 49) / 4 = 19
    assert reused_steps_for(0.5, 50, 1) == 19 and reused_steps_for(0.5, 50) == 25
    with pytest.raises(ValueError, match="--skip 0.99"):
        reused_steps_for(0.99, 50)
    plan = uniform_plan(50, 4, 25)
    assert len(plan.reused) == 25 and 49 not in plan.reused
    gaps = np.diff(sorted(set(range(50)) - plan.reused))
    assert gaps.max() - gaps[gaps > 1].min() <= 1 if (gaps > 1).any() else True


def test_the_profile_gives_constant_types_and_step_changes():
    prof = synthetic_profile()
    assert constant_op_types(prof) == ("cross_attn",)
    d = step_change(prof, ("cross_attn",))
    keep = [i for i, t in enumerate(OP_TYPES) if t != "cross_attn"]
    assert d[0] == 0.0
    assert d[5] == pytest.approx(float(np.mean(prof.out_change[:, 5][..., keep])))


# ---------------------------------------------------------------- the shipped model
@pytest.fixture(scope="module")
def profile_6(tmp_path_factory):
    """A 6-step profile of the shipped model, two calibration videos."""
    d = tmp_path_factory.mktemp("prof")
    assert main(["profile", "--prompts", "3,8", "--seeds", "77", "--steps", "6",
                 "--out", str(d)]) == 0
    return d / "profile.npz"


def test_coda_schedule_search_by_rollouts(profile_6, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["schedule", "search", "--profile", str(profile_6), "--skip", "0.3",
                 "--workers", "0", "--prune-videos", "1", "--finalists", "2", "--refine", "1",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    info = data["coda"]
    assert info["method"] == "steps" and info["calibration"]["videos"] == 2
    whole = [c for c in info["candidates"] if "round1" in c]
    finals = [c for c in whole if "round2" in c]
    assert 1 <= len(finals) <= 2
    # the finalists are the round-1 best; the best finalist on all videos is refined, its
    # refinements judged on all videos too (no round 1), keeping the skip
    r1 = sorted(c["round1"]["psnr_db"] for c in whole)
    assert min(c["round1"]["psnr_db"] for c in finals) >= r1[-len(finals)]
    top = max(finals, key=lambda c: c["round2"]["psnr_db"])
    refined = [c for c in info["candidates"] if "round1" not in c]
    for c in refined:
        assert c["label"].startswith(top["label"] + " + refresh step ")
        assert c["plan"].startswith(top["plan"] + "refresh[") and c["skip"] >= 0.3
        assert "round2" in c and "pareto" not in c
    # the winner is the best of the finalists and the refinements on all videos
    best = max(finals + refined, key=lambda c: c["round2"]["psnr_db"])
    assert info["plan"] == best["plan"]
    assert "chosen:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--skip", "1.0"], "--skip 1.0: expected a fraction in (0, 1)"),
    (["--skip", "0"], "--skip 0.0: expected a fraction in (0, 1)"),
    (["--skip", "nan"], "--skip nan: expected a fraction in (0, 1)"),
    (["--profile", "missing.npz"], "missing.npz: no such file"),
    (["--workers", "-1"], "--workers -1: expected >= 0"),
    (["--finalists", "0"], "--finalists 0: expected >= 1"),
    (["--refine", "-1"], "--refine -1: expected >= 0"),
    (["--cooldown", "0"], "--cooldown 0: expected >= 1"),
    (["--skip", "0.99"], "--skip 0.99: whole-step plans of 6 steps"),
    # the cooldown bounds the reachable skip before any work: 2 of 6 steps reused, with the
    # cross attention at every other step 13 / 30 at most
    (["--skip", "0.7", "--cooldown", "3"], "--skip 0.7: whole-step plans of 6 steps (the last 3 "
                                           "computed) reach 0.000..0.333, or 0.167..0.433"),
])
def test_coda_schedule_search_by_rollouts_refuses_bad_input(profile_6, tmp_path, capsys,
                                                            argv, message):
    base = {"--profile": str(profile_6), "--skip": "0.3", "--out": str(tmp_path / "s.json")}
    base.update(dict(zip(argv[::2], argv[1::2])))
    assert main(["schedule", "search", *[x for kv in base.items() for x in kv]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "s.json").exists()


def test_a_profile_of_another_model_is_refused_before_any_rollout(tmp_path, capsys):
    synthetic_profile().save(tmp_path)
    assert main(["schedule", "search", "--profile", str(tmp_path / "profile.npz"), "--skip",
                 "0.3", "--out", str(tmp_path / "s.json")]) == 2
    assert "made for model 'synthetic'" in capsys.readouterr().err


@pytest.mark.parametrize("latency", [None, "uniform"])
@pytest.mark.parametrize("skip", [0.3, 0.5, 0.6, 0.7])
def test_the_shipped_schedules_are_whole_step_plans_of_the_shipped_model(skip, latency):
    """Each shipped schedule was searched for the shipped model and profile: whole steps
    reused in both branches (plus, at every step from 1 on, the profile's constant types if
    the plan says so), as many reused steps as the target needs."""
    from coda.host.model.dit import load_model
    from coda.host.cache.profile import Profile, model_hash
    from coda.host.cache.shipped import SHIPPED_PROFILE, load_schedule, shipped_schedule

    model, _ = load_model()
    path = shipped_schedule(skip, latency)
    sched = load_schedule(path, model_id=model_hash(model), num_steps=50, num_layers=4)
    info = json.loads(path.read_text())["coda"]
    assert info.get("latency_budget") == latency
    prof = Profile.load(SHIPPED_PROFILE)
    always = tuple(info["always"])
    assert set(always) <= set(constant_op_types(prof))
    const = {(layer, op) for layer in range(4) for op in always}
    whole = [s for s in range(50) if sched.reused(s, "cond") - const]
    refresh = {(s, (layer, op)) for s, layer, op in info.get("refresh", [])}
    plan = StepPlan(50, 4, frozenset(whole), always, refresh=refresh).schedule()
    for s in range(50):
        assert sched.reused(s, "cond") == sched.reused(s, "uncond") == plan.reused(s, "cond")
    assert len({s for s, _ in refresh}) <= 1      # refined inside one reused step at most
    budget = info.get("latency_budget")
    if budget is None:      # chosen on quality alone: the count that reaches the skip
        assert len(whole) == reused_steps_for(skip, 50, len(always))
    else:                   # the fewest reused steps modelled within the budget
        from coda.experiments.search import (counts_within_latency, uniform_latency,
                                                  within_budget)
        from coda.host.system.cost import schedule_cost
        seconds = uniform_latency(prof, skip, info["target"]) if budget == "uniform" else budget
        assert seconds == pytest.approx(info["max_latency_s"], rel=1e-12)
        assert len(whole) == counts_within_latency(prof, skip, seconds,
                                                   target=info["target"])[always]
        assert within_budget(schedule_cost(sched, info["target"], "f")["latency_s"], seconds)
        assert len(whole) >= reused_steps_for(skip, 50, len(always))
    assert info["target_skip"] == skip and info["calibration"]["videos"] >= 20
    assert info["model_hash"] == model_hash(model)
    if latency is None:     # step DRA's table, chosen on the profile's videos (coda+dra)
        from coda.experiments.dra_calibration import load_step_dra
        from coda.host.cache.policies.dra import (DEFAULT_BUDGET, DEFAULT_MAX_EXTRA,
                                                  DEFAULT_PROBES)
        _, table = load_step_dra(path, model_id=model_hash(model), num_steps=50)
        assert table.probe in DEFAULT_PROBES and table.budget == DEFAULT_BUDGET
        assert table.max_fallbacks == int(DEFAULT_MAX_EXTRA * 50 + 1e-9)
        assert (list(table.prompts), list(table.seeds)) == (prof.meta["prompts"],
                                                            prof.meta["seeds"])


def test_a_latency_budget_keeps_only_candidates_modelled_that_fast(profile_6, tmp_path,
                                                                   capsys):
    """--latency: the winner is modelled at most that slow on the target; a budget below every
    candidate is refused, naming the fastest."""
    out = tmp_path / "s.json"
    args = ["schedule", "search", "--profile", str(profile_6), "--skip", "0.3", "--workers",
            "0", "--prune-videos", "1", "--finalists", "1", "--out", str(out)]
    assert main(args) == 0
    cands = [c for c in json.loads(out.read_text())["coda"]["candidates"] if "round1" in c]
    lat = sorted({c["modelled"]["latency_s"] for c in cands})
    front = [c for c in cands if c["pareto"]]
    assert front and all(not (o["round1"]["psnr_db"] > c["round1"]["psnr_db"]
                              and o["modelled"]["latency_s"] < c["modelled"]["latency_s"])
                         for c in front for o in cands)
    assert main(args + ["--latency", str(lat[0])]) == 0
    info = json.loads(out.read_text())["coda"]
    chosen = next(c for c in info["candidates"] if c["plan"] == info["plan"])
    from coda.experiments.search import within_budget
    assert within_budget(chosen["modelled"]["latency_s"], lat[0])   # up to LATENCY_RTOL
    # a budget reuses more steps when it must; below the fastest plan (every step but the
    # first and the last reused, the constant types at every step) it is refused, naming it
    from coda.host.cache.profile import Profile
    from coda.host.system.cost import schedule_cost
    prof = Profile.load(profile_6)
    fastest = schedule_cost(StepPlan(6, prof.num_layers, frozenset(range(1, 5)),
                                     constant_op_types(prof)).schedule(),
                            "wan2.1-14b@720p", "f")["latency_s"]
    assert fastest < lat[0] / 2
    assert main(args + ["--latency", str(lat[0] / 2)]) == 0
    capsys.readouterr()
    assert main(args + ["--latency", str(fastest / 2)]) == 2
    err = capsys.readouterr().err
    assert "no candidate for skip 0.3 is modelled that fast" in err
    assert f"(the fastest reaching it: {fastest:.1f} s)" in err


def test_a_uniform_latency_budget(profile_6, tmp_path, capsys):
    """--latency uniform: the budget is the uniform baseline's modelled latency at the skip;
    the winner is modelled within it, and each choice of ``always`` reuses the fewest whole
    steps that fit it (without ``always``: uniform's own count, which fits by definition)."""
    from coda.host.cache.profile import Profile
    from coda.experiments.search import (LATENCY_RTOL, counts_within_latency, uniform_latency,
                                       within_budget)
    from coda.host.system.cost import schedule_cost

    prof = Profile.load(profile_6)
    budget = uniform_latency(prof, 0.3)
    counts = counts_within_latency(prof, 0.3, budget)
    assert counts[()] == reused_steps_for(0.3, 6, 0)
    for always, n in counts.items():
        assert n >= reused_steps_for(0.3, 6, len(always))
        if n > reused_steps_for(0.3, 6, len(always)):     # one fewer would not fit
            fewer = uniform_plan(6, prof.num_layers, n - 1, always=always)
            assert not within_budget(schedule_cost(fewer.schedule(), "wan2.1-14b@720p",
                                                   "f")["latency_s"], budget)
    assert within_budget(budget * (1 + LATENCY_RTOL), budget)
    assert not within_budget(budget * (1 + 2 * LATENCY_RTOL), budget)
    out = tmp_path / "s.json"
    assert main(["schedule", "search", "--profile", str(profile_6), "--skip", "0.3",
                 "--workers", "0", "--prune-videos", "1", "--finalists", "1",
                 "--latency", "uniform", "--out", str(out)]) == 0
    info = json.loads(out.read_text())["coda"]
    assert info["latency_budget"] == "uniform" and info["max_latency_s"] == budget
    assert all(within_budget(c["modelled"]["latency_s"], budget) for c in info["candidates"])
    chosen = next(c for c in info["candidates"] if c["plan"] == info["plan"])
    assert chosen["skip"] >= 0.3 - 1 / 6


@pytest.mark.parametrize("value", ["fast", "0", "-3", "nan", "inf"])
def test_a_bad_latency_budget_is_refused(profile_6, tmp_path, capsys, value):
    assert main(["schedule", "search", "--profile", str(profile_6), "--skip", "0.3",
                 "--latency", value, "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert f"--latency {value}: expected a finite time > 0 (seconds) or 'uniform'" in err, err
    assert not (tmp_path / "s.json").exists()


def test_kept_full_compute_videos_are_keyed_by_the_cpus_vector_isa(tmp_path, monkeypatch):
    """full_videos(cache_dir=...): read back on the same machine, generated anew (another
    file) where torch's kernels use another vector ISA, whatever the CPU is named."""
    import torch

    from coda.experiments.rollouts import full_videos
    from coda.host.model.dit import load_model

    model, _ = load_model()
    kw = dict(num_steps=2, guidance_scale=5.0, cache_dir=tmp_path)
    first = full_videos(model, [3], [77], **kw)
    (kept,) = tmp_path.iterdir()
    torch.save(torch.zeros_like(first), kept)          # what is read back is the file
    assert torch.equal(full_videos(model, [3], [77], **kw), torch.zeros_like(first))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "ANOTHER_ISA")
    assert torch.equal(full_videos(model, [3], [77], **kw), first)
    assert len(list(tmp_path.iterdir())) == 2


# ---------------------------------------------------------------- the proxy, uniform, files
def test_step_weights_fit_the_measured_decay():
    prof = synthetic_profile(steps=20)
    assert step_weights(prof)[0] == 0.0                       # no measurement: flat
    frac = 1 - (np.arange(20) + 0.5) / 20
    prof.sensitivity = 3.0 * frac ** 2
    p, w = step_weights(prof)
    assert p == pytest.approx(2.0) and w.mean() == pytest.approx(1.0)
    assert np.all(np.diff(w) < 0)


def test_uniform_for_skip_hits_the_target():
    for skip in (0.3, 0.5, 0.6):
        got = uniform_for_skip(skip, 50, 4).build(50, 4).ops_skipped_fraction()
        assert abs(got - skip) <= 0.02


def test_load_schedule_refuses_unreadable_files(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(ValueError, match="a.json: not JSON: Expecting property name .* at "
                                         "line 1, column 2; expected a schedule JSON"):
        load_schedule(tmp_path / "a.json")
    with pytest.raises(ValueError, match="cannot read it"):
        load_schedule(tmp_path / "missing.json")
    (tmp_path / "b.json").write_text(json.dumps({"num_steps": 4, "num_layers": 1, "reuse": [
        {"step": 0, "branch": "cond", "reuse": [[0, "cross_attn"]]}]}))
    with pytest.raises(ValueError, match="never computed"):
        load_schedule(tmp_path / "b.json")
