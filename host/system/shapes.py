"""Model shapes: the cacheable operators of a video DiT at a resolution and duration, with the
FLOPs and bytes of every GPU kernel they launch.

For every model that diffusers ships, nothing here is hand-written: the diffusers transformer
class is instantiated from its published config on the ``meta`` device (no weights, no
memory), one forward runs there at the requested latent shape, and

- a ``TorchDispatchMode`` sees every aten kernel (FLOPs from torch's own
  ``torch.utils.flop_counter`` formulas, bytes = the kernel's input and output tensors,
  parameter bytes apart), and
- a ``TorchFunctionMode`` replaces ``F.scaled_dot_product_attention`` by one fused-attention
  kernel (FLOPs ``4·B·H·L·S·E``; bytes of q, k, v and the output: what a flash-attention
  kernel moves), instead of the ``bmm``/softmax decomposition the meta device would run;
- forward hooks on each block's operator modules attribute every kernel to the cacheable
  operator it belongs to: the norm/modulation kernels before an operator's module and the
  module's own kernels are that operator's; the gated residual add after it goes to the next
  operator of the block (the last one of a block keeps the block's tail); kernels outside the
  blocks (embeddings, final layer, Latte's temporal position embedding) are ``other``.

Only Open-Sora 1.2 (STDiT3, no diffusers class) is written by hand (:func:`opensora_shape`),
from its published configuration and the arithmetic of its blocks, and checked against the
traced Latte-1 blocks (the same PixArt-α block) in ``tests/test_system.py``.

Units: FLOPs (multiply-add = 2), bytes, tokens per sample. Every per-kernel number is per
sample (batch 1) except ``weight_bytes``, read once per kernel whatever the batch.
"""

from __future__ import annotations

import json
import os
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

__all__ = ["GEMM", "ATTENTION", "MEMORY", "CLASSES", "Kernels", "OpShape", "ModelShape",
           "ModelSpec", "MODELS", "RESOLUTIONS", "model_shape", "resolve_resolution",
           "frames_for", "opensora_shape", "trace", "shipped_shape"]

#: kernel classes (efficiency factors in :mod:`coda.host.system.platforms` are per class)
GEMM, ATTENTION, MEMORY = 0, 1, 2
CLASSES = ("gemm", "attention", "memory")

#: bumped when the traced fields change, so cached shape files of an older trace are not read
SHAPES_VERSION = 2

#: resolution name -> (height, width) in pixels
RESOLUTIONS = {"480p": (480, 832), "720p": (720, 1280)}
# Bounds of what the model is asked to trace (beyond them a meta-device trace takes minutes
# or overflows; the published video DiTs generate up to 1280x720 and 16 s): 4K sides, a minute.
MAX_SIDE = 4096
MAX_SECONDS = 60.0
MAX_FRAMES = 2049


