"""A per-operator schedule for the tests of what runs schedules (policies, DRA, ``coda run``):
reused and computed operators mixed inside a step, and some reused in one CFG branch only,
so segments start and end anywhere in a step."""

from __future__ import annotations

import numpy as np

from coda.host.cache.schedule import BRANCHES, ModelOps, Schedule


def mixed_schedule(num_steps: int, num_layers: int, skip: float, *, seed: int = 0,
                   ops: ModelOps | None = None) -> Schedule:
    """Exactly ``round(skip * N)`` of the ``N`` operator executions reused, drawn with
    ``seed``; about three quarters of them in both branches at once, the rest in one branch,
    never the first operator (step DRA's probe, one verdict for both branches). Step 0 and the
    last step compute everything. At the step before the last, the first operator is computed
    and the second reused in both branches, so a DRA that falls back at every probed step
    still leaves a reuse. ``ops``: default Latte's of ``num_layers``."""
    ops = ModelOps.latte(num_layers) if ops is None else ops
    order, last = ops.ops, num_steps - 2
    if num_steps < 4 or len(order) < 2:
        raise ValueError(f"{num_steps} steps of {len(order)} operators: expected >= 4 and >= 2")
    cells = [(s, k) for s in range(1, num_steps - 1) for k in range(len(order))
             if (s, k) not in ((last, 0), (last, 1))]
    target = round(skip * num_steps * len(BRANCHES) * len(order))
    if not len(BRANCHES) < target <= len(BRANCHES) * (len(cells) + 1):
        raise ValueError(f"skip {skip}: expected {len(BRANCHES) + 1}.."
                         f"{len(BRANCHES) * (len(cells) + 1)} reused executions, got {target}")
    rng = np.random.default_rng(seed)
    cells = [(last, 1)] + [cells[i] for i in rng.permutation(len(cells))]
    pairs = max(1, 3 * target // 8)
    singles = target - 2 * pairs
    rest = sum(k != 0 for _, k in cells[pairs:])
    while singles > rest:       # too few cells for singles: more pairs
        pairs, singles = pairs + 1, singles - 2
        rest -= cells[pairs - 1][1] != 0
    if singles < 0 or pairs > len(cells):
        raise ValueError(f"skip {skip}: {target} reused executions do not fit")
    single = [c for c in cells[pairs:] if c[1] != 0][:singles]
    reuse: dict = {}
    for i, (s, k) in enumerate(cells[:pairs] + single):
        branches = BRANCHES if i < pairs else (BRANCHES[int(rng.integers(len(BRANCHES)))],)
        for b in branches:
            reuse.setdefault((s, b), set()).add(order[k])
    return Schedule(num_steps, ops.num_layers, {key: frozenset(v) for key, v in reuse.items()},
                    name=f"mixed(skip={skip:g},seed={seed})", ops=ops)
