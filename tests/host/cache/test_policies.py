"""The baseline policies (PAB, TeaCache, MagCache, FBCache, LeMiCa), step-level DRA and the
registry, on a small random Latte (test_cache_engine's configuration) with the real NMP
driver."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch

from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.host.cache.events import EventLog
from coda.host.model.dit import DEFAULT_CONFIG, build_model
from coda.host.model.sample import cached_generate, generate
from coda.host.cache.policies import POLICIES, SchedulePolicy, get_policy
from coda.experiments.dra_calibration import (calibrate_step_dra, load_step_dra, probe_values,
                                       save_step_dra)
from coda.host.cache.policies.dra import StepDRAPolicy, StepThresholds
from coda.host.cache.policies.fbcache import FBCachePolicy
from coda.host.cache.policies.lemica import lemica_schedule, min_error_path, span_costs
from coda.host.cache.policies.magcache import MagCachePolicy, magnitude_ratios
from coda.host.cache.policies.pab import PABPolicy
from coda.host.cache.policies.teacache import TeaCachePolicy, fit_rescale
from coda.host.cache.profile import model_hash
from coda.experiments.profile import profile_model
from coda.host.cache.schedule import BRANCHES, OP_TYPES, Schedule, operator_order
from coda.hw.nme.isa import NMEConfig
from mixed_schedule import mixed_schedule

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
    from coda.host.cache.profile import InputNormDriver
    model = tiny_model()
    prof = profile_model(model, [2, 6], [40], lambda n: InputNormDriver(
        TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 16), ranks=2),
        num_steps=STEPS, guidance_scale=3.0)
    return model, prof


def run(model, policy, labels, seeds):
    log = EventLog()
    video, stats = cached_generate(model, labels, driver(), policy, events=log,
                                   num_steps=STEPS, guidance_scale=3.0, seeds=seeds)
    return video, stats, log


def whole_steps(steps, layers=2):
    """A schedule reusing every operator of ``steps``, both branches."""
    every = frozenset(operator_order(layers))
    return Schedule(STEPS, layers, {(s, b): every for s in steps for b in BRANCHES},
                    name=f"steps{sorted(steps)}")


def table_for(model, sched, thresholds):
    return StepThresholds(thresholds, STEPS, model_hash(model), sched.digest(), 1.0,
                          1.0)


# ---------------------------------------------------------------- registry
@pytest.fixture(scope="module")
def short_profiles():
    """Profiles of the tiny model over 1, 2 and 3 steps."""
    from coda.host.cache.profile import InputNormDriver
    model = tiny_model()
    return {n: profile_model(model, [2], [40], lambda v: InputNormDriver(
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
    from coda.host.cache.policies import MIN_CACHED_STEPS, expected_skip
    assert MIN_CACHED_STEPS == 3
    kw = dict(profile=short_profiles[3], num_steps=3, num_layers=2)
    assert expected_skip(get_policy(name, skip=0.3, **kw), **kw) > 0.0


def test_registry_facts_are_what_each_class_needs(setup):
    """Each registry fact is the class's behaviour: a policy that needs a profile (or a
    schedule) is refused without one, naming it; one that needs neither builds from the run's
    shape alone; an unknown parameter is refused, naming the class's own keyword parameters
    (read from its from_inputs signature)."""
    import inspect

    from coda.host.cache.policies import policy_names

    model, prof = setup
    shape = dict(skip=0.4, num_steps=STEPS, num_layers=2)
    for name, cls in POLICIES.items():
        if cls.needs_profile:
            with pytest.raises(ValueError, match=f"policy '{re.escape(name)}' needs a profile"):
                get_policy(name, **shape)
        elif cls.needs_schedule:
            with pytest.raises(ValueError, match=f"policy '{re.escape(name)}' needs a schedule"):
                get_policy(name, **shape)
        else:
            assert isinstance(get_policy(name, **shape), cls)
        own = sorted(p.name for p in inspect.signature(cls.from_inputs).parameters.values()
                     if p.kind is p.KEYWORD_ONLY)
        with pytest.raises(ValueError, match=re.escape(f"unknown parameters ['bogus']; "
                                                       f"expected {own or 'none'}")):
            get_policy(name, bogus=1, **shape)
    assert set(policy_names("needs_profile")) == {n for n, c in POLICIES.items()
                                                  if c.needs_profile}
    with pytest.raises(ValueError, match="fact 'cheap'"):
        policy_names("cheap")


def test_registry_builds_every_policy_and_refuses_bad_input(setup):
    model, prof = setup
    sched = mixed_schedule(STEPS, 2, 0.4)
    table = calibrate_step_dra(model, sched, [2], [40], num_steps=STEPS, guidance_scale=3.0,
                               driver_factory=driver)
    for name in POLICIES:
        extra = {"thresholds": table} if name == "coda+dra" else {}
        pol = get_policy(name, skip=0.4, profile=prof, num_steps=STEPS, num_layers=2,
                         schedule=sched, **extra)
        # coda, coda-lat and coda+dra run the schedule they are given: named after it
        prefix = sched.name if name.startswith("coda") else name.split("+")[0]
        assert pol.name.startswith(prefix)
    assert get_policy("coda+dra", schedule=sched, thresholds=table).name.endswith("+dra")
    with pytest.raises(ValueError, match="'coda\\+dra' needs thresholds"):
        get_policy("coda+dra", schedule=sched)
    other = mixed_schedule(STEPS, 2, 0.3)
    with pytest.raises(ValueError, match="calibrated for schedule"):
        get_policy("coda+dra", schedule=other, thresholds=table)
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
def reuse_matrix(sched: Schedule) -> np.ndarray:
    """bool [steps, branches, operators] (True = reused), operators in forward order."""
    order = sched.order()
    return np.array([[[ref in sched.reused(s, b) for ref in order] for b in BRANCHES]
                     for s in range(sched.num_steps)])


def test_magcache_respects_its_limits(setup):
    _, prof = setup
    ratios = magnitude_ratios(prof)
    assert ratios.shape == (STEPS, 2, 10) and np.all(ratios[0] == 1)
    pol = MagCachePolicy(ratios, threshold=1e9, max_skips=2, retention=0.25)
    m = reuse_matrix(pol.build(STEPS, 2))
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


# ---------------------------------------------------------------- step-level DRA
#: the order the shipped model's CFG branches ask the policy in (one batched call on
#: [uncond; cond] rows, coda.host.model.sample): step DRA probes in the first that reuses
ASK_ORDER = ("uncond", "cond")


def probing_branch(sched, step: int):
    """The branch whose probe decides ``step`` for both (None: no branch reuses the first
    operator there)."""
    first = operator_order(2)[0]
    return next((b for b in ASK_ORDER if first in sched.reused(step, b)), None)


def test_step_dra_probing_only_changes_nothing_but_costs_monitors(setup):
    model, _ = setup
    sched = mixed_schedule(STEPS, 2, 0.4)
    ref, ref_stats, _ = run(model, SchedulePolicy(sched), [2, 6], [40, 41])
    got, stats, log = run(model, StepDRAPolicy(SchedulePolicy(sched)), [2, 6], [40, 41])
    assert torch.equal(got, ref)
    assert stats["fallbacks"] == 0 and stats["ops_reused"] == ref_stats["ops_reused"]
    first = operator_order(2)[0]
    probed = {(s, probing_branch(sched, s), i) for s in range(STEPS) for i in range(2)
              if probing_branch(sched, s) is not None}
    mons = log.of("monitor")
    assert probed and {(m.step, m.branch, m.sample) for m in mons} == probed
    assert len(mons) == len(probed) == stats["monitors"]
    assert all((m.layer, m.op) == first and m.nme_cycles > 0 and m.bytes_to_nmp > 0
               for m in mons)
    # the reference is the input kept at the last step that computed the first operator
    for m in mons:
        assert m.reference_step == max(s for s in range(m.step)
                                       if first not in sched.reused(s, m.branch))
    assert stats["pcie_bytes"] > ref_stats["pcie_bytes"]          # kept inputs + monitors


def test_step_dra_fallback_computes_and_stores_the_whole_step(setup):
    model, _ = setup
    sched = whole_steps({2, 3, 4})
    # step 3 always falls back (threshold 0), steps 2 and 4 never do
    dra = StepDRAPolicy(SchedulePolicy(sched), table_for(model, sched, {2: 1e9, 3: 0.0, 4: 1e9}))
    got, stats, log = run(model, dra, [2, 6], [40, 41])
    # = the static schedule that computes step 3: step 4 reads step 3's fresh caches
    ref, ref_stats, _ = run(model, SchedulePolicy(whole_steps({2, 4})), [2, 6], [40, 41])
    assert torch.equal(got, ref)
    ops = log.of("op")
    fallbacks = [e for e in ops if e.reason == "fallback"]
    assert {(e.step, e.branch, e.sample, e.ref) for e in fallbacks} == \
        {(3, b, i, r) for b in BRANCHES for i in range(2) for r in operator_order(2)}
    assert stats["fallbacks"] == len(fallbacks) == 2 * 2 * 10
    assert stats["ops_computed"] - run(model, SchedulePolicy(sched), [2, 6], [40, 41])[1][
        "ops_computed"] == stats["fallbacks"]
    assert all(e.stored_bytes > 0 and not e.reused for e in fallbacks)
    assert all(e.kept_bytes > 0 for e in fallbacks if e.ref == operator_order(2)[0])
    assert all(e.reused for e in ops if e.step in (2, 4))
    assert dra.fired == 2 * 2
    assert ref_stats["ops_reused"] == stats["ops_reused"]


def test_step_dra_decides_per_sample_for_both_branches(setup):
    model, _ = setup
    sched = whole_steps({2, 4, 5})
    labels, seeds = [2, 6, 9], [40, 41, 42]
    values = {}
    for i, (label, seed) in enumerate(zip(labels, seeds)):
        _, _, log = run(model, StepDRAPolicy(SchedulePolicy(sched)), [label], [seed])
        values[i] = {(m.step, m.branch): m.value for m in log.of("monitor")}
        assert set(values[i]) == {(s, "uncond") for s in (2, 4, 5)}   # one probe per step
    # step 4's threshold between the videos' probes: some fall back, some do not
    at4 = sorted(v[(4, "uncond")] for v in values.values())
    assert at4[0] < at4[-1]
    thr = 0.5 * (at4[0] + at4[1])
    dra = StepDRAPolicy(SchedulePolicy(sched), table_for(model, sched, {2: 1e9, 4: thr, 5: 1e9}))
    three, _, log3 = run(model, dra, labels, seeds)
    fired = {(e.branch, e.sample) for e in log3.of("op") if e.reason == "fallback"}
    assert fired == {(b, i) for i in range(3) for b in BRANCHES if values[i][(4, "uncond")] > thr}
    for i, (label, seed) in enumerate(zip(labels, seeds)):
        one, _, _ = run(model, dra, [label], [seed])
        assert torch.equal(one, three[i:i + 1])


def probed_alone(model, sched, probe: str, steps) -> list:
    """Run ``sched`` under StepDRAPolicy with an xPU ``probe`` and no table: the same bits as
    the static policy, no fallback, nothing more on the host link, one device-side monitor
    (no NME work) per reused step in ``steps`` and sample, read in the first branch. Returns
    the monitors."""
    ref, ref_stats, _ = run(model, SchedulePolicy(sched), [2, 6], [40, 41])
    got, stats, log = run(model, StepDRAPolicy(SchedulePolicy(sched), probe=probe),
                          [2, 6], [40, 41])
    assert torch.equal(got, ref) and stats["fallbacks"] == 0
    mons = log.of("monitor")
    assert {(m.step, m.branch, m.sample) for m in mons} == {
        (s, "uncond", i) for s in steps for i in range(2)}
    assert all(m.probe == probe and m.cache_memory == "device" and m.nme_cycles == 0
               and m.bytes_to_nmp == 0 and m.reference_step == m.step - 1 for m in mons)
    assert stats["pcie_bytes"] == ref_stats["pcie_bytes"]     # nothing kept on the ranks
    return mons


def test_step_dra_acceleration_probe_is_the_block0_inputs_second_difference(setup):
    """probe="accel": the relative second difference of the block-0 input over the last three
    steps, on the xPU (no NME work, no link bytes), from step 2; probing alone changes no
    bit; a threshold of 0 at a step falls back there as the L1 probe's does."""
    model, _ = setup
    sched = whole_steps({2, 4, 5})
    mons = probed_alone(model, sched, "accel", (2, 4, 5))
    # step 2's block-0 input follows two computed steps: the full-compute model's, so the
    # value is the formula on the inputs of steps 0-2 of a plain generation (the same fp32
    # tensors; the sums' order may differ: 1e-6)
    inputs = []
    block = model.transformer.transformer_blocks[0]
    handle = block.register_forward_pre_hook(
        lambda mod, args, kw: inputs.append((args[0] if args else kw["hidden_states"])
                                            .detach().float().clone()), with_kwargs=True)
    try:
        generate(model, [2, 6], seeds=[40, 41], num_steps=STEPS, guidance_scale=3.0)
    finally:
        handle.remove()
    frames = model.config["data"]["frames"]
    for m in mons:
        if m.step != 2:
            continue
        row = (m.branch == "cond") * 2 + m.sample      # generate's rows: uncond | cond
        x = [h.reshape(4, frames, -1)[row].reshape(-1) for h in inputs[:3]]
        want = float((x[2] - 2.0 * x[1] + x[0]).abs().sum()) / float(x[1].abs().sum())
        assert m.value == pytest.approx(want, rel=1e-6)
    table = StepThresholds({2: 1e9, 4: 0.0, 5: 1e9}, STEPS, model_hash(model),
                           sched.digest(), 1.0, 1.0, probe="accel")
    dra = StepDRAPolicy(SchedulePolicy(sched), table)
    assert dra.probe == "accel" and dra.input_history
    fell, _, _ = run(model, dra, [2, 6], [40, 41])
    assert torch.equal(fell, run(model, SchedulePolicy(whole_steps({2, 5})), [2, 6],
                                 [40, 41])[0])
    with pytest.raises(ValueError, match="probe='l2': expected one of l1, accel, output"):
        StepDRAPolicy(SchedulePolicy(sched), probe="l2")
    with pytest.raises(ValueError, match="of the 'accel' probe for a policy probing 'l1'"):
        StepDRAPolicy(SchedulePolicy(sched), table, probe="l1")
    kw = dict(num_steps=STEPS, guidance_scale=3.0, driver_factory=driver)
    early = whole_steps({1, 2, 4, 5})
    cal = calibrate_step_dra(model, early, [2, 6], [40], probe="accel", quantile=0.5, **kw)
    values = probe_values(model, early, [2, 6], [40], probe="accel", **kw)
    assert cal.probe == "accel" and sorted(values) == [2, 4, 5]      # none at step 1
    assert cal.thresholds == {s: float(np.quantile(values[s], 0.5)) for s in values}


