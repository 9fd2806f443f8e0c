"""The cache engine on the four diffusers video transformers it serves (coda.host.cache.arch): the same
battery for each, on small random-initialised configurations, with the real NMPDriver.

Where a test compares a batch with single samples or batched CFG with separate calls, the model
is made batch-invariant first (:func:`batch_invariant`): torch's CPU kernels round some small
per-sample computations (a GEMM of 1..3 rows, a 3-D convolution, an activation over a few
elements) differently with the batch size, in the unhooked model as much as in the hooked one;
the engine must not add a dependence of its own (the shipped digit model does the same,
coda.host.model.dit._batch_invariant_conditioning).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from coda.host.cache.arch import ARCHITECTURES, UnsupportedModelError, get_architecture, model_ops
from coda.host.nme.backend import TorchBackend
from coda.host.cache.engine import (CodaCacheConfig, apply_coda_cache, get_coda_cache_hook,
                                    remove_coda_cache)
from coda.host.nmp.driver import NMPDriver
from coda.host.cache.events import EventLog
from coda.host.cache.policies import UniformIntervalPolicy
from coda.host.cache.schedule import ModelOps, Schedule, ScheduleError, segment_runs
from coda.hw.nme.isa import NMEConfig
from reference_driver import TorchSegmentDriver

STEPS = 5
BRANCHES = ("cond", "uncond")


# ---------------------------------------------------------------- the four models
@dataclasses.dataclass
class Arch:
    name: str
    build: callable          # () -> model (seeded)
    sample: callable         # (generator, frames, size) -> (cond kwargs, uncond kwargs), batch 1
    frames: tuple[int, int]  # (default, the other size of the size-change test)
    size: tuple[int, int]
    streams: int             # residual streams (video [+ text])
    frame_dim: int = 2       # where the frames are in hidden_states


def _latte():
    from diffusers import LatteTransformer3DModel
    return LatteTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=2,
        cross_attention_dim=32, attention_bias=True, sample_size=8, patch_size=2,
        activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        norm_elementwise_affine=False, norm_eps=1e-6, caption_channels=16, video_length=4)


def _cogvideox():
    from diffusers import CogVideoXTransformer3DModel
    return CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        time_embed_dim=32, text_embed_dim=16, num_layers=2, sample_width=8, sample_height=8,
        sample_frames=9, patch_size=2, max_text_seq_length=6, temporal_compression_ratio=4)


def _wan():
    from diffusers import WanTransformer3DModel
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=32)


def _hunyuan():
    from diffusers import HunyuanVideoTransformer3DModel
    return HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
        num_single_layers=2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
        guidance_embeds=False, text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(4, 6, 6))


def _text(g, n=6, d=16):
    return torch.randn(1, n, d, generator=g)


def _video(g, frames, size, frames_first=False):
    shape = (1, frames, 4, size, size) if frames_first else (1, 4, frames, size, size)
    return {"hidden_states": torch.randn(shape, generator=g)}


def _hunyuan_sample(g, frames, size):
    def cond():
        mask = torch.ones(1, 6, dtype=torch.long)
        mask[0, 6 - int(torch.randint(0, 3, (1,), generator=g)):] = 0     # padded prompts
        return {"encoder_hidden_states": _text(g), "encoder_attention_mask": mask,
                "pooled_projections": torch.randn(1, 8, generator=g)}
    return {**_video(g, frames, size), **cond()}, cond()


ARCHS = {
    "latte": Arch("latte", _latte,
                  lambda g, f, s: ({**_video(g, f, s), "encoder_hidden_states": _text(g)},
                                   {"encoder_hidden_states": _text(g)}),
                  (4, 1), (8, 4), 1),
    "cogvideox": Arch("cogvideox", _cogvideox,
                      lambda g, f, s: ({**_video(g, f, s, True), "encoder_hidden_states": _text(g)},
                                       {"encoder_hidden_states": _text(g)}),
                      (3, 2), (8, 4), 2, frame_dim=1),
    "wan": Arch("wan", _wan,
                lambda g, f, s: ({**_video(g, f, s), "encoder_hidden_states": _text(g)},
                                 {"encoder_hidden_states": _text(g)}),
                (3, 1), (8, 4), 1),
    "hunyuan_video": Arch("hunyuan_video", _hunyuan, _hunyuan_sample, (3, 1), (8, 4), 2),
}


def build(arch: Arch, invariant: bool = False):
    torch.manual_seed(1)
    model = arch.build().eval()
    return batch_invariant(model) if invariant else model


def batch_invariant(model):
    """Per-sample linears (2-D inputs) and convolutions evaluated one sample at a time (the
    same weights): a sample's result no longer depends on its batch."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            def linear(x, mod=mod):
                if x.dim() != 2:
                    return F.linear(x, mod.weight, mod.bias)
                return torch.cat([F.linear(x[i:i + 1], mod.weight, mod.bias) for i in range(len(x))])
            mod.forward = linear
        elif isinstance(mod, (torch.nn.Conv2d, torch.nn.Conv3d)):
            def conv(x, mod=mod, f=type(mod).forward):
                return torch.cat([f(mod, x[i:i + 1]) for i in range(len(x))])
            mod.forward = conv
    return model


