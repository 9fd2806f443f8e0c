"""Cache policies: which operators the cache engine reuses, one policy per file.

| name        | file            | kind    | rule |
|-------------|-----------------|---------|------|
| ``uniform`` | ``uniform.py``  | static  | DeepCache/FORA: every operator type recomputed every k steps |
| ``schedule``| ``static.py``   | static  | a fixed :class:`coda.host.schedule.Schedule` (e.g. annealed by ``coda schedule search``) |

Every policy is a :class:`coda.host.policies.base.CachePolicy` (decide before each operator,
observe the events after it, reset between generations); :func:`as_policy` turns what a user
passes to the engine into one.
"""

from __future__ import annotations

from coda.host.schedule import Schedule

from .base import COMPUTE, CachePolicy, Decision, OpQuery
from .static import SchedulePolicy, StaticPolicy
from .uniform import UniformIntervalPolicy

__all__ = ["CachePolicy", "Decision", "OpQuery", "COMPUTE", "StaticPolicy", "SchedulePolicy",
           "UniformIntervalPolicy", "as_policy"]


def as_policy(policy) -> CachePolicy:
    """A :class:`CachePolicy` from a policy (returned as is), a :class:`Schedule` (as a
    :class:`SchedulePolicy`) or None (the default :class:`UniformIntervalPolicy`).

    Raises TypeError for anything else."""
    if policy is None:
        return UniformIntervalPolicy()
    if isinstance(policy, Schedule):
        return SchedulePolicy(policy)
    if isinstance(policy, CachePolicy):
        return policy
    raise TypeError(f"policy {policy!r}: expected a CachePolicy (coda.host.policies) or a Schedule")
