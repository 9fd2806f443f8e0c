"""Step-level dynamic runtime adjustment (DRA): a shadow monitor around a static schedule that
recomputes a whole step when a probe says the video needs it more than the calibration
videos did.

:class:`StepDRAPolicy` decides per step, not per operator, and per sample, not per CFG
branch (why, with the measurements: ``docs/scheduler.md``, "DRA"): at a step where the static
policy reuses the first operator, a probe (:data:`PROBES`) above the step's threshold
computes and stores every operator of that step the static policy would have reused (reason
``"fallback"``). Thresholds (:class:`StepThresholds`) come from calibration videos only
(:func:`coda.experiments.dra_calibration.calibrate_step_dra`; with ``thresholds=None`` the
policy only measures, never falls back). Costs, read from the events: a monitor per probed
step and sample, the kept inputs (``kept_bytes``), and the recomputed operators
(``reason == "fallback"``: exactly the extra executions over the static policy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from coda.host.cache.schedule import BRANCHES, MAX_STEPS, STEP_KEY, Schedule
from coda.jsonin import check

from .base import CachePolicy, Decision, OpQuery
from .static import SchedulePolicy

__all__ = ["StepDRAPolicy", "StepThresholds", "DEFAULT_QUANTILE", "DEFAULT_BUDGET",
           "DEFAULT_GAMMA", "DEFAULT_MARGIN", "PROBES", "DEFAULT_PROBES",
           "DEFAULT_MAX_EXTRA", "DRA_SCHEMA"]

#: quantile of the calibration probes taken as every reused step's threshold when DRA is
#: calibrated without a budget (``calibrate_step_dra(..., budget=None)``): 0.9, the smallest
#: quantile within 5 % extra executions on the calibration videos around a LeMiCa
#: whole-step schedule for skip 0.5 of the shipped model. It spreads the fallbacks evenly over
#: the steps, where the probe mostly sees fast motion, and it left the held-out videos the
#: static schedule loses most nearly unchanged (measured: docs/results.md, Cache schedules:
#: comparison).
DEFAULT_QUANTILE = 0.9
#: the default budget of a budgeted calibration (what ``coda eval`` and ``coda run`` use):
#: extra operator executions, a fraction of a video's, that the fallback rates add up to on
#: the calibration videos (:func:`coda.experiments.dra_calibration.fallback_rates`). 3 %, under
#: the 5 % DRA may spend: videos other than the calibration ones cross the thresholds more
#: often than the calibration videos do.
DEFAULT_BUDGET = 0.03
#: the stand-in's step-weight exponent of a budgeted calibration: 10, which puts most of the
#: budget on the first two reused steps. That is where rollouts of the calibration videos
#: (``scripts/step_gains.py``, seeds 100-101) show the videos the schedule loses most are
#: lost: computing the first two reused steps gains the worst quarter far more than the next
#: two, and the search's exponent 3 spreads the stand-in's values too evenly to follow that
#: (measured: docs/scheduler.md, DRA).
DEFAULT_GAMMA = 10.0
DEFAULT_MARGIN = 1.0
#: the most extra operator executions DRA may spend on any one video (the issue's 5 %),
#: enforced per sample (``StepThresholds.max_fallbacks``): the budget bounds the
#: spending on videos like the calibration ones, this bounds it on every video (with two
#: calibration seeds the acceleration's quantiles do not transfer to other seeds: held-out
#: videos overspent the budget without it; docs/scheduler.md, DRA)
DEFAULT_MAX_EXTRA = 0.05
#: step DRA's probes: ``"l1"``, the block-0 input's relative L1 change against the input
#: kept at the last computed step (numerator on the NMEs); ``"accel"``, its relative second
#: difference over the last three steps (on the xPU, fp32); ``"output"``, the relative second
#: difference of the model's output over the three steps before (on the xPU, fp32). The L1
#: change barely ranks videos by what the static schedule loses on them: it sees fast motion,
#: which the schedules handle well (docs/scheduler.md, DRA).
PROBES = ("l1", "accel", "output")
#: the probes ``coda eval`` and ``coda run`` choose from, per schedule, on the calibration
#: videos (:func:`coda.experiments.dra_calibration.calibrate_default_dra`): the output's second
#: difference and the input's. Which one ranks the videos better by what computing the first
#: two reused steps gains them (where the budget goes) depends on the schedule: on the
#: calibration videos (``scripts/step_gains.py --probes output,accel``) the output ranks
#: better at 0.5 and 0.6, the input at 0.7 (measured: docs/scheduler.md, DRA). In this
#: order: the first wins a tie.
DEFAULT_PROBES = ("output", "accel")


@dataclass(frozen=True)
class StepThresholds:
    """Per reused step, the largest relative L1 change of the block-0 input DRA lets a reuse
    through (a unitless ratio, float).

    Attributes:
        thresholds: step index -> threshold (>= 0, finite) for every step at which the
            calibrated schedule reuses the first operator in some branch.
        num_steps: the run's step count. model_hash: :func:`coda.host.cache.profile.model_hash`.
        schedule_hash: :meth:`Schedule.digest` of the calibrated schedule.
        quantile, margin: threshold = margin x the quantile of the calibration probes (the
            same quantile at every step; None for a budgeted table).
        prompts, seeds: the calibration videos (every prompt with every seed).
        guidance_scale: the CFG scale of the calibration runs.
        probe: what the thresholds bound (:data:`PROBES`): ``"l1"``, the relative L1 change
            of the block-0 input on the NMEs; ``"accel"``, its relative second
            difference on the xPU (:meth:`OpQuery.input_accel`); ``"output"``, the
            relative second difference of the model's output (:meth:`OpQuery.output_accel`).
        max_fallbacks: the most steps one sample falls back at in a generation (both CFG
            branches; None: no limit); a step's fallback costs at most 1 / num_steps of a
            video's executions, so ``floor(x * num_steps)`` bounds every video's extra
            executions by x (:data:`DEFAULT_MAX_EXTRA`).
        budget, gamma, rates: a budgeted table (:func:`coda.experiments.dra_calibration.
            fallback_rates`): the extra executions (a fraction of a video's) the per-step
            fallback ``rates`` (step -> fraction of the calibration probes above the
            threshold, in [0, 1]) add up to, and the stand-in's weight exponent they were
            spread by; each step's threshold is then margin x the (1 - rate) quantile
            (0 where the rate is 1: that step always falls back). None/empty otherwise.
    Raises:
        ValueError: a threshold that is negative or not finite, a step outside
            0..num_steps-1, a quantile or rate outside [0, 1], a margin <= 0, neither a
            quantile nor a budget in (0, 1].
    """
    thresholds: Mapping[int, float]
    num_steps: int
    model_hash: str
    schedule_hash: str
    quantile: float | None
    margin: float
    prompts: tuple = ()
    seeds: tuple = ()
    guidance_scale: float = 0.0
    budget: float | None = None
    gamma: float | None = None
    rates: Mapping[int, float] = field(default_factory=dict)
    probe: str = "l1"
    max_fallbacks: int | None = None

    def __post_init__(self):
        clean = {int(s): float(t) for s, t in self.thresholds.items()}
        for s, t in clean.items():
            if not 0 <= s < self.num_steps:
                raise ValueError(f"DRA threshold at step {s}: expected steps "
                                 f"0..{self.num_steps - 1}")
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"DRA threshold {t} at step {s}: expected a finite value >= 0")
        if self.probe not in PROBES:
            raise ValueError(f"probe={self.probe!r}: expected one of {', '.join(PROBES)}")
        if self.max_fallbacks is not None and not (isinstance(self.max_fallbacks, int)
                                                   and self.max_fallbacks >= 0):
            raise ValueError(f"max_fallbacks={self.max_fallbacks!r}: expected an int >= 0 "
                             "or None")
        if self.quantile is None and self.budget is None:
            raise ValueError("DRA thresholds: neither a quantile nor a budget; expected one")
        if self.quantile is not None and not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"quantile={self.quantile}: expected a fraction in [0, 1]")
        if self.budget is not None and not 0.0 < self.budget <= 1.0:
            raise ValueError(f"budget={self.budget}: expected a fraction in (0, 1]")
        rates = {int(s): float(r) for s, r in self.rates.items()}
        bad = {s: r for s, r in rates.items() if not 0.0 <= r <= 1.0 or s not in clean}
        if bad:
            raise ValueError(f"fallback rates {bad}: expected fractions in [0, 1] of steps "
                             "with a threshold")
        object.__setattr__(self, "rates", dict(sorted(rates.items())))
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

    def check_probed(self, schedule: Schedule, what: str = "DRA thresholds") -> None:
        """Raise ValueError naming ``what`` and the threshold (``thresholds.STEP``) if one
        is at a step where a run of ``schedule`` never probes (a step that reuses its first
        operator in no branch: the threshold would never apply). A schedule file's table is
        held to it."""
        first = schedule.order()[0]
        for step in self.thresholds:
            if not any(first in schedule.reused(step, b) for b in BRANCHES):
                raise ValueError(f"{what}: thresholds.{step}: step {step} is never probed (the "
                                 f"schedule reuses its first operator {first} there in no "
                                 "branch, so the threshold would never apply); expected "
                                 "thresholds only at probed steps")

    def to_dict(self) -> dict:
        """JSON-ready (``"thresholds"``: {step as text: value}); :meth:`from_dict` reads it."""
        return {"thresholds": {str(s): t for s, t in self.thresholds.items()},
                "num_steps": self.num_steps, "model_hash": self.model_hash,
                "schedule_hash": self.schedule_hash, "quantile": self.quantile,
                "margin": self.margin, "prompts": list(self.prompts),
                "seeds": list(self.seeds), "guidance_scale": self.guidance_scale,
                "budget": self.budget, "gamma": self.gamma,
                "rates": {str(s): r for s, r in self.rates.items()}, "probe": self.probe,
                "max_fallbacks": self.max_fallbacks}

    @classmethod
    def from_dict(cls, data, what: str = "DRA thresholds") -> "StepThresholds":
        """Read :meth:`to_dict`'s form (parsed JSON). Raises ValueError naming ``what`` and
        the field if it breaks :data:`DRA_SCHEMA` (types, ranges), or the checks of
        :class:`StepThresholds` (steps below ``num_steps``, rates of steps with a threshold,
        a quantile or a budget)."""
        check(data, DRA_SCHEMA, what)
        try:
            return cls({int(k): v for k, v in data["thresholds"].items()},
                       data["num_steps"], data["model_hash"], data["schedule_hash"],
                       data.get("quantile"), data["margin"], tuple(data.get("prompts", ())),
                       tuple(data.get("seeds", ())), data.get("guidance_scale", 0.0),
                       data.get("budget"), data.get("gamma"),
                       {int(k): v for k, v in data.get("rates", {}).items()},
                       data.get("probe", "l1"), data.get("max_fallbacks"))
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None


def _fraction(lo_open: bool = False) -> dict:
    return ({"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0,
             "expected": "a fraction in (0, 1]"} if lo_open
            else {"type": "number", "minimum": 0.0, "maximum": 1.0,
                  "expected": "a fraction in [0, 1]"})


def _optional(schema: dict) -> dict:
    return {**schema, "type": [schema["type"], "null"],
            "expected": f"{schema['expected']} or null"}


_SEEDS = {"type": "array", "maxItems": 100_000,
          "items": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}}
#: :meth:`StepThresholds.to_dict` (a schedule file's ``"dra"`` block) as a JSON schema
#: (:func:`coda.jsonin.check`)
DRA_SCHEMA: dict = {
    "type": "object",
    "required": ["thresholds", "num_steps", "model_hash", "schedule_hash", "margin"],
    "properties": {
        "thresholds": {"type": "object", "maxProperties": MAX_STEPS, "propertyNames": STEP_KEY,
                       "additionalProperties": {"type": "number", "minimum": 0.0},
                       "expected": "{step: threshold >= 0}"},
        "num_steps": {"type": "integer", "minimum": 1, "maximum": MAX_STEPS},
        "model_hash": {"type": "string", "maxLength": 64},
        "schedule_hash": {"type": "string", "maxLength": 64},
        "quantile": _optional(_fraction()),
        "margin": {"type": "number", "exclusiveMinimum": 0.0},
        "prompts": _SEEDS,
        "seeds": _SEEDS,
        "guidance_scale": {"type": "number", "minimum": 0.0},
        "budget": _optional(_fraction(lo_open=True)),
        "gamma": {"type": ["number", "null"]},
        "rates": {"type": "object", "maxProperties": MAX_STEPS, "propertyNames": STEP_KEY,
                  "additionalProperties": _fraction(), "expected": "{step: rate 0..1}"},
        "probe": {"enum": list(PROBES)},
        "max_fallbacks": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_STEPS},
    },
    "additionalProperties": False,
}


@dataclass(eq=False)
class StepDRAPolicy(CachePolicy):
    """A static policy plus a whole-step fallback to recomputation, per sample (both CFG
    branches).

    Attributes:
        inner: the static policy (e.g. ``SchedulePolicy`` of a whole-step schedule).
        thresholds: a :class:`StepThresholds` (checked against the inner schedule when inner
            is a ``SchedulePolicy``), or None: probe only, never fall back (calibration).
        probe: :data:`PROBES`; None: the table's (``"l1"`` without a table).
        fired: fallback steps of the current generation, counted per sample and branch.
    Raises:
        TypeError: an ``inner`` that is not a :class:`CachePolicy`.
        ValueError: thresholds of another schedule than the inner one, or of another probe;
            an unknown probe; at run time, a run of another step count than the table's,
            or a probed step without a threshold.

    The first CFG branch that asks at a probed step (the static policy reuses layer 0's
    first operator, whose input is the block-0 input) reads the probe, and its verdict
    holds for the sample's other branch at that step:

    - ``"l1"``: the block-0 input's relative L1 change ``Σ|x - x_ref| / Σ|x_ref|`` against the
      input kept at the last step that computed the first operator: the numerator on the NMEs
      (:meth:`OpQuery.input_change`, one :class:`coda.host.cache.events.MonitorEvent` with its
      bytes and NME cycles), the reference kept in rank memory (``Decision(keep_input=True)``
      when the first operator is computed and its output stored);
    - ``"accel"``: its relative second difference ``Σ|x_t - 2 x_{t-1} + x_{t-2}| / Σ|x_{t-1}|``
      over the last three steps, on the xPU in fp32 from the block-0 inputs the engine keeps
      there for this policy (:meth:`OpQuery.input_accel`; no NME work, no link bytes);
    - ``"output"``: the same second difference of the model's output over the three steps
      before this one, summed over the sample's CFG branches, on the xPU in fp32
      (:meth:`OpQuery.output_accel`; no NME work, no link bytes). It sees how fast the
      prediction itself turns, which a reused step's stale outputs miss.
    """
    inner: CachePolicy
    thresholds: StepThresholds | None = None
    probe: str | None = None
    fired: int = 0
    _fired: dict = field(default_factory=dict, repr=False)    # sample -> fallback steps
    _joint: dict = field(default_factory=dict, repr=False)    # (sample, step) -> verdict
    needs_schedule = True

    @classmethod
    def from_inputs(cls, inputs, *, thresholds: StepThresholds | None = None) -> "StepDRAPolicy":
        """``inputs.schedule`` as a :class:`SchedulePolicy` with the step fallback of
        ``thresholds`` (calibrated on that schedule); ValueError for a missing schedule or
        thresholds."""
        from .static import schedule_of
        inner = SchedulePolicy(schedule_of(inputs))
        if not isinstance(thresholds, StepThresholds):
            raise ValueError(f"policy {inputs.name!r} needs thresholds (a StepThresholds of "
                             "coda.experiments.dra_calibration.calibrate_step_dra or "
                             f"load_step_dra), got {type(thresholds).__name__}")
        return cls(inner, thresholds)

    def __post_init__(self):
        if not isinstance(self.inner, CachePolicy):
            raise TypeError(f"inner policy {self.inner!r}: expected a CachePolicy")
        table = None if self.thresholds is None else self.thresholds.probe
        if self.probe is None:
            self.probe = table or "l1"
        if self.probe not in PROBES:
            raise ValueError(f"probe={self.probe!r}: expected one of {', '.join(PROBES)}")
        if table is not None and table != self.probe:
            raise ValueError(f"DRA thresholds of the {table!r} probe for a policy probing "
                             f"{self.probe!r}: expected the same probe")
        if self.thresholds is not None and isinstance(self.inner, SchedulePolicy):
            self.thresholds.check_for(schedule=self.inner.schedule)

    @property
    def input_history(self) -> bool:
        return self.probe == "accel"

    @property
    def output_history(self) -> bool:
        return self.probe == "output"

    @property
    def name(self) -> str:
        return f"{getattr(self.inner, 'name', 'policy')}+dra"

    def reset(self) -> None:
        self.inner.reset()
        self._fired = {}
        self._joint = {}
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
        d = self.inner.decide(q)
        if q.index == 0:
            l1 = self.probe == "l1"
            if not d.reuse:     # the L1 probe's reference: kept whenever the output is stored
                return Decision(False, store=d.store,
                                keep_input=d.keep_input or (l1 and d.store), reason=d.reason)
            if self._fires(q):
                self.fired += 1
                return Decision(False, store=True, keep_input=l1, reason="fallback")
            return d
        if d.reuse and self._joint.get((q.sample, q.step)):   # the sample's verdict there
            return Decision(False, store=True, reason="fallback")
        return d

    def _fires(self, q: OpQuery) -> bool:
        """Whether sample ``q.sample`` falls back at ``q.step``, a step the inner policy
        reuses its first operator at: decided once per sample and step, by the first CFG
        branch that asks, and then the same for every branch (computing one branch of a step
        while the other reuses costs more than it gains)."""
        joint = (q.sample, q.step)
        if joint not in self._joint:
            self._joint[joint] = self._probe_fires(q)
            self._fired[q.sample] = self._fired.get(q.sample, 0) + self._joint[joint]
        return self._joint[joint]

    def _probe_fires(self, q: OpQuery) -> bool:
        """This branch's probe against the step's threshold (False when the sample has
        spent its ``max_fallbacks``, or when the probe has no value or no table is set)."""
        cap = None if self.thresholds is None else self.thresholds.max_fallbacks
        if cap is not None and self._fired.get(q.sample, 0) >= cap:
            return False
        if self.probe == "l1" and (q.kept_step is None or q.segment_open):
            return False
        change = {"l1": q.input_change, "accel": q.input_accel,
                  "output": q.output_accel}[self.probe]()
        return not (change is None or self.thresholds is None
                    or change <= self.threshold(q.step, q.num_steps))

    def describe(self) -> dict:
        t = self.thresholds
        return {"name": self.name, "inner": self.inner.describe(),
                "probe": self.probe,
                "quantile": None if t is None else t.quantile,
                "budget": None if t is None else t.budget,
                "margin": None if t is None else t.margin,
                "calibration": None if t is None else {"prompts": list(t.prompts),
                                                       "seeds": list(t.seeds)}}
