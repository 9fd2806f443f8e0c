"""Train the shipped video DiT on moving digits: ``coda train``.

Two stages run one after the other by the default command: stage 1 (``--steps``, the
model's recipe: 7,000 for the digit model, 5,000 for the text model),
Latte's image-video joint training from Latte's initialisation, and stage 2
(``--video-steps`` 5,000), videos only from stage 1's EMA weights, so that every step trains
the temporal blocks. :func:`train` runs one stage; :func:`main` the command. Training stops
after a fixed number of steps (never by wall time), so the result depends only on the
arguments, the torch build and the CPU (on another CPU the float rounding differs and the
bits drift apart within a few hundred steps). Writes ``weights/latte_digits.safetensors`` +
``latte_digits.json``, stage 1's EMA weights as ``<weights stem>_stage1``. The recipe in
full: ``docs/model.md``, "Training".
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from coda.options import add_options, option
from coda.paths import atomic_write, check_output_path

from .data import moving_digits
from .dit import (CONFIG_FILE, DEFAULT_CONFIG, MODELS, TEXT_WEIGHTS_FILE, WEIGHTS_FILE, build_model,
                  latte_init, save_model)

__all__ = ["train", "training_batch", "stage1_path", "TrainConfig", "configure", "main"]

LABEL_DROPOUT = 0.1
WARMUP_STEPS = 200
BATCH = 8
IMAGE_BATCH = 64
LR = 1e-3
EMA_DECAY = 0.999
VIDEO_STEPS = 5000     # stage 2 of the recipe: videos only, from stage 1's EMA weights
VIDEO_BATCH = 16
VIDEO_LR = 3e-4
MIN_SNR_GAMMA = 5.0   # Hang et al., "Efficient Diffusion Training via Min-SNR Weighting
                      # Strategy", ICCV 2023 (their default gamma); off in the shipped recipe


def _lr_factor(step: int, steps: int) -> float:
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def _ema_update(ema: torch.nn.Module, model: torch.nn.Module, step: int) -> None:
    decay = min(EMA_DECAY, (1 + step) / (10 + step))
    for pe, pm in zip(ema.parameters(), model.parameters()):
        if pm.requires_grad:       # frozen parts (the text encoder) stay as they are
            pe.mul_(decay).add_(pm, alpha=1 - decay)


def min_snr_weights(sched, t: torch.Tensor, gamma: float = MIN_SNR_GAMMA) -> torch.Tensor:
    """Min-SNR-gamma loss weights [n] (float32) of timesteps t [n] (int64).

    The weight makes each timestep's loss equal to ``min(SNR(t), gamma)`` times the x0 error
    (SNR = alpha_bar / (1 - alpha_bar)): ``min(SNR, gamma) / (SNR + 1)`` for a v-prediction
    loss, ``min(SNR, gamma) / SNR`` for an epsilon loss (Hang et al., ICCV 2023, eq. 8-9;
    diffusers' ``train_text_to_image.py --snr_gamma``). gamma <= 0 turns it off (all ones).
    """
    if gamma <= 0:
        return torch.ones(t.shape[0])
    abar = sched.alphas_cumprod[t].float()
    snr = abar / (1 - abar)
    clipped = snr.clamp(max=gamma)
    return clipped / (snr + 1) if sched.config.prediction_type == "v_prediction" else clipped / snr


def training_batch(config: dict, n: int, data_seed: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of training data: (videos float32 [n, 1, frames, S, S], condition).

    The condition is int64 labels [n] for the label-conditioned model, or int64 prompt tokens
    [n, MAX_TOKENS] for the text-conditioned one (single frames, ``frames == 1``, get still
    one-digit prompts). Everything is drawn from ``data_seed``.
    """
    data = config["data"]
    if config.get("conditioning") == "text":
        from .data import prompted_videos
        from .prompts import random_specs, tokenize

        specs = random_specs(n, torch.Generator().manual_seed(int(data_seed)),
                             data.get("pair_fraction", 0.0), still=frames == 1)
        videos = prompted_videos(specs, data_seed, frames=frames, size=data["size"],
                                 digit_size=data["digit_size"])
        return videos, tokenize(specs)
    return moving_digits(n, data_seed, frames=frames, size=data["size"], digit_size=data["digit_size"])


def _diffusion_loss(model, sched, videos, condition, null, gen, temporal: bool,
                    snr_gamma: float = 0.0) -> torch.Tensor:
    """v-prediction (or epsilon) MSE of one batch with condition dropout to ``null`` and
    random timesteps, Min-SNR-weighted when ``snr_gamma`` > 0."""
    n = videos.shape[0]
    drop = torch.rand(n, generator=gen) < LABEL_DROPOUT
    mask = drop.reshape(n, *([1] * (condition.ndim - 1)))
    condition = torch.where(mask, null[:n], condition)
    noise = torch.randn(videos.shape, generator=gen)
    t = torch.randint(0, sched.config.num_train_timesteps, (n,), generator=gen)
    noisy = sched.add_noise(videos, noise, t)
    target = sched.get_velocity(videos, noise, t) if sched.config.prediction_type == "v_prediction" else noise
    pred = model(noisy, t, condition, temporal=temporal)
    if snr_gamma <= 0:
        return torch.nn.functional.mse_loss(pred, target)
    err = (pred - target).square().flatten(1).mean(1)
    return (min_snr_weights(sched, t, snr_gamma) * err).mean()


def _save_state(path: Path, state: dict) -> None:
    """Write a training checkpoint atomically (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as fh:
        torch.save(state, fh)


def train(steps: int, batch_size: int = BATCH, image_batch_size: int = IMAGE_BATCH,
          lr: float = LR, seed: int = 0, weights: Path = WEIGHTS_FILE,
          config_path: Path = CONFIG_FILE, log_every: int = 50, checkpoint_every: int = 0,
          snr_gamma: float = 0.0, init: Path | None = None, config: dict | None = None,
          state_path: Path | None = None, state_every: int = 0, resume: bool = False) -> dict:
    """Train from scratch (or from ``init``) and save the EMA weights.

    Args:
        steps: optimiser steps (>= 1).
        batch_size: videos per step.
        image_batch_size: single frames per step (0 = videos only). Why: the frames of one
            video show one digit, so a video step teaches few digit shapes; images cost 1/F
            of a video each (docs/model.md has the measurement).
        lr: peak learning rate.
        seed: seeds the initial weights, the data stream, the noise and the condition dropout.
        weights, config_path: where to write the safetensors file and its JSON config.
        log_every: print the mean loss every this many steps.
        checkpoint_every: also save the EMA weights every this many steps as
            ``<weights stem>_step<N>.safetensors`` (0 = never).
        snr_gamma: Min-SNR gamma of the loss weighting (:func:`min_snr_weights`; 0 = off, the
            shipped recipe).
        init: start from these weights (a safetensors file of the same configuration, e.g.
            an earlier stage's EMA weights) instead of a fresh initialisation; the optimiser,
            the EMA and the learning-rate schedule start afresh.
        config: the model configuration (:data:`~coda.host.model.dit.DEFAULT_CONFIG`, the
            label-conditioned model, when None; ``TEXT_CONFIG`` for the text-conditioned one).
        state_path: where to keep the resumable training state (model, EMA, optimiser,
            generator, step, losses; a torch file written atomically every ``state_every``
            steps and at the end). None: no state is kept.
        state_every: steps between two writes of ``state_path`` (0 = only at the end).
        resume: continue from ``state_path`` if it exists (a finished state just writes the
            weights again). The result is bit-identical to an uninterrupted run with the
            same arguments, torch build, thread count and CPU.
    Returns:
        {"steps", "final_loss" (mean of the last 100 steps), "wall_s" (this run's seconds),
        "parameters", "resumed_from" (step, 0 for a fresh start)}.
    Raises:
        ValueError: steps or batch_size < 1, image_batch_size < 0, state_every < 0, resume
            without state_path, or a state written with other arguments.
        FileNotFoundError: ``init`` does not exist.
        RuntimeError: ``init`` holds weights of another configuration (torch's
            ``load_state_dict`` names the mismatching tensors).
    """
    from diffusers import DDPMScheduler

    if steps < 1 or batch_size < 1 or image_batch_size < 0 or state_every < 0:
        raise ValueError(f"steps={steps}, batch_size={batch_size}, image_batch_size="
                         f"{image_batch_size}, state_every={state_every}: expected >= 1, >= 1, "
                         ">= 0, >= 0")
    if resume and state_path is None:
        raise ValueError("resume=True without a state_path: expected the training state's file")
    if init is not None and not Path(init).is_file():
        raise FileNotFoundError(f"init={init}: no such weights file")
    cfg = copy.deepcopy(DEFAULT_CONFIG if config is None else config)
    model = build_model(cfg, seed=seed).train()
    if init is None:
        latte_init(model)
        if cfg.get("conditioning") == "text":
            from .text_encoder import pretrain

            pretrain(model.text_encoder, cfg["text_encoder"]["pretrain_steps"], seed=seed)
    else:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(init)))
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    sched = DDPMScheduler(**cfg["scheduler"])
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    data = cfg["data"]
    losses: list[float] = []
    fingerprint = {"steps": steps, "batch_size": batch_size, "image_batch_size": image_batch_size,
                   "lr": lr, "seed": seed, "snr_gamma": snr_gamma, "config": cfg,
                   "init": None if init is None else _file_digest(Path(init))}
    first = 0
    if resume and Path(state_path).exists():
        state = torch.load(state_path, weights_only=False)
        if state["fingerprint"] != fingerprint:
            raise ValueError(f"{state_path}: a training state of other arguments "
                             f"({state['fingerprint']!r}); expected {fingerprint!r}")
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        losses, first = list(state["losses"]), int(state["step"])
    null = model.null_conditions(max(batch_size, image_batch_size))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"training {n_params} parameters for {steps} steps, batch {batch_size} videos + "
          f"{image_batch_size} images" + (f", resumed at step {first}" if first else ""), flush=True)

    def keep_state(step: int) -> None:
        if state_path is not None:
            _save_state(Path(state_path), {
                "step": step, "model": model.state_dict(), "ema": ema.state_dict(),
                "optimizer": opt.state_dict(), "generator": gen.get_state(), "losses": losses,
                "fingerprint": fingerprint})

    start = time.perf_counter()
    for step in range(first, steps):
        data_seed = seed * 1_000_003 + step
        videos, cond = training_batch(cfg, batch_size, data_seed, data["frames"])
        loss = _diffusion_loss(model, sched, videos, cond, null, gen, True, snr_gamma)
        if image_batch_size:
            images, image_cond = training_batch(cfg, image_batch_size, (1 << 40) + data_seed, 1)
            loss = (loss + _diffusion_loss(model, sched, images, image_cond, null, gen, False,
                                           snr_gamma)) / 2
        for group in opt.param_groups:
            group["lr"] = lr * _lr_factor(step, steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        _ema_update(ema, model, step)
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            print(f"step {step + 1:6d}  loss {recent:.4f}  lr {opt.param_groups[0]['lr']:.2e}  "
                  f"{time.perf_counter() - start:7.1f} s", flush=True)
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            weights = Path(weights)
            stem = weights.with_name(f"{weights.stem}_step{step + 1}")
            save_model(ema, stem.with_suffix(".safetensors"), stem.with_suffix(".json"))
        if state_every and (step + 1) % state_every == 0 and step + 1 < steps:
            keep_state(step + 1)
    wall = time.perf_counter() - start
    if first < steps:
        keep_state(steps)
    save_model(ema, weights, config_path)
    final = sum(losses[-100:]) / len(losses[-100:])
    print(f"done: {steps} steps ({steps - first} in this run, {wall:.1f} s), final loss "
          f"{final:.4f}, wrote {weights}", flush=True)
    return {"steps": steps, "final_loss": final, "wall_s": wall, "parameters": n_params,
            "resumed_from": first}


def _file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (hex): identifies a stage's starting weights."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage1_path(weights: Path) -> Path:
    """Where the two-stage recipe keeps stage 1's EMA weights: ``<stem>_stage1.safetensors``
    beside ``weights`` (its JSON config beside it with the same stem)."""
    weights = Path(weights)
    return weights.with_name(f"{weights.stem}_stage1{weights.suffix}")


_RECIPE = "the shipped recipe"



@dataclass(frozen=True)
class TrainConfig:
    """Every option of ``coda train`` with its default (the one source of them: the
    recipe's constants of this module)."""
    steps: int = option(None, "stage 1 steps", type=int, unit="steps",
                        default_text="the model's recipe, ShippedModel.stage1_steps: "
                        + ", ".join(f"{m.stage1_steps:,} ({k})" for k, m in MODELS.items()))
    batch_size: int = option(BATCH, "stage 1 videos per step", source=_RECIPE)
    image_batch_size: int = option(IMAGE_BATCH, "stage 1 single frames per step (image-video "
                                   "joint training; 0 = off)", source=_RECIPE)
    lr: float = option(LR, "stage 1 peak learning rate", source=_RECIPE)
    video_steps: int = option(VIDEO_STEPS, "stage 2 (videos only, from stage 1's EMA weights) "
                              "steps; 0 = no stage 2, stage 1 writes --weights", unit="steps",
                              source=_RECIPE)
    video_batch_size: int = option(VIDEO_BATCH, "stage 2 videos per step", source=_RECIPE)
    video_lr: float = option(VIDEO_LR, "stage 2 peak learning rate", source=_RECIPE)
    stage: str = option("all", "run both stages, or one: stage 2 alone starts from --init",
                        choices=("all", "1", "2"))
    init: Path = option(None, "stage 2's starting weights", type=Path,
                        default_text="stage 1's file beside --weights, <weights stem>_stage1")
    seed: int = option(0, "stage 1's seed; stage 2 uses seed + 1")
    threads: int = option(2, "torch CPU threads (1 is robust on a shared machine; the result's "
                          "last bits may depend on it)")
    model: str = option("digits", "which model: the label-conditioned digits model or the "
                        "text-conditioned, deeper one", choices=tuple(MODELS))
    weights: Path = option(None, "where to write the weights (safetensors)", type=Path,
                           default_text=f"the model's shipped file, weights/{WEIGHTS_FILE.name} "
                           f"or weights/{TEXT_WEIGHTS_FILE.name}")
    config: Path = option(None, "where to write the model configuration (JSON)", type=Path,
                          default_text="the model's shipped file beside its weights")
    state_dir: Path = option(Path("build/train"), "where the resumable training state of "
                             "each stage is kept (<weights stem>_stage<k>.pt)", type=Path)
    state_every: int = option(100, "write the training state every this many steps (0 = only "
                              "at the end of a stage)", unit="steps")
    resume: bool = option(False, "continue from the training state in --state-dir (the same "
                          "bits as an uninterrupted run of the same command)")
    log_every: int = option(50, "print the mean loss every this many steps", unit="steps")
    checkpoint_every: int = option(0, "also save the EMA weights every this many steps as "
                                   "<weights stem>_step<N>.safetensors (0 = never)",
                                   unit="steps")
    snr_gamma: float = option(0.0, "Min-SNR loss weighting gamma (0 = plain MSE, measured "
                              f"better here; the paper's is {MIN_SNR_GAMMA:g})", source=_RECIPE)


#: the configuration ``coda train`` hands to :func:`main` (coda.cli)
CONFIG = TrainConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda train``: :class:`TrainConfig`."""
    add_options(parser, TrainConfig)


def main(cfg: TrainConfig) -> int:
    """Run ``coda train`` with ``cfg`` (what the command line gave, or a :class:`TrainConfig`
    built in Python, e.g. ``main(TrainConfig(steps=10, video_steps=0))``): stage 1 then
    stage 2 (or the one ``--stage`` names); returns 0.
    Bad options: ValueError before any training (``coda: error:``, exit 2)."""
    if cfg.video_steps < 0:
        raise ValueError(f"--video-steps {cfg.video_steps}: expected >= 0")
    if cfg.video_steps == 0 and cfg.stage == "2":
        raise ValueError("--stage 2 with --video-steps 0: expected a stage 2 of >= 1 step")
    if cfg.threads < 1:
        raise ValueError(f"--threads {cfg.threads}: expected >= 1")
    if cfg.state_every < 0:
        raise ValueError(f"--state-every {cfg.state_every}: expected >= 0")
    chosen = MODELS[cfg.model]
    steps = chosen.stage1_steps if cfg.steps is None else cfg.steps
    model_config, default_weights, default_config = chosen.config, chosen.weights, chosen.config_file
    weights = Path(cfg.weights) if cfg.weights is not None else default_weights
    config = (Path(cfg.config) if cfg.config is not None
              else default_config if cfg.weights is None else weights.with_suffix(".json"))
    check_output_path(weights, "--weights")
    check_output_path(config, "--config")
    first = stage1_path(weights) if cfg.video_steps else weights
    init = Path(cfg.init) if cfg.init is not None else first
    # stage 2 starts from --init, or from stage 1's file, which stage 1 writes unless --stage 2
    if (cfg.video_steps and cfg.stage != "1" and (cfg.stage == "2" or cfg.init is not None)
            and not Path(init).exists()):
        raise ValueError(f"--init {init}: no such weights file (run stage 1 first)")
    state = Path(cfg.state_dir)
    torch.set_num_threads(cfg.threads)
    if cfg.stage in ("all", "1"):
        train(steps, cfg.batch_size, cfg.image_batch_size, cfg.lr, cfg.seed, first,
              first.with_suffix(".json") if cfg.video_steps else config, cfg.log_every,
              cfg.checkpoint_every, cfg.snr_gamma, config=model_config,
              state_path=state / f"{weights.stem}_stage1.pt", state_every=cfg.state_every,
              resume=cfg.resume)
    if cfg.video_steps and cfg.stage in ("all", "2"):
        train(cfg.video_steps, cfg.video_batch_size, 0, cfg.video_lr, cfg.seed + 1,
              weights, config, cfg.log_every, cfg.checkpoint_every, cfg.snr_gamma,
              init, config=model_config, state_path=state / f"{weights.stem}_stage2.pt",
              state_every=cfg.state_every, resume=cfg.resume)
    return 0
