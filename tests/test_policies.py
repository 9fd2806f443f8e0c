"""The baseline policies (PAB, TeaCache, MagCache), DRA and the registry, on a small random
Latte with the real NMP driver."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from coda.host.backend import TorchBackend
from coda.host.driver import NMPDriver
from coda.host.events import EventLog
from coda.host.model.dit import DEFAULT_CONFIG, build_model
from coda.host.model.sample import cached_generate
from coda.host.policies import POLICIES, SchedulePolicy, get_policy
from coda.host.policies.dra import DRAPolicy, input_change_limits
from coda.host.policies.magcache import MagCachePolicy, magnitude_ratios
from coda.host.policies.pab import PABPolicy
from coda.host.policies.teacache import TeaCachePolicy, fit_rescale
from coda.host.profile import profile_model
from coda.host.schedule import OP_TYPES, operator_order
from coda.host.search import anneal, schedule_to_matrix
from coda.hw.isa import NMEConfig

TINY = dict(num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
            num_layers=2, sample_size=16, video_length=4, caption_channels=16)
STEPS = 8


def tiny_model():
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    cfg["transformer"].update(TINY)
    cfg["data"].update(frames=4, size=16)
    return build_model(cfg, seed=1).eval()


def driver(videos=1):
    return NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 16), ranks=2)


@pytest.fixture(scope="module")
def setup():
    from coda.host.profile import _InputNormDriver
    model = tiny_model()
    prof = profile_model(model, [2, 6], [40], lambda n: _InputNormDriver(
        TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 16), ranks=2),
        num_steps=STEPS, guidance_scale=3.0)
    return model, prof


def run(model, policy, labels, seeds):
    log = EventLog()
    video, stats = cached_generate(model, labels, driver(), policy, events=log,
                                   num_steps=STEPS, guidance_scale=3.0, seeds=seeds)
    return video, stats, log


# ---------------------------------------------------------------- registry
@pytest.fixture(scope="module")
def short_profiles():
    """Profiles of the tiny model over 1, 2 and 3 steps."""
    from coda.host.profile import _InputNormDriver
    model = tiny_model()
    return {n: profile_model(model, [2], [40], lambda v: _InputNormDriver(
        TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 16), ranks=2),
        num_steps=n, guidance_scale=3.0) for n in (1, 2, 3)}


@pytest.mark.parametrize("name", ["uniform", "pab", "teacache", "magcache"])
def test_every_calibrated_policy_refuses_a_run_too_short_to_cache(name, short_profiles):
    """In 1 or 2 steps every policy calibrated to a skip says nothing would be cached (a
    ValueError, no TypeError or reshape error from inside); at 3 (MIN_CACHED_STEPS) it
    reuses a fraction > 0, as the calibration it returns says."""
    for steps in (1, 2):
        kw = dict(profile=short_profiles[steps], num_steps=steps, num_layers=2)
        with pytest.raises(ValueError, match=f"{steps}.*nothing would be cached"):
            get_policy(name, skip=0.3, **kw)
        if name in ("teacache", "magcache"):      # an explicit threshold too
            with pytest.raises(ValueError, match="nothing would be cached"):
                get_policy(name, threshold=0.1, **kw)
        # the calibrations called directly (from Python) say the same
        cls = {"teacache": TeaCachePolicy, "magcache": MagCachePolicy}.get(name)
        if cls is not None:
            with pytest.raises(ValueError, match=f"{steps} with --policy {name}: nothing"):
                cls.calibrate(short_profiles[steps], 0.3)
    with pytest.raises(ValueError, match="expected a profile of >= 2 steps"):
        fit_rescale(short_profiles[1])       # no step >= 1 to fit on: not a reshape error
    from coda.host.policies import MIN_CACHED_STEPS, expected_skip
    assert MIN_CACHED_STEPS == 3
    kw = dict(profile=short_profiles[3], num_steps=3, num_layers=2)
    assert expected_skip(get_policy(name, skip=0.3, **kw), **kw) > 0.0


def test_registry_builds_every_policy_and_refuses_bad_input(setup):
    model, prof = setup
    sched = anneal(prof, 0.4, moves=2000).schedule
    for name in POLICIES:
        pol = get_policy(name, skip=0.4, profile=prof, num_steps=STEPS, num_layers=2,
                         schedule=sched)
        assert pol.name.startswith(name.split("+")[0] if name != "coda" else "coda(")
    assert get_policy("coda+dra", profile=prof, schedule=sched).name.endswith("+dra")
    with pytest.raises(ValueError, match="needs a schedule"):
        get_policy("coda", schedule="file.json")
    with pytest.raises(ValueError, match="unknown policy 'fora'"):
        get_policy("fora")
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=f"skip {bad}: expected a fraction in"):
            get_policy("pab", skip=bad, num_steps=STEPS, num_layers=2)
    with pytest.raises(ValueError, match="needs a profile"):
        get_policy("teacache", skip=0.4)
    with pytest.raises(ValueError, match="unknown parameters"):
        get_policy("uniform", interval=2, colour="red")


# ---------------------------------------------------------------- PAB
def test_pab_pyramid_reaches_the_target_inside_its_windows():
    for skip in (0.3, 0.5, 0.6):
        pol = PABPolicy.for_skip(skip, 50, 4)
        sched = pol.build(50, 4)
        assert abs(sched.ops_skipped_fraction() - skip) <= 0.02
        r = pol.ranges
        assert r["cross_attn"] >= r["temporal_attn"] >= r["spatial_attn"] >= r["spatial_ffn"]
        for step in range(50):
            for layer, op in sched.reused(step, "cond"):
                lo, hi = pol.windows[op]
                assert int(lo * 50) <= step < int(np.ceil(hi * 50)) and step > 0
    assert PABPolicy.for_skip(0.3, 50, 4).ranges["spatial_attn"] == 2   # PAB's own 2:4:6


# ---------------------------------------------------------------- MagCache
def test_magcache_respects_its_limits(setup):
    _, prof = setup
    ratios = magnitude_ratios(prof)
    assert ratios.shape == (STEPS, 2, 10) and np.all(ratios[0] == 1)
    pol = MagCachePolicy(ratios, threshold=1e9, max_skips=2, retention=0.25)
    m = schedule_to_matrix(pol.build(STEPS, 2))
    assert not m[:2].any() and not m[-1].any()           # retention, last step computed
    runs = np.zeros(m.shape[1:], int)
    for s in range(STEPS):
        runs = np.where(m[s], runs + 1, 0)
        assert runs.max() <= 2
    low = MagCachePolicy(ratios, threshold=0.0).build(STEPS, 2).ops_skipped_fraction()
    assert low == 0.0
    cal = MagCachePolicy.calibrate(prof, 0.3)
    assert abs(cal.build(STEPS, 2).ops_skipped_fraction() - 0.3) < 0.1


# ---------------------------------------------------------------- TeaCache
def test_teacache_reuses_whole_steps_per_sample_from_nme_monitors(setup):
    model, prof = setup
    coeffs = fit_rescale(prof)
    assert len(coeffs) == 5
    pol = TeaCachePolicy.calibrate(prof, 0.4)
    assert abs(pol.simulate_skip(prof) - 0.4) < 0.15
    both, stats, log = run(model, pol, [2, 6], [40, 41])
    assert stats["ops_reused"] > 0 and stats["monitors"] == 2 * 2 * (STEPS - 1)
    first = operator_order(2)[0]
    for e in log.of("op"):
        if e.ref == first:
            assert not e.reused                              # the signal operator
    # a step is reused whole (all but the first operator) or not at all, per sample
    per = {}
    for e in log.of("op"):
        per.setdefault((e.step, e.branch, e.sample), set()).add(e.reused)
    assert all(len(v) == 1 or e_ref_only(log, k) for k, v in per.items())
    # per sample: the batch does not change a sample's decisions or bits
    for i, (label, seed) in enumerate([(2, 40), (6, 41)]):
        one, _, _ = run(model, pol, [label], [seed])
        assert torch.equal(one, both[i:i + 1])


def e_ref_only(log, key):
    step, branch, sample = key
    ev = [e for e in log.of("op") if (e.step, e.branch, e.sample) == key]
    return [e.reused for e in ev[1:]] == [ev[1].reused] * (len(ev) - 1)


# ---------------------------------------------------------------- DRA
def test_dra_with_a_lenient_threshold_changes_nothing_but_costs_monitors(setup):
    model, prof = setup
    static = SchedulePolicy(anneal(prof, 0.4, seed=0, moves=3000).schedule)
    ref, ref_stats, _ = run(model, static, [2, 6], [40, 41])
    dra = DRAPolicy(static, input_change_limits(prof), margin=1e6)
    got, stats, log = run(model, dra, [2, 6], [40, 41])
    assert torch.equal(got, ref)
    assert stats["fallbacks"] == 0 and stats["ops_reused"] == ref_stats["ops_reused"]
    mons = log.of("monitor")
    assert len(mons) == stats["monitors"] > 0
    heads = {(s.step, s.branch, s.sample, s.ops[0]) for s in log.of("segment")}
    assert {(m.step, m.branch, m.sample, (m.layer, m.op)) for m in mons} == heads
    assert all(m.nme_cycles > 0 and m.bytes_to_nmp > 0 for m in mons)
    assert stats["pcie_bytes"] > ref_stats["pcie_bytes"]          # kept inputs + monitors


def test_dra_falls_back_for_a_window_and_per_sample(setup):
    model, prof = setup
    static = SchedulePolicy(anneal(prof, 0.5, seed=0, moves=3000).schedule)
    dra = DRAPolicy(static, input_change_limits(prof), margin=1e-6, window=2)
    both, stats, log = run(model, dra, [2, 6], [40, 41])
    assert stats["fallbacks"] > 0
    assert stats["ops_reused"] < round(0.5 * STEPS * 2 * 10) * 2
    fallbacks = [e for e in log.of("op") if e.reason == "fallback"]
    fired = {(m.step, m.branch, m.sample, m.layer, m.op) for m in log.of("monitor")}
    for e in fallbacks:   # each fallback was fired by its monitor this step or the one before
        assert any((e.step - d, e.branch, e.sample, e.layer, e.op) in fired for d in (0, 1))
        assert e.stored_bytes > 0 and e.kept_bytes > 0
    for i, (label, seed) in enumerate([(2, 40), (6, 41)]):
        one, _, _ = run(model, dra, [label], [seed])
        assert torch.equal(one, both[i:i + 1])


def test_dra_limits_follow_the_profile(setup):
    _, prof = setup
    lim = input_change_limits(prof)
    x = np.nan_to_num(prof.in_change.astype(np.float64))
    k = operator_order(2).index((1, "temporal_ffn"))
    expect = x[:, 1:4, 0, 1, OP_TYPES.index("temporal_ffn")].max(axis=0).sum()
    assert lim[3, 0, k] - lim[0, 0, k] == pytest.approx(expect)
    with pytest.raises(ValueError, match="margin=0"):
        DRAPolicy(SchedulePolicy(anneal(prof, 0.3, moves=100).schedule), lim, margin=0)
