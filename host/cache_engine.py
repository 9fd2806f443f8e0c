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
``BasicTransformerBlock`` (``norm_type="ada_norm_single"``), so a schedule that reuses nothing
gives bit-identical outputs to the unhooked model. Per step and branch:

- a *computed* operator runs norm -> adaLN modulation -> attention/FFN on the xPU (float32),
  is added as ``x + gate * out``, and its pre-gate output ``out`` is written to its NMP cache
  slot (``driver.store``, in the NME format) if the next step reuses it;
- a *reused* operator skips its norm, modulation and attention entirely; only its current
  adaLN gate is computed (cross attention has none: gate = 1). Each maximal run of consecutive
  reused operators is one segment ``y = ((x + g0*c0) + g1*c1) + ...`` run by
  ``driver.segment`` (per sample) with x, the gates and the caches in the NME format (bf16 or fp16, from
  the driver's ``cfg.fmt``); the host casts y back to float32. This is what a deployment does:
  the xPU keeps float32 activations, the DIMMs hold 16-bit caches, and segment inputs/outputs
  cross PCIe in the 16-bit format.

Cache slots are per branch and sample (the conditional and unconditional outputs never mix;
a sample's tensor is [F*N, C] in token order (frame, patch)), and are freed on ``reset``; a
generation starting at step 0 frees its branch's slots first, so nothing is carried over.
A segment runs once per sample of its branch: the digit model's label enters adaLN, so each
sample has its own gates, and a gate is one [C] vector per NME program.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Hashable

import torch
from diffusers.hooks.hooks import ModelHook, StateManager

from .ops import MAX_SEGMENT_TERMS
from .schedule import BRANCHES, Schedule, ScheduleError, UniformIntervalPolicy, operator_order

__all__ = ["BATCHED_CFG", "CodaCacheConfig", "CodaCacheState", "CodaCacheHook",
           "apply_coda_cache", "remove_coda_cache", "reset_coda_cache", "get_coda_cache_hook",
           "HOOK_NAME"]

HOOK_NAME = "coda_cache"
BATCHED_CFG = "uncond|cond"
_NME_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_GATE_CHUNK = {"spatial_attn": 2, "temporal_attn": 2, "spatial_ffn": 5, "temporal_ffn": 5}
_hook_ids = itertools.count()


@dataclass
class CodaCacheConfig:
    """Configuration of the cache engine.

    Attributes:
        driver: the NMP driver (``coda.host.driver.NMPDriver``) holding the cache slots and
            running segments; anything with its ``store/segment/free/__contains__`` works.
        schedule: a concrete :class:`Schedule` (its ``num_steps`` must match the run) or a
            policy with ``build(num_steps, num_layers) -> Schedule`` (e.g.
            :class:`UniformIntervalPolicy`), built anew whenever the step count changes.
        cache_dtype: NME element format; default: from ``driver.cfg.fmt`` (bf16 if absent).
    """
    driver: Any
    schedule: Any = field(default_factory=UniformIntervalPolicy)
    cache_dtype: torch.dtype | None = None

    def resolved_dtype(self) -> torch.dtype:
        if self.cache_dtype is not None:
            if self.cache_dtype not in _NME_DTYPES.values():
                raise ValueError(f"cache_dtype={self.cache_dtype}: expected torch.bfloat16 or torch.float16")
            return self.cache_dtype
        fmt = getattr(getattr(self.driver, "cfg", None), "fmt", "bf16")
        if fmt not in _NME_DTYPES:
            raise ValueError(f"driver cfg.fmt={fmt!r}: expected one of {sorted(_NME_DTYPES)}")
        return _NME_DTYPES[fmt]


@dataclass
class _BranchState:
    last_step: int = -1
    slots: dict = field(default_factory=dict)      # key -> shape of the stored tensor


class CodaCacheState:
    """Per-generation state: the schedule in use, per-branch step counters and slots, stats.

    ``stats`` (per generation): ``ops_computed``, ``ops_reused``, ``segments``,
    ``segment_ops`` (reused operators run in segments), ``programs`` (NMP segment launches:
    a segment longer than the NME's 8 terms takes several), ``stores`` (slots written),
    ``calls`` (transformer forwards).
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.schedule: Schedule | None = None
        self.branches: dict[str, _BranchState] = {b: _BranchState() for b in BRANCHES}
        self.stats: dict[str, int] = dict(ops_computed=0, ops_reused=0, segments=0,
                                          segment_ops=0, programs=0, stores=0, calls=0)


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
        config: the :class:`CodaCacheConfig`.
        state: the :class:`CodaCacheState` (``state.stats`` for reports).
    """
    _is_stateful = True

    def __init__(self, config: CodaCacheConfig):
        super().__init__()
        self.config = config
        self.dtype = config.resolved_dtype()
        self.state = CodaCacheState()
        # diffusers' cache_context() delivers the CacheContext to StateManager attributes.
        self.context_manager = StateManager(CodaCacheState)
        self._tag = f"coda{next(_hook_ids)}"

    def initialize_hook(self, module):
        from diffusers import LatteTransformer3DModel

        if not isinstance(module, LatteTransformer3DModel):
            raise TypeError(f"{type(module).__name__}: the CODA cache hook needs a LatteTransformer3DModel")
        if module.config.norm_type != "ada_norm_single":
            raise ValueError(f"norm_type={module.config.norm_type!r}: expected 'ada_norm_single' (Latte)")
        self.num_layers = len(module.transformer_blocks)
        return module

    # ---- generation bookkeeping -------------------------------------------------
    def reset_state(self, module):
        for branch in self.state.branches.values():
            self._free_slots(branch)
        self.state.reset()
        return module

    def _free_slots(self, branch: _BranchState) -> None:
        for key in list(branch.slots):
            if key in self.config.driver:
                self.config.driver.free(key)
        branch.slots.clear()

    def _schedule_for(self, num_steps: int) -> Schedule:
        sched = self.config.schedule
        if isinstance(sched, Schedule):
            if sched.num_steps != num_steps or sched.num_layers != self.num_layers:
                raise ScheduleError(
                    f"schedule {sched.name!r} is for {sched.num_steps} steps x {sched.num_layers} "
                    f"layers; this run has {num_steps} steps x {self.num_layers} layers")
            return sched
        return sched.build(num_steps, self.num_layers)

    def _begin_call(self, ctx, branches: list[str]) -> int:
        if ctx.step_index is None or ctx.num_inference_steps is None:
            raise ValueError("cache_context must give step_index and num_inference_steps, e.g. "
                             "transformer.cache_context('cond', step_index=i, num_inference_steps=n)")
        step, n = int(ctx.step_index), int(ctx.num_inference_steps)
        if not 0 <= step < n:
            raise ValueError(f"step_index={step}: expected 0..{n - 1}")
        st = self.state
        for name in dict.fromkeys(branches):
            branch = st.branches[name]
            if step == 0:
                # A new generation of this branch: never reuse anything older.
                self._free_slots(branch)
                branch.last_step = -1
            elif step != branch.last_step + 1:
                raise ValueError(f"branch {name}: step {step} after step {branch.last_step}; "
                                 "steps must run in order from 0 (reset between generations)")
            branch.last_step = step
        if st.schedule is None or st.schedule.num_steps != n:
            if step != 0:
                raise ValueError(f"num_inference_steps changed to {n} at step {step}: "
                                 "start the new generation at step 0")
            st.schedule = self._schedule_for(n)
        st.stats["calls"] += 1
        return step

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
        if not return_dict:
            return (output,)
        from diffusers.models.modeling_outputs import Transformer2DModelOutput
        return Transformer2DModelOutput(sample=output)

    def key(self, branch: str, sample: int, layer: int, op: str) -> Hashable:
        """Slot key of one sample's (index within its branch) cached operator output."""
        return (self._tag, branch, sample, layer, op)



class _StepRun:
    """One transformer forward (one step, one or two branches) under a schedule."""

    def __init__(self, hook, model, hidden_states, timestep, encoder_hidden_states,
                 encoder_attention_mask, branches, step):
        self.hook, self.m = hook, model
        self.driver, self.dtype = hook.config.driver, hook.dtype
        self.schedule: Schedule = hook.state.schedule
        self.stats = hook.state.stats
        self.step = step
        self.x_in = hidden_states
        self.t_in, self.ehs_in, self.mask = timestep, encoder_hidden_states, encoder_attention_mask
        self.branches = branches
        self.rows = {b: torch.tensor([i for i, n in enumerate(branches) if n == b], dtype=torch.long)
                     for b in dict.fromkeys(branches)}
        self.pending: dict[str, list[tuple[torch.Tensor, int, str]]] = {b: [] for b in self.rows}

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
        for layer, (sblock, tblock) in enumerate(zip(m.transformer_blocks, m.temporal_transformer_blocks)):
            for op in ("spatial_attn", "cross_attn", "spatial_ffn"):
                self.operator(layer, op, sblock)
            if layer == 0 and f > 1:
                self.flush_all()
                self.h = self.h + m.temp_pos_embed.to(self.h.dtype).reshape(1, f, 1, self.c)
            for op in ("temporal_attn", "temporal_ffn"):
                self.operator(layer, op, tblock)
        self.flush_all()
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

    # ---- one operator for every branch of the call --------------------------------
    def operator(self, layer: int, op: str, block) -> None:
        compute = [br for br in self.rows if (layer, op) not in self.schedule.reused(self.step, br)]
        for br in self.rows:
            if br not in compute:
                self.pending[br].append((self.gate(block, op, self.rows[br]), layer, op))
                self.stats["ops_reused"] += 1
        if not compute:
            return
        for br in compute:
            self.flush(br)
        samples = torch.cat([self.rows[br] for br in compute]).sort().values
        out = self.compute(block, op, samples)
        self.stats["ops_computed"] += len(compute)
        for br in compute:
            if self.schedule.store_after_compute(self.step, br, (layer, op)):
                self.store(br, layer, op, out, samples)

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

    def store(self, br: str, layer: int, op: str, out: torch.Tensor, samples: torch.Tensor) -> None:
        """Write the pre-gate output of each of the branch's samples to its slot."""
        pos = torch.searchsorted(samples, self.rows[br])
        slots = self.hook.state.branches[br].slots
        for j, p in enumerate(pos.tolist()):
            tensor = out[p].reshape(-1, self.c).to(self.dtype).contiguous()
            key = self.hook.key(br, j, layer, op)
            self.driver.store(key, tensor)
            slots[key] = tuple(tensor.shape)
            self.stats["stores"] += 1

    # ---- segments -----------------------------------------------------------------
    def flush(self, br: str) -> None:
        """Run the branch's pending reused operators as one segment: per sample (each has
        its own gates and slots) ``y = x + Σ g_k ⊙ c_k`` on the NMP."""
        run = self.pending[br]
        if not run:
            return
        slots = self.hook.state.branches[br].slots
        for j, sample in enumerate(self.rows[br].tolist()):
            x16 = self.h[sample].reshape(-1, self.c).to(self.dtype).contiguous()
            keys = [self.hook.key(br, j, layer, op) for _, layer, op in run]
            for key, (_, layer, op) in zip(keys, run):
                if slots.get(key) != tuple(x16.shape) or key not in self.driver:
                    raise ScheduleError(
                        f"step {self.step}, branch {br}, sample {j}: reuse of ({layer}, {op!r}) needs "
                        f"a cached tensor of shape {tuple(x16.shape)}, found {slots.get(key)}")
            # The NME takes at most MAX_SEGMENT_TERMS terms per program; chaining programs
            # rounds exactly as one left-to-right evaluation does.
            y = x16
            for i in range(0, len(run), MAX_SEGMENT_TERMS):
                y = self.driver.segment(y, [g[j] for g, *_ in run[i:i + MAX_SEGMENT_TERMS]],
                                        keys[i:i + MAX_SEGMENT_TERMS])
                self.stats["programs"] += 1
            self.h[sample] = y.to(self.h.dtype).reshape(self.h.shape[1:])
        self.stats["segments"] += 1
        self.stats["segment_ops"] += len(run)
        self.pending[br] = []

    def flush_all(self) -> None:
        for br in self.rows:
            self.flush(br)


def apply_coda_cache(transformer: torch.nn.Module, config: CodaCacheConfig) -> CodaCacheHook:
    """Register the CODA cache hook on a ``LatteTransformer3DModel``.

    Args:
        transformer: the diffusers Latte transformer (``DigitLatte.transformer``).
        config: driver, schedule or policy, cache dtype.
    Returns:
        the hook (``hook.state.stats`` has the per-generation counters).
    Raises:
        TypeError / ValueError: not a Latte transformer with adaLN-single; a hook already there.
    """
    from diffusers.hooks import HookRegistry

    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    hook = CodaCacheHook(config)
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
