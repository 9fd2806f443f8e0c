"""``coda.enable_cache`` / ``coda.disable_cache`` on real diffusers pipelines
(coda.host.cache.pipeline), end to end: tiny WanPipeline (Wan 2.1, and Wan 2.2 with two
experts), CogVideoXPipeline and LattePipeline built here from small random-weight components,
no download.

The environment has no ``transformers`` (the pipelines' text encoders and tokenizers): the
pipeline modules are imported with a stand-in ``transformers`` module that names the classes
their imports ask for, the pipelines are built with ``tokenizer=None, text_encoder=None``,
and every call passes prompt embeddings, so no text model is ever needed.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch

import coda
from coda.host.cache import pipeline as api
from coda.host.cache.arch.base import UnsupportedModelError, UntestedDiffusersWarning
from coda.host.cache.engine import (CodaCacheConfig, apply_coda_cache, get_coda_cache_hook,
                                    remove_coda_cache)
from coda.host.cache.policies import UniformIntervalPolicy
from coda.host.cache.policies.fbcache import FBCachePolicy
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.hw.nme.isa import NMEConfig
from tiny_pipelines import pipeline_class, wan_pipe, wan_pipeline_class, wan_transformer

STEPS = 6
#: Wan 2.2: 8 flow-matching steps (shift 3) have timesteps 1000 948 883 801 | 694 548 338 9;
#: boundary 0.75 * 1000 gives the high-noise expert steps 0-3, the low-noise one steps 4-7
STEPS_22, SWITCH = 8, 4


# ---------------------------------------------------------------- the pipelines, offline
@pytest.fixture(scope="module")
def wan_pipeline_cls():
    return wan_pipeline_class()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _prompts(batch: int = 1, dim: int = 16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, 6, dim, generator=g), torch.randn(batch, 6, dim, generator=g)


def run_wan(pipe, steps: int = STEPS, batch: int = 1, output_type: str = "latent", **kw):
    cond, uncond = _prompts(batch)
    return pipe(prompt_embeds=cond, negative_prompt_embeds=uncond, height=32, width=32,
                num_frames=5, num_inference_steps=steps, guidance_scale=5.0,
                generator=torch.Generator().manual_seed(1), output_type=output_type,
                **kw).frames


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ---------------------------------------------------------------- the package entry
def test_import_coda_stays_cheap_and_exports_the_api():
    code = ("import sys, coda; assert 'torch' not in sys.modules, 'import coda loaded torch'; "
            "assert {'enable_cache', 'disable_cache'} <= set(dir(coda))")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert coda.enable_cache is api.enable_cache and coda.disable_cache is api.disable_cache
    with pytest.raises(AttributeError, match="no attribute 'enable_cachee'"):
        coda.enable_cachee


# ---------------------------------------------------------------- Wan 2.1
@pytest.mark.parametrize("policy", ["uniform", "pab"])
@pytest.mark.parametrize("backend", ["device", "nmp"])
def test_wan_pipeline_policy_backend_and_disable_restores_the_bits(wan_pipeline_cls, policy,
                                                                   backend):
    """One call on the pipeline: the run reuses operators (summary from the events), the
    cache is where the backend says; disable_cache gives the decoded video of a pipeline
    that was never hooked, bit for bit."""
    never = run_wan(wan_pipe(wan_pipeline_cls), output_type="pt")
    pipe = wan_pipe(wan_pipeline_cls)
    params = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    handle = coda.enable_cache(pipe, policy, backend=backend, skip=0.5)
    cached = run_wan(pipe, output_type="pt")
    s = handle.summary()
    assert s["ops_skipped_fraction"] > 0 and s["ops_reused"] > 0 and s["segments"] > 0
    assert s["backend"] == backend and s["cache"] == "reuse"
    assert s["stored_bytes"] > 0
    assert (s["pcie_bytes"] > 0) == (backend == "nmp")
    assert list(s["experts"]) == ["transformer"]
    assert s["experts"]["transformer"]["first_step"] == 0
    assert s["experts"]["transformer"]["steps"] == STEPS
    assert s["experts"]["transformer"]["policy"]["name"] == policy
    assert s["modelled_latency_s"] is None and "system model" in s["modelled_latency"]
    assert torch.isfinite(cached).all() and not _same(cached, never)
    assert coda.disable_cache(pipe) is True
    assert get_coda_cache_hook(pipe.transformer) is None
    assert all(torch.equal(v, params[k]) for k, v in pipe.transformer.state_dict().items())
    assert _same(run_wan(pipe, output_type="pt"), never)
    assert coda.disable_cache(pipe) is False


def test_device_and_nmp_backends_give_the_same_bits_and_counts(wan_pipeline_cls):
    runs = {}
    for backend in ("device", "nmp"):
        pipe = wan_pipe(wan_pipeline_cls)
        handle = coda.enable_cache(pipe, "uniform", backend=backend, skip=0.5)
        runs[backend] = (run_wan(pipe), handle.summary())
    (dev, s_dev), (nmp, s_nmp) = runs["device"], runs["nmp"]
    assert _same(dev, nmp)
    for key in ("ops_reused", "ops_computed", "segments", "stores", "stored_bytes"):
        assert s_dev[key] == s_nmp[key]


def test_a_policy_object_and_a_second_run(wan_pipeline_cls):
    """A typed policy object (the policies are dataclasses) instead of a name; the summary
    is of the last run, ``all_generations`` of every run."""
    pipe = wan_pipe(wan_pipeline_cls)
    policy = UniformIntervalPolicy(intervals={"cross_attn": 3}, default_interval=2, warmup=2)
    handle = coda.enable_cache(pipe, policy, backend="nmp")
    assert handle.hooks["transformer"].policy is policy
    first = run_wan(pipe)
    one = handle.summary()
    assert _same(run_wan(pipe), first)
    assert handle.summary() == one
    both = handle.summary(all_generations=True)
    assert both["ops_reused"] == 2 * one["ops_reused"] > 0
    assert handle.hooks["transformer"].events.generations == 2


def test_reusing_nothing_gives_the_unhooked_bits_and_the_self_check_passes(wan_pipeline_cls):
    never = run_wan(wan_pipe(wan_pipeline_cls, two_experts=True), steps=STEPS_22)
    pipe = wan_pipe(wan_pipeline_cls, two_experts=True)
    handle = coda.enable_cache(pipe, UniformIntervalPolicy(default_interval=1, warmup=1),
                               self_check=True)
    assert _same(run_wan(pipe, steps=STEPS_22), never)
    assert handle.summary()["self_checked"] == {"transformer": True, "transformer_2": True}
    assert handle.summary()["ops_reused"] == 0


def test_forecast_mode_through_enable_cache(wan_pipeline_cls):
    """``cache="forecast"`` with a table made for the policy's schedule: the reused operators
    extrapolate (other bits than plain reuse, the same operators reused)."""
    from coda.host.cache.arch import model_ops
    from coda.host.cache.forecast import ForecastTable

    pipe = wan_pipe(wan_pipeline_cls)
    ops = model_ops(pipe.transformer)
    policy = api.SkipTargetPolicy("uniform", 0.5)
    schedule = policy.schedule_for(STEPS, ops)
    table = ForecastTable({s: {op: 0.5 for op in ops.op_types} for s in range(STEPS)}, STEPS,
                          "tiny-wan", schedule.digest())
    runs = {}
    for cache in ("reuse", "forecast"):
        handle = coda.enable_cache(pipe, api.SkipTargetPolicy("uniform", 0.5), cache=cache,
                                   forecast=table if cache == "forecast" else None)
        runs[cache] = (run_wan(pipe), handle.summary())
        coda.disable_cache(pipe)
    (reuse, s_reuse), (forecast, s_forecast) = runs["reuse"], runs["forecast"]
    assert s_forecast["cache"] == "forecast" and s_forecast["ops_reused"] == s_reuse["ops_reused"]
    assert s_reuse["ops_skipped_fraction"] == pytest.approx(schedule.ops_skipped_fraction())
    assert torch.isfinite(forecast).all() and not _same(forecast, reuse)


# ---------------------------------------------------------------- Wan 2.2: two experts
@pytest.mark.parametrize("policy, kw", [("uniform", {"skip": 0.5}), ("pab", {"skip": 0.5}),
                                        ("fbcache", {"threshold": 0.5})])
@pytest.mark.parametrize("backend", ["device", "nmp"])
def test_wan22_both_experts_each_with_its_own_cache_across_the_boundary(wan_pipeline_cls,
                                                                        policy, kw, backend):
    """Both experts hooked, each with its own policy and cache state: the low-noise expert
    starts its generation at the boundary step (its step 0, its own warmup), the high-noise
    one's slots are freed there; decisions per sample (two prompts in one batch)."""
    pipe = wan_pipe(wan_pipeline_cls, two_experts=True)
    handle = coda.enable_cache(pipe, policy, backend=backend, **kw)
    high, low = handle.hooks["transformer"], handle.hooks["transformer_2"]
    assert get_coda_cache_hook(pipe.transformer) is high
    assert get_coda_cache_hook(pipe.transformer_2) is low
    assert high.policy is not low.policy and high.state is not low.state
    held = {}

    def on_step(p, i, t, kwargs):      # which expert holds cache slots after step i
        keys = handle.driver.keys()
        held[i] = {name for name, hook in handle.hooks.items()
                   if any(k[0] == hook._tag for k in keys)}
        return {}
    out = run_wan(pipe, steps=STEPS_22, batch=2, callback_on_step_end=on_step)
    assert torch.isfinite(out).all()
    s = handle.summary()
    e1, e2 = s["experts"]["transformer"], s["experts"]["transformer_2"]
    assert (e1["first_step"], e1["steps"]) == (0, SWITCH)
    assert (e2["first_step"], e2["steps"]) == (SWITCH, STEPS_22 - SWITCH)
    assert s["ops_reused"] == e1["ops_reused"] + e2["ops_reused"]
    if policy != "fbcache":    # static: both reuse after their own warmup
        assert e1["ops_reused"] > 0 and e2["ops_reused"] > 0
    assert s["ops_skipped_fraction"] > 0
    # each expert's events: its own generation, steps from its first call, both samples
    ops2 = low.events.of("op", low.events.generations - 1)
    assert {e.step for e in ops2} == set(range(STEPS_22 - SWITCH))
    assert {e.num_steps for e in ops2} == {STEPS_22 - SWITCH}
    assert {(e.branch, e.sample) for e in ops2} == {(b, j) for b in ("cond", "uncond")
                                                    for j in (0, 1)}
    assert {e.num_steps for e in high.events.of("op")} == {STEPS_22}
    # the high-noise expert's slots are freed when the pipeline switches experts
    assert "transformer_2" not in held[SWITCH - 1]
    assert all("transformer" not in held[i] for i in range(SWITCH, STEPS_22))
    # the next run starts over: both experts again, the same counters
    assert _same(run_wan(pipe, steps=STEPS_22, batch=2), out)
    again = handle.summary()
    assert again["experts"] == s["experts"]