@torch.no_grad()
def generate(model, arch: Arch, seeds=(0,), *, steps=STEPS, mode="batched", frames=None,
             size=None):
    """A CFG loop like diffusers' pipelines: each step calls the transformer under
    ``cache_context`` ("uncond|cond" batched, or "cond" then "uncond" with step_index, sigma
    and num_inference_steps as WanPipeline 0.42 passes them). Returns all steps' latents."""
    frames, size = frames or arch.frames[0], size or arch.size[0]
    draws = [arch.sample(torch.Generator().manual_seed(1000 + s), frames, size) for s in seeds]
    cond = {k: torch.cat([d[0][k] for d in draws]) for k in draws[0][0]}
    uncond = {k: torch.cat([d[1][k] for d in draws]) for k in draws[0][1]}
    x, n, out = cond.pop("hidden_states"), len(seeds), []
    for i in range(steps):
        t = torch.full((n,), 900 - 170 * i, dtype=torch.long)
        ctx = dict(step_index=i, num_inference_steps=steps, sigma=1.0 - i / steps)
        if mode == "batched":
            kw = {k: torch.cat([uncond[k], cond[k]]) for k in cond}
            with model.cache_context("uncond|cond", **ctx):
                u, c = model(hidden_states=torch.cat([x, x]), timestep=torch.cat([t, t]), **kw,
                             return_dict=False)[0].chunk(2)
        else:
            with model.cache_context("cond", **ctx):
                c = model(hidden_states=x, timestep=t, **cond, return_dict=False)[0]
            with model.cache_context("uncond", **ctx):
                u = model(hidden_states=x, timestep=t, **uncond, return_dict=False)[0]
        x = x - 0.1 * (u + 3.0 * (c - u))
        out.append(x)
    return torch.stack(out)


def nmp_driver(mem_words=1 << 15):
    return NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=mem_words), ranks=2)


def policy_for(arch: Arch):
    """Uniform: every other step, the first op type of the first block every third."""
    spec = next(a for a in ARCHITECTURES.values() if a.name == arch.name).block_lists[0][1]
    return UniformIntervalPolicy(intervals={spec.ops[0]: 3}, default_interval=2, warmup=1)


def cached(model, driver, policy):
    remove_coda_cache(model)
    return apply_coda_cache(model, CodaCacheConfig(driver, policy))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


ALL = pytest.mark.parametrize("name", list(ARCHS))


# ---------------------------------------------------------------- exactness
@ALL
def test_reusing_nothing_is_bit_identical_to_the_unhooked_model(name):
    arch = ARCHS[name]
    model = build(arch)
    plain = {m: generate(model, arch, (0, 1), mode=m) for m in ("batched", "separate")}
    ops = model_ops(model)
    hook = cached(model, nmp_driver(), Schedule(STEPS, ops.num_layers, ops=ops))
    for mode, expected in plain.items():
        assert torch.equal(generate(model, arch, (0, 1), mode=mode), expected), mode
    assert hook.stats["ops_reused"] == 0 and hook.stats["segments"] == 0
    assert hook.stats["ops_computed"] == STEPS * 2 * 2 * len(ops.ops)
    remove_coda_cache(model)       # unhooked again: its own forward, same bits
    assert torch.equal(generate(model, arch, (0, 1)), plain["batched"])


