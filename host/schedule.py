"""Cache schedules as data: which DiT operators are reused at each timestep, per CFG branch.

The cacheable operators of a Latte transformer with ``L`` layers, in forward order, are::

    for layer in 0..L-1:
        (layer, "spatial_attn")   spatial self-attention       (gated by adaLN gate_msa)
        (layer, "cross_attn")     cross attention to the label (no gate: Latte adds it as is)
        (layer, "spatial_ffn")    FFN of the spatial block     (gated by gate_mlp)
        [layer 0 only, F > 1: temporal position embedding, not cacheable -> segment barrier]
        (layer, "temporal_attn")  temporal self-attention      (gated by gate_msa)
        (layer, "temporal_ffn")   FFN of the temporal block    (gated by gate_mlp)

A :class:`Schedule` maps every (step index, branch) to the frozenset of (layer, op) reused at
that step; everything else is computed. A *segment* is a maximal run of consecutive reused
operators in this order within one step and branch (``../shared/DESIGN.md`` §7); it runs on the
NMEs as one ``y = x + Σ g_k ⊙ c_k`` program.

Policies that make or follow schedules live in :mod:`coda.host.policies`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = ["OP_TYPES", "BRANCHES", "OpRef", "operator_order", "segment_runs", "Schedule",
           "ScheduleError"]

OP_TYPES: tuple[str, ...] = ("spatial_attn", "cross_attn", "spatial_ffn",
                             "temporal_attn", "temporal_ffn")
BRANCHES: tuple[str, ...] = ("cond", "uncond")
OpRef = tuple[int, str]   # (layer, op type)

# Between layer 0's spatial and temporal blocks Latte adds the temporal position embedding:
# a computed operation, so no segment can run across it.
_BARRIER_AFTER: OpRef = (0, "spatial_ffn")


class ScheduleError(ValueError):
    """A schedule that cannot run (bad step, branch, operator, or a reuse of something
    never computed)."""


def operator_order(num_layers: int) -> list[OpRef]:
    """The cacheable operators of a ``num_layers``-layer Latte in forward order."""
    if num_layers < 1:
        raise ScheduleError(f"num_layers={num_layers}: expected >= 1")
    return [(layer, op) for layer in range(num_layers) for op in OP_TYPES]


def segment_runs(reused: Iterable[OpRef], num_layers: int, frames: int = 2) -> list[list[OpRef]]:
    """The segments of one step and branch: maximal runs of consecutive reused operators.

    Args:
        reused: the (layer, op) reused at this step.
        num_layers: layers of the model.
        frames: frames of the video (with F = 1 Latte adds no temporal embedding, so
            layer 0's spatial FFN and temporal attention may share a segment).
    Returns:
        list of runs, each a list of (layer, op) in forward order.
    """
    reused = set(reused)
    runs: list[list[OpRef]] = []
    current: list[OpRef] = []
    for ref in operator_order(num_layers):
        if ref in reused:
            current.append(ref)
        elif current:
            runs.append(current)
            current = []
        if ref == _BARRIER_AFTER and frames > 1 and current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


@dataclass(frozen=True)
class Schedule:
    """Per (step, branch) the frozenset of reused (layer, op); validated on construction.

    Attributes:
        num_steps: denoising steps the schedule covers (step indices 0..num_steps-1).
        num_layers: layers of the model it was made for.
        reuse: mapping (step, branch) -> frozenset of (layer, op); missing entries reuse nothing.
        name: a label for reports.
    Raises:
        ScheduleError: unknown branch or operator, step or layer out of range, or an operator
            reused at a step before it was ever computed in that branch.
    """
    num_steps: int
    num_layers: int
    reuse: Mapping[tuple[int, str], frozenset] = field(default_factory=dict)
    name: str = "custom"

    def __post_init__(self):
        if self.num_steps < 1:
            raise ScheduleError(f"num_steps={self.num_steps}: expected >= 1")
        ops = set(operator_order(self.num_layers))
        clean = {}
        for (step, branch), refs in self.reuse.items():
            if branch not in BRANCHES:
                raise ScheduleError(f"branch {branch!r}: expected one of {BRANCHES}")
            if not 0 <= step < self.num_steps:
                raise ScheduleError(f"step {step}: expected 0..{self.num_steps - 1}")
            refs = frozenset((int(layer), str(op)) for layer, op in refs)
            bad = refs - ops
            if bad:
                raise ScheduleError(f"step {step}, branch {branch}: unknown operators {sorted(bad)}; "
                                    f"expected layers 0..{self.num_layers - 1} and ops {OP_TYPES}")
            if refs:
                clean[(int(step), branch)] = refs
        object.__setattr__(self, "reuse", clean)
        self._check_computed_before_reuse()

    def _check_computed_before_reuse(self) -> None:
        for branch in BRANCHES:
            computed: set[OpRef] = set()
            for step in range(self.num_steps):
                reused = self.reused(step, branch)
                never = reused - computed
                if never:
                    layer, op = sorted(never)[0]
                    raise ScheduleError(
                        f"step {step}, branch {branch}: reuses ({layer}, {op!r}) which was never "
                        f"computed at an earlier step of this branch")
                computed |= set(operator_order(self.num_layers)) - reused

    def reused(self, step: int, branch: str) -> frozenset:
        """The (layer, op) reused at ``step`` in ``branch`` (empty frozenset if none)."""
        return self.reuse.get((step, branch), frozenset())

    def store_after_compute(self, step: int, branch: str, ref: OpRef) -> bool:
        """Whether a computed operator's output must be written to its cache slot: only if the
        next step reuses it (a later reuse implies this one, or a recompute in between)."""
        return step + 1 < self.num_steps and ref in self.reused(step + 1, branch)

    def ops_skipped_fraction(self) -> float:
        """Reused operator executions / all cacheable operator executions, both branches."""
        total = self.num_steps * len(BRANCHES) * len(OP_TYPES) * self.num_layers
        return sum(len(v) for v in self.reuse.values()) / total

    def segment_count(self, frames: int = 2) -> int:
        """Segments over all steps and both branches (see :func:`segment_runs`)."""
        return sum(len(segment_runs(self.reused(s, b), self.num_layers, frames))
                   for s in range(self.num_steps) for b in BRANCHES)

    def to_json(self) -> str:
        """JSON text; :meth:`from_json` reads it back."""
        items = [{"step": s, "branch": b, "reuse": sorted([list(r) for r in refs])}
                 for (s, b), refs in sorted(self.reuse.items())]
        return json.dumps({"name": self.name, "num_steps": self.num_steps,
                           "num_layers": self.num_layers, "reuse": items})

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        data = json.loads(text)
        reuse = {(int(i["step"]), i["branch"]): frozenset((int(l), o) for l, o in i["reuse"])
                 for i in data["reuse"]}
        return cls(data["num_steps"], data["num_layers"], reuse, data.get("name", "custom"))
