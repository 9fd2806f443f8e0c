"""The space of ``coda schedule search`` and its stand-in: whole-step plans, then operators
refreshed inside a reused step.

**Search space** (:class:`StepPlan`): the set of reused steps (both branches, every
operator), plus the operator types reused at *every* step from step 1 on (``always``: those
whose profiled output never changes, :func:`constant_op_types`); the second level
(``refresh``, :func:`refined_plans`) computes operators inside a reused step. **Stand-in**
(:func:`plan_by_dp`): an exact dynamic programme over the computed steps minimising
``w(s)^gamma * (D(s) - D(c))`` (the profiled output change accumulated since the last computed
step ``c``, weighted by the step sensitivity); :func:`candidate_plans` gives its optima over
several ``gamma`` and ``max_run`` and both choices of ``always``, with uniform's whole-step
plan among them. The space and the stand-in in full: ``docs/scheduler.md``, "Search".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from coda.host.cache.schedule import BRANCHES, OP_TYPES, ModelOps, Schedule, ScheduleError

__all__ = ["StepPlan", "constant_op_types", "step_change", "reused_steps_for", "check_reachable",
           "plan_by_dp", "uniform_plan", "candidate_plans", "stand_in_cost", "step_values",
           "refined_plans"]


# ---------------------------------------------------------------- the space
@dataclass(frozen=True)
class StepPlan:
    """A whole-step schedule of a model (Latte's by default).

    Attributes:
        num_steps, num_layers: the model's run (steps 0..num_steps-1, layers).
        reused: the steps at which every operator is reused in both CFG branches.
        always: operator types (of the model's, :data:`coda.host.cache.schedule.OP_TYPES` for
            Latte) reused at every step from step 1 on, computed steps included.
        label: how the plan was made (for reports).
        ops: the model's operators (:class:`ModelOps`; None: Latte's of ``num_layers``).
        refresh: (step, (layer, op)) computed inside a reused step (both branches), the
            second level of the space (:func:`refined_plans`).
    Raises:
        ScheduleError: step 0 reused, a step out of range, an unknown operator type, a
            refreshed operator outside the reused steps or the model, or of an ``always``
            type.
    """
    num_steps: int
    num_layers: int
    reused: frozenset
    always: tuple = ()
    label: str = ""
    ops: ModelOps | None = None
    refresh: frozenset = frozenset()

    def __post_init__(self):
        bad = [s for s in self.reused if not 1 <= s < self.num_steps]
        if bad:
            raise ScheduleError(f"reused steps {sorted(bad)}: expected 1..{self.num_steps - 1} "
                                "(step 0 computes the first caches)")
        types = self.model_ops().op_types
        unknown = [t for t in self.always if t not in types]
        if unknown:
            raise ScheduleError(f"always-reused types {unknown}: expected some of {types}")
        object.__setattr__(self, "reused", frozenset(int(s) for s in self.reused))
        object.__setattr__(self, "always", tuple(t for t in types if t in self.always))
        refresh = frozenset((int(s), (int(r[0]), str(r[1]))) for s, r in self.refresh)
        every = set(self.model_ops().ops)
        bad = sorted(x for x in refresh if x[0] not in self.reused or x[1] not in every
                     or x[1][1] in self.always)
        if bad:
            raise ScheduleError(f"refreshed operators {bad[:4]}: expected (step, (layer, op)) "
                                "of a reused step, an operator of the model, not of an "
                                f"always-reused type {self.always}")
        object.__setattr__(self, "refresh", refresh)

    def refreshed(self, step: int) -> frozenset:
        """The (layer, op) computed inside reused step ``step``."""
        return frozenset(r for s, r in self.refresh if s == step)

    def model_ops(self) -> ModelOps:
        return ModelOps.latte(self.num_layers) if self.ops is None else self.ops

    def schedule(self, name: str | None = None) -> Schedule:
        """The plan as a :class:`Schedule` (both branches alike)."""
        ops = self.model_ops()
        every = ops.ops
        const = frozenset(r for r in every if r[1] in self.always)
        reuse = {}
        for step in range(1, self.num_steps):
            refs = frozenset(every) - self.refreshed(step) if step in self.reused else const
            for branch in BRANCHES:
                if refs:
                    reuse[(step, branch)] = refs
        return Schedule(self.num_steps, self.num_layers, reuse, name or self.describe(), ops)

    def skip_fraction(self) -> float:
        """Reused / all operator executions."""
        ops = self.model_ops()
        k, a = len(ops.ops), ops.count(self.always)
        n = len(self.reused)
        return (n * k + (self.num_steps - 1 - n) * a - len(self.refresh)) / (self.num_steps * k)

    def describe(self) -> str:
        """``steps+ALWAYS[reused steps]``, then ``refresh[STEP:LAYER.OP,...]`` if any."""
        steps = sorted(self.reused)
        always = f"+{'+'.join(self.always)}" if self.always else ""
        text = f"steps{always}[{','.join(map(str, steps))}]"
        if self.refresh:
            text += "refresh[" + ",".join(f"{s}:{layer}.{op}" for s, (layer, op) in
                                          sorted(self.refresh)) + "]"
        return text

    def with_refresh(self, step: int, refs, label: str) -> "StepPlan":
        """This plan with ``refs`` ((layer, op)) also computed inside reused step ``step``."""
        return StepPlan(self.num_steps, self.num_layers, self.reused, self.always,
                        f"{self.label} + {label}".strip(" +"), self.ops,
                        self.refresh | {(step, r) for r in refs})


def constant_op_types(profile, tol: float = 0.0) -> tuple[str, ...]:
    """Operator types whose profiled relative output change is at most ``tol`` at every step
    >= 1, video, branch and layer (0.0: exactly constant), of the profile's model."""
    ops = profile.model_ops
    out = np.asarray(profile.per_op(profile.out_change[:, 1:]), np.float64)   # [V, S-1, B, ops]
    worst = np.nanmax(np.nan_to_num(out, nan=np.inf).reshape(-1, out.shape[-1]), axis=0)
    return tuple(t for t in ops.op_types
                 if max(w for w, (_, op) in zip(worst, ops.ops) if op == t) <= tol)


