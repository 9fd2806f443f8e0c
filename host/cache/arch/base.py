"""What the cache engine needs to know about one diffusers video transformer.

An :class:`Architecture` names the transformer class it serves, finds its blocks by name (in
the order the model's own forward calls them, each with its layer number) and checks the
model's configuration and each call. A :class:`BlockSpec` describes one block type: its
cacheable operators in forward order, its residual streams, and for each operator how to
compute its pre-gate output ``c`` on the xPU, its gate ``g`` (one ``[C]`` vector per sample: the
NME broadcasts it along tokens) and how its residual is added, so that ``x + g ⊙ c`` is the
operator's effect on every stream. The engine (:mod:`coda.host.cache.engine`) does the rest:
policies, events, slots, segments, CFG interleaving.

A spec replays the block's forward with the same torch calls in the same order as the diffusers
code it mirrors, so a policy that reuses nothing gives the unhooked model's bits. That code is
pinned (:attr:`BlockSpec.pinned`: a hash of the mirrored functions' source); attaching to a
diffusers whose code differs is refused instead of giving other bits silently.

Layouts: the engine keeps each stream of a call's batch in a *canonical* layout
``[B, ..., C]`` whose per-sample flattening ``[T, C]`` is the token order of the cache slots;
:meth:`BlockSpec.to_canonical` / :meth:`BlockSpec.from_canonical` convert from / to the layout
the block receives and returns. They must accept a trailing dimension other than ``C`` (the
engine runs them on a ``[..., 1]`` token-index probe to check that a block's input is the
previous block's output, moved only by layout operations).
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from coda.host.cache.schedule import ModelOps

__all__ = ["UnsupportedModelError", "StepState", "BlockCall", "BlockSpec", "BlockRef",
           "Architecture", "source_hash"]


class UnsupportedModelError(TypeError):
    """A transformer (class, configuration or installed diffusers code) the cache engine
    cannot serve exactly."""


def source_hash(fn: Callable) -> str:
    """First 16 hex digits of the sha256 of ``fn``'s source text (``inspect.getsource``)."""
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        return "no-source"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class StepState(Protocol):
    """What a :class:`BlockSpec` sees of the engine during one transformer call.

    Attributes:
        b: rows (samples of all branches) of the call.
        h: stream name -> the batch's current residual stream, canonical layout, [B, ..., C].
    """
    b: int
    h: dict[str, torch.Tensor]

    def take(self, stream: str, samples: torch.Tensor) -> torch.Tensor:
        """``h[stream]`` rows ``samples`` (int64 [S]); the tensor itself when all rows."""

    def put(self, stream: str, samples: torch.Tensor, value: torch.Tensor) -> None:
        """Write rows ``samples`` of ``h[stream]`` (``value`` [S, ..., C])."""

    def rows(self, t: torch.Tensor | None, samples: torch.Tensor, per: int = 1):
        """Rows of a per-sample tensor ``t`` [B * per, ...] (``per`` rows per sample, e.g.
        Latte's per-frame copies): the tensor itself when all rows; None stays None."""


@dataclass
class BlockCall:
    """One call of a block inside a transformer forward, as the engine recorded it.

    Attributes:
        spec: the block type. block: the module. layer: its layer number (ModelOps).
        args: the call's arguments by parameter name, the residual-stream ones removed
            (the engine holds those). prep: what :meth:`BlockSpec.prepare` computed.
    """
    spec: "BlockSpec"
    block: torch.nn.Module
    layer: int
    args: dict[str, Any]
    prep: Any = None