def test_step_dra_output_probe_is_the_model_outputs_second_difference(setup):
    """probe="output": the relative second difference of the sample's model outputs over the
    three steps before, summed over both CFG branches, on the xPU (no NME work, no link
    bytes), from step 3; probing alone changes no bit; a threshold of 0 at a step falls back
    there."""
    model, _ = setup
    sched = whole_steps({3, 5, 6})
    mons = probed_alone(model, sched, "output", (3, 5, 6))
    # step 3 follows three computed steps: the value is the formula on the outputs of steps
    # 0-2 of a plain generation, both branches' sums together (the sums' order may differ)
    outputs = []
    handle = model.transformer.register_forward_hook(
        lambda mod, args, out: outputs.append((out[0] if isinstance(out, tuple) else out.sample)
                                              .detach().float().clone()))
    try:
        generate(model, [2, 6], seeds=[40, 41], num_steps=STEPS, guidance_scale=3.0)
    finally:
        handle.remove()
    for m in mons:
        if m.step != 3:
            continue
        y = [[o[row] for o in outputs[:3]] for row in (m.sample, 2 + m.sample)]   # uncond|cond
        num = sum(float((y2 - 2.0 * y1 + y0).abs().sum()) for y0, y1, y2 in y)
        want = num / sum(float(y1.abs().sum()) for _, y1, _ in y)
        assert m.value == pytest.approx(want, rel=1e-6)
    table = StepThresholds({3: 1e9, 5: 0.0, 6: 1e9}, STEPS, model_hash(model),
                           sched.digest(), 1.0, 1.0, probe="output")
    dra = StepDRAPolicy(SchedulePolicy(sched), table)
    assert dra.probe == "output" and dra.output_history and not dra.input_history
    fell, _, _ = run(model, dra, [2, 6], [40, 41])
    assert torch.equal(fell, run(model, SchedulePolicy(whole_steps({3, 6})), [2, 6],
                                 [40, 41])[0])
    kw = dict(num_steps=STEPS, guidance_scale=3.0, driver_factory=driver)
    early = whole_steps({2, 3, 5, 6})
    values = probe_values(model, early, [2, 6], [40], probe="output", **kw)
    assert sorted(values) == [3, 5, 6]      # none at step 2


