"""Step-level dynamic runtime adjustment (DRA): a shadow monitor around a static schedule that
recomputes a whole step when the video moved more than the calibration videos did.

Mixing fresh and stale operators inside one step costs quality (the search's measurement,
:mod:`coda.experiments.search`), so DRA decides per step, not per operator. Per sample and CFG
branch, at a step where the static policy reuses the first operator (layer 0's first op; its
input is the block-0 input), DRA measures the relative L1 change of that input,
``Σ|x - x_ref| / Σ|x_ref|``, against the input kept at the last step that computed the first
operator: the numerator on the NMEs (:meth:`OpQuery.input_change`, one
:class:`coda.host.cache.events.MonitorEvent` with its bytes and NME cycles), the reference kept in
rank memory (``Decision(keep_input=True)`` when the first operator is computed and its
output stored). If the change exceeds the step's threshold, every operator of that step the
static policy would have reused is computed instead (reason ``"fallback"``) and stored, so
the steps after it read fresh caches; the first operator's input is kept again.

Thresholds (:class:`StepThresholds`) come from calibration videos only:
:func:`coda.experiments.dra_calibration.calibrate_step_dra` runs the static schedule with the probes
(:class:`StepDRAPolicy` with ``thresholds=None`` measures, never falls back) and sets each
reused step's threshold to a quantile of the probe values seen there, times a margin. The
table names the model (hash), the schedule (digest), the step count and the calibration
videos; a table for another model, schedule or step count is refused.

Costs (read them from the events): a monitor per probed step and sample, the kept inputs
(``kept_bytes``), and the recomputed operators (``reason == "fallback"``: exactly the extra
executions over the static policy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from coda.host.cache.schedule import Schedule

from .base import CachePolicy, Decision, OpQuery
from .static import SchedulePolicy

__all__ = ["StepDRAPolicy", "StepThresholds", "DEFAULT_QUANTILE",
           "DEFAULT_MARGIN"]

#: quantile of the calibration probes taken as a step's threshold, chosen on the calibration
#: videos only (the shipped profile's: digits 0-9 x seeds 100, 101), around the LeMiCa
#: whole-step schedule for skip 0.5 of the shipped model (50 steps, CFG 5). Extra operator
#: executions (of all 2,000 per video) and mean per-video PSNR against full compute, static
#: 40.59 dB, on its 5 most fragile videos 37.57 dB:
#:
#: =========  =====  =========  ======================
#: quantile   extra  PSNR (dB)  PSNR fragile 5 (extra)
#: =========  =====  =========  ======================
#: 0.5        12.8 %   42.69      41.15 (15.2 %)
#: 0.75        6.4 %   41.66      39.28 (6.8 %)
#: 0.9         2.5 %   41.04      38.68 (2.0 %)
#: 0.95        1.7 %   40.75      37.64 (0.4 %)
#: 1.0         0        40.59      37.57 (0)
#: =========  =====  =========  ======================
#:
#: 0.9 is the smallest quantile within 5 % extra executions. Reported, not chosen on: the
#: held-out seeds 0, 1 (20 videos) at 0.9: 1.2 % extra, mean PSNR 40.65 -> 40.85 dB, the
#: static schedule's worst quarter 37.40 -> 37.55 dB.
DEFAULT_QUANTILE = 0.9
DEFAULT_MARGIN = 1.0


@dataclass(frozen=True)
class StepThresholds:
    """Per reused step, the largest relative L1 change of the block-0 input DRA lets a reuse
    through (a unitless ratio, float).

    Attributes:
        thresholds: step index -> threshold (>= 0, finite) for every step at which the
            calibrated schedule reuses the first operator in some branch.
        num_steps: the run's step count. model_hash: :func:`coda.experiments.profile.model_hash`.
        schedule_hash: :meth:`Schedule.digest` of the calibrated schedule.
        quantile, margin: threshold = margin x the quantile of the calibration probes.
        prompts, seeds: the calibration videos (every prompt with every seed).
        guidance_scale: the CFG scale of the calibration runs.
    Raises:
        ValueError: a threshold that is negative or not finite, a step outside
            0..num_steps-1, a quantile outside [0, 1] or a margin <= 0.
    """
    thresholds: Mapping[int, float]
    num_steps: int
    model_hash: str
    schedule_hash: str
    quantile: float
    margin: float
    prompts: tuple = ()
    seeds: tuple = ()
    guidance_scale: float = 0.0

    def __post_init__(self):
        clean = {int(s): float(t) for s, t in self.thresholds.items()}
        for s, t in clean.items():
            if not 0 <= s < self.num_steps:
                raise ValueError(f"DRA threshold at step {s}: expected steps "
                                 f"0..{self.num_steps - 1}")
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"DRA threshold {t} at step {s}: expected a finite value >= 0")
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"quantile={self.quantile}: expected a fraction in [0, 1]")
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise ValueError(f"margin={self.margin}: expected a finite value > 0")
        object.__setattr__(self, "thresholds", dict(sorted(clean.items())))
        object.__setattr__(self, "prompts", tuple(int(p) for p in self.prompts))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))

    def check_for(self, model_id: str | None = None, num_steps: int | None = None,
                  schedule: Schedule | None = None, what: str = "DRA thresholds") -> None:
        """Raise ValueError (naming ``what``) if the table was calibrated for another model
        hash, step count or schedule than the given ones."""
        if model_id is not None and self.model_hash != model_id:
            raise ValueError(f"{what}: calibrated for model {self.model_hash!r}, expected the "
                             f"model in use ({model_id})")
        if num_steps is not None and self.num_steps != num_steps:
            raise ValueError(f"{what}: calibrated for {self.num_steps} steps, expected "
                             f"{num_steps}")
        if schedule is not None and self.schedule_hash != schedule.digest():
            raise ValueError(f"{what}: calibrated for schedule {self.schedule_hash!r}, expected "
                             f"the schedule in use ({schedule.digest()}, "
                             f"{schedule.name!r}); calibrate it again (calibrate_step_dra)")

    def to_dict(self) -> dict:
        """JSON-ready (``"thresholds"``: {step as text: value}); :meth:`from_dict` reads it."""
        return {"thresholds": {str(s): t for s, t in self.thresholds.items()},
                "num_steps": self.num_steps, "model_hash": self.model_hash,
                "schedule_hash": self.schedule_hash, "quantile": self.quantile,
                "margin": self.margin, "prompts": list(self.prompts),
                "seeds": list(self.seeds), "guidance_scale": self.guidance_scale}

    @classmethod
    def from_dict(cls, data, what: str = "DRA thresholds") -> "StepThresholds":
        """Read :meth:`to_dict`'s form. Raises ValueError naming ``what`` if it is not one."""
        try:
            return cls({int(k): float(v) for k, v in data["thresholds"].items()},
                       int(data["num_steps"]), str(data["model_hash"]),
                       str(data["schedule_hash"]), float(data["quantile"]),
                       float(data["margin"]), tuple(data.get("prompts", ())),
                       tuple(data.get("seeds", ())), float(data.get("guidance_scale", 0.0)))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{what}: not a DRA threshold table ({type(exc).__name__}: "
                             f"{exc}); expected the block written by save_step_dra") from None
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None