def step_change(profile, skip_types: tuple[str, ...] = ()) -> np.ndarray:
    """float64 [steps]: the profiled relative output change between step t-1 and t, the mean
    over videos, branches, layers and the operator types not in ``skip_types``; 0 at step 0."""
    ops = profile.model_ops
    keep = [i for i, (_, t) in enumerate(ops.ops) if t not in skip_types]
    out = np.asarray(profile.per_op("out_change"), np.float64)[..., keep]   # [V, S, B, ops]
    d = np.zeros(out.shape[1])
    d[1:] = np.nanmean(out[:, 1:].reshape(out.shape[0], out.shape[1] - 1, -1), axis=(0, 2))
    return np.nan_to_num(d, nan=0.0)


def reused_steps_for(skip: float, num_steps: int, always: int = 0, cooldown: int = 1,
                     per_step: int | None = None) -> int:
    """Whole steps to reuse so the plan's skip fraction is the closest to ``skip`` (ties: the
    larger), with ``always`` types of :data:`OP_TYPES` reused at every step from step 1 on and
    the last ``cooldown`` steps computed; another model: ``always`` of its ``per_step``
    operators per step. Raises ValueError when no count in 0..num_steps-1-cooldown comes
    within 1/num_steps of ``skip``."""
    k = len(OP_TYPES) if per_step is None else per_step
    most = max(0, num_steps - 1 - max(1, cooldown))
    frac = lambda n: (n * k + (num_steps - 1 - n) * always) / (num_steps * k)  # noqa: E731
    best = min(range(most + 1), key=lambda n: (abs(frac(n) - skip), -n))
    if abs(frac(best) - skip) > 1.0 / num_steps:
        what = (f"{always} operator types" if per_step is None
                else f"{always} of the {per_step} operators of a step")
        raise ValueError(f"--skip {skip}: whole-step plans of {num_steps} steps (the last "
                         f"{max(1, cooldown)} computed, {what} reused at every "
                         f"step) reach {frac(0):.3f}..{frac(most):.3f}")
    return best