def test_step_dra_falls_back_at_most_max_fallbacks_steps_per_sample(setup):
    """max_fallbacks: the first crossings fall back, the later ones reuse; the cap from
    calibrate_step_dra(max_extra=x) is floor(x * steps) and bounds a video's extra
    executions by x."""
    model, _ = setup
    sched = whole_steps({2, 4, 5})
    always = {2: 0.0, 4: 0.0, 5: 0.0}          # every probe crosses its threshold
    for cap, fell in ((None, {2, 4, 5}), (2, {2, 4}), (1, {2}), (0, set())):
        table = StepThresholds(always, STEPS, model_hash(model), sched.digest(), 1.0, 1.0,
                               max_fallbacks=cap)
        _, stats, log = run(model, StepDRAPolicy(SchedulePolicy(sched), table), [2, 6],
                            [40, 41])
        steps = {(e.step, e.branch, e.sample) for e in log.of("op") if e.reason == "fallback"}
        assert steps == {(s, b, i) for s in fell for b in BRANCHES for i in range(2)}
        assert StepThresholds.from_dict(table.to_dict()) == table
    kw = dict(num_steps=STEPS, guidance_scale=3.0, driver_factory=driver)
    cal = calibrate_step_dra(model, sched, [2], [40], max_extra=0.3, **kw)
    assert cal.max_fallbacks == 2                          # floor(0.3 * 8)
    # per video at most 2 steps, both branches, of 10 operators of 2 * 8 * 10: <= 0.3 of them
    assert 2 * 2 * 10 / (2 * STEPS * 10) <= 0.3
    with pytest.raises(ValueError, match="max_extra=0.0: expected a fraction in"):
        calibrate_step_dra(model, sched, [2], [40], max_extra=0.0, **kw)
    with pytest.raises(ValueError, match="max_fallbacks=-1: expected an int >= 0"):
        StepThresholds(always, STEPS, "m", "s", 1.0, 1.0, max_fallbacks=-1)


