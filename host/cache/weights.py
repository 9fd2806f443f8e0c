"""Weights of the quality proxy read from a profile (:class:`coda.host.cache.profile.Profile`, read
by attribute only): the per-step weight of a reuse (:func:`step_weights`) and the per-operator
weight (:func:`quality_weights`). Used by the schedule search's stand-in
(:mod:`coda.experiments.step_plans`), DRA's calibration, the profile's step sensitivity and the
LeMiCa-style path (:mod:`coda.host.cache.policies.lemica`); this module imports nothing of the
project, so all of them can.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["step_weights", "quality_weights"]


def step_weights(profile) -> tuple[float, np.ndarray]:
    """(p, w[steps]): the weight of a reuse at each step in the quality proxy, the profile's
    measured step sensitivity (:func:`coda.experiments.profile.step_sensitivity`) smoothed by the
    least-squares fit ``log sens = c + p log(1 - s/S)`` (the measurement is noisy, a few
    videos per block; its trend is a decay: a deviation early moves the rest of the
    trajectory, one late does not). Mean 1; p = 0 (flat) without a measurement."""
    steps = profile.num_steps
    frac = 1.0 - (np.arange(steps) + 0.5) / steps
    sens = profile.sensitivity
    if sens is None or not np.all(np.isfinite(sens)) or np.any(np.asarray(sens) <= 0):
        return 0.0, np.ones(steps)
    a = np.stack([np.ones(steps), np.log(frac)], axis=1)
    p = float(np.clip(np.linalg.lstsq(a, np.log(np.asarray(sens, np.float64)), rcond=None)[0][1],
                      0.0, 8.0))
    w = frac ** p
    return p, w / w.mean()


def quality_weights(profile) -> np.ndarray:
    """[branches, ops]: mean |output| / mean |input| over videos and steps >= 1 (how much of
    the residual stream an operator writes), the profile's operators in forward order
    (``profile.per_op``); 1 where undefined."""
    with warnings.catch_warnings():     # a grid cell of an operator the model lacks: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        out = np.nanmean(profile.out_abs[:, 1:], axis=(0, 1))      # [B, L, K]
        inp = np.nanmean(profile.in_abs[:, 1:], axis=(0, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(inp > 0, out / inp, 1.0)
    w = np.nan_to_num(w, nan=1.0)
    return profile.per_op(w)