def test_an_expert_joining_mid_loop_is_configured_in_the_engine():
    """The engine itself: without ``joins_mid_loop`` a first call at step k > 0 is refused as
    before (a single transformer keeps its checks); with it, the call starts a generation
    at k, the steps after follow in order, a call at k again starts over, a skipped step is
    refused."""
    model = wan_transformer(3)
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 4, 2, 8, 8, generator=g), torch.randn(1, 6, 16, generator=g)

    def call(step, n=8):
        with model.cache_context("cond", step_index=step, num_inference_steps=n):
            model(hidden_states=x, timestep=torch.tensor([900 - 100 * step]),
                  encoder_hidden_states=text)

    driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
    apply_coda_cache(model, CodaCacheConfig(driver, UniformIntervalPolicy(warmup=1)))
    with pytest.raises(ValueError, match="step 4 without a generation.*joins_mid_loop=True"):
        call(4)
    remove_coda_cache(model)
    hook = apply_coda_cache(model, CodaCacheConfig(driver, UniformIntervalPolicy(warmup=1),
                                                   joins_mid_loop=True))
    for step in (4, 5, 6):
        call(step)
    assert hook.state.first_step == 4 and hook.state.num_steps == 4
    assert [e.step for e in hook.events.of("op", 0)][::6] == [0, 1, 2]
    assert any(e.reused for e in hook.events.of("op", 0))
    call(4)                                   # the loop started again at the boundary
    assert hook.events.generations == 2 and hook.state.first_step == 4
    with pytest.raises(ValueError, match="branch cond: step 2 after step 0"):
        call(6)
    call(0)                                   # a generation from step 0 is as before
    assert hook.state.first_step == 0 and hook.state.num_steps == 8