def test_default_dra_is_the_table_of_the_probe_its_calibration_rollouts_pick(setup):
    """What coda eval / coda run calibrate: per default probe, the budgeted, bounded table on
    the profile's videos; the chosen one is pick_probe's verdict on the videos each table
    generates there, judged against full compute (every figure re-derived here)."""
    from coda.experiments.dra_calibration import calibrate_default_dra, dra_videos, pick_probe
    from coda.experiments.metrics import psnr_db
    from coda.host.cache.policies.dra import DEFAULT_BUDGET, DEFAULT_MAX_EXTRA, DEFAULT_PROBES

    model, prof = setup
    sched = whole_steps({3, 4, 5, 6})
    kw = dict(num_steps=STEPS, guidance_scale=3.0, driver_factory=driver)
    labels, seeds = prof.meta["prompts"], prof.meta["seeds"]
    table, report = calibrate_default_dra(model, sched, prof, **kw)
    full = torch.cat([generate(model, labels, seeds=[s] * len(labels), num_steps=STEPS,
                               guidance_scale=3.0) for s in seeds])

    def psnr(thresholds):
        videos, extra = dra_videos(model, sched, thresholds, labels, seeds, **kw)
        return [psnr_db(videos[i:i + 1], full[i:i + 1]) for i in range(len(full))], extra

    tables = {p: calibrate_step_dra(model, sched, labels, seeds, budget=DEFAULT_BUDGET,
                                    profile=prof, probe=p, max_extra=DEFAULT_MAX_EXTRA, **kw)
              for p in DEFAULT_PROBES}
    static = psnr(None)[0]
    judged = {p: psnr(t) for p, t in tables.items()}
    choice, figures = pick_probe(static, {p: j[0] for p, j in judged.items()})
    assert report["probe"] == choice and table == tables[choice]
    assert report["static_psnr_db"] == static
    assert report["videos"] == [[p, s] for s in seeds for p in labels]
    assert report["probes"] == {p: {**figures[p], "psnr_db": judged[p][0],
                                    "extra_executions": judged[p][1]} for p in DEFAULT_PROBES}
    with pytest.raises(ValueError, match=r"probes=\('cos',\): expected one or more of"):
        calibrate_default_dra(model, sched, prof, probes=("cos",), **kw)
    with pytest.raises(ValueError, match=r"probes=\(\): expected one or more of"):
        calibrate_default_dra(model, sched, prof, probes=(), **kw)


