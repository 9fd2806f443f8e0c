"""Uniform-interval policy (DeepCache / FORA style): after ``warmup`` computed steps, each
operator type is recomputed every ``k`` steps and reused in between (docs/design.md,
Anchor figures: speedup ≈ r·(1 − 1/k) for a reused share r).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from coda.host.cache.schedule import (ALL_OP_TYPES, OP_TYPES, BRANCHES, ModelOps, Schedule,
                                ScheduleError, operator_order)

from .base import refuse_short_run
from .static import StaticPolicy

__all__ = ["UniformIntervalPolicy", "uniform_for_skip", "DEFAULT_INTERVAL", "DEFAULT_WARMUP"]


#: the uniform rule of ``coda run --policy uniform`` and ``coda sim --schedule uniform`` when
#: neither --interval nor --warmup is given: every operator recomputed every 2nd step after 5
#: computed steps (the common uniform-reuse baseline: a short warm-up, then every other step)
DEFAULT_INTERVAL = 2
DEFAULT_WARMUP = 5


@dataclass(frozen=True, eq=True)
class UniformIntervalPolicy(StaticPolicy):
    """Recompute each operator type every ``intervals[op]`` steps; the first ``warmup`` steps
    and, optionally, the last ``cooldown`` steps are always computed.

    At step s (warmup <= s < num_steps - cooldown), operator type ``op`` is recomputed when
    ``(s - warmup) % k == 0`` and reused otherwise; k = 1 never reuses. Same for both branches.

    Attributes:
        intervals: op type -> k >= 1 (types not listed use ``default_interval``); any op type
            of any architecture (:data:`coda.host.cache.schedule.ALL_OP_TYPES`), so one policy
            serves Latte and the others (:meth:`build_for`).
        default_interval: k for unlisted op types.
        warmup: leading steps always computed (>= 1, so every operator is computed before reuse).
        cooldown: trailing steps always computed.
    """
    intervals: Mapping[str, int] = field(default_factory=dict)
    default_interval: int = 2
    warmup: int = 2
    cooldown: int = 0
    _built: dict = field(default_factory=dict, repr=False, compare=False)
    name = "uniform"
    skip_calibrated = True
    serves_forecast = True

    @classmethod
    def from_inputs(cls, inputs, *, interval: int | None = None,
                    warmup: int | None = None) -> "UniformIntervalPolicy":
        """With ``inputs.skip``: :func:`uniform_for_skip` on the run's shape (``num_steps``,
        ``num_layers``, ``ops``); else every operator every ``interval`` steps after ``warmup``
        (default :data:`DEFAULT_INTERVAL`, :data:`DEFAULT_WARMUP`). ValueError for both or
        a missing shape."""
        if inputs.skip is not None:
            if interval is not None or warmup is not None:
                raise ValueError(f"policy {inputs.name!r}: skip and interval / warmup are "
                                 "alternatives (skip calibrates them); expected one")
            return uniform_for_skip(inputs.skip, inputs.need("num_steps"),
                                    inputs.need("num_layers"), ops=inputs.ops)
        return cls(default_interval=DEFAULT_INTERVAL if interval is None else interval,
                   warmup=DEFAULT_WARMUP if warmup is None else warmup)

    def __post_init__(self):
        for op, k in self.intervals.items():
            if op not in ALL_OP_TYPES:
                raise ScheduleError(f"op type {op!r}: expected one of {ALL_OP_TYPES}")
            if int(k) < 1:
                raise ScheduleError(f"interval {op}={k}: expected >= 1")
        if self.default_interval < 1:
            raise ScheduleError(f"default_interval={self.default_interval}: expected >= 1")
        if self.warmup < 1 or self.cooldown < 0:
            raise ScheduleError(f"warmup={self.warmup}, cooldown={self.cooldown}: "
                                "expected warmup >= 1 and cooldown >= 0")

    def interval(self, op: str) -> int:
        return int(self.intervals.get(op, self.default_interval))

    def build(self, num_steps: int, num_layers: int) -> Schedule:
        """The concrete :class:`Schedule` for a run of ``num_steps`` steps (Latte)."""
        return self._build(num_steps, num_layers, operator_order(num_layers), OP_TYPES, None)

    def build_for(self, num_steps: int, ops: ModelOps) -> Schedule:
        """The concrete :class:`Schedule` for a run of ``num_steps`` steps on a model with the
        operators ``ops`` (any architecture)."""
        return self._build(num_steps, ops.num_layers, ops.ops, ops.op_types, ops)

    def _build(self, num_steps, num_layers, order, op_types, ops) -> Schedule:
        reuse: dict[tuple[int, str], frozenset] = {}
        for step in range(self.warmup, max(self.warmup, num_steps - self.cooldown)):
            refs = frozenset((layer, op) for layer, op in order
                             if (step - self.warmup) % self.interval(op) != 0)
            for branch in BRANCHES:
                reuse[(step, branch)] = refs
        label = ",".join(f"{op}={self.interval(op)}" for op in op_types)
        return Schedule(num_steps, num_layers, reuse,
                        name=f"uniform({label},warmup={self.warmup},cooldown={self.cooldown})",
                        ops=ops)

    def describe(self) -> dict:
        listed = [op for op in self.intervals if op not in OP_TYPES]    # other architectures'
        return {"name": self.name,
                "intervals": {op: self.interval(op) for op in OP_TYPES + tuple(listed)},
                "warmup": self.warmup, "cooldown": self.cooldown}


def uniform_for_skip(skip: float, num_steps: int, num_layers: int, tol: float = 0.02,
                     ops: ModelOps | None = None):
    """The uniform-interval policy (one interval for every operator type if one is within
    ``tol`` of ``skip``, else two neighbouring intervals over the types) whose skip fraction
    is closest to ``skip`` (to 0.005), with the shortest interval and then the most warmup
    steps (1..20) among the closest. ``ops``: the model's operators (default: Latte's of
    ``num_layers``); each op type weighs by its operators per step.
    Returns a :class:`coda.host.cache.policies.UniformIntervalPolicy`. Raises ValueError (as
    :func:`coda.host.cache.policies.base.refuse_short_run`) for ``num_steps`` < :data:`MIN_CACHED_STEPS`."""
    from itertools import product

    refuse_short_run(num_steps, "num_steps")
    ops = ModelOps.latte(num_layers) if ops is None else ops
    types = ops.op_types
    counts = [ops.count((op,)) for op in types]

    def reused_steps(k: int, warmup: int) -> int:     # steps >= warmup off the interval
        span = max(0, num_steps - warmup)
        return span - -(-span // k)

    best = None
    for k in range(1, 12):
        for combo in product((k, k + 1), repeat=len(types)):
            mixed = len(set(combo)) > 1
            for warmup in range(1, min(21, num_steps)):
                got = (sum(n * reused_steps(kk, warmup) for n, kk in zip(counts, combo))
                       / (sum(counts) * num_steps))
                err = abs(got - skip)
                key = (err > tol + 1e-9, mixed, round(err / 0.005), k, -warmup, err)
                if best is None or key < best[0]:
                    best = (key, (combo, k, warmup))
    combo, k, warmup = best[1]
    if len(set(combo)) == 1:        # one interval for every type: it is the default
        return UniformIntervalPolicy(default_interval=combo[0], warmup=warmup)
    return UniformIntervalPolicy(intervals=dict(zip(types, combo)),
                                 default_interval=min(combo), warmup=warmup)
