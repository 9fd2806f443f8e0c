"""The text encoder trained with the shipped video DiT: a small stand-in for T5.

Token embeddings plus learned positions, a few pre-norm transformer encoder layers over the
prompt's real tokens (padding masked), a final LayerNorm; the output is a fixed-length
sequence [B, MAX_TOKENS, dim] whose padded positions are zero, as Wan's pipeline pads its
T5 output with zeros and cross-attends to all positions without a mask. The mean over the
real tokens is the pooled embedding that conditions adaLN (as HunyuanVideo's and SD3's
pooled text vectors do).
"""

from __future__ import annotations

import torch
from torch import nn

from .prompts import MAX_TOKENS, PAD, VOCABULARY

__all__ = ["TextEncoder"]

_PAD_ID = VOCABULARY.index(PAD)


class TextEncoder(nn.Module):
    """Tokens int64 [B, MAX_TOKENS] -> (sequence float32 [B, MAX_TOKENS, dim], pooled [B, dim]).

    Args:
        dim: model width (the DiT's ``caption_channels``).
        layers: encoder layers.
        heads: attention heads (dim divisible by heads).
    """

    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.token_embedding = nn.Embedding(len(VOCABULARY), dim)
        self.position_embedding = nn.Parameter(torch.zeros(MAX_TOKENS, dim))
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a batch of token rows (see :func:`coda.host.model.prompts.tokenize`).

        Raises:
            ValueError: tokens not [B, MAX_TOKENS] int64 with ids in the vocabulary.
        """
        if (tokens.ndim != 2 or tokens.shape[1] != MAX_TOKENS or tokens.dtype != torch.long
                or (tokens.numel() and (tokens.min() < 0 or tokens.max() >= len(VOCABULARY)))):
            raise ValueError(f"tokens {tuple(tokens.shape)} {tokens.dtype}: expected int64 "
                             f"[B, {MAX_TOKENS}] ids in 0..{len(VOCABULARY) - 1}")
        keep = tokens != _PAD_ID                                      # [B, L]
        x = self.token_embedding(tokens) + self.position_embedding[None]
        x = self.norm(self.layers(x, src_key_padding_mask=~keep))
        x = x * keep[..., None]
        pooled = x.sum(1) / keep.sum(1, keepdim=True).clamp(min=1)
        return x, pooled