def test_pick_probe_takes_the_best_corner_among_probes_that_do_not_lower_the_mean():
    from coda.experiments.dra_calibration import pick_probe

    static = [30.0, 10.0, 40.0, 20.0, 50.0, 60.0, 70.0, 80.0]     # corner: videos 1, 3
    psnr = {"a": [30.0, 12.0, 40.0, 21.0, 50.0, 60.0, 70.0, 79.0],  # corner +1.5, mean +0.25
            "b": [30.0, 16.0, 40.0, 20.0, 40.0, 60.0, 70.0, 80.0],  # corner +3, mean -0.5
            "c": [31.0, 11.0, 40.0, 22.0, 50.0, 60.0, 70.0, 80.0]}  # corner +1.5, mean +0.5
    choice, figures = pick_probe(static, psnr)
    assert choice == "a"                 # b lowers the mean; a ties c and comes first
    assert figures == {"a": {"mean_gain_db": 0.25, "corner_gain_db": 1.5},
                       "b": {"mean_gain_db": -0.5, "corner_gain_db": 3.0},
                       "c": {"mean_gain_db": 0.5, "corner_gain_db": 1.5}}
    assert pick_probe(static, {"c": psnr["c"], "a": psnr["a"]})[0] == "c"
    assert pick_probe(static, {"b": psnr["b"]})[0] == "b"    # none keeps the mean: best corner
    inf = float("inf")                   # identical videos on both sides: no gain, not nan
    assert pick_probe([inf, 1.0], {"a": [inf, 2.0]})[1]["a"] == {"mean_gain_db": 0.5,
                                                                 "corner_gain_db": 1.0}
    with pytest.raises(ValueError, match="probe_psnr is empty"):
        pick_probe(static, {})
    with pytest.raises(ValueError, match=r"probe 'a': 3 PSNR values, expected one per video \(8\)"):
        pick_probe(static, {"a": [1.0, 2.0, 3.0]})


