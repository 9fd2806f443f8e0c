"""A scikit-learn digit classifier for video frames: measures prompt adherence.

A frame is first *centred*: the digit's intensity-weighted centre of mass picks a
``CROP`` x ``CROP`` window (the digit size used by :mod:`.data`), so the classifier sees the
digit wherever it moved. The window's pixels feed an RBF support-vector classifier
(``sklearn.svm.SVC``, deterministic) trained on frames of moving-digit videos made from the
*training* digit images; its accuracy is measured on frames made from the *held-out* digit
images (:data:`.data.HOLDOUT_FRACTION`). Training takes a few seconds and happens once per
process (no pickles are shipped).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from .data import moving_digits

__all__ = ["CROP", "frame_features", "DigitClassifier", "digit_classifier", "label_accuracy"]

CROP = 16           # window side in pixels (= data.moving_digits' digit_size)
TRAIN_VIDEOS = 1500  # videos per split used to fit / test (8 frames each)
TRAIN_SEED, TEST_SEED = 11, 12


def frame_features(frames: torch.Tensor) -> np.ndarray:
    """Centred ``CROP`` x ``CROP`` windows of frames, flattened.

    Args:
        frames: float [N, H, W] in [-1, 1] (H, W >= CROP).
    Returns:
        float32 [N, CROP*CROP] in [0, 1].
    Raises:
        ValueError: frames not 3-D or smaller than the window.
    """
    if frames.ndim != 3 or min(frames.shape[-2:]) < CROP:
        raise ValueError(f"frames shape {tuple(frames.shape)}: expected [N, H>={CROP}, W>={CROP}]")
    ink = ((frames.detach().float().cpu() + 1.0) / 2.0).clamp(0.0, 1.0)
    n, h, w = ink.shape
    mass = ink.sum(dim=(1, 2))
    rows = torch.arange(h, dtype=torch.float32)
    cols = torch.arange(w, dtype=torch.float32)
    safe = mass.clamp_min(1e-6)
    cy = torch.where(mass > 1e-3, (ink.sum(2) * rows).sum(1) / safe, torch.full_like(mass, (h - 1) / 2))
    cx = torch.where(mass > 1e-3, (ink.sum(1) * cols).sum(1) / safe, torch.full_like(mass, (w - 1) / 2))
    top = (cy - (CROP - 1) / 2).round().long().clamp(0, h - CROP)
    left = (cx - (CROP - 1) / 2).round().long().clamp(0, w - CROP)
    out = torch.stack([ink[i, top[i]:top[i] + CROP, left[i]:left[i] + CROP] for i in range(n)])
    return out.reshape(n, -1).numpy().astype(np.float32)


def _frames_and_labels(videos: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    if videos.ndim != 5 or videos.shape[1] != 1:
        raise ValueError(f"videos shape {tuple(videos.shape)}: expected [B, 1, F, H, W]")
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if labels.shape[0] != videos.shape[0]:
        raise ValueError(f"{labels.shape[0]} labels for {videos.shape[0]} videos: expected one per video")
    frames = videos[:, 0].reshape(-1, *videos.shape[-2:])
    return frames, labels.repeat_interleave(videos.shape[2]).numpy()


class DigitClassifier:
    """Fitted frame classifier. Attributes: ``svc``, ``heldout_accuracy`` (fraction of
    held-out frames classified right)."""

    def __init__(self):
        from sklearn.svm import SVC

        videos, labels = moving_digits(TRAIN_VIDEOS, TRAIN_SEED, split="train")
        frames, y = _frames_and_labels(videos, labels)
        self.svc = SVC(C=10.0, gamma="scale").fit(frame_features(frames), y)
        test_v, test_l = moving_digits(TRAIN_VIDEOS, TEST_SEED, split="test")
        self.heldout_accuracy = self.frame_accuracy(test_v, test_l)

    def predict_frames(self, videos: torch.Tensor) -> np.ndarray:
        """Predicted digit per frame: int64 [B, F] for videos [B, 1, F, H, W] in [-1, 1]."""
        frames, _ = _frames_and_labels(videos, torch.zeros(videos.shape[0], dtype=torch.long))
        return self.svc.predict(frame_features(frames)).reshape(videos.shape[0], videos.shape[2])

    def frame_accuracy(self, videos: torch.Tensor, labels: torch.Tensor) -> float:
        """Fraction of all frames whose predicted digit is the video's label."""
        _, per_frame = _frames_and_labels(videos, labels)
        return float((self.predict_frames(videos).reshape(-1) == per_frame).mean())


@lru_cache(maxsize=1)
def digit_classifier() -> DigitClassifier:
    """The process-wide classifier, fitted on first use (a few seconds)."""
    return DigitClassifier()


def label_accuracy(videos: torch.Tensor, labels: torch.Tensor) -> float:
    """Prompt adherence: the per-frame mean accuracy, i.e. the fraction of all B*F frames
    in which the classifier recognises the video's label.

    Args:
        videos: float [B, 1, F, H, W] in [-1, 1].
        labels: int64 [B] digits 0..9.
    Returns:
        accuracy in [0, 1].
    Raises:
        ValueError: on mismatched shapes.
    """
    return digit_classifier().frame_accuracy(videos, labels)
