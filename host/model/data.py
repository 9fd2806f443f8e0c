"""Moving-digit videos built from scikit-learn's bundled digits dataset.

Each video shows one handwritten digit (``sklearn.datasets.load_digits``: 1797 images of
8x8 pixels, 17 grey levels 0..16) upscaled to ``digit_size`` pixels and translated across
the frames along a random direction, bouncing off the frame edges. Pixel values are in
[-1, 1] (-1 = black background). Everything is deterministic given the seed.

The digit images are split once, by a fixed permutation (seed :data:`SPLIT_SEED`), into a
training part (first ``1 - HOLDOUT_FRACTION``) and a held-out part used only to test the
digit classifier, so the classifier's accuracy is measured on handwriting it never saw.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["NUM_CLASSES", "NULL_LABEL", "HOLDOUT_FRACTION", "SPLIT_SEED", "digit_images",
           "moving_digits", "render_frames", "spec_corners", "prompted_videos"]

NUM_CLASSES = 10
NULL_LABEL = 10            # the "no prompt" label used by classifier-free guidance
HOLDOUT_FRACTION = 0.2     # share of the 1797 digit images kept out of training
SPLIT_SEED = 0
SPEED_PX = (1.0, 2.5)      # pixels per frame, drawn uniformly


@lru_cache(maxsize=8)
def _split_images(split: str, digit_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    if split not in ("train", "test"):
        raise ValueError(f"split={split!r}: expected 'train' or 'test'")
    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 16.0)  # [N, 8, 8] in [0, 1]
    labels = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(SPLIT_SEED).permutation(len(labels)))
    n_test = int(round(HOLDOUT_FRACTION * len(labels)))
    idx = order[n_test:] if split == "train" else order[:n_test]
    big = F.interpolate(images[idx, None], size=(digit_size, digit_size), mode="bilinear",
                        align_corners=False)[:, 0].clamp(0.0, 1.0)
    return big.contiguous(), labels[idx].contiguous()


def digit_images(split: str = "train", digit_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The upscaled digit images of one split.

    Args:
        split: ``"train"`` (80 %) or ``"test"`` (20 % held out).
        digit_size: side of the upscaled digit in pixels (bilinear from 8x8).
    Returns:
        (images float32 [N, digit_size, digit_size] in [0, 1], labels int64 [N]).
    Raises:
        ValueError: unknown split or digit_size < 8.
    """
    if digit_size < 8:
        raise ValueError(f"digit_size={digit_size}: expected >= 8 pixels")
    return _split_images(split, int(digit_size))


def _trajectories(n: int, frames: int, span: int, gen: torch.Generator) -> torch.Tensor:
    """Top-left corners [n, frames, 2] (row, col) in pixels, bouncing inside [0, span]."""
    start = torch.rand(n, 2, generator=gen) * span
    angle = torch.rand(n, generator=gen) * 2 * math.pi
    speed = SPEED_PX[0] + torch.rand(n, generator=gen) * (SPEED_PX[1] - SPEED_PX[0])
    velocity = torch.stack([torch.sin(angle), torch.cos(angle)], dim=1) * speed[:, None]
    travel = start[:, None, :] + velocity[:, None, :] * torch.arange(frames)[None, :, None]
    if span == 0:
        return torch.zeros(n, frames, 2, dtype=torch.long)
    # Reflecting at the walls is a triangle wave of period 2*span.
    folded = torch.remainder(travel, 2 * span)
    folded = torch.where(folded > span, 2 * span - folded, folded)
    return folded.round().long()


def render_frames(images: torch.Tensor, corners: torch.Tensor, size: int) -> torch.Tensor:
    """Paste each digit at its per-frame corner on a black frame.

    Args:
        images: float32 [B, d, d] in [0, 1].
        corners: int64 [B, F, 2] top-left (row, col), each in [0, size - d].
        size: frame side in pixels.
    Returns:
        float32 [B, 1, F, size, size] in [-1, 1].
    """
    b, d = images.shape[0], images.shape[-1]
    frames = corners.shape[1]
    video = torch.zeros(b, frames, size, size)
    for i in range(b):
        for f in range(frames):
            r, c = int(corners[i, f, 0]), int(corners[i, f, 1])
            video[i, f, r:r + d, c:c + d] = images[i]
    return (video * 2.0 - 1.0)[:, None]


