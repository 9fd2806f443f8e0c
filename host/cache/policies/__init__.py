"""Cache policies: which operators the cache engine reuses, one policy per file.

| name        | file            | kind    | rule |
|-------------|-----------------|---------|------|
| ``uniform`` | ``uniform.py``  | static  | DeepCache/FORA: every operator type recomputed every k steps |
| ``coda``    | ``static.py``   | static  | the searched schedule (``coda schedule search``; the shipped one by default) |
| ``coda-lat``| ``static.py``   | static  | as ``coda``, searched within uniform's modelled latency (``--latency uniform``) |
| ``pab``     | ``pab.py``      | static  | PAB: broadcast ranges per attention type inside step windows |
| ``teacache``| ``teacache.py`` | dynamic | TeaCache: accumulated rescaled relative L1 of the first operator's input |
| ``magcache``| ``magcache.py`` | static  | MagCache: accumulated magnitude-ratio error per operator |
| ``fbcache`` | ``fbcache.py``  | dynamic | First Block Cache: block 0 gates reusing the rest |
| ``lemica``  | ``lemica.py``   | static  | LeMiCa: whole steps, min-error path over steps |
| ``coda+dra``| ``dra.py``      | dynamic | a static schedule plus step-level DRA (fallback) |

:func:`as_policy` turns what a user passes into a policy; :func:`get_policy` makes one by name.
"""

from __future__ import annotations

from coda.host.cache.schedule import Schedule

from .base import (COMPUTE, MIN_CACHED_STEPS, CachePolicy, Decision, OpQuery, PolicyInputs)
from .registry import POLICIES, check_cached_steps, expected_skip, get_policy, policy_names
from .static import SchedulePolicy, StaticPolicy
from .uniform import UniformIntervalPolicy, uniform_for_skip

__all__ = ["CachePolicy", "Decision", "OpQuery", "PolicyInputs", "COMPUTE", "StaticPolicy",
           "SchedulePolicy", "UniformIntervalPolicy", "as_policy", "get_policy", "POLICIES",
           "policy_names", "uniform_for_skip", "MIN_CACHED_STEPS", "check_cached_steps",
           "expected_skip"]


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
    raise TypeError(f"policy {policy!r}: expected a CachePolicy (coda.host.cache.policies) or a Schedule")
