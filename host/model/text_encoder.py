"""The text encoder of the shipped video DiT: a small stand-in for T5, pretrained, then frozen.

Token embeddings plus learned positions, a few pre-norm transformer encoder layers over the
prompt's real tokens (padding masked), a final LayerNorm; the output is a fixed-length
sequence [B, MAX_TOKENS, dim] whose padded positions are zero, as Wan's pipeline pads its
T5 output with zeros and cross-attends to all positions without a mask. The mean over the
real tokens is the pooled embedding that conditions adaLN (as HunyuanVideo's and SD3's
pooled text vectors do). As video DiTs use T5, the encoder is first pretrained on text alone
(:func:`pretrain`, a denoising objective) and then frozen while the DiT trains: trained
jointly from the start, it merged digit words the DiT must tell apart (docs/model.md,
"The text encoder").
"""

from __future__ import annotations

import torch
from torch import nn

from .prompts import MASK, MAX_TOKENS, PAD, VOCABULARY, random_specs, tokenize

__all__ = ["TextEncoder", "pretrain", "reconstruct"]

_PAD_ID = VOCABULARY.index(PAD)
_MASK_ID = VOCABULARY.index(MASK)


class TextEncoder(nn.Module):
    """Tokens int64 [B, MAX_TOKENS] -> (sequence float32 [B, MAX_TOKENS, dim], pooled [B, dim]).

    Token embeddings start at N(0, 1), T5's initialisation of its shared embedding (Hugging
    Face ``T5PreTrainedModel._init_weights``, ``factor * 1.0``), so every word starts distinct.

    Args:
        dim: model width (the DiT's ``caption_channels``).
        layers: encoder layers.
        heads: attention heads (dim divisible by heads).
    """

    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.token_embedding = nn.Embedding(len(VOCABULARY), dim)
        self.position_embedding = nn.Parameter(torch.zeros(MAX_TOKENS, dim))
        nn.init.normal_(self.token_embedding.weight, std=1.0)
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


def _logits(encoder: TextEncoder, seq: torch.Tensor) -> torch.Tensor:
    """Token logits [B, L, V] of encoder outputs, read out through the (tied) embedding."""
    return seq @ encoder.token_embedding.weight.T / seq.shape[-1] ** 0.5


def reconstruct(encoder: TextEncoder, tokens: torch.Tensor) -> torch.Tensor:
    """The pretraining head's reading of each position: int64 [B, MAX_TOKENS] token ids
    (argmax of the tied-embedding logits; pads where ``tokens`` has pads)."""
    with torch.no_grad():
        seq, _ = encoder(tokens)
        ids = _logits(encoder, seq).argmax(-1)
    return torch.where(tokens == _PAD_ID, tokens, ids)


def pretrain(encoder: TextEncoder, steps: int, batch: int = 256, lr: float = 1e-3,
             seed: int = 0, mask_fraction: float = 0.15, pair_fraction: float = 0.3) -> dict:
    """Pretrain the encoder on prompts alone, in place: a denoising objective (T5's and
    BART's family): a random ``mask_fraction`` of each prompt's real tokens (at least one)
    becomes ``<mask>``, and cross entropy asks every real position for its original token
    through logits tied to the token embedding. The unmasked positions keep each word
    recoverable from its output (what the DiT needs: every digit word distinct); the masked
    ones learn the grammar from context. Prompts: a third still (``a seven``), the rest
    moving or pairs as in training (:func:`coda.host.model.prompts.random_specs`).
    AdamW, constant ``lr``, everything drawn from ``seed``.

    Returns:
        {"steps", "final_loss" (mean of the last 50 steps, nats per token)}.
    Raises:
        ValueError: steps < 0, batch < 1, mask_fraction outside [0, 1).
    """
    if steps < 0 or batch < 1 or not 0 <= mask_fraction < 1:
        raise ValueError(f"steps={steps}, batch={batch}, mask_fraction={mask_fraction}: "
                         "expected >= 0, >= 1 and in [0, 1)")
    gen = torch.Generator().manual_seed(int(seed))
    was_training = encoder.training
    encoder.train()
    params = list(encoder.parameters())
    grads = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    losses: list[float] = []
    stills = batch // 3
    for _ in range(steps):
        tokens = torch.cat([tokenize(random_specs(stills, gen, pair_fraction, still=True)),
                            tokenize(random_specs(batch - stills, gen, pair_fraction))])
        real = tokens != _PAD_ID
        score = torch.rand(tokens.shape, generator=gen).masked_fill(~real, 2.0)
        masked = (score < mask_fraction) | (score == score.min(1, keepdim=True).values)
        seq, _ = encoder(tokens.masked_fill(masked, _MASK_ID))
        loss = nn.functional.cross_entropy(_logits(encoder, seq)[real], tokens[real])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    opt.zero_grad(set_to_none=True)
    for p, g in zip(params, grads):
        p.requires_grad_(g)
    encoder.train(was_training)
    tail = losses[-50:]
    return {"steps": steps, "final_loss": sum(tail) / len(tail) if tail else float("nan")}
