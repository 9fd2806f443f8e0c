"""Annealed static schedules: constraints, cost terms derived from their definitions, the
NME cycle model against the driver, determinism, and the command's refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from coda.cli import main
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.experiments.profile import Profile
from coda.host.cache.schedule import BRANCHES, OP_TYPES, Schedule
from coda.experiments.search import (CostModel, LinkModel, NMEModel, anneal, flop_compute_time,
                                     matrix_to_schedule, op_flops, quality_weights,
                                     schedule_to_matrix, segment_nme_cycles, uniform_for_skip)
from coda.host.cache.shipped import load_schedule
from coda.hw.nme.isa import NMEConfig

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


def test_anneal_meets_the_constraints_and_beats_the_reference():
    prof = synthetic_profile()
    res = anneal(prof, 0.5, seed=1, moves=20_000)
    s = res.schedule
    total = 12 * 2 * 10
    assert round(s.ops_skipped_fraction() * total) == round(0.5 * total)
    assert not s.reused(0, "cond") and not s.reused(0, "uncond")     # nothing before computed
    assert not s.reused(11, "cond") and not s.reused(11, "uncond")   # cooldown: last step
    assert Schedule.from_json(s.to_json()) == s                       # validates
    # normalised cost: the reference (closest uniform) scores 1 + 0.1 + 0.1
    assert res.cost < 1.2
    assert res.terms["quality"] < res.reference["quality"]
    # cross attention never changes: the cheapest operator to reuse, reused wherever allowed
    m = schedule_to_matrix(s)
    cross = [k for k in range(10) if k % 5 == OP_TYPES.index("cross_attn")]
    assert m[1:, :, cross].mean() > m[1:].mean()


def test_anneal_cooldown_and_its_limits():
    prof = synthetic_profile()
    m = schedule_to_matrix(anneal(prof, 0.3, cooldown=3, moves=3000).schedule)
    assert not m[-3:].any() and not m[0].any() and m.sum() == round(0.3 * m.size)
    with pytest.raises(ValueError, match="--skip 0.95"):
        anneal(prof, 0.95, cooldown=2)          # more than steps 1..9 can hold
    with pytest.raises(ValueError, match="--cooldown 11: expected 0..10"):
        anneal(prof, 0.3, cooldown=11)


def test_the_skip_bound_counts_step_0_and_the_cooldown():
    from coda.experiments.search import check_skip, reusable_executions
    prof = synthetic_profile(steps=6, layers=4)          # 240 executions, 40 per step
    assert reusable_executions(6, 4, cooldown=1) == 160     # steps 1..4
    assert reusable_executions(6, 4, cooldown=0) == 200
    with pytest.raises(ValueError, match=r"--skip 0.8: 192 reused of 240 executions, expected "
                                         r"1..160 reused, a --skip of 0.00417..0.6667 \(step 0 "
                                         r"and the last 1 step \(--cooldown 1\)"):
        anneal(prof, 0.8)
    assert check_skip(0.8, 6, 4, cooldown=0) == 192
    with pytest.raises(ValueError, match="0 reused of 240 executions, expected 1..160"):
        check_skip(0.001, 6, 4)                  # rounds to no reuse at all
    with pytest.raises(ValueError, match="--skip nan: expected a fraction"):
        check_skip(float("nan"), 6, 4)


@pytest.mark.parametrize("steps, skip, cooldown", [(12, 10 / 12, 1), (4, 0.5, 1), (6, 5 / 6, 0)])
def test_anneal_at_the_largest_skip(steps, skip, cooldown):
    """At the bound every reusable execution is reused: nothing is left to swap, the
    schedule is determined (no annealing moves), it is not an error."""
    prof = synthetic_profile(steps=steps)
    res = anneal(prof, skip, moves=500, cooldown=cooldown)
    m = schedule_to_matrix(res.schedule)
    assert not m[0].any() and m[1:steps - cooldown].all()
    assert not m[steps - cooldown:].any() and res.moves == 0


def test_anneal_is_deterministic_per_seed():
    prof = synthetic_profile()
    a = anneal(prof, 0.3, seed=4, moves=5_000).schedule
    b = anneal(prof, 0.3, seed=4, moves=5_000).schedule
    assert a.to_json() == b.to_json()


def test_cost_terms_follow_their_definitions():
    prof = synthetic_profile()
    change = prof.mean("out_change").reshape(12, 2, 10)
    g = 3.0
    cm = CostModel(change, quality_weights(prof), prof.meta["shape"], g)
    uniform = uniform_for_skip(0.4, 12, 2).build(12, 2)
    m = schedule_to_matrix(uniform)
    assert matrix_to_schedule(m, 2, "x").reuse == uniform.reuse
    assert m[5].all()
    m[5, BRANCHES.index("uncond")] = False          # a step where only cond reuses
    sched = matrix_to_schedule(m, 2, "x")
    t = cm.evaluate(m)
    assert t["segments"] == sched.segment_count(frames=8)
    stores = sum(sched.store_after_compute(s, b, ref) and ref not in sched.reused(s, b)
                 for s in range(12) for b in BRANCHES for ref in
                 [(l, o) for l in range(2) for o in OP_TYPES])
    assert t["stores"] == stores
    # quality: per step and operator, the CFG combination g * cond + (1 - g) * uncond of each
    # branch's change accumulated since its last compute, weighted (|out|/|in| = 0.5)
    d = np.nan_to_num(change.astype(np.float64))
    coef = {"cond": g, "uncond": 1 - g}
    q = 0.0
    for k in range(10):
        err = np.zeros(12)
        for b, name in enumerate(BRANCHES):
            last = 0
            for s in range(12):
                if m[s, b, k]:
                    err[s] += coef[name] * 0.5 * d[last + 1:s + 1, b, k].sum()
                else:
                    last = s
        q += np.abs(err).sum()
    assert t["quality"] == pytest.approx(q)
    # a slower xPU (a longer compute window) hides more of each segment
    slow = CostModel(change, quality_weights(prof), prof.meta["shape"], g,
                     compute_time=lambda op, shape: 10 * flop_compute_time(op, shape))
    assert slow.evaluate(m)["mismatch_s"] <= t["mismatch_s"]


def test_segment_cycles_equal_the_drivers():
    nme = NMEModel(lanes=8, ranks=2)
    drv = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 16), ranks=2)
    torch.manual_seed(0)
    x = torch.randn(64, 32).bfloat16()
    for k in (1, 3):
        keys = [f"c{i}" for i in range(k)]
        for key in keys:
            drv.store(key, torch.randn(64, 32).bfloat16())
        before = drv.stats["nme_cycles"]
        drv.segment(x, [torch.randn(32).bfloat16() for _ in keys], keys)
        assert drv.stats["nme_cycles"] - before == segment_nme_cycles(nme, 64, 32, k)


def test_op_flops_scale():
    # FFN = 2 matmuls of C x 4C per token: 16 T C^2
    assert op_flops("spatial_ffn", SHAPE) == 16 * 512 * 96 * 96
    assert op_flops("temporal_attn", SHAPE) < op_flops("spatial_attn", SHAPE)
    with pytest.raises(ValueError, match="op 'x'"):
        op_flops("x", SHAPE)


def test_uniform_for_skip_hits_the_target():
    for skip in (0.3, 0.5, 0.6):
        got = uniform_for_skip(skip, 50, 4).build(50, 4).ops_skipped_fraction()
        assert abs(got - skip) <= 0.02


def test_coda_schedule_search_command(tmp_path, capsys):
    prof = synthetic_profile()
    prof.save(tmp_path)
    out = tmp_path / "s.json"
    assert main(["schedule", "search", "--method", "anneal",
                 "--profile", str(tmp_path / "profile.npz"), "--skip",
                 "0.4", "--out", str(out), "--moves", "3000"]) == 0
    printed = capsys.readouterr().out
    assert "quality proxy" in printed and "mismatch" in printed
    data = json.loads(out.read_text())
    assert data["coda"]["target_skip"] == 0.4 and "terms" in data["coda"]
    sched = load_schedule(out, num_steps=12, num_layers=2)
    assert abs(sched.ops_skipped_fraction() - 0.4) < 1e-9 + 1 / 240
    with pytest.raises(ValueError, match="made for 12 steps, expected 50"):
        load_schedule(out, num_steps=50)
    with pytest.raises(ValueError, match="made for model 'synthetic'"):
        load_schedule(out, model_id="0123")


@pytest.mark.parametrize("argv, message", [
    (["--skip", "1.0"], "--skip 1.0: expected a fraction in (0, 1)"),
    (["--skip", "0"], "--skip 0.0: expected a fraction in (0, 1)"),
    (["--skip", "nan"], "--skip nan: expected a fraction in (0, 1)"),
    (["--profile", "missing.npz"], "missing.npz: no such file"),
    (["--profile", "bad.npz"], "not a profile written by coda profile"),
    (["--profile", "half.npz"], "--profile half.npz: not a profile written by coda profile"),
    (["--profile", "nan/profile.npz"], "--profile nan/profile.npz: 1 values of out_change are "
                                       "not finite"),
    # checked before the profile is read
    (["--seed", "-1", "--profile", "missing.npz"], "--seed -1: expected an integer 0..2147483647"),
    (["--seed", "2147483648"], "--seed 2147483648: expected an integer 0..2147483647"),
    (["--w-transfer", "nan", "--profile", "missing.npz"], "--w-transfer nan: expected a finite "
                                                          "weight >= 0"),
    (["--w-mismatch", "inf"], "--w-mismatch inf: expected a finite weight >= 0"),
    (["--w-transfer", "-1"], "--w-transfer -1.0: expected a finite weight >= 0"),
    (["--cooldown", "-1", "--profile", "missing.npz"], "--cooldown -1: expected >= 0"),
    (["--cooldown", "11"], "--cooldown 11: expected 0..10 steps for a profile of 12 steps"),
    (["--skip", "0.9"], "--skip 0.9: 216 reused of 240 executions, expected 1..200 reused, a "
                        "--skip of 0.00417..0.8333"),
    (["--skip", "0.8", "--cooldown", "3"], "expected 1..160 reused, a --skip of 0.00417..0.6667 "
                                           "(step 0 and the last 3 steps (--cooldown 3)"),
])
def test_coda_schedule_search_refuses_bad_input(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    prof = synthetic_profile()
    data = prof.save(tmp_path).read_bytes()
    (tmp_path / "half.npz").write_bytes(data[:len(data) // 2])
    prof.out_change[1, 4, 0, 1, 2] = np.nan          # e.g. a profile made with --guidance nan
    prof.save(tmp_path / "nan")
    (tmp_path / "bad.npz").write_text("garbage")
    base = {"--profile": "profile.npz", "--skip": "0.5", "--out": "s.json"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    args = [x for kv in base.items() for x in kv]
    assert main(["schedule", "search", "--method", "anneal", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err, err
    assert err.count("\n") == 1                   # one line: no warnings, no traceback
    assert not (tmp_path / "s.json").exists()


def test_coda_schedule_search_at_the_largest_skip(tmp_path):
    """--skip at the bound (step 0 and the cooldown computed, everything else reused)."""
    synthetic_profile().save(tmp_path)
    out = tmp_path / "s.json"
    assert main(["schedule", "search", "--method", "anneal",
                 "--profile", str(tmp_path / "profile.npz"), "--skip",
                 str(10 / 12), "--out", str(out), "--moves", "100"]) == 0
    sched = load_schedule(out, num_steps=12, num_layers=2)
    assert sched.ops_skipped_fraction() == pytest.approx(10 / 12)


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


def test_step_weights_fit_the_measured_decay():
    from coda.experiments.search import step_weights
    prof = synthetic_profile(steps=20)
    assert step_weights(prof)[0] == 0.0                       # no measurement: flat
    frac = 1 - (np.arange(20) + 0.5) / 20
    prof.sensitivity = 3.0 * frac ** 2
    p, w = step_weights(prof)
    assert p == pytest.approx(2.0) and w.mean() == pytest.approx(1.0)
    assert np.all(np.diff(w) < 0)
    res = anneal(prof, 0.4, moves=5000)
    m = schedule_to_matrix(res.schedule)
    assert m[:5].mean() < m[-5:].mean()          # early reuse costs more


def test_transfer_term_counts_the_segment_form():
    """The transfer term's bytes are coda.host.nmp.link.segment_bytes: a "residual" segment
    sends x ([T, C] bf16 tiled over the ranks) down, a "sum" segment (the default, as the
    cache engine) does not; everything else is the same."""
    from coda.host.nmp.link import segment_bytes, tensor_bytes

    prof = synthetic_profile()
    change = prof.mean("out_change").reshape(12, 2, 10)
    shape = prof.meta["shape"]
    cm = {f: CostModel(change, quality_weights(prof), shape, 3.0, segment_output=f)
          for f in ("sum", "residual")}
    tokens = shape["frames"] * shape["tokens_per_frame"]
    x = tensor_bytes(tokens, shape["hidden"], cm["sum"].nme.ranks, cm["sum"].nme.lanes)
    assert x == tokens * shape["hidden"] * 2 == cm["sum"].tensor_bytes
    for k in range(1, 11):
        sb = segment_bytes(tokens, shape["hidden"], k, cm["sum"].nme.ranks, cm["sum"].nme.lanes)
        assert cm["sum"].seg_bytes[k] == sb["down"] + sb["up"]
        assert cm["residual"].seg_bytes[k] - cm["sum"].seg_bytes[k] == x
    m = schedule_to_matrix(uniform_for_skip(0.4, 12, 2).build(12, 2))
    t = {f: c.evaluate(m) for f, c in cm.items()}
    assert t["residual"]["pcie_bytes"] - t["sum"]["pcie_bytes"] == t["sum"]["segments"] * x
    with pytest.raises(ValueError, match="segment_output='y'"):
        CostModel(change, quality_weights(prof), shape, 3.0, segment_output="y")