def _reused_steps(skip: float, num_steps: int, always: tuple, cooldown: int,
                  ops: ModelOps | None) -> int:
    """:func:`reused_steps_for` with the operator types ``always`` of the model of ``ops``."""
    if ops is None or ops.arch == "latte":
        return reused_steps_for(skip, num_steps, len(always), cooldown)
    return reused_steps_for(skip, num_steps, ops.count(always), cooldown, len(ops.ops))


def check_reachable(skip: float, num_steps: int, constant: tuple = (), cooldown: int = 1,
                    ops: ModelOps | None = None):
    """Raise ValueError (naming ``--skip`` and the ranges) unless a whole-step plan reaches
    ``skip``, with or without the ``constant`` operator types reused at every step
    (``ops``: the model's operators, default Latte's)."""
    ranges = []
    for always in dict.fromkeys([(), tuple(constant)]):
        try:
            _reused_steps(skip, num_steps, always, cooldown, ops)
            return
        except ValueError as exc:
            ranges.append(str(exc).rsplit(" reach ", 1)[1] + (
                f" with {'+'.join(always)} reused at every step" if always else ""))
    raise ValueError(f"--skip {skip}: whole-step plans of {num_steps} steps (the last "
                     f"{max(1, cooldown)} computed) reach {', or '.join(ranges)}")


# ---------------------------------------------------------------- the stand-in
def plan_by_dp(change: np.ndarray, weight: np.ndarray, count: int, *, cooldown: int = 1,
               gamma: float = 1.0, max_run: int = 5) -> tuple[frozenset, float]:
    """The exact cheapest set of ``count`` reused steps under the stand-in cost: the
    minimum-error path through the DAG of steps (:func:`coda.host.cache.policies.lemica.
    min_error_path`) whose edge ``i -> j`` reuses steps i+1..j-1 from step i's caches at
    ``Σ_s w(s)^gamma (D(s) - D(i))``.

    Args:
        change: float [S] profiled change per step (:func:`step_change`; index 0 unused).
        weight: float [S] step weights (> 0).
        count: reused steps wanted.
        cooldown: the last ``cooldown`` steps (>= 1) are computed.
        gamma: exponent of the weights.
        max_run: at most this many reused steps in a row.
    Returns:
        (reused steps, proxy cost). Raises ValueError when no plan has ``count`` reused steps
        under these constraints.
    """
    from coda.host.cache.policies.lemica import min_error_path

    s_n = len(change)
    cum = np.cumsum(np.asarray(change, np.float64))
    w = np.asarray(weight, np.float64) ** gamma
    last = s_n - max(1, cooldown)             # steps last..S-1 are computed
    cost = np.full((s_n, s_n), math.inf)
    for i in range(s_n):
        for j in range(i + 1, min(s_n, i + max_run + 2)):
            if j - 1 > i and j - 1 >= last:   # step j-1 would join the span reused from i
                break
            cost[i, j] = _span_cost(cum, w, i, j)
    try:
        path, total = min_error_path(cost, s_n - count)
    except ValueError:
        raise ValueError(f"no plan reuses {count} of {s_n} steps with runs <= {max_run} and "
                         f"the last {cooldown} computed") from None
    return frozenset(range(s_n)) - frozenset(path), total


