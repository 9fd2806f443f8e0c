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

Other architectures: each operator type is broadcast as its PAB class
(:meth:`PABPolicy.build_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from typing import Mapping

from coda.host.cache.schedule import (ALL_OP_TYPES, BRANCHES, OP_TYPES, ModelOps, Schedule,
                                      ScheduleError)

from .static import StaticPolicy

__all__ = ["PABPolicy", "PAB_RANGES", "PAB_WINDOWS"]

#: PAB's broadcast ranges (VideoSys Open-Sora PAB config); FFNs not broadcast
PAB_RANGES = {"spatial_attn": 2, "temporal_attn": 4, "cross_attn": 6,
              "spatial_ffn": 1, "temporal_ffn": 1}
#: broadcast windows as fractions of the steps: timesteps (100, 800) / (100, 900) of 1000
PAB_WINDOWS = {"spatial_attn": (0.2, 0.9), "temporal_attn": (0.2, 0.9),
               "cross_attn": (0.1, 0.9), "spatial_ffn": (0.2, 0.9), "temporal_ffn": (0.2, 0.9)}
#: the Latte op type whose range and window an operator of each PAB class takes by default
_CLASS_OP = {"spatial": "spatial_attn", "temporal": "temporal_attn", "cross": "cross_attn",
             "mlp": "spatial_ffn"}


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
    skip_calibrated = True
    serves_forecast = True

    def __post_init__(self):
        for op in dict.fromkeys(OP_TYPES + tuple(self.ranges) + tuple(self.windows)):
            if op not in ALL_OP_TYPES:
                raise ScheduleError(f"PAB range or window {op!r}: expected an op type of "
                                    f"{ALL_OP_TYPES}")
            r = int(self.ranges.get(op, 1))
            lo, hi = self.windows.get(op, PAB_WINDOWS.get(op, (0.2, 0.9)))
            if r < 1:
                raise ScheduleError(f"PAB range {op}={r}: expected >= 1")
            if not 0.0 <= lo < hi <= 1.0:
                raise ScheduleError(f"PAB window {op}=({lo}, {hi}): expected 0 <= start < end <= 1")

    def range_window(self, op: str, ops: ModelOps | None = None) -> tuple[int, tuple]:
        """(range, window) of op type ``op``: its own entry, else (an op type of another
        architecture than Latte, ``ops``) that of the Latte op type of its PAB class; an
        unlisted range is 1 (never broadcast)."""
        base = op if op in OP_TYPES or ops is None else _CLASS_OP[ops.pab_class(op)]
        r = int(self.ranges.get(op, self.ranges.get(base, 1)))
        window = self.windows.get(op, self.windows.get(base, PAB_WINDOWS[base]))
        return r, window

    def build(self, num_steps: int, num_layers: int) -> Schedule:
        return self._build(num_steps, ModelOps.latte(num_layers))

    def build_for(self, num_steps: int, ops: ModelOps) -> Schedule:
        """The schedule on a model of another architecture.

        Other architectures (:data:`coda.host.cache.schedule.ARCH_OP_KINDS`): each operator type is
        broadcast with the range and window of its PAB class (:meth:`ModelOps.pab_class`:
        spatial / temporal / cross attention or MLP), i.e. of the Latte operator type of that class
        (spatial_attn, temporal_attn, cross_attn, spatial_ffn), unless ``ranges`` / ``windows`` name
        the op type itself: Wan's self-attention broadcasts as spatial attention (2), its cross
        attention as cross (6), CogVideoX's and HunyuanVideo's joint attention (and HunyuanVideo's
        single-stream blocks) as spatial, every FFN as MLP (1: not broadcast).
        """
        return self._build(num_steps, ops)

    def _build(self, num_steps: int, ops: ModelOps) -> Schedule:
        import math

        reuse: dict = {}
        for op in ops.op_types:
            r, (lo, hi) = self.range_window(op, ops)
            first = max(1, math.floor(lo * num_steps))
            last = min(num_steps, math.ceil(hi * num_steps))
            for step in range(first, last):
                if r > 1 and (step - first) % r:
                    for branch in BRANCHES:
                        reuse.setdefault((step, branch), set()).update(
                            ref for ref in ops.ops if ref[1] == op)
        label = ",".join(f"{op}={self.range_window(op, ops)[0]}" for op in ops.op_types)
        return Schedule(num_steps, ops.num_layers, {k: frozenset(v) for k, v in reuse.items()},
                        name=f"pab({label})", ops=ops)

    @classmethod
    def from_inputs(cls, inputs, *, ranges=None, windows=None) -> "PABPolicy":
        """With ``inputs.skip``: :meth:`for_skip` on the run's shape; else PAB with these
        ``ranges`` / ``windows`` (default PAB's). ValueError for both or a missing shape."""
        if inputs.skip is not None:
            if ranges is not None or windows is not None:
                raise ValueError(f"policy {inputs.name!r}: skip and ranges / windows are "
                                 "alternatives (skip calibrates them); expected one")
            return cls.for_skip(inputs.skip, inputs.need("num_steps"), inputs.need("num_layers"),
                                ops=inputs.ops)
        given = {k: v for k, v in (("ranges", ranges), ("windows", windows)) if v is not None}
        return cls(**given)

    @classmethod
    def for_skip(cls, skip: float, num_steps: int, num_layers: int,
                 tol: float = 0.02, ops: ModelOps | None = None) -> "PABPolicy":
        """The PAB pyramid (cross >= temporal >= spatial >= FFN ranges) whose skip fraction is
        closest to ``skip``: PAB's windows first; wider ones (all steps but the first) only
        if those cannot come within ``tol``; FFN broadcast only where attention alone cannot;
        among equals the pyramid closest to PAB's 2 : 4 : 6 shape. ``ops``: the model's
        operators (default: Latte's of ``num_layers``); the range of a PAB class the model
        lacks changes nothing of its schedule (only the pyramid's order constrains it)."""
        import math

        ops = ModelOps.latte(num_layers) if ops is None else ops
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
                got = pol.schedule_for(num_steps, ops).ops_skipped_fraction()
                err = abs(got - skip)
                key = (err > tol, wi, f > 1, err if err > tol else 0.0, round(shape, 6), err)
                if best is None or key < best[0]:
                    best = (key, pol)
        return best[1]

    def describe(self) -> dict:
        listed = [op for op in self.ranges if op not in OP_TYPES]       # other architectures'
        return {"name": self.name,
                "ranges": {op: int(self.ranges.get(op, 1)) for op in OP_TYPES + tuple(listed)},
                "windows": {op: list(self.windows.get(op, PAB_WINDOWS[op])) for op in OP_TYPES}}
