"""CogVideoX 1.0 / 1.5 (diffusers ``CogVideoXTransformer3DModel``).

Blocks: ``transformer_blocks[i]`` (``CogVideoXBlock``), layer ``i``. Two residual streams,
each ``[B, T, C]``: ``"hidden"`` (the video tokens) and ``"encoder"`` (the text tokens, which
CogVideoX carries through every block alongside the video). Both operators are joint and gate
each stream with its own adaLN vector (``CogVideoXLayerNormZero``).

The operators, their gates and residuals, the segment barriers and the rest the engine
needs to know: :class:`CogVideoX`.
"""

from __future__ import annotations

import torch

from .base import Architecture, BlockSpec

__all__ = ["CogVideoX"]


class _CogVideoXBlock(BlockSpec):
    block_class = "CogVideoXBlock"
    ops = ("attn", "ffn")
    op_modules = {"attn": ("attn1",), "ffn": ("ff",)}
    streams = {"hidden": "hidden_states", "encoder": "encoder_hidden_states"}
    returns_tuple = True
    structure = {f"{norm}.{part}": torch.nn.Module for norm in ("norm1", "norm2")
                 for part in ("linear", "silu", "norm")} | {"attn1": torch.nn.Module,
                                                           "ff": torch.nn.Module}
    call_params = ("temb", "image_rotary_emb", "attention_kwargs")

    def prepare(self, call, batch):
        # shift, scale, gate, enc_shift, enc_scale, enc_gate: [B, C] each, per norm
        temb = call.args["temb"]
        return {norm: getattr(call.block, norm).linear(getattr(call.block, norm).silu(temb)).chunk(6, dim=1)
                for norm in ("norm1", "norm2")}

    def gates(self, state, call, op, samples):
        mods = call.prep["norm1" if op == "attn" else "norm2"]
        return {"hidden": state.rows(mods[2], samples), "encoder": state.rows(mods[5], samples)}

    def compute(self, state, call, op, samples):
        # diffusers 0.42 CogVideoXBlock.forward (with CogVideoXLayerNormZero), op by op
        block = call.block
        norm = getattr(block, "norm1" if op == "attn" else "norm2")
        shift, scale, gate, enc_shift, enc_scale, enc_gate = (state.rows(m, samples)
                                                              for m in call.prep["norm1" if op == "attn" else "norm2"])
        h, e = state.take("hidden", samples), state.take("encoder", samples)
        norm_h = norm.norm(h) * (1 + scale)[:, None, :] + shift[:, None, :]
        norm_e = norm.norm(e) * (1 + enc_scale)[:, None, :] + enc_shift[:, None, :]
        if op == "attn":
            out_h, out_e = block.attn1(hidden_states=norm_h, encoder_hidden_states=norm_e,
                                       image_rotary_emb=call.args["image_rotary_emb"],
                                       **(call.args["attention_kwargs"] or {}))
        else:
            text = e.size(1)
            ff = block.ff(torch.cat([norm_e, norm_h], dim=1))
            out_h, out_e = ff[:, text:], ff[:, :text]
        h = h + gate[:, None, :] * out_h
        e = e + enc_gate[:, None, :] * out_e
        state.put("hidden", samples, h)
        state.put("encoder", samples, e)
        return {"hidden": out_h, "encoder": out_e}


class CogVideoX(Architecture):
    """CogVideoX as the cache engine runs it.

    =========  =======================================================  ======================
    op         pre-gate output ``c`` (video / text)                     gate ``g`` (video / text)
    =========  =======================================================  ======================
    ``attn``   ``attn1(norm1(video), norm1(text), rope)``: both outputs  ``gate`` / ``enc_gate``
    ``ffn``    ``ff(cat(norm2(text), norm2(video)))`` split at the text  ``gate`` / ``enc_gate``
    =========  =======================================================  ======================

    The residual of each stream is ``x + g * c``; a reused operator is applied to both streams, so
    a segment is one NME program per stream (``SegmentEvent.stream_tokens``). The adaLN linear is
    computed once per block call on the whole batch, as the block does.
    Segment barriers: none; the model passes both streams straight from block to block.
    """
    name = "cogvideox"
    model_class = "CogVideoXTransformer3DModel"
    block_lists = (("transformer_blocks", _CogVideoXBlock()),)
    config_keys = ("num_attention_heads", "attention_head_dim")