def uniform_plan(num_steps: int, num_layers: int, count: int, *, cooldown: int = 1,
                 always: tuple = (), ops: ModelOps | None = None) -> StepPlan:
    """Uniform whole-step reuse: after the warm-up that makes the count fit, every k-th step
    computed, the reused steps spread as evenly as the count allows (DeepCache/FORA's rule
    as a :class:`StepPlan` of the model of ``ops``, default Latte's)."""
    last = num_steps - max(1, cooldown)
    for k in range(2, num_steps):
        for warmup in range(1, last):
            span = range(warmup, last)
            reused = [s for s in span if (s - warmup) % k != 0]
            if len(reused) == count:
                return StepPlan(num_steps, num_layers, frozenset(reused), always,
                                f"uniform k={k} warmup={warmup}", ops)
    raise ValueError(f"no uniform whole-step plan reuses {count} of {num_steps} steps")


def candidate_plans(profile, skip: float, *, cooldown: int = 1,
                    gammas=(0.0, 0.5, 1.0, 2.0, 3.0), max_runs=(2, 3, 5, 8),
                    counts: dict | None = None) -> list[StepPlan]:
    """The candidates for ``skip``: the stand-in's optimum for every ``gamma`` x ``max_run``,
    with and without the profile's constant operator types reused at every step, and
    uniform's plan; duplicates dropped, order kept.

    ``counts``: reused steps per choice of ``always`` (a tuple of operator types, as
    :func:`counts_within_latency` gives them); a choice missing from it is left out. None:
    the count that reaches ``skip`` (:func:`reused_steps_for`) for both choices."""
    from coda.host.cache.weights import step_weights

    steps, layers, ops = profile.num_steps, profile.num_layers, profile.model_ops
    mine = None if ops.arch == "latte" else ops
    const = constant_op_types(profile)
    _, w = step_weights(profile)
    plans: list[StepPlan] = []
    for always in dict.fromkeys([(), const]):
        if counts is not None:
            if always not in counts:
                continue
            count = counts[always]
        else:
            try:
                count = _reused_steps(skip, steps, always, cooldown, ops)
            except ValueError:
                continue
        change = step_change(profile, always)
        try:
            plans.append(uniform_plan(steps, layers, count, cooldown=cooldown, always=always,
                                      ops=mine))
        except ValueError:
            pass
        for gamma in gammas:
            for run in max_runs:
                try:
                    reused, _ = plan_by_dp(change, w, count, cooldown=cooldown, gamma=gamma,
                                           max_run=run)
                except ValueError:
                    continue
                plans.append(StepPlan(steps, layers, reused, always,
                                      f"dp gamma={gamma:g} max_run={run}", mine))
    if not plans:
        check_reachable(skip, steps, const, cooldown, ops)
        raise ValueError(f"--skip {skip}: no whole-step plan of {steps} steps with runs of at "
                         f"most {max(max_runs)} reused steps reaches it")
    unique: dict = {}
    for p in plans:
        unique.setdefault((p.reused, p.always), p)
    return list(unique.values())



# ---------------------------------------------------------------- the second level
def stand_in_cost(plan: StepPlan, change: np.ndarray, weight: np.ndarray,
                  gamma: float = 1.0, computed: frozenset = frozenset()) -> float:
    """The stand-in's error of ``plan``'s whole reused steps (as :func:`plan_by_dp` sums it):
    ``Σ_s w(s)^gamma (D(s) - D(c(s)))`` over the reused steps ``s`` not in ``computed``,
    ``c(s)`` the last step before ``s`` that is not reused or is in ``computed``."""
    cum = np.cumsum(np.asarray(change, np.float64))
    w = np.asarray(weight, np.float64) ** gamma
    steps = [s for s in range(plan.num_steps) if s not in plan.reused or s in computed]
    return float(sum(_span_cost(cum, w, i, j)
                     for i, j in zip(steps, steps[1:] + [plan.num_steps])))


def step_values(plan: StepPlan, change: np.ndarray, weight: np.ndarray,
                gamma: float = 1.0) -> dict[int, float]:
    """Per reused step of ``plan``, what computing it instead is worth to the stand-in: the
    drop of :func:`stand_in_cost` (>= 0; a step early in a long run also freshens the
    caches the rest of the run reads). Used by :func:`refined_plans` and by step DRA's
    budgeted calibration (:func:`coda.experiments.dra_calibration.fallback_rates`)."""
    base = stand_in_cost(plan, change, weight, gamma)
    return {s: base - stand_in_cost(plan, change, weight, gamma, frozenset([s]))
            for s in sorted(plan.reused)}


