"""LeMiCa-style static path (Gao et al., "LeMiCa: Lexicographic Minimax Path Caching for
Efficient Diffusion-Based Video Generation", NeurIPS 2025): a whole-step cache schedule chosen
as a path through a DAG over the denoising steps.

A node is a computed step; an edge ``i -> j`` (i < j) computes steps i and j and reuses every
operator of steps i+1..j-1 from step i's cache, both CFG branches alike. LeMiCa weighs an edge
by the global error of that one reuse span, measured offline; here the weight comes from the
profile, in the quality proxy of the schedule search's stand-in (:func:`span_costs`).

The path from step 0 to the last step with exactly as many nodes as the target skip leaves
computed is found by dynamic programming over (nodes used, last node), exactly
(:func:`min_error_path`). LeMiCa's own objective is lexicographic minimax (the largest edge
first); this one minimises the sum of the edge errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coda.host.cache.schedule import BRANCHES, Schedule
from coda.host.cache.weights import quality_weights, step_weights

from .static import SchedulePolicy

__all__ = ["min_error_path", "span_costs", "lemica_schedule", "LeMiCaPolicy"]


def min_error_path(cost: np.ndarray, computed: int) -> tuple[tuple[int, ...], float]:
    """The path ``0 = p_0 < p_1 < ... < p_{n-1} = S-1`` with exactly ``n = computed`` nodes
    minimising ``sum_k cost[p_k, p_{k+1}]`` (exact: dynamic programming in O(n S^2)).

    Args:
        cost: [S, S] float; only ``cost[i, j]`` with i < j is read (+inf: no such edge).
        computed: nodes of the path, 2..S (1 when S == 1).
    Returns:
        (the path's nodes, its total cost); among equal totals, the path whose last inner
        node is smallest, then the node before it, and so on.
    Raises:
        ValueError: a cost that is not square or has NaN / -inf above the diagonal, a node
            count out of range, or no finite path.
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2 or cost.shape[0] != cost.shape[1] or cost.shape[0] < 1:
        raise ValueError(f"cost of shape {cost.shape}: expected a square [S, S] matrix, S >= 1")
    steps = cost.shape[0]
    upper = cost[np.triu_indices(steps, 1)]
    if np.isnan(upper).any() or (upper == -np.inf).any():
        raise ValueError("cost: NaN or -inf above the diagonal; expected real numbers or +inf")
    lo = 1 if steps == 1 else 2
    if not lo <= computed <= steps:
        raise ValueError(f"computed={computed}: expected {lo}..{steps} nodes for {steps} steps")
    if steps == 1:
        return (0,), 0.0
    best = np.full((computed, steps), np.inf)     # best[k, j]: k+1 nodes, the last at j
    prev = np.full((computed, steps), -1, dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, computed):
        for j in range(k, steps):
            cand = best[k - 1, :j] + cost[:j, j]
            i = int(np.argmin(cand))                # the first minimum: the smallest i
            best[k, j], prev[k, j] = cand[i], i
    total = best[computed - 1, steps - 1]
    if not np.isfinite(total):
        raise ValueError(f"cost: no path of {computed} nodes from step 0 to {steps - 1} "
                         "with finite cost")
    path = [steps - 1]
    for k in range(computed - 1, 0, -1):
        path.append(int(prev[k, path[-1]]))
    return tuple(reversed(path)), float(total)


def span_costs(profile, guidance_scale: float | None = None) -> np.ndarray:
    """[S, S] edge weights: ``W[i, j]`` (i < j) = the error of reusing steps i+1..j-1 from step
    i's cache, +inf on and below the diagonal.

    LeMiCa weighs an edge
    by the global error of that one reuse span, measured offline; here the weight comes from the
    profile (:class:`coda.host.cache.profile.Profile`), in the quality proxy of the schedule
    search's stand-in (:mod:`coda.experiments.step_plans`): a reused step s of the span costs its step weight
    (:func:`coda.host.cache.weights.step_weights`, the measured step sensitivity) times the output
    change accumulated since step i, ``|g e_cond(s) + (1 - g) e_uncond(s)|`` with
    ``e_b(s) = D_b(s) - D_b(i)``, ``D_b`` the cumulative one-step output change of branch b
    averaged over operators (each weighted by :func:`coda.host.cache.weights.quality_weights`) and g
    the profile's guidance scale.

    Args:
        profile: a :class:`coda.host.cache.profile.Profile` (out_change, out_abs, in_abs,
            sensitivity, meta["guidance_scale"]).
        guidance_scale: the CFG scale g (default: the profile's).
    Raises:
        ValueError: no guidance scale given or in the profile."""
    g = guidance_scale if guidance_scale is not None else profile.meta.get("guidance_scale")
    if g is None or not np.isfinite(g):
        raise ValueError(f"guidance_scale={g}: expected a finite CFG scale (give one or use a "
                         "profile whose meta has it)")
    steps = profile.num_steps
    change = np.nan_to_num(profile.per_op(profile.mean("out_change")).astype(np.float64),
                           nan=0.0)                              # [S, B, ops]
    change[0] = 0.0
    per_step = (change * quality_weights(profile)[None]).mean(axis=2)   # [S, B]
    cum = np.cumsum(per_step, axis=0)
    coef = np.array([g if b == "cond" else 1.0 - g for b in BRANCHES])
    _, w = step_weights(profile)
    out = np.full((steps, steps), np.inf)
    for i in range(steps):
        err = np.abs(((cum - cum[i]) * coef).sum(axis=1)) * w     # [S]: reuse at s from i
        err[:i + 1] = 0.0
        span = np.concatenate([[0.0], np.cumsum(err)])           # span[j] = sum err[:j]
        out[i, i + 1:] = span[i + 1:steps] - span[i + 1]
    return out


def lemica_schedule(profile, skip: float, guidance_scale: float | None = None) -> Schedule:
    """The whole-step schedule of the minimum-error path (:func:`min_error_path` over
    :func:`span_costs`) reusing ``round(skip * S)`` of the S steps: every operator of a reused
    step, both branches; steps 0 and S-1 computed. On the profile's model (any architecture).

    Raises ValueError for a skip outside (0, 1) or one that rounds to no reused step or to
    more than S - 2."""
    if not 0.0 < skip < 1.0:
        raise ValueError(f"skip {skip}: expected a fraction in (0, 1)")
    steps, ops = profile.num_steps, profile.model_ops
    reused = int(round(skip * steps))
    if not 1 <= reused <= steps - 2:
        raise ValueError(f"skip {skip}: {reused} of {steps} steps reused, expected 1..{steps - 2}"
                         f" (a skip of {1 / steps:.3g}..{(steps - 2) / steps:.3g}: the first and"
                         " last steps are computed)")
    path, _ = min_error_path(span_costs(profile, guidance_scale), steps - reused)
    every, nodes = frozenset(ops.ops), set(path)
    reuse = {(s, b): every for s in range(steps) if s not in nodes for b in BRANCHES}
    return Schedule(steps, ops.num_layers, reuse, name=f"lemica(skip={skip:g})", ops=ops)


@dataclass(frozen=True, eq=False)
class LeMiCaPolicy(SchedulePolicy):
    """The schedule of :func:`lemica_schedule`, as a static policy (the registry's ``lemica``)."""
    needs_schedule = False
    needs_profile = True
    skip_calibrated = True
    serves_forecast = False

    @classmethod
    def from_inputs(cls, inputs) -> "LeMiCaPolicy":
        """The min-error path on ``inputs.profile`` leaving ``1 - inputs.skip`` computed."""
        return cls(lemica_schedule(inputs.need("profile", "a profile"),
                                   inputs.need("skip")))