@ALL
def test_uniform_schedule_reuses_what_it_says_with_segments_on_the_nme(name):
    arch = ARCHS[name]
    model = build(arch)
    policy = policy_for(arch)
    plain = generate(model, arch, (0, 1))
    hook = cached(model, nmp_driver(), policy)
    on_nmp = generate(model, arch, (0, 1))
    stats, ops = dict(hook.stats), hook.model_ops
    sched = policy.build_for(STEPS, ops)
    cached(model, TorchSegmentDriver(), policy)
    assert torch.equal(generate(model, arch, (0, 1)), on_nmp)   # NMPDriver == ops.segment
    assert not torch.equal(on_nmp, plain)                         # reuse changed the result

    op_events, segs = hook.events.of("op"), hook.events.of("segment")
    assert len(op_events) == STEPS * 2 * 2 * len(ops.ops)        # steps x branches x samples
    for e in op_events:
        assert e.reused == (e.ref in sched.reused(e.step, e.branch)), e
        assert ops.ops[e.index] == e.ref
    frames = arch.frames[0]
    for step in range(STEPS):
        for branch in BRANCHES:
            runs = segment_runs(sched.reused(step, branch), ops.num_layers, frames, ops)
            for sample in (0, 1):
                got = [list(s.ops) for s in segs if (s.step, s.branch, s.sample) == (step, branch, sample)]
                assert got == runs, (step, branch, sample)
    assert segs and all(s.programs == arch.streams and s.nme_cycles > 0 for s in segs)
    assert all(len(s.stream_tokens) == (arch.streams if arch.streams > 1 else 0) for s in segs)
    assert stats["ops_reused"] == stats["segment_ops"] == 2 * sum(
        len(sched.reused(s, b)) for s in range(STEPS) for b in BRANCHES)
    if name != "latte":     # no barrier: some segment runs across a block boundary
        assert any(len({layer for layer, _ in s.ops}) > 1 for s in segs)
    assert EventLog.from_jsonl(hook.events.to_jsonl()).events == hook.events.events


@ALL
def test_reusing_an_unchanged_step_reproduces_it_to_the_cache_precision(name):
    """Gates and residuals right: step 1 repeats step 0's inputs and reuses every operator, so
    what each block adds to each residual stream (video and text) is step 0's up to the bf16
    rounding of the stream and the cache, and so is the output; a wrong gate is off by far
    more (the text gate of CogVideoX's attention replaced by the video one: 1.5 against 0.07)."""
    import inspect

    arch = ARCHS[name]
    model = build(arch)
    ops = model_ops(model)
    hook = cached(model, nmp_driver(), Schedule(2, ops.num_layers, {(1, b): frozenset(ops.ops)
                                                                    for b in BRANCHES}, ops=ops))
    seen = {}       # (block, stream) -> [(input, output) per step]
    for ref in get_architecture(model).blocks(model):
        def keep(mod, args, kwargs, out, ref=ref):
            bound = inspect.signature(type(mod).forward).bind(mod, *args, **kwargs).arguments
            outs = out if ref.spec.returns_tuple else (out,)
            for (stream, param), y in zip(ref.spec.streams.items(), outs):
                seen.setdefault((ref.name, stream), []).append((bound[param] + 0, y + 0))
        ref.module.register_forward_hook(keep, with_kwargs=True)
    cond, uncond = arch.sample(torch.Generator().manual_seed(7), arch.frames[0], arch.size[0])
    x = cond.pop("hidden_states")
    kw = {k: torch.cat([uncond[k], cond[k]]) for k in cond}
    outs = []
    with torch.no_grad():
        for step in range(2):
            with model.cache_context("uncond|cond", step_index=step, num_inference_steps=2):
                outs.append(model(hidden_states=torch.cat([x, x]), timestep=torch.tensor([500, 500]),
                                  **kw, return_dict=False)[0])
    assert hook.stats["ops_reused"] == 2 * len(ops.ops)
    assert len(seen) == sum(len(ref.spec.streams) for ref in get_architecture(model).blocks(model))
    for key, ((x0, y0), (x1, y1)) in seen.items():
        error = ((y1 - x1) - (y0 - x0)).norm() / (y0 - x0).norm()
        assert error < 0.25, (key, float(error))
    error = (outs[1] - outs[0]).norm() / outs[0].norm()
    assert 0 < error < 0.01, float(error)


