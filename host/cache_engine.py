"""Cross-timestep cache engine for diffusers' ``LatteTransformer3DModel``, with the cache
operators executed on the DIMM-NMP through :class:`coda.host.driver.NMPDriver`.

Follows diffusers' hook conventions (``diffusers.hooks``): a :class:`CodaCacheConfig`, a
:class:`CodaCacheState` with ``reset()``, a stateful :class:`CodaCacheHook` (``ModelHook``)
registered in the transformer's ``HookRegistry``, and :func:`apply_coda_cache`. The denoising
loop tells the hook where it is with diffusers' ``transformer.cache_context(name,
step_index=i, num_inference_steps=n)``; ``name`` is the CFG branch of the call (``"cond"`` or
``"uncond"``) or, for both branches batched in one call, the branches of equal consecutive
batch chunks joined by ``"|"`` (:data:`BATCHED_CFG` = ``"uncond|cond"``, diffusers' order).

What the hook does
------------------
It takes over the transformer's forward and replays Latte's blocks operator by operator
(spatial self-attention, cross attention, spatial FFN, temporal self-attention, temporal FFN;
see :mod:`coda.host.schedule`), with the same torch calls in the same order as diffusers'
``BasicTransformerBlock`` (``norm_type="ada_norm_single"``), so a policy that reuses nothing
gives bit-identical outputs to the unhooked model. For every operator and every sample of
every branch it asks its policy (:mod:`coda.host.policies`) for a :class:`Decision`:

- *compute*: norm -> adaLN modulation -> attention/FFN on the xPU (float32), added as
  ``x + gate * out``; the pre-gate output ``out`` is written to the sample's NMP cache slot
  (``driver.store``, in the NME format) if the decision says ``store``, and the operator's
  input kept as a monitor reference if it says ``keep_input``;
- *reuse*: its norm, modulation and attention are skipped; only its current adaLN gate is
  computed (cross attention has none: gate = 1). Each maximal run of consecutive reused
  operators of a sample is one segment ``y = ((x + g0*c0) + g1*c1) + ...`` run by
  ``driver.segment`` with x, the gates and the caches in the NME format (bf16 or fp16, from
  the driver's ``cfg.fmt``); the host casts y back to float32. This is what a deployment does:
  the xPU keeps float32 activations, the DIMMs hold 16-bit caches, and segment inputs/outputs
  cross PCIe in the 16-bit format.

Everything it does is emitted as operator events (:mod:`coda.host.events`) into
``hook.events``; ``hook.state.stats`` are counted from them.

Cache slots are per branch and sample (the conditional and unconditional outputs never mix;
a sample's tensor is [F*N, C] in token order (frame, patch)). They are freed when a
generation's last step is done (``CodaCacheConfig.keep_slots=True`` keeps them until the next
generation starts or ``reset``); a generation starting at step 0 frees its branch's slots
first, so nothing is carried over. A segment runs once per sample: the digit model's label
enters adaLN, so each sample has its own gates, and a gate is one [C] vector per NME program.
Decisions are per sample too, so a sample's result never depends on the rest of its batch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Hashable

import torch
from diffusers.hooks.hooks import ModelHook, StateManager

from .driver import PendingOp
from .events import EventLog, MonitorEvent, OpEvent, SegmentEvent
from .ops import MAX_SEGMENT_TERMS
from .policies import as_policy
from .policies.base import CachePolicy, Decision, OpQuery
from .schedule import BRANCHES, OP_TYPES, ScheduleError

__all__ = ["BATCHED_CFG", "CodaCacheConfig", "CodaCacheState", "CodaCacheHook",
           "apply_coda_cache", "remove_coda_cache", "reset_coda_cache", "get_coda_cache_hook",
           "HOOK_NAME"]

HOOK_NAME = "coda_cache"
BATCHED_CFG = "uncond|cond"
_NME_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_NAMES = {v: k for k, v in _NME_DTYPES.items()}
_GATE_CHUNK = {"spatial_attn": 2, "temporal_attn": 2, "spatial_ffn": 5, "temporal_ffn": 5}
_hook_ids = itertools.count()


@dataclass
class CodaCacheConfig:
    """Configuration of the cache engine.

    Attributes:
        driver: the NMP driver (``coda.host.driver.NMPDriver``) holding the cache slots and
            running segments; anything with its ``store/segment/free/__contains__`` and
            ``stats["bytes_written"]`` works (``segment_submit`` for overlapped segments and
            ``l1_to_slot``, ``wait`` for monitors are used where present / needed).
        policy: a :class:`coda.host.policies.base.CachePolicy` (e.g.
            ``UniformIntervalPolicy()``, ``SchedulePolicy(schedule)``, a DRA wrapper), or a
            :class:`coda.host.schedule.Schedule` (run as a ``SchedulePolicy``).
        cache_dtype: NME element format; default: from ``driver.cfg.fmt`` (bf16 if absent).
            Must agree with the driver's format.
        keep_slots: keep the cache slots after a generation's last step (default: free them,
            so an idle model holds no rank memory).
        events: where events go (default: a new :class:`EventLog`, ``hook.events``).
        interleave_cfg: in a call that batches both CFG branches, run each branch's blocks
            as its own trunk and switch trunks whenever one launches a segment, so the xPU
            computes one branch while the NMEs run the other's segment (CODA's CFG-interleaved
            pipelining; the bits are those of the plain order, see the tests).
    Raises (on apply):
        ValueError: a ``cache_dtype`` that is not bf16/fp16 or disagrees with the driver.
    """
    driver: Any
    policy: Any = None
    cache_dtype: torch.dtype | None = None
    keep_slots: bool = False
    events: EventLog | None = None
    interleave_cfg: bool = True

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
    parts = name.split("|")
    if any(p not in BRANCHES for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"cache context name {name!r}: expected 'cond', 'uncond' or "
                         f"branches joined by '|' such as {BATCHED_CFG!r}")
    if batch % len(parts):
        raise ValueError(f"batch {batch} does not split into {len(parts)} equal CFG chunks ({name!r})")
    per = batch // len(parts)
    return [p for p in parts for _ in range(per)]


class CodaCacheHook(ModelHook):
    """Stateful hook that runs a Latte transformer's forward with cross-timestep caching.

    Attributes:
        config: the :class:`CodaCacheConfig`. policy: the resolved policy.
        state: the :class:`CodaCacheState`. events: the :class:`EventLog`.
    """
    _is_stateful = True

    def __init__(self, config: CodaCacheConfig):
        super().__init__()
        self.config = config
        self.dtype = config.resolved_dtype()
        self.fmt = _DTYPE_NAMES[self.dtype]
        self.policy: CachePolicy = as_policy(config.policy)
        self.events = config.events if config.events is not None else EventLog()
        self.state = CodaCacheState()
        # diffusers' cache_context() delivers the CacheContext to StateManager attributes.
        self.context_manager = StateManager(CodaCacheState)
        self._tag = f"coda{next(_hook_ids)}"
        self._last_generation: int | None = None

    def initialize_hook(self, module):
        from diffusers import LatteTransformer3DModel

        if not isinstance(module, LatteTransformer3DModel):
            raise TypeError(f"{type(module).__name__}: the CODA cache hook needs a LatteTransformer3DModel")
        if module.config.norm_type != "ada_norm_single":
            raise ValueError(f"norm_type={module.config.norm_type!r}: expected 'ada_norm_single' (Latte)")
        self.num_layers = len(module.transformer_blocks)
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
        if ctx.step_index is None or ctx.num_inference_steps is None:
            raise ValueError("cache_context must give step_index and num_inference_steps, e.g. "
                             "transformer.cache_context('cond', step_index=i, num_inference_steps=n)")
        step, n = int(ctx.step_index), int(ctx.num_inference_steps)
        if not 0 <= step < n:
            raise ValueError(f"step_index={step}: expected 0..{n - 1}")
        st = self.state
        names = list(dict.fromkeys(branches))
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

    # ---- the forward ----------------------------------------------------------
    def new_forward(self, module, hidden_states: torch.Tensor, timestep=None,
                    encoder_hidden_states=None, encoder_attention_mask=None,
                    enable_temporal_attentions: bool = True, return_dict: bool = True):
        if encoder_attention_mask is not None:
            raise ValueError("encoder_attention_mask: the CODA cache engine supports unmasked "
                             "conditions only (pass None)")
        if not enable_temporal_attentions:
            raise ValueError("enable_temporal_attentions=False: the CODA cache engine runs "
                             "the full spatio-temporal Latte only")
        ctx = self.context_manager.context
        branches = _parse_branches(ctx.name, hidden_states.shape[0])
        step = self._begin_call(ctx, branches)
        run = _StepRun(self, module, hidden_states, timestep, encoder_hidden_states,
                       encoder_attention_mask, branches, step)
        output = run.execute()
        self._end_call()
        if not return_dict:
            return (output,)
        from diffusers.models.modeling_outputs import Transformer2DModelOutput
        return Transformer2DModelOutput(sample=output)

    def key(self, branch: str, sample: int, layer: int, op: str, what: str = "out") -> Hashable:
        """Slot key of one sample's (index within its branch) cached operator output
        (``what="out"``) or kept input (``what="in"``)."""
        key = (self._tag, branch, sample, layer, op)
        return key if what == "out" else key + (what,)

    def emit(self, event) -> None:
        self.events.append(event)
        self.policy.observe(event)


class _StepRun:
    """One transformer forward (one step, one or two branches) under the hook's policy.

    Rows are the batch indices; row ``i`` is sample ``sample_of[i]`` of branch ``branch_of[i]``.
    """

    def __init__(self, hook, model, hidden_states, timestep, encoder_hidden_states,
                 encoder_attention_mask, branches, step):
        self.hook, self.m = hook, model
        self.driver, self.dtype = hook.config.driver, hook.dtype
        self.step, self.num_steps = step, hook.state.num_steps
        self.x_in = hidden_states
        self.t_in, self.ehs_in, self.mask = timestep, encoder_hidden_states, encoder_attention_mask
        self.branch_of = branches
        counters: dict[str, int] = {}
        self.sample_of = []
        for br in branches:
            self.sample_of.append(counters.get(br, 0))
            counters[br] = counters.get(br, 0) + 1
        self.pending: list[list[tuple]] = [[] for _ in branches]

    def _event_fields(self, row: int) -> dict:
        return dict(generation=self.hook.state.generation, step=self.step,
                    num_steps=self.num_steps, branch=self.branch_of[row],
                    sample=self.sample_of[row])

    # The embedding and output stages are Latte's own code (diffusers 0.42
    # latte_transformer_3d.py), unchanged, so the cache engine is exact where nothing is reused.
    def execute(self) -> torch.Tensor:
        m = self.m
        b, c, f, hh, ww = self.x_in.shape
        x = self.x_in.permute(0, 2, 1, 3, 4).reshape(-1, c, hh, ww)
        ph, pw = hh // m.config.patch_size, ww // m.config.patch_size
        x = m.pos_embed(x)
        t_emb, embedded_t = m.adaln_single(self.t_in, added_cond_kwargs={"resolution": None, "aspect_ratio": None},
                                           batch_size=b, hidden_dtype=x.dtype)
        ehs = m.caption_projection(self.ehs_in)
        self.b, self.f, self.n, self.c = b, f, ph * pw, x.shape[-1]
        self.t_emb, self.ehs = t_emb, ehs
        self.h = x.reshape(b, f, self.n, self.c)
        branches = list(dict.fromkeys(self.branch_of))
        if self.hook.config.interleave_cfg and len(branches) > 1:
            groups = [[r for r, br in enumerate(self.branch_of) if br == name] for name in branches]
        else:
            groups = [list(range(b))]
        # CFG interleaving: each branch's trunk pauses right after launching a segment, so the
        # other branch computes on the xPU while the NMEs run it (the RTL simulators are
        # processes of their own); the step ends when both trunks are done (CFG fusion).
        trunks = [self._trunk(rows) for rows in groups]
        while trunks:
            for trunk in list(trunks):
                try:
                    next(trunk)
                except StopIteration:
                    trunks.remove(trunk)
        x = self.h.reshape(b * f, self.n, self.c)
        embedded_t = embedded_t.repeat_interleave(f, dim=0, output_size=embedded_t.shape[0] * f
                                                  ).view(-1, embedded_t.shape[-1])
        shift, scale = (m.scale_shift_table[None] + embedded_t[:, None]).chunk(2, dim=1)
        x = m.norm_out(x)
        x = x * (1 + scale) + shift
        x = m.proj_out(x)
        p, oc = m.config.patch_size, m.out_channels
        x = x.reshape(shape=(-1, ph, pw, p, p, oc))
        x = torch.einsum("nhwpqc->nchpwq", x)
        out = x.reshape(shape=(-1, oc, ph * p, pw * p))
        return out.reshape(b, -1, out.shape[-3], out.shape[-2], out.shape[-1]).permute(0, 2, 1, 3, 4)

    def _trunk(self, rows: list[int]):
        """The transformer blocks for ``rows`` (a generator: it yields after launching
        segments, so another branch's trunk may run meanwhile)."""
        m, f = self.m, self.f
        for layer, (sblock, tblock) in enumerate(zip(m.transformer_blocks, m.temporal_transformer_blocks)):
            for op in ("spatial_attn", "cross_attn", "spatial_ffn"):
                yield from self.operator(layer, op, sblock, rows)
            if layer == 0 and f > 1:
                yield from self.flush_rows(rows)
                temp = m.temp_pos_embed.to(self.h.dtype).reshape(1, f, 1, self.c)
                if len(rows) == self.b:
                    self.h = self.h + temp
                else:   # the same elementwise add, on these rows only
                    idx = torch.tensor(rows, dtype=torch.long)
                    self.h = self.h.index_copy(0, idx, self.h.index_select(0, idx) + temp)
            for op in ("temporal_attn", "temporal_ffn"):
                yield from self.operator(layer, op, tblock, rows)
        yield from self.flush_rows(rows)

    # ---- one operator for some rows of the call -------------------------------------
    def operator(self, layer: int, op: str, block, rows: list[int]):
        """Decide, then compute or queue for a segment, ``(layer, op)`` for ``rows`` (a
        generator, see :meth:`flush_rows`)."""
        hook, st = self.hook, self.hook.state
        index = layer * len(OP_TYPES) + OP_TYPES.index(op)
        decisions: dict[int, Decision] = {}
        for row in rows:
            br, j = self.branch_of[row], self.sample_of[row]
            bstate = st.branches[br]
            out_key, in_key = hook.key(br, j, layer, op), hook.key(br, j, layer, op, "in")
            slot, kept = bstate.slots.get(out_key), bstate.kept.get(in_key)
            q = OpQuery(step=self.step, num_steps=self.num_steps, branch=br, sample=j,
                        layer=layer, op=op, index=index, num_layers=hook.num_layers,
                        cached_step=None if slot is None else slot[1],
                        kept_step=None if kept is None else kept[1],
                        segment_open=bool(self.pending[row]),
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
            gates = self.gate(block, op, torch.tensor(reuse, dtype=torch.long))
            for g, row in zip(gates, reuse):
                self.pending[row].append((g, layer, op, index, decisions[row].reason))
        if not compute:
            return
        yield from self.flush_rows(compute)
        samples = torch.tensor(compute, dtype=torch.long)
        x_before = {row: self.h[row] for row in compute if decisions[row].keep_input}
        out = self.compute(block, op, samples)
        for pos, row in enumerate(compute):
            d = decisions[row]
            stored = self.store(row, layer, op, out[pos]) if d.store else 0
            kept = self.keep_input(row, layer, op, x_before[row]) if d.keep_input else 0
            hook.emit(OpEvent(**self._event_fields(row), layer=layer, op=op, index=index,
                              reused=False, reason=d.reason, tokens=self.f * self.n,
                              channels=self.c, dtype=hook.fmt, stored_bytes=stored,
                              kept_bytes=kept))

    def _bytes_written(self) -> int:
        return self.driver.stats["bytes_written"]

    def _modulation(self, block, samples: torch.Tensor, repeat: int):
        t = self.t_emb if len(samples) == self.b else self.t_emb.index_select(0, samples)
        t = t.repeat_interleave(repeat, dim=0, output_size=t.shape[0] * repeat).view(-1, t.shape[-1])
        return (block.scale_shift_table[None] + t.reshape(t.shape[0], 6, -1)).chunk(6, dim=1)

    def gate(self, block, op: str, samples: torch.Tensor) -> torch.Tensor:
        """The op's adaLN gates [len(samples), C] at this step, in the NME format (the digit
        model's label enters adaLN too, so gates differ between samples of one branch)."""
        if op == "cross_attn":
            return torch.ones(len(samples), self.c, dtype=self.dtype)
        return self._modulation(block, samples, 1)[_GATE_CHUNK[op]][:, 0, :].to(self.dtype)

    def compute(self, block, op: str, samples: torch.Tensor) -> torch.Tensor:
        """Run ``op`` on the xPU for ``samples``; update self.h; return the pre-gate output in
        canonical layout [len(samples), F, N, C]."""
        full = len(samples) == self.b
        h = self.h if full else self.h.index_select(0, samples)
        s, f, n, c = h.shape
        temporal = op.startswith("temporal")
        if temporal:
            x = h.permute(0, 2, 1, 3).reshape(s * n, f, c)
            mods = self._modulation(block, samples, n)
        else:
            x = h.reshape(s * f, n, c)
            mods = self._modulation(block, samples, f) if op != "cross_attn" else None
        if op in ("spatial_attn", "temporal_attn"):
            shift_msa, scale_msa, gate_msa = mods[0], mods[1], mods[2]
            norm = block.norm1(x) * (1 + scale_msa) + shift_msa
            out = block.attn1(norm, encoder_hidden_states=None, attention_mask=None)
            x = gate_msa * out + x
        elif op == "cross_attn":
            ehs = self.ehs if full else self.ehs.index_select(0, samples)
            ehs = ehs.repeat_interleave(f, dim=0, output_size=ehs.shape[0] * f).view(-1, ehs.shape[-2], ehs.shape[-1])
            out = block.attn2(x, encoder_hidden_states=ehs, attention_mask=self.mask)
            x = out + x
        else:
            shift_mlp, scale_mlp, gate_mlp = mods[3], mods[4], mods[5]
            norm = block.norm2(x) * (1 + scale_mlp) + shift_mlp
            out = block.ff(norm)
            x = gate_mlp * out + x
        if temporal:
            x = x.reshape(s, n, f, c).permute(0, 2, 1, 3)
            out = out.reshape(s, n, f, c).permute(0, 2, 1, 3)
        else:
            x, out = x.reshape(s, f, n, c), out.reshape(s, f, n, c)
        if full:
            self.h = x.contiguous()
        else:
            self.h = self.h.index_copy(0, samples, x.contiguous())
        return out

    def store(self, row: int, layer: int, op: str, out: torch.Tensor) -> int:
        """Write one row's pre-gate output [F, N, C] to its slot; returns the bytes written."""
        br, j = self.branch_of[row], self.sample_of[row]
        tensor = out.reshape(-1, self.c).to(self.dtype).contiguous()
        key = self.hook.key(br, j, layer, op)
        before = self._bytes_written()
        self.driver.store(key, tensor)
        self.hook.state.branches[br].slots[key] = (tuple(tensor.shape), self.step)
        return self._bytes_written() - before

    def keep_input(self, row: int, layer: int, op: str, x: torch.Tensor) -> int:
        """Keep one row's operator input [F, N, C] (its value before the operator) in rank
        memory as a monitor reference, with ``Σ|x|`` in fp32; returns the bytes written."""
        br, j = self.branch_of[row], self.sample_of[row]
        tensor = x.reshape(-1, self.c).to(self.dtype).contiguous()
        key = self.hook.key(br, j, layer, op, "in")
        before = self._bytes_written()
        self.driver.store(key, tensor)
        norm = float(tensor.float().abs().sum())
        self.hook.state.branches[br].kept[key] = (tuple(tensor.shape), self.step, norm)
        return self._bytes_written() - before

    def input_change(self, row: int, layer: int, op: str, index: int) -> float:
        """The relative L1 change of a row's operator input against its kept reference, the
        numerator on the NMEs (``driver.l1_to_slot``); emits a MonitorEvent."""
        self.flush(row)
        br, j = self.branch_of[row], self.sample_of[row]
        key = self.hook.key(br, j, layer, op, "in")
        shape, ref_step, norm = self.hook.state.branches[br].kept[key]
        x16 = self.h[row].reshape(-1, self.c).to(self.dtype).contiguous()
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
        """Launch a row's pending reused operators as one segment ``y = x + Σ g_k ⊙ c_k``.
        The NME takes at most MAX_SEGMENT_TERMS terms per program; chained programs round
        exactly as one left-to-right evaluation does: all but the last are waited for."""
        run, self.pending[row] = self.pending[row], []
        hook = self.hook
        br, j = self.branch_of[row], self.sample_of[row]
        slots = hook.state.branches[br].slots
        x16 = self.h[row].reshape(-1, self.c).to(self.dtype).contiguous()
        keys = [hook.key(br, j, layer, op) for _, layer, op, _, _ in run]
        for key, (_, layer, op, _, _) in zip(keys, run):
            if key not in slots or slots[key][0] != tuple(x16.shape) or key not in self.driver:
                raise ScheduleError(
                    f"step {self.step}, branch {br}, sample {j}: reuse of ({layer}, {op!r}) needs "
                    f"a cached tensor of shape {tuple(x16.shape)}, found "
                    f"{slots[key][0] if key in slots else None}")
        submit = getattr(self.driver, "segment_submit", None)
        if submit is None:      # a driver without asynchronous launches
            submit = lambda *a: PendingOp.done(self.driver.segment(*a))  # noqa: E731
        launches, y = [], x16
        for i in range(0, len(run), MAX_SEGMENT_TERMS):
            if launches:
                y = launches[-1].result()
            launches.append(submit(y, [g for g, *_ in run[i:i + MAX_SEGMENT_TERMS]],
                                   keys[i:i + MAX_SEGMENT_TERMS]))
        return row, run, launches

    def _finish_segment(self, row: int, run: list, launches: list) -> None:
        """Take a launched segment's result into the row; emit its OpEvents and SegmentEvent."""
        hook = self.hook
        y = launches[-1].result()
        self.h[row] = y.to(self.h.dtype).reshape(self.h.shape[1:])
        seg = hook.state.segments
        hook.state.segments += 1
        fields = self._event_fields(row)
        for _, layer, op, index, reason in run:
            hook.emit(OpEvent(**fields, layer=layer, op=op, index=index, reused=True,
                              reason=reason, tokens=self.f * self.n, channels=self.c,
                              dtype=hook.fmt, segment=seg))
        hook.emit(SegmentEvent(
            **fields, segment=seg, ops=tuple((layer, op) for _, layer, op, _, _ in run),
            first_index=run[0][3], tokens=self.f * self.n, channels=self.c, dtype=hook.fmt,
            bytes_to_nmp=sum(p.bytes_to_nmp for p in launches),
            bytes_from_nmp=sum(p.bytes_from_nmp for p in launches),
            programs=sum(p.programs for p in launches),
            nme_cycles=sum(p.nme_cycles for p in launches)))


def apply_coda_cache(transformer: torch.nn.Module, config: CodaCacheConfig) -> CodaCacheHook:
    """Register the CODA cache hook on a ``LatteTransformer3DModel``.

    Args:
        transformer: the diffusers Latte transformer (``DigitLatte.transformer``).
        config: driver, policy, cache dtype, slot keeping, event log.
    Returns:
        the hook (``hook.events``: the operator events; ``hook.stats``: the counters of the
        current or last generation).
    Raises:
        TypeError / ValueError: not a Latte transformer with adaLN-single; a hook already
        there; a cache dtype that disagrees with the driver; a policy that is not one.
    """
    from diffusers.hooks import HookRegistry

    hook = CodaCacheHook(config)     # checks the config before anything is registered
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    registry.register_hook(hook, HOOK_NAME)
    return hook


def get_coda_cache_hook(transformer: torch.nn.Module) -> CodaCacheHook | None:
    """The registered hook, or None."""
    registry = getattr(transformer, "_diffusers_hook", None)
    return None if registry is None else registry.get_hook(HOOK_NAME)


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
