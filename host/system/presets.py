"""Model presets: the video DiTs ``coda sim`` knows, each from its published configuration
with its sources, how a resolution and a duration map to frames and a latent, and the entry
points :func:`model_shape` / :func:`shipped_shape`.

- every diffusers model (:data:`MODELS`: Latte-1, CogVideoX-2B/5B, Wan 2.1 1.3B/14B,
  HunyuanVideo) and the shipped Lattes (``latte-digits``, ``latte-text``) are traced on the meta device
  (:mod:`coda.host.system.trace`), its operators those of the cache engine's adapter;
- Open-Sora 1.2 (STDiT3, no diffusers class) is written by hand (:func:`opensora_shape`),
  from its published configuration and the arithmetic of its blocks, and checked against the
  traced Latte-1 blocks (the same PixArt-α block) in ``tests/host/system/test_system.py``.

Traced shapes are cached as JSON (:func:`model_shape`'s ``cache_dir``). Units as
:mod:`coda.host.system.shapes`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from coda.paths import write_file

from .shapes import ATTENTION, GEMM, MEMORY, Kernels, ModelShape, OpShape
from .trace import ModelSpec, trace, with_layers

__all__ = ["MODELS", "OPENSORA", "RESOLUTIONS", "MAX_SIDE", "MAX_SECONDS", "MAX_FRAMES",
           "get_spec", "model_names", "resolve_resolution", "frames_for", "video_size", "model_shape",
           "opensora_shape", "shipped_shape", "shipped_presets"]

#: bumped when the traced fields change, so cached shape files of an older trace are not read
SHAPES_VERSION = 2

#: resolution name -> (height, width) in pixels
RESOLUTIONS = {"480p": (480, 832), "720p": (720, 1280)}
# Bounds of what the model is asked to trace (beyond them a meta-device trace takes minutes
# or overflows; the published video DiTs generate up to 1280x720 and 16 s): 4K sides, a minute.
MAX_SIDE = 4096
MAX_SECONDS = 60.0
MAX_FRAMES = 2049

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
        notes="CogVideoX README: 8 fps, 49 frames = 6 s (num_seconds*fps + 1), 226 prompt "
              "tokens; pipeline CFG batched; runs in fp16 (README: FP16 recommended).",
        dtype="fp16"),
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
        notes="as CogVideoX-2B; bf16 (README); the 3D RoPE (elementwise on q, k) is not "
              "passed in the trace: its kernels are missing (< 1 % of the FLOPs)."),
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
        notes="HunyuanVideo README: 129 frames at 24 fps (5.4 s), 720x1280; LLaVA-LLaMA "
              "prompt padded to 256 tokens (pipeline max_sequence_length); guidance-distilled "
              "(guidance_embeds): one call per step, true CFG off by default."),
}


def _shipped_spec(name: str) -> ModelSpec:
    """The system model's spec of the shipped model whose preset is ``name``
    (:attr:`coda.host.model.dit.ShippedModel.preset`), from its architecture."""
    from coda.host.model.dit import MODELS

    chosen = next(m for m in MODELS.values() if m.preset == name)
    cfg = chosen.architecture
    t = cfg["transformer"]
    text = cfg.get("conditioning") == "text"
    if text:
        from coda.host.model.prompts import MAX_TOKENS
    blocks = t["num_layers"]
    return ModelSpec(
        title=(f"shipped {'text' if text else 'digit'} Latte ({blocks} spatial + {blocks} "
               f"temporal blocks, hidden {t['num_attention_heads'] * t['attention_head_dim']})"),
        cls="LatteTransformer3DModel", config=dict(t),
        source=str(chosen.config_file.relative_to(chosen.config_file.parents[2])),
        vae=(1, 1), patch=(1, t["patch_size"], t["patch_size"]),
        latent_channels=t["in_channels"], fps=None, frame_rule=f"fixed:{t['video_length']}",
        text_tokens=MAX_TOKENS if text else 1, text_dim=t["caption_channels"], cfg="batched",
        notes=("pixel space (no VAE), the prompt's padded tokens from the small text encoder "
               "(its cost not modelled: once per video)" if text else
               "pixel space (no VAE), one label token") +
              "; coda.host.model.sample batches CFG.",
        dtype="fp32")


def shipped_presets() -> tuple[str, ...]:
    """The system model's preset names of the shipped models (``latte-digits``,
    ``latte-text``: :attr:`coda.host.model.dit.ShippedModel.preset`)."""
    from coda.host.model.dit import MODELS
    return tuple(m.preset for m in MODELS.values())


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
    """The :class:`~coda.host.system.trace.ModelSpec` of diffusers preset ``name`` (a key of
    :data:`MODELS`) or of a shipped model (:func:`shipped_presets`)."""
    if name in shipped_presets():
        return _shipped_spec(name)
    return MODELS[name]


def model_names() -> list[str]:
    """Every preset: the diffusers ones, ``opensora-1.2`` (hand-written) and the shipped
    models (:func:`shipped_presets`)."""
    return sorted(list(MODELS) + ["opensora-1.2", *shipped_presets()])


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
    return get_spec(name).latent(name, height, width, frames)


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
def video_size(name: str, resolution: str | tuple[int, int] | None = None,
               seconds: float | None = None, frames: int | None = None) -> tuple[int, int, int]:
    """(height, width, frames) of a video of preset ``name`` at ``resolution`` (name, ``WxH``
    or (height, width); None only for a shipped model: its training size) and ``seconds``
    (or ``frames``, :func:`frames_for`). Raises ValueError naming the bad value."""
    if resolution is None:
        if name not in shipped_presets():
            raise ValueError(f"{name}: a resolution is needed")
        size = _shipped_architecture(name)["data"]["size"]
        height, width = size, size
    elif isinstance(resolution, tuple):
        height, width = resolution
    else:
        height, width = resolve_resolution(resolution)
    return height, width, frames_for(name, seconds, frames)


def model_shape(name: str, resolution: str | tuple[int, int] | None = None,
                seconds: float | None = None, frames: int | None = None,
                cache_dir: Path | None = None, layers: int | None = None) -> ModelShape:
    """The :class:`ModelShape` of preset ``name`` at ``resolution`` (name, ``WxH`` or
    (height, width)) and ``seconds`` (or ``frames``); ``layers``: the model cut to at most
    that many blocks per block list (:func:`coda.host.system.trace.with_layers`, a check at a
    small size; None: the published depth).

    Traced shapes are cached as JSON under ``cache_dir`` (keyed by model, size, frames and
    layers; the trace is deterministic), so a repeated call costs a file read.
    Raises ValueError for an unknown model, a size the model cannot take, or ``layers`` for
    opensora-1.2 (hand-written, not traced) or below 1.
    """
    if name not in model_names():
        raise ValueError(f"--model {name!r}: expected one of {', '.join(model_names())}")
    height, width, n = video_size(name, resolution, seconds, frames)
    if name == "opensora-1.2":
        if layers is not None:
            raise ValueError("layers: opensora-1.2 is written by hand, not traced; expected "
                             "None")
        return opensora_shape(height, width, n)
    spec = with_layers(get_spec(name), layers)
    _latent(name, height, width, n)     # refuse a bad size before anything else
    if cache_dir is not None:
        cut = "" if layers is None else f"_{int(layers)}l"
        path = Path(cache_dir) / f"{name}_{width}x{height}_{n}f{cut}_v{SHAPES_VERSION}.json"
        if path.is_file():
            return ModelShape.from_json(path.read_text())
    shape = trace(name, spec, height, width, n)
    if cache_dir is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, shape.to_json())   # concurrent sweep points share it
    return shape


def _shipped_architecture(name: str) -> dict:
    """The configuration of the shipped model whose preset is ``name``."""
    from coda.host.model.dit import MODELS
    return next(m for m in MODELS.values() if m.preset == name).architecture


def shipped_shape(model_config: dict | None = None) -> ModelShape:
    """A shipped Latte's shape at its training size (8 frames of 32 x 32): the model of
    ``model_config`` (a model's ``config``: text-conditioned or not), default the digits
    model's."""
    if model_config is None:
        model_config = _shipped_architecture("latte-digits")
    name = "latte-text" if model_config.get("conditioning") == "text" else "latte-digits"
    size, frames = model_config["data"]["size"], model_config["data"]["frames"]
    return trace(name, get_spec(name), size, size, frames)
