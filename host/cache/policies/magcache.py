"""MagCache-style policy (Ma et al. 2025, Zehong-Ma/MagCache), per operator: skip while the
error accumulated from the ratio of output magnitudes stays below a threshold.

MagCache observes that the magnitude ratio of successive residual outputs,
``γ_t = mean|r_t| / mean|r_{t-1}|``, is close to 1 and smooth over most steps and nearly the
same for every prompt, so one calibration run fixes it. While skipping, it multiplies the
ratios of the skipped steps (``Γ``) and accumulates the error ``|1 - Γ|``; it recomputes when
the error reaches the threshold or after ``K`` consecutive skips; the first ``retention``
fraction of the steps is always computed.

Here the rule runs per operator, branch and layer, on the ratios of our profile (mean |output|
per step, averaged over the profile's videos instead of one calibration sample). It needs no
run-time signal, so the schedule is static (:class:`StaticPolicy`). On any architecture: the
ratios are the profile's operators in forward order (:attr:`Profile.model_ops`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from coda.host.cache.schedule import BRANCHES, ModelOps, Schedule, ScheduleError

from .base import calibrate_threshold
from .static import StaticPolicy

__all__ = ["MagCachePolicy", "magnitude_ratios"]


def magnitude_ratios(profile) -> np.ndarray:
    """γ [steps, branches, operators] (the profile's operators in forward order, L*5 for
    Latte): mean |output| at step s over step s-1 (1 at step 0)."""
    mag = np.nanmean(profile.per_op("out_abs"), axis=0)     # [S, B, ops]
    mag = mag.astype(np.float64)
    ratio = np.ones_like(mag)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio[1:] = np.where(mag[:-1] > 0, mag[1:] / mag[:-1], 1.0)
    return np.nan_to_num(ratio, nan=1.0, posinf=1.0)


@dataclass(frozen=True, eq=False)
class MagCachePolicy(StaticPolicy):
    """Attributes: ratios γ [steps, branches, operators] (:func:`magnitude_ratios`),
    threshold, max_skips K >= 1, retention (fraction of leading steps always computed);
    ops: the model the ratios are of (None: Latte's, L*5 operators)."""
    ratios: np.ndarray
    threshold: float = 0.12
    max_skips: int = 2
    retention: float = 0.2
    ops: ModelOps | None = None
    _built: dict = field(default_factory=dict, repr=False, compare=False)
    name = "magcache"
    needs_profile = True
    skip_calibrated = True
    serves_forecast = True

    @classmethod
    def from_inputs(cls, inputs, *, threshold: float | None = None) -> "MagCachePolicy":
        """Calibrated on ``inputs.profile``: the magnitude ratios measured on it, with
        ``threshold`` if given, else the threshold reaching ``inputs.skip`` (:meth:`calibrate`)."""
        profile = inputs.calibration_profile()
        if threshold is not None:
            return cls(magnitude_ratios(profile), float(threshold))
        return cls.calibrate(profile, inputs.need("skip", "skip or threshold"))

    def __post_init__(self):
        if self.threshold < 0 or self.max_skips < 1 or not 0 <= self.retention < 1:
            raise ValueError(f"threshold={self.threshold}, max_skips={self.max_skips}, "
                             f"retention={self.retention}: expected >= 0, >= 1, [0, 1)")

    def build(self, num_steps: int, num_layers: int) -> Schedule:
        if self.ratios.shape[0] != num_steps or self.ratios.shape[2] != num_layers * 5:
            raise ScheduleError(f"magcache: ratios for {self.ratios.shape[0]} steps x "
                                f"{self.ratios.shape[2] // 5} layers; this run has "
                                f"{num_steps} x {num_layers}")
        return self._build(num_steps, ModelOps.latte(num_layers))

    def build_for(self, num_steps: int, ops: ModelOps) -> Schedule:
        """The schedule on the model of ``ops``: the ratios' own (ScheduleError otherwise)."""
        # ratios without operators are a Latte's (profiles made before ModelOps)
        own = self.ops if self.ops is not None or self.ratios.shape[2] % 5 else \
            ModelOps.latte(self.ratios.shape[2] // 5)
        if self.ratios.shape[0] != num_steps or own != ops:
            mine = "latte" if own is None else own.arch
            raise ScheduleError(f"magcache: ratios for {self.ratios.shape[0]} steps of a {mine} "
                                f"model with {self.ratios.shape[2]} operators; this run has "
                                f"{num_steps} steps of a {ops.arch} model with {len(ops.ops)}")
        return self._build(num_steps, ops)

    def _build(self, num_steps: int, ops: ModelOps) -> Schedule:
        first = max(1, math.ceil(self.retention * num_steps))
        reuse: dict = {}
        for bi, branch in enumerate(BRANCHES):
            for k, ref in enumerate(ops.ops):
                gamma, err, run = 1.0, 0.0, 0
                for s in range(first, num_steps - 1):
                    gamma *= float(self.ratios[s, bi, k])
                    err += abs(1.0 - gamma)
                    if err < self.threshold and run < self.max_skips:
                        reuse.setdefault((s, branch), set()).add(ref)
                        run += 1
                    else:
                        gamma, err, run = 1.0, 0.0, 0
        return Schedule(num_steps, ops.num_layers, {k: frozenset(v) for k, v in reuse.items()},
                        name=f"magcache(thr={self.threshold:.4g},K={self.max_skips})", ops=ops)

    @classmethod
    def calibrate(cls, profile, skip: float, retention: float = 0.2) -> "MagCachePolicy":
        """The smallest K (1..10) that can reach ``skip``, then the threshold (bisection)
        whose skip fraction is closest to it, on the profile's model. Raises ValueError for a
        profile too short to cache anything
        (:func:`coda.host.cache.policies.base.refuse_short_run`)."""
        from .base import refuse_short_run
        refuse_short_run(profile.num_steps, "profile --steps", "magcache")
        ratios = magnitude_ratios(profile)
        steps, ops = profile.num_steps, profile.model_ops
        mine = None if ops.arch == "latte" else ops       # Latte: build(), its files as they were
        frac = lambda p: p.schedule_for(steps, ops).ops_skipped_fraction()  # noqa: E731
        for k in range(1, 11):
            if frac(cls(ratios, 1e9, k, retention, mine)) >= skip:
                break
        return calibrate_threshold(lambda t: cls(ratios, t, k, retention, mine), frac, skip,
                                   iters=30)

    def describe(self) -> dict:
        return {"name": self.name, "threshold": self.threshold, "max_skips": self.max_skips,
                "retention": self.retention}