def test_step_dra_calibration_is_the_probe_quantile_and_is_stored_with_the_schedule(
        setup, tmp_path):
    model, _ = setup
    sched = whole_steps({2, 4, 5})
    kw = dict(num_steps=STEPS, guidance_scale=3.0, driver_factory=driver)
    values = probe_values(model, sched, [2, 6], [40, 41], **kw)
    assert sorted(values) == [2, 4, 5] and all(len(v) == 2 * 2 for v in values.values())
    table = calibrate_step_dra(model, sched, [2, 6], [40, 41], quantile=0.75, margin=1.5, **kw)
    assert table.thresholds == {s: 1.5 * float(np.quantile(values[s], 0.75)) for s in values}
    assert (table.prompts, table.seeds, table.model_hash) == ((2, 6), (40, 41),
                                                               model_hash(model))
    path = tmp_path / "s.json"
    save_step_dra(path, sched, table)
    assert load_step_dra(path, model_id=model_hash(model), num_steps=STEPS) == (sched, table)
    with pytest.raises(ValueError, match="calibrated for model"):
        load_step_dra(path, model_id="0123456789abcdef")
    with pytest.raises(ValueError, match="holds another schedule"):
        save_step_dra(path, whole_steps({2, 4}), StepThresholds(
            {2: 0.1}, STEPS, table.model_hash, whole_steps({2, 4}).digest(), 0.5, 1.0))
    with pytest.raises(ValueError, match="made for 8 steps, expected 9"):
        load_step_dra(path, num_steps=9)
    other = StepThresholds(table.thresholds, STEPS + 1, table.model_hash,
                           table.schedule_hash, 0.5, 1.0)
    with pytest.raises(ValueError, match="DRA thresholds for 9 steps, this run has 8"):
        run(model, StepDRAPolicy(SchedulePolicy(sched), other), [2], [40])
    with pytest.raises(ValueError, match="calibrated for schedule"):
        StepDRAPolicy(SchedulePolicy(whole_steps({2, 4})), table)
    with pytest.raises(ValueError, match="quantile=1.5: expected a fraction in"):
        calibrate_step_dra(model, sched, [2], [40], quantile=1.5, **kw)
    with pytest.raises(ValueError, match="threshold -1.0 at step 2"):
        StepThresholds({2: -1.0}, STEPS, "m", "s", 0.5, 1.0)


def test_budgeted_step_dra_spreads_the_budget_over_the_steps_by_the_stand_in(
        setup, short_profiles, tmp_path, monkeypatch):
    """fallback_rates: rates proportional to what computing each probed step is worth to the
    stand-in (step_values), capped at 1, adding up to the budget in extra executions; the
    budgeted calibration's thresholds are the (1 - rate) quantiles of the probes."""
    import coda.experiments.dra_calibration as dc
    from coda.experiments.dra_calibration import fallback_extra, fallback_rates
    from coda.experiments.step_plans import StepPlan, step_change, step_values
    from coda.host.cache.weights import step_weights

    model, prof = setup
    sched = whole_steps({2, 4, 5})
    cost = 2 * 10 / (STEPS * 2 * 10)      # a whole step, both branches, of a video's
    value = step_values(StepPlan(STEPS, 2, frozenset({2, 4, 5})), step_change(prof),
                        step_weights(prof)[1], 3.0)
    assert all(v > 0 for v in value.values())
    for budget in (0.05, 0.3):
        rates = fallback_rates(sched, prof, budget, gamma=3.0)
        assert sorted(rates) == [2, 4, 5]
        assert sum(r * cost for r in rates.values()) == pytest.approx(budget, rel=1e-9)
        free = [s for s in rates if rates[s] < 1.0]
        assert len(free) >= 1 and all(0.0 < rates[s] <= 1.0 for s in rates)
        for s in free:      # unsaturated rates: in the ratio of the values
            assert rates[s] / value[s] == pytest.approx(rates[free[0]] / value[free[0]])
        for s in set(rates) - set(free):    # a saturated step is worth at least the others
            assert all(value[s] >= value[f] for f in free)
    assert fallback_rates(sched, prof, 3 * cost, gamma=3.0) == {2: 1.0, 4: 1.0, 5: 1.0}
    for bad, match in ((0.0, "budget=0.0: expected"), (1.5, "budget=1.5: expected")):
        with pytest.raises(ValueError, match=match):
            fallback_rates(sched, prof, bad)
    with pytest.raises(ValueError, match="gamma=-1: expected >= 0"):
        fallback_rates(sched, prof, 0.1, gamma=-1)
    with pytest.raises(ValueError, match="profile of 3 steps, schedule"):
        fallback_rates(sched, short_profiles[3], 0.1)
    with pytest.raises(ValueError, match="reuses its first operator at no step"):
        fallback_rates(Schedule(STEPS, 2, {}, name="none"), prof, 0.1)

    kw = dict(num_steps=STEPS, guidance_scale=3.0, driver_factory=driver)
    values = probe_values(model, sched, [2, 6], [40, 41], **kw)

    def expected(rates):
        return StepThresholds({s: 0.0 if rates[s] == 1.0 else float(np.quantile(
            values[s], 1.0 - rates[s])) for s in values}, STEPS, model_hash(model),
            sched.digest(), None, 1.0, (2, 6), (40, 41), 3.0, budget, 3.0, rates)

    for budget in (0.05, 0.3):
        first = expected(fallback_rates(sched, prof, budget, gamma=3.0))
        spent = fallback_extra(model, sched, first, [2, 6], [40, 41], **kw)
        fell = sum(run(model, StepDRAPolicy(SchedulePolicy(sched), first), [2, 6],
                       [seed, seed])[1]["fallbacks"] for seed in (40, 41))
        assert spent == fell / (4 * STEPS * 2 * 10)      # 4 videos, 2 branches, 10 ops
        # what the table spends on the calibration videos decides: kept if within the
        # budget, else the rates spread again by the last spread times budget / spent
        want, spread = first, budget
        for _ in range(dc.MAX_SPREADS):
            if spent <= budget:
                break
            spread *= budget / spent
            want = expected(fallback_rates(sched, prof, spread, gamma=3.0))
            spent = fallback_extra(model, sched, want, [2, 6], [40, 41], **kw)
        table = calibrate_step_dra(model, sched, [2, 6], [40, 41], budget=budget,
                                   profile=prof, gamma=3.0, **kw)
        assert table == want and table.quantile is None
    assert 0 < spent <= 0.3     # the tiny model's videos spend within it: the table is kept
    # tables that spend 0.6, then 0.45, then 0.2 of a 0.3 budget on them: the rates are
    # spread by 0.3, then 0.3 * 0.3 / 0.6, then that * 0.3 / 0.45, and that table is kept
    spends = iter([0.6, 0.45, 0.2])
    monkeypatch.setattr(dc, "fallback_extra", lambda *a, **k: next(spends))
    table = calibrate_step_dra(model, sched, [2, 6], [40, 41], budget=0.3, profile=prof,
                               gamma=3.0, **kw)
    budget = 0.3
    assert table == expected(fallback_rates(sched, prof, 0.3 * 0.5 * (0.3 / 0.45),
                                            gamma=3.0))
    assert next(spends, None) is None
    path = tmp_path / "b.json"
    save_step_dra(path, sched, table)
    assert load_step_dra(path, model_id=model_hash(model), num_steps=STEPS) == (sched, table)
    with pytest.raises(ValueError, match="needs the profile"):
        calibrate_step_dra(model, sched, [2], [40], budget=0.3, **kw)
    with pytest.raises(ValueError, match="neither a quantile nor a budget"):
        StepThresholds({2: 0.1}, STEPS, "m", "s", None, 1.0)
    with pytest.raises(ValueError, match="fallback rates"):
        StepThresholds({2: 0.1}, STEPS, "m", "s", None, 1.0, budget=0.1, rates={2: 1.5})


