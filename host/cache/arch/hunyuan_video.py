"""HunyuanVideo (diffusers ``HunyuanVideoTransformer3DModel``, no token replacement).

Blocks: dual-stream ``transformer_blocks[i]`` (``HunyuanVideoTransformerBlock``), layers
0..L-1, then single-stream ``single_transformer_blocks[j]``
(``HunyuanVideoSingleTransformerBlock``), layers L..L+S-1. Two residual streams, each
``[B, T, C]``: ``"hidden"`` (video tokens) and ``"encoder"`` (the refined text tokens).

The operators, their gates and residuals, the segment barriers and the rest the engine
needs to know: :class:`HunyuanVideo`.
"""

from __future__ import annotations

import torch

from .base import Architecture, BlockSpec, UnsupportedModelError

__all__ = ["HunyuanVideo"]


def _mod(norm, temb, chunks):
    return norm.linear(norm.silu(temb)).chunk(chunks, dim=1)


class _DualBlock(BlockSpec):
    block_class = "HunyuanVideoTransformerBlock"
    ops = ("attn", "ffn")
    op_modules = {"attn": ("attn",), "ffn": ("ff", "ff_context")}
    streams = {"hidden": "hidden_states", "encoder": "encoder_hidden_states"}
    returns_tuple = True
    structure = ({f"{norm}.{part}": torch.nn.Module for norm in ("norm1", "norm1_context")
                  for part in ("linear", "silu", "norm")}
                 | {"norm1.emb": (torch.nn.Module, type(None)),
                    "norm1_context.emb": (torch.nn.Module, type(None))}
                 | {name: torch.nn.Module for name in ("attn", "norm2", "norm2_context", "ff",
                                                       "ff_context")})
    call_params = ("temb", "attention_mask", "freqs_cis")

    def prepare(self, call, batch):
        # shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp: [B, C] each
        temb = call.args["temb"]
        return _mod(call.block.norm1, temb, 6), _mod(call.block.norm1_context, temb, 6)

    def gates(self, state, call, op, samples):
        k = 2 if op == "attn" else 5
        mods, cmods = call.prep
        return {"hidden": state.rows(mods[k], samples), "encoder": state.rows(cmods[k], samples)}

    def compute(self, state, call, op, samples):
        # diffusers 0.42 HunyuanVideoTransformerBlock.forward, op by op
        block = call.block
        mods, cmods = ([state.rows(m, samples) for m in ms] for ms in call.prep)
        h, e = state.take("hidden", samples), state.take("encoder", samples)
        if op == "attn":
            shift_msa, scale_msa, gate_msa = mods[:3]
            c_shift_msa, c_scale_msa, c_gate_msa = cmods[:3]
            norm_h = block.norm1.norm(h) * (1 + scale_msa[:, None]) + shift_msa[:, None]
            norm_e = block.norm1_context.norm(e) * (1 + c_scale_msa[:, None]) + c_shift_msa[:, None]
            out_h, out_e = block.attn(hidden_states=norm_h, encoder_hidden_states=norm_e,
                                      attention_mask=state.rows(call.args["attention_mask"], samples),
                                      image_rotary_emb=call.args["freqs_cis"])
            h = h + out_h * gate_msa.unsqueeze(1)
            e = e + out_e * c_gate_msa.unsqueeze(1)
        else:
            shift_mlp, scale_mlp, gate_mlp = mods[3:]
            c_shift_mlp, c_scale_mlp, c_gate_mlp = cmods[3:]
            norm_h = block.norm2(h)
            norm_e = block.norm2_context(e)
            norm_h = norm_h * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
            norm_e = norm_e * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
            out_h = block.ff(norm_h)
            out_e = block.ff_context(norm_e)
            h = h + gate_mlp.unsqueeze(1) * out_h
            e = e + c_gate_mlp.unsqueeze(1) * out_e
        state.put("hidden", samples, h)
        state.put("encoder", samples, e)
        return {"hidden": out_h, "encoder": out_e}