def test_the_rtl_nmes_give_the_torch_backend_bits_and_events(wan_pipeline_cls):
    """Wan 2.2's two experts on the Verilated NMEs (a driver object as the backend): the
    bits and the events, cycles included, of the NMEs' torch backend."""
    from coda.host.nme.backend import get_backend

    cfg = NMEConfig(lanes=8, mem_words=1 << 19)      # test_run.py's build too (tests/experiments)
    pipe = wan_pipe(wan_pipeline_cls, two_experts=True)
    reference = coda.enable_cache(pipe, "uniform", skip=0.5,
                                  backend=NMPDriver(TorchBackend(), cfg, ranks=2))
    expected = run_wan(pipe, steps=STEPS_22)
    coda.disable_cache(pipe)
    with get_backend("rtl") as backend:
        driver = NMPDriver(backend, cfg, ranks=2)
        handle = coda.enable_cache(pipe, "uniform", skip=0.5, backend=driver)
        got = run_wan(pipe, steps=STEPS_22)
    assert _same(got, expected)
    for name in ("transformer", "transformer_2"):
        assert handle.hooks[name].events.events == reference.hooks[name].events.events
    s = handle.summary()
    assert s["backend"] == "NMPDriver" and s["nme_cycles"] > 0
    assert s["experts"]["transformer_2"]["ops_reused"] > 0
    assert driver.stats["async_launches"] > 0


