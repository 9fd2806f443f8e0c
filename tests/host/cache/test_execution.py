"""Offloading and parallelism under the cache engine (coda.host.cache.execution): what it
serves gives the bits of the model without it, what it refuses is refused in one line, when
the engine attaches or, for a hook added later, at the next call.

Offline stand-ins, where this environment cannot build the real thing:

- accelerate is not installed: diffusers' group offloading takes ``send_to_device`` from it,
  so the group-offloading tests put an equivalent in its place (each tensor of the arguments
  moved to the onload device); the accelerate-hook tests put objects of accelerate's hook
  classes' names on the attribute accelerate sets (``_hf_hook``);
- ``enable_parallelism`` needs an accelerator for its device mesh: the context-parallel test
  applies what it would, diffusers' ``apply_context_parallel`` hooks of the model's
  ``_cp_plan`` and the config recorded on the model;
- group offloading with streams needs an accelerator stream: its test registers the hook
  diffusers adds for it (``LazyPrefetchGroupOffloadingHook``).

Group offloading here offloads to disk (``offload_to_disk_path``): an offloaded group's
tensors are left as uninitialised storage until onloaded, so computing with a group that was
not onloaded gives other values, which the exactness checks would see.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.hooks import HookRegistry, apply_group_offloading
from torch.utils._pytree import tree_map

import coda
from coda.host.cache.arch import model_ops
from coda.host.cache.device import DeviceCache
from coda.host.cache.engine import CodaCacheConfig, apply_coda_cache, get_coda_cache_hook
from coda.host.cache.schedule import Schedule
from test_arch_adapters import STEPS, ARCHS, build, generate, policy_for  # noqa: F401
from test_pipeline_api import run_wan
from tiny_pipelines import wan_pipe, wan_pipeline_class

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def send_to_device(monkeypatch):
    """diffusers' group offloading with accelerate's ``send_to_device`` (module docstring)."""
    import diffusers.hooks.group_offloading as group_offloading

    def send(x, device, non_blocking=False):
        return tree_map(lambda t: t.to(device, non_blocking=non_blocking)
                        if isinstance(t, torch.Tensor) else t, x)
    monkeypatch.setattr(group_offloading, "send_to_device", send, raising=False)


def _offload(model, kind: str, path) -> None:
    apply_group_offloading(model, onload_device="cpu", offload_type=kind, num_blocks_per_group=1,
                           offload_to_disk_path=str(path))


def _refused(call, *match: str) -> str:
    """The one-line ValueError of ``call``, checked to contain each of ``match``."""
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for m in match:
        assert m in message, message
    return message


def _cached_run(model, arch, policy=None):
    hook = apply_coda_cache(model, CodaCacheConfig(DeviceCache(), policy or policy_for(arch)))
    return generate(model, arch), hook


# ---------------------------------------------------------------- served exactly
@pytest.mark.parametrize("name", ["cogvideox", "hunyuan_video"])
def test_leaf_level_group_offloading_is_served_exactly(name, send_to_device, tmp_path):
    """Blocks that hold no parameters of their own: every offloaded group is a module the
    engine calls when it computes an operator, so it is onloaded there. The cached run gives
    the events and bits of the cached run without offloading; reusing nothing gives the
    offloaded model's own bits."""
    arch = ARCHS[name]
    want, hook = _cached_run(build(arch), arch)
    model = build(arch)
    _offload(model, "leaf_level", tmp_path)
    assert list(tmp_path.glob("*.safetensors"))            # the groups went to disk
    got, offloaded = _cached_run(model, arch)
    assert offloaded.events.events == hook.events.events
    assert any(e.reused for e in offloaded.events.of("op"))
    assert torch.equal(got, want)

    plain = build(arch)
    _offload(plain, "leaf_level", tmp_path / "plain")
    ops = model_ops(plain)
    never = generate(plain, arch)
    got, _ = _cached_run(plain, arch, Schedule(STEPS, ops.num_layers, ops=ops))
    assert torch.equal(got, never)


@pytest.mark.parametrize("name", list(ARCHS))
def test_layerwise_casting_is_served_exactly(name):
    """diffusers' layerwise casting (fp8 storage, fp32 compute) hooks the linear layers
    inside the blocks, which the engine calls: reusing nothing gives the cast model's bits."""
    arch = ARCHS[name]
    model = build(arch)
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn,
                                   compute_dtype=torch.float32)
    never = generate(model, arch)
    assert not torch.equal(never, generate(build(arch), arch))     # the casting does something
    ops = model_ops(model)
    got, _ = _cached_run(model, arch, Schedule(STEPS, ops.num_layers, ops=ops))
    assert torch.equal(got, never)


