"""One call to put the CODA cache on a diffusers pipeline: :func:`enable_cache` and
:func:`disable_cache` (re-exported as ``coda.enable_cache`` / ``coda.disable_cache``).

``enable_cache(pipe)`` finds the pipeline's transformers (``pipe.transformer`` and, for Wan
2.2's two experts, ``pipe.transformer_2``), makes a driver for the cache (``backend``), a
policy per transformer (by name, or an instance) and registers the engine
(:func:`coda.host.cache.engine.apply_coda_cache`) on each, plus one small hook per
transformer of this module's own (:class:`_PipelineHook`: step counts and cache contexts
where the pipeline gives none, the switch between Wan 2.2's experts, a self-check of the
first call's bits). It returns a :class:`CacheHandle`. :func:`disable_cache` removes every
hook: the transformers run their own forward again, with their parameters untouched.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

import torch
from diffusers.hooks import HookRegistry
from diffusers.hooks.hooks import ModelHook

from coda.host.cache.arch import get_architecture
from coda.host.cache.arch.base import (TESTED_DIFFUSERS, UnsupportedModelError,
                                       diffusers_tested)
from coda.host.cache.engine import (BATCHED_CFG, CodaCacheConfig, CodaCacheHook,
                                    apply_coda_cache, get_coda_cache_hook, remove_coda_cache)
from coda.host.cache.execution import check_execution
from coda.host.cache.forecast import CACHE_MODES
from coda.host.cache.policies import (MIN_CACHED_STEPS, POLICIES, CachePolicy, SchedulePolicy,
                                      as_policy, get_policy, policy_names, uniform_for_skip)
from coda.host.cache.policies.static import StaticPolicy
from coda.host.cache.schedule import ModelOps, Schedule

__all__ = ["enable_cache", "disable_cache", "CacheHandle", "BACKENDS", "EXPERTS",
           "SkipTargetPolicy", "PIPELINE_HOOK_NAME"]

#: the caches :func:`enable_cache` makes by name (or pass a driver object)
BACKENDS = ("device", "nmp")
#: a pipeline's transformer attributes, in the order a Wan 2.2 loop calls them
EXPERTS = ("transformer", "transformer_2")
PIPELINE_HOOK_NAME = "coda_cache_pipeline"
#: policies calibrated on a profile of the model (fbcache also runs with a given threshold)
_PROFILE_POLICIES = policy_names("needs_profile")
#: policies that run a searched schedule
_SCHEDULE_POLICIES = policy_names("needs_schedule")
_ATTR = "_coda_cache"          # the handle, on the pipeline (or bare transformer)
#: the rank memory of the default NMP driver, words per rank (the NMEConfig maximum)
_NMP_MEM_WORDS = 1 << 24


class SkipTargetPolicy(StaticPolicy):
    """``uniform`` or ``pab`` calibrated to a skip fraction for each run's step count and
    model, when it runs (:func:`coda.host.cache.policies.uniform_for_skip`,
    ``PABPolicy.for_skip``: what :func:`~coda.host.cache.policies.get_policy` does with
    ``skip``; once per shape): what ``enable_cache(pipe, name, skip=s)`` uses, since the
    step count is known only when the pipeline is called.

    A run too short to reuse anything (fewer than
    :data:`coda.host.cache.policies.MIN_CACHED_STEPS` steps: a Wan 2.2 expert's share of a
    short loop) computes every operator: the summary shows it.

    Args:
        name: ``"uniform"`` or ``"pab"``. skip: target fraction of operator executions
            reused, in (0, 1).
    Raises:
        ValueError: another name, a skip outside (0, 1).
    """

    def __init__(self, name: str, skip: float):
        if name not in ("uniform", "pab"):
            raise ValueError(f"policy {name!r} with skip: expected 'uniform' or 'pab'")
        _check_skip(skip)
        self.name, self.skip = name, float(skip)
        self._calibrated: dict = {}

    def calibrated(self, num_steps: int, ops: ModelOps) -> StaticPolicy:
        """The policy calibrated for ``num_steps`` steps of the model of ``ops``."""
        key = (num_steps, ops)
        if key not in self._calibrated:
            if num_steps < MIN_CACHED_STEPS:
                policy = SchedulePolicy(Schedule(num_steps, ops.num_layers, ops=ops))
            elif self.name == "uniform":
                policy = uniform_for_skip(self.skip, num_steps, ops.num_layers, ops=ops)
            else:
                from coda.host.cache.policies.pab import PABPolicy

                policy = PABPolicy.for_skip(self.skip, num_steps, ops.num_layers, ops=ops)
            self._calibrated[key] = policy
        return self._calibrated[key]

    def build(self, num_steps: int, num_layers: int) -> Schedule:
        return self.calibrated(num_steps, ModelOps.latte(num_layers)).build(num_steps, num_layers)

    def build_for(self, num_steps: int, ops: ModelOps) -> Schedule:
        return self.calibrated(num_steps, ops).build_for(num_steps, ops)

    def describe(self) -> dict:
        return {"name": self.name, "skip": self.skip,
                "calibrated": {f"{n} steps": p.describe()
                               for (n, _), p in self._calibrated.items()}}


def _check_skip(skip) -> None:
    try:
        ok = 0.0 < float(skip) < 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"skip={skip!r}: expected a fraction of operator executions to reuse, "
                         "in (0, 1)")


# ---------------------------------------------------------------- the handle
class CacheHandle:
    """What :func:`enable_cache` returns: the hooks, the driver, and the summary.

    Attributes:
        target: the pipeline (or bare transformer) the cache is on.
        modules: expert name (``"transformer"``, ``"transformer_2"``) -> its transformer.
        hooks: expert name -> its :class:`coda.host.cache.engine.CodaCacheHook` (its
            ``events``: the operator events, one :class:`~coda.host.cache.events.EventLog`
            per expert; ``policy``: the expert's own policy).
        driver: the cache (shared by the experts; slot keys are per hook).
        backend: ``"device"``, ``"nmp"`` or the driver's class name.
        self_checked: expert name -> True once its first-call self-check passed.
    """

    def __init__(self, target, modules: dict[str, torch.nn.Module], driver, backend: str,
                 cache: str, self_check: bool):
        self.target, self.modules, self.driver, self.backend = target, modules, driver, backend
        self.cache, self.self_check = cache, self_check
        self.hooks: dict[str, CodaCacheHook] = {}
        self.self_checked: dict[str, bool] = {}
        self.calibration: _Calibration | None = None
        self._run: dict[str, tuple[int, int]] = {}   # expert -> (generation, first step) of
        self._seen: dict[str, int] = {}              # the last run; its last generation seen

    # ---- during calls ---------------------------------------------------------------
    def _scheduler_steps(self) -> int | None:
        timesteps = getattr(getattr(self.target, "scheduler", None), "timesteps", None)
        try:
            return len(timesteps) if timesteps is not None and len(timesteps) > 0 else None
        except TypeError:
            return None

    def _default_context(self):
        """A context for a pipeline that sets none: both CFG branches batched as diffusers
        does when the pipeline guides, else the conditional branch; no step index."""
        from diffusers.hooks.hooks import CacheContext   # diffusers >= 0.41 (arch.base)

        guided = bool(getattr(self.target, "do_classifier_free_guidance", False))
        return CacheContext(BATCHED_CFG if guided else "cond")

    def _switch_to(self, expert: str) -> None:
        """End the other experts' running generations (the pipeline switched experts); one
        that was calibrating gets its policy now (its generation is complete)."""
        for name, hook in self.hooks.items():
            if name != expert and hook.state.generation is not None:
                if self.calibration is not None and name in self.calibration.pending:
                    self.calibration.finish(self, name)
                else:
                    hook.reset_state(self.modules[name])

    @property
    def profiles(self) -> dict:
        """Expert name -> the :class:`coda.host.cache.profile.Profile` measured by
        ``calibrate=True`` (empty before the first generation ends, or without it)."""
        return {} if self.calibration is None else dict(self.calibration.profiles)

    def _record(self, expert: str) -> None:
        """Note the expert's current generation as part of the pipeline's last run (a
        generation starting at step 0 starts a new run; one joining mid-loop joins it)."""
        hook = self.hooks[expert]
        gen = hook.events.generations - 1
        if gen < 0 or self._seen.get(expert) == gen:
            return
        self._seen[expert] = gen
        first = hook.state.first_step
        if first == 0:
            self._run = {}
        self._run[expert] = (gen, first)

    def _check_bits(self, expert: str, module, args, kwargs, output) -> None:
        """The first call's self-check: the transformer's own forward (its blocks unhooked:
        no step is running) must give the cached call's bits. Raises UnsupportedModelError
        otherwise, after ending the generation."""
        hook = self.hooks[expert]
        if any(e.reused for e in hook.events.of("op", hook.events.generations - 1)):
            return          # a first call that reused something (not possible): no check
        with torch.no_grad():
            plain = hook.fn_ref.original_forward(*args, **kwargs)
        got, want = _tensors(output), _tensors(plain)
        same = len(got) == len(want) and all(
            a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
            for a, b in zip(got, want))
        if not same:
            import diffusers

            hook.reset_state(module)
            worst = max((float((a.float() - b.float()).abs().max()) for a, b in zip(got, want)
                         if a.shape == b.shape), default=float("nan"))
            raise UnsupportedModelError(
                f"{expert} ({type(module).__name__}, diffusers {diffusers.__version__}): the "
                "CODA adapter's replay of a step that reuses nothing differs from the "
                f"model's own forward (largest difference {worst:g}); its block code is not "
                "what the adapter replays (tested on diffusers "
                f"{TESTED_DIFFUSERS}): disable the cache (coda.disable_cache) or use that version")
        self.self_checked[expert] = True

    # ---- reporting ------------------------------------------------------------------
    def summary(self, all_generations: bool = False) -> dict:
        """Counters of the pipeline's last run (``all_generations``: of every run since
        :func:`enable_cache`), counted from the engine's events
        (:meth:`coda.host.cache.events.EventLog.stats`).

        Returns:
            dict: ``ops_computed``, ``ops_reused`` (operator executions, per sample and CFG
            branch), ``ops_skipped_fraction`` (reused / all), ``segments``, ``segment_ops``,
            ``stores``, ``programs``, ``monitors``, ``fallbacks``, ``nme_cycles``,
            ``pcie_bytes`` (bytes over the host link to and from the DIMMs; 0 for the
            device cache), ``stored_bytes`` (bytes written to cache slots), summed over the
            experts; ``experts``: the same per expert (None for one that did not run),
            with ``first_step`` (the pipeline step its generation started at), ``steps`` and
            ``policy`` (its description); ``backend``, ``cache``, ``self_checked``;
            ``modelled_latency_s``: None with ``modelled_latency`` saying why (the system
            model replays the event streams of the shipped model and of the presets
            ``coda sim`` knows, not of a pipeline's own transformer).
        """
        per = {}
        for name, hook in self.hooks.items():
            if not all_generations and name not in self._run:
                per[name] = None
                continue
            gen, first = (None, None) if all_generations else self._run[name]
            stats = hook.events.stats(gen)
            ops = hook.events.of("op", gen)
            stats["stored_bytes"] = sum(e.stored_bytes for e in ops)
            stats["steps"] = len({(e.generation, e.step) for e in ops})
            stats["first_step"] = first
            stats["policy"] = hook.policy.describe()
            per[name] = stats
        ran = [s for s in per.values() if s is not None]
        keys = ("ops_computed", "ops_reused", "fallbacks", "segments", "segment_ops",
                "programs", "stores", "monitors", "nme_cycles", "pcie_bytes", "stored_bytes")
        out = {k: sum(s[k] for s in ran) for k in keys}
        total = out["ops_computed"] + out["ops_reused"]
        out["ops_skipped_fraction"] = out["ops_reused"] / total if total else 0.0
        out.update(experts=per, backend=self.backend, cache=self.cache,
                   self_checked=dict(self.self_checked), modelled_latency_s=None,
                   modelled_latency="not known for a pipeline's transformer: the system model "
                   "(coda.host.system, coda sim) replays the shipped model's events and the "
                   "presets of coda sim --model")
        return out


def _tensors(x) -> list[torch.Tensor]:
    """The tensors of a transformer's output (a tensor, a tuple, a diffusers output)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if hasattr(x, "to_tuple"):
        x = x.to_tuple()
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    return []


class _PipelineHook(ModelHook):
    """Outermost hook on one transformer of a pipeline. It

    - gives the engine the step count where the pipeline's ``cache_context`` has none (diffusers
      0.42's CogVideoX and HunyuanVideo pipelines): the pipeline scheduler's timesteps;
    - gives a call a cache context where the pipeline sets none (diffusers 0.42's LattePipeline):
      ``"uncond|cond"`` when the pipeline does classifier-free guidance, else ``"cond"``, steps
      placed by their timestep;
    - ends the other expert's generation when the pipeline switches experts (Wan 2.2 switches
      from ``transformer`` to ``transformer_2`` at the boundary step, and never back), freeing its
      cache slots; ``transformer_2`` is configured to join mid-loop
      (:attr:`coda.host.cache.engine.CodaCacheConfig.joins_mid_loop`), so it starts its own
      generation, with its own cache state and policy, at the boundary step;
    - checks once per transformer, on its first call (nothing is cached yet, so nothing is
      reused), that the cached forward gives the unhooked forward's bits (``self_check``; by
      default only with a diffusers other than
      :data:`coda.host.cache.arch.base.TESTED_DIFFUSERS`, whose block code the adapters were not
      checked against);
    - records which generation of each transformer belongs to the pipeline's last run, for
      :meth:`CacheHandle.summary`.
    """

    def __init__(self, handle: CacheHandle, expert: str, auto_steps: bool):
        super().__init__()
        self.handle, self.expert, self.auto_steps = handle, expert, auto_steps

    @torch.compiler.disable     # bookkeeping and the self-check: never traced
    def new_forward(self, module, *args, **kwargs):
        handle = self.handle
        hook = handle.hooks[self.expert]
        manager = hook.context_manager
        try:
            manager.context
            own = False
        except ValueError:          # the pipeline set no cache context
            own = True
            manager.set_context(handle._default_context())
        try:
            if self.auto_steps and manager.context.num_inference_steps is None:
                steps = handle._scheduler_steps()
                if steps is not None:
                    hook.config.num_inference_steps = steps
            handle._switch_to(self.expert)
            output = self.fn_ref.original_forward(*args, **kwargs)
            handle._record(self.expert)
            cal = handle.calibration
            if cal is not None and self.expert in cal.pending and cal.complete(hook):
                cal.finish(handle, self.expert)
            if handle.self_check and not handle.self_checked.get(self.expert):
                handle._check_bits(self.expert, module, args, kwargs, output)
            return output
        finally:
            if own:
                manager.set_context(None)


# ---------------------------------------------------------------- calibration on first use
class _Calibration:
    """``enable_cache(..., calibrate=True)``: each transformer's first generation runs the
    profiling policy on a profiling driver; when it is complete (:meth:`complete`) the
    profile is built from what was measured and the expert goes on with the named policy
    built from it, on the handle's own driver (:meth:`finish`)."""

    def __init__(self, name: str, skip, options: dict, path, experts):
        from coda.host.cache.profile import InputNormDriver, ProfilePolicy
        from coda.host.nme.backend import TorchBackend
        from coda.hw.nme.isa import NMEConfig

        self.name, self.skip, self.options = name, skip, dict(options)
        self.path = None if path is None else os.fspath(path)
        self.driver = InputNormDriver(TorchBackend(),
                                      NMEConfig(mem_words=_NMP_MEM_WORDS), ranks=2)
        self.pending = {expert: ProfilePolicy() for expert in experts}
        self.profiles: dict = {}
        self.two = len(experts) > 1

    @classmethod
    def for_args(cls, calibrate, path, policy, skip, profile, cache, options, modules):
        """The calibration ``enable_cache``'s arguments ask for, or None; ValueError for
        arguments it cannot serve (checked before any hook is placed)."""
        if not isinstance(calibrate, bool):
            raise ValueError(f"calibrate={calibrate!r}: expected True or False")
        if not calibrate:
            if path is not None:
                raise ValueError(f"profile_path={os.fspath(path)!r}: a calibrate=True option, "
                                 "expected none without it")
            return None
        need = policy_names("needs_profile")
        if not isinstance(policy, str) or policy not in need:
            raise ValueError(f"calibrate=True with policy {policy!r}: expected one calibrated "
                             f"on a profile ({', '.join(need)}); uniform and pab need none, "
                             "coda's schedule is searched by coda schedule search")
        if profile is not None:
            raise ValueError("calibrate=True and profile= are alternatives: the profile is "
                             "measured on the first generation; expected one")
        if cache != "reuse":
            raise ValueError(f"calibrate=True with cache={cache!r}: expected 'reuse' (forecast "
                             "alphas are calibrated for a schedule by coda schedule forecast)")
        import inspect

        allowed = [p.name for p in inspect.signature(POLICIES[policy].from_inputs)
                   .parameters.values() if p.kind is p.KEYWORD_ONLY]
        extra = sorted(set(options) - set(allowed))
        if extra:
            raise ValueError(f"policy {policy!r}: unknown parameters {extra}; expected "
                             f"{allowed or 'none'}")
        if skip is None and options.get("threshold") is None:
            raise ValueError(f"calibrate=True with policy {policy!r}: expected skip= (the "
                             "fraction to reuse, calibrated on the profile)"
                             + (" or threshold=" if "threshold" in allowed else ""))
        if policy == "fbcache" and "threshold" in options:
            raise ValueError("calibrate=True with fbcache and threshold=: that policy needs no "
                             "profile; expected no calibrate")
        return cls(policy, skip, options, path, list(modules))

    @staticmethod
    def complete(hook: CodaCacheHook) -> bool:
        """Whether the hook's generation has run its last step on every branch that ran
        (the engine then ends it: :meth:`CodaCacheHook._end_call`)."""
        st = hook.state
        ran = [b.last_step for b in st.branches.values() if b.last_step >= 0]
        return st.num_steps is not None and bool(ran) and all(s == st.num_steps - 1 for s in ran)

    def finish(self, handle: "CacheHandle", expert: str) -> None:
        """Build ``expert``'s profile and policy, save the profile (``profile_path``), and
        switch the expert to the policy and the handle's driver (its generation ended)."""
        from coda.host.cache.profile import ProfileBuilder, model_hash

        hook, module = handle.hooks[expert], handle.modules[expert]
        probe = self.pending.pop(expert)
        mine = [r for r in self.driver.records if r[0][0] == hook._tag]
        steps = max(index for _, index, _, _ in mine) + 1
        videos = max(key[2] for key, _, _, _ in mine) + 1
        builder = ProfileBuilder(hook.model_ops, videos, steps)
        builder.add(self.driver, probe, tag=hook._tag)
        guidance = getattr(handle.target, "guidance_scale", None)
        profile = builder.build({
            "model_hash": model_hash(module), "source": "coda.enable_cache(calibrate=True)",
            "prompts": [], "seeds": [], "videos": [[i, None] for i in range(videos)],
            "steps": steps, "first_step": hook.state.first_step,
            "guidance_scale": float(guidance) if isinstance(guidance, (int, float)) else 1.0})
        self.profiles[expert] = profile
        if self.path is not None:
            profile.save(os.path.join(self.path, expert) if self.two else self.path)
        policy = get_policy(self.name, skip=self.skip, profile=profile, **self.options)
        total = hook.state.num_steps
        if isinstance(policy, StaticPolicy) and total is not None and total > steps:
            # an expert whose generations end at the boundary (Wan 2.2's high-noise one):
            # its schedule for the steps it runs, nothing reused in the steps it never runs
            ran = policy.schedule_for(steps, hook.model_ops)
            policy = SchedulePolicy(Schedule(total, ran.num_layers, dict(ran.reuse),
                                             name=ran.name, ops=hook.model_ops))
        hook.swap(module, policy=policy, driver=handle.driver)


# ---------------------------------------------------------------- enable / disable
def enable_cache(pipe, policy: Any = "uniform", *, backend: Any = "device",
                 skip: float | None = None, cache: str = "reuse", profile: Any = None,
                 schedule: Any = None, forecast: Any = None, self_check: bool | None = None,
                 num_inference_steps: int | None = None, calibrate: bool = False,
                 profile_path: str | os.PathLike | None = None,
                 **policy_options) -> CacheHandle:
    """Put the CODA cache on a diffusers pipeline (or a bare transformer) in one call.

    Args:
        pipe: a diffusers pipeline whose ``transformer`` (and ``transformer_2``: Wan 2.2's
            low-noise expert, which gets its own hook, policy and cache state) is a
            ``LatteTransformer3DModel``, ``CogVideoXTransformer3DModel``,
            ``WanTransformer3DModel`` or ``HunyuanVideoTransformer3DModel``; or one such
            transformer (its loop must then give ``cache_context`` as the pipelines do).
        policy: a name of :data:`coda.host.cache.policies.POLICIES` (``"uniform"``,
            ``"pab"`` need nothing else; ``"teacache"``, ``"magcache"``, ``"fbcache"``,
            ``"lemica"`` a ``profile``; ``"coda"``, ``"coda-lat"``, ``"coda+dra"`` a
            ``schedule``), a policy object (e.g. ``UniformIntervalPolicy(...)``,
            ``PABPolicy(...)``: the policies are typed dataclasses; a second expert gets a
            copy), a :class:`coda.host.cache.schedule.Schedule`, or a mapping from expert
            name (``"transformer"``, ``"transformer_2"``) to any of these.
        backend: where the cache lives: ``"device"`` (default; slots in the model's device
            memory, :class:`coda.host.cache.device.DeviceCache`), ``"nmp"`` (the DIMM-NMP:
            :class:`coda.host.nmp.driver.NMPDriver` over the NMEs' torch backend, 8 lanes,
            2 ranks of 2**24 words), or a driver object (e.g. an ``NMPDriver`` over
            ``get_backend("rtl")``, the Verilated NMEs).
        skip: target fraction of operator executions reused, in (0, 1), for a policy by
            name: uniform and PAB are calibrated to it per run (step count and model, when
            the pipeline runs: :class:`SkipTargetPolicy`); the profile policies on the
            profile. None: the policy's own defaults or ``policy_options``.
        cache: ``"reuse"`` (default: a reused operator contributes its last computed output)
            or ``"forecast"`` (a damped extrapolation of the last two; needs ``forecast``
            and a static policy).
        profile: for the profile policies: a profile of this model
            (``coda.experiments.profile.profile_model`` with a ``CFGLoop``; a loaded
            ``Profile``; one profile serves every expert), or a mapping expert name ->
            profile.
        schedule: for ``coda`` / ``coda-lat`` / ``coda+dra``: the
            :class:`~coda.host.cache.schedule.Schedule` searched for this model and step
            count, or a mapping expert name -> schedule.
        forecast: the :class:`coda.host.cache.forecast.ForecastTable` of
            ``cache="forecast"`` (calibrated for the schedule and step count; a second
            expert's steps are its own, from the boundary), or a mapping expert name ->
            table.
        self_check: check on each transformer's first call that the cached forward gives
            the unhooked one's bits (a second forward, once); None (default): only when
            the installed diffusers is not the tested one.
        num_inference_steps: the step count for pipelines whose ``cache_context`` gives
            none; default: the length of ``pipe.scheduler.timesteps`` at each call.
        calibrate: for a policy calibrated on a profile (``"teacache"``, ``"magcache"``,
            ``"fbcache"``, ``"lemica"``) given without ``profile``: the first generation of
            each transformer runs at full compute while it is profiled (every operator's
            output and input change measured on the NMEs' torch backend, as ``coda
            profile`` does), then its policy is built from that profile (the same as
            ``get_policy(name, skip=..., profile=...)``) and the cache goes on with it from
            the next generation. ``handle.profiles`` holds the profiles.
        profile_path: with ``calibrate``: a folder to save the profiles to
            (``profile.npz``, or ``<expert>/profile.npz`` for two transformers), to pass
            as ``profile=Profile.load(...)`` next time.
        **policy_options: the named policy's own parameters (``interval``, ``warmup`` for
            uniform; ``ranges``, ``windows`` for PAB; ``threshold``; ``thresholds`` for
            coda+dra).
    Returns:
        a :class:`CacheHandle` (``summary()``: a dict of the last run's counters).
    Raises:
        ValueError: a pipeline without a transformer; one that already has the cache;
            an unknown policy name or backend; a ``skip`` outside (0, 1); ``skip`` or
            options with a policy object; a profile or schedule missing (the message says
            how to make one), or given as a path; a ``cache`` mode other than the two, or
            ``"forecast"`` without a table; the policy's own errors.
            An offload hook, parallelism or another cache on a transformer that the engine
            does not run exactly (:func:`coda.host.cache.execution.check_execution`: one
            line naming it and what to do; also at every call, for one added later).
        coda.host.cache.arch.UnsupportedModelError (a TypeError): a transformer class the
            engine does not serve, or one without the structure its adapter reads.
        TypeError: a policy or driver that is not one.
    """
    if getattr(pipe, _ATTR, None) is not None:
        raise ValueError(f"{type(pipe).__name__} already has the CODA cache: call "
                         "coda.disable_cache(pipe) first")
    modules = _experts(pipe)
    if cache not in CACHE_MODES:
        raise ValueError(f"cache={cache!r}: expected one of {', '.join(CACHE_MODES)}")
    if cache == "forecast" and forecast is None:
        raise ValueError("cache='forecast' needs forecast=ForecastTable: alphas calibrated for "
                         "the schedule and step count (coda schedule forecast, "
                         "coda.experiments.forecast_calibration); enable_cache does not "
                         "calibrate one")
    if skip is not None:
        _check_skip(skip)
    for name, module in modules.items():
        arch = get_architecture(module)
        arch.check_structure(module)
        check_execution(module, arch.blocks(module))
        if get_coda_cache_hook(module) is not None:
            raise ValueError(f"{name} already has a CODA cache hook (apply_coda_cache): "
                             "remove it first (remove_coda_cache)")
    calibration = _Calibration.for_args(calibrate, profile_path, policy, skip, profile, cache,
                                        policy_options, modules)
    if calibration is None:
        policies = {name: _policy(policy, name, i, skip, profile, schedule, policy_options)
                    for i, name in enumerate(modules)}
    else:
        policies = {name: calibration.pending[name] for name in modules}
    driver, label = _driver(backend)
    check = (not diffusers_tested()) if self_check is None else bool(self_check)
    handle = CacheHandle(pipe, modules, driver, label, cache, check)
    handle.calibration = calibration
    auto_steps = num_inference_steps is None
    try:
        for name, module in modules.items():
            config = CodaCacheConfig(driver if calibration is None else calibration.driver,
                                     policies[name], cache=cache,
                                     forecast=_per_expert(forecast, name, "forecast"),
                                     num_inference_steps=num_inference_steps,
                                     joins_mid_loop=name != EXPERTS[0])
            handle.hooks[name] = apply_coda_cache(module, config)
            HookRegistry.check_if_exists_or_initialize(module).register_hook(
                _PipelineHook(handle, name, auto_steps), PIPELINE_HOOK_NAME)
    except BaseException:
        _remove(handle)
        raise
    setattr(pipe, _ATTR, handle)
    return handle


def disable_cache(pipe) -> bool:
    """Remove what :func:`enable_cache` put on ``pipe`` (a pipeline or bare transformer):
    every hook, the cache slots; the transformers run their own forward again, their
    parameters untouched. Returns True if there was a cache, False if not."""
    handle = getattr(pipe, _ATTR, None)
    if handle is None:
        return False
    _remove(handle)
    delattr(pipe, _ATTR)
    return True


def _remove(handle: CacheHandle) -> None:
    """Unregister the handle's hooks (the outer one first), freeing the cache slots."""
    for name, module in handle.modules.items():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None and registry.get_hook(PIPELINE_HOOK_NAME) is not None:
            registry.remove_hook(PIPELINE_HOOK_NAME, recurse=False)
        hook = handle.hooks.get(name)
        if hook is not None and get_coda_cache_hook(module) is hook:
            remove_coda_cache(module)


def _experts(pipe) -> dict[str, torch.nn.Module]:
    """Expert name -> transformer of a pipeline (or ``{"transformer": pipe}`` for a bare
    transformer). Raises ValueError for an object with none."""
    if isinstance(pipe, torch.nn.Module):
        get_architecture(pipe)            # UnsupportedModelError naming the class
        return {EXPERTS[0]: pipe}
    out = {name: getattr(pipe, name) for name in EXPERTS
           if isinstance(getattr(pipe, name, None), torch.nn.Module)}
    if not out:
        raise ValueError(f"{type(pipe).__name__}: expected a diffusers pipeline with a "
                         "transformer (pipe.transformer, and pipe.transformer_2 for Wan 2.2) "
                         "or a video transformer")
    return out


def _driver(backend):
    """(driver, label) for a backend name or a driver object."""
    if isinstance(backend, str):
        if backend == "device":
            from coda.host.cache.device import DeviceCache

            return DeviceCache(), "device"
        if backend == "nmp":
            from coda.host.nme.backend import TorchBackend
            from coda.host.nmp.driver import NMPDriver
            from coda.hw.nme.isa import NMEConfig

            return NMPDriver(TorchBackend(), NMEConfig(mem_words=_NMP_MEM_WORDS),
                             ranks=2), "nmp"
        raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)} or a "
                         "driver object (e.g. coda.host.nmp.driver.NMPDriver)")
    missing = [m for m in ("store", "segment", "free", "__contains__") if not hasattr(backend, m)]
    if missing:
        raise TypeError(f"backend {type(backend).__name__}: expected {', '.join(BACKENDS)} or a "
                        f"driver with store, segment, free (missing {', '.join(missing)})")
    return backend, type(backend).__name__


