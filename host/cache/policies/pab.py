"""PAB-style policy (Pyramid Attention Broadcast, Zhao et al. 2024; VideoSys ``core/pab``,
diffusers ``PyramidAttentionBroadcastConfig``): each attention type's output is computed once
every ``ranges[type]`` steps and broadcast (reused) in between, inside a window of steps;
outside the window everything is computed. PAB's observation (docs/design.md, Anchor figures): cross
attention is the most stable, then temporal, then spatial, so the ranges form a pyramid
(cross 6 > temporal 4 > spatial 2 in PAB's Open-Sora setting) and the FFNs are broadcast
only when more skipping is needed (PAB's MLP broadcast, range 1 = never).

Windows are fractions of the run: PAB broadcasts spatial and temporal attention for timesteps
in (100, 800) and cross attention in (100, 900) of 1000, i.e. steps 20 %..90 % and 10 %..90 %
of a trailing-spaced DDIM run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from typing import Mapping

from coda.host.cache.schedule import BRANCHES, OP_TYPES, Schedule, ScheduleError

from .static import StaticPolicy

__all__ = ["PABPolicy", "PAB_RANGES", "PAB_WINDOWS"]

#: PAB's broadcast ranges (VideoSys Open-Sora PAB config); FFNs not broadcast
PAB_RANGES = {"spatial_attn": 2, "temporal_attn": 4, "cross_attn": 6,
              "spatial_ffn": 1, "temporal_ffn": 1}
#: broadcast windows as fractions of the steps: timesteps (100, 800) / (100, 900) of 1000
PAB_WINDOWS = {"spatial_attn": (0.2, 0.9), "temporal_attn": (0.2, 0.9),
               "cross_attn": (0.1, 0.9), "spatial_ffn": (0.2, 0.9), "temporal_ffn": (0.2, 0.9)}


@dataclass(frozen=True, eq=True)
class PABPolicy(StaticPolicy):
    """Broadcast ranges per operator type inside step windows.

    Attributes:
        ranges: op type -> r >= 1: inside its window, computed at the window's first step and
            every r steps after, reused otherwise (r = 1: never reused).
        windows: op type -> (start, end) fractions of the steps, 0 <= start < end <= 1;
            steps ``floor(start*n) .. ceil(end*n) - 1``, never step 0.
    """
    ranges: Mapping[str, int] = field(default_factory=lambda: dict(PAB_RANGES))
    windows: Mapping[str, tuple] = field(default_factory=lambda: dict(PAB_WINDOWS))
    _built: dict = field(default_factory=dict, repr=False, compare=False)
    name = "pab"

    def __post_init__(self):
        for op in OP_TYPES:
            r = int(self.ranges.get(op, 1))
            lo, hi = self.windows.get(op, PAB_WINDOWS[op])
            if r < 1:
                raise ScheduleError(f"PAB range {op}={r}: expected >= 1")
            if not 0.0 <= lo < hi <= 1.0:
                raise ScheduleError(f"PAB window {op}=({lo}, {hi}): expected 0 <= start < end <= 1")

    def build(self, num_steps: int, num_layers: int) -> Schedule:
        import math

        reuse: dict = {}
        for op in OP_TYPES:
            r = int(self.ranges.get(op, 1))
            lo, hi = self.windows.get(op, PAB_WINDOWS[op])
            first = max(1, math.floor(lo * num_steps))
            last = min(num_steps, math.ceil(hi * num_steps))
            for step in range(first, last):
                if r > 1 and (step - first) % r:
                    for branch in BRANCHES:
                        reuse.setdefault((step, branch), set()).update(
                            (layer, op) for layer in range(num_layers))
        label = ",".join(f"{op}={int(self.ranges.get(op, 1))}" for op in OP_TYPES)
        return Schedule(num_steps, num_layers, {k: frozenset(v) for k, v in reuse.items()},
                        name=f"pab({label})")

    @classmethod
    def for_skip(cls, skip: float, num_steps: int, num_layers: int,
                 tol: float = 0.02) -> "PABPolicy":
        """The PAB pyramid (cross >= temporal >= spatial >= FFN ranges) whose skip fraction is
        closest to ``skip``: PAB's windows first; wider ones (all steps but the first) only
        if those cannot come within ``tol``; FFN broadcast only where attention alone cannot;
        among equals the pyramid closest to PAB's 2 : 4 : 6 shape."""
        import math

        wide = {op: (0.0, 1.0) for op in OP_TYPES}
        best = None
        for wi, windows in enumerate((dict(PAB_WINDOWS), wide)):
            if best is not None and not best[0][0]:
                break                      # PAB's own windows reach the target
            for s, t, c, f in product(range(1, 10), repeat=4):
                if not c >= t >= s >= f:
                    continue
                shape = abs(math.log(t / s / 2)) + abs(math.log(c / s / 3))
                pol = cls({"spatial_attn": s, "temporal_attn": t, "cross_attn": c,
                           "spatial_ffn": f, "temporal_ffn": f}, windows)
                got = pol.build(num_steps, num_layers).ops_skipped_fraction()
                err = abs(got - skip)
                key = (err > tol, wi, f > 1, err if err > tol else 0.0, round(shape, 6), err)
                if best is None or key < best[0]:
                    best = (key, pol)
        return best[1]

    def describe(self) -> dict:
        return {"name": self.name, "ranges": {op: int(self.ranges.get(op, 1)) for op in OP_TYPES},
                "windows": {op: list(self.windows.get(op, PAB_WINDOWS[op])) for op in OP_TYPES}}
