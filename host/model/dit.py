"""The shipped video DiT: diffusers' ``LatteTransformer3DModel`` conditioned on a digit label.

The condition is a learned label embedding (11 entries: digits 0..9 and :data:`NULL_LABEL`
for the unconditional branch of classifier-free guidance) giving ``encoder_hidden_states``
of shape [B, 1, caption_channels]; Latte's caption projection maps it to the hidden size and
every spatial block cross-attends to that single token. The label also conditions adaLN-single,
as in Latte's class-conditional models (and DiT): a second table ``class_embedding`` (11 x
hidden) is added to the timestep embedding before the adaLN projection. Why both: with one
condition token, cross attention can only add a label-dependent bias to every token; a first
training run with that path alone ignored the label entirely (the same x0 error with the true,
the null and a wrong label; the classifier's accuracy at chance).
The model works in pixel space (no VAE): videos [B, 1, F, 32, 32] in [-1, 1]. The
configuration lives in ``weights/latte_digits.json`` next to the safetensors weights,
so a checkpoint always carries the exact architecture that produced it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from coda.jsonout import json_text
from coda.paths import write_file

from .data import NULL_LABEL, NUM_CLASSES

__all__ = ["WEIGHTS_DIR", "WEIGHTS_FILE", "CONFIG_FILE", "DEFAULT_CONFIG", "DigitLatte",
           "TEXT_CONFIG", "TEXT_WEIGHTS_FILE", "TEXT_CONFIG_FILE", "TextLatte", "MODELS",
           "ShippedModel", "shipped_model",
           "build_model", "latte_init", "load_model", "save_model"]

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
WEIGHTS_FILE = WEIGHTS_DIR / "latte_digits.safetensors"
CONFIG_FILE = WEIGHTS_DIR / "latte_digits.json"

# A small Latte: hidden 96 = 4 heads x 24, 4 spatial + 4 temporal blocks, 4x4 patches
# (8x8 = 64 tokens per 32x32 frame, 512 tokens per 8-frame video), 1.16 M parameters. Sized
# so that each stage of the recipe trains in about an hour on 2 CPU cores (measured:
# docs/results.md, Training time); hidden 64 followed the label clearly less well.
DEFAULT_CONFIG: dict = {
    "transformer": {
        "num_attention_heads": 4,
        "attention_head_dim": 24,
        "in_channels": 1,
        "out_channels": 1,
        "num_layers": 4,
        "cross_attention_dim": 96,
        "attention_bias": True,
        "sample_size": 32,
        "patch_size": 4,
        "activation_fn": "gelu-approximate",
        "num_embeds_ada_norm": 1000,
        "norm_type": "ada_norm_single",
        "norm_elementwise_affine": False,
        "norm_eps": 1e-6,
        "caption_channels": 64,
        "video_length": 8,
    },
    "num_labels": NUM_CLASSES + 1,
    "null_label": NULL_LABEL,
    "scheduler": {
        "num_train_timesteps": 1000,
        "beta_schedule": "squaredcos_cap_v2",
        "prediction_type": "v_prediction",
    },
    "data": {"frames": 8, "size": 32, "digit_size": 16},
}


TEXT_WEIGHTS_FILE = WEIGHTS_DIR / "latte_text.safetensors"
TEXT_CONFIG_FILE = WEIGHTS_DIR / "latte_text.json"

# The text-conditioned model: 8 spatial + 8 temporal blocks of the same width, conditioned on
# prompts (coda.host.model.prompts) through a small text encoder; cross attention sees
# MAX_TOKENS tokens, so it is no longer constant across queries.
TEXT_CONFIG: dict = {
    "conditioning": "text",
    "transformer": {**DEFAULT_CONFIG["transformer"], "num_layers": 8},
    "text_encoder": {"dim": 64, "layers": 2, "heads": 4, "pretrain_steps": 1500},
    "scheduler": dict(DEFAULT_CONFIG["scheduler"]),
    "data": {**DEFAULT_CONFIG["data"], "pair_fraction": 0.3},
}


@dataclass(frozen=True)
class ShippedModel:
    """A shipped model: what ``--model NAME`` selects.

    Attributes:
        name: the ``--model`` value (``"digits"``, ``"text"``).
        config: the architecture ``coda train`` builds (the trained file's JSON is a copy).
        weights: the shipped safetensors file; ``config_file``: the JSON beside it.
        stage1_steps: stage 1 of its training recipe (``coda train --steps``' default):
            7,000 for the digit model, 5,000 for the text model, whose frozen pretrained
            encoder reached more with less (docs/results.md, "The text-conditioned model").
    """
    name: str
    config: dict
    weights: Path
    config_file: Path
    stage1_steps: int = 7000

    @property
    def preset(self) -> str:
        """The system model's preset name of this model (``latte-digits``, ``latte-text``):
        :func:`coda.host.system.presets.get_spec`."""
        return self.weights.stem.replace("_", "-")

    def schedule(self, skip: float = 0.5, latency: str | None = None) -> Path:
        """Its shipped searched schedule file (:func:`coda.host.cache.shipped.shipped_schedule`;
        ``coda run``'s default is skip 0.5)."""
        from coda.host.cache.shipped import shipped_schedule
        return shipped_schedule(skip, latency, self.weights.stem)

    @property
    def profile(self) -> Path:
        """The profile its shipped schedules were searched on."""
        from coda.host.cache.shipped import shipped_profile
        return shipped_profile(self.weights.stem)

    @property
    def architecture(self) -> dict:
        """The trained file's configuration if it exists, else :attr:`config` (the same
        architecture: training writes it)."""
        return json.loads(self.config_file.read_text()) if self.config_file.exists() else self.config


# The models by name (``--model``).
MODELS: dict[str, ShippedModel] = {
    "digits": ShippedModel("digits", DEFAULT_CONFIG, WEIGHTS_FILE, CONFIG_FILE),
    "text": ShippedModel("text", TEXT_CONFIG, TEXT_WEIGHTS_FILE, TEXT_CONFIG_FILE, 5000),
}


def shipped_model(name: str) -> ShippedModel:
    """The :class:`ShippedModel` called ``name``. Raises ValueError naming the models."""
    if name not in MODELS:
        raise ValueError(f"model {name!r}: expected one of {', '.join(MODELS)}")
    return MODELS[name]


def _batch_invariant_conditioning(transformer) -> None:
    """Make Latte's per-sample conditioning (adaLN-single timestep MLP, caption projection)
    independent of the batch it is computed in.

    Why: torch's CPU GEMM takes a different kernel for 1..3 rows than for 4 or more (measured
    here: ``Linear(x[:M])`` differs in the last bits from ``Linear(x)[:M]`` for M <= 3, and
    agrees for M >= 4 at any row offset), so a sample's timestep embedding would change with
    the batch size, breaking "batch of 3 == 3 batches of 1" and "batched CFG == separate CFG".
    Evaluating these small MLPs one sample at a time fixes that; the token-wise trunk has
    B*F*N >= 4 rows and is already batch-invariant. Only the classes change (same weights).
    """
    from diffusers.models.embeddings import PixArtAlphaTextProjection
    from diffusers.models.normalization import AdaLayerNormSingle

    class _RowwiseAdaLayerNormSingle(AdaLayerNormSingle):
        class_condition: torch.Tensor | None = None   # [B, C] set by DigitLatte.forward

        def forward(self, timestep, added_cond_kwargs=None, batch_size=None, hidden_dtype=None):
            embs = []
            for i in range(timestep.shape[0]):
                emb = self.emb(timestep[i:i + 1], **(added_cond_kwargs or {"resolution": None, "aspect_ratio": None}),
                               batch_size=1, hidden_dtype=hidden_dtype)
                if self.class_condition is not None:
                    emb = emb + self.class_condition[i:i + 1]
                embs.append(emb)
            rows = [self.linear(self.silu(e)) for e in embs]
            return torch.cat(rows), torch.cat(embs)

    class _RowwiseCaptionProjection(PixArtAlphaTextProjection):
        def forward(self, caption):
            return torch.cat([PixArtAlphaTextProjection.forward(self, caption[i:i + 1])
                              for i in range(caption.shape[0])])

    transformer.adaln_single.__class__ = _RowwiseAdaLayerNormSingle
    transformer.caption_projection.__class__ = _RowwiseCaptionProjection


class DigitLatte(nn.Module):
    """Latte transformer + label embedding.

    Attributes:
        transformer: the ``diffusers.LatteTransformer3DModel`` (cache hooks attach here).
        label_embedding: ``nn.Embedding(11, caption_channels)``.
        config: the configuration dict (see :data:`DEFAULT_CONFIG`).
    """

    def __init__(self, config: dict):
        super().__init__()
        from diffusers import LatteTransformer3DModel

        self.config = config
        self.transformer = LatteTransformer3DModel(**config["transformer"])
        _batch_invariant_conditioning(self.transformer)
        self.label_embedding = nn.Embedding(config["num_labels"],
                                            config["transformer"]["caption_channels"])
        inner = config["transformer"]["num_attention_heads"] * config["transformer"]["attention_head_dim"]
        self.class_embedding = nn.Embedding(config["num_labels"], inner)
        # Small start (DiT inits its label table at std 0.02): the timestep signal must not be
        # drowned at init; training grows what the label needs.
        nn.init.normal_(self.class_embedding.weight, std=0.1)

    def condition(self, labels: torch.Tensor) -> torch.Tensor:
        """``encoder_hidden_states`` [B, 1, caption_channels] of int64 labels [B] (0..10)."""
        labels = torch.as_tensor(labels, dtype=torch.long, device=self.label_embedding.weight.device)
        n = self.config["num_labels"]
        if labels.numel() and (labels.min() < 0 or labels.max() >= n):
            raise ValueError(f"labels={labels.tolist()}: expected values in 0..{n - 1}")
        return self.label_embedding(labels)[:, None, :]

    def conditions(self, prompts) -> torch.Tensor:
        """The condition tensor of what a user asks for: int64 labels [B] of digits 0..9.

        Raises:
            ValueError: no prompt, or a value outside 0..9.
        """
        labels = torch.as_tensor(prompts, dtype=torch.long).reshape(-1)
        if labels.numel() == 0 or labels.min() < 0 or labels.max() > 9:
            raise ValueError(f"labels={labels.tolist()}: expected at least one digit, each 0..9")
        return labels

    def null_conditions(self, n: int) -> torch.Tensor:
        """The unconditional branch's condition of ``n`` samples: int64 [n] null labels."""
        return torch.full((n,), self.config["null_label"], dtype=torch.long)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                labels: torch.Tensor, temporal: bool = True) -> torch.Tensor:
        """Model prediction (v or epsilon, see config["scheduler"]).

        Args:
            sample: float32 [B, 1, F, H, W] noisy video (F <= video_length, H = W multiple
                of patch_size).
            timestep: int64 [B] or scalar, 0..num_train_timesteps-1.
            labels: int64 [B], 0..9 or 10 (null).
            temporal: run the temporal blocks; False for single images in Latte's
                image-video joint training (the temporal blocks are skipped, as in the paper).
        Returns:
            float32 [B, 1, F, H, W].
        """
        b = sample.shape[0]
        timestep = torch.as_tensor(timestep, device=sample.device).reshape(-1).expand(b)
        labels = torch.as_tensor(labels, dtype=torch.long, device=sample.device).reshape(-1)
        condition = self.condition(labels)
        ada = self.transformer.adaln_single
        ada.class_condition = self.class_embedding(labels)
        try:
            return self.transformer(sample, timestep=timestep, encoder_hidden_states=condition,
                                    enable_temporal_attentions=temporal, return_dict=False)[0]
        finally:
            ada.class_condition = None


class TextLatte(nn.Module):
    """Latte transformer + text encoder: the text-conditioned video DiT.

    The prompt's token sequence (:func:`coda.host.model.prompts.tokenize`) is encoded by
    :class:`~coda.host.model.text_encoder.TextEncoder` (frozen: ``coda train`` pretrains it
    on prompts for ``config["text_encoder"]["pretrain_steps"]`` steps, then trains the rest)
    into ``encoder_hidden_states`` [B, MAX_TOKENS, caption_channels] that every spatial block
    cross-attends to (padding zeroed, no mask, as Wan does); its pooled vector, projected to
    the hidden size, is added to the adaLN-single timestep embedding (HunyuanVideo's and SD3's
    pooled text path).

    Attributes:
        transformer: the ``diffusers.LatteTransformer3DModel`` (cache hooks attach here).
        text_encoder: the :class:`TextEncoder`.
        pooled_projection: ``nn.Linear(caption_channels, hidden)``.
        config: the configuration dict (see :data:`TEXT_CONFIG`).
    """

    def __init__(self, config: dict):
        super().__init__()
        from diffusers import LatteTransformer3DModel

        from .text_encoder import TextEncoder

        self.config = config
        tcfg = config["transformer"]
        self.transformer = LatteTransformer3DModel(**tcfg)
        _batch_invariant_conditioning(self.transformer)
        enc = config["text_encoder"]
        if enc["dim"] != tcfg["caption_channels"]:
            raise ValueError(f"text_encoder dim {enc['dim']}: expected the transformer's "
                             f"caption_channels {tcfg['caption_channels']}")
        self.text_encoder = TextEncoder(enc["dim"], enc["layers"], enc["heads"])
        self.text_encoder.requires_grad_(False)   # pretrained first, then frozen, as T5 is
        inner = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
        self.pooled_projection = nn.Linear(enc["dim"], inner)
        nn.init.normal_(self.pooled_projection.weight, std=0.02)
        nn.init.zeros_(self.pooled_projection.bias)

    def conditions(self, prompts) -> torch.Tensor:
        """The condition tensor of what a user asks for: int64 tokens [B, MAX_TOKENS].

        Args:
            prompts: a sequence of prompt texts, ``PromptSpec`` or indices into
                :data:`~coda.host.model.prompts.DEMO_PROMPTS` (ints or an int64 tensor; what
                ``--prompts 0-9`` selects), at least one digit each.
        Raises:
            ValueError: no prompt, the null prompt, an index out of range, or a text outside
                the grammar (:func:`coda.host.model.prompts.parse_prompt` names it).
        """
        from .prompts import PromptSpec, demo_prompt, parse_prompt, tokenize

        if isinstance(prompts, (str, PromptSpec)):
            prompts = [prompts]
        if isinstance(prompts, torch.Tensor):
            prompts = prompts.reshape(-1).tolist()
        specs = [p if isinstance(p, PromptSpec) else parse_prompt(p) if isinstance(p, str)
                 else demo_prompt(p) for p in prompts]
        if not specs or any(not s.digits for s in specs):
            raise ValueError(f"prompts={[s.text for s in specs]}: expected at least one prompt, "
                             "each naming a digit (the empty prompt is CFG's unconditional branch)")
        return tokenize(specs)

    def null_conditions(self, n: int) -> torch.Tensor:
        """The unconditional branch's condition of ``n`` samples: the empty prompt's tokens
        int64 [n, MAX_TOKENS]."""
        from .prompts import PromptSpec, tokenize

        return tokenize([PromptSpec(())] * n)

    def condition(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(``encoder_hidden_states`` [B, MAX_TOKENS, caption_channels], pooled [B, hidden]) of
        int64 tokens [B, MAX_TOKENS], each sample encoded alone (batch-invariant bits)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long,
                                 device=self.pooled_projection.weight.device)
        if self.training:
            seq, pooled = self.text_encoder(tokens)
            return seq, self.pooled_projection(pooled)
        # one sample at a time: a GEMM of 1..3 rows takes another CPU kernel than 4 or more
        parts = [self.text_encoder(tokens[i:i + 1]) for i in range(tokens.shape[0])]
        return (torch.cat([p[0] for p in parts]),
                torch.cat([self.pooled_projection(p[1]) for p in parts]))

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                tokens: torch.Tensor, temporal: bool = True) -> torch.Tensor:
        """Model prediction (v or epsilon, see config["scheduler"]).

        Args:
            sample: float32 [B, 1, F, H, W] noisy video.
            timestep: int64 [B] or scalar, 0..num_train_timesteps-1.
            tokens: int64 [B, MAX_TOKENS] prompt tokens (the null prompt's for CFG's
                unconditional branch).
            temporal: run the temporal blocks (False for single images).
        Returns:
            float32 [B, 1, F, H, W].
        """
        b = sample.shape[0]
        timestep = torch.as_tensor(timestep, device=sample.device).reshape(-1).expand(b)
        seq, pooled = self.condition(tokens)
        ada = self.transformer.adaln_single
        ada.class_condition = pooled
        try:
            return self.transformer(sample, timestep=timestep, encoder_hidden_states=seq,
                                    enable_temporal_attentions=temporal, return_dict=False)[0]
        finally:
            ada.class_condition = None


def latte_init(model: DigitLatte) -> None:
    """Latte's / DiT's initialisation (diffusers' model classes leave torch's defaults, as
    they expect pretrained weights): xavier-uniform linear and patch-embedding weights with
    zero biases, N(0, 0.02) timestep and caption MLPs, and adaLN-Zero, i.e. every block's
    gates (rows 2 and 5 of its ``scale_shift_table`` plus the adaLN-single projection that
    adds to them), the cross-attention output projection (PixArt-alpha) and the final
    projection start at zero, so every block starts as the identity.
    Source: Latte ``models/latte.py`` and DiT ``models.py`` ``initialize_weights``; PixArt-alpha
    ``PixArt.initialize_weights`` for the cross attention."""
    t = model.transformer
    for m in t.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    w = t.pos_embed.proj.weight
    nn.init.xavier_uniform_(w.view(w.shape[0], -1))
    nn.init.zeros_(t.pos_embed.proj.bias)
    emb = t.adaln_single.emb.timestep_embedder
    cap = t.caption_projection
    for lin in (emb.linear_1, emb.linear_2, cap.linear_1, cap.linear_2):
        nn.init.normal_(lin.weight, std=0.02)
    with torch.no_grad():
        for block in list(t.transformer_blocks) + list(t.temporal_transformer_blocks):
            block.scale_shift_table[2].zero_()
            block.scale_shift_table[5].zero_()
            if getattr(block, "attn2", None) is not None:
                nn.init.zeros_(block.attn2.to_out[0].weight)
    for lin in (t.adaln_single.linear, t.proj_out):
        nn.init.zeros_(lin.weight)
        nn.init.zeros_(lin.bias)


def build_model(config: dict | None = None, seed: int = 0) -> DigitLatte:
    """A freshly initialised model with torch's default initialisation (torch seed ``seed``
    fixes the weights); training applies :func:`latte_init` on top. Tests use it as is: its
    blocks are not the identity, so cached and computed operators really differ."""
    torch.manual_seed(seed)
    config = DEFAULT_CONFIG if config is None else config
    return (TextLatte if config.get("conditioning") == "text" else DigitLatte)(config)


def save_model(model: DigitLatte, weights: Path = WEIGHTS_FILE, config: Path = CONFIG_FILE) -> None:
    """Write the weights (safetensors, float32) and the configuration JSON."""
    from safetensors.torch import save

    weights = Path(weights)
    weights.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    write_file(weights, save(state))
    write_file(Path(config), json_text(model.config, indent=2) + "\n")


def load_model(device: str = "cpu", weights: Path = WEIGHTS_FILE,
               config: Path = CONFIG_FILE) -> tuple[DigitLatte, dict]:
    """The shipped, trained model in eval mode.

    Returns:
        (model, config dict).
    Raises:
        FileNotFoundError: the weights or config are missing (train them with
            ``coda train``).
    """
    from safetensors.torch import load_file

    weights, config = Path(weights), Path(config)
    for path in (weights, config):
        if not path.exists():
            which = next((f" --model {m.name}" for m in MODELS.values()
                          if path in (m.weights, m.config_file)), "")
            raise FileNotFoundError(f"{path}: missing; train it with `coda train{which}`")
    cfg = json.loads(config.read_text())
    model = (TextLatte if cfg.get("conditioning") == "text" else DigitLatte)(cfg)
    model.load_state_dict(load_file(str(weights)))
    return model.to(device).eval(), cfg
