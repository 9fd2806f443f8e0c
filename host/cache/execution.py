"""How a transformer may be executed under the cache engine: the offloading and parallelism
set-ups it refuses, checked when the engine attaches and again at every call (a hook added
after the engine is refused at the next call, before the call does anything).

The engine runs the model's own forward but not its blocks' forwards: a block call is
recorded and its operators replayed later, one by one, through the block's submodules
(:mod:`coda.host.cache.step`). What a set-up does at a block's forward therefore never
happens, and what it does at a submodule's forward happens at the replay. What is served
and what is refused, and why: :func:`check_execution`.
"""

from __future__ import annotations

import torch

__all__ = ["check_execution", "ENGINE_HOOKS"]

#: the hook names of the engine itself (:mod:`coda.host.cache.engine`,
#: :mod:`coda.host.cache.pipeline`): never refused
ENGINE_HOOKS = frozenset({"coda_cache", "coda_cache_block", "coda_cache_pipeline"})
_GROUP_OFFLOADING = "group_offloading"
_LAZY_PREFETCH = "lazy_prefetch_group_offloading"
_CP_HOOKS = ("cp_input---", "cp_output---")
_ACCELERATE = {
    "CpuOffload": "model CPU offload (enable_model_cpu_offload)",
    "AlignDevicesHook": "sequential CPU offload or a device_map (accelerate's AlignDevicesHook)",
}
_DO_INSTEAD = "move the model to one device instead (pipe.to(device))"


def _hooks(module: torch.nn.Module) -> dict:
    registry = getattr(module, "_diffusers_hook", None)
    return {} if registry is None else dict(getattr(registry, "hooks", {}))


def check_execution(model: torch.nn.Module, blocks) -> None:
    """Refuse a set-up the engine does not run exactly.

    - served: hooks on the transformer itself and on modules inside its blocks, when each acts
      at its own module's forward alone: diffusers' leaf-level group offloading without streams
      (``apply_group_offloading(..., offload_type="leaf_level")``) where no block holds
      parameters of its own (CogVideoX, HunyuanVideo; Wan and Latte blocks hold their
      ``scale_shift_table``), and diffusers' layerwise casting (``enable_layerwise_casting``);
      ``torch.compile`` of the blocks, of their submodules or of the whole transformer
      (the engine's own code is never traced: :mod:`coda.host.cache.engine`);
    - refused: any diffusers hook on a block other than the engine's (block-level group
      offloading, a leaf-level group holding a block's own parameters, diffusers' cache hooks on
      blocks): it would act when the block is recorded, not when its operators run;
      group offloading with streams (its prefetch order is learned from the first forward, and
      reused operators skip their modules); diffusers' own cache (``transformer.enable_cache``):
      one cache at a time; accelerate's hooks (``enable_model_cpu_offload``,
      ``enable_sequential_cpu_offload``, a ``device_map``): not tested here, and accelerate
      restores a transformer's forward when a pipeline resets its hooks, dropping the engine's;
      context and tensor parallelism (``enable_parallelism``): each rank would decide on its
      own share of the tokens, and ranks that decide differently no longer meet in their
      collectives.

    Args:
        model: the transformer. blocks: its :class:`coda.host.cache.arch.base.BlockRef` s.
    Raises:
        ValueError: one line naming the set-up, where it is and what to do instead:
            context or tensor parallelism; an accelerate hook on the model or any submodule;
            diffusers' own cache; group offloading with streams; a diffusers hook other than
            the engine's on a block.
    """
    cls = type(model).__name__
    modules = list(model.named_modules())
    parallel = getattr(model, "_parallel_config", None)
    if parallel is not None or any(name.startswith(_CP_HOOKS) for _, m in modules
                                   for name in _hooks(m)):
        kind = ("tensor parallelism" if getattr(parallel, "tensor_parallel_config", None)
                is not None else "context parallelism")
        raise ValueError(f"{cls} runs with {kind} (enable_parallelism): the CODA cache does not "
                         "support it (each rank would decide on its own share of the tokens); "
                         "run the transformer on one device, without enable_parallelism")
    for name, module in modules:
        hook = getattr(module, "_hf_hook", None)
        if hook is not None:
            kinds = {type(h).__name__ for h in getattr(hook, "hooks", (hook,))}
            what = "; ".join(_ACCELERATE.get(k, f"accelerate's {k}") for k in sorted(kinds))
            raise ValueError(f"{cls}{'.' + name if name else ''} has {what}: the CODA cache does "
                             f"not support accelerate's offload hooks; {_DO_INSTEAD}, or "
                             "without streams diffusers' leaf-level group offloading "
                             "(apply_group_offloading(..., offload_type='leaf_level')) where "
                             "the blocks hold no parameters of their own")
        hooks = _hooks(module)
        group = hooks.get(_GROUP_OFFLOADING)
        if _LAZY_PREFETCH in hooks or getattr(getattr(group, "group", None), "stream",
                                              None) is not None:
            raise ValueError(f"{cls}: group offloading with streams (use_stream=True) is not "
                             "supported by the CODA cache (the prefetch order is learned from "
                             "the first forward, and reused operators skip their modules); "
                             "apply it with use_stream=False")
    if getattr(model, "_cache_config", None) is not None:
        raise ValueError(f"{cls} has diffusers' own cache on (transformer.enable_cache): one "
                         "cache at a time: call transformer.disable_cache() first")
    for ref in blocks:
        foreign = [n for n in _hooks(ref.module) if n not in ENGINE_HOOKS]
        if not foreign:
            continue
        if _GROUP_OFFLOADING in foreign:
            group = getattr(_hooks(ref.module)[_GROUP_OFFLOADING], "group", None)
            what = ("block-level group offloading" if getattr(group, "modules", None)
                    else "leaf-level group offloading of the block's own parameters")
            what += " (apply_group_offloading / enable_group_offload)"
        else:
            what = f"the diffusers hook(s) {', '.join(map(repr, foreign))}"
        raise ValueError(
            f"{cls}.{ref.name} has {what}: the CODA cache replays a block's operators without "
            "running the block's forward, where that hook acts; remove it: "
            f"{_DO_INSTEAD}, or leaf-level group offloading without streams on a model whose "
            "blocks hold no parameters of their own (CogVideoX, HunyuanVideo)")