@dataclass(eq=False)
class StepDRAPolicy(CachePolicy):
    """A static policy plus a whole-step fallback to recomputation, per sample and branch.

    Attributes:
        inner: the static policy (e.g. ``SchedulePolicy`` of a whole-step schedule).
        thresholds: a :class:`StepThresholds` (checked against the inner schedule when inner
            is a ``SchedulePolicy``), or None: probe only, never fall back (calibration).
        fired: fallback steps (sample, branch) of the current generation.
    Raises:
        TypeError: an ``inner`` that is not a :class:`CachePolicy`.
        ValueError: thresholds of another schedule than the inner one; at run time, a run of
            another step count than the table's, or a probed step without a threshold.
    """
    inner: CachePolicy
    thresholds: StepThresholds | None = None
    fired: int = 0
    _fallback: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if not isinstance(self.inner, CachePolicy):
            raise TypeError(f"inner policy {self.inner!r}: expected a CachePolicy")
        if self.thresholds is not None and isinstance(self.inner, SchedulePolicy):
            self.thresholds.check_for(schedule=self.inner.schedule)

    @property
    def name(self) -> str:
        return f"{getattr(self.inner, 'name', 'policy')}+dra"

    def reset(self) -> None:
        self.inner.reset()
        self._fallback = {}
        self.fired = 0

    def observe(self, event) -> None:
        self.inner.observe(event)

    def threshold(self, step: int, num_steps: int) -> float:
        """The table's threshold of ``step``. Raises ValueError for another step count or a
        step the table has none for."""
        t = self.thresholds
        if t.num_steps != num_steps:
            raise ValueError(f"DRA thresholds for {t.num_steps} steps, this run has {num_steps}")
        if step not in t.thresholds:
            raise ValueError(f"DRA thresholds: none for step {step} (the table has steps "
                             f"{list(t.thresholds)[:8]}...); calibrate it on this schedule")
        return t.thresholds[step]

    def decide(self, q: OpQuery) -> Decision:
        key = (q.branch, q.sample)
        d = self.inner.decide(q)
        if q.index == 0:
            if not d.reuse:     # the probe's reference: kept whenever the output is stored
                return Decision(False, store=d.store, keep_input=d.store or d.keep_input,
                                reason=d.reason)
            if q.kept_step is None or q.segment_open:
                return d
            change = q.input_change()
            if self.thresholds is None or change <= self.threshold(q.step, q.num_steps):
                return d
            self._fallback[key] = q.step
            self.fired += 1
            return Decision(False, store=True, keep_input=True, reason="fallback")
        if d.reuse and self._fallback.get(key) == q.step:
            return Decision(False, store=True, reason="fallback")
        return d

    def describe(self) -> dict:
        t = self.thresholds
        return {"name": self.name, "inner": self.inner.describe(),
                "quantile": None if t is None else t.quantile,
                "margin": None if t is None else t.margin,
                "calibration": None if t is None else {"prompts": list(t.prompts),
                                                       "seeds": list(t.seeds)}}
