"""Cross-timestep cache engine for diffusers video transformers (Latte, CogVideoX, Wan,
HunyuanVideo: :mod:`coda.host.cache.arch`), with the cache operators executed on the DIMM-NMP
through :class:`coda.host.nmp.driver.NMPDriver`.

Follows diffusers' hook conventions (``diffusers.hooks``): a :class:`CodaCacheConfig`, a
:class:`CodaCacheState` with ``reset()``, a stateful :class:`CodaCacheHook` (``ModelHook``)
registered in the transformer's ``HookRegistry``, one block hook per transformer block found
by name through the architecture registry, and :func:`apply_coda_cache`. The denoising loop
tells the hook where it is with diffusers' ``transformer.cache_context(name,
step_index=i, num_inference_steps=n)``; ``name`` is the CFG branch of the call (``"cond"`` or
``"uncond"``) or, for both branches batched in one call, the branches of equal consecutive
batch chunks joined by ``"|"`` (:data:`BATCHED_CFG` = ``"uncond|cond"``, diffusers' order;
CogVideoX's pipeline says ``"cond_uncond"`` for the same). A context without ``step_index``
(diffusers 0.42's CogVideoX and HunyuanVideo pipelines) counts steps per branch from 0; one
without ``num_inference_steps`` takes ``CodaCacheConfig.num_inference_steps``.

What the hooks do
-----------------
The transformer's own forward runs (embeddings, its block loop, the output head); each block
hook records its call and returns deferred outputs (:mod:`coda.host.cache.arch.deferred`); the
recorded blocks run, operator by operator, when something other than the next block needs
their outputs. The architecture's block spec replays the block's forward with the same torch
calls in the same order as the diffusers code, so a policy that reuses nothing gives
bit-identical outputs to the unhooked model. For every operator and every sample of every
branch the engine asks its policy (:mod:`coda.host.cache.policies`) for a :class:`Decision`:

- *compute*: norm -> adaLN modulation -> attention/FFN on the xPU, added as
  ``x + gate * out`` per residual stream; the pre-gate output ``out`` is written to the
  sample's NMP cache slot (``driver.store``, in the NME format) if the decision says
  ``store``, and the operator's input kept as a monitor reference if it says ``keep_input``;
- *reuse*: its norm, modulation and attention are skipped; only its current adaLN gate is
  computed (an ungated residual has gate = 1). Each maximal run of consecutive reused
  operators of a sample is one segment, run by ``driver.segment_submit`` with the gates and
  the caches in the NME format (bf16 or fp16, from the driver's ``cfg.fmt``), one program per
  residual stream (CogVideoX and HunyuanVideo also carry the text tokens). Two forms
  (``CodaCacheConfig.segment_output``):

  - ``"sum"`` (default): the NME returns ``z = ((0 + g0*c0) + g1*c1) + ...`` (its x stream
    is a slot of zeros resident in rank memory), z crosses PCIe up in the 16-bit format and
    the xPU adds it to the residual stream in the model's dtype, ``h = h + z``. One tensor
    crosses the link per segment, and a segment rounds only the reused outputs to the cache
    format, never the residual stream: reusing an operator whose output is exactly constant
    costs only the 16-bit rounding of that output.
  - ``"residual"``: ``y = ((x + g0*c0) + g1*c1) + ...`` on the NME, x down and y up in the
    16-bit format, the host casts y back: every segment rounds the whole residual stream to
    the cache format (an fp32 model pays that rounding once per segment).

  A segment runs on across block boundaries
  where the model passes its streams straight from block to block; the model's own code in
  between (Latte's temporal position embedding) ends it (:meth:`ModelOps.barriers`).

Everything it does is emitted as operator events (:mod:`coda.host.cache.events`) into
``hook.events``; ``hook.state.stats`` are counted from them.

Cache slots are per branch, sample and stream (the conditional and unconditional outputs never
mix; a sample's tensor is [T, C] in the architecture's canonical token order, for Latte
(frame, patch)). They are freed when a
generation's last step is done (``CodaCacheConfig.keep_slots=True`` keeps them until the next
generation starts or ``reset``); a generation starting at step 0 frees its branch's slots
first, so nothing is carried over. A segment runs once per sample: the digit model's label
enters adaLN, so each sample has its own gates, and a gate is one [C] vector per NME program.
Decisions are per sample too, so a sample's result never depends on the rest of its batch.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any, Hashable

import torch
from diffusers.hooks.hooks import ModelHook, StateManager

from coda.host.cache.arch import Architecture, get_architecture
from .arch.base import BlockCall, BlockSpec
from .arch.deferred import Deferred, continues, materialized
from coda.host.nmp.launch import PendingOp
from coda.host.cache.events import EventLog, MonitorEvent, OpEvent, SegmentEvent
from coda.host.nmp.link import SEGMENT_OUTPUTS, check_segment_output   # segment_output's forms
from coda.host.nme.ops import MAX_SEGMENT_TERMS
from coda.host.cache.policies import as_policy
from .policies.base import CachePolicy, Decision, OpQuery
from coda.host.cache.schedule import BRANCHES, ScheduleError

__all__ = ["BATCHED_CFG", "SEGMENT_OUTPUTS", "CodaCacheConfig", "CodaCacheState", "CodaCacheHook",
           "apply_coda_cache", "remove_coda_cache", "reset_coda_cache", "get_coda_cache_hook",
           "coda_generation", "HOOK_NAME", "BLOCK_HOOK_NAME"]

HOOK_NAME = "coda_cache"
BLOCK_HOOK_NAME = "coda_cache_block"
BATCHED_CFG = "uncond|cond"
#: context names of diffusers pipelines meaning a batched CFG call (CogVideoX: [uncond; cond])
_CONTEXT_ALIASES = {"cond_uncond": BATCHED_CFG}
_PRIMARY = "hidden"      # the video-token stream: monitors and the Latte-compatible slot keys
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
            ``l1_to_slot``, ``wait`` for monitors are used where present / needed).
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
            in the cache format); see the module docstring.
    Raises (on apply):
        ValueError: a ``cache_dtype`` that is not bf16/fp16 or disagrees with the driver; a
            ``num_inference_steps`` below 1; a ``segment_output`` other than the two.
    """
    driver: Any
    policy: Any = None
    cache_dtype: torch.dtype | None = None
    keep_slots: bool = False
    events: EventLog | None = None
    interleave_cfg: bool = True
    num_inference_steps: int | None = None
    segment_output: str = "sum"

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
    slots: dict = field(default_factory=dict)   # key -> (shape, step written)
    kept: dict = field(default_factory=dict)    # key -> (shape, step kept, Σ|x_ref| fp32)