# ---------------------------------------------------------------- refused
@pytest.mark.parametrize("name", list(ARCHS))
def test_block_level_group_offloading_is_refused_in_one_line(name, tmp_path):
    arch = ARCHS[name]
    model = build(arch)
    _offload(model, "block_level", tmp_path)
    _refused(lambda: coda.enable_cache(model, "uniform"), "block-level group offloading",
             f"{type(model).__name__}.", "move the model to one device")
    _refused(lambda: apply_coda_cache(model, CodaCacheConfig(DeviceCache())),
             "block-level group offloading")
    assert get_coda_cache_hook(model) is None and getattr(model, "_coda_cache", None) is None


@pytest.mark.parametrize("name", ["wan", "latte"])
def test_leaf_level_group_offloading_of_a_blocks_own_parameters_is_refused(name, tmp_path):
    """Wan and Latte blocks hold their adaLN table (scale_shift_table): leaf-level group
    offloading gives each block a group of its own, onloaded by the block's forward."""
    model = build(ARCHS[name])
    _offload(model, "leaf_level", tmp_path)
    _refused(lambda: coda.enable_cache(model, "uniform"),
             "leaf-level group offloading of the block's own parameters")


def test_group_offloading_added_after_the_cache_is_refused_at_the_next_call(send_to_device,
                                                                          tmp_path):
    """Offloading applied to a pipeline's transformer after enable_cache: the next call is
    refused before it does anything, and the running generation's slots are freed."""
    pipe = wan_pipe(wan_pipeline_class())
    handle = coda.enable_cache(pipe, "uniform", skip=0.5, backend="nmp")
    run_wan(pipe)
    _offload(pipe.transformer, "block_level", tmp_path)
    _refused(lambda: run_wan(pipe), "WanTransformer3DModel.blocks.0 has block-level group "
             "offloading")
    assert handle.driver.keys() == []
    assert handle.hooks["transformer"].state.generation is None


def test_group_offloading_with_streams_is_refused():
    from diffusers.hooks.group_offloading import LazyPrefetchGroupOffloadingHook

    model = build(ARCHS["cogvideox"])
    HookRegistry.check_if_exists_or_initialize(model).register_hook(
        LazyPrefetchGroupOffloadingHook(), "lazy_prefetch_group_offloading")
    _refused(lambda: coda.enable_cache(model, "uniform"),
             "group offloading with streams (use_stream=True)", "use_stream=False")


@pytest.mark.parametrize("hook, where, match", [
    ("CpuOffload", "", "model CPU offload (enable_model_cpu_offload)"),
    ("AlignDevicesHook", "blocks.1.ffn.net.0.proj", "sequential CPU offload or a device_map"),
])
def test_accelerate_offload_hooks_are_refused(hook, where, match):
    model = build(ARCHS["wan"])
    target = model.get_submodule(where)
    target._hf_hook = type(hook, (), {})()
    message = _refused(lambda: coda.enable_cache(model, "uniform"), match,
                       "accelerate's offload hooks", "pipe.to(device)")
    assert message.startswith(f"WanTransformer3DModel{'.' + where if where else ''} has ")
    del target._hf_hook
    handle = coda.enable_cache(model, "uniform")        # accelerate's SequentialHook: several
    target._hf_hook = type("SequentialHook", (), {"hooks": (type(hook, (), {})(),)})()
    with model.cache_context("cond", step_index=0, num_inference_steps=5):
        _refused(lambda: model(**ARCHS["wan"].sample(torch.Generator().manual_seed(0), 3, 8)[0],
                               timestep=torch.tensor([900])), match)
    assert handle.hooks["transformer"].events.generations == 0


def test_context_parallelism_is_refused_in_one_line():
    from diffusers import ContextParallelConfig
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models._modeling_parallel import ParallelConfig

    model = build(ARCHS["wan"])
    config = ContextParallelConfig(ulysses_degree=2)
    apply_context_parallel(model, config, model._cp_plan)         # the hooks alone
    _refused(lambda: coda.enable_cache(model, "uniform"), "WanTransformer3DModel runs with "
             "context parallelism (enable_parallelism)", "run the transformer on one device")
    model._parallel_config = ParallelConfig(context_parallel_config=config)
    _refused(lambda: coda.enable_cache(model, "uniform"), "context parallelism")
    assert get_coda_cache_hook(model) is None


def test_diffusers_own_cache_is_refused():
    from diffusers import FirstBlockCacheConfig

    model = build(ARCHS["wan"])
    model.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    _refused(lambda: coda.enable_cache(model, "uniform"), "diffusers' own cache",
             "transformer.disable_cache()")
    model.disable_cache()
    coda.enable_cache(model, "uniform")
