"""Cache policies: which operators the cache engine reuses, one policy per file.

| name        | file            | kind    | rule |
|-------------|-----------------|---------|------|
| ``uniform`` | ``uniform.py``  | static  | DeepCache/FORA: every operator type recomputed every k steps |
| ``schedule``| ``static.py``   | static  | a fixed :class:`coda.host.cache.schedule.Schedule` (e.g. searched by ``coda schedule search``) |
| ``coda``    | ``static.py``   | static  | the searched schedule (``coda schedule search``; the shipped one by default) |
| ``coda-lat``| ``static.py``   | static  | as ``coda``, searched within uniform's modelled latency (``--latency uniform``) |
| ``pab``     | ``pab.py``      | static  | PAB: broadcast ranges per attention type inside step windows |
| ``teacache``| ``teacache.py`` | dynamic | TeaCache: accumulated rescaled relative L1 of the first operator's input |
| ``magcache``| ``magcache.py`` | static  | MagCache: accumulated magnitude-ratio error per operator |
| ``fbcache`` | ``fbcache.py``  | dynamic | First Block Cache: block 0 gates reusing the rest |
| ``lemica``  | ``lemica.py``   | static  | LeMiCa: whole steps, min-error path over steps |
| ``coda+dra``| ``dra.py``      | dynamic | a static schedule plus step-level DRA (fallback) |

Every policy is a :class:`coda.host.cache.policies.base.CachePolicy` (decide before each operator,
observe the events after it, reset between generations); :func:`as_policy` turns what a user
passes to the engine into one; :func:`get_policy` makes one by name (:data:`POLICIES`).

The commands that pick and calibrate policies (``coda run``, ``coda profile``, ``coda schedule
search``, ``coda eval``) share one reading of their values, here: :func:`parse_int_list`,
:func:`parse_list` (one rule for lists: no empty item, no duplicate), :func:`check_steps`,
:func:`check_guidance`, :func:`check_seed`. Each raises ValueError
naming the flag, the value and what was expected.
"""

from __future__ import annotations

import math

from coda.host.cache.schedule import ModelOps, Schedule
from coda.lists import items, no_duplicates

from .base import (COMPUTE, MIN_CACHED_STEPS, SCHEDULE_POLICIES, CachePolicy, Decision, OpQuery,
                   check_cached_steps)
from .static import SchedulePolicy, StaticPolicy
from .uniform import DEFAULT_INTERVAL, DEFAULT_WARMUP, UniformIntervalPolicy

__all__ = ["CachePolicy", "Decision", "OpQuery", "COMPUTE", "StaticPolicy", "SchedulePolicy",
           "UniformIntervalPolicy", "as_policy", "get_policy", "POLICIES", "uniform_for_skip",
           "parse_int_list", "parse_list", "check_steps", "max_steps", "check_guidance",
           "check_seed", "MAX_SEED", "MIN_CACHED_STEPS", "check_cached_steps",
           "SCHEDULE_POLICIES", "expected_skip"]


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