# ---------------------------------------------------------------- other pipeline classes
def test_cogvideox_pipeline_without_step_index_in_its_context():
    """diffusers 0.42's CogVideoXPipeline batches both branches as ``"cond_uncond"`` and gives
    neither step_index nor num_inference_steps: the step count comes from its scheduler."""
    from diffusers import (AutoencoderKLCogVideoX, CogVideoXDDIMScheduler,
                           CogVideoXTransformer3DModel)

    cls = pipeline_class("diffusers.pipelines.cogvideo.pipeline_cogvideox", "CogVideoXPipeline",
                          ("T5EncoderModel", "T5Tokenizer"), ("CogVideoXLoraLoaderMixin",))

    def build():
        torch.manual_seed(0)
        vae = AutoencoderKLCogVideoX(block_out_channels=(8, 8, 8, 8), latent_channels=4,
                                     layers_per_block=1, norm_num_groups=2,
                                     temporal_compression_ratio=4).eval()
        transformer = CogVideoXTransformer3DModel(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
            time_embed_dim=32, text_embed_dim=16, num_layers=2, sample_width=8, sample_height=8,
            sample_frames=9, patch_size=2, max_text_seq_length=6,
            temporal_compression_ratio=4).eval()
        pipe = cls(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                   scheduler=CogVideoXDDIMScheduler())
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def run(pipe, steps=STEPS):
        cond, uncond = _prompts()
        return pipe(prompt_embeds=cond, negative_prompt_embeds=uncond, height=32, width=32,
                    num_frames=5, num_inference_steps=steps, guidance_scale=5.0,
                    max_sequence_length=6, generator=torch.Generator().manual_seed(1),
                    output_type="pt").frames

    never = run(build())
    pipe = build()
    handle = coda.enable_cache(pipe, "uniform", backend="nmp", skip=0.5)
    cached = run(pipe)
    s = handle.summary()
    assert s["ops_reused"] > 0 and s["experts"]["transformer"]["steps"] == STEPS
    assert torch.isfinite(cached).all() and not _same(cached, never)
    run(pipe, steps=STEPS - 1)                 # another step count: calibrated for it
    assert handle.summary()["experts"]["transformer"]["steps"] == STEPS - 1
    coda.disable_cache(pipe)
    assert _same(run(pipe), never)


