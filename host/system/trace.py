"""The meta-device trace: a diffusers video transformer's cacheable operators and the GPU
kernels of each, measured rather than written down.

:func:`trace` instantiates the diffusers transformer class from a :class:`ModelSpec`'s
published config on the ``meta`` device (no weights, no memory), runs one forward there at the
requested latent shape, records every aten kernel (FLOPs from torch's own formulas, bytes),
counts ``scaled_dot_product_attention`` as one fused kernel and attributes every kernel to
the cacheable operator it belongs to (its docstring has how). What the operators are is the
cache engine's adapter's (:mod:`coda.host.cache.arch`), not restated here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from .shapes import ATTENTION, GEMM, MEMORY, Kernels, ModelShape, OpShape

__all__ = ["ModelSpec", "SHIPPED_KIND", "LAYER_KEYS", "with_layers", "build", "inputs", "trace"]


@dataclass(frozen=True)
class ModelSpec:
    """A model preset: the diffusers class and its published config, and how videos map to
    latents. Every number has its source in ``source``/``notes``. Its cacheable operators are
    those of the cache engine's adapter for ``cls`` (:data:`coda.host.cache.arch.ARCHITECTURES`).

    Attributes:
        title: readable name. cls: diffusers transformer class name (None: hand-written).
        config: the class's constructor arguments (the published ``transformer/config.json``).
        source: URL of that config. vae: (temporal, spatial) compression of the VAE.
        patch: (t, h, w) patch size. latent_channels: channels of the latent.
        fps: frames per second of the model's videos. frame_rule: ``"4k+1"`` (causal video
            VAE: frames = seconds*fps + 1), ``"fixed:N"`` (exactly N frames), ``"opensora"``.
        text_tokens: prompt tokens the pipeline pads to. text_dim: text-encoder width.
        cfg: ``"batched"``, ``"two_pass"`` or ``"distilled"`` (the diffusers pipeline's loop).
        dtype: the run dtype of the weights and activations.
        notes: sources of the rest (fps, frame rule, CFG).
    """
    title: str
    cls: str | None
    config: dict
    source: str
    vae: tuple[int, int]
    patch: tuple[int, int, int]
    latent_channels: int
    fps: float | None
    frame_rule: str
    text_tokens: int
    text_dim: int
    cfg: str
    dtype: str = "bf16"
    notes: str = ""

    def latent(self, name: str, height: int, width: int, frames: int) -> tuple[int, int, int]:
        """(frames, height, width) of the latent of a ``height x width`` video of ``frames``
        frames. Raises ValueError (naming model ``name``) for a size the VAE and the patch
        do not divide."""
        t, s = self.vae
        div = s * self.patch[1]
        if height % div or width % div or height < div or width < div:
            raise ValueError(f"--resolution {width}x{height}: {name} takes heights and widths "
                             f"that are positive multiples of {div} (VAE {s} x patch "
                             f"{self.patch[1]})")
        return ((frames - 1) // t + 1 if t > 1 else frames, height // s, width // s)


#: the shipped model's operator type (:data:`coda.host.cache.schedule.OP_TYPES`) an operator
#: type of another architecture corresponds to, for transferring schedules
#: (:mod:`coda.host.system.schedules`); a shipped type is itself
SHIPPED_KIND = {"attn": "spatial_attn", "ffn": "spatial_ffn", "single": "spatial_ffn"}


def _is_view(func) -> bool:
    return any(r.alias_info is not None for r in func._schema.returns)


_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
              "_unsafe_view", "lift_fresh", "detach", "alias", "unbind", "split",
              "split_with_sizes", "chunk", "_local_scalar_dense", "sym_size", "sym_stride",
              "sym_numel", "sym_storage_offset", "is_same_size"}
_GEMM = {"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution", "conv2d",
         "conv3d", "linear"}


class _Tracer:
    """Collects kernels per cacheable operator during a meta-device forward.

    ``refs`` are the adapter's blocks (:class:`coda.host.cache.arch.base.BlockRef`) in
    forward order; records are keyed ``(block index in refs, op)``.
    """

    def __init__(self, model, refs, elem_bytes: int):
        self.model = model
        self.refs = refs
        self.params = {id(p) for p in model.parameters()} | {id(b) for b in model.buffers()}
        self.elem_bytes = elem_bytes
        self.pending: list[tuple] = []
        self.other: list[tuple] = []
        self.ops: dict[tuple[int, str], dict] = {}   # (block, op) -> record
        self.order: list[tuple[int, str]] = []
        self.barriers: set[tuple[int, str]] = set()  # (block, op) a computation follows
        self.max_working = 0
        self.batch = 1
        self._handles = []
        self._last_block: int | None = None          # the block that ended last
        self._computed = False                       # a non-layout kernel since then
        for i, ref in enumerate(refs):
            self._hook_block(i, ref.module, ref.spec)

    def _hook_block(self, i, block, spec):
        self._handles.append(block.register_forward_pre_hook(
            lambda m, a, i=i: self._block_start(i)))
        self._handles.append(block.register_forward_hook(
            lambda m, a, out, i=i, spec=spec: self._block_end(i, spec, out)))
        for op in spec.ops:
            for attr in spec.op_modules[op]:
                mod = getattr(block, attr)
                self._handles.append(mod.register_forward_hook(
                    lambda m, a, out, i=i, op=op: self._op_end(i, op, out)))

    def _record(self, i, op) -> dict:
        key = (i, op)
        if key not in self.ops:
            self.ops[key] = {"rows": [], "tokens": 0, "channels": 0}
            self.order.append(key)
        return self.ops[key]

    def _tokens(self, out) -> tuple[int, int]:
        import torch
        tensors = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                   if isinstance(t, torch.Tensor)]
        c = tensors[0].shape[-1]
        return sum(t.numel() for t in tensors) // (c * self.batch), c

    def _op_end(self, i, op, out):
        rec = self._record(i, op)
        rec["rows"] += self.pending
        self.pending = []
        t, c = self._tokens(out)
        rec["tokens"] += t
        rec["channels"] = c

    def _block_start(self, i):
        if self._last_block is not None and self._computed:
            prev = self._last_block
            self.barriers.add((prev, self.refs[prev].spec.ops[-1]))
        self.other += self.pending
        self.pending = []
        self._computed = False

    def _block_end(self, i, spec, out):
        whole = [op for op in spec.ops if spec.op_modules[op] == ()]
        if whole:
            rec = self._record(i, whole[0])
            rec["rows"] += self.pending
            t, c = self._tokens(out)
            rec["tokens"], rec["channels"] = t, c
        else:
            last = [k for k in self.order if k[0] == i][-1]
            self.ops[last]["rows"] += self.pending
        self.pending = []
        self._last_block, self._computed = i, False

    def add(self, flops: float, act: float, weight: float, cls: int,
            layout: bool = False) -> None:
        self.pending.append((flops, act, weight, cls))
        self._computed = self._computed or not layout

    def close(self):
        for h in self._handles:
            h.remove()


def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def _make_modes(tracer: _Tracer):
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    from coda.host.cache.arch.deferred import LAYOUT_OPS

    class Attention(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                names = ("query", "key", "value")
                q, k, v = (args[i] if i < len(args) else kwargs[n] for i, n in enumerate(names))
                out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
                heads = math.prod(q.shape[:-2])
                flops = 2.0 * heads * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
                act = sum(_tensor_bytes(t) for t in (q, k, v, out))
                tracer.add(flops / tracer.batch, act / tracer.batch, 0.0, ATTENTION)
                tracer.max_working = max(tracer.max_working, act)
                return out
            return func(*args, **kwargs)

    class Kernels_(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if _is_view(func) and name not in ("copy_",) or name in _NO_KERNEL:
                return out
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            weight = act = 0
            for t in ins:
                base = t._base if t._base is not None else t
                if id(base) in tracer.params:
                    weight += _tensor_bytes(t)
                else:
                    act += _tensor_bytes(t)
            act += sum(_tensor_bytes(t) for t in outs if not (name.endswith("_") and t in ins))
            flops = 0.0
            fn = flop_registry.get(func.overloadpacket)
            if fn is not None:
                flops = float(fn(*args, **kwargs, out_val=out))
            cls = GEMM if name in _GEMM else MEMORY
            tracer.add(flops / tracer.batch, act / tracer.batch, float(weight), cls,
                       layout=func in LAYOUT_OPS)
            tracer.max_working = max(tracer.max_working, act + weight)
            return out

    return Attention(), Kernels_()


#: the configuration keys that count a diffusers video transformer's blocks (per block list)
LAYER_KEYS = ("num_layers", "num_single_layers")


def with_layers(spec: ModelSpec, layers: int | None) -> ModelSpec:
    """``spec`` with at most ``layers`` blocks in each block list (:data:`LAYER_KEYS`: Wan,
    CogVideoX, Latte ``num_layers``; HunyuanVideo also ``num_single_layers``), for measuring one
    block (``coda calibrate``) or checking a model at a small size; None: ``spec`` itself.
    Raises ValueError for ``layers < 1``."""
    if layers is None:
        return spec
    if int(layers) < 1:
        raise ValueError(f"layers={layers}: expected >= 1")
    config = {k: min(int(layers), v) if k in LAYER_KEYS else v for k, v in spec.config.items()}
    return replace(spec, config=config)


def build(spec: ModelSpec, device="meta", seed: int | None = None):
    """``spec``'s diffusers model in its run dtype on ``device``: (model, torch dtype). On the
    meta device (the default) it has no weights; elsewhere its weights are the class's own
    random initialisation after ``torch.manual_seed(seed)`` (no download)."""
    import diffusers
    import torch

    cls = getattr(diffusers, spec.cls)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        model = cls(**spec.config)
    import logging
    logger = logging.getLogger("diffusers.models.modeling_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)      # Wan warns that some modules "should be kept in fp32"
    try:
        model = model.to(dtype).eval()
    finally:
        logger.setLevel(level)
    return model, dtype


def inputs(name: str, spec: ModelSpec, latent, dtype, device="meta", batch: int = 1,
           seed: int = 0) -> dict:
    """The keyword arguments of one transformer call of ``spec``'s class on a ``latent``
    (frames, height, width) of ``batch`` samples: latents and prompt embeddings of the
    pipeline's sizes (``spec.text_tokens`` x ``spec.text_dim``), timestep 0. On the meta
    device the tensors are empty; elsewhere normal draws of a generator seeded ``seed``.
    Raises ValueError for a class without a recipe."""
    import torch

    f, h, w = latent
    gen = None if str(device) == "meta" else torch.Generator(device).manual_seed(seed)

    def draw(*shape):
        if gen is None:
            return torch.empty(*shape, device=device, dtype=dtype)
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    b, c = batch, spec.latent_channels
    t = torch.zeros(b, dtype=torch.long, device=device)
    text = draw(b, spec.text_tokens, spec.text_dim)
    if spec.cls == "LatteTransformer3DModel":
        return dict(hidden_states=draw(b, c, f, h, w), timestep=t,
                    encoder_hidden_states=text, return_dict=False)
    if spec.cls == "CogVideoXTransformer3DModel":
        return dict(hidden_states=draw(b, f, c, h, w),
                    encoder_hidden_states=text, timestep=t, return_dict=False)
    if spec.cls == "WanTransformer3DModel":
        return dict(hidden_states=draw(b, c, f, h, w), timestep=t,
                    encoder_hidden_states=text, return_dict=False)
    if spec.cls == "HunyuanVideoTransformer3DModel":
        return dict(hidden_states=draw(b, c, f, h, w), timestep=t,
                    encoder_hidden_states=text,
                    encoder_attention_mask=torch.ones(b, spec.text_tokens, dtype=torch.bool,
                                                      device=device),
                    pooled_projections=draw(b, spec.config["pooled_projection_dim"]),
                    guidance=torch.zeros(b, device=device, dtype=dtype), return_dict=False)
    raise ValueError(f"{name}: no input recipe for {spec.cls}")


def trace(name: str, spec: ModelSpec, height: int, width: int, frames: int) -> ModelShape:
    """Trace model ``name`` (preset ``spec``, a diffusers class the cache engine serves) at
    ``height x width`` pixels and ``frames`` frames on the meta device.

    The forward runs under

    - a ``TorchDispatchMode`` sees every aten kernel (FLOPs from torch's own
      ``torch.utils.flop_counter`` formulas, bytes = the kernel's input and output tensors,
      parameter bytes apart), and
    - a ``TorchFunctionMode`` replaces ``F.scaled_dot_product_attention`` by one fused-attention
      kernel (FLOPs ``4·B·H·L·S·E``; bytes of q, k, v and the output: what a flash-attention
      kernel moves), instead of the ``bmm``/softmax decomposition the meta device would run;
    - forward hooks on each block's operator modules attribute every kernel to the cacheable
      operator it belongs to: the norm/modulation kernels before an operator's module and the
      module's own kernels are that operator's; the gated residual add after it goes to the next
      operator of the block (the last one of a block keeps the block's tail); kernels outside the
      blocks (embeddings, final layer, Latte's temporal position embedding) are ``other``.

    What the operators are is the cache engine's adapter's (:mod:`coda.host.cache.arch`), not
    restated here: its blocks in forward order with their layers
    (:meth:`~coda.host.cache.arch.base.Architecture.blocks`), each block's operators, the
    submodules that compute them, which are ungated and its residual streams
    (:class:`~coda.host.cache.arch.base.BlockSpec`). A segment barrier is read off the trace the
    way the engine meets one: a kernel between two blocks other than a pure layout operation
    (:data:`coda.host.cache.arch.deferred.LAYOUT_OPS`) computes on the residual stream, so no
    segment spans it (Latte's temporal position embedding after layer 0's spatial block).

    Returns:
        the :class:`~coda.host.system.shapes.ModelShape` (per-sample kernels of every
        cacheable operator and of the rest of one forward).
    Raises:
        ValueError: a resolution or frame count the model cannot take.
    """
    import torch

    from coda.host.cache.arch import ARCHITECTURES

    latent = spec.latent(name, height, width, frames)
    t0 = time.perf_counter()
    model, dtype = build(spec)
    elem = torch.empty(0, dtype=dtype).element_size()
    refs = ARCHITECTURES[spec.cls].blocks(model)
    tracer = _Tracer(model, refs, elem)
    attention, kernels = _make_modes(tracer)
    try:
        with torch.no_grad(), attention, kernels:
            model(**inputs(name, spec, latent, dtype))
    finally:
        tracer.close()
    tracer.other += tracer.pending
    ops: list[OpShape] = []
    f, h, w = latent
    p = spec.patch
    video_tokens = (f // p[0]) * (h // p[1]) * (w // p[2])
    for i, ref in enumerate(refs):
        two = len(ref.spec.streams) == 2
        for op in ref.spec.ops:
            rec = tracer.ops[(i, op)]
            tokens = int(rec["tokens"])
            streams = (video_tokens, tokens - video_tokens) if two and tokens > video_tokens else ()
            ops.append(OpShape(index=len(ops), layer=ref.layer, op=op,
                               kind=SHIPPED_KIND.get(op, op), tokens=tokens,
                               channels=int(rec["channels"]), gated=op not in ref.spec.ungated,
                               barrier_after=(i, op) in tracer.barriers,
                               kernels=Kernels.from_rows(rec["rows"]), stream_tokens=streams))
    params = sum(p.numel() for p in model.parameters())
    hidden = ops[0].channels
    return ModelShape(
        name=name, title=spec.title, source=spec.source, traced=True, height=height,
        width=width, frames=frames, latent=latent, video_tokens=video_tokens,
        text_tokens=spec.text_tokens, hidden=hidden,
        num_layers=1 + max(o.layer for o in ops), cfg=spec.cfg, params=int(params),
        weight_bytes=int(params * elem), dtype_bytes=2, ops=ops,
        other=Kernels.from_rows(tracer.other), activation_bytes=int(tracer.max_working),
        trace_s=round(time.perf_counter() - t0, 3))