class _SingleBlock(BlockSpec):
    block_class = "HunyuanVideoSingleTransformerBlock"
    ops = ("single",)
    op_modules = {"single": ()}
    streams = {"hidden": "hidden_states", "encoder": "encoder_hidden_states"}
    returns_tuple = True
    structure = {f"norm.{part}": torch.nn.Module for part in ("linear", "silu", "norm")} | {
        name: torch.nn.Module for name in ("proj_mlp", "act_mlp", "attn", "proj_out")}
    call_params = ("temb", "attention_mask", "image_rotary_emb")

    def prepare(self, call, batch):
        return _mod(call.block.norm, call.args["temb"], 3)     # shift, scale, gate: [B, C]

    def gates(self, state, call, op, samples):
        gate = state.rows(call.prep[2], samples)
        return {"hidden": gate, "encoder": gate}

    def compute(self, state, call, op, samples):
        # diffusers 0.42 HunyuanVideoSingleTransformerBlock.forward
        block = call.block
        shift_msa, scale_msa, gate = (state.rows(m, samples) for m in call.prep)
        h, e = state.take("hidden", samples), state.take("encoder", samples)
        text = e.shape[1]
        x = torch.cat([h, e], dim=1)
        residual = x
        norm_x = block.norm.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        mlp = block.act_mlp(block.proj_mlp(norm_x))
        norm_h, norm_e = norm_x[:, :-text, :], norm_x[:, -text:, :]
        attn, context_attn = block.attn(hidden_states=norm_h, encoder_hidden_states=norm_e,
                                        attention_mask=state.rows(call.args["attention_mask"], samples),
                                        image_rotary_emb=call.args["image_rotary_emb"])
        attn = torch.cat([attn, context_attn], dim=1)
        out = block.proj_out(torch.cat([attn, mlp], dim=2))
        x = gate.unsqueeze(1) * out
        x = x + residual
        state.put("hidden", samples, x[:, :-text, :])
        state.put("encoder", samples, x[:, -text:, :])
        return {"hidden": out[:, :-text, :], "encoder": out[:, -text:, :]}


class HunyuanVideo(Architecture):
    """HunyuanVideo as the cache engine runs it.

    ==========  =======  ===================================================  ===================
    op          block    pre-gate output ``c`` (video / text)                 gate ``g`` (video / text)
    ==========  =======  ===================================================  ===================
    ``attn``    dual     joint ``attn(norm1(video), norm1_context(text))``    ``gate_msa`` / ``c_gate_msa``
    ``ffn``     dual     ``ff(norm2(video) mod)`` / ``ff_context(... text)``  ``gate_mlp`` / ``c_gate_mlp``
    ``single``  single   ``proj_out(cat(attn, mlp))`` over cat(video, text),  ``gate`` / the same
                         split back at the text                               ``gate``
    ==========  =======  ===================================================  ===================

    The residual of each stream is ``x + g * c`` (dual blocks: ``x + c * g`` and ``x + g * c``,
    single: ``g * c + x``: the same IEEE operations); the adaLN linears (``AdaLayerNormZero``,
    ``AdaLayerNormZeroSingle``) run once per block call on the whole batch, as the block does.
    A reused operator is applied to both streams: one NME program per stream per segment.
    Segment barriers: none; the model passes both streams straight through the dual blocks and
    on into the single blocks (the single block's concatenation is inside the operator).
    Refused: ``image_condition_type="token_replace"`` (other block classes).
    """
    name = "hunyuan_video"
    model_class = "HunyuanVideoTransformer3DModel"
    block_lists = (("transformer_blocks", _DualBlock()), ("single_transformer_blocks", _SingleBlock()))
    config_keys = ("image_condition_type", "num_attention_heads", "attention_head_dim")

    def check_model(self, model):
        if getattr(model.config, "image_condition_type", None) == "token_replace":
            raise UnsupportedModelError("HunyuanVideo image_condition_type='token_replace' (its "
                                        "token-replace blocks) is not supported")
        self.check_structure(model)
        for block in model.transformer_blocks:
            if block.norm1.emb is not None or block.norm1_context.emb is not None:
                raise UnsupportedModelError("HunyuanVideo block with a label embedding in its "
                                            "adaLN: not what the adapter replays")
        super().check_model(model)
