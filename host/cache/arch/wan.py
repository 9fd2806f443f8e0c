"""Wan 2.1 / 2.2 (diffusers ``WanTransformer3DModel``).

Blocks: ``blocks[i]`` (``WanTransformerBlock``), layer ``i``. One residual stream, the video
tokens ``[B, T, C]`` (T = F' * H' * W' patches, the slots' order).

The operators, their gates and residuals, the segment barriers and the rest the engine
needs to know: :class:`Wan`.
"""

from __future__ import annotations

import torch

from .base import Architecture, BlockSpec

__all__ = ["Wan"]


class _WanBlock(BlockSpec):
    block_class = "WanTransformerBlock"
    ops = ("attn", "cross_attn", "ffn")
    op_modules = {"attn": ("attn1",), "cross_attn": ("attn2",), "ffn": ("ffn",)}
    ungated = frozenset({"cross_attn"})
    structure = {"norm1": torch.nn.Module, "attn1": torch.nn.Module, "norm2": torch.nn.Module,
                 "attn2": torch.nn.Module, "norm3": torch.nn.Module, "ffn": torch.nn.Module,
                 "scale_shift_table": torch.Tensor}
    call_params = ("temb", "rotary_emb")

    def check(self, call):
        if call.args["temb"].ndim != 3:
            raise ValueError("per-token timestep modulation (Wan 2.2 TI2V, expand_timesteps): "
                             "the NME applies one gate per channel and sample; not supported")

    def prepare(self, call, batch):
        # shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa: [B, 1, C] each
        return (call.block.scale_shift_table + call.args["temb"].float()).chunk(6, dim=1)

    def gates(self, state, call, op, samples):
        if op == "cross_attn":
            return {"hidden": torch.ones(len(samples), call.block.scale_shift_table.shape[-1])}
        mods = call.prep
        return {"hidden": state.rows(mods[2 if op == "attn" else 5], samples)[:, 0, :]}

    def compute(self, state, call, op, samples):
        # diffusers 0.42 WanTransformerBlock.forward, op by op
        block, mods = call.block, [state.rows(m, samples) for m in call.prep]
        h = state.take("hidden", samples)
        if op == "attn":
            shift_msa, scale_msa, gate_msa = mods[0], mods[1], mods[2]
            norm = (block.norm1(h.float()) * (1 + scale_msa) + shift_msa).type_as(h)
            out = block.attn1(norm, None, None, call.args["rotary_emb"])
            h = (h.float() + out * gate_msa).type_as(h)
        elif op == "cross_attn":
            norm = block.norm2(h.float()).type_as(h)
            out = block.attn2(norm, state.rows(call.args["encoder_hidden_states"], samples), None, None)
            h = h + out
        else:
            c_shift_msa, c_scale_msa, c_gate_msa = mods[3], mods[4], mods[5]
            norm = (block.norm3(h.float()) * (1 + c_scale_msa) + c_shift_msa).type_as(h)
            out = block.ffn(norm)
            h = (h.float() + out.float() * c_gate_msa).type_as(h)
        state.put("hidden", samples, h)
        return {"hidden": out}


class Wan(Architecture):
    """Wan as the cache engine runs it.

    ===============  ==================================================  =================
    op               pre-gate output ``c``                               gate ``g``
    ===============  ==================================================  =================
    ``attn``         ``attn1(norm1(x) * (1+scale_msa) + shift_msa, rope)``  ``gate_msa``
    ``cross_attn``   ``attn2(norm2(x), text [+ image] tokens)``          1 (added as is)
    ``ffn``          ``ffn(norm3(x) * (1+c_scale_msa) + c_shift_msa)``   ``c_gate_msa``
    ===============  ==================================================  =================

    The adaLN vectors are ``scale_shift_table + temb`` (float32), one ``[C]`` gate per sample; the
    residual is ``(x.float() + c * g).type_as(x)`` (``x + c`` for cross attention), as the block.
    Segment barriers: none; the model passes the stream straight from block to block, so a
    segment may span any number of blocks. Refused: per-token timesteps (Wan 2.2 TI2V
    ``expand_timesteps``: a gate per token, which the NME's per-channel gate cannot apply).
    """
    name = "wan"
    model_class = "WanTransformer3DModel"
    block_lists = (("blocks", _WanBlock()),)
    config_keys = ("num_attention_heads", "attention_head_dim")

    def check_call(self, model, args):
        if args["timestep"].ndim == 2:
            raise ValueError("per-token timesteps (Wan 2.2 TI2V, expand_timesteps): the NME "
                             "applies one gate per channel and sample; not supported")
