"""Latte (diffusers ``LatteTransformer3DModel``, ``norm_type="ada_norm_single"``).

Blocks: ``transformer_blocks[i]`` (spatial) and ``temporal_transformer_blocks[i]`` (temporal),
both diffusers ``BasicTransformerBlock``; the model calls spatial ``i`` then temporal ``i``,
and both are layer ``i``. One residual stream, the video tokens.

The operators, their gates and residuals, the segment barriers and the rest the engine
needs to know: :class:`Latte`.
"""

from __future__ import annotations

import torch

from .base import Architecture, BlockCall, BlockSpec, StepState, UnsupportedModelError

__all__ = ["Latte"]

_GATE_CHUNK = {"spatial_attn": 2, "temporal_attn": 2, "spatial_ffn": 5, "temporal_ffn": 5}


class _LatteBlock(BlockSpec):
    """A ``BasicTransformerBlock`` with ``norm_type="ada_norm_single"``."""
    block_class = "BasicTransformerBlock"
    temporal = False
    structure = {"norm1": torch.nn.Module, "attn1": torch.nn.Module,
                 "attn2": (torch.nn.Module, type(None)), "norm2": torch.nn.Module,
                 "ff": torch.nn.Module, "scale_shift_table": torch.Tensor,
                 "_chunk_size": (int, type(None)), "_chunk_dim": int}
    call_params = ("attention_mask", "encoder_hidden_states", "encoder_attention_mask",
                   "timestep", "cross_attention_kwargs", "class_labels", "added_cond_kwargs")

    def check(self, call: BlockCall) -> None:
        a = call.args
        if a["attention_mask"] is not None or a["encoder_attention_mask"] is not None:
            raise ValueError("encoder_attention_mask: the CODA cache engine supports unmasked "
                             "conditions only (pass None)")
        if a["cross_attention_kwargs"] or a["class_labels"] is not None or a["added_cond_kwargs"]:
            raise ValueError("Latte block called with cross_attention_kwargs / class_labels / "
                             "added_cond_kwargs: not what LatteTransformer3DModel passes")

    def _modulation(self, state: StepState, call: BlockCall, samples: torch.Tensor):
        t = call.args["timestep"]                        # [B * per, 6C], per-frame/patch copies
        t = state.rows(t, samples, t.shape[0] // state.b)
        return (call.block.scale_shift_table[None] + t.reshape(t.shape[0], 6, -1)).chunk(6, dim=1)

    def gates(self, state, call, op, samples):
        if op == "cross_attn":
            return {"hidden": torch.ones(len(samples), call.block.scale_shift_table.shape[-1])}
        t = call.args["timestep"]
        first = t.reshape(state.b, t.shape[0] // state.b, t.shape[-1])[:, 0]     # [B, 6C]
        first = state.rows(first, samples)
        mods = (call.block.scale_shift_table[None] + first.reshape(first.shape[0], 6, -1)).chunk(6, dim=1)
        return {"hidden": mods[_GATE_CHUNK[op]][:, 0, :]}

    def compute(self, state, call, op, samples):
        # diffusers 0.42 BasicTransformerBlock.forward, ada_norm_single path, op by op
        block = call.block
        h = state.take("hidden", samples)
        s, f, n, c = h.shape
        if self.temporal:
            x = h.permute(0, 2, 1, 3).reshape(s * n, f, c)
            mods = self._modulation(state, call, samples)
        else:
            x = h.reshape(s * f, n, c)
            mods = self._modulation(state, call, samples) if op != "cross_attn" else None
        if op in ("spatial_attn", "temporal_attn"):
            shift_msa, scale_msa, gate_msa = mods[0], mods[1], mods[2]
            norm = block.norm1(x) * (1 + scale_msa) + shift_msa
            out = block.attn1(norm, encoder_hidden_states=None, attention_mask=None)
            x = gate_msa * out + x
        elif op == "cross_attn":
            ehs = state.rows(call.args["encoder_hidden_states"], samples, f)
            out = block.attn2(x, encoder_hidden_states=ehs, attention_mask=None)
            x = out + x
        else:
            shift_mlp, scale_mlp, gate_mlp = mods[3], mods[4], mods[5]
            norm = block.norm2(x) * (1 + scale_mlp) + shift_mlp
            if block._chunk_size is not None:
                from diffusers.models.attention import _chunked_feed_forward

                out = _chunked_feed_forward(block.ff, norm, block._chunk_dim, block._chunk_size)
            else:
                out = block.ff(norm)
            x = gate_mlp * out + x
        if self.temporal:
            x = x.reshape(s, n, f, c).permute(0, 2, 1, 3)
            out = out.reshape(s, n, f, c).permute(0, 2, 1, 3)
        else:
            x, out = x.reshape(s, f, n, c), out.reshape(s, f, n, c)
        state.put("hidden", samples, x)
        return {"hidden": out}


class _Spatial(_LatteBlock):
    ops = ("spatial_attn", "cross_attn", "spatial_ffn")
    op_modules = {"spatial_attn": ("attn1",), "cross_attn": ("attn2",), "spatial_ffn": ("ff",)}
    ungated = frozenset({"cross_attn"})

    def to_canonical(self, stream, x, batch):           # [B*F, N, C] -> [B, F, N, C]
        return x.reshape(batch, -1, x.shape[-2], x.shape[-1])

    def from_canonical(self, stream, h):
        return h.reshape(-1, h.shape[-2], h.shape[-1]).contiguous()


class _Temporal(_LatteBlock):
    ops = ("temporal_attn", "temporal_ffn")
    op_modules = {"temporal_attn": ("attn1",), "temporal_ffn": ("ff",)}
    temporal = True

    def check(self, call):
        super().check(call)
        if call.args["encoder_hidden_states"] is not None:
            raise ValueError("Latte temporal block called with encoder_hidden_states")

    def to_canonical(self, stream, x, batch):           # [B*N, F, C] -> [B, F, N, C]
        return x.reshape(batch, -1, x.shape[-2], x.shape[-1]).permute(0, 2, 1, 3)

    def from_canonical(self, stream, h):
        return h.permute(0, 2, 1, 3).reshape(-1, h.shape[1], h.shape[-1]).contiguous()


class Latte(Architecture):
    """Latte as the cache engine runs it.

    =================  ===============  ====================================  ==================
    op                 block            pre-gate output ``c``                 gate ``g``
    =================  ===============  ====================================  ==================
    ``spatial_attn``   spatial          ``attn1(norm1(x) * (1+scale) + shift)``  ``gate_msa``
    ``cross_attn``     spatial          ``attn2(x, label / caption tokens)``  1 (added as is)
    ``spatial_ffn``    spatial          ``ff(norm2(x) * (1+scale) + shift)``  ``gate_mlp``
    ``temporal_attn``  temporal         as spatial, over the frames           ``gate_msa``
    ``temporal_ffn``   temporal         as spatial                            ``gate_mlp``
    =================  ===============  ====================================  ==================

    The residual is ``x = g * c + x`` (float32 on the xPU), the adaLN vectors
    ``scale_shift_table + t`` per sample (the per-frame / per-patch copies the model passes are
    equal). Canonical layout ``[B, F, N, C]`` (tokens in (frame, patch) order: the slots' order);
    a spatial block works on ``[B*F, N, C]``, a temporal one on ``[B*N, F, C]``.

    Segment barrier: the temporal position embedding the model adds after layer 0's spatial block
    when F > 1 (its own code: the deferred output is computed there). Between a spatial and a
    temporal block the model only reshapes and permutes the tokens, which a segment spans.
    Refused: ``encoder_attention_mask``, ``enable_temporal_attentions=False``, adaLN other than
    ``ada_norm_single``, spatial blocks without cross attention, blocks with positional embeddings.
    """
    name = "latte"
    model_class = "LatteTransformer3DModel"
    block_lists = (("transformer_blocks", _Spatial()), ("temporal_transformer_blocks", _Temporal()))
    barriers = ("the temporal position embedding the model adds after layer 0's spatial block "
                "(F > 1); spatial <-> temporal token moves (reshape/permute) are spanned")
    config_keys = ("norm_type", "num_attention_heads", "attention_head_dim")
    call_params = ("hidden_states", "timestep", "encoder_attention_mask",
                   "enable_temporal_attentions")

    def blocks(self, model):
        from .base import BlockRef, _uncompiled

        (sname, spatial), (tname, temporal) = self.block_lists
        out = []
        for i, (sb, tb) in enumerate(zip(getattr(model, sname), getattr(model, tname))):
            sb, tb = _uncompiled(sb), _uncompiled(tb)
            out += [BlockRef(f"{sname}.{i}", sb, spatial, i), BlockRef(f"{tname}.{i}", tb, temporal, i)]
        return out

    def check_model(self, model):
        cfg = model.config
        if getattr(cfg, "norm_type", None) != "ada_norm_single":
            raise UnsupportedModelError(f"norm_type={getattr(cfg, 'norm_type', None)!r}: "
                                        "expected 'ada_norm_single' (Latte)")
        self.check_structure(model)
        if len(model.transformer_blocks) != len(model.temporal_transformer_blocks):
            raise UnsupportedModelError("Latte with unequal spatial and temporal block counts")
        for ref in self.blocks(model):
            b = ref.module
            if getattr(b, "pos_embed", None) is not None or getattr(b, "only_cross_attention", False):
                raise UnsupportedModelError(f"{ref.name}: positional embedding or cross-attention-"
                                            "only blocks are not what the Latte adapter replays")
            if isinstance(ref.spec, _Spatial) and b.attn2 is None:
                raise UnsupportedModelError(f"{ref.name}: a spatial block without cross attention "
                                            "(cross_attention_dim=None) is not supported")
        super().check_model(model)

    def check_call(self, model, args):
        if args.get("encoder_attention_mask") is not None:
            raise ValueError("encoder_attention_mask: the CODA cache engine supports unmasked "
                             "conditions only (pass None)")
        if not args.get("enable_temporal_attentions", True):
            raise ValueError("enable_temporal_attentions=False: the CODA cache engine runs "
                             "the full spatio-temporal Latte only")
