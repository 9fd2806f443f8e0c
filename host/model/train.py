"""Train the shipped video DiT on moving digits: ``python -m coda.host.model.train``.

Recipe (all fixed, so the same command reproduces the weights on the same torch build):
diffusers ``DDPMScheduler`` (1000 steps, cosine ``squaredcos_cap_v2`` betas, v-prediction),
AdamW (lr 1e-3, betas (0.9, 0.99), weight decay 0.01) with 200 linear warm-up steps then
cosine decay to 10 %, batch 16 fresh videos per step drawn with seed ``seed * 1_000_003 +
step``, 10 % label dropout to the null label (classifier-free guidance), gradient clipping at
1.0, an exponential moving average of the weights (decay 0.999, warmed up) which is what is
saved. Training stops after ``--steps`` steps (never by wall time), so the result depends only
on the arguments. Writes ``weights/latte_digits.safetensors`` + ``latte_digits.json``.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path

import torch

from .data import NULL_LABEL, moving_digits
from .dit import CONFIG_FILE, DEFAULT_CONFIG, WEIGHTS_FILE, build_model, save_model

__all__ = ["train", "main"]

LABEL_DROPOUT = 0.1
WARMUP_STEPS = 200
EMA_DECAY = 0.999


def _lr_factor(step: int, steps: int) -> float:
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def _ema_update(ema: torch.nn.Module, model: torch.nn.Module, step: int) -> None:
    decay = min(EMA_DECAY, (1 + step) / (10 + step))
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.mul_(decay).add_(pm, alpha=1 - decay)


def train(steps: int, batch_size: int = 16, lr: float = 1e-3, seed: int = 0,
          weights: Path = WEIGHTS_FILE, config_path: Path = CONFIG_FILE,
          log_every: int = 50) -> dict:
    """Train from scratch and save the EMA weights.

    Args:
        steps: optimiser steps (>= 1).
        batch_size: videos per step.
        lr: peak learning rate.
        seed: seeds the initial weights, the data stream, the noise and the label dropout.
        weights, config_path: where to write the safetensors file and its JSON config.
        log_every: print the mean loss every this many steps.
    Returns:
        {"steps", "final_loss" (mean of the last 100 steps), "wall_s", "parameters"}.
    Raises:
        ValueError: steps or batch_size < 1.
    """
    from diffusers import DDPMScheduler

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps={steps}, batch_size={batch_size}: expected both >= 1")
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    model = build_model(cfg, seed=seed).train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    sched = DDPMScheduler(**cfg["scheduler"])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    data = cfg["data"]
    losses: list[float] = []
    n_params = sum(p.numel() for p in model.parameters())
    print(f"training {n_params} parameters for {steps} steps, batch {batch_size}", flush=True)
    start = time.perf_counter()
    for step in range(steps):
        videos, labels = moving_digits(batch_size, seed * 1_000_003 + step, frames=data["frames"],
                                       size=data["size"], digit_size=data["digit_size"])
        drop = torch.rand(batch_size, generator=gen) < LABEL_DROPOUT
        labels = torch.where(drop, torch.full_like(labels, NULL_LABEL), labels)
        noise = torch.randn(videos.shape, generator=gen)
        t = torch.randint(0, sched.config.num_train_timesteps, (batch_size,), generator=gen)
        noisy = sched.add_noise(videos, noise, t)
        target = sched.get_velocity(videos, noise, t) if sched.config.prediction_type == "v_prediction" else noise
        loss = torch.nn.functional.mse_loss(model(noisy, t, labels), target)
        for group in opt.param_groups:
            group["lr"] = lr * _lr_factor(step, steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        _ema_update(ema, model, step)
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            print(f"step {step + 1:6d}  loss {recent:.4f}  lr {opt.param_groups[0]['lr']:.2e}  "
                  f"{time.perf_counter() - start:7.1f} s", flush=True)
    wall = time.perf_counter() - start
    save_model(ema, weights, config_path)
    final = sum(losses[-100:]) / len(losses[-100:])
    print(f"done: {steps} steps in {wall:.1f} s, final loss {final:.4f}, wrote {weights}", flush=True)
    return {"steps": steps, "final_loss": final, "wall_s": wall, "parameters": n_params}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch CPU threads (1 is robust on a shared machine; the "
                             "result's last bits may depend on it)")
    parser.add_argument("--weights", type=Path, default=WEIGHTS_FILE)
    parser.add_argument("--config", type=Path, default=CONFIG_FILE)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    train(args.steps, args.batch_size, args.lr, args.seed, args.weights, args.config, args.log_every)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