class CodaCacheState:
    """Per-generation state: the generation in the event log, per-branch step counters, cache
    slots and kept monitor references, the transformer calls and segments so far."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.generation: int | None = None
        self.num_steps: int | None = None
        self.branches: dict[str, _BranchState] = {b: _BranchState() for b in BRANCHES}
        self.calls = 0
        self.segments = 0      # segment ids issued in this generation


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
        self.dtype = config.resolved_dtype()
        self.fmt = _DTYPE_NAMES[self.dtype]
        self.policy: CachePolicy = as_policy(config.policy)
        self.events = config.events if config.events is not None else EventLog()
        self.state = CodaCacheState()
        # diffusers' cache_context() delivers the CacheContext to StateManager attributes.
        self.context_manager = StateManager(CodaCacheState)
        self._tag = f"coda{next(_hook_ids)}"
        self._last_generation: int | None = None
        self._run: _StepRun | None = None

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
        return module

    @property
    def stats(self) -> dict:
        """Counters of the current (or last) generation (:meth:`EventLog.stats`) plus
        ``calls`` (its transformer forwards); zeros before the first one or after a reset."""
        out = self.events.stats(-1 if self._last_generation is None else self._last_generation)
        out["calls"] = self.state.calls
        return out

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

    def _begin_call(self, ctx, branches: list[str]) -> int:
        n = ctx.num_inference_steps if ctx.num_inference_steps is not None \
            else self.config.num_inference_steps
        if n is None:
            raise ValueError("the cache context gives no num_inference_steps: call "
                             "transformer.cache_context('cond', step_index=i, num_inference_steps=n) "
                             "or, for a pipeline that does not, set "
                             "CodaCacheConfig(num_inference_steps=n)")
        st = self.state
        names = list(dict.fromkeys(branches))
        step, n = (self._counted_step(names) if ctx.step_index is None
                   else int(ctx.step_index)), int(n)
        if not 0 <= step < n:
            raise ValueError(f"step_index={step}: expected 0..{n - 1}")
        if step == 0 and (st.generation is None
                          or any(st.branches[b].last_step >= 0 for b in names)):
            self._start_generation(n)
        elif st.generation is None:
            raise ValueError(f"step {step} without a generation: start it at step 0 "
                             "(reset between generations)")
        elif n != st.num_steps:
            raise ValueError(f"num_inference_steps changed to {n} at step {step}: "
                             "start the new generation at step 0")
        for name in names:
            branch = st.branches[name]
            if step != branch.last_step + 1:
                raise ValueError(f"branch {name}: step {step} after step {branch.last_step}; "
                                 "steps must run in order from 0 (reset between generations)")
            branch.last_step = step
        st.calls += 1
        return step

    def _counted_step(self, names: list[str]) -> int:
        """The step of a call whose context has no step_index: 0 when no generation is
        running, else one after the branches' last step (they must agree)."""
        st = self.state
        if st.generation is None:
            return 0
        steps = {st.branches[b].last_step + 1 for b in names}
        if len(steps) != 1:
            raise ValueError(f"branches {names} are at different steps {sorted(steps)}: give "
                             "step_index in the cache context")
        return steps.pop()

    def _start_generation(self, num_steps: int) -> None:
        for branch in self.state.branches.values():
            self._free_slots(branch)
        self.state.reset()
        self.state.num_steps = num_steps
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
    def new_forward(self, module, *args, **kwargs):
        """The transformer's own forward (under ``torch.no_grad``: the engine is for
        inference), its blocks recorded and run by this call's :class:`_StepRun`.
        Raises ValueError for a call the architecture does not cover, a missing or bad cache
        context, steps out of order."""
        call_args = self.arch.bind_call(module, args, kwargs)
        self.arch.check_call(module, call_args)
        ctx = self.context_manager.context
        branches = _parse_branches(ctx.name, self.arch.batch_size(call_args))
        step = self._begin_call(ctx, branches)
        try:
            run = self._run = _StepRun(self, module, branches, step)
            with torch.no_grad():
                output = run.finish(self.fn_ref.original_forward(*args, **kwargs))
        except BaseException:   # KeyboardInterrupt, NMPCapacityError, ...: nothing is held
            self._abort_generation()
            raise
        finally:
            self._run = None
        self._end_call()
        return output

    def key(self, branch: str, sample: int, layer: int, op: str, what: str = "out",
            stream: str = _PRIMARY) -> Hashable:
        """Slot key of one sample's (index within its branch) cached operator output
        (``what="out"``) or kept input (``what="in"``), per residual stream."""
        key = (self._tag, branch, sample, layer, op)
        if stream != _PRIMARY:
            key += (stream,)
        return key if what == "out" else key + (what,)

    def emit(self, event) -> None:
        self.events.append(event)
        self.policy.observe(event)