def test_latte_pipeline_that_sets_no_cache_context():
    """diffusers 0.42's LattePipeline calls its transformer without a cache context: the
    handle gives one (both CFG branches batched)."""
    from diffusers import AutoencoderKL, DDIMScheduler, LatteTransformer3DModel

    cls = pipeline_class("diffusers.pipelines.latte.pipeline_latte", "LattePipeline",
                          ("T5EncoderModel", "T5Tokenizer"))

    def build():
        torch.manual_seed(0)
        vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=2, latent_channels=4,
                            down_block_types=("DownEncoderBlock2D",),
                            up_block_types=("UpDecoderBlock2D",)).eval()
        transformer = LatteTransformer3DModel(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
            num_layers=2, cross_attention_dim=32, attention_bias=True, sample_size=8,
            patch_size=2, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
            norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
            caption_channels=16, video_length=4).eval()
        pipe = cls(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                   scheduler=DDIMScheduler())
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def run(pipe):
        cond, uncond = _prompts()
        return pipe(prompt_embeds=cond, negative_prompt_embeds=uncond, negative_prompt=None,
                    height=8, width=8, video_length=4, num_inference_steps=STEPS,
                    guidance_scale=5.0, mask_feature=False,
                    generator=torch.Generator().manual_seed(1), output_type="pt").frames

    never = run(build())
    pipe = build()
    handle = coda.enable_cache(pipe, "pab", backend="device", skip=0.5)
    cached = run(pipe)
    s = handle.summary()
    assert s["ops_reused"] > 0 and s["experts"]["transformer"]["steps"] == STEPS
    branches = {e.branch for e in handle.hooks["transformer"].events.of("op")}
    assert branches == {"cond", "uncond"}
    assert torch.isfinite(cached).all() and not _same(cached, never)
    coda.disable_cache(pipe)
    assert _same(run(pipe), never)


def test_a_bare_transformer_takes_the_cache_too():
    model = wan_transformer(3)
    handle = coda.enable_cache(model, "uniform", backend="nmp")
    assert get_coda_cache_hook(model) is handle.hooks["transformer"]
    assert handle.summary()["experts"] == {"transformer": None}
    assert coda.disable_cache(model) and get_coda_cache_hook(model) is None


# ---------------------------------------------------------------- version robustness
def test_an_untested_diffusers_warns_and_the_first_call_checks_the_bits(wan_pipeline_cls,
                                                                        monkeypatch):
    """Another diffusers version is served with a warning; each transformer's first call is
    checked against the unhooked forward. Block code that no longer computes what the adapter
    replays (here: a block whose output is shifted) is refused there."""
    import diffusers
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    monkeypatch.setattr(diffusers, "__version__", "0.99.0")
    never = run_wan(wan_pipe(wan_pipeline_cls))
    pipe = wan_pipe(wan_pipeline_cls)
    with pytest.warns(UntestedDiffusersWarning, match="0.99.0"):
        handle = coda.enable_cache(pipe, "uniform", skip=0.5)
    assert handle.self_check
    run_wan(pipe)
    assert handle.self_checked == {"transformer": True}
    coda.disable_cache(pipe)
    assert _same(run_wan(pipe), never)

    forward = WanTransformerBlock.forward

    @functools.wraps(forward)
    def shifted(self, *args, **kwargs):
        return forward(self, *args, **kwargs) + 1e-3
    monkeypatch.setattr(WanTransformerBlock, "forward", shifted)
    pipe = wan_pipe(wan_pipeline_cls)
    with pytest.warns(UntestedDiffusersWarning):
        handle = coda.enable_cache(pipe, "uniform", skip=0.5)
    with pytest.raises(UnsupportedModelError, match="differs from the model's own forward"):
        run_wan(pipe)
    assert handle.driver.keys() == []          # the generation was ended, its slots freed


def test_the_tested_diffusers_runs_no_self_check_unless_asked(wan_pipeline_cls):
    """On the pinned diffusers no self-check runs by default; on another release (``make
    compat``) it runs on the first call and passes."""
    import diffusers

    from coda.host.cache.arch.base import TESTED_DIFFUSERS

    pipe = wan_pipe(wan_pipeline_cls)
    handle = coda.enable_cache(pipe, "uniform")
    run_wan(pipe)
    if diffusers.__version__ == TESTED_DIFFUSERS:
        assert not handle.self_check and handle.self_checked == {}
    else:
        assert handle.self_check and handle.self_checked == {"transformer": True}


