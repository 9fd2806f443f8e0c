"""A pipeline-like classifier-free-guidance loop over any diffusers video transformer the cache
engine serves, for the experiments that generate: profiling (:mod:`coda.experiments.profile`),
DRA calibration (:mod:`coda.experiments.dra_calibration`) and the schedule search's rollouts
(:mod:`coda.experiments.search`).

The shipped model brings its own loop (:mod:`coda.host.model.sample`); a diffusers
transformer brings none, so :class:`CFGLoop` is one: what a diffusers pipeline does between
its text encoder and its VAE. :func:`generate_videos` / :func:`cached_videos` run either kind of model, so the experiments
take a ``DigitLatte`` or a :class:`CFGLoop` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CFGLoop", "generate_videos", "cached_videos", "CFG_MODES"]

#: how the loop calls the transformer per step: both branches in one call or one call each
CFG_MODES = ("batched", "separate")


def _default_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler()


@dataclass(eq=False)
class CFGLoop:
    """A CFG denoising loop over ``transformer``.

    The shipped model (``DigitLatte``, :mod:`coda.host.model.sample`) brings its own loop; a
    ``WanTransformer3DModel``, ``CogVideoXTransformer3DModel``, ``HunyuanVideoTransformer3DModel``
    (or a ``LatteTransformer3DModel``) brings none, so :class:`CFGLoop` is one: what a diffusers
    pipeline does between its text encoder and its VAE. Per step ``i`` it calls the transformer
    under ``transformer.cache_context(name, step_index=i, num_inference_steps=n)`` (both CFG
    branches in one call, ``"uncond|cond"`` rows as diffusers' pipelines batch them, or one call
    per branch), combines ``u + g (c - u)`` and takes the scheduler's step. Prompts are the
    transformer's conditioning keyword arguments, given (the text encoder is not part of it);
    a video is (prompt index, noise seed).

    Attributes:
        transformer: a diffusers video transformer of :mod:`coda.host.cache.arch`.
        prompts: per prompt, ``(cond, uncond)``: the transformer's keyword arguments besides
            ``hidden_states`` and ``timestep`` (``encoder_hidden_states``, masks, pooled
            projections ...), tensors of batch 1.
        latent_shape: one sample's ``hidden_states`` shape without the batch, e.g.
            ``(C, F, H, W)`` (Wan, HunyuanVideo, Latte) or ``(F, C, H, W)`` (CogVideoX).
        scheduler: a diffusers scheduler (``set_timesteps``, ``timesteps``, ``step``; a fresh
            copy per generation, ``from_config``); default ``FlowMatchEulerDiscreteScheduler()``
            (the flow-matching Euler sampler of Wan 2.1 and HunyuanVideo).
        cfg: :data:`CFG_MODES`: ``"batched"`` or ``"separate"`` (cond, then uncond).
    Raises:
        ValueError: no prompts, an unknown ``cfg``.
    """
    transformer: torch.nn.Module
    prompts: list
    latent_shape: tuple
    scheduler: Any = field(default_factory=_default_scheduler)
    cfg: str = "batched"

    def __post_init__(self):
        if not self.prompts:
            raise ValueError("CFGLoop: no prompts, expected at least one (cond, uncond) pair")
        if self.cfg not in CFG_MODES:
            raise ValueError(f"cfg={self.cfg!r}: expected one of {', '.join(CFG_MODES)}")
        self.latent_shape = tuple(int(d) for d in self.latent_shape)

    # what the experiments read of a model: its configuration and weights (model_hash)
    @property
    def config(self):
        return self.transformer.config

    def state_dict(self):
        return self.transformer.state_dict()

    def noise(self, seeds) -> torch.Tensor:
        """Initial latents, one per seed: ``randn(latent_shape)`` of ``Generator(seed)``,
        float32 [N, *latent_shape]."""
        return torch.stack([torch.randn(self.latent_shape,
                                        generator=torch.Generator().manual_seed(int(s)))
                            for s in seeds])

    def _conditions(self, prompts) -> tuple[dict, dict]:
        for p in prompts:
            if not 0 <= int(p) < len(self.prompts):
                raise ValueError(f"prompt {p}: expected 0..{len(self.prompts) - 1}")
        pairs = [self.prompts[int(p)] for p in prompts]
        return tuple({k: torch.cat([pair[i][k] for pair in pairs]) for k in pairs[0][i]}
                     for i in (0, 1))

    @torch.no_grad()
    def generate(self, prompts, *, seeds, num_steps: int, guidance_scale: float,
                 progress: bool = False) -> torch.Tensor:
        """The final latents of videos (``prompts[i]``, ``seeds[i]``), one batch,
        float32 [N, *latent_shape]. ``progress`` is accepted for the shipped model's
        signature and ignored. Raises ValueError for prompts and seeds of other lengths."""
        prompts, seeds = list(prompts), list(seeds)
        if len(prompts) != len(seeds) or not prompts:
            raise ValueError(f"{len(prompts)} prompts, {len(seeds)} seeds: expected one seed "
                             "per prompt, at least one")
        cond, uncond = self._conditions(prompts)
        n, model = len(prompts), self.transformer
        sched = type(self.scheduler).from_config(self.scheduler.config)
        sched.set_timesteps(num_steps)
        x = self.noise(seeds)
        for i, t in enumerate(sched.timesteps):
            ctx = dict(step_index=i, num_inference_steps=num_steps)
            tt = t.expand(n)
            if self.cfg == "batched":
                kw = {k: torch.cat([uncond[k], cond[k]]) for k in cond}
                with model.cache_context("uncond|cond", **ctx):
                    u, c = model(hidden_states=torch.cat([x, x]), timestep=torch.cat([tt, tt]),
                                 **kw, return_dict=False)[0].chunk(2)
            else:
                with model.cache_context("cond", **ctx):
                    c = model(hidden_states=x, timestep=tt, **cond, return_dict=False)[0]
                with model.cache_context("uncond", **ctx):
                    u = model(hidden_states=x, timestep=tt, **uncond, return_dict=False)[0]
            x = sched.step(u + guidance_scale * (c - u), t, x, return_dict=False)[0]
        return x

    def cached_generate(self, prompts, driver, policy=None, *, events=None, **kwargs):
        """:meth:`generate` with the CODA cache engine attached for this call only (as
        :func:`coda.host.model.sample.cached_generate` for the shipped model).
        Returns (latents, the generation's counters :attr:`CodaCacheHook.stats`)."""
        from coda.host.cache.engine import CodaCacheConfig, apply_coda_cache, remove_coda_cache

        hook = apply_coda_cache(self.transformer, CodaCacheConfig(driver, policy, events=events))
        try:
            out = self.generate(prompts, **kwargs)
            stats = hook.stats
        finally:
            remove_coda_cache(self.transformer)
        return out, stats

    @torch.no_grad()
    def shape(self) -> dict:
        """The model's shapes, as a profile records them (its ``meta["shape"]``,
        :func:`coda.experiments.profile.profile_model`): ``arch``, ``tokens`` (video tokens per
        sample), ``text_tokens`` (the text stream a joint model carries through its blocks;
        0 for one stream), ``cond_tokens`` (condition tokens), ``hidden``, ``heads``,
        ``ffn_inner`` (the FFN's hidden width), ``mlp_inner`` (HunyuanVideo's single-stream
        MLP), ``layers``. Measured on one forward of prompt 0 at the first timestep (the
        transformer unhooked), the stream shapes at the first block's input; once per loop."""
        if getattr(self, "_shape", None) is None:
            self._shape = self._measure_shape()
        return dict(self._shape)

    def _measure_shape(self) -> dict:
        from coda.host.cache.arch import get_architecture

        arch = get_architecture(self.transformer)
        refs = arch.blocks(self.transformer)
        first, seen = refs[0], {}

        def grab(mod, args, kwargs):
            bound = first.spec.bind(mod, args, kwargs)
            for stream, param in first.spec.streams.items():
                x = first.spec.to_canonical(stream, bound[param], 1)
                seen[stream] = x[0].numel() // x.shape[-1]
        handle = first.module.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            cond, _ = self._conditions([0])
            sched = type(self.scheduler).from_config(self.scheduler.config)
            sched.set_timesteps(1)
            self.transformer(hidden_states=self.noise([0]), timestep=sched.timesteps[:1],
                             **cond, return_dict=False)
        finally:
            handle.remove()
        cfg = self.transformer.config
        text = next((t.shape[1] for k, t in cond.items() if k == "encoder_hidden_states"), 0)
        return {"arch": arch.name, "tokens": seen["hidden"],
                "text_tokens": seen.get("encoder", 0), "cond_tokens": int(text),
                "hidden": int(cfg.num_attention_heads * cfg.attention_head_dim),
                "heads": int(cfg.num_attention_heads),
                "ffn_inner": _width(refs, "ffn"), "mlp_inner": _width(refs, "single"),
                "layers": 1 + max(r.layer for r in refs)}


def _width(refs, op: str) -> int:
    """The output width of the first linear layer of operator ``op``'s module in the first
    block that has it (an FFN's hidden width; the single-stream block's ``proj_mlp``); 0 if
    no block has the op."""
    for ref in refs:
        if op in ref.spec.ops:
            mods = [getattr(ref.module, a) for a in ref.spec.op_modules[op]] or [ref.module]
            if op == "single":
                mods = [ref.module.proj_mlp]
            for mod in mods:
                for m in mod.modules():
                    if isinstance(m, torch.nn.Linear):
                        return int(m.out_features)
    return 0


def generate_videos(model, prompts, **kwargs) -> torch.Tensor:
    """Full-compute videos of a ``DigitLatte`` (:func:`coda.host.model.sample.generate`) or a
    :class:`CFGLoop` (:meth:`CFGLoop.generate`), the same keyword arguments."""
    if isinstance(model, CFGLoop):
        return model.generate(prompts, **kwargs)
    from coda.host.model.sample import generate
    return generate(model, prompts, **kwargs)


def cached_videos(model, prompts, driver, policy=None, **kwargs):
    """Cached generation of either kind of model: (videos, stats), as
    :func:`coda.host.model.sample.cached_generate`."""
    if isinstance(model, CFGLoop):
        return model.cached_generate(prompts, driver, policy, **kwargs)
    from coda.host.model.sample import cached_generate
    return cached_generate(model, prompts, driver, policy, **kwargs)