# ---------------------------------------------------------------- CFG branches, batches
class SpyDriver(NMPDriver):
    """The real driver, recording which CFG context wrote and read each slot."""

    def __init__(self, model):
        super().__init__(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
        self.model, self.seen = model, []

    def _context(self):
        return get_coda_cache_hook(self.model).context_manager.context.name

    def store(self, key, tensor, group=None, x_of=None):
        self.seen.append(("store", self._context(), key[1]))
        super().store(key, tensor, group, x_of)

    def segment_submit(self, x, gates, keys):
        self.seen.extend(("segment", self._context(), k[1]) for k in keys)
        return super().segment_submit(x, gates, keys)


@ALL
def test_branches_never_share_a_cache_and_batched_cfg_equals_separate(name):
    arch = ARCHS[name]
    model = build(arch, invariant=True)
    spy = SpyDriver(model)
    cached(model, spy, policy_for(arch))
    separate = generate(model, arch, (0, 1), mode="separate")
    assert any(kind == "segment" for kind, _, _ in spy.seen)
    assert all(context == branch for _, context, branch in spy.seen)
    cached(model, nmp_driver(), policy_for(arch))
    assert torch.equal(generate(model, arch, (0, 1), mode="batched"), separate)


@ALL
def test_batch_of_three_equals_three_batches_of_one(name):
    arch = ARCHS[name]
    model = build(arch, invariant=True)
    cached(model, nmp_driver(), policy_for(arch))
    three = generate(model, arch, (10, 11, 12))
    for i, seed in enumerate((10, 11, 12)):
        assert torch.equal(three[:, i:i + 1], generate(model, arch, (seed,))), f"sample {i}"


# ---------------------------------------------------------------- generations
@ALL
def test_no_cache_is_carried_over_between_generations(name):
    arch = ARCHS[name]
    model = build(arch)
    driver = nmp_driver()
    hook = cached(model, driver, policy_for(arch))
    generate(model, arch, (5,))
    assert hook.stats["stores"] > 0 and driver.keys() == []    # freed at the last step
    second = generate(model, arch, (6,))
    cached(model, nmp_driver(), policy_for(arch))
    assert torch.equal(second, generate(model, arch, (6,)))


@ALL
def test_a_size_change_between_generations_equals_a_fresh_hook(name):
    arch = ARCHS[name]
    model = build(arch)
    cached(model, nmp_driver(), policy_for(arch))
    first = generate(model, arch, (3,))
    second = generate(model, arch, (3,), frames=arch.frames[1], size=arch.size[1])
    assert second.shape[arch.frame_dim + 1] == arch.frames[1] and second.shape[-1] == arch.size[1]
    assert first.shape[-1] == arch.size[0]
    cached(model, nmp_driver(), policy_for(arch))
    assert torch.equal(second, generate(model, arch, (3,), frames=arch.frames[1], size=arch.size[1]))


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_rtl_backend_gives_the_torch_bits_events_and_cycles(name):
    """Each architecture (HunyuanVideo: dual- and single-stream blocks, two residual streams)
    on the Verilated NMEs: the bits and the events (cycles included) of the torch backend."""
    from coda.host.nme.backend import get_backend

    arch = ARCHS[name]
    model = build(arch)
    cfg = NMEConfig(lanes=8, mem_words=1 << 19)    # test_run.py's build too (tests/experiments)
    reference = cached(model, NMPDriver(TorchBackend(), cfg, ranks=2), policy_for(arch))
    expected = generate(model, arch, (0, 1), steps=3)
    with get_backend("rtl") as backend:
        driver = NMPDriver(backend, cfg, ranks=2)
        hook = cached(model, driver, policy_for(arch))
        got = generate(model, arch, (0, 1), steps=3)
    assert torch.equal(got, expected)
    assert hook.events.events == reference.events.events
    assert hook.stats["segments"] > 0 and driver.stats["async_launches"] > 0


# ---------------------------------------------------------------- what the hooks cannot be sure of
def test_model_code_between_blocks_ends_a_segment():
    """Code of the model's own between two blocks (here a forward pre-hook that shifts block
    1's input) sees the real tensor: the segment ends before it; the bits are exact."""
    arch = ARCHS["wan"]
    model = build(arch)
    model.blocks[1].register_forward_pre_hook(lambda mod, args: (args[0] + 0.5,) + args[1:])
    plain = generate(model, arch, (0,))
    ops = model_ops(model)
    everything = frozenset(ops.ops)
    sched = Schedule(STEPS, ops.num_layers, {(s, b): everything for s in (2, 4) for b in BRANCHES},
                     ops=ops)
    hook = cached(model, nmp_driver(), Schedule(STEPS, ops.num_layers, ops=ops))
    assert torch.equal(generate(model, arch, (0,)), plain)
    hook = cached(model, nmp_driver(), sched)
    on_nmp = generate(model, arch, (0,))
    assert {s.ops for s in hook.events.of("segment")} == {
        tuple(r for r in ops.ops if r[0] == layer) for layer in (0, 1)}
    cached(model, TorchSegmentDriver(), sched)
    assert torch.equal(generate(model, arch, (0,)), on_nmp)


def test_a_block_output_that_other_code_keeps_is_computed_exactly():
    """A block output still held elsewhere when the blocks run (a forward hook keeping block
    0's output) is computed at that block's end: exactly the unhooked model's value."""
    arch = ARCHS["wan"]
    model = build(arch)
    kept = []
    model.blocks[0].register_forward_hook(lambda mod, args, out: kept.append(out))
    generate(model, arch, (0,), steps=1, mode="separate")
    expected = [t.clone() for t in kept]
    kept.clear()
    ops = model_ops(model)
    cached(model, nmp_driver(), Schedule(1, ops.num_layers, ops=ops))
    generate(model, arch, (0,), steps=1, mode="separate")
    assert len(kept) == len(expected) == 2
    for got, want in zip(kept, expected):
        assert torch.equal(got + 0, want)


# ---------------------------------------------------------------- pipelines' contexts
def test_contexts_without_step_index_count_steps_as_cogvideox_pipelines_call():
    """CogVideoXPipeline 0.42 wraps each batched call in ``cache_context("cond_uncond")``
    (rows [uncond; cond], no step_index, no num_inference_steps): the engine counts steps per
    branch and takes the step count from the config; the bits of explicit contexts."""
    arch = ARCHS["cogvideox"]
    model = build(arch)
    policy = policy_for(arch)
    cached(model, nmp_driver(), policy)
    expected = generate(model, arch, (0,))
    remove_coda_cache(model)
    hook = apply_coda_cache(model, CodaCacheConfig(nmp_driver(), policy, num_inference_steps=STEPS))
    g = torch.Generator().manual_seed(1000)
    cond, uncond = arch.sample(g, arch.frames[0], arch.size[0])
    x, text = cond["hidden_states"], torch.cat([uncond["encoder_hidden_states"],
                                                cond["encoder_hidden_states"]])
    for generation in range(2):      # the second starts at step 0 again
        y = x
        with torch.no_grad():
            for i in range(STEPS):
                t = torch.full((2,), 900 - 170 * i, dtype=torch.long)
                with model.cache_context("cond_uncond"):
                    u, c = model(hidden_states=torch.cat([y, y]), encoder_hidden_states=text,
                                 timestep=t, return_dict=False)[0].chunk(2)
                y = y - 0.1 * (u + 3.0 * (c - u))
                assert torch.equal(y, expected[i]), (generation, i)
    assert hook.events.generations == 2 and hook.events.stats(1)["segments"] > 0
    remove_coda_cache(model)
    apply_coda_cache(model, CodaCacheConfig(nmp_driver(), policy))
    with pytest.raises(ValueError, match="gives no num_inference_steps"):
        with model.cache_context("cond_uncond"):
            model(hidden_states=torch.cat([x, x]), encoder_hidden_states=text,
                  timestep=torch.tensor([900, 900]))


# ---------------------------------------------------------------- errors and registry
def test_an_unsupported_transformer_is_refused_with_the_supported_ones_named():
    class MyVideoTransformer(torch.nn.Module):
        pass

    for module in (MyVideoTransformer(), torch.nn.Linear(2, 2)):
        with pytest.raises(UnsupportedModelError) as err:
            apply_coda_cache(module, CodaCacheConfig(nmp_driver(), UniformIntervalPolicy()))
        msg = str(err.value)
        assert type(module).__name__ in msg
        assert all(cls in msg for cls in ("LatteTransformer3DModel", "CogVideoXTransformer3DModel",
                                          "WanTransformer3DModel", "HunyuanVideoTransformer3DModel"))
        assert get_coda_cache_hook(module) is None
    assert isinstance(err.value, TypeError)


@ALL
def test_a_model_without_the_structure_the_adapter_reads_is_refused_naming_it(name):
    """A block lacking a submodule the replay uses (a later diffusers that renamed it) is
    refused before any hook is registered, naming the block and the attribute."""
    model = build(ARCHS[name])
    arch = get_architecture(model)
    attr, spec = arch.block_lists[0]
    path = next(iter(spec.structure))
    owner = getattr(model, attr)[0]
    *parents, leaf = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    delattr(owner, leaf)
    with pytest.raises(UnsupportedModelError, match=rf"{attr}\.0.*{path} is missing"):
        apply_coda_cache(model, CodaCacheConfig(nmp_driver(), UniformIntervalPolicy()))
    assert get_coda_cache_hook(model) is None


def test_a_block_forward_without_a_parameter_the_replay_reads_is_refused(monkeypatch):
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    model = build(ARCHS["wan"])

    def forward(self, hidden_states, encoder_hidden_states, temb):     # no rotary_emb
        raise AssertionError("not called")
    monkeypatch.setattr(WanTransformerBlock, "forward", forward)
    with pytest.raises(UnsupportedModelError, match="blocks.0.forward.*'rotary_emb'"):
        apply_coda_cache(model, CodaCacheConfig(nmp_driver(), UniformIntervalPolicy()))
    assert get_coda_cache_hook(model) is None


def test_another_diffusers_version_is_served_with_a_warning(monkeypatch):
    """An untested diffusers version whose blocks have the structure the adapter reads is a
    warning, not a refusal (once per model); reusing nothing still gives the bits."""
    import diffusers

    from coda.host.cache.arch.base import TESTED_DIFFUSERS, UntestedDiffusersWarning

    arch = ARCHS["wan"]
    model = build(arch)
    plain = generate(model, arch, (0,))
    monkeypatch.setattr(diffusers, "__version__", "0.99.0")
    ops = model_ops(model)
    with pytest.warns(UntestedDiffusersWarning, match=rf"0\.99\.0.*{TESTED_DIFFUSERS}") as rec:
        cached(model, nmp_driver(), Schedule(STEPS, ops.num_layers, ops=ops))
    assert len([w for w in rec if w.category is UntestedDiffusersWarning]) == 1
    assert torch.equal(generate(model, arch, (0,)), plain)


def test_hunyuan_token_replace_and_wan_per_token_timesteps_are_refused():
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(0)
    replace = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0, guidance_embeds=False,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(4, 6, 6),
        image_condition_type="token_replace")
    with pytest.raises(UnsupportedModelError, match="token_replace"):
        apply_coda_cache(replace, CodaCacheConfig(nmp_driver(), UniformIntervalPolicy()))
    arch = ARCHS["wan"]
    model = build(arch)
    apply_coda_cache(model, CodaCacheConfig(nmp_driver(), UniformIntervalPolicy()))
    cond, _ = arch.sample(torch.Generator().manual_seed(0), 3, 8)
    with pytest.raises(ValueError, match="per-token timesteps"):
        with model.cache_context("cond", step_index=0, num_inference_steps=2):
            model(timestep=torch.full((1, 48), 900), **cond)