# ---------------------------------------------------------------- calibration on first use
@pytest.mark.parametrize("policy", ["teacache", "lemica"])
def test_calibrate_on_first_use_is_the_explicit_profile_path(wan_pipeline_cls, policy,
                                                             tmp_path):
    """calibrate=True: the first run computes everything (the unhooked bits) while it is
    profiled, the second reuses; the saved profile, passed as profile= to a fresh
    enable_cache, builds the same policy and gives the same bits and counters."""
    import numpy as np

    from coda.host.cache.profile import ARRAYS, Profile

    pipe = wan_pipe(wan_pipeline_cls)
    plain = run_wan(pipe)
    handle = coda.enable_cache(pipe, policy, skip=0.4, calibrate=True, profile_path=tmp_path)
    assert handle.profiles == {}
    assert _same(run_wan(pipe), plain)
    assert handle.summary()["ops_reused"] == 0
    prof = handle.profiles["transformer"]
    assert prof.num_steps == STEPS and prof.out_change.shape[0] == 1
    assert np.isfinite(prof.per_op("out_change")[:, 1:]).all()
    second = run_wan(pipe)
    counts = handle.summary()
    assert counts["ops_reused"] > 0
    built = handle.hooks["transformer"].policy
    coda.disable_cache(pipe)
    loaded = Profile.load(tmp_path / "profile.npz")
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(loaded, name), getattr(prof, name))
    explicit = coda.enable_cache(pipe, policy, skip=0.4, profile=loaded)
    assert explicit.hooks["transformer"].policy.describe() == built.describe()
    assert _same(run_wan(pipe), second)
    assert explicit.summary()["ops_reused"] == counts["ops_reused"]


def test_calibrate_on_first_use_gives_each_wan22_expert_its_own_profile(wan_pipeline_cls,
                                                                       tmp_path):
    pipe = wan_pipe(wan_pipeline_cls, two_experts=True)
    handle = coda.enable_cache(pipe, "magcache", skip=0.3, calibrate=True,
                               profile_path=tmp_path)
    run_wan(pipe, steps=STEPS_22)
    assert handle.summary()["ops_reused"] == 0
    assert {n: p.num_steps for n, p in handle.profiles.items()} == {
        "transformer": SWITCH, "transformer_2": STEPS_22 - SWITCH}
    assert (tmp_path / "transformer" / "profile.npz").is_file()
    assert (tmp_path / "transformer_2" / "profile.npz").is_file()
    run_wan(pipe, steps=STEPS_22)
    assert handle.summary()["ops_reused"] > 0
    # the high-noise expert's generations are the loop's 8 steps, cut at the boundary: its
    # schedule reuses nothing in the steps it never runs
    high = handle.hooks["transformer"]
    sched = high.policy.schedule_for(STEPS_22, high.model_ops)
    assert sched.num_steps == STEPS_22
    assert not any(sched.reuse.get((s, b)) for s in range(SWITCH, STEPS_22)
                   for b in ("cond", "uncond"))


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("kwargs, error, match", [
    ({"policy": "fastcache"}, ValueError, "unknown policy 'fastcache': expected one of uniform"),
    ({"policy": "teacache", "skip": 0.5}, ValueError,
     "policy 'teacache' needs profile=: a profile of this model, or calibrate=True"),
    ({"policy": "uniform", "calibrate": True}, ValueError,
     "calibrate=True with policy 'uniform': expected one calibrated on a profile"),
    ({"policy": "coda", "calibrate": True}, ValueError,
     "calibrate=True with policy 'coda': .*coda schedule search"),
    ({"policy": "teacache", "calibrate": True}, ValueError,
     "calibrate=True with policy 'teacache': expected skip= .* or threshold="),
    ({"policy": "lemica", "calibrate": True, "threshold": 0.1}, ValueError,
     r"policy 'lemica': unknown parameters \['threshold'\]; expected none"),
    ({"policy": "teacache", "skip": 0.5, "calibrate": True, "profile": "p.npz"}, ValueError,
     "calibrate=True and profile= are alternatives"),
    ({"policy": "teacache", "skip": 0.5, "calibrate": "yes"}, ValueError,
     "calibrate='yes': expected True or False"),
    ({"policy": "uniform", "profile_path": "build/p"}, ValueError,
     "profile_path='build/p': a calibrate=True option"),
    ({"policy": "fbcache", "threshold": 0.1, "calibrate": True}, ValueError,
     "fbcache and threshold=: that policy needs no profile"),
    ({"policy": "magcache", "profile": "build/profile/profile.npz"}, ValueError,
     "profile='build/profile/profile.npz': pass the loaded profile, .*Profile.load"),
    ({"policy": "coda"}, ValueError, "policy 'coda' needs schedule=: the Schedule searched"),
    ({"policy": "uniform", "skip": 1.5}, ValueError, r"skip=1.5: expected a fraction .* \(0, 1\)"),
    ({"policy": "uniform", "skip": 0.5, "interval": 3}, ValueError,
     r"skip and \['interval'\] are alternatives"),
    ({"policy": UniformIntervalPolicy(), "skip": 0.5}, ValueError,
     "go with a policy by name; got a UniformIntervalPolicy"),
    ({"policy": 3}, TypeError, "expected a CachePolicy"),
    ({"policy": "uniform", "interval": 2, "window": 1}, ValueError,
     r"policy 'uniform': unknown parameters \['window'\]"),
    ({"backend": "gpu"}, ValueError, "backend='gpu': expected one of device, nmp or a driver"),
    ({"backend": object()}, TypeError, "expected device, nmp or a driver with store"),
    ({"cache": "taylor"}, ValueError, "cache='taylor': expected one of reuse, forecast"),
    ({"cache": "forecast"}, ValueError, "cache='forecast' needs forecast=ForecastTable"),
    ({"policy": {"transformer_2": "uniform"}}, ValueError,
     "policy: a mapping without 'transformer'"),
])
def test_bad_arguments_are_refused_before_anything_is_hooked(wan_pipeline_cls, kwargs, error,
                                                             match):
    pipe = wan_pipe(wan_pipeline_cls)
    with pytest.raises(error, match=match):
        coda.enable_cache(pipe, **kwargs)
    assert get_coda_cache_hook(pipe.transformer) is None
    assert getattr(pipe, "_coda_cache", None) is None