def _per_expert(value, expert: str, what: str):
    if isinstance(value, Mapping):
        if expert not in value:
            raise ValueError(f"{what}: a mapping without {expert!r}; expected one entry per "
                             f"transformer ({', '.join(EXPERTS)})")
        return value[expert]
    return value


def _policy(policy, expert: str, index: int, skip, profile, schedule, options) -> CachePolicy:
    """The policy of one expert (:func:`enable_cache`'s ``policy`` argument)."""
    policy = _per_expert(policy, expert, "policy")
    if not isinstance(policy, str):
        if skip is not None or options:
            raise ValueError(f"skip / {sorted(options) or 'options'} go with a policy by name; "
                             f"got a {type(policy).__name__}: configure the object itself")
        resolved = as_policy(policy)       # TypeError for anything else
        return copy.deepcopy(resolved) if index else resolved
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: expected one of {', '.join(POLICIES)}, "
                         "a CachePolicy or a Schedule")
    if policy in ("uniform", "pab") and skip is not None:
        if options:
            raise ValueError(f"policy {policy!r}: skip and {sorted(options)} are alternatives "
                             "(skip calibrates them)")
        return SkipTargetPolicy(policy, skip)
    if policy in _PROFILE_POLICIES:
        prof = _per_expert(profile, expert, "profile")
        if isinstance(prof, (str, os.PathLike)):
            raise ValueError(f"profile={str(prof)!r}: pass the loaded profile, "
                             "coda.host.cache.profile.Profile.load(path) (this module does "
                             "not read profile files)")
        if prof is None and not (policy == "fbcache" and "threshold" in options):
            raise ValueError(
                f"policy {policy!r} needs profile=: a profile of this model, or calibrate=True "
                "to measure one on the first generation (at full compute; profile_path= saves "
                "it), or coda.experiments.profile.profile_model over a "
                "coda.experiments.cfg_loop.CFGLoop of the transformer (docs/cache-engine.md, "
                "Profiles of any model). 'uniform' and 'pab' need none")
        return get_policy(policy, skip=skip, profile=prof, **options)
    if policy in _SCHEDULE_POLICIES:
        sched = _per_expert(schedule, expert, "schedule")
        if not isinstance(sched, Schedule):
            raise ValueError(
                f"policy {policy!r} needs schedule=: the Schedule searched for this model and "
                "step count (coda.experiments.search on a profile of it, docs/scheduler.md; "
                f"got {type(sched).__name__}). 'uniform' and 'pab' need none")
        return get_policy(policy, skip=skip, schedule=sched, **options)
    return get_policy(policy, **options)