def uniform_for_skip(skip: float, num_steps: int, num_layers: int, tol: float = 0.02,
                     ops: ModelOps | None = None):
    """The uniform-interval policy (one interval for every operator type if one is within
    ``tol`` of ``skip``, else two neighbouring intervals over the types) whose skip fraction
    is closest to ``skip`` (to 0.005), with the shortest interval and then the most warmup
    steps (1..20) among the closest. ``ops``: the model's operators (default: Latte's of
    ``num_layers``); each op type weighs by its operators per step.
    Returns a :class:`coda.host.cache.policies.UniformIntervalPolicy`. Raises ValueError (as
    :func:`check_cached_steps`) for ``num_steps`` < :data:`MIN_CACHED_STEPS`."""
    from itertools import product

    check_cached_steps(num_steps, "num_steps")
    ops = ModelOps.latte(num_layers) if ops is None else ops
    types = ops.op_types
    counts = [ops.count((op,)) for op in types]

    def reused_steps(k: int, warmup: int) -> int:     # steps >= warmup off the interval
        span = max(0, num_steps - warmup)
        return span - -(-span // k)

    best = None
    for k in range(1, 12):
        for combo in product((k, k + 1), repeat=len(types)):
            mixed = len(set(combo)) > 1
            for warmup in range(1, min(21, num_steps)):
                got = (sum(n * reused_steps(kk, warmup) for n, kk in zip(counts, combo))
                       / (sum(counts) * num_steps))
                err = abs(got - skip)
                key = (err > tol + 1e-9, mixed, round(err / 0.005), k, -warmup, err)
                if best is None or key < best[0]:
                    best = (key, (combo, k, warmup))
    combo, k, warmup = best[1]
    if len(set(combo)) == 1:        # one interval for every type: it is the default
        return UniformIntervalPolicy(default_interval=combo[0], warmup=warmup)
    return UniformIntervalPolicy(intervals=dict(zip(types, combo)),
                                 default_interval=min(combo), warmup=warmup)


# ---------------------------------------------------------------- the registry
#: policy names :func:`get_policy` knows, with what each needs besides ``skip``
POLICIES = {
    "uniform": "interval/warmup, or skip + num_steps + num_layers",
    "pab": "ranges/windows, or skip + num_steps + num_layers",
    "teacache": "profile + (threshold or skip)",
    "magcache": "profile + (threshold or skip)",
    "coda": "schedule (a Schedule: coda.host.cache.shipped.load_schedule or the search)",
    "coda-lat": "as coda: the schedule searched within uniform's modelled latency",
    "fbcache": "profile + (threshold or skip)",
    "lemica": "profile + skip",
    "coda+dra": "as coda, plus thresholds (coda.experiments.dra_calibration.calibrate_step_dra)",
}


def get_policy(name: str, *, skip: float | None = None, profile=None, schedule=None,
               num_steps: int | None = None, num_layers: int | None = None,
               ops: ModelOps | None = None, **params) -> CachePolicy:
    """A policy by name (:data:`POLICIES`), for any architecture the engine serves.

    Args:
        name: ``uniform``, ``pab``, ``teacache``, ``magcache``, ``fbcache``, ``lemica``,
            ``coda``, ``coda-lat`` or ``coda+dra``.
        skip: target fraction of operator executions reused; each policy is calibrated to it
            (uniform / PAB: the closest parameters; TeaCache / MagCache: the threshold on the
            profile; FBCache: its threshold on the profile; LeMiCa: its path on the profile;
            coda: the ``schedule`` given, made for it).
        profile: a :class:`coda.experiments.profile.Profile` (teacache, magcache, fbcache,
            lemica); its model's operators are the ones calibrated for.
        schedule: a :class:`Schedule` (coda, coda+dra): read one with
            :func:`coda.host.cache.shipped.load_schedule` or search one with
            :func:`coda.experiments.search.search_steps`.
        num_steps, num_layers: the run's shape (uniform and PAB with ``skip``).
        ops: the model's operators (:class:`coda.host.cache.schedule.ModelOps`,
            ``coda.host.cache.arch.model_ops(transformer)``) for uniform and PAB with
            ``skip``; default: the profile's, else Latte's of ``num_layers``.
        **params: the policy's own parameters (``interval``, ``warmup`` for uniform;
            ``threshold``; coda+dra's ``thresholds``, a
            :class:`coda.host.cache.policies.dra.StepThresholds` calibrated on ``schedule``).
    Raises:
        ValueError: an unknown name, a skip outside (0, 1), a missing profile / shape /
            thresholds, thresholds of another schedule, parameters the policy does not
            take, a run (``num_steps``, or the profile's steps) shorter than
            :data:`MIN_CACHED_STEPS`, or a policy calibrated to ``skip`` that would reuse
            nothing ("nothing would be cached").
    """
    if ops is None and profile is not None and profile.model_ops.arch != "latte":
        ops = profile.model_ops
    if ops is not None:
        num_layers = ops.num_layers if num_layers is None else num_layers
    policy = _get_policy(name, skip, profile, schedule, num_steps, num_layers, ops, params)
    if skip is not None and name in ("uniform", "pab", "teacache", "magcache"):
        got = expected_skip(policy, num_steps, num_layers, profile, ops)
        if got == 0.0:
            steps = profile.num_steps if name in ("teacache", "magcache") else num_steps
            raise ValueError(f"policy {name!r} at skip {skip} on {steps} steps: nothing would "
                             f"be cached (the closest calibration reuses no operator); "
                             "expected more steps or a larger skip")
    return policy


def expected_skip(policy, num_steps: int | None, num_layers: int | None, profile=None,
                  ops: ModelOps | None = None) -> float:
    """The fraction of operator executions ``policy`` reuses: a static policy's schedule
    for ``num_steps`` on the model of ``ops`` (default: the profile's operators and steps
    when ``num_steps`` is None, else Latte's of ``num_layers``), TeaCache's simulation on
    ``profile`` (its steps)."""
    if hasattr(policy, "simulate_skip"):
        return float(policy.simulate_skip(profile))
    if isinstance(policy, StaticPolicy) or hasattr(policy, "build"):
        if num_steps is None and profile is not None:
            num_steps, num_layers, ops = profile.num_steps, profile.num_layers, profile.model_ops
        ops = ModelOps.latte(num_layers) if ops is None else ops
        if isinstance(policy, StaticPolicy):
            return float(policy.schedule_for(num_steps, ops).ops_skipped_fraction())
        return float(policy.build(num_steps, num_layers).ops_skipped_fraction())
    raise TypeError(f"policy {policy!r}: expected a static or TeaCache policy")


def _get_policy(name, skip, profile, schedule, num_steps, num_layers, ops,
                params) -> CachePolicy:
    """:func:`get_policy` before its check that a calibrated policy caches something."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: expected one of {', '.join(POLICIES)}")
    if skip is not None and not 0.0 < float(skip) < 1.0:
        raise ValueError(f"skip {skip}: expected a fraction in (0, 1)")

    def need(what, value):
        if value is None:
            raise ValueError(f"policy {name!r} needs {what}")
        return value

    def take(*allowed):
        extra = set(params) - set(allowed)
        if extra:
            raise ValueError(f"policy {name!r}: unknown parameters {sorted(extra)}; "
                             f"expected {list(allowed) or 'none'}")
        return {k: params[k] for k in allowed if k in params}

    if name == "uniform":
        p = take("interval", "warmup")
        if skip is not None:
            return uniform_for_skip(skip, need("num_steps", num_steps),
                                    need("num_layers", num_layers), ops=ops)
        return UniformIntervalPolicy(default_interval=p.get("interval", DEFAULT_INTERVAL),
                                     warmup=p.get("warmup", DEFAULT_WARMUP))
    if name == "pab":
        from .pab import PABPolicy
        p = take("ranges", "windows")
        if skip is not None:
            return PABPolicy.for_skip(skip, need("num_steps", num_steps),
                                      need("num_layers", num_layers), ops=ops)
        return PABPolicy(**p)
    if name in ("uniform", "pab") and skip is not None:
        check_cached_steps(need("num_steps", num_steps), "num_steps", name)
    if name in ("teacache", "magcache"):
        check_cached_steps(need("a profile", profile).num_steps, "profile --steps", name)
    if name == "teacache":
        from .teacache import TeaCachePolicy, fit_rescale
        p = take("threshold")
        prof = need("a profile", profile)
        if "threshold" in p:
            return TeaCachePolicy(float(p["threshold"]), tuple(fit_rescale(prof)))
        return TeaCachePolicy.calibrate(prof, need("skip or threshold", skip))
    if name == "magcache":
        from .magcache import MagCachePolicy, magnitude_ratios
        p = take("threshold")
        prof = need("a profile", profile)
        if "threshold" in p:
            return MagCachePolicy(magnitude_ratios(prof), float(p["threshold"]))
        return MagCachePolicy.calibrate(prof, need("skip or threshold", skip))
    if name == "fbcache":
        from .fbcache import FBCachePolicy
        p = take("threshold")
        if "threshold" in p:
            return FBCachePolicy(float(p["threshold"]))
        return FBCachePolicy.calibrate(need("a profile", profile), need("skip or threshold", skip))
    if name == "lemica":
        from .lemica import lemica_schedule
        take()
        return SchedulePolicy(lemica_schedule(need("a profile", profile), need("skip", skip)))
    # coda, coda-lat, coda+dra
    p = take("thresholds") if name == "coda+dra" else take()
    if not isinstance(schedule, Schedule):
        raise ValueError(f"policy {name!r} needs a schedule (coda.host.cache.shipped.load_schedule "
                         f"or coda.experiments.search.search_steps), got {type(schedule).__name__}")
    policy: CachePolicy = SchedulePolicy(schedule)
    if name == "coda+dra":
        from .dra import StepDRAPolicy, StepThresholds
        table = p.get("thresholds")
        if not isinstance(table, StepThresholds):
            raise ValueError(f"policy 'coda+dra' needs thresholds (a StepThresholds of "
                             f"coda.experiments.dra_calibration.calibrate_step_dra or load_step_dra), "
                             f"got {type(table).__name__}")
        policy = StepDRAPolicy(policy, table)
    return policy


# ---------------------------------------------------------------- command-line values
#: the largest seed the commands take (seeds are 0..MAX_SEED)
MAX_SEED = 2**31 - 1


# one rule for lists, shared with coda sweep's --param / --grid (coda.lists)
_items, _no_duplicates = items, no_duplicates


def parse_int_list(text, flag: str, lo: int, hi: int) -> list[int]:
    """``"0-9"``, ``"1,4,9"`` or ``"0-2,7"`` -> a list of ints in ``lo..hi``, order kept.
    Empty items and duplicates (also through overlapping ranges) are refused.

    Raises ValueError naming ``flag``."""
    expected = (f"distinct integers {lo}..{hi} as a comma-separated list or ranges, such as "
                "0-9 or 1,4,9")
    out: list[int] = []
    for part in _items(text, flag, expected):
        try:
            if "-" in part[1:]:
                a, b = (part.split("-", 1) if not part.startswith("-") else (part, ""))
                a, b = int(a), int(b)
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {part!r} is not an integer or a range a-b "
                             f"(a <= b), expected {expected}") from None
    bad = [v for v in out if not lo <= v <= hi]
    if bad:
        raise ValueError(f"{flag} {text!r}: {bad[0]} is out of range, expected {expected}")
    _no_duplicates(out, text, flag, expected)
    return out


def parse_list(text, flag: str, kind=str, *, choices=None, expected: str | None = None) -> list:
    """A comma-separated list of ``kind`` values (``str``: names, ``float``: numbers), order
    kept; empty items and duplicates are refused, and with ``choices`` any other name.

    Raises ValueError naming ``flag``."""
    expected = expected or (f"a comma-separated list of {', '.join(choices)}" if choices
                            else "a comma-separated list")
    out = []
    for part in _items(text, flag, expected):
        try:
            value = kind(part)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {part!r} is not a {kind.__name__}, expected "
                             f"{expected}") from None
        if choices is not None and value not in choices:
            raise ValueError(f"{flag} {value!r}: unknown value, expected {expected}")
        out.append(value)
    _no_duplicates(out, text, flag, expected)
    return out


def max_steps(config: dict | None = None) -> int:
    """The most DDIM steps a run can take: the noise schedule's ``num_train_timesteps``
    (``config["scheduler"]``, default: the shipped model's configuration file)."""
    if config is None:
        import json

        from coda.host.model.dit import CONFIG_FILE
        config = json.loads(CONFIG_FILE.read_text())
    return int(config["scheduler"]["num_train_timesteps"])


def check_steps(steps: int, flag: str = "--steps", *, lo: int = 1,
                config: dict | None = None) -> int:
    """``steps`` in ``lo..max_steps(config)`` (DDIM cannot take more steps than the model
    was trained with timesteps). Raises ValueError naming ``flag``."""
    hi = max_steps(config)
    if not lo <= steps <= hi:
        raise ValueError(f"{flag} {steps}: expected {lo}..{hi} (at least {lo}; at most the "
                         f"model's {hi} training timesteps, num_train_timesteps of its "
                         "noise schedule)")
    return steps


def check_guidance(value: float, flag: str = "--guidance") -> float:
    """A CFG scale: finite and >= 0 (0: the unconditional branch alone, 1: the conditional
    one; a negative scale would push the video away from its prompt). Raises ValueError."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{flag} {value}: expected a finite CFG scale >= 0 (0 = unconditional "
                         "only, 1 = conditional only, > 1 = classifier-free guidance)")
    return value


def check_seed(value: int, flag: str = "--seed", count: int = 1) -> int:
    """A seed in ``0..MAX_SEED``; with ``count`` > 1 the run uses ``value .. value + count -
    1``, all in range. Raises ValueError naming ``flag``."""
    hi = MAX_SEED - (count - 1)
    if not 0 <= value <= hi:
        extra = (f" (the run's {count} videos take seeds {flag} .. {flag} + {count - 1}, "
                 f"each <= {MAX_SEED})" if count > 1 else "")
        raise ValueError(f"{flag} {value}: expected an integer 0..{hi}{extra}")
    return value
