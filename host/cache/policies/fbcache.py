"""FirstBlockCache-style policy (ParaAttention's First Block Cache, chengzeyi/ParaAttention,
``para_attn.first_block_cache``): compute the first transformer block every step; reuse the
rest of the step while the first block's output changed little since the step that last
computed the rest.

ParaAttention compares the first block's residual (output - input) with the one kept at the
last step that ran the remaining blocks, ``mean|r - r_ref| / mean|r_ref|``, and reuses the
remaining blocks' residual while it is below the threshold; otherwise it runs them and keeps
the new residual as the reference. The first and last steps are always computed.

How it runs here (per sample and CFG branch, the probe on the NMEs): :class:`FBCachePolicy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from coda.host.cache.schedule import ModelOps

from .base import CachePolicy, Decision, OpQuery, calibrate_threshold

__all__ = ["FBCachePolicy"]


@dataclass(eq=False)
class FBCachePolicy(CachePolicy):
    """First Block Cache: reuse layers 1..L-1 while the first block's output changed by less
    than ``threshold`` (relative L1, unitless) since the rest was last computed.

    Here, per sample and CFG branch, the probe is the first block's *output* (the input of layer
    1's first operator), so that the kept-input monitor measures it on the NMEs
    (:meth:`OpQuery.input_change` against the input kept, ``keep_input``, at the step that last
    computed layers 1..L-1; one MonitorEvent per probe). Layer 0's operators are computed every
    step; below the threshold every operator of layers 1..L-1 is reused, else computed (its
    output stored for the next step) and the reference kept again. The threshold is calibrated
    on a profile (:meth:`FBCachePolicy.calibrate`) to a target skip fraction, with the bisection
    TeaCache and MagCache use (:func:`coda.host.cache.policies.base.calibrate_threshold`).

    Attributes:
        threshold: finite, >= 0 (0 never reuses).
    Raises:
        ValueError: a negative or non-finite threshold.
    """
    threshold: float
    _skip: dict = field(default_factory=dict, repr=False)
    name = "fbcache"
    needs_profile = True
    skip_calibrated = True

    @classmethod
    def from_inputs(cls, inputs, *, threshold: float | None = None) -> "FBCachePolicy":
        """With ``threshold``: that one (no profile needed); else the threshold whose simulated
        skip on ``inputs.profile`` reaches ``inputs.skip`` (:meth:`calibrate`)."""
        if threshold is not None:
            return cls(float(threshold))
        return cls.calibrate(inputs.need("profile", "a profile"),
                             inputs.need("skip", "skip or threshold"))

    def __post_init__(self):
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"threshold={self.threshold}: expected a finite value >= 0")

    def reset(self) -> None:
        self._skip = {}

    @staticmethod
    def _is_probe(q: OpQuery) -> bool:
        """The first operator of layer 1 (:attr:`ModelOps.block_probe`: its input is the
        first block's output)."""
        if q.layer != 1 or q.index == 0:
            return False
        ops = q.model_ops if q.model_ops is not None else ModelOps.latte(q.num_layers)
        return q.ref == ops.block_probe

    def decide(self, q: OpQuery) -> Decision:
        if q.layer == 0:
            return Decision(False, reason="fbcache")
        key = (q.branch, q.sample)
        probe = self._is_probe(q)
        if probe:
            edge = q.step == 0 or q.step == q.num_steps - 1 or q.kept_step is None
            self._skip[key] = (q.step, not edge and q.input_change() < self.threshold)
        if self._skip.get(key) == (q.step, True) and q.cached:
            return Decision(True, reason="threshold")
        # computed: stored for the next step, unless that is the last (always computed)
        return Decision(False, store=q.step + 2 < q.num_steps,
                        keep_input=probe and q.step + 1 < q.num_steps, reason="fbcache")

    def simulate_skip(self, profile) -> float:
        """Skip fraction this threshold reaches on the profile's videos. The change since the
        step that last computed the rest is taken as the sum of the profiled one-step input
        changes of layer 1's first operator since then (full compute: an estimate)."""
        ops = profile.model_ops
        if ops.block_probe is None:
            return 0.0
        x = profile.per_op("in_change")[..., ops.index(ops.block_probe)]
        x = np.nan_to_num(x.astype(np.float64), nan=0.0)
        n_v, n_s, n_b = x.shape
        reused_steps = 0
        for v in range(n_v):
            for b in range(n_b):
                acc = 0.0
                for s in range(1, n_s - 1):
                    acc += x[v, s, b]
                    if acc < self.threshold:
                        reused_steps += 1
                    else:
                        acc = 0.0
        later = sum(layer != ops.ops[0][0] for layer, _ in ops.ops)     # operators after layer 0
        return reused_steps * later / (n_v * n_s * n_b * len(ops.ops))

    @classmethod
    def calibrate(cls, profile, skip: float) -> "FBCachePolicy":
        """The threshold (bisection, :func:`calibrate_threshold`) whose simulated skip
        fraction on ``profile`` is closest to ``skip`` (a fraction in (0, 1); at most
        (L-1)/L x (S-2)/S is reachable). Raises ValueError for a skip outside (0, 1) or a
        profile of fewer than 2 layers or 3 steps (nothing to reuse)."""
        if not 0.0 < skip < 1.0:
            raise ValueError(f"skip {skip}: expected a fraction in (0, 1)")
        if profile.num_layers < 2 or profile.num_steps < 3:
            raise ValueError(f"profile of {profile.num_layers} layers x {profile.num_steps} "
                             "steps: FBCache needs >= 2 layers and >= 3 steps to reuse anything")
        return calibrate_threshold(cls, lambda p: p.simulate_skip(profile), skip, iters=40)

    def describe(self) -> dict:
        return {"name": self.name, "threshold": self.threshold}