def test_operators_of_each_architecture_and_their_schedules():
    orders = {}
    for name, arch in ARCHS.items():
        with torch.device("meta"):       # shapes only: what the system model traces
            model = arch.build()
        orders[name] = model_ops(model)
    assert orders["latte"] == ModelOps.latte(2)
    assert orders["wan"].ops == tuple((l, op) for l in range(2) for op in ("attn", "cross_attn", "ffn"))
    assert orders["cogvideox"].ops == tuple((l, op) for l in range(2) for op in ("attn", "ffn"))
    assert orders["hunyuan_video"].ops == ((0, "attn"), (0, "ffn"), (1, "attn"), (1, "ffn"),
                                           (2, "single"), (3, "single"))
    assert orders["latte"].barriers(frames=4) == {(0, "spatial_ffn")}
    assert orders["latte"].barriers(frames=1) == set()
    assert all(orders[n].barriers(frames=4) == set() for n in ("wan", "cogvideox", "hunyuan_video"))
    hy = orders["hunyuan_video"]
    sched = UniformIntervalPolicy(intervals={"single": 3}, warmup=1).build_for(6, hy)
    assert Schedule.from_json(sched.to_json()) == sched and '"arch": "hunyuan_video"' in sched.to_json()
    assert sched.reused(2, "cond") == frozenset(hy.ops)            # (2-1) % 2, (2-1) % 3 != 0
    assert sched.reused(3, "uncond") == frozenset({(2, "single"), (3, "single")})
    assert sched.ops_skipped_fraction() == pytest.approx(
        sum(len(sched.reused(s, "cond")) for s in range(6)) / (6 * len(hy.ops)))
    assert segment_runs(hy.ops, hy.num_layers, ops=hy) == [list(hy.ops)]
    latte = UniformIntervalPolicy(warmup=1).build(4, 2)
    assert latte.ops is None and '"arch"' not in latte.to_json()   # Latte files unchanged
    with pytest.raises(ScheduleError, match="unknown operators"):
        Schedule(4, hy.num_layers, {(1, "cond"): frozenset({(2, "attn")})}, ops=hy)
    from coda.host.cache.policies import SchedulePolicy
    from coda.host.cache.policies.base import OpQuery
    q = OpQuery(step=1, num_steps=4, branch="cond", sample=0, layer=0, op="attn", index=0,
                num_layers=hy.num_layers, cached_step=0, kept_step=None, segment_open=False,
                model_ops=hy)
    with pytest.raises(ScheduleError, match="is for 4 steps of a latte model with 2 layers"):
        SchedulePolicy(latte).decide(q)
    from coda.host.cache.policies import StaticPolicy

    class LatteOnly(StaticPolicy):
        name = "latte-only"

        def build(self, num_steps, num_layers):
            return Schedule(num_steps, num_layers)
    with pytest.raises(ScheduleError, match="'latte-only' makes Latte schedules only"):
        LatteOnly().decide(q)
    assert SchedulePolicy(sched).decide(dataclasses.replace(q, step=2, num_steps=6)).reuse


def test_a_hidden_size_the_lanes_do_not_divide_is_refused_when_applied():
    from diffusers import WanTransformer3DModel

    from coda.host.nme.backend import TorchBackend
    from coda.host.cache.engine import CodaCacheConfig, apply_coda_cache, get_coda_cache_hook
    from coda.host.nmp.driver import NMPDriver
    from coda.host.cache.policies import UniformIntervalPolicy
    from coda.hw.nme.isa import NMEConfig

    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=3,
                                  attention_head_dim=6, in_channels=4, out_channels=4,
                                  text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1)
    driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 12))
    with pytest.raises(ValueError, match="hidden size 18 is not a multiple of the NME's 8 lanes"):
        apply_coda_cache(model, CodaCacheConfig(driver, UniformIntervalPolicy()))
    assert get_coda_cache_hook(model) is None
