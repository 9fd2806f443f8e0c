"""Model shapes: the cacheable operators of a video DiT at one resolution and duration, with
the FLOPs and bytes of every GPU kernel they launch; what the rest of the system model
(workload, schedules, replay) reads of a model.

Where they come from: :mod:`coda.host.system.presets` (the models ``coda sim`` knows, how a
resolution and a duration map to a latent, and the entry point
:func:`~coda.host.system.presets.model_shape`), :mod:`coda.host.system.trace` (every diffusers
model traced on the ``meta`` device, its operators those of the cache engine's adapter) and
:func:`~coda.host.system.presets.opensora_shape` (Open-Sora 1.2, no diffusers class, written
by hand). Units: FLOPs (multiply-add = 2), bytes, tokens per sample. Every per-kernel number
is per sample (batch 1) except ``weight_bytes``, read once per kernel whatever the batch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["GEMM", "ATTENTION", "MEMORY", "CLASSES", "Kernels", "OpShape", "ModelShape"]

#: kernel classes (efficiency factors in :mod:`coda.host.system.platforms` are per class)
GEMM, ATTENTION, MEMORY = 0, 1, 2
CLASSES = ("gemm", "attention", "memory")


@dataclass
class Kernels:
    """The GPU kernels of one operator (or of the non-cacheable rest of a forward).

    Attributes (numpy arrays, one entry per kernel, all per sample except weight_bytes):
        flops: floating-point operations (FLOPs, a multiply-add counts 2).
        act_bytes: activation bytes read and written (scale with the batch).
        weight_bytes: parameter bytes read (once per kernel, whatever the batch).
        cls: kernel class (:data:`GEMM`, :data:`ATTENTION`, :data:`MEMORY`).
    """
    flops: np.ndarray = field(default_factory=lambda: np.zeros(0))
    act_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    weight_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cls: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))

    @classmethod
    def from_rows(cls, rows: list[tuple[float, float, float, int]]) -> "Kernels":
        if not rows:
            return cls()
        a = np.asarray(rows, dtype=np.float64)
        return cls(a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy(), a[:, 3].astype(np.int8))

    def __add__(self, other: "Kernels") -> "Kernels":
        return Kernels(np.concatenate([self.flops, other.flops]),
                       np.concatenate([self.act_bytes, other.act_bytes]),
                       np.concatenate([self.weight_bytes, other.weight_bytes]),
                       np.concatenate([self.cls, other.cls]))

    @property
    def count(self) -> int:
        return len(self.flops)

    def total_flops(self, batch: int = 1) -> float:
        return float(self.flops.sum()) * batch

    def total_bytes(self, batch: int = 1) -> float:
        return float(self.act_bytes.sum()) * batch + float(self.weight_bytes.sum())

    def to_dict(self) -> dict:
        return {"flops": self.flops.tolist(), "act_bytes": self.act_bytes.tolist(),
                "weight_bytes": self.weight_bytes.tolist(), "cls": self.cls.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "Kernels":
        return cls(np.asarray(d["flops"], np.float64), np.asarray(d["act_bytes"], np.float64),
                   np.asarray(d["weight_bytes"], np.float64), np.asarray(d["cls"], np.int8))


@dataclass
class OpShape:
    """One cacheable operator of the model, in forward order.

    Attributes:
        index: forward position. layer: the model's layer (block) index it belongs to.
        op: operator name, as the cache engine names it (``host/cache/arch``: e.g. Wan's ``"attn"``,
            Latte's ``"spatial_attn"``).
        kind: the shipped model's operator type it corresponds to, for transferring
            schedules (one of :data:`coda.host.cache.schedule.OP_TYPES`).
        tokens, channels: the cached output per sample, ``[T, C]`` (for joint text-video
            attention T counts the text tokens too).
        gated: an adaLN gate scales the output (else the gate is 1).
        barrier_after: a computed, non-cacheable operation follows (no segment spans it).
        kernels: its GPU kernels (norm and modulation before it included).
        stream_tokens: for a model with two residual streams (CogVideoX, HunyuanVideo: video
            then text tokens, each with its own gates and NME programs, as the cache engine
            runs them: ``host/cache/arch``), the tokens of each; () for one stream.
    """
    index: int
    layer: int
    op: str
    kind: str
    tokens: int
    channels: int
    gated: bool
    barrier_after: bool
    kernels: Kernels
    stream_tokens: tuple = ()

    @property
    def ref(self) -> tuple[int, str]:
        return (self.layer, self.op)


@dataclass
class ModelShape:
    """A model at one resolution and length: its cacheable operators and the rest.

    Attributes:
        name, title: preset key and a readable name. source: where the config comes from.
        traced: True if measured by a meta-device forward (else hand-written).
        height, width, frames: the video in pixels and frames.
        latent: (frames, height, width) of the latent the transformer sees.
        video_tokens, text_tokens: per sample.
        hidden: model width C. num_layers: layers (blocks, Latte: spatial+temporal pairs).
        cfg: how CFG runs: ``"batched"`` (cond and uncond in one batch-2 call), ``"two_pass"``
            (two calls per step) or ``"distilled"`` (one call, guidance embedded: no uncond).
        params: parameters; weight_bytes: their bytes in the run dtype.
        dtype_bytes: bytes per activation/cache element (2: bf16/fp16).
        ops: the cacheable operators. other: the kernels of everything else of a forward.
        activation_bytes: largest single kernel's inputs + output (a working-set bound).
        trace_s: seconds the trace took here.
    """
    name: str
    title: str
    source: str
    traced: bool
    height: int
    width: int
    frames: int
    latent: tuple[int, int, int]
    video_tokens: int
    text_tokens: int
    hidden: int
    num_layers: int
    cfg: str
    params: int
    weight_bytes: int
    dtype_bytes: int
    ops: list[OpShape]
    other: Kernels
    activation_bytes: int
    trace_s: float = 0.0

    @property
    def forward_flops(self) -> float:
        """FLOPs of one forward of one sample (all operators + the rest)."""
        return sum(o.kernels.total_flops() for o in self.ops) + self.other.total_flops()

    def op_bytes(self, op: OpShape) -> int:
        """Bytes of one cached output of ``op`` per sample: T x C elements."""
        return op.tokens * op.channels * self.dtype_bytes

    def all_ops_cache_bytes(self, branches: int = 2) -> int:
        """Bytes to hold every cacheable operator's output of every branch (the cache of a
        schedule that reuses every operator at some step)."""
        return branches * sum(self.op_bytes(o) for o in self.ops)

    def describe(self) -> dict:
        return {"name": self.name, "title": self.title, "source": self.source,
                "traced": self.traced, "height": self.height, "width": self.width,
                "frames": self.frames, "latent": list(self.latent),
                "video_tokens": self.video_tokens, "text_tokens": self.text_tokens,
                "hidden": self.hidden, "num_layers": self.num_layers, "cfg": self.cfg,
                "params": self.params, "weight_bytes": self.weight_bytes,
                "cacheable_ops": len(self.ops), "forward_flops": self.forward_flops,
                "cached_tensor_bytes": max((self.op_bytes(o) for o in self.ops), default=0)}

    def to_json(self) -> str:
        d = {k: v for k, v in self.__dict__.items() if k not in ("ops", "other")}
        d["latent"] = list(self.latent)
        d["other"] = self.other.to_dict()
        d["ops"] = [{**{k: v for k, v in asdict(o).items() if k != "kernels"},
                     "kernels": o.kernels.to_dict()} for o in self.ops]
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "ModelShape":
        d = json.loads(text)
        d["latent"] = tuple(d["latent"])
        d["other"] = Kernels.from_dict(d["other"])
        d["ops"] = [OpShape(**{**o, "kernels": Kernels.from_dict(o["kernels"]),
                               "stream_tokens": tuple(o.get("stream_tokens", ()))})
                    for o in d["ops"]]
        return cls(**d)

