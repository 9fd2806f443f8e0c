"""Cross-timestep cache engine for diffusers video transformers (Latte, CogVideoX, Wan,
HunyuanVideo: :mod:`coda.host.cache.arch`), with the cache operators executed on the DIMM-NMP
through :class:`coda.host.nmp.driver.NMPDriver`.

Follows diffusers' hook conventions (``diffusers.hooks``): a :class:`CodaCacheConfig`, a
:class:`CodaCacheState` with ``reset()``, a stateful :class:`CodaCacheHook` (``ModelHook``)
with one block hook per transformer block, and :func:`apply_coda_cache`. The denoising loop
tells the hook where it is with ``transformer.cache_context(name, step_index=i,
num_inference_steps=n)``, ``name`` the CFG branch (``"cond"``, ``"uncond"``, or
:data:`BATCHED_CFG` for both batched in one call); how calls without ``step_index`` are
placed: :class:`CodaCacheHook`. This module holds the hooks, their configuration and the
generation's bookkeeping; one step's forward is :class:`coda.host.cache.step.StepRun`, its
segments :mod:`coda.host.cache.segments`; all it does is emitted as operator events
(:mod:`coda.host.cache.events`) into ``hook.events``. What the hooks do per operator, the
two segment forms and the cache slots: ``docs/cache-engine.md``, "How a step runs".
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Hashable

import torch
from diffusers.hooks.hooks import ModelHook, StateManager

from coda.host.cache.arch import Architecture, get_architecture
from .arch.base import BlockSpec
from coda.host.cache.compress import check_format, resolve_group
from coda.host.cache.events import CACHE_MEMORIES, EventLog
from coda.host.cache.execution import check_execution
from coda.host.cache.forecast import CACHE_MODES, ForecastTable
from coda.host.nmp.link import SEGMENT_OUTPUTS, check_segment_output   # segment_output's forms
from coda.host.cache.policies import as_policy
from .policies.base import CachePolicy
from .policies.static import StaticPolicy
from coda.host.cache.schedule import BRANCHES
from coda.host.cache.step import PRIMARY, StepRun

__all__ = ["BATCHED_CFG", "SEGMENT_OUTPUTS", "CodaCacheConfig", "CodaCacheState", "CodaCacheHook",
           "apply_coda_cache", "remove_coda_cache", "reset_coda_cache", "get_coda_cache_hook",
           "coda_generation", "HOOK_NAME", "BLOCK_HOOK_NAME"]

HOOK_NAME = "coda_cache"
BLOCK_HOOK_NAME = "coda_cache_block"
BATCHED_CFG = "uncond|cond"
#: context names of diffusers pipelines meaning a batched CFG call (CogVideoX: [uncond; cond])
_CONTEXT_ALIASES = {"cond_uncond": BATCHED_CFG}
_NME_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_NAMES = {v: k for k, v in _NME_DTYPES.items()}
_hook_ids = itertools.count()


@dataclass
class CodaCacheConfig:
    """Configuration of the cache engine.

    Attributes:
        driver: the NMP driver (``coda.host.nmp.driver.NMPDriver``) holding the cache slots and
            running segments; anything with its ``store/segment/free/__contains__`` and
            ``stats["bytes_written"]`` works (``segment_submit`` for overlapped segments and
            ``l1_to_slot``, ``wait`` for monitors are used where present / needed). The cache
            in the xPU's own memory (system b) is
            :class:`coda.host.cache.device.DeviceCache`; a driver's ``cache_memory``
            (default ``"nmp"``) goes into every event
            (:data:`coda.host.cache.events.CACHE_MEMORIES`). The engine runs on the device
            of the model's tensors (``model.to(device)``; an NMP driver takes a segment's
            inputs from there and returns its output there).
        policy: a :class:`coda.host.cache.policies.base.CachePolicy` (e.g.
            ``UniformIntervalPolicy()``, ``SchedulePolicy(schedule)``, a DRA wrapper), or a
            :class:`coda.host.cache.schedule.Schedule` (run as a ``SchedulePolicy``).
        cache_dtype: NME element format; default: from ``driver.cfg.fmt`` (bf16 if absent).
            Must agree with the driver's format.
        keep_slots: keep the cache slots after a generation's last step (default: free them,
            so an idle model holds no rank memory).
        events: where events go (default: a new :class:`EventLog`, ``hook.events``).
        interleave_cfg: in a call that batches both CFG branches, run each branch's blocks
            as its own trunk and switch trunks whenever one launches a segment, so the xPU
            computes one branch while the NMEs run the other's segment (CODA's CFG-interleaved
            pipelining; the bits are those of the plain order, see the tests).
        num_inference_steps: the generation's step count, for pipelines whose
            ``cache_context`` does not give it (diffusers 0.42's CogVideoX and HunyuanVideo
            pipelines); the context's value wins when it has one.
        segment_output: ``"sum"`` (default: the NME returns ``Σ g_k ⊙ c_k`` and the xPU adds
            the residual in the model's dtype) or ``"residual"`` (the NME adds the residual
            in the cache format); see ``docs/cache-engine.md``, "How a step runs".
        cache: what a reused operator contributes (:data:`coda.host.cache.forecast.CACHE_MODES`):
            ``"reuse"`` (default) its last computed output, ``"forecast"``
            ``(1 + alpha) c_k - alpha c_k'`` from its last two (both kept in rank memory; a
            static policy stores for it), alpha from ``forecast``.
        forecast: the :class:`coda.host.cache.forecast.ForecastTable` of ``cache="forecast"``
            (its step count must be the generation's).
        cache_format: how a computed output is kept in rank memory
            (:data:`coda.host.cache.compress.CACHE_FORMATS`): ``"bf16"`` (default) in the
            NME's 16-bit format, ``"int8"`` quantised per group of ``cache_group`` channels
            (about half the bytes; the NMEs dequantise in the segment,
            :mod:`coda.host.cache.compress`). Composes with ``cache="forecast"`` (both
            entries int8). Needs a driver with ``store_int8``.
        cache_group: G, channels per int8 scale (int8 only): a divisor of the hidden size C
            and a multiple of the NME's lanes; default (None) the largest such G up to 64
            (:func:`coda.host.cache.compress.resolve_group`).
        joins_mid_loop: the model is an expert that a pipeline switches to mid-loop (Wan
            2.2's low-noise ``transformer_2``): a call with ``step_index`` k > 0 while no
            generation runs (or at or before the running one's first step, a loop started
            again) starts a generation at k. Its policy, events and slots then count from
            that call: step 0 is the pipeline's step k, ``num_steps`` is n - k, and
            ``hook.state.first_step`` is k (a static policy warms up on the expert's own
            first steps). Calls with ``step_index`` 0 and calls without one behave as
            without it. Default False: such a call is refused.
    Raises (on apply):
        ValueError: a ``cache_dtype`` that is not bf16/fp16 or disagrees with the driver; a
            ``num_inference_steps`` below 1; a ``segment_output`` other than the two; a
            ``cache`` mode other than the two, or ``"forecast"`` without a table; a
            ``cache_format`` other than the two, int8 on a driver without ``store_int8``, a
            ``cache_group`` that does not divide C or is not a multiple of the lanes.
    """
    driver: Any
    policy: Any = None
    cache_dtype: torch.dtype | None = None
    keep_slots: bool = False
    events: EventLog | None = None
    interleave_cfg: bool = True
    num_inference_steps: int | None = None
    segment_output: str = "sum"
    cache: str = "reuse"
    forecast: Any = None
    cache_format: str = "bf16"
    cache_group: int | None = None
    joins_mid_loop: bool = False

    @property
    def history(self) -> int:
        """Computed outputs kept per reused operator: 2 in forecast mode, else 1."""
        return 2 if self.cache == "forecast" else 1

    def resolved_dtype(self) -> torch.dtype:
        fmt = getattr(getattr(self.driver, "cfg", None), "fmt", None)
        if fmt is not None and fmt not in _NME_DTYPES:
            raise ValueError(f"driver cfg.fmt={fmt!r}: expected one of {sorted(_NME_DTYPES)}")
        if self.cache_dtype is None:
            return _NME_DTYPES[fmt or "bf16"]
        if self.cache_dtype not in _NME_DTYPES.values():
            raise ValueError(f"cache_dtype={self.cache_dtype}: expected torch.bfloat16 or torch.float16")
        if fmt is not None and _NME_DTYPES[fmt] != self.cache_dtype:
            raise ValueError(f"cache_dtype={self.cache_dtype} disagrees with the driver's NME "
                             f"format {fmt!r} ({_NME_DTYPES[fmt]}): leave cache_dtype unset or "
                             "make them equal")
        return self.cache_dtype


@dataclass
class _BranchState:
    last_step: int = -1
    timestep: float | None = None               # of the last call, if it gave no step_index
    slots: dict = field(default_factory=dict)   # key -> (shape, step written)
    kept: dict = field(default_factory=dict)    # key -> (shape, step kept, Σ|x_ref| fp32)
    inputs: dict = field(default_factory=dict)  # sample -> [(step, block-0 input fp32)], last 3
    outputs: dict = field(default_factory=dict)  # sample -> [(step, model output fp32)], last 3


class CodaCacheState:
    """Per-generation state: the generation in the event log, per-branch step counters, cache
    slots and kept monitor references, the transformer calls and segments so far, and the
    pipeline step of the generation's step 0 (``first_step``: above 0 only for an expert
    that joined mid-loop, :attr:`CodaCacheConfig.joins_mid_loop`)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.generation: int | None = None
        self.num_steps: int | None = None
        self.first_step = 0
        self.branches: dict[str, _BranchState] = {b: _BranchState() for b in BRANCHES}
        self.calls = 0
        self.segments = 0      # segment ids issued in this generation


def _timestep_value(t) -> float | None:
    """A call's timestep (a number or a tensor: its largest element) as a float; None for
    none, an empty or non-numeric one, or a non-finite value."""
    if t is None:
        return None
    try:
        value = float(torch.as_tensor(t).detach().max())
    except (TypeError, ValueError, RuntimeError):
        return None
    return value if math.isfinite(value) else None


def _parse_branches(name: str, batch: int) -> list[str]:
    parts = _CONTEXT_ALIASES.get(name, name).split("|")
    if any(p not in BRANCHES for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"cache context name {name!r}: expected 'cond', 'uncond' or "
                         f"branches joined by '|' such as {BATCHED_CFG!r}")
    if batch % len(parts):
        raise ValueError(f"batch {batch} does not split into {len(parts)} equal CFG chunks ({name!r})")
    per = batch // len(parts)
    return [p for p in parts for _ in range(per)]


class CodaCacheHook(ModelHook):
    """Stateful hook on the transformer: a forward with cross-timestep caching (its blocks
    carry :class:`_BlockHook` s that hand their calls to the running step).

    Context names: ``name`` is the CFG branch of the call (``"cond"`` or
    ``"uncond"``) or, for both branches batched in one call, the branches of equal consecutive
    batch chunks joined by ``"|"`` (:data:`BATCHED_CFG` = ``"uncond|cond"``, diffusers' order;
    CogVideoX's pipeline says ``"cond_uncond"`` for the same). A context without ``step_index``
    (diffusers 0.42's CogVideoX and HunyuanVideo pipelines) counts steps per branch from 0; one
    without ``num_inference_steps`` takes ``CodaCacheConfig.num_inference_steps``.

    Where a generation starts: a call with ``step_index=0`` starts one; so does any call when
    none is running (a generation ends after its last step, on ``reset_coda_cache`` / diffusers'
    ``_reset_stateful_cache``, which pipelines call when their ``__call__`` ends, and on an
    exception in a call or in :func:`coda_generation`). A call without ``step_index`` while one
    is running is placed by its timestep (the context's ``timestep``, else the call's
    ``timestep`` argument, its largest element): denoising lowers it every step, so a timestep
    not below the one of the branch's previous call starts a new generation at step 0 (a loop
    broken off and started again), a lower one is the next step. A call it cannot place (a
    missing or non-finite timestep, a generation whose earlier calls gave ``step_index``,
    branches of one call that disagree) raises ValueError rather than guess; so does a scheduler
    that repeats a timestep within a generation (second-order ones such as Heun's): give
    ``step_index`` there.

    An expert a pipeline switches to mid-loop (Wan 2.2's low-noise ``transformer_2``, called
    from the boundary step on) is configured with ``CodaCacheConfig(joins_mid_loop=True)``: its
    first call at ``step_index`` k > 0 starts its own generation there, whose steps k..n-1 are
    its steps 0..n-k-1 (``state.first_step`` = k). Without it such a call is refused, as any
    call at a step above 0 without a running generation.

    Attributes:
        config: the :class:`CodaCacheConfig`. policy: the resolved policy.
        state: the :class:`CodaCacheState`. events: the :class:`EventLog`.
        arch: the :class:`coda.host.cache.arch.Architecture`; model_ops: the model's operators
        (:class:`coda.host.cache.schedule.ModelOps`); num_layers: ``model_ops.num_layers``.
    """
    _is_stateful = True

    def __init__(self, config: CodaCacheConfig):
        super().__init__()
        self.config = config
        if config.num_inference_steps is not None and int(config.num_inference_steps) < 1:
            raise ValueError(f"num_inference_steps={config.num_inference_steps}: expected >= 1")
        check_segment_output(config.segment_output)
        if config.cache not in CACHE_MODES:
            raise ValueError(f"cache={config.cache!r}: expected one of {', '.join(CACHE_MODES)}")
        if config.cache == "forecast" and not isinstance(config.forecast, ForecastTable):
            raise ValueError("cache='forecast' needs a ForecastTable (forecast=...), "
                             f"got {type(config.forecast).__name__}")
        self.dtype = config.resolved_dtype()
        self.fmt = _DTYPE_NAMES[self.dtype]
        self.cache_memory = getattr(config.driver, "cache_memory", "nmp")
        if self.cache_memory not in CACHE_MEMORIES:
            raise ValueError(f"driver cache_memory={self.cache_memory!r}: expected one of "
                             f"{', '.join(CACHE_MEMORIES)}")
        check_format(config.cache_format)
        if config.cache_format == "int8" and not hasattr(config.driver, "store_int8"):
            raise ValueError(f"cache_format='int8' needs a driver with store_int8 "
                             f"({type(config.driver).__name__} has none)")
        if config.cache_format != "int8" and config.cache_group is not None:
            raise ValueError(f"cache_group={config.cache_group}: an int8 option, expected "
                             f"none with cache_format={config.cache_format!r}")
        self.group: int | None = None     # G of int8 entries, set for the model's C
        self.policy: CachePolicy = as_policy(config.policy)
        if config.cache == "forecast" and not isinstance(self.policy, StaticPolicy):
            raise ValueError(f"cache='forecast' with policy {self.policy.name!r}: expected a "
                             "static policy (uniform, pab, magcache, coda): the alphas are "
                             "calibrated for a schedule's computed steps")
        self.events = config.events if config.events is not None else EventLog()
        self.state = CodaCacheState()
        # diffusers' cache_context() delivers the CacheContext to StateManager attributes.
        self.context_manager = StateManager(CodaCacheState)
        self._tag = f"coda{next(_hook_ids)}"
        self._last_generation: int | None = None
        self._run: StepRun | None = None

    def initialize_hook(self, module):
        self.arch: Architecture = get_architecture(module)
        self.arch.check_model(module)
        self.model_ops = self.arch.model_ops(module)
        self.num_layers = self.model_ops.num_layers
        # a gate is one [C] vector per NME program: C must fill whole words of `lanes`
        cfg, lanes = module.config, getattr(getattr(self.config.driver, "cfg", None), "lanes", None)
        channels = getattr(cfg, "num_attention_heads", 0) * getattr(cfg, "attention_head_dim", 0)
        if lanes and channels and channels % lanes:
            raise ValueError(f"{type(module).__name__}: hidden size {channels} is not a multiple "
                             f"of the NME's {lanes} lanes (a per-channel gate fills whole words); "
                             "use a driver whose lanes divide it")
        if self.config.cache_format == "int8":
            self.group = resolve_group(channels, lanes or 1, self.config.cache_group)
        return module

    @property
    def stats(self) -> dict:
        """Counters of the current (or last) generation (:meth:`EventLog.stats`) plus
        ``calls`` (its transformer forwards); zeros before the first one or after a reset."""
        out = self.events.stats(-1 if self._last_generation is None else self._last_generation)
        out["calls"] = self.state.calls
        return out

    def swap(self, module, *, policy=None, driver=None) -> None:
        """End the running generation (its slots freed) and go on with another ``policy``
        and/or ``driver`` (what :func:`coda.enable_cache` does after calibrating on the first
        generation). Raises what the constructor raises for them (a driver without the
        NME lanes the model needs, a policy that the cache mode cannot serve)."""
        self.reset_state(module)
        if driver is not None:
            memory = getattr(driver, "cache_memory", "nmp")
            if memory not in CACHE_MEMORIES:
                raise ValueError(f"driver cache_memory={memory!r}: expected one of "
                                 f"{', '.join(CACHE_MEMORIES)}")
            self.config.driver, self.cache_memory = driver, memory
            self.initialize_hook(module)        # the lanes and int8 group of this driver
        if policy is not None:
            policy = as_policy(policy)
            if self.config.cache == "forecast" and not isinstance(policy, StaticPolicy):
                raise ValueError(f"cache='forecast' with policy {policy.name!r}: expected a "
                                 "static policy")
            self.policy = policy

    # ---- generation bookkeeping -------------------------------------------------
    def reset_state(self, module):
        for branch in self.state.branches.values():
            self._free_slots(branch)
        self.state.reset()
        self._last_generation = None
        return module

    def _free_slots(self, branch: _BranchState) -> None:
        for key in list(branch.slots) + list(branch.kept):
            if key in self.config.driver:
                self.config.driver.free(key)
        branch.slots.clear()
        branch.kept.clear()

    def _begin_call(self, ctx, branches: list[str], call_args: dict) -> int:
        n = ctx.num_inference_steps if ctx.num_inference_steps is not None \
            else self.config.num_inference_steps
        if n is None:
            raise ValueError("the cache context gives no num_inference_steps: call "
                             "transformer.cache_context('cond', step_index=i, num_inference_steps=n) "
                             "or, for a pipeline that does not, set "
                             "CodaCacheConfig(num_inference_steps=n)")
        st = self.state
        names = list(dict.fromkeys(branches))
        timestep = None
        if ctx.step_index is None:
            timestep = _timestep_value(ctx.timestep if ctx.timestep is not None
                                       else call_args.get("timestep"))
            step = self._counted_step(names, timestep)
        else:
            step = int(ctx.step_index)
        n = int(n)
        if not 0 <= step < n:
            raise ValueError(f"step_index={step}: expected 0..{n - 1}")
        if ctx.step_index is not None and step > 0 and self._joins_at(step, names):
            self._start_generation(n - step, first_step=step)
        elif step == 0 and (st.generation is None
                            or any(st.branches[b].last_step >= 0 for b in names)):
            self._start_generation(n)
        elif st.generation is None:
            raise ValueError(f"step {step} without a generation: start it at step 0 "
                             "(reset between generations); an expert that a pipeline switches "
                             "to mid-loop (Wan 2.2's transformer_2) needs "
                             "CodaCacheConfig(joins_mid_loop=True)")
        elif n != st.first_step + st.num_steps:
            raise ValueError(f"num_inference_steps changed to {n} at step {step}: "
                             "start the new generation at step 0")
        if ctx.step_index is not None:      # the generation's own step (0 at its first call)
            step -= st.first_step
        for name in names:
            branch = st.branches[name]
            if step != branch.last_step + 1:
                raise ValueError(f"branch {name}: step {step} after step {branch.last_step}; "
                                 "steps must run in order from 0 (reset between generations)")
            branch.last_step, branch.timestep = step, timestep
        st.calls += 1
        return step

    def _counted_step(self, names: list[str], timestep: float | None) -> int:
        """The step of a call whose context has no step_index: 0 when no generation is
        running or when ``timestep`` is not below the last one of the branches that ran in
        it (a new generation), else one after the branches' last step (they must agree).
        Raises ValueError where that cannot be told (see :class:`CodaCacheHook`)."""
        st = self.state
        if st.generation is None:
            return 0
        ran = {b: st.branches[b] for b in names if st.branches[b].last_step >= 0}
        if ran:
            unknown = ("its timestep is missing or not a finite number" if timestep is None
                       else "the generation's earlier calls gave step_index"
                       if any(b.timestep is None for b in ran.values()) else None)
            restart = {} if unknown else {name: timestep >= b.timestep for name, b in ran.items()}
            if len(set(restart.values())) > 1:
                unknown = (f"its timestep {timestep:g} is not below the last one of branches "
                           f"{[b for b, r in restart.items() if r]} but is below that of "
                           f"{[b for b, r in restart.items() if not r]}")
            if unknown:
                steps = sorted({b.last_step + 1 for b in ran.values()})
                raise ValueError(f"cache context {'|'.join(names)!r} without step_index: cannot "
                                 "tell whether this call continues the running generation "
                                 f"(step {steps[0] if len(steps) == 1 else steps}) or starts a "
                                 f"new one: {unknown}; give step_index in the cache context "
                                 "(transformer.cache_context(name, step_index=i)) or reset "
                                 "between generations (reset_coda_cache)")
            if all(restart.values()):
                return 0
        steps = {st.branches[b].last_step + 1 for b in names}
        if len(steps) != 1:
            raise ValueError(f"branches {names} are at different steps {sorted(steps)}: give "
                             "step_index in the cache context")
        return steps.pop()

    def _joins_at(self, step: int, names: list[str]) -> bool:
        """Whether a call with ``step_index`` ``step`` > 0 starts a generation there: only
        for an expert configured to join mid-loop, when none runs, or when the call is not
        after the running one's first step for branches that already ran in it (the
        pipeline's loop started again)."""
        st = self.state
        if not self.config.joins_mid_loop:
            return False
        return (st.generation is None or step < st.first_step
                or (step == st.first_step and any(st.branches[b].last_step >= 0 for b in names)))

    def _start_generation(self, num_steps: int, first_step: int = 0) -> None:
        if self.config.cache == "forecast":     # alphas of this step count and schedule
            self.config.forecast.check_for(None, num_steps, self.policy._schedule(
                num_steps, self.num_layers, self.model_ops))
        for branch in self.state.branches.values():
            self._free_slots(branch)
        self.state.reset()
        self.state.num_steps, self.state.first_step = num_steps, first_step
        self.state.generation = self._last_generation = self.events.start_generation()
        self.policy.reset()

    def _end_call(self) -> None:
        """After a call: a generation whose every branch that ran has done its last step is
        over; its slots are freed unless ``keep_slots``."""
        st = self.state
        ran = [b for b in st.branches.values() if b.last_step >= 0]
        if ran and all(b.last_step == st.num_steps - 1 for b in ran):
            if not self.config.keep_slots:
                for branch in st.branches.values():
                    self._free_slots(branch)
            st.generation = None

    def _abort_generation(self) -> None:
        """A call ended by an exception: the generation cannot go on. Release the scratch of
        the segments it launched and did not take (the driver's ``release_open``, if it has
        one), free every slot it holds (also with ``keep_slots``) and end it: a model
        sharing the driver gets the whole memory, the next call must start at step 0."""
        release_open = getattr(self.config.driver, "release_open", None)
        try:
            if release_open is not None:
                release_open()
        finally:
            for branch in self.state.branches.values():
                self._free_slots(branch)
            self.state.reset()

    # ---- the forward ----------------------------------------------------------
    # not traced by torch.compile: the step's bookkeeping, decisions, monitors and segments
    # are Python control flow with host syncs (torch.compiler.disable, as diffusers' cache
    # hooks); compiled submodules that the block specs call still run compiled
    @torch.compiler.disable
    def new_forward(self, module, *args, **kwargs):
        """The transformer's own forward (under ``torch.no_grad``: the engine is for
        inference), its blocks recorded and run by this call's
        :class:`~coda.host.cache.step.StepRun`.
        Raises ValueError for a call the architecture does not cover, a missing or bad cache
        context, steps out of order, a call without step_index it cannot place, an offload or
        parallel set-up added since the engine attached
        (:func:`coda.host.cache.execution.check_execution`). An exception
        raised in the call (by the policy, the driver, the engine) reaches the caller as
        itself, with its traceback, also where the model's code between the blocks caught
        or replaced it (:attr:`coda.host.cache.step.StepRun.failure`); the generation is
        then ended."""
        try:        # an offload / parallel hook added since the engine attached
            check_execution(module, self.arch.blocks(module))
        except ValueError:
            self._abort_generation()
            raise
        call_args = self.arch.bind_call(module, args, kwargs)
        self.arch.check_call(module, call_args)
        ctx = self.context_manager.context
        branches = _parse_branches(ctx.name, self.arch.batch_size(call_args))
        step = self._begin_call(ctx, branches, call_args)
        run = failure = None
        try:
            run = self._run = StepRun(self, module, branches, step)
            with torch.no_grad():
                output = self.fn_ref.original_forward(*args, **kwargs)
                failure = run.failure
                if failure is None:
                    output = run.finish(output)
        except BaseException as exc:   # KeyboardInterrupt, NMPCapacityError, ...: nothing is held
            failure = None if run is None else run.failure
            if failure is None or failure is exc:
                self._abort_generation()
                raise
        finally:
            self._run = None
        if failure is not None:
            # raised in the engine under the model's own code, which hid or replaced it
            # (torch's operators turn a TypeError into NotImplemented): raised here as itself,
            # with its traceback, outside any handler so that nothing is chained onto it
            self._abort_generation()
            raise failure.with_traceback(run.failure_traceback)
        self._end_call()
        return output

    def key(self, branch: str, sample: int, layer: int, op: str, what: str = "out",
            stream: str = PRIMARY) -> Hashable:
        """Slot key of one sample's (index within its branch) cached operator output
        (``what="out"``), its previous output in forecast mode (``what="prev"``) or kept
        input (``what="in"``), per residual stream."""
        key = (self._tag, branch, sample, layer, op)
        if stream != PRIMARY:
            key += (stream,)
        return key if what == "out" else key + (what,)

    def emit(self, event) -> None:
        self.events.append(event)
        self.policy.observe(event)


class _BlockHook(ModelHook):
    """On one transformer block: inside a hooked transformer forward, the call goes to the
    step's :class:`~coda.host.cache.step.StepRun` (recorded, run with the cache); outside one, the block runs as
    diffusers wrote it."""

    def __init__(self, owner: CodaCacheHook, spec: BlockSpec, layer: int):
        super().__init__()
        self.owner, self.spec, self.layer = owner, spec, layer

    @torch.compiler.disable     # a compiled block's call ends here: see CodaCacheHook
    def new_forward(self, block, *args, **kwargs):
        run = self.owner._run
        if run is None:
            return self.fn_ref.original_forward(*args, **kwargs)
        try:
            return run.block_call(self.spec, block, self.layer, args, kwargs)
        except BaseException as exc:    # the model's code may catch it: the step fails by it
            run.fail(exc)
            raise


def apply_coda_cache(transformer: torch.nn.Module, config: CodaCacheConfig) -> CodaCacheHook:
    """Register the CODA cache hook on a diffusers video transformer: one hook on the model,
    one on each of its blocks (found by name through :mod:`coda.host.cache.arch`).

    Args:
        transformer: a ``LatteTransformer3DModel`` (e.g. ``DigitLatte.transformer``),
            ``CogVideoXTransformer3DModel``, ``WanTransformer3DModel`` or
            ``HunyuanVideoTransformer3DModel`` (tested on diffusers 0.42.1; another version
            with the structure the adapter reads is served with an
            ``UntestedDiffusersWarning``).
        config: driver, policy, cache dtype, slot keeping, event log.
    Returns:
        the hook (``hook.events``: the operator events; ``hook.stats``: the counters of the
        current or last generation; ``hook.model_ops``: the model's operators).
    Raises:
        coda.host.cache.arch.UnsupportedModelError (a TypeError): another transformer class (the
            message names it and the supported ones), a configuration the architecture's
            adapter does not replay, a model without the structure it reads
            (:meth:`coda.host.cache.arch.base.Architecture.check_structure`).
        ValueError: a hook already there; a cache dtype that disagrees with the driver; an
            execution set-up the engine does not run exactly (offload hooks, parallelism,
            another cache: :func:`coda.host.cache.execution.check_execution`, also checked
            at every call).
        TypeError: a policy that is not one.
    """
    from diffusers.hooks import HookRegistry

    arch = get_architecture(transformer)
    arch.check_model(transformer)
    check_execution(transformer, arch.blocks(transformer))
    hook = CodaCacheHook(config)     # checks the config before anything is registered
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    registry.register_hook(hook, HOOK_NAME)
    for ref in arch.blocks(transformer):
        HookRegistry.check_if_exists_or_initialize(ref.module).register_hook(
            _BlockHook(hook, ref.spec, ref.layer), BLOCK_HOOK_NAME)
    registry.invalidate_child_registries_cache()
    return hook


def get_coda_cache_hook(transformer: torch.nn.Module) -> CodaCacheHook | None:
    """The registered hook, or None."""
    registry = getattr(transformer, "_diffusers_hook", None)
    return None if registry is None else registry.get_hook(HOOK_NAME)


@contextlib.contextmanager
def coda_generation(transformer: torch.nn.Module):
    """Context manager around a denoising loop: if the loop ends by an exception (Ctrl-C
    between two transformer calls, a scheduler error, ...), the hook's generation is ended
    and its slots and launched segments' scratch freed (as a call ending by an exception
    does itself), so nothing stays held in the ranks for other models of the driver.
    Yields the hook (None if the transformer has none); re-raises the exception."""
    try:
        yield get_coda_cache_hook(transformer)
    except BaseException:
        hook = get_coda_cache_hook(transformer)
        if hook is not None:
            hook._abort_generation()
        raise


def reset_coda_cache(transformer: torch.nn.Module) -> None:
    """Free every cache slot of the hook and clear its state (call between generations)."""
    hook = get_coda_cache_hook(transformer)
    if hook is not None:
        hook.reset_state(transformer)


def remove_coda_cache(transformer: torch.nn.Module) -> None:
    """Reset and unregister the hook (the transformer runs its own forward again)."""
    hook = get_coda_cache_hook(transformer)
    if hook is not None:
        hook.reset_state(transformer)
        transformer._diffusers_hook.remove_hook(HOOK_NAME, recurse=False)
        for ref in hook.arch.blocks(transformer):
            registry = getattr(ref.module, "_diffusers_hook", None)
            if registry is not None:
                registry.remove_hook(BLOCK_HOOK_NAME, recurse=False)
        transformer._diffusers_hook.invalidate_child_registries_cache()