class BlockSpec:
    """One block type of an architecture (subclass per block type).

    Class attributes:
        block_class: the diffusers block class it replays.
        ops: its cacheable operators in forward order (op types of :mod:`coda.host.cache.schedule`).
        op_modules: op -> the attributes of the block's submodules that compute it (several:
            one per stream; ``()``: the whole block), for code that attributes work to
            operators without running :meth:`compute` (the system model's meta-device trace).
        ungated: the ops whose residual is added without a gate (:meth:`gates` gives 1).
        streams: residual stream name -> the forward parameter carrying it, in the order the
            block returns them (``"hidden"``, the video tokens, first).
        returns_tuple: the block returns a tuple of its streams (else the one tensor).
    """
    block_class: str = ""
    ops: tuple[str, ...] = ()
    op_modules: dict[str, tuple[str, ...]] = {}
    ungated: frozenset[str] = frozenset()
    streams: dict[str, str] = {"hidden": "hidden_states"}
    returns_tuple: bool = False

    def pinned(self) -> dict[str, tuple[Callable, str]]:
        """``{qualified name: (function, source hash)}`` of the diffusers code it mirrors."""
        return {}

    # ---- arguments ----------------------------------------------------------------
    def bind(self, block: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's arguments by name (``type(block).forward``'s signature).
        Raises TypeError for arguments the block does not take."""
        sig = inspect.signature(type(block).forward)
        bound = sig.bind(block, *args, **kwargs)
        bound.apply_defaults()
        out = dict(bound.arguments)
        out.pop(next(iter(sig.parameters)))      # self
        return out

    def check(self, call: BlockCall) -> None:
        """Refuse (ValueError) a call the replay does not cover."""

    # ---- layouts -------------------------------------------------------------------
    def to_canonical(self, stream: str, x: torch.Tensor, batch: int) -> torch.Tensor:
        """The block's input layout -> canonical [B, ..., C] (default: [B, T, C] both)."""
        return x

    def from_canonical(self, stream: str, h: torch.Tensor) -> torch.Tensor:
        """Canonical -> the block's output layout, contiguous."""
        return h.contiguous()

    # ---- operators -----------------------------------------------------------------
    def prepare(self, call: BlockCall, batch: int) -> Any:
        """Per-call values for all rows (modulation vectors), computed once on the whole
        batch exactly as the block computes them (a GEMM on fewer rows may round otherwise)."""
        return None

    def compute(self, state: StepState, call: BlockCall, op: str,
                samples: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run ``op`` on the xPU for rows ``samples`` (int64 [S]): update ``state.h`` as the
        block does; return its pre-gate output per stream, canonical rows [S, ..., C]."""
        raise NotImplementedError

    def gates(self, state: StepState, call: BlockCall, op: str,
              samples: torch.Tensor) -> dict[str, torch.Tensor]:
        """``op``'s gate per stream for rows ``samples``: [S, C] (model dtype); the residual
        is ``x + g ⊙ c`` (an ungated residual has g = 1)."""
        raise NotImplementedError


@dataclass(frozen=True)
class BlockRef:
    """A block of a model: its qualified name (``"blocks.3"``), module, spec, layer."""
    name: str
    module: torch.nn.Module
    spec: BlockSpec
    layer: int


class Architecture:
    """A diffusers transformer class the engine serves (one subclass per file).

    Class attributes:
        name: the :data:`coda.host.cache.schedule.ARCH_OP_TYPES` key. model_class: the diffusers
        class name. block_lists: ``(attribute, spec)`` of the block ``ModuleList`` s.
        barriers: what ends a segment, in words (README / report).
    """
    name: str = ""
    model_class: str = ""
    block_lists: tuple[tuple[str, BlockSpec], ...] = ()
    barriers: str = "none: the residual streams pass straight from block to block"

    def model_type(self) -> type:
        import diffusers

        return getattr(diffusers, self.model_class)

    def blocks(self, model: torch.nn.Module) -> list[BlockRef]:
        """The model's blocks in the order its forward calls them, with their layers
        (default: the lists one after the other, layers counting on)."""
        out, layer = [], 0
        for attr, spec in self.block_lists:
            for i, block in enumerate(getattr(model, attr)):
                out.append(BlockRef(f"{attr}.{i}", block, spec, layer))
                layer += 1
        return out

    def model_ops(self, model: torch.nn.Module) -> ModelOps:
        """The model's cacheable operators in forward order."""
        return ModelOps(self.name, tuple((ref.layer, op) for ref in self.blocks(model)
                                         for op in ref.spec.ops))

    def check_model(self, model: torch.nn.Module) -> None:
        """Refuse a configuration or installed diffusers code the specs do not mirror.

        Raises:
            UnsupportedModelError: a block of another class than its spec replays, or
                diffusers code whose source differs from the pinned one.
        """
        for ref in self.blocks(model):
            want = ref.spec.block_class
            if type(ref.module).__name__ != want:
                raise UnsupportedModelError(
                    f"{type(model).__name__}.{ref.name} is a {type(ref.module).__name__}; the "
                    f"CODA {self.name} adapter replays {want} blocks only")
        specs = {type(spec): spec for _, spec in self.block_lists}
        for spec in specs.values():
            for qual, (fn, digest) in spec.pinned().items():
                got = source_hash(fn)
                if got != digest:
                    import diffusers

                    raise UnsupportedModelError(
                        f"diffusers {diffusers.__version__}: {qual} differs from the diffusers "
                        f"0.42.1 code the CODA {self.name} adapter replays (source sha256 "
                        f"{got}, expected {digest}); refusing rather than computing other bits")

    def bind_call(self, model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The transformer call's arguments by name."""
        sig = inspect.signature(type(model).forward)
        bound = sig.bind(model, *args, **kwargs)
        bound.apply_defaults()
        out = dict(bound.arguments)
        out.pop(next(iter(sig.parameters)))
        return out

    def check_call(self, model: torch.nn.Module, args: dict[str, Any]) -> None:
        """Refuse (ValueError) a call the engine does not cover."""

    def batch_size(self, args: dict[str, Any]) -> int:
        return int(args["hidden_states"].shape[0])
