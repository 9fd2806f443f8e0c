"""The policy registry: name -> policy class, each class building itself from what the run
knows (:meth:`CachePolicy.from_inputs`: skip, profile, schedule, the run's shape).

Every command and :func:`coda.enable_cache` reads the class facts here (``needs_profile``,
``needs_schedule``, ``skip_calibrated``, ``serves_forecast``) instead of keeping its own lists.
"""

from __future__ import annotations

import inspect

from coda.host.cache.schedule import ModelOps

from .base import CachePolicy, PolicyInputs, refuse_short_run
from .dra import StepDRAPolicy
from .fbcache import FBCachePolicy
from .lemica import LeMiCaPolicy
from .magcache import MagCachePolicy
from .pab import PABPolicy
from .static import SchedulePolicy, StaticPolicy
from .teacache import TeaCachePolicy
from .uniform import UniformIntervalPolicy

__all__ = ["POLICIES", "get_policy", "expected_skip", "check_cached_steps", "policy_names"]

#: registry name -> policy class (``coda`` and ``coda-lat`` are both a searched schedule:
#: within any latency, or searched within uniform's modelled latency)
POLICIES: dict[str, type[CachePolicy]] = {
    "uniform": UniformIntervalPolicy,
    "pab": PABPolicy,
    "teacache": TeaCachePolicy,
    "magcache": MagCachePolicy,
    "fbcache": FBCachePolicy,
    "lemica": LeMiCaPolicy,
    "coda": SchedulePolicy,
    "coda-lat": SchedulePolicy,
    "coda+dra": StepDRAPolicy,
}


def policy_names(fact: str) -> tuple[str, ...]:
    """The registry names whose class has ``fact`` (``needs_profile``, ``needs_schedule``,
    ``skip_calibrated``, ``serves_forecast``) true, in registry order. ValueError for an
    unknown fact."""
    if fact not in ("needs_profile", "needs_schedule", "skip_calibrated", "serves_forecast"):
        raise ValueError(f"fact {fact!r}: expected needs_profile, needs_schedule, "
                         "skip_calibrated or serves_forecast")
    return tuple(name for name, cls in POLICIES.items() if getattr(cls, fact))


def check_cached_steps(steps: int, flag: str = "--steps", policy: str | None = None) -> int:
    """``steps`` if ``policy`` can reuse anything in a run of that many DDIM steps: any for a
    policy built from a searched schedule (checked against the steps when read), else
    >= :data:`coda.host.cache.policies.MIN_CACHED_STEPS`. ValueError naming ``flag`` (and
    ``policy``) otherwise: nothing would be cached."""
    if policy in POLICIES and POLICIES[policy].needs_schedule:
        return steps
    return refuse_short_run(steps, flag, policy)


def get_policy(name: str, *, skip: float | None = None, profile=None, schedule=None,
               num_steps: int | None = None, num_layers: int | None = None,
               ops: ModelOps | None = None, **params) -> CachePolicy:
    """A policy by name (:data:`POLICIES`), for any architecture the engine serves.

    Args:
        name: ``uniform``, ``pab``, ``teacache``, ``magcache``, ``fbcache``, ``lemica``,
            ``coda``, ``coda-lat`` or ``coda+dra``.
        skip: target fraction of operator executions reused; each policy is calibrated to it
            (uniform / PAB: the closest parameters; TeaCache / MagCache / FBCache: the
            threshold on the profile; LeMiCa: its path on the profile).
        profile: a :class:`coda.host.cache.profile.Profile` (teacache, magcache, fbcache,
            lemica); its model's operators are the ones calibrated for.
        schedule: a :class:`coda.host.cache.schedule.Schedule` (coda, coda-lat, coda+dra):
            :func:`coda.host.cache.shipped.load_schedule` or
            :func:`coda.experiments.search.search_steps`.
        num_steps, num_layers: the run's shape (uniform and PAB with ``skip``).
        ops: the model's operators (``coda.host.cache.arch.model_ops(transformer)``) for
            uniform and PAB with ``skip``; default: the profile's, else Latte's of
            ``num_layers``.
        **params: the class's own keyword parameters (its ``from_inputs``): ``interval``,
            ``warmup`` (uniform); ``ranges``, ``windows`` (pab); ``threshold`` (teacache,
            magcache, fbcache); ``thresholds`` (coda+dra, a
            :class:`coda.host.cache.policies.dra.StepThresholds` calibrated on ``schedule``).
    Raises:
        ValueError: an unknown name, a skip outside (0, 1), a missing profile / shape /
            schedule / thresholds, parameters the class does not take, a run (``num_steps``,
            or the profile's steps) shorter than :data:`MIN_CACHED_STEPS`, or a policy
            calibrated to ``skip`` that would reuse nothing ("nothing would be cached").
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r}: expected one of {', '.join(POLICIES)}")
    if skip is not None and not 0.0 < float(skip) < 1.0:
        raise ValueError(f"skip {skip}: expected a fraction in (0, 1)")
    if ops is None and profile is not None and profile.model_ops.arch != "latte":
        ops = profile.model_ops
    if ops is not None:
        num_layers = ops.num_layers if num_layers is None else num_layers
    allowed = [p.name for p in inspect.signature(cls.from_inputs).parameters.values()
               if p.kind is p.KEYWORD_ONLY]
    extra = sorted(set(params) - set(allowed))
    if extra:
        raise ValueError(f"policy {name!r}: unknown parameters {extra}; expected "
                         f"{allowed or 'none'}")
    inputs = PolicyInputs(name, skip, profile, schedule, num_steps, num_layers, ops)
    policy = cls.from_inputs(inputs, **params)
    if skip is not None and cls.skip_calibrated:
        got = expected_skip(policy, num_steps, num_layers, profile, ops)
        if got == 0.0:
            steps = profile.num_steps if cls.needs_profile else num_steps
            raise ValueError(f"policy {name!r} at skip {skip} on {steps} steps: nothing would "
                             f"be cached (the closest calibration reuses no operator); "
                             "expected more steps or a larger skip")
    return policy


def expected_skip(policy, num_steps: int | None, num_layers: int | None, profile=None,
                  ops: ModelOps | None = None) -> float:
    """The fraction of operator executions ``policy`` reuses: a static policy's schedule
    for ``num_steps`` on the model of ``ops`` (default: the profile's operators and steps
    when ``num_steps`` is None, else Latte's of ``num_layers``), a threshold policy's
    simulation on ``profile`` (its steps). TypeError for any other policy."""
    if hasattr(policy, "simulate_skip"):
        return float(policy.simulate_skip(profile))
    if isinstance(policy, StaticPolicy):
        if num_steps is None and profile is not None:
            num_steps, num_layers, ops = profile.num_steps, profile.num_layers, profile.model_ops
        ops = ModelOps.latte(num_layers) if ops is None else ops
        return float(policy.schedule_for(num_steps, ops).ops_skipped_fraction())
    raise TypeError(f"policy {policy!r}: expected a static or TeaCache policy")