def test_what_is_not_a_pipeline_or_is_hooked_already_is_refused(wan_pipeline_cls):
    with pytest.raises(ValueError, match="expected a diffusers pipeline with a transformer"):
        coda.enable_cache(object())
    with pytest.raises(UnsupportedModelError, match="Linear"):
        coda.enable_cache(torch.nn.Linear(2, 2))
    pipe = wan_pipe(wan_pipeline_cls)
    coda.enable_cache(pipe)
    with pytest.raises(ValueError, match="already has the CODA cache: call coda.disable_cache"):
        coda.enable_cache(pipe)
    coda.disable_cache(pipe)
    apply_coda_cache(pipe.transformer, CodaCacheConfig(api._driver("device")[0]))
    with pytest.raises(ValueError, match="transformer already has a CODA cache hook"):
        coda.enable_cache(pipe)


def test_a_second_expert_too_short_to_reuse_computes_everything(wan_pipeline_cls):
    """A skip target on an expert with fewer than 3 steps of its own (a short loop) reuses
    nothing there instead of failing mid-pipeline."""
    pipe = wan_pipe(wan_pipeline_cls, two_experts=True)
    handle = coda.enable_cache(pipe, "uniform", skip=0.5)
    run_wan(pipe, steps=5)       # 1000 900 751 | 503 9: the low-noise expert runs 2
    s = handle.summary()
    assert s["experts"]["transformer_2"]["steps"] == 2
    assert s["experts"]["transformer_2"]["ops_reused"] == 0
    assert s["experts"]["transformer"]["steps"] == 3


def test_fbcache_instance_is_copied_for_the_second_expert(wan_pipeline_cls):
    pipe = wan_pipe(wan_pipeline_cls, two_experts=True)
    policy = FBCachePolicy(0.5)
    handle = coda.enable_cache(pipe, policy)
    assert handle.hooks["transformer"].policy is policy
    second = handle.hooks["transformer_2"].policy
    assert isinstance(second, FBCachePolicy) and second is not policy