# ---------------------------------------------------------------- FBCache
def test_fbcache_reuses_the_rest_of_the_step_per_sample_from_nme_probes(setup):
    model, prof = setup
    pol = FBCachePolicy.calibrate(prof, 0.3)
    assert abs(pol.simulate_skip(prof) - 0.3) < 0.1
    assert FBCachePolicy(0.0).simulate_skip(prof) == 0.0
    labels, seeds = [2, 6, 9], [40, 41, 42]
    three, stats, log = run(model, pol, labels, seeds)
    mons = log.of("monitor")
    # one probe per sample, branch and step 1..S-2, on layer 1's first operator
    assert sorted((m.step, m.branch, m.sample) for m in mons) == sorted(
        (s, b, i) for s in range(1, STEPS - 1) for b in BRANCHES for i in range(3))
    assert all((m.layer, m.op) == (1, OP_TYPES[0]) and m.nme_cycles > 0 for m in mons)
    reuse = {(m.step, m.branch, m.sample): m.value < pol.threshold for m in mons}
    assert any(reuse.values()) and not all(reuse.values())
    for e in log.of("op"):
        expect = e.layer >= 1 and reuse.get((e.step, e.branch, e.sample), False)
        assert e.reused == expect, e
    assert stats["ops_reused"] == 10 // 2 * sum(reuse.values())
    # the reference is the step that last computed the rest
    for m in mons:
        assert m.reference_step == max(s for s in range(m.step)
                                       if not reuse.get((s, m.branch, m.sample), False))
    for i, (label, seed) in enumerate(zip(labels, seeds)):
        one, _, _ = run(model, pol, [label], [seed])
        assert torch.equal(one, three[i:i + 1])
    with pytest.raises(ValueError, match="threshold=-1: expected a finite value"):
        FBCachePolicy(-1)
    with pytest.raises(ValueError, match="skip 1.2: expected a fraction"):
        FBCachePolicy.calibrate(prof, 1.2)


# ---------------------------------------------------------------- LeMiCa
def _brute_force(cost, computed):
    """Every path's total, summed left to right as the DP does: path -> total."""
    from itertools import combinations
    n = cost.shape[0]
    paths = [(0, *inner, n - 1) for inner in combinations(range(1, n - 1), computed - 2)]
    return {path: sum(cost[a, b] for a, b in zip(path, path[1:])) for path in paths}