@dataclass(eq=False)
class _Node:
    """One recorded block call of a program; ``lazies``: its deferred outputs still alive;
    ``values``: its real outputs per stream once the program ran."""
    call: BlockCall
    lazies: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    values: dict[str, torch.Tensor] | None = None


@dataclass(eq=False)
class _Program:
    """Consecutive block calls whose residual streams pass straight from one to the next:
    run together, one trunk per CFG branch, segments spanning their boundaries.

    inputs: stream -> the real tensor entering the first block; canon: their canonical
    shapes; nodes: the calls in order; executed: it ran (or is running)."""
    inputs: dict[str, torch.Tensor]
    canon: dict[str, torch.Size]
    nodes: list[_Node] = field(default_factory=list)
    executed: bool = False


class _StepRun:
    """One transformer forward (one step, one or two branches) under the hook's policy: the
    programs its block calls form, their execution, and the engine state the block specs see
    (:class:`coda.host.cache.arch.base.StepState`: ``b``, ``h``, ``take``, ``put``, ``rows``).

    Rows are the batch indices; row ``i`` is sample ``sample_of[i]`` of branch ``branch_of[i]``.
    """

    def __init__(self, hook, model, branches, step):
        self.hook, self.m = hook, model
        self.driver, self.dtype = hook.config.driver, hook.dtype
        self.ops = hook.model_ops
        self.step, self.num_steps = step, hook.state.num_steps
        self.branch_of = branches
        counters: dict[str, int] = {}
        self.sample_of = []
        for br in branches:
            self.sample_of.append(counters.get(br, 0))
            counters[br] = counters.get(br, 0) + 1
        self.b = len(branches)
        self.pending: list[list[tuple]] = [[] for _ in branches]
        self.h: dict[str, torch.Tensor] = {}
        self.program: _Program | None = None
        self._called: set[int] = set()

    def _event_fields(self, row: int) -> dict:
        return dict(generation=self.hook.state.generation, step=self.step,
                    num_steps=self.num_steps, branch=self.branch_of[row],
                    sample=self.sample_of[row])

    # ---- StepState: what the block specs see ------------------------------------------
    def take(self, stream: str, samples: torch.Tensor) -> torch.Tensor:
        h = self.h[stream]
        return h if len(samples) == self.b else h.index_select(0, samples)

    def put(self, stream: str, samples: torch.Tensor, value: torch.Tensor) -> None:
        if len(samples) == self.b:
            self.h[stream] = value.contiguous()
        else:   # the same values, on these rows only
            self.h[stream] = self.h[stream].index_copy(0, samples, value.contiguous())

    def rows(self, t, samples: torch.Tensor, per: int = 1):
        if t is None or len(samples) == self.b:
            return t
        if per == 1:
            return t.index_select(0, samples)
        return t.reshape(self.b, per, *t.shape[1:]).index_select(0, samples).reshape(-1, *t.shape[1:])

    @property
    def c(self) -> int:
        return self.h[_PRIMARY].shape[-1]

    def _tokens(self) -> dict[str, int]:
        """Tokens per sample of each stream."""
        return {s: h[0].numel() // h.shape[-1] for s, h in self.h.items()}

    # ---- the model's blocks: record, run on demand ------------------------------------
    def block_call(self, spec: BlockSpec, block: torch.nn.Module, layer: int, args, kwargs):
        """A hooked block's call: recorded into the open program (or a new one); returns its
        outputs as :class:`Deferred` tensors."""
        if id(block) in self._called:
            raise ValueError(f"layer {layer} ({spec.block_class}) called twice in one forward: "
                             "the CODA cache engine needs each block once per step")
        self._called.add(id(block))
        bound = spec.bind(block, args, kwargs)
        streams = {s: bound.pop(param) for s, param in spec.streams.items()}
        # anything else deferred that a block gets is computed now: the spec needs real values
        bound = {k: materialized(v) for k, v in bound.items()}
        call = BlockCall(spec, block, layer, bound)
        spec.check(call)
        if not self._continues(spec, streams):
            real = {s: materialized(x) for s, x in streams.items()}
            self.run_open()
            self.program = _Program(real, {s: spec.to_canonical(s, x, self.b).shape
                                           for s, x in real.items()})
        call.prep = spec.prepare(call, self.b)
        node = _Node(call)
        self.program.nodes.append(node)
        outs = [Deferred(self, node, s, x.shape, x.dtype, x.device) for s, x in streams.items()]
        return tuple(outs) if spec.returns_tuple else outs[0]

    def _continues(self, spec: BlockSpec, streams: dict) -> bool:
        """Whether a block with these stream inputs continues the open program: each input is
        the last block's output of that stream, moved at most by layout operations that land
        on the same canonical tokens (:func:`coda.host.cache.arch.deferred.continues`)."""
        p = self.program
        if p is None or p.executed or not p.nodes:
            return False
        last = p.nodes[-1]
        if set(streams) != set(last.call.spec.streams):
            return False
        return all(isinstance(x, Deferred) and x._owner is self and x._node is last
                   and x._stream == s and x._value is None
                   and continues(x, last.call.spec, spec, s, p.canon[s], self.b)
                   for s, x in streams.items())

    def node_value(self, node: _Node, stream: str) -> torch.Tensor:
        """A recorded block's real output (runs its program first). Raises RuntimeError for
        an output dropped when its program ran (the engine keeps every one still referenced)."""
        if node.values is None:
            p = self.program
            if p is None or p.executed or not any(n is node for n in p.nodes):
                raise RuntimeError("CODA cache engine: a block output was needed after its "
                                   "program ran without keeping it")
            self._execute(p)
        return node.values[stream]

    def run_open(self) -> None:
        """Run the open program, if any (a step's programs run in the order recorded)."""
        if self.program is not None and not self.program.executed:
            self._execute(self.program)

    def finish(self, output):
        """After the model's forward: run what is still recorded; the output with any deferred
        tensor replaced by its value."""
        self.run_open()
        assert not any(self.pending), "segments left pending after a step"
        if isinstance(output, Deferred):
            return output.materialize()
        if isinstance(output, tuple):
            return type(output)(materialized(o) for o in output)
        if isinstance(output, dict):    # diffusers' ModelOutput
            for k, v in list(output.items()):
                if isinstance(v, Deferred):
                    output[k] = v.materialize()
        return output

    def _execute(self, p: _Program) -> None:
        """Run a program: one trunk per CFG branch over its blocks, operator by operator. It is
        cut after a block whose outputs someone else still holds (their values are kept)."""
        p.executed = True
        nodes = p.nodes
        first = nodes[0].call.spec
        # a copy the engine owns (segments write rows in place)
        self.h = {s: first.to_canonical(s, x, self.b).clone(memory_format=torch.contiguous_format)
                  for s, x in p.inputs.items()}
        p.inputs = {}
        cuts = [i for i, n in enumerate(nodes[:-1]) if len(n.lazies)] + [len(nodes) - 1]
        start = 0
        for cut in cuts:
            self._run_trunks(nodes[start:cut + 1])
            node, last = nodes[cut], cut == len(nodes) - 1
            node.values = {s: node.call.spec.from_canonical(s, h if last else h.clone())
                           for s, h in self.h.items()}
            start = cut + 1

    def _run_trunks(self, nodes: list[_Node]) -> None:
        branches = list(dict.fromkeys(self.branch_of))
        if self.hook.config.interleave_cfg and len(branches) > 1:
            groups = [[r for r, br in enumerate(self.branch_of) if br == name] for name in branches]
        else:
            groups = [list(range(self.b))]
        # CFG interleaving: each branch's trunk pauses right after launching a segment, so the
        # other branch computes on the xPU while the NMEs run it (the RTL simulators are
        # processes of their own); the program ends when both trunks are done.
        trunks = [self._trunk(nodes, rows) for rows in groups]
        while trunks:
            for trunk in list(trunks):
                try:
                    next(trunk)
                except StopIteration:
                    trunks.remove(trunk)

    def _trunk(self, nodes: list[_Node], rows: list[int]):
        """The blocks ``nodes`` for ``rows`` (a generator: it yields after launching
        segments, so another branch's trunk may run meanwhile)."""
        for node in nodes:
            for op in node.call.spec.ops:
                yield from self.operator(node.call, op, rows)
        yield from self.flush_rows(rows)

    # ---- one operator for some rows of the call -------------------------------------
    def operator(self, call: BlockCall, op: str, rows: list[int]):
        """Decide, then compute or queue for a segment, ``(call.layer, op)`` for ``rows`` (a
        generator, see :meth:`flush_rows`)."""
        hook, st = self.hook, self.hook.state
        layer, spec = call.layer, call.spec
        index = self.ops.index((layer, op))
        decisions: dict[int, Decision] = {}
        for row in rows:
            br, j = self.branch_of[row], self.sample_of[row]
            bstate = st.branches[br]
            out_key, in_key = hook.key(br, j, layer, op), hook.key(br, j, layer, op, "in")
            slot, kept = bstate.slots.get(out_key), bstate.kept.get(in_key)
            q = OpQuery(step=self.step, num_steps=self.num_steps, branch=br, sample=j,
                        layer=layer, op=op, index=index, num_layers=self.ops.num_layers,
                        cached_step=None if slot is None else slot[1],
                        kept_step=None if kept is None else kept[1],
                        segment_open=bool(self.pending[row]), model_ops=self.ops,
                        _input_change=lambda row=row: self.input_change(row, layer, op, index))
            d = hook.policy.decide(q)
            if d.reuse and slot is None:
                raise ScheduleError(
                    f"step {self.step}, branch {br}, sample {j}: reuse of ({layer}, {op!r}) "
                    "needs a cached output, but none was stored")
            decisions[row] = d
        compute = [row for row in rows if not decisions[row].reuse]
        reuse = [row for row in rows if decisions[row].reuse]
        if reuse:
            gates = {s: g.to(self.dtype) for s, g in
                     spec.gates(self, call, op, torch.tensor(reuse, dtype=torch.long)).items()}
            for pos, row in enumerate(reuse):
                self.pending[row].append(({s: g[pos] for s, g in gates.items()}, layer, op, index,
                                          decisions[row].reason))
        if not compute:
            return
        yield from self.flush_rows(compute)
        samples = torch.tensor(compute, dtype=torch.long)
        x_before = {row: self.h[_PRIMARY][row] for row in compute if decisions[row].keep_input}
        out = spec.compute(self, call, op, samples)
        tokens = sum(self._tokens().values())
        for pos, row in enumerate(compute):
            d = decisions[row]
            stored = self.store(row, layer, op, {s: o[pos] for s, o in out.items()}) if d.store else 0
            kept = self.keep_input(row, layer, op, x_before[row]) if d.keep_input else 0
            hook.emit(OpEvent(**self._event_fields(row), layer=layer, op=op, index=index,
                              reused=False, reason=d.reason, tokens=tokens,
                              channels=self.c, dtype=hook.fmt, stored_bytes=stored,
                              kept_bytes=kept))

    def _bytes_written(self) -> int:
        return self.driver.stats["bytes_written"]

    def store(self, row: int, layer: int, op: str, outs: dict[str, torch.Tensor]) -> int:
        """Write one row's pre-gate outputs (per stream, canonical [..., C]) to their slots;
        returns the bytes written."""
        br, j = self.branch_of[row], self.sample_of[row]
        before = self._bytes_written()
        for stream, out in outs.items():
            tensor = out.reshape(-1, self.c).to(self.dtype).contiguous()
            key = self.hook.key(br, j, layer, op, stream=stream)
            self.driver.store(key, tensor, group=(br, j, stream))
            self.hook.state.branches[br].slots[key] = (tuple(tensor.shape), self.step)
        return self._bytes_written() - before

    def keep_input(self, row: int, layer: int, op: str, x: torch.Tensor) -> int:
        """Keep one row's operator input (video stream, canonical) in rank memory as a monitor
        reference, with ``Σ|x|`` in fp32; returns the bytes written."""
        br, j = self.branch_of[row], self.sample_of[row]
        tensor = x.reshape(-1, self.c).to(self.dtype).contiguous()
        key = self.hook.key(br, j, layer, op, "in")
        before = self._bytes_written()
        self.driver.store(key, tensor, group=(br, j, _PRIMARY))
        norm = float(tensor.float().abs().sum())
        self.hook.state.branches[br].kept[key] = (tuple(tensor.shape), self.step, norm)
        return self._bytes_written() - before

    def input_change(self, row: int, layer: int, op: str, index: int) -> float:
        """The relative L1 change of a row's operator input (video stream) against its kept
        reference, the numerator on the NMEs (``driver.l1_to_slot``); emits a MonitorEvent."""
        self.flush(row)
        br, j = self.branch_of[row], self.sample_of[row]
        key = self.hook.key(br, j, layer, op, "in")
        shape, ref_step, norm = self.hook.state.branches[br].kept[key]
        x16 = self.h[_PRIMARY][row].reshape(-1, self.c).to(self.dtype).contiguous()
        self.driver.wait()      # so the counters below see this check alone
        s = self.driver.stats
        before, cycles, programs = (s["bytes_written"] + s["cmd_bytes"], s["nme_cycles"],
                                    s["programs"])
        l1 = self.driver.l1_to_slot(x16, key)
        value = l1 / norm if norm > 0 else (0.0 if l1 == 0 else float("inf"))
        self.hook.emit(MonitorEvent(
            **self._event_fields(row), layer=layer, op=op, index=index, reference_step=ref_step,
            value=value, bytes_to_nmp=s["bytes_written"] + s["cmd_bytes"] - before,
            programs=self.driver.stats["programs"] - programs,
            nme_cycles=self.driver.stats["nme_cycles"] - cycles))
        return value

    # ---- segments -----------------------------------------------------------------
    def flush_rows(self, rows: list[int]):
        """Run the pending segments of ``rows`` (a generator): launch them on the NMEs, yield
        once so another branch's trunk computes meanwhile, then take their results."""
        launched = [self._launch_segment(row) for row in rows if self.pending[row]]
        if launched:
            yield
        for item in launched:
            self._finish_segment(*item)

    def flush(self, row: int) -> None:
        """Run a row's pending segment now (no other work overlaps it)."""
        if self.pending[row]:
            self._finish_segment(*self._launch_segment(row))

    def _launch_segment(self, row: int):
        """Launch a row's pending reused operators as one segment per residual stream,
        ``x + Σ g_k ⊙ c_k`` with x = 0 (``"sum"``) or the row (``"residual"``). The NME takes at most MAX_SEGMENT_TERMS terms per program: the
        driver chains longer ones in rank memory (one round trip); a driver without
        ``segment_submit`` gets one call per MAX_SEGMENT_TERMS terms (the same rounding)."""
        run, self.pending[row] = self.pending[row], []
        hook = self.hook
        br, j = self.branch_of[row], self.sample_of[row]
        slots = hook.state.branches[br].slots
        submit = getattr(self.driver, "segment_submit", None)
        native = submit is not None
        chunk = len(run) if native else MAX_SEGMENT_TERMS
        if submit is None:      # a driver without asynchronous launches or chaining
            submit = lambda *a: PendingOp.done(self.driver.segment(*a))  # noqa: E731
        launches: dict[str, list] = {}
        zero_bytes = 0
        for stream, h in self.h.items():
            x16 = h[row].reshape(-1, self.c).to(self.dtype).contiguous()
            keys = [hook.key(br, j, layer, op, stream=stream) for _, layer, op, _, _ in run]
            for key, (_, layer, op, _, _) in zip(keys, run):
                if key not in slots or slots[key][0] != tuple(x16.shape) or key not in self.driver:
                    raise ScheduleError(
                        f"step {self.step}, branch {br}, sample {j}: reuse of ({layer}, {op!r}) "
                        f"needs a cached tensor of shape {tuple(x16.shape)}, found "
                        f"{slots[key][0] if key in slots else None}")
            y = x16
            if hook.config.segment_output == "sum":
                y, written = self._zero_input(br, j, stream, x16, in_place=native)
                zero_bytes += written
            pending = []
            for i in range(0, len(run), chunk):
                if pending:
                    y = pending[-1].result()
                pending.append(submit(y, [g[stream] for g, *_ in run[i:i + chunk]],
                                      keys[i:i + chunk]))
            launches[stream] = pending
        return row, run, launches, zero_bytes

    def _zero_input(self, branch: str, sample: int, stream: str, x16: torch.Tensor,
                    in_place: bool):
        """The x of a sum segment: with ``in_place`` (a driver with ``segment_submit``, which
        reads x from a slot) the key of the sample's slot of zeros of ``x16``'s shape, placed
        where the segment would put an x it sent (``store(..., x_of=group)``: the same DRAM
        banks as a residual segment), written once per generation and kept with the
        branch's slots (its bytes go to the first segment that needs it); else a zero
        tensor. Returns (x, bytes written)."""
        if not in_place:
            return torch.zeros_like(x16), 0
        key = self.hook.key(branch, sample, -1, "zero", stream=stream)
        slots = self.hook.state.branches[branch].slots
        if key in slots and slots[key][0] == tuple(x16.shape) and key in self.driver:
            return key, 0
        before = self._bytes_written()
        self.driver.store(key, torch.zeros_like(x16), x_of=(branch, sample, stream))
        slots[key] = (tuple(x16.shape), self.step)
        return key, self._bytes_written() - before

    def _finish_segment(self, row: int, run: list, launches: dict[str, list],
                        zero_bytes: int = 0) -> None:
        """Take a launched segment's results into the row (``"sum"``: added to it in the
        model's dtype; ``"residual"``: in place of it); emit its OpEvents and SegmentEvent."""
        hook = self.hook
        add = hook.config.segment_output == "sum"
        for stream, pending in launches.items():
            y = pending[-1].result()
            h = self.h[stream]
            y = y.to(h.dtype).reshape(h.shape[1:])
            h[row] = h[row] + y if add else y
        every = [p for pending in launches.values() for p in pending]
        per_stream = self._tokens()
        tokens = sum(per_stream.values())
        seg = hook.state.segments
        hook.state.segments += 1
        fields = self._event_fields(row)
        for _, layer, op, index, reason in run:
            hook.emit(OpEvent(**fields, layer=layer, op=op, index=index, reused=True,
                              reason=reason, tokens=tokens, channels=self.c,
                              dtype=hook.fmt, segment=seg))
        hook.emit(SegmentEvent(
            **fields, segment=seg, ops=tuple((layer, op) for _, layer, op, _, _ in run),
            first_index=run[0][3], tokens=tokens, channels=self.c, dtype=hook.fmt,
            bytes_to_nmp=zero_bytes + sum(p.bytes_to_nmp for p in every),
            bytes_from_nmp=sum(p.bytes_from_nmp for p in every),
            programs=sum(p.programs for p in every),
            nme_cycles=sum(p.nme_cycles for p in every),
            stream_tokens=tuple(per_stream.values()) if len(per_stream) > 1 else ()))


class _BlockHook(ModelHook):
    """On one transformer block: inside a hooked transformer forward, the call goes to the
    step's :class:`_StepRun` (recorded, run with the cache); outside one, the block runs as
    diffusers wrote it."""

    def __init__(self, owner: CodaCacheHook, spec: BlockSpec, layer: int):
        super().__init__()
        self.owner, self.spec, self.layer = owner, spec, layer

    def new_forward(self, block, *args, **kwargs):
        run = self.owner._run
        if run is None:
            return self.fn_ref.original_forward(*args, **kwargs)
        return run.block_call(self.spec, block, self.layer, args, kwargs)


def apply_coda_cache(transformer: torch.nn.Module, config: CodaCacheConfig) -> CodaCacheHook:
    """Register the CODA cache hook on a diffusers video transformer: one hook on the model,
    one on each of its blocks (found by name through :mod:`coda.host.cache.arch`).

    Args:
        transformer: a ``LatteTransformer3DModel`` (e.g. ``DigitLatte.transformer``),
            ``CogVideoXTransformer3DModel``, ``WanTransformer3DModel`` or
            ``HunyuanVideoTransformer3DModel`` of diffusers 0.42.1.
        config: driver, policy, cache dtype, slot keeping, event log.
    Returns:
        the hook (``hook.events``: the operator events; ``hook.stats``: the counters of the
        current or last generation; ``hook.model_ops``: the model's operators).
    Raises:
        coda.host.cache.arch.UnsupportedModelError (a TypeError): another transformer class (the
            message names it and the supported ones), a configuration or installed diffusers
            code the architecture's adapter does not replay exactly.
        ValueError: a hook already there; a cache dtype that disagrees with the driver.
        TypeError: a policy that is not one.
    """
    from diffusers.hooks import HookRegistry

    arch = get_architecture(transformer)
    arch.check_model(transformer)
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