def moving_digits(n: int, seed: int, split: str = "train", frames: int = 8, size: int = 32,
                  digit_size: int = 16, labels: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of moving-digit videos.

    Args:
        n: number of videos (>= 1).
        seed: seed of the torch generator choosing digits, start points and directions.
        split: which digit images to draw from (``"train"`` or ``"test"``).
        frames: frames per video F (>= 1).
        size: frame side H = W in pixels (>= digit_size).
        digit_size: side of the digit in pixels.
        labels: optional int64 [n] of wanted digits 0..9 (an image of that digit is drawn).
    Returns:
        (videos float32 [n, 1, F, size, size] in [-1, 1], labels int64 [n]).
    Raises:
        ValueError: on a non-positive count, a frame smaller than the digit, or labels out
            of 0..9 / of the wrong length.
    """
    if n < 1 or frames < 1:
        raise ValueError(f"n={n}, frames={frames}: expected both >= 1")
    if size < digit_size:
        raise ValueError(f"size={size}: expected >= digit_size={digit_size}")
    images, all_labels = digit_images(split, digit_size)
    gen = torch.Generator().manual_seed(int(seed))
    if labels is None:
        pick = torch.randint(len(all_labels), (n,), generator=gen)
    else:
        labels = torch.as_tensor(labels, dtype=torch.long)
        if labels.shape != (n,) or labels.min() < 0 or labels.max() >= NUM_CLASSES:
            raise ValueError(f"labels={labels.tolist()}: expected {n} digits in 0..9")
        pick = torch.empty(n, dtype=torch.long)
        for i, lab in enumerate(labels.tolist()):
            pool = torch.nonzero(all_labels == lab)[:, 0]
            pick[i] = pool[torch.randint(len(pool), (1,), generator=gen)]
    corners = _trajectories(n, frames, size - digit_size, gen)
    return render_frames(images[pick], corners, size), all_labels[pick].clone()


def spec_corners(spec, frames: int, span: int, gen: torch.Generator) -> torch.Tensor:
    """Top-left corners int64 [len(spec.digits), frames, 2] (row, col) of what a prompt asks.

    One moving digit: a straight line at :data:`~coda.host.model.prompts.SPEEDS` pixels per
    frame along its direction, from a start drawn so that the path stays inside [0, span]
    (no bounce, so the trajectory shows the direction); a path longer than ``span`` stops at
    the wall. Two digits drifting apart: the first from just left of the middle moving left,
    the second from just right of it moving right, 1 pixel per frame each, rows drawn
    independently. A still digit: a random position.
    """
    from .prompts import DIRECTIONS, SPEEDS

    f = torch.arange(frames, dtype=torch.float32)
    if spec.direction == "apart":
        rows = torch.rand(2, generator=gen) * span
        cols = torch.stack([span // 2 - 1 - f, span // 2 + 1 + f])
        corners = torch.stack([rows[:, None].expand(2, frames), cols], dim=-1)
    elif spec.direction is None:
        corners = (torch.rand(1, 1, 2, generator=gen) * span).expand(1, frames, 2)
    else:
        v = torch.tensor(DIRECTIONS[spec.direction]) * SPEEDS[spec.speed]
        travel = v * (frames - 1)
        low, high = (-travel).clamp(min=0), span - travel.clamp(min=0)
        start = low + torch.rand(2, generator=gen) * (high - low).clamp(min=0)
        corners = (start[None] + f[:, None] * v[None])[None]
    return corners.round().clamp(0, span).long()


def prompted_videos(specs, seed: int, split: str = "train", frames: int = 8, size: int = 32,
                    digit_size: int = 16) -> torch.Tensor:
    """Videos that show what each prompt says (:mod:`coda.host.model.prompts`).

    Args:
        specs: list of ``PromptSpec`` with at least one digit each.
        seed: seed of the torch generator choosing handwriting images and start points.
        split: which digit images to draw from (``"train"`` or ``"test"``).
        frames, size, digit_size: as :func:`moving_digits`.
    Returns:
        float32 [len(specs), 1, frames, size, size] in [-1, 1]; overlapping digits take the
        brighter pixel.
    Raises:
        ValueError: an empty list, a spec without digits, frames < 1, size < digit_size.
    """
    if not specs or frames < 1:
        raise ValueError(f"{len(specs)} specs, frames={frames}: expected >= 1 of each")
    if size < digit_size:
        raise ValueError(f"size={size}: expected >= digit_size={digit_size}")
    images, labels = digit_images(split, digit_size)
    pools = [torch.nonzero(labels == d)[:, 0] for d in range(NUM_CLASSES)]
    gen = torch.Generator().manual_seed(int(seed))
    video = torch.zeros(len(specs), frames, size, size)
    for i, spec in enumerate(specs):
        if not spec.digits:
            raise ValueError(f"spec {i} {spec!r}: the null prompt has no video")
        corners = spec_corners(spec, frames, size - digit_size, gen)
        for k, digit in enumerate(spec.digits):
            pool = pools[digit]
            image = images[pool[torch.randint(len(pool), (1,), generator=gen)]][0]
            for t in range(frames):
                r, c = int(corners[k, t, 0]), int(corners[k, t, 1])
                window = video[i, t, r:r + digit_size, c:c + digit_size]
                torch.maximum(window, image, out=window)
    return (video * 2.0 - 1.0)[:, None]
