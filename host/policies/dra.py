"""Dynamic runtime adjustment (DRA, docs/design.md): a shadow monitor around a static schedule.

For an operator the static schedule reuses, at the head of a segment (the operator's input
exists: no segment open before it), DRA compares the relative L1 change of the operator's
input since the step its cached output was written — measured on the NMEs by the
``l1_distance`` micro-op against the input kept in rank memory then
(:meth:`OpQuery.input_change`) — with a threshold derived from the profile: the largest
change the profiled videos showed over the same steps (the sum of their one-step input
changes, times ``margin``). Above it, the operator is recomputed now and for the next
``window - 1`` steps (where the schedule reuses it), its output stored fresh.

Everything is per (branch, sample): the monitor reads one sample's input, so a decision for
one sample never depends on the others of the batch. Costs (read them from the events): each
monitor (a MonitorEvent: bytes of x to the ranks, NME cycles), the inputs kept at every
stored compute (``kept_bytes``) and the recomputed operators (``reason == "fallback"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coda.host.schedule import BRANCHES, OP_TYPES

from .base import CachePolicy, Decision, OpQuery

__all__ = ["DRAPolicy", "input_change_limits"]


def input_change_limits(profile, quantile: float = 1.0) -> np.ndarray:
    """Cumulative one-step input changes ``C[s, b, L*5]`` of the profile's ``quantile``
    video (per step, over the videos): the limit for a cache written at step c and read at
    step s is ``C[s] - C[c]`` (at ``quantile`` of the profiled videos' changes per step)."""
    x = np.nan_to_num(profile.in_change.astype(np.float64), nan=0.0)   # [V, S, B, L, K]
    per_step = np.quantile(x, quantile, axis=0)                          # [S, B, L, K]
    per_step[0] = 0.0
    cum = np.cumsum(per_step, axis=0)
    return cum.reshape(cum.shape[0], cum.shape[1], -1)


@dataclass(eq=False)
class DRAPolicy(CachePolicy):
    """A static policy plus a run-time fallback to recomputation.

    Attributes:
        inner: the static policy (e.g. the annealed schedule's ``SchedulePolicy``).
        limits: :func:`input_change_limits` of a profile made for the same model and steps.
        margin: threshold = margin x the profiled limit.
        window: steps recomputed once a monitor fires (>= 1: this step only).
        fired: fallbacks started (monitors above the threshold) in this generation.
    """
    inner: CachePolicy
    limits: np.ndarray
    margin: float = 1.0
    window: int = 2
    fired: int = 0
    _until: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.margin <= 0 or self.window < 1:
            raise ValueError(f"margin={self.margin}, window={self.window}: expected > 0 and >= 1")

    @property
    def name(self) -> str:
        return f"{getattr(self.inner, 'name', 'policy')}+dra"

    def reset(self) -> None:
        self.inner.reset()
        self._until = {}
        self.fired = 0

    def observe(self, event) -> None:
        self.inner.observe(event)

    def threshold(self, q: OpQuery) -> float:
        if self.limits.shape[0] != q.num_steps:
            raise ValueError(f"dra: limits for {self.limits.shape[0]} steps, this run has "
                             f"{q.num_steps}")
        k = q.layer * len(OP_TYPES) + OP_TYPES.index(q.op)
        b = BRANCHES.index(q.branch)
        return self.margin * float(self.limits[q.step, b, k] - self.limits[q.kept_step, b, k])

    def decide(self, q: OpQuery) -> Decision:
        d = self.inner.decide(q)
        key = (q.branch, q.sample, q.layer, q.op)
        if not d.reuse:
            # keep the input whenever the output is cached: the monitor's reference
            return Decision(False, store=d.store, keep_input=d.store or d.keep_input,
                            reason=d.reason)
        fallback = Decision(False, store=True, keep_input=True, reason="fallback")
        if self._until.get(key, -1) >= q.step:
            return fallback
        if not q.segment_open and q.kept_step is not None and q.kept_step == q.cached_step:
            if q.input_change() > self.threshold(q):
                self._until[key] = q.step + self.window - 1
                self.fired += 1
                return fallback
        return d

    def describe(self) -> dict:
        return {"name": self.name, "inner": self.inner.describe(), "margin": self.margin,
                "window": self.window}
