"""Quality metrics of cached videos against full-compute ones (pixels in [-1, 1], float
tensors [B, 1, F, H, W]): PSNR and SSIM by torchmetrics, the digit's motion. Used by ``coda
eval`` (:mod:`coda.experiments.evaluate`) and the schedule search's rollouts
(:mod:`coda.experiments.search`)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["psnr_db", "ssim", "motion_px", "worst_quarter"]


def _frames(video: torch.Tensor) -> torch.Tensor:
    if video.ndim != 5:
        raise ValueError(f"video shape {tuple(video.shape)}: expected [B, 1, F, H, W]")
    return video.double().reshape(-1, 1, *video.shape[-2:])


def psnr_db(test: torch.Tensor, reference: torch.Tensor) -> float:
    """PSNR (dB) over all elements, data range 2 (pixels in [-1, 1]); torchmetrics. ``inf``
    for identical videos (written as ``null`` to JSON, :func:`coda.jsonout.json_text`).
    Raises ValueError for shapes that differ."""
    from torchmetrics.functional.image import peak_signal_noise_ratio

    if test.shape != reference.shape:
        raise ValueError(f"shapes {tuple(test.shape)} vs {tuple(reference.shape)}: expected equal")
    if torch.equal(test, reference):
        return float("inf")
    return float(peak_signal_noise_ratio(_frames(test), _frames(reference), data_range=2.0))


def ssim(test: torch.Tensor, reference: torch.Tensor) -> float:
    """Mean SSIM over all frames (11x11 Gaussian window, sigma 1.5, data range 2);
    torchmetrics."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    if test.shape != reference.shape:
        raise ValueError(f"shapes {tuple(test.shape)} vs {tuple(reference.shape)}: expected equal")
    return float(structural_similarity_index_measure(_frames(test), _frames(reference),
                                                     data_range=2.0))


def motion_px(video: torch.Tensor) -> np.ndarray:
    """Per video, the mean travel (pixels per frame) of the ink's centre of mass."""
    ink = ((video[:, 0].double() + 1) / 2).clamp(0, 1)         # [B, F, H, W]
    h, w = ink.shape[-2:]
    mass = ink.sum(dim=(-1, -2)).clamp_min(1e-6)
    cy = (ink.sum(-1) * torch.arange(h, dtype=torch.float64)).sum(-1) / mass
    cx = (ink.sum(-2) * torch.arange(w, dtype=torch.float64)).sum(-1) / mass
    step = torch.sqrt(torch.diff(cy, dim=1) ** 2 + torch.diff(cx, dim=1) ** 2)
    return step.mean(dim=1).numpy()


def worst_quarter(psnr) -> np.ndarray:
    """The indices of the quarter of the videos (at least one) with the lowest PSNR, lowest
    first (ties in index order): the corner set a dynamic fallback is judged on. Raises
    ValueError for no video."""
    psnr = np.asarray(psnr, dtype=float)
    if psnr.ndim != 1 or not len(psnr):
        raise ValueError(f"psnr of shape {psnr.shape}: expected one value per video, >= 1")
    return np.argsort(psnr, kind="stable")[:max(1, len(psnr) // 4)]