def _cheapest(cost, computed):
    """(path, total) of the cheapest path by brute force, ties (exactly equal totals) to
    the smallest last inner node, then the node before it, ..."""
    totals = _brute_force(cost, computed)
    low = min(totals.values())
    return min((p for p, t in totals.items() if t == low), key=lambda p: p[::-1]), low


def test_min_error_path_is_exact_against_brute_force():
    """The DP's path is a cheapest one (float costs); with integer costs (exact sums, many
    ties) it is the tie rule's: the smallest last inner node, then the one before, ..."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    def case(costs):
        return st.integers(2, 8).flatmap(lambda n: st.tuples(
            st.just(n), st.integers(2, n), st.lists(costs, min_size=n * n, max_size=n * n)))

    @settings(max_examples=150, deadline=None)
    @given(case(st.floats(0, 100, allow_nan=False)))
    @example((4, 3, [0.0] * 7 + [1e-35] + [0.0] * 8))    # 0-1-3 costs 1e-35, 0-2-3 nothing
    def cheapest(case):
        n, computed, flat = case
        cost = np.array(flat).reshape(n, n)
        path, total = min_error_path(cost, computed)
        totals = _brute_force(cost, computed)
        assert len(path) == computed and path[0] == 0 and path[-1] == n - 1
        assert total == pytest.approx(min(totals.values()), rel=1e-12, abs=0)
        assert total == totals[path]

    @settings(max_examples=150, deadline=None)
    @given(case(st.integers(0, 3)))
    def ties(case):
        n, computed, flat = case
        cost = np.array(flat, dtype=float).reshape(n, n)
        assert min_error_path(cost, computed) == _cheapest(cost, computed)

    cheapest()
    ties()
    hand = np.array([[0, 5, 1, 9], [0, 0, 1, 2], [0, 0, 0, 7], [0, 0, 0, 0]], float)
    assert min_error_path(hand, 3) == ((0, 1, 3), 7.0)     # 0-1-3: 5 + 2; 0-2-3: 1 + 7
    assert min_error_path(hand, 4) == ((0, 1, 2, 3), 13.0)
    with pytest.raises(ValueError, match="computed=5: expected 2..4"):
        min_error_path(hand, 5)
    with pytest.raises(ValueError, match="expected a square"):
        min_error_path(np.zeros((2, 3)), 2)


def test_lemica_reuses_whole_steps_on_the_minimum_error_path(setup):
    model, prof = setup
    cost = span_costs(prof)
    g = prof.meta["guidance_scale"]
    # one entry derived again: reuse steps 2..4 from step 1's cache
    from coda.host.cache.weights import quality_weights, step_weights
    change = np.nan_to_num(prof.mean("out_change").astype(np.float64)).reshape(STEPS, 2, -1)
    change[0] = 0
    d = np.cumsum((change * quality_weights(prof)[None]).mean(axis=2), axis=0)
    w = step_weights(prof)[1]
    want = sum(abs(g * (d[s, 0] - d[1, 0]) + (1 - g) * (d[s, 1] - d[1, 1])) * w[s]
               for s in (2, 3, 4))
    assert cost[1, 5] == pytest.approx(want) and cost[1, 2] == 0.0
    sched = lemica_schedule(prof, 0.4)
    reused = sorted({s for s, _ in sched.reuse})
    assert len(reused) == round(0.4 * STEPS) and 0 not in reused and STEPS - 1 not in reused
    assert all(sched.reused(s, b) == frozenset(operator_order(2)) for s in reused
               for b in BRANCHES)
    computed = [s for s in range(STEPS) if s not in reused]
    assert tuple(computed) == _cheapest(cost, len(computed))[0]
    pol = get_policy("lemica", skip=0.4, profile=prof)
    _, stats, log = run(model, pol, [2], [40])
    assert {(e.step, e.branch, e.ref) for e in log.of("op") if e.reused} == \
        {(s, b, r) for s in reused for b in BRANCHES for r in operator_order(2)}
    assert stats["ops_skipped_fraction"] == sched.ops_skipped_fraction()
    with pytest.raises(ValueError, match="skip 0.95: 8 of 8 steps reused, expected 1..6"):
        lemica_schedule(prof, 0.95)


@pytest.mark.parametrize("skip", [0.3, 0.5, 0.6, 0.7])
def test_uniform_for_skip_says_the_interval_it_uses(skip):
    """The policy's own fields name the intervals its schedule uses: one interval for every
    type is the default interval (no per-type table beside it); mixed intervals list every
    type, the default the smaller."""
    from coda.host.cache.policies import uniform_for_skip
    from coda.host.cache.schedule import OP_TYPES
    p = uniform_for_skip(skip, 50, 4)
    used = {op: p.interval(op) for op in OP_TYPES}
    if len(set(used.values())) == 1:
        assert p.intervals == {} and p.default_interval == used["spatial_attn"]
    else:
        assert set(p.intervals) == set(OP_TYPES) and p.default_interval == min(used.values())
    assert f"default_interval={p.default_interval}" in repr(p)
