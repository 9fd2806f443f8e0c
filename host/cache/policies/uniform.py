"""Uniform-interval policy (DeepCache / FORA style): after ``warmup`` computed steps, each
operator type is recomputed every ``k`` steps and reused in between (docs/design.md,
Anchor figures: speedup ≈ r·(1 − 1/k) for a reused share r).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from coda.host.cache.schedule import (ALL_OP_TYPES, OP_TYPES, BRANCHES, ModelOps, Schedule,
                                ScheduleError, operator_order)

from .static import StaticPolicy

__all__ = ["UniformIntervalPolicy"]


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
