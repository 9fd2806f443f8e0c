"""Every cache policy on every diffusers architecture besides Latte (Wan, CogVideoX,
HunyuanVideo), on the small random-initialised configurations of
tests/host/cache/test_arch_adapters.py, through a pipeline-like CFG loop (coda.experiments.cfg_loop.CFGLoop) with the cache engine and the real
NMP driver.

Per architecture, once: a profile of full-compute generations (coda.experiments.profile), the
calibrated policies (coda.host.cache.policies.get_policy), a CODA schedule found by the
whole-step search judged by rollouts (coda.experiments.search) and its step-DRA
thresholds (coda.experiments.dra_calibration). Each policy must run, reuse exactly what its
schedule or its rule on the signals it measured says, give a batch the bits of its videos
one by one, keep its state per CFG branch, and (a few) give the torch backend's bits and
events on the Verilated NMEs. The models are made batch-invariant (test_arch_adapters'
batch_invariant: torch's CPU kernels round some per-sample computations differently with the
batch size, in the unhooked model as much as in the hooked one). Quality figures need trained
weights; these check that the machinery runs and does what it says.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from coda.experiments.cfg_loop import CFGLoop
from coda.experiments.dra_calibration import calibrate_step_dra
from coda.host.cache.profile import Profile
from coda.experiments.profile import profile_model
from coda.host.cache.profile import InputNormDriver
from coda.experiments.rollouts import loop_judge
from coda.experiments.search import search_steps
from coda.host.cache.arch import ARCHITECTURES, model_ops
from coda.host.cache.events import EventLog
from coda.host.cache.policies import StaticPolicy, get_policy
from coda.host.cache.policies.dra import StepDRAPolicy
from coda.host.cache.policies.pab import PABPolicy
from coda.host.cache.schedule import ARCH_OP_TYPES, BRANCHES, PAB_CLASSES
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.hw.nme.isa import NMEConfig
from test_arch_adapters import ARCHS, SpyDriver, build

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS, SKIP, GUIDANCE, SEED = 8, 0.4, 4.0, 40
NAMES = ("wan", "cogvideox", "hunyuan_video")
POLICIES = ("uniform", "pab", "teacache", "magcache", "fbcache", "lemica", "coda", "coda+dra")
#: the NME build tests/host/cache/test_arch_adapters.py and tests/experiments/test_run.py use:
#: one Verilator build for all
CFG = NMEConfig(lanes=8, mem_words=1 << 19)


def driver(videos=1, cls=NMPDriver):
    return cls(TorchBackend(), CFG, ranks=2)


@dataclasses.dataclass
class Setup:
    loop: CFGLoop
    profile: Profile
    policies: dict


_SETUPS: dict = {}


def make_loop(name: str, cfg: str = "batched") -> CFGLoop:
    """Two prompts (test_arch_adapters' draws for seeds 1000, 1001) over the batch-invariant model."""
    arch = ARCHS[name]
    model = build(arch, invariant=True)
    prompts = []
    for i in range(2):
        cond, uncond = arch.sample(torch.Generator().manual_seed(1000 + i), arch.frames[0],
                                   arch.size[0])
        latent = cond.pop("hidden_states")
        prompts.append((cond, uncond))
    return CFGLoop(model, prompts, latent.shape[1:], cfg=cfg)


def setup(name: str) -> Setup:
    """The architecture's loop, profile and every calibrated policy (built once)."""
    if name in _SETUPS:
        return _SETUPS[name]
    loop = make_loop(name)
    prof = profile_model(loop, [0, 1], [SEED], lambda n: driver(n, InputNormDriver),
                         num_steps=STEPS, guidance_scale=GUIDANCE)
    ops = prof.model_ops
    pols = {n: get_policy(n, skip=SKIP, profile=prof, num_steps=STEPS, ops=ops)
            for n in ("uniform", "pab", "teacache", "magcache", "fbcache", "lemica")}
    labels, seeds = [0, 1], [SEED, SEED]
    full = loop.generate(labels, seeds=seeds, num_steps=STEPS, guidance_scale=GUIDANCE)
    report = search_steps(prof, loop, SKIP, labels=labels, seeds=seeds, full=full,
                          prune_videos=2, finalists=2, workers=0, guidance_scale=GUIDANCE,
                          target=None, log=lambda *a: None,
                          judge_with=loop_judge(loop, driver))
    pols["coda"] = get_policy("coda", schedule=report.schedule)
    table = calibrate_step_dra(loop, report.schedule, labels, [SEED, SEED + 1],
                               num_steps=STEPS, guidance_scale=GUIDANCE, driver_factory=driver,
                               quantile=0.75)
    pols["coda+dra"] = get_policy("coda+dra", schedule=report.schedule, thresholds=table)
    _SETUPS[name] = Setup(loop, prof, pols)
    return _SETUPS[name]


@pytest.fixture(scope="module", autouse=True)
def _drop_setups():
    yield
    _SETUPS.clear()


def run(loop, policy, labels=(0, 1), seeds=(SEED, SEED + 1), drv=None):
    log = EventLog()
    out, stats = loop.cached_generate(list(labels), drv or driver(), policy, events=log,
                                      seeds=list(seeds), num_steps=STEPS,
                                      guidance_scale=GUIDANCE)
    return out, stats, log


EACH = pytest.mark.parametrize("name", NAMES)
EVERY = pytest.mark.parametrize("name,policy", [(a, p) for a in NAMES for p in POLICIES])


# ---------------------------------------------------------------- what the adapters declare
@EACH
def test_each_architecture_declares_what_the_policies_need(name):
    ops = model_ops(build(ARCHS[name]))
    arch = next(a for a in ARCHITECTURES.values() if a.name == name)
    assert ops.op_types == ARCH_OP_TYPES[name]
    assert {op for _, spec in arch.block_lists for op in spec.ops} == set(ops.op_types)
    assert all(ops.kind(op) in PAB_CLASSES for op in ops.op_types)
    assert ops.step_probe == ops.ops[0] == (0, "attn")
    assert ops.block_probe == (1, "attn")        # HunyuanVideo: its second dual-stream block
    # PAB's pyramid by class (12 steps): spatial range 2 in steps 2..10, cross 6 in 1..10
    sched = PABPolicy().schedule_for(12, ops)
    for op in ops.op_types:
        cls = ops.pab_class(op)
        if cls == "mlp":
            want = set()
        elif cls == "cross":
            want = {s for s in range(1, 11) if (s - 1) % 6}
        else:
            want = {s for s in range(2, 11) if (s - 2) % 2}
        got = {s for s in range(12) if any(r[1] == op for r in sched.reused(s, "cond"))}
        assert got == want, (op, cls)
        assert all({r for r in sched.reused(s, b) if r[1] == op} in (set(), {r for r in ops.ops
                                                                               if r[1] == op})
                   for s in range(12) for b in BRANCHES)


@EACH
def test_a_profile_of_each_architecture_holds_its_operators(name, tmp_path):
    prof = setup(name).profile
    ops = prof.model_ops
    assert prof.meta["arch"] == name and prof.meta["op_types"] == list(ARCH_OP_TYPES[name])
    assert prof.out_change.shape == (2, STEPS, 2, ops.num_layers, len(ops.op_types))
    has = np.zeros((ops.num_layers, len(ops.op_types)), bool)
    for layer, op in ops.ops:
        has[layer, ops.op_types.index(op)] = True
    for arr in (prof.out_change, prof.in_change):
        assert np.isnan(arr[:, 0]).all()
        assert np.isfinite(arr[:, 1:][..., has]).all() and np.isnan(arr[..., ~has]).all()
    assert np.isfinite(prof.out_abs[..., has]).all() and (prof.out_abs[..., has] > 0).all()
    assert prof.per_op("out_abs").shape == (2, STEPS, 2, len(ops.ops))
    back = Profile.load(prof.save(tmp_path))
    assert back.model_ops == ops and back.meta["shape"] == prof.meta["shape"]
    for a in ("out_change", "in_change", "out_abs", "in_abs"):
        assert np.array_equal(getattr(back, a), getattr(prof, a), equal_nan=True)


@EACH
def test_the_coda_search_runs_on_each_architecture(name):
    s = setup(name)
    ops = s.profile.model_ops
    coda = s.policies["coda"].schedule
    assert coda.model_ops() == ops and coda.ops_skipped_fraction() > 0
    for step in range(STEPS):                                  # whole steps, both branches
        assert coda.reused(step, "cond") == coda.reused(step, "uncond")
        assert coda.reused(step, "cond") in (frozenset(), frozenset(ops.ops))


# ---------------------------------------------------------------- every policy
def expected_reuse(name: str, policy, log: EventLog, ops) -> dict:
    """(step, branch, sample) -> the operators the policy says it reuses: a static policy's
    schedule; a dynamic one's rule applied to the signals the run measured (its monitors)."""
    samples = {(e.branch, e.sample) for e in log.of("op")}
    mon = {(m.step, m.branch, m.sample, (m.layer, m.op)): m.value for m in log.of("monitor")}
    # step DRA probes once per sample and step (the first branch that asks) for both branches
    joint = {(m.step, m.sample): m.value for m in log.of("monitor")}
    assert name != "coda+dra" or len(joint) == len(mon)
    out = {}
    if isinstance(policy, StaticPolicy):
        sched = policy.schedule_for(STEPS, ops)
        return {(s, b, j): sched.reused(s, b) for s in range(STEPS) for b, j in samples}
    for b, j in samples:
        acc = 0.0
        for s in range(STEPS):
            if name == "teacache":      # accumulate the rescaled change, reuse below threshold
                x = mon.get((s, b, j, ops.step_probe))
                skip = False
                if x is not None and 0 < s < STEPS - 1:
                    acc += max(0.0, float(np.polyval(policy.coeffs, x)))
                    skip = acc < policy.threshold
                acc = acc if skip else 0.0
                out[(s, b, j)] = frozenset(ops.ops[1:]) if skip else frozenset()
            elif name == "fbcache":     # the first block's output change below the threshold
                x = mon.get((s, b, j, ops.block_probe))
                skip = x is not None and x < policy.threshold
                out[(s, b, j)] = frozenset(r for r in ops.ops if r[0] != 0) if skip \
                    else frozenset()
            else:                       # coda+dra: the static schedule unless the probe fires
                sched = policy.inner.schedule_for(STEPS, ops)
                x = joint.get((s, j))
                fired = x is not None and x > policy.thresholds.thresholds[s]
                out[(s, b, j)] = frozenset() if fired else sched.reused(s, b)
    return out


@EVERY
def test_every_policy_runs_and_reuses_what_it_says(name, policy):
    s = setup(name)
    pol, ops = s.policies[policy], s.profile.model_ops
    out, stats, log = run(s.loop, pol)
    assert torch.isfinite(out).all() and stats["ops_reused"] > 0
    want = expected_reuse(policy, pol, log, ops)
    events = log.of("op")
    assert len(events) == STEPS * 2 * 2 * len(ops.ops)
    got = {}
    for e in events:
        got.setdefault((e.step, e.branch, e.sample), set())
        if e.reused:
            got[(e.step, e.branch, e.sample)].add(e.ref)
    assert got == {k: set(v) for k, v in want.items()}
    assert stats["ops_reused"] == stats["segment_ops"] == sum(len(v) for v in want.values())
    if policy in ("teacache", "fbcache", "coda+dra"):
        assert log.of("monitor")        # the signal was measured on the NMEs
    if policy == "coda+dra":
        assert pol.fired == sum(e.reason == "fallback" and e.ref == ops.step_probe
                                for e in events)
        # thresholds of 0: every probed step (the schedule reuses it, its input moved) falls
        # back to computing; the fallbacks are exactly the reuses the schedule had there
        table = dataclasses.replace(pol.thresholds, thresholds={
            t: 0.0 for t in pol.thresholds.thresholds})
        strict = StepDRAPolicy(pol.inner, table)
        _, stats0, log0 = run(s.loop, strict)
        sched = pol.inner.schedule_for(STEPS, ops)
        probed = [t for t in range(STEPS) if ops.step_probe in sched.reused(t, "cond")]
        assert strict.fired == len(probed) * 2 * 2 and stats0["ops_reused"] == 0
        assert sum(e.reason == "fallback" for e in log0.of("op")) == 2 * sum(   # 2 samples
            len(sched.reused(t, b)) for t in probed for b in BRANCHES)


@EVERY
def test_a_batch_gives_the_bits_of_its_videos_one_by_one(name, policy):
    s = setup(name)
    pol = s.policies[policy]
    both, _, log = run(s.loop, pol)
    for i, (label, seed) in enumerate(((0, SEED), (1, SEED + 1))):
        one, _, one_log = run(s.loop, pol, (label,), (seed,))
        assert torch.equal(both[i:i + 1], one), i
        mine = sorted((e.step, e.branch, e.index, e.reused) for e in log.of("op")
                      if e.sample == i)
        assert mine == sorted((e.step, e.branch, e.index, e.reused) for e in one_log.of("op"))


@EVERY
def test_cfg_branches_keep_their_own_state(name, policy):
    """Each branch's calls alone (cond, then uncond, as WanPipeline calls them) give the bits
    and decisions of the batched CFG call; every slot is written and read by its own branch."""
    s = setup(name)
    pol = s.policies[policy]
    batched, _, log = run(s.loop, pol)
    apart = dataclasses.replace(s.loop, cfg="separate")
    spy = SpyDriver(apart.transformer)
    separate, _, log2 = run(apart, pol, drv=spy)
    assert torch.equal(separate, batched)

    def decisions(lg):
        return sorted((e.step, e.branch, e.sample, e.index, e.reused) for e in lg.of("op"))
    assert decisions(log2) == decisions(log)
    assert spy.seen and all(context == branch for _, context, branch in spy.seen)
    assert {b for _, _, b in spy.seen} == set(BRANCHES)


# ---------------------------------------------------------------- the Verilated NMEs
@pytest.fixture(scope="module")
def rtl():
    from coda.host.nme.backend import get_backend

    with get_backend("rtl") as backend:
        yield backend


RTL_CASES = [("wan", "pab"), ("wan", "coda+dra"), ("cogvideox", "teacache"),
             ("cogvideox", "coda"), ("hunyuan_video", "fbcache"), ("hunyuan_video", "magcache")]


@pytest.mark.parametrize("name,policy", RTL_CASES)
def test_rtl_backend_gives_the_torch_bits_and_events(name, policy, rtl):
    s = setup(name)
    pol = s.policies[policy]
    expected, _, log = run(s.loop, pol)
    nmp = NMPDriver(rtl, CFG, ranks=2)
    got, stats, rtl_log = run(s.loop, pol, drv=nmp)
    assert torch.equal(got, expected)
    assert rtl_log.events == log.events
    assert stats["segments"] > 0 and nmp.stats["programs"] > 0
    if policy in ("teacache", "fbcache", "coda+dra"):
        assert rtl_log.of("monitor") and all(math.isfinite(m.value) for m in rtl_log.of("monitor"))
