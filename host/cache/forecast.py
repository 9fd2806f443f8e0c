"""Forecast mode of the cache: a reused operator contributes a damped extrapolation of its last
two computed outputs instead of the last one alone,

    c_hat_t = c_k + alpha_t (c_k - c_k')  =  (1 + alpha_t) c_k - alpha_t c_k'

(``k``: the last step that computed the operator, ``k'``: the one before; ScalingCache,
ICLR'26, and FasterCache's weighted difference calibrate alpha offline per step). On the
DIMM-NMP this is a 2-term segment with gate vectors the host scales,
``y = x + (g (1 + alpha)) c_k + (-g alpha) c_k'``: no new hardware, one more stream read on
the NME, and the older entry kept in rank memory beside the newer one.

:class:`ForecastTable` holds alpha per reused step and operator type, calibrated on
calibration videos only (:func:`coda.experiments.forecast_calibration.calibrate_forecast`:
closed-form least squares of the full-compute output against the extrapolation, clipped to
:data:`ALPHA_RANGE`), and names the model (hash), the schedule (digest) and the step count it
was made for; :meth:`ForecastTable.check_for` refuses another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["CACHE_MODES", "ALPHA_RANGE", "ForecastTable", "fit_alpha", "forecast_gates"]

#: what a reused operator contributes: ``reuse`` c_k, ``forecast`` (1 + alpha) c_k - alpha c_k'
CACHE_MODES = ("reuse", "forecast")

#: the range alpha is clipped to: 0 is plain reuse; above 1 the extrapolation reaches past a
#: full step of the last difference, which the calibration videos rarely support and which
#: amplifies the bf16 rounding of both entries
ALPHA_RANGE = (0.0, 1.0)


def fit_alpha(num: float, den: float, lo: float = ALPHA_RANGE[0],
              hi: float = ALPHA_RANGE[1]) -> float:
    """The least-squares alpha of ``min_a sum |c_t - c_k - a (c_k - c_k')|^2`` from its sums
    ``num = sum <c_t - c_k, c_k - c_k'>`` and ``den = sum |c_k - c_k'|^2`` (unitless),
    clipped to ``[lo, hi]``; 0 (plain reuse) when ``den`` is 0 (the two entries equal)."""
    if not (math.isfinite(num) and math.isfinite(den)) or den < 0:
        raise ValueError(f"fit_alpha: num={num}, den={den}: expected finite sums, den >= 0")
    if den == 0:
        return 0.0
    return min(hi, max(lo, num / den))


def forecast_gates(gate, alpha: float, dtype):
    """The two gate vectors of a forecast term, ``(g (1 + alpha), -g alpha)``, computed in
    fp32 from ``gate`` (a tensor of any shape) and rounded once to ``dtype`` (the NME format):
    the torch reference and the NMEs read the same rounded gates."""
    g = gate.float()
    return (g * (1.0 + alpha)).to(dtype), (g * -alpha).to(dtype)


@dataclass(frozen=True)
class ForecastTable:
    """alpha per reused step and operator type (unitless; :data:`ALPHA_RANGE`).

    Attributes:
        alphas: step -> operator type -> alpha. A (step, type) not listed forecasts with
            alpha 0 (plain reuse).
        num_steps: the run's step count. model_hash: :func:`coda.experiments.profile.model_hash`.
        schedule: the digest of the schedule it was calibrated for
            (:meth:`coda.host.cache.schedule.Schedule.digest`).
        videos: the calibration videos, ``(prompt, seed)`` each.
        fit: per (step, type), the relative squared error of reuse and of the forecast on the
            calibration videos (``{"reuse": r, "forecast": f}``), for the record.
    """
    alphas: Mapping[int, Mapping[str, float]]
    num_steps: int
    model_hash: str
    schedule: str
    videos: tuple = ()
    fit: Mapping = field(default_factory=dict)

    def __post_init__(self):
        lo, hi = ALPHA_RANGE
        for step, row in self.alphas.items():
            if not 0 <= int(step) < self.num_steps:
                raise ValueError(f"forecast table: step {step}: expected 0..{self.num_steps - 1}")
            for op, a in row.items():
                if not (math.isfinite(a) and lo <= a <= hi):
                    raise ValueError(f"forecast table: alpha {a} at step {step}, {op!r}: "
                                     f"expected {lo}..{hi}")

    def alpha(self, step: int, op: str) -> float:
        """alpha at ``step`` for operator type ``op`` (0 where not calibrated)."""
        return float(self.alphas.get(step, {}).get(op, 0.0))

    def check_for(self, model_hash: str | None, num_steps: int, schedule=None,
                  what: str = "forecast table") -> None:
        """Raise ValueError naming ``what`` unless the table was made for this model hash,
        step count and :class:`coda.host.cache.schedule.Schedule` (None skips that check)."""
        if model_hash is not None and self.model_hash != model_hash:
            raise ValueError(f"{what}: calibrated for model {self.model_hash}, expected the "
                             f"model in use ({model_hash})")
        if self.num_steps != num_steps:
            raise ValueError(f"{what}: calibrated for {self.num_steps} steps, expected "
                             f"{num_steps}")
        if schedule is not None and self.schedule != schedule.digest():
            raise ValueError(f"{what}: calibrated for schedule {self.schedule}, expected the "
                             f"schedule in use ({schedule.digest()}, {schedule.name!r}); "
                             "calibrate it for this schedule")

    def to_dict(self) -> dict:
        return {"alphas": {str(s): dict(row) for s, row in sorted(self.alphas.items())},
                "num_steps": self.num_steps, "model_hash": self.model_hash,
                "schedule": self.schedule, "videos": [list(v) for v in self.videos],
                "fit": {str(k): v for k, v in self.fit.items()}}

    @classmethod
    def from_dict(cls, data: Mapping) -> "ForecastTable":
        """The table of :meth:`to_dict`; raises ValueError for a malformed one."""
        try:
            return cls({int(s): {str(op): float(a) for op, a in row.items()}
                        for s, row in data["alphas"].items()},
                       int(data["num_steps"]), str(data["model_hash"]), str(data["schedule"]),
                       tuple(tuple(v) for v in data.get("videos", ())),
                       dict(data.get("fit", {})))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"forecast table: malformed ({type(exc).__name__}: {exc})") from None

    def describe(self) -> dict:
        vals = [a for row in self.alphas.values() for a in row.values()]
        return {"steps": len(self.alphas), "alpha_mean": sum(vals) / len(vals) if vals else 0.0,
                "alpha_max": max(vals, default=0.0), "videos": len(self.videos)}
