"""Tiny diffusers pipelines built offline from small random-weight components (the cache
engine's pipeline tests, the CLI's pipeline --model tests).

The environment has no ``transformers`` (the pipelines' text encoders and tokenizers): the
pipeline modules are imported with a stand-in ``transformers`` module that names the classes
their imports ask for (:func:`pipeline_class`, :func:`stand_in_transformers`), and the
pipelines are built with ``tokenizer=None, text_encoder=None``.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types

import torch

#: Wan 2.2: boundary 0.75 * 1000 (8 flow-matching steps, shift 3: the high-noise expert
#: steps 0-3, the low-noise one steps 4-7)
BOUNDARY = 0.75
#: the classes of Wan's pipeline module that come from transformers
WAN_TEXT = ("AutoTokenizer", "UMT5EncoderModel")


@contextlib.contextmanager
def stand_in_transformers(text_classes: tuple[str, ...], mixins: tuple[str, ...] = ()):
    """A stand-in ``transformers`` module naming ``text_classes`` (they only name types in
    the pipelines' signatures) and the LoRA ``mixins`` diffusers exports only with
    transformers installed, while the block runs; both removed after."""
    import diffusers.loaders
    import diffusers.loaders.lora_pipeline as lora
    import diffusers.pipelines  # noqa: F401  (diffusers' availability checks run first)

    stub = types.ModuleType("transformers")
    for name in text_classes:
        setattr(stub, name, type(name, (), {}))
    had = sys.modules.get("transformers")
    added = [m for m in mixins if not hasattr(diffusers.loaders, m)]
    sys.modules["transformers"] = stub
    for m in added:
        setattr(diffusers.loaders, m, getattr(lora, m))
    try:
        yield
    finally:
        for m in added:
            delattr(diffusers.loaders, m)
        if had is None:
            sys.modules.pop("transformers", None)
        else:
            sys.modules["transformers"] = had


def pipeline_class(module: str, cls: str, text_classes: tuple[str, ...],
                   mixins: tuple[str, ...] = ()):
    """``cls`` of diffusers' ``module``, imported under :func:`stand_in_transformers`."""
    with stand_in_transformers(text_classes, mixins):
        try:
            return getattr(importlib.import_module(module), cls)
        finally:
            sys.modules.pop(module, None)


def wan_pipeline_class():
    return pipeline_class("diffusers.pipelines.wan.pipeline_wan", "WanPipeline", WAN_TEXT,
                          ("WanLoraLoaderMixin",))


def wan_transformer(seed: int):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=32, ffn_dim=64, num_layers=2,
        rope_max_seq_len=32).eval()


def wan_pipe(cls, two_experts: bool = False):
    """A tiny Wan 2.1 pipeline, or Wan 2.2's two experts with a boundary: the same weights
    every time it is built."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
                           latents_std=[1.0] * 4).eval()
    pipe = cls(tokenizer=None, text_encoder=None, vae=vae,
               scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
               transformer=wan_transformer(1),
               transformer_2=wan_transformer(2) if two_experts else None,
               boundary_ratio=BOUNDARY if two_experts else None)
    pipe.set_progress_bar_config(disable=True)
    return pipe