def _span_cost(cum: np.ndarray, w: np.ndarray, i: int, j: int) -> float:
    """The stand-in's error of steps i+1..j-1 reused from step i's caches (the DP's edge
    ``i -> j``): ``Σ_s w[s] (cum[s] - cum[i])``, summed in step order."""
    run = 0.0
    for s in range(i + 1, j):
        run += w[s] * (cum[s] - cum[i])
    return run


def refined_plans(plan: StepPlan, profile, fits: Callable[[StepPlan], bool], *,
                  gammas=(1.0, 3.0)) -> list[StepPlan]:
    """The second level of the space for ``plan``: operators computed inside one reused step,
    as many as ``fits`` accepts (the search's skip and latency budget).

    The steps tried: for each ``gamma``, the reused step whose computing the stand-in values
    most (the largest drop of :func:`stand_in_cost`; a step early in a long run also
    freshens the caches the rest of the run reads; a larger ``gamma`` favours the early,
    sensitive steps, the smaller the long runs). In each, three nested families, each giving
    its largest member that ``fits``: the last L layers (L = layers-1 .. 1), the first L
    layers, and the m operator types whose profiled output changed most since the step that
    wrote the caches (m = types-1 .. 1). The plan's ``always`` types stay reused.

    Args:
        plan: a plan with reused steps and no refreshed operators yet.
        profile: the profile (:class:`coda.host.cache.profile.Profile`) of the plan's model.
        fits: whether a refined plan may be a candidate.
        gammas: the stand-in's weight exponents, one step each (the same step once).
    Returns:
        the refined plans (labels say the step and family), [] when nothing fits.
    """
    from coda.host.cache.weights import step_weights

    if not plan.reused:
        return []
    change = step_change(profile, plan.always)
    _, w = step_weights(profile)
    steps = []
    for gamma in gammas:
        value = step_values(plan, change, w, gamma)
        steps.append(max(sorted(value), key=value.get))
    out: list[StepPlan] = []
    for step in dict.fromkeys(steps):
        for q in _refined_at(plan, profile, step, fits):
            if all(q.refresh != p.refresh for p in out):
                out.append(q)
    return out


def _refined_at(plan: StepPlan, profile, step: int, fits: Callable) -> list[StepPlan]:
    """:func:`refined_plans`' three families at reused step ``step``."""
    ops = plan.model_ops()
    wrote = max(s for s in range(step) if s not in plan.reused)
    fresh = [r for r in ops.ops if r[1] not in plan.always]
    layers = sorted({r[0] for r in fresh})
    per_op = np.asarray(profile.per_op("out_change"), np.float64)       # [V, S, B, ops]
    moved = np.nansum(np.nanmean(per_op[:, wrote + 1:step + 1], axis=(0, 2)), axis=0)
    by_type: dict = {}
    for (_, op), m in zip(ops.ops, moved):
        if op not in plan.always:
            by_type.setdefault(op, []).append(m)
    types = sorted(by_type, key=lambda t: -float(np.mean(by_type[t])))
    families = [
        [(f"refresh step {step} last {n} layers", [r for r in fresh if r[0] in layers[-n:]])
         for n in range(len(layers) - 1, 0, -1)],
        [(f"refresh step {step} first {n} layers", [r for r in fresh if r[0] in layers[:n]])
         for n in range(len(layers) - 1, 0, -1)],
        [(f"refresh step {step} {'+'.join(types[:m])}", [r for r in fresh if r[1] in types[:m]])
         for m in range(len(types) - 1, 0, -1)]]
    out: list[StepPlan] = []
    for family in families:
        for label, refs in family:
            candidate = plan.with_refresh(step, refs, label)
            if refs and fits(candidate):
                out.append(candidate)
                break
    return out
