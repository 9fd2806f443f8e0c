"""Forecast mode of the cache: a reused operator contributes a damped extrapolation of its last
two computed outputs instead of the last one alone,

    c_hat_t = c_k + alpha_t (c_k - c_k')  =  (1 + alpha_t) c_k - alpha_t c_k'

(``k``: the last step that computed the operator, ``k'``: the one before; ScalingCache,
ICLR'26, and FasterCache's weighted difference calibrate alpha offline per step). On the
DIMM-NMP this is a 2-term segment with gate vectors the host scales,
``y = x + (g (1 + alpha)) c_k + (-g alpha) c_k'``: no new hardware, one more stream read on
the NME, and the older entry kept in rank memory beside the newer one.

:class:`ForecastTable` holds alpha per reused step and operator type, calibrated on
calibration videos only (:func:`coda.experiments.forecast_calibration.calibrate_forecast`),
for one model, schedule and step count (:meth:`ForecastTable.check_for` refuses another).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from coda.host.cache.schedule import ALL_OP_TYPES, BRANCHES, MAX_STEPS, STEP_KEY
from coda.jsonin import check

__all__ = ["CACHE_MODES", "ALPHA_RANGE", "FORECAST_SCHEMA", "ForecastTable", "fit_alpha",
           "forecast_gates"]

#: what a reused operator contributes: ``reuse`` c_k, ``forecast`` (1 + alpha) c_k - alpha c_k'
CACHE_MODES = ("reuse", "forecast")

#: the range alpha is clipped to: 0 is plain reuse; above 1 the extrapolation reaches past a
#: full step of the last difference, which the calibration videos rarely support and which
#: amplifies the bf16 rounding of both entries
ALPHA_RANGE = (0.0, 1.0)

_NAME = {"type": "string", "maxLength": 64}
#: :meth:`ForecastTable.to_dict` (a schedule file's ``"forecast"`` block) as a JSON schema
#: (:func:`coda.jsonin.check`)
FORECAST_SCHEMA: dict = {
    "type": "object",
    "required": ["alphas", "num_steps", "model_hash", "schedule"],
    "properties": {
        "alphas": {"type": "object", "maxProperties": MAX_STEPS, "propertyNames": STEP_KEY,
                   "expected": "{step: {operator type: alpha}}",
                   "additionalProperties": {
                       "type": "object", "maxProperties": len(ALL_OP_TYPES),
                       "propertyNames": _NAME,
                       "expected": "{operator type: alpha}",
                       "additionalProperties": {"type": "number", "minimum": ALPHA_RANGE[0],
                                                "maximum": ALPHA_RANGE[1]}}},
        "num_steps": {"type": "integer", "minimum": 1, "maximum": MAX_STEPS},
        "model_hash": _NAME,
        "schedule": _NAME,
        "videos": {"type": "array", "maxItems": 100_000, "expected": "[[prompt, seed], ...]",
                   "items": {"type": "array", "minItems": 2, "maxItems": 2,
                             "items": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                             "expected": "[prompt, seed]"}},
        "fit": {"type": "object", "maxProperties": len(ALL_OP_TYPES) * MAX_STEPS,
                "expected": "{\"step:operator type\": {\"reuse\": error, \"forecast\": "
                            "error}}",
                "additionalProperties": {
                    "type": "object", "required": ["reuse", "forecast"],
                    "properties": {"reuse": {"type": "number"},
                                   "forecast": {"type": "number"}},
                    "additionalProperties": False}},
    },
    "additionalProperties": False,
}


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

    Calibrated by closed-form least squares of the full-compute output against the
    extrapolation, clipped to :data:`ALPHA_RANGE`; names the model (hash), the schedule
    (digest) and the step count it was made for.

    Attributes:
        alphas: step -> operator type -> alpha. A (step, type) not listed forecasts with
            alpha 0 (plain reuse).
        num_steps: the run's step count. model_hash: :func:`coda.host.cache.profile.model_hash`.
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

    def check_applies(self, schedule, what: str = "forecast table") -> None:
        """Raise ValueError naming ``what`` and the alpha (``alphas.STEP.OP``) unless every
        alpha is one a run of the :class:`coda.host.cache.schedule.Schedule` ``schedule``
        applies: of one of its operator types, at a step where it reuses an operator of
        that type after two computed outputs
        (:meth:`~coda.host.cache.schedule.Schedule.computed_pairs`). A schedule file's table
        is held to it (an alpha that never applies would still count in
        :meth:`describe`)."""
        types = schedule.model_ops().op_types
        points = {(t, ref[1]) for b in BRANCHES for ref in schedule.order()
                  for t in schedule.computed_pairs(b, ref)}
        for step, row in sorted(self.alphas.items()):
            for op in row:
                if op not in types:
                    raise ValueError(f"{what}: alphas.{step}.{op}: unknown operator type "
                                     f"{op!r}; expected one of {', '.join(types)}")
                if (step, op) not in points:
                    raise ValueError(
                        f"{what}: alphas.{step}.{op}: step {step} forecasts no {op!r} (the "
                        f"schedule reuses no {op!r} there after two computed outputs, so the "
                        "alpha would never apply); expected alphas only where the schedule "
                        "forecasts")

    def to_dict(self) -> dict:
        return {"alphas": {str(s): dict(row) for s, row in sorted(self.alphas.items())},
                "num_steps": self.num_steps, "model_hash": self.model_hash,
                "schedule": self.schedule, "videos": [list(v) for v in self.videos],
                "fit": {str(k): v for k, v in self.fit.items()}}

    @classmethod
    def from_dict(cls, data: Mapping, what: str = "forecast table") -> "ForecastTable":
        """The table of :meth:`to_dict`'s parsed JSON. Raises ValueError naming ``what``
        and the field for one that breaks :data:`FORECAST_SCHEMA` (types, ranges) or has a
        step outside ``0..num_steps-1``."""
        check(data, FORECAST_SCHEMA, what)
        for s in data["alphas"]:
            if int(s) >= data["num_steps"]:
                raise ValueError(f"{what}: alphas.{s}: step {s}; expected a step "
                                 f"0..{data['num_steps'] - 1} (num_steps {data['num_steps']})")
        return cls({int(s): dict(row) for s, row in data["alphas"].items()},
                   data["num_steps"], data["model_hash"], data["schedule"],
                   tuple(tuple(v) for v in data.get("videos", ())), dict(data.get("fit", {})))

    def describe(self) -> dict:
        vals = [a for row in self.alphas.values() for a in row.values()]
        return {"steps": len(self.alphas), "alpha_mean": sum(vals) / len(vals) if vals else 0.0,
                "alpha_max": max(vals, default=0.0), "videos": len(self.videos)}
