"""TeaCache-style policy (Liu et al. 2024, ali-vilab/TeaCache): reuse a whole step while the
accumulated, rescaled relative L1 change of the first block's input stays below a threshold.

TeaCache compares the timestep-modulated input of the first transformer block between
consecutive steps, maps the relative L1 change through a polynomial fitted offline (input
change -> output change), accumulates it over the steps it skips, and recomputes (resetting
the sum) once the sum reaches the threshold; the first and last steps are always computed.

How it runs here (per sample and CFG branch, the probe on the NMEs, the polynomial fitted
on a profile by :func:`fit_rescale`): :class:`TeaCachePolicy`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np


from .base import CachePolicy, Decision, OpQuery, calibrate_threshold

__all__ = ["TeaCachePolicy", "fit_rescale"]


#: operator types each architecture's fit leaves out of the output change: the shipped Latte's
#: cross attention attends to one token, its label, so its output never changes
_UNFITTED = {"latte": ("cross_attn",)}


def fit_rescale(profile, degree: int = 4) -> np.ndarray:
    """Polynomial coefficients (``degree + 1``, highest power first) mapping the first
    operator's relative input change to the mean relative output change of the other
    operators, per (video, step >= 1, branch) of the profile (a lower degree, zero-padded,
    when the profile has too few points). Any architecture: the profile's operators
    (:attr:`Profile.model_ops`)."""
    if profile.num_steps < 2:     # no step >= 1: no input change to fit on
        raise ValueError(f"profile of {profile.num_steps} step: the rescaling polynomial is "
                         "fitted on the input changes of steps >= 1, expected a profile of "
                         ">= 2 steps (coda profile --steps)")
    ops = profile.model_ops
    x = profile.per_op("in_change")[:, 1:, :, 0].reshape(-1)     # the step probe, first
    out = profile.per_op("out_change")[:, 1:].copy()             # [V, S-1, B, ops]
    out[..., 0] = np.nan                                        # the signal operator itself
    unfitted = _UNFITTED.get(ops.arch, ())
    out[..., [i for i, (_, op) in enumerate(ops.ops) if op in unfitted]] = np.nan
    y = np.nanmean(out, axis=-1).reshape(-1)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        raise ValueError(f"profile: {int(ok.sum())} finite points, expected at least 2 to fit "
                         "the rescaling polynomial")
    deg = min(degree, int(ok.sum()) - 1)        # a short profile gets a lower degree
    with warnings.catch_warnings():     # few, clustered points: a rough fit is still a fit
        warnings.simplefilter("ignore", np.exceptions.RankWarning)
        coeffs = np.polyfit(x[ok].astype(np.float64), y[ok].astype(np.float64), deg)
    return np.concatenate([np.zeros(degree - deg), coeffs])


@dataclass(eq=False)
class TeaCachePolicy(CachePolicy):
    """Accumulated rescaled relative-L1 threshold on the first operator's input.

    Here, per sample and CFG branch: the first operator (:attr:`ModelOps.step_probe`: Latte's
    layer-0 spatial attention, the first block's attention on the other architectures; its input
    is the input of the first block) is computed every step and keeps its input; its relative L1 change against the previous step is measured
    on the NMEs (:meth:`OpQuery.input_change`, one MonitorEvent per sample and step); the
    polynomial (``numpy.polyfit``, degree 4) is fitted on a profile: that input change against the
    mean relative output change of the other operators at the same step. When the step is
    skipped, every other operator of that sample is reused from its cache. A dynamic policy does
    not know ahead which outputs will be reused, so it writes every computed output to its cache
    slot (their bytes count on the host link).

    TeaCache proper measures the timestep-*modulated* input of the first block
    (``norm1(x) * (1 + scale) + shift``); the engine keeps and compares the residual stream
    entering the probe operator instead (the one tensor its monitor keeps in rank memory, on every
    architecture alike), and the polynomial fitted on the profile maps that signal to the output
    change, whichever it is.

    Attributes:
        threshold: reuse the step while the accumulated rescaled change is below it.
        coeffs: rescaling polynomial (highest power first), e.g. :func:`fit_rescale`.
    """
    threshold: float
    coeffs: tuple = (1.0, 0.0)
    _acc: dict = field(default_factory=dict, repr=False)
    _skip: dict = field(default_factory=dict, repr=False)
    name = "teacache"
    needs_profile = True
    skip_calibrated = True

    @classmethod
    def from_inputs(cls, inputs, *, threshold: float | None = None) -> "TeaCachePolicy":
        """Calibrated on ``inputs.profile``: to ``threshold`` if given (the rescaling fitted on
        the profile), else to ``inputs.skip`` (:meth:`calibrate`)."""
        profile = inputs.calibration_profile()
        if threshold is not None:
            return cls(float(threshold), tuple(fit_rescale(profile)))
        return cls.calibrate(profile, inputs.need("skip", "skip or threshold"))

    def __post_init__(self):
        if not self.threshold >= 0:
            raise ValueError(f"threshold={self.threshold}: expected >= 0")
        self.coeffs = tuple(float(c) for c in self.coeffs)

    def reset(self) -> None:
        self._acc, self._skip = {}, {}

    def rescale(self, x: float) -> float:
        return max(0.0, float(np.polyval(self.coeffs, x)))

    def step_skipped(self, key, step: int, num_steps: int, change: float | None) -> bool:
        """Advance the accumulator of one sample (``key``) by one step; True = reuse."""
        if change is None or step == 0 or step == num_steps - 1:
            self._acc[key] = 0.0
            return False
        acc = self._acc.get(key, 0.0) + self.rescale(change)
        if acc < self.threshold:
            self._acc[key] = acc
            return True
        self._acc[key] = 0.0
        return False

    def decide(self, q: OpQuery) -> Decision:
        key = (q.branch, q.sample)
        if q.index == 0:            # the step probe (ModelOps.step_probe)
            change = q.input_change() if q.kept_step is not None else None
            self._skip[key] = self.step_skipped(key, q.step, q.num_steps, change)
            return Decision(False, store=False, keep_input=True, reason="teacache")
        if self._skip.get(key) and q.cached:
            return Decision(True, reason="threshold")
        return Decision(False, store=True, reason="teacache")

    def simulate_skip(self, profile) -> float:
        """Skip fraction this policy would reach on the profile's videos (its one-step input
        changes taken as the run-time signal)."""
        x = profile.per_op("in_change")[..., 0]            # [V, S, B]: the step probe
        n_v, n_s, n_b = x.shape
        ops = len(profile.model_ops.ops)
        skipped = 0
        for v in range(n_v):
            for b in range(n_b):
                self.reset()
                for s in range(n_s):
                    c = None if s == 0 or not np.isfinite(x[v, s, b]) else float(x[v, s, b])
                    skipped += self.step_skipped(0, s, n_s, c) * (ops - 1)
        self.reset()
        return skipped / (n_v * n_s * n_b * ops)

    @classmethod
    def calibrate(cls, profile, skip: float) -> "TeaCachePolicy":
        """The threshold (bisection) whose simulated skip fraction on the profile is closest
        to ``skip``, with the polynomial fitted on it. Raises ValueError for a profile too
        short to cache anything (:func:`coda.host.cache.policies.base.refuse_short_run`)."""
        from .base import refuse_short_run
        refuse_short_run(profile.num_steps, "profile --steps", "teacache")
        coeffs = tuple(fit_rescale(profile))
        return calibrate_threshold(lambda t: cls(t, coeffs),
                                   lambda p: p.simulate_skip(profile), skip, iters=40)

    def describe(self) -> dict:
        return {"name": self.name, "threshold": self.threshold, "coeffs": list(self.coeffs)}