@dataclass
class Kernels:
    """The GPU kernels of one operator (or of the non-cacheable rest of a forward).

    Attributes (numpy arrays, one entry per kernel, all per sample except weight_bytes):
        flops: floating-point operations (FLOPs, a multiply-add counts 2).
        act_bytes: activation bytes read and written (scale with the batch).
        weight_bytes: parameter bytes read (once per kernel, whatever the batch).
        cls: kernel class (:data:`GEMM`, :data:`ATTENTION`, :data:`MEMORY`).
    """
    flops: np.ndarray = field(default_factory=lambda: np.zeros(0))
    act_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    weight_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cls: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))

    @classmethod
    def from_rows(cls, rows: list[tuple[float, float, float, int]]) -> "Kernels":
        if not rows:
            return cls()
        a = np.asarray(rows, dtype=np.float64)
        return cls(a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy(), a[:, 3].astype(np.int8))

    def __add__(self, other: "Kernels") -> "Kernels":
        return Kernels(np.concatenate([self.flops, other.flops]),
                       np.concatenate([self.act_bytes, other.act_bytes]),
                       np.concatenate([self.weight_bytes, other.weight_bytes]),
                       np.concatenate([self.cls, other.cls]))

    @property
    def count(self) -> int:
        return len(self.flops)

    def total_flops(self, batch: int = 1) -> float:
        return float(self.flops.sum()) * batch

    def total_bytes(self, batch: int = 1) -> float:
        return float(self.act_bytes.sum()) * batch + float(self.weight_bytes.sum())

    def to_dict(self) -> dict:
        return {"flops": self.flops.tolist(), "act_bytes": self.act_bytes.tolist(),
                "weight_bytes": self.weight_bytes.tolist(), "cls": self.cls.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "Kernels":
        return cls(np.asarray(d["flops"], np.float64), np.asarray(d["act_bytes"], np.float64),
                   np.asarray(d["weight_bytes"], np.float64), np.asarray(d["cls"], np.int8))


@dataclass
class OpShape:
    """One cacheable operator of the model, in forward order.

    Attributes:
        index: forward position. layer: the model's layer (block) index it belongs to.
        op: operator name, as the cache engine names it (``host/cache/arch``: e.g. Wan's ``"attn"``,
            Latte's ``"spatial_attn"``).
        kind: the shipped model's operator type it corresponds to, for transferring
            schedules (one of :data:`coda.host.cache.schedule.OP_TYPES`).
        tokens, channels: the cached output per sample, ``[T, C]`` (for joint text-video
            attention T counts the text tokens too).
        gated: an adaLN gate scales the output (else the gate is 1).
        barrier_after: a computed, non-cacheable operation follows (no segment spans it).
        kernels: its GPU kernels (norm and modulation before it included).
        stream_tokens: for a model with two residual streams (CogVideoX, HunyuanVideo: video
            then text tokens, each with its own gates and NME programs, as the cache engine
            runs them: ``host/cache/arch``), the tokens of each; () for one stream.
    """
    index: int
    layer: int
    op: str
    kind: str
    tokens: int
    channels: int
    gated: bool
    barrier_after: bool
    kernels: Kernels
    stream_tokens: tuple = ()

    @property
    def ref(self) -> tuple[int, str]:
        return (self.layer, self.op)


@dataclass
class ModelShape:
    """A model at one resolution and length: its cacheable operators and the rest.

    Attributes:
        name, title: preset key and a readable name. source: where the config comes from.
        traced: True if measured by a meta-device forward (else hand-written).
        height, width, frames: the video in pixels and frames.
        latent: (frames, height, width) of the latent the transformer sees.
        video_tokens, text_tokens: per sample.
        hidden: model width C. num_layers: layers (blocks, Latte: spatial+temporal pairs).
        cfg: how CFG runs: ``"batched"`` (cond and uncond in one batch-2 call), ``"two_pass"``
            (two calls per step) or ``"distilled"`` (one call, guidance embedded: no uncond).
        params: parameters; weight_bytes: their bytes in the run dtype.
        dtype_bytes: bytes per activation/cache element (2: bf16/fp16).
        ops: the cacheable operators. other: the kernels of everything else of a forward.
        activation_bytes: largest single kernel's inputs + output (a working-set bound).
        trace_s: seconds the trace took here.
    """
    name: str
    title: str
    source: str
    traced: bool
    height: int
    width: int
    frames: int
    latent: tuple[int, int, int]
    video_tokens: int
    text_tokens: int
    hidden: int
    num_layers: int
    cfg: str
    params: int
    weight_bytes: int
    dtype_bytes: int
    ops: list[OpShape]
    other: Kernels
    activation_bytes: int
    trace_s: float = 0.0

    @property
    def forward_flops(self) -> float:
        """FLOPs of one forward of one sample (all operators + the rest)."""
        return sum(o.kernels.total_flops() for o in self.ops) + self.other.total_flops()

    def op_bytes(self, op: OpShape) -> int:
        """Bytes of one cached output of ``op`` per sample: T x C elements."""
        return op.tokens * op.channels * self.dtype_bytes

    def all_ops_cache_bytes(self, branches: int = 2) -> int:
        """Bytes to hold every cacheable operator's output of every branch (the cache of a
        schedule that reuses every operator at some step)."""
        return branches * sum(self.op_bytes(o) for o in self.ops)

    def describe(self) -> dict:
        return {"name": self.name, "title": self.title, "source": self.source,
                "traced": self.traced, "height": self.height, "width": self.width,
                "frames": self.frames, "latent": list(self.latent),
                "video_tokens": self.video_tokens, "text_tokens": self.text_tokens,
                "hidden": self.hidden, "num_layers": self.num_layers, "cfg": self.cfg,
                "params": self.params, "weight_bytes": self.weight_bytes,
                "cacheable_ops": len(self.ops), "forward_flops": self.forward_flops,
                "cached_tensor_bytes": max((self.op_bytes(o) for o in self.ops), default=0)}

    def to_json(self) -> str:
        d = {k: v for k, v in self.__dict__.items() if k not in ("ops", "other")}
        d["latent"] = list(self.latent)
        d["other"] = self.other.to_dict()
        d["ops"] = [{**{k: v for k, v in asdict(o).items() if k != "kernels"},
                     "kernels": o.kernels.to_dict()} for o in self.ops]
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "ModelShape":
        d = json.loads(text)
        d["latent"] = tuple(d["latent"])
        d["other"] = Kernels.from_dict(d["other"])
        d["ops"] = [OpShape(**{**o, "kernels": Kernels.from_dict(o["kernels"]),
                               "stream_tokens": tuple(o.get("stream_tokens", ()))})
                    for o in d["ops"]]
        return cls(**d)


# ------------------------------------------------------------------------------ presets
@dataclass(frozen=True)
class OpGroup:
    """The cacheable operators of one list of blocks of a diffusers model.

    Attributes:
        blocks: attribute of the model holding the ``nn.ModuleList`` of blocks.
        ops: per operator ``(name, module attributes of the block ("" = the whole block),
            kind, gated)``; several modules make one operator (e.g. HunyuanVideo's image and
            text FFNs).
        layer_offset: model layer of the group's first block; None: after the previous
            group's blocks (HunyuanVideo's single-stream blocks follow its dual-stream ones,
            layers L..L+S-1 as ``host/cache/arch`` numbers them); Latte's spatial and temporal
            block ``i`` are both layer ``i``.
    """
    blocks: str
    ops: tuple[tuple[str, tuple[str, ...], str, bool], ...]
    layer_offset: int | None = 0


@dataclass(frozen=True)
class ModelSpec:
    """A model preset: the diffusers class and its published config, and how videos map to
    latents. Every number has its source in ``source``/``notes``.

    Attributes:
        title: readable name. cls: diffusers transformer class name (None: hand-written).
        config: the class's constructor arguments (the published ``transformer/config.json``).
        source: URL of that config. vae: (temporal, spatial) compression of the VAE.
        patch: (t, h, w) patch size. latent_channels: channels of the latent.
        fps: frames per second of the model's videos. frame_rule: ``"4k+1"`` (causal video
            VAE: frames = seconds*fps + 1), ``"fixed:N"`` (exactly N frames), ``"opensora"``.
        text_tokens: prompt tokens the pipeline pads to. text_dim: text-encoder width.
        cfg: ``"batched"``, ``"two_pass"`` or ``"distilled"`` (the diffusers pipeline's loop).
        groups: the cacheable operators (:class:`OpGroup`).
        dtype: the run dtype of the weights and activations.
        streams: residual streams the cache engine keeps per operator (2: video and text).
        notes: sources of the rest (fps, frame rule, CFG).
    """
    title: str
    cls: str | None
    config: dict
    source: str
    vae: tuple[int, int]
    patch: tuple[int, int, int]
    latent_channels: int
    fps: float | None
    frame_rule: str
    text_tokens: int
    text_dim: int
    cfg: str
    groups: tuple[OpGroup, ...] = ()
    dtype: str = "bf16"
    streams: int = 1
    notes: str = ""


_LATTE_SPATIAL = OpGroup("transformer_blocks", (
    ("spatial_attn", ("attn1",), "spatial_attn", True),
    ("cross_attn", ("attn2",), "cross_attn", False),
    ("spatial_ffn", ("ff",), "spatial_ffn", True)))
_LATTE_TEMPORAL = OpGroup("temporal_transformer_blocks", (
    ("temporal_attn", ("attn1",), "temporal_attn", True),
    ("temporal_ffn", ("ff",), "temporal_ffn", True)))

MODELS: dict[str, ModelSpec] = {
    "latte-1": ModelSpec(
        title="Latte-1 (LatteTransformer3DModel, 28 spatial + 28 temporal blocks)",
        cls="LatteTransformer3DModel",
        config=dict(num_attention_heads=16, attention_head_dim=72, in_channels=4,
                    out_channels=8, num_layers=28, cross_attention_dim=1152,
                    attention_bias=True, sample_size=64, patch_size=2,
                    activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
                    norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
                    caption_channels=4096, video_length=16),
        source="https://huggingface.co/maxin-cn/Latte-1/blob/main/transformer/config.json "
               "(video_length: the class default 16, Latte-1 generates 16 frames)",
        vae=(1, 8), patch=(1, 2, 2), latent_channels=4, fps=8, frame_rule="fixed:16",
        text_tokens=120, text_dim=4096, cfg="batched",
        groups=(_LATTE_SPATIAL, _LATTE_TEMPORAL),
        notes="SD VAE 8x spatial, no temporal compression; T5 prompts padded to 120 tokens "
              "(diffusers LattePipeline max_length=120); CFG batched (torch.cat([latents]*2)); "
              "8 fps as Latte's sample scripts save (16 frames = 2 s).",
        dtype="fp16"),
    "cogvideox-2b": ModelSpec(
        title="CogVideoX-2B (30 blocks, joint text-video attention)",
        cls="CogVideoXTransformer3DModel",
        config=dict(num_attention_heads=30, attention_head_dim=64, in_channels=16,
                    out_channels=16, flip_sin_to_cos=True, freq_shift=0, time_embed_dim=512,
                    text_embed_dim=4096, num_layers=30, attention_bias=True, sample_width=90,
                    sample_height=60, sample_frames=49, patch_size=2,
                    temporal_compression_ratio=4, max_text_seq_length=226,
                    activation_fn="gelu-approximate", timestep_activation_fn="silu",
                    norm_elementwise_affine=True, norm_eps=1e-5,
                    spatial_interpolation_scale=1.875, temporal_interpolation_scale=1.0),
        source="https://huggingface.co/THUDM/CogVideoX-2b/blob/main/transformer/config.json",
        vae=(4, 8), patch=(1, 2, 2), latent_channels=16, fps=8, frame_rule="4k+1",
        text_tokens=226, text_dim=4096, cfg="batched",
        groups=(OpGroup("transformer_blocks", (
            ("attn", ("attn1",), "spatial_attn", True),
            ("ffn", ("ff",), "spatial_ffn", True))),),
        notes="CogVideoX README: 8 fps, 49 frames = 6 s (num_seconds*fps + 1), 226 prompt "
              "tokens; pipeline CFG batched; runs in fp16 (README: FP16 recommended).",
        dtype="fp16", streams=2),
    "cogvideox-5b": ModelSpec(
        title="CogVideoX-5B (42 blocks, joint text-video attention)",
        cls="CogVideoXTransformer3DModel",
        config=dict(num_attention_heads=48, attention_head_dim=64, in_channels=16,
                    out_channels=16, flip_sin_to_cos=True, freq_shift=0, time_embed_dim=512,
                    text_embed_dim=4096, num_layers=42, attention_bias=True, sample_width=90,
                    sample_height=60, sample_frames=49, patch_size=2,
                    temporal_compression_ratio=4, max_text_seq_length=226,
                    activation_fn="gelu-approximate", timestep_activation_fn="silu",
                    norm_elementwise_affine=True, norm_eps=1e-5,
                    spatial_interpolation_scale=1.875, temporal_interpolation_scale=1.0,
                    use_rotary_positional_embeddings=True,
                    use_learned_positional_embeddings=False),
        source="https://huggingface.co/THUDM/CogVideoX-5b/blob/main/transformer/config.json",
        vae=(4, 8), patch=(1, 2, 2), latent_channels=16, fps=8, frame_rule="4k+1",
        text_tokens=226, text_dim=4096, cfg="batched",
        groups=(OpGroup("transformer_blocks", (
            ("attn", ("attn1",), "spatial_attn", True),
            ("ffn", ("ff",), "spatial_ffn", True))),),
        notes="as CogVideoX-2B; bf16 (README); the 3D RoPE (elementwise on q, k) is not "
              "passed in the trace: its kernels are missing (< 1 % of the FLOPs).",
        streams=2),
    "wan2.1-1.3b": ModelSpec(
        title="Wan 2.1 T2V 1.3B (30 blocks)",
        cls="WanTransformer3DModel",
        config=dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                    in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
                    ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", eps=1e-6),
        source="https://huggingface.co/Wan-AI/Wan2.1-T2V-1.3B-Diffusers/blob/main/transformer/"
               "config.json (= Wan2.1 wan/configs/wan_t2v_1_3B.py: dim 1536, ffn 8960, 12 heads, "
               "30 layers)",
        vae=(4, 8), patch=(1, 2, 2), latent_channels=16, fps=16, frame_rule="4k+1",
        text_tokens=512, text_dim=4096, cfg="two_pass",
        groups=(OpGroup("blocks", (
            ("attn", ("attn1",), "spatial_attn", True),
            ("cross_attn", ("attn2",), "cross_attn", False),
            ("ffn", ("ffn",), "spatial_ffn", True))),),
        notes="Wan2.1 README: 16 fps, 81 frames = 5 s; umT5 text_len 512; WanPipeline runs "
              "cond and uncond as two transformer calls per step."),
    "wan2.1-14b": ModelSpec(
        title="Wan 2.1 T2V 14B (40 blocks)",
        cls="WanTransformer3DModel",
        config=dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128,
                    in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
                    ffn_dim=13824, num_layers=40, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", eps=1e-6),
        source="https://huggingface.co/Wan-AI/Wan2.1-T2V-14B-Diffusers/blob/main/transformer/"
               "config.json (= Wan2.1 wan/configs/wan_t2v_14B.py: dim 5120, ffn 13824, 40 heads, "
               "40 layers)",
        vae=(4, 8), patch=(1, 2, 2), latent_channels=16, fps=16, frame_rule="4k+1",
        text_tokens=512, text_dim=4096, cfg="two_pass",
        groups=(OpGroup("blocks", (
            ("attn", ("attn1",), "spatial_attn", True),
            ("cross_attn", ("attn2",), "cross_attn", False),
            ("ffn", ("ffn",), "spatial_ffn", True))),),
        notes="as Wan 2.1 1.3B."),
    "hunyuanvideo": ModelSpec(
        title="HunyuanVideo (20 dual-stream + 40 single-stream blocks)",
        cls="HunyuanVideoTransformer3DModel",
        config=dict(in_channels=16, out_channels=16, num_attention_heads=24,
                    attention_head_dim=128, num_layers=20, num_single_layers=40,
                    num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1,
                    qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096,
                    pooled_projection_dim=768, rope_theta=256.0, rope_axes_dim=(16, 56, 56)),
        source="https://huggingface.co/hunyuanvideo-community/HunyuanVideo/blob/main/"
               "transformer/config.json",
        vae=(4, 8), patch=(1, 2, 2), latent_channels=16, fps=24, frame_rule="4k+1",
        text_tokens=256, text_dim=4096, cfg="distilled",
        groups=(OpGroup("transformer_blocks", (
                    ("attn", ("attn",), "spatial_attn", True),
                    ("ffn", ("ff", "ff_context"), "spatial_ffn", True))),
                OpGroup("single_transformer_blocks", (
                    ("single", ("",), "spatial_ffn", True),), layer_offset=None)),
        notes="HunyuanVideo README: 129 frames at 24 fps (5.4 s), 720x1280; LLaVA-LLaMA "
              "prompt padded to 256 tokens (pipeline max_sequence_length); guidance-distilled "
              "(guidance_embeds): one call per step, true CFG off by default.",
        streams=2),
}


def _shipped_spec() -> ModelSpec:
    from coda.host.model.dit import CONFIG_FILE

    cfg = json.loads(Path(CONFIG_FILE).read_text())
    t = cfg["transformer"]
    return ModelSpec(
        title="shipped digit Latte (4 spatial + 4 temporal blocks, hidden 96)",
        cls="LatteTransformer3DModel", config=dict(t),
        source="host/model/weights/latte_digits.json",
        vae=(1, 1), patch=(1, t["patch_size"], t["patch_size"]),
        latent_channels=t["in_channels"], fps=None, frame_rule=f"fixed:{t['video_length']}",
        text_tokens=1, text_dim=t["caption_channels"], cfg="batched",
        groups=(_LATTE_SPATIAL, _LATTE_TEMPORAL),
        notes="pixel space (no VAE), one label token; coda.host.model.sample batches CFG.",
        dtype="fp32")


#: Open-Sora 1.2 STDiT3-XL/2, hand-written (no diffusers class)
OPENSORA = {
    "title": "Open-Sora 1.2 (STDiT3-XL/2, 28 spatial + 28 temporal blocks)",
    "hidden": 1152, "depth": 28, "heads": 16, "mlp_ratio": 4, "patch": (1, 2, 2),
    "latent_channels": 4, "text_tokens": 300, "text_dim": 4096, "fps": 24,
    # Open-Sora 1.2 VAE: SD VAE (8x spatial), then 4x temporal over 17-frame chunks -> 5
    "vae_chunk": (17, 5), "vae_s": 8,
    "frames": {2: 51, 4: 102, 8: 204, 16: 408},
    "source": "hpcaitech/Open-Sora v1.2 configs/opensora-v1-2/inference/sample.py "
              "(STDiT3-XL/2: hidden 1152, depth 28, 16 heads, mlp_ratio 4, patch (1,2,2), "
              "model_max_length 300); opensora/datasets/aspect.py NUM_FRAMES_MAP "
              "('4s' = 102 frames); VideoAutoencoderPipeline micro_frame_size 17 -> 5 latents",
    "cfg": "batched",
}


def get_spec(name: str) -> ModelSpec:
    if name == "latte-digits":
        return _shipped_spec()
    return MODELS[name]


def model_names() -> list[str]:
    """Every preset: the diffusers ones, ``opensora-1.2`` (hand-written) and
    ``latte-digits`` (the shipped model)."""
    return sorted(list(MODELS) + ["opensora-1.2", "latte-digits"])


# ------------------------------------------------------------------------------ inputs
def resolve_resolution(text: str) -> tuple[int, int]:
    """``"720p"`` / ``"480p"`` or ``"WIDTHxHEIGHT"`` -> (height, width) in pixels.
    Raises ValueError naming the value and what is expected."""
    key = str(text).strip().lower()
    if key in RESOLUTIONS:
        return RESOLUTIONS[key]
    parts = key.split("x")
    if len(parts) == 2 and all(p.isdigit() and 0 < int(p) <= MAX_SIDE for p in parts):
        return int(parts[1]), int(parts[0])
    raise ValueError(f"--resolution {text!r}: expected one of {', '.join(RESOLUTIONS)} or "
                     f"WIDTHxHEIGHT in pixels (e.g. 720x480), each side 1..{MAX_SIDE}")


def frames_for(name: str, seconds: float | None = None, frames: int | None = None) -> int:
    """Frames of a ``seconds``-long video (or ``frames`` as given) for model ``name``,
    checked against the model's rule (and ``0 < seconds <= MAX_SECONDS``, ``frames <=
    MAX_FRAMES``). Raises ValueError naming what the model takes."""
    if seconds is not None and not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise ValueError(f"--seconds {seconds}: expected a duration in (0, {MAX_SECONDS}] s")
    if frames is not None and not 1 <= frames <= MAX_FRAMES:
        raise ValueError(f"--frames {frames}: expected 1..{MAX_FRAMES}")
    if name == "opensora-1.2":
        table = OPENSORA["frames"]
        if frames is not None:
            if frames not in table.values():
                raise ValueError(f"--frames {frames}: opensora-1.2 takes "
                                 f"{sorted(table.values())} frames (2/4/8/16 s)")
            return frames
        if seconds not in table:
            raise ValueError(f"--seconds {seconds}: opensora-1.2 generates 2, 4, 8 or 16 s "
                             f"({', '.join(f'{s} s = {f} frames' for s, f in table.items())})")
        return table[int(seconds)]
    spec = get_spec(name)
    if spec.frame_rule.startswith("fixed:"):
        n = int(spec.frame_rule.split(":")[1])
        got = frames if frames is not None else (
            None if seconds is None or spec.fps is None else round(seconds * spec.fps))
        if got is not None and got != n:
            what = f"--frames {frames}" if frames is not None else f"--seconds {seconds}"
            alt = f" (= {n / spec.fps:g} s at {spec.fps:g} fps)" if spec.fps else ""
            raise ValueError(f"{what}: {name} generates exactly {n} frames{alt}; "
                             f"use --frames {n}")
        return n
    if frames is None:
        if seconds is None or seconds <= 0:
            raise ValueError(f"--seconds {seconds}: expected > 0")
        frames = int(round(seconds * spec.fps)) + 1
    t = spec.vae[0]
    if frames < 1 or (frames - 1) % t:
        raise ValueError(f"--frames {frames}: {name} takes {t}k+1 frames "
                         f"(its VAE compresses {t} frames into one after the first)")
    return frames


def _latent(name: str, height: int, width: int, frames: int) -> tuple[int, int, int]:
    if name == "opensora-1.2":
        s, (chunk, lat) = OPENSORA["vae_s"], OPENSORA["vae_chunk"]
        div = s * OPENSORA["patch"][1]
        if height % div or width % div:
            raise ValueError(f"--resolution {width}x{height}: opensora-1.2 takes heights and "
                             f"widths that are multiples of {div} (VAE {s} x patch 2)")
        return (frames // chunk * lat, height // s, width // s)
    spec = get_spec(name)
    t, s = spec.vae
    div = s * spec.patch[1]
    if height % div or width % div or height < div or width < div:
        raise ValueError(f"--resolution {width}x{height}: {name} takes heights and widths "
                         f"that are positive multiples of {div} (VAE {s} x patch {spec.patch[1]})")
    return ((frames - 1) // t + 1 if t > 1 else frames, height // s, width // s)


# ------------------------------------------------------------------------------ tracing
def _is_view(func) -> bool:
    return any(r.alias_info is not None for r in func._schema.returns)


_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
              "_unsafe_view", "lift_fresh", "detach", "alias", "unbind", "split",
              "split_with_sizes", "chunk", "_local_scalar_dense", "sym_size", "sym_stride",
              "sym_numel", "sym_storage_offset", "is_same_size"}
_GEMM = {"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution", "conv2d",
         "conv3d", "linear"}


class _Tracer:
    """Collects kernels per cacheable operator during a meta-device forward."""

    def __init__(self, model, groups: tuple[OpGroup, ...], elem_bytes: int):
        self.model = model
        self.params = {id(p) for p in model.parameters()} | {id(b) for b in model.buffers()}
        self.elem_bytes = elem_bytes
        self.pending: list[tuple] = []
        self.other: list[tuple] = []
        self.ops: dict[tuple[int, int, str], dict] = {}   # (group, block, op) -> record
        self.order: list[tuple[int, int, str]] = []
        self.max_working = 0
        self.batch = 1
        self._handles = []
        for g, group in enumerate(groups):
            for b, block in enumerate(getattr(model, group.blocks)):
                self._hook_block(g, b, group, block)

    def _hook_block(self, g, b, group, block):
        self._handles.append(block.register_forward_pre_hook(
            lambda m, a, g=g, b=b: self._block_start(g, b)))
        self._handles.append(block.register_forward_hook(
            lambda m, a, out, g=g, b=b, group=group: self._block_end(g, b, group, out)))
        for name, modules, kind, gated in group.ops:
            for attr in modules:
                if attr == "":
                    continue                       # the whole block: handled at block end
                mod = getattr(block, attr)
                self._handles.append(mod.register_forward_hook(
                    lambda m, a, out, g=g, b=b, name=name: self._op_end(g, b, name, out)))

    def _record(self, g, b, name) -> dict:
        key = (g, b, name)
        if key not in self.ops:
            self.ops[key] = {"rows": [], "tokens": 0, "channels": 0}
            self.order.append(key)
        return self.ops[key]

    def _tokens(self, out) -> tuple[int, int]:
        import torch
        tensors = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                   if isinstance(t, torch.Tensor)]
        c = tensors[0].shape[-1]
        return sum(t.numel() for t in tensors) // (c * self.batch), c

    def _op_end(self, g, b, name, out):
        rec = self._record(g, b, name)
        rec["rows"] += self.pending
        self.pending = []
        t, c = self._tokens(out)
        rec["tokens"] += t
        rec["channels"] = c

    def _block_start(self, g, b):
        self.other += self.pending
        self.pending = []

    def _block_end(self, g, b, group, out):
        whole = [name for name, mods, _, _ in group.ops if mods == ("",)]
        if whole:
            rec = self._record(g, b, whole[0])
            rec["rows"] += self.pending
            t, c = self._tokens(out)
            rec["tokens"], rec["channels"] = t, c
        else:
            last = [k for k in self.order if k[:2] == (g, b)][-1]
            self.ops[last]["rows"] += self.pending
        self.pending = []

    def add(self, flops: float, act: float, weight: float, cls: int) -> None:
        self.pending.append((flops, act, weight, cls))

    def close(self):
        for h in self._handles:
            h.remove()


def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def _make_modes(tracer: _Tracer):
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    class Attention(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                names = ("query", "key", "value")
                q, k, v = (args[i] if i < len(args) else kwargs[n] for i, n in enumerate(names))
                out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
                heads = math.prod(q.shape[:-2])
                flops = 2.0 * heads * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
                act = sum(_tensor_bytes(t) for t in (q, k, v, out))
                tracer.add(flops / tracer.batch, act / tracer.batch, 0.0, ATTENTION)
                tracer.max_working = max(tracer.max_working, act)
                return out
            return func(*args, **kwargs)

    class Kernels_(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if _is_view(func) and name not in ("copy_",) or name in _NO_KERNEL:
                return out
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            weight = act = 0
            for t in ins:
                base = t._base if t._base is not None else t
                if id(base) in tracer.params:
                    weight += _tensor_bytes(t)
                else:
                    act += _tensor_bytes(t)
            act += sum(_tensor_bytes(t) for t in outs if not (name.endswith("_") and t in ins))
            flops = 0.0
            fn = flop_registry.get(func.overloadpacket)
            if fn is not None:
                flops = float(fn(*args, **kwargs, out_val=out))
            cls = GEMM if name in _GEMM else MEMORY
            tracer.add(flops / tracer.batch, act / tracer.batch, float(weight), cls)
            tracer.max_working = max(tracer.max_working, act + weight)
            return out

    return Attention(), Kernels_()


def _build(spec: ModelSpec):
    import diffusers
    import torch

    cls = getattr(diffusers, spec.cls)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    with torch.device("meta"):
        model = cls(**spec.config)
    import logging
    logger = logging.getLogger("diffusers.models.modeling_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)      # Wan warns that some modules "should be kept in fp32"
    try:
        model = model.to(dtype).eval()
    finally:
        logger.setLevel(level)
    return model, dtype


def _inputs(name: str, spec: ModelSpec, latent, dtype):
    import torch

    f, h, w = latent
    meta = dict(device="meta", dtype=dtype)
    c = spec.latent_channels
    t = torch.zeros(1, dtype=torch.long, device="meta")
    text = torch.empty(1, spec.text_tokens, spec.text_dim, **meta)
    if spec.cls == "LatteTransformer3DModel":
        return dict(hidden_states=torch.empty(1, c, f, h, w, **meta), timestep=t,
                    encoder_hidden_states=text, return_dict=False)
    if spec.cls == "CogVideoXTransformer3DModel":
        return dict(hidden_states=torch.empty(1, f, c, h, w, **meta),
                    encoder_hidden_states=text, timestep=t, return_dict=False)
    if spec.cls == "WanTransformer3DModel":
        return dict(hidden_states=torch.empty(1, c, f, h, w, **meta), timestep=t,
                    encoder_hidden_states=text, return_dict=False)
    if spec.cls == "HunyuanVideoTransformer3DModel":
        return dict(hidden_states=torch.empty(1, c, f, h, w, **meta), timestep=t,
                    encoder_hidden_states=text,
                    encoder_attention_mask=torch.ones(1, spec.text_tokens, dtype=torch.bool,
                                                      device="meta"),
                    pooled_projections=torch.empty(1, spec.config["pooled_projection_dim"], **meta),
                    guidance=torch.zeros(1, device="meta", dtype=dtype), return_dict=False)
    raise ValueError(f"{name}: no input recipe for {spec.cls}")


def trace(name: str, height: int, width: int, frames: int) -> ModelShape:
    """Trace model ``name`` (a diffusers preset of :data:`MODELS` or ``"latte-digits"``) at
    ``height x width`` pixels and ``frames`` frames on the meta device.

    Returns:
        the :class:`ModelShape` (per-sample kernels of every cacheable operator and of the
        rest of one forward).
    Raises:
        ValueError: a resolution or frame count the model cannot take.
    """
    import torch

    spec = get_spec(name)
    latent = _latent(name, height, width, frames)
    t0 = time.perf_counter()
    model, dtype = _build(spec)
    elem = torch.empty(0, dtype=dtype).element_size()
    tracer = _Tracer(model, spec.groups, elem)
    attention, kernels = _make_modes(tracer)
    try:
        with torch.no_grad(), attention, kernels:
            model(**_inputs(name, spec, latent, dtype))
    finally:
        tracer.close()
    tracer.other += tracer.pending
    ops: list[OpShape] = []
    f, h, w = latent
    p = spec.patch
    video_tokens = (f // p[0]) * (h // p[1]) * (w // p[2])
    next_layer = 0
    for g, group in enumerate(spec.groups):
        n_blocks = len(getattr(model, group.blocks))
        offset = next_layer if group.layer_offset is None else group.layer_offset
        for b in range(n_blocks):
            for name_, _, kind, gated in group.ops:
                rec = tracer.ops[(g, b, name_)]
                tokens = int(rec["tokens"])
                streams = ((video_tokens, tokens - video_tokens)
                           if spec.streams == 2 and tokens > video_tokens else ())
                ops.append(OpShape(index=0, layer=b + offset, op=name_, kind=kind,
                                   tokens=tokens, channels=int(rec["channels"]),
                                   gated=gated, barrier_after=False,
                                   kernels=Kernels.from_rows(rec["rows"]),
                                   stream_tokens=streams))
        next_layer = offset + n_blocks
    if spec.cls == "LatteTransformer3DModel":
        # Latte's forward order: spatial block i, then temporal block i (layer-major)
        order = {op: i for i, op in enumerate(("spatial_attn", "cross_attn", "spatial_ffn",
                                               "temporal_attn", "temporal_ffn"))}
        ops.sort(key=lambda o: (o.layer, order[o.op]))
        if latent[0] > 1:   # temporal position embedding after layer 0's spatial FFN
            next(o for o in ops if o.ref == (0, "spatial_ffn")).barrier_after = True
    for i, o in enumerate(ops):
        o.index = i
    params = sum(p.numel() for p in model.parameters())
    hidden = ops[0].channels
    return ModelShape(
        name=name, title=spec.title, source=spec.source, traced=True, height=height,
        width=width, frames=frames, latent=latent, video_tokens=video_tokens,
        text_tokens=spec.text_tokens, hidden=hidden,
        num_layers=1 + max(o.layer for o in ops), cfg=spec.cfg, params=int(params),
        weight_bytes=int(params * elem), dtype_bytes=2, ops=ops,
        other=Kernels.from_rows(tracer.other), activation_bytes=int(tracer.max_working),
        trace_s=round(time.perf_counter() - t0, 3))


# ------------------------------------------------------------------------------ Open-Sora
def opensora_shape(height: int, width: int, frames: int) -> ModelShape:
    """Open-Sora 1.2's STDiT3-XL/2 written out from its configuration (:data:`OPENSORA`).

    Each of the 28 layers has a spatial and a temporal STDiT3 block, each: adaLN-single
    modulated self-attention (spatial: over the N tokens of a frame; temporal: over the F
    frames of a position; RMS-normed q, k), cross attention to the 300 T5 tokens (added
    ungated), and a 4x GELU MLP, gated. Per sample, T = F·N tokens, C = 1152, L = 300:

    - self-attention: q, k, v, proj GEMMs ``4 · 2TC²``; scores and values ``4·T·S·C``
      with S = N (spatial) or F (temporal);
    - cross attention: q and proj ``2 · 2TC²``, k and v ``2 · 2LC²``; scores ``4·T·L·C``;
    - MLP: ``2 · 2·T·C·4C``;
    - elementwise kernels as the traced PixArt-α blocks of Latte-1 run them (layer norm,
      modulation, gate and residual: read and write of [T, C] per kernel).

    Kernel bytes: GEMM inputs + outputs (bf16) and weights; attention q, k, v, o.
    """
    cfg = OPENSORA
    latent = _latent("opensora-1.2", height, width, frames)
    f, h, w = latent
    n = (h // 2) * (w // 2)
    t_ = f * n
    c, L, e = cfg["hidden"], cfg["text_tokens"], 2
    mlp = cfg["mlp_ratio"] * c

    def gemm(m, k, nn, weight=True):
        return (2.0 * m * k * nn, float(e * (m * k + m * nn)), float(e * k * nn if weight else 0),
                GEMM)

    def mem(elems, passes=2):     # elementwise: no FLOPs counted (as torch's flop counter)
        return (0.0, float(e * elems * passes), 0.0, MEMORY)

    def attn(seq, kv, groups):
        return (4.0 * groups * seq * kv * c, float(e * groups * (2 * seq + 2 * kv) * c), 0.0,
                ATTENTION)

    def self_attn(temporal: bool):
        s, g = (f, n) if temporal else (n, f)
        return [mem(t_ * c), mem(t_ * c, 3),                    # layer norm, modulate
                gemm(t_, c, 3 * c), mem(2 * t_ * c),            # qkv, RMS-norm q, k
                attn(s, s, g), gemm(t_, c, c), mem(t_ * c, 3)]  # attention, proj, gate+add

    def cross():
        return [gemm(t_, c, c), gemm(L, c, 2 * c), attn(t_, L, 1), gemm(t_, c, c),
                mem(t_ * c, 3)]

    def ffn():
        return [mem(t_ * c), mem(t_ * c, 3), gemm(t_, c, mlp), mem(t_ * mlp),
                gemm(t_, mlp, c), mem(t_ * c, 3)]

    ops: list[OpShape] = []
    for layer in range(cfg["depth"]):
        for name, kind, rows, gated in (
                ("spatial_attn", "spatial_attn", self_attn(False), True),
                ("spatial_cross_attn", "cross_attn", cross(), False),
                ("spatial_ffn", "spatial_ffn", ffn(), True),
                ("temporal_attn", "temporal_attn", self_attn(True), True),
                ("temporal_cross_attn", "cross_attn", cross(), False),
                ("temporal_ffn", "temporal_ffn", ffn(), True)):
            ops.append(OpShape(index=len(ops), layer=layer, op=name, kind=kind, tokens=t_,
                               channels=c, gated=gated, barrier_after=False,
                               kernels=Kernels.from_rows(rows)))
    # x embedder (patch conv), t embedder, y embedder (4096 -> 1152 -> 1152), final layer
    other = Kernels.from_rows([gemm(t_, cfg["latent_channels"] * 4, c),
                               gemm(L, cfg["text_dim"], c), gemm(L, c, c),
                               mem(t_ * c, 3), gemm(t_, c, cfg["latent_channels"] * 2 * 4)])
    per_block = 4 * c * c + c + 4 * c * c + 2 * c * mlp   # attn, cross (q,k,v,o), mlp
    params = 2 * cfg["depth"] * per_block + cfg["text_dim"] * c + c * c
    return ModelShape(
        name="opensora-1.2", title=cfg["title"], source=cfg["source"], traced=False,
        height=height, width=width, frames=frames, latent=latent, video_tokens=t_,
        text_tokens=L, hidden=c, num_layers=cfg["depth"], cfg=cfg["cfg"], params=int(params),
        weight_bytes=int(params * e), dtype_bytes=e, ops=ops, other=other,
        activation_bytes=int(e * t_ * mlp * 2))


# ------------------------------------------------------------------------------ entry
def model_shape(name: str, resolution: str | tuple[int, int] | None = None,
                seconds: float | None = None, frames: int | None = None,
                cache_dir: Path | None = None) -> ModelShape:
    """The :class:`ModelShape` of preset ``name`` at ``resolution`` (name, ``WxH`` or
    (height, width)) and ``seconds`` (or ``frames``).

    Traced shapes are cached as JSON under ``cache_dir`` (keyed by model, size and frames;
    the trace is deterministic), so a repeated call costs a file read.
    Raises ValueError for an unknown model or a size the model cannot take.
    """
    if name not in model_names():
        raise ValueError(f"--model {name!r}: expected one of {', '.join(model_names())}")
    if resolution is None:
        if name != "latte-digits":
            raise ValueError(f"{name}: a resolution is needed")
        size = json.loads(_shipped_config().read_text())["data"]["size"]
        height, width = size, size
    elif isinstance(resolution, tuple):
        height, width = resolution
    else:
        height, width = resolve_resolution(resolution)
    n = frames_for(name, seconds, frames)
    if name == "opensora-1.2":
        return opensora_shape(height, width, n)
    _latent(name, height, width, n)     # refuse a bad size before anything else
    if cache_dir is not None:
        path = Path(cache_dir) / f"{name}_{width}x{height}_{n}f_v{SHAPES_VERSION}.json"
        if path.is_file():
            return ModelShape.from_json(path.read_text())
    shape = trace(name, height, width, n)
    if cache_dir is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")   # concurrent sweep points share it
        tmp.write_text(shape.to_json())
        tmp.replace(path)
    return shape


def _shipped_config() -> Path:
    from coda.host.model.dit import CONFIG_FILE
    return Path(CONFIG_FILE)


def shipped_shape(model_config: dict | None = None) -> ModelShape:
    """The shipped digit Latte's shape at its training size (8 frames of 32 x 32)."""
    if model_config is None:
        model_config = json.loads(_shipped_config().read_text())
    size, frames = model_config["data"]["size"], model_config["data"]["frames"]
    return trace("latte-digits", size, size, frames)
