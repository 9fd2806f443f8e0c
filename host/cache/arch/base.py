"""What the cache engine needs to know about one diffusers video transformer.

An :class:`Architecture` names the transformer class it serves, finds its blocks by name (in
the order the model's own forward calls them, each with its layer number) and checks the
model's configuration and each call. A :class:`BlockSpec` describes one block type: its
cacheable operators in forward order, its residual streams, and for each operator how to
compute its pre-gate output ``c`` on the xPU, its gate ``g`` (one ``[C]`` vector per sample: the
NME broadcasts it along tokens) and how its residual is added, so that ``x + g ⊙ c`` is the
operator's effect on every stream. The engine (:mod:`coda.host.cache.engine`) does the rest:
policies, events, slots, segments, CFG interleaving.

A spec replays the block's forward with the same torch calls in the same order as the
diffusers code it mirrors (diffusers :data:`TESTED_DIFFUSERS`), so a policy that reuses
nothing gives the unhooked model's bits; how what it reads is checked, and the canonical
layouts: :class:`BlockSpec`.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from coda.host.cache.schedule import ModelOps

__all__ = ["UnsupportedModelError", "UntestedDiffusersWarning", "StepState", "BlockCall",
           "BlockSpec", "BlockRef", "Architecture", "TESTED_DIFFUSERS", "diffusers_tested",
           "check_structure", "check_diffusers_api"]

#: the diffusers version whose block code the specs replay (tests/host/cache/test_arch_adapters.py runs on it)
TESTED_DIFFUSERS = "0.42.1"
_WARNED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()   # models warned about


class UnsupportedModelError(TypeError):
    """A transformer (class, configuration or structure) the cache engine cannot serve
    exactly."""


class UntestedDiffusersWarning(UserWarning):
    """The installed diffusers is not :data:`TESTED_DIFFUSERS`: the model has the structure
    the adapter reads, but its code was not checked against the replay here."""


def diffusers_tested() -> bool:
    """Whether the installed diffusers is :data:`TESTED_DIFFUSERS`."""
    import diffusers

    return diffusers.__version__ == TESTED_DIFFUSERS


def check_diffusers_api() -> None:
    """Refuse a diffusers whose ``cache_context`` carries only a name: the engine places a
    call in its generation by the context's ``step_index``, ``num_inference_steps`` and
    ``timestep`` (``diffusers.hooks.hooks.CacheContext``, from diffusers 0.41.0 on).

    Raises:
        UnsupportedModelError: naming the installed version and the first one with it.
    """
    from diffusers.hooks import hooks

    if not hasattr(hooks, "CacheContext"):
        import diffusers

        raise UnsupportedModelError(
            f"diffusers {diffusers.__version__}: its cache_context carries no step "
            "(diffusers.hooks.hooks.CacheContext, from diffusers 0.41.0 on), which the CODA "
            f"cache engine reads; install diffusers >= 0.41 (tested: {TESTED_DIFFUSERS})")


def _type_names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join("None" if t is type(None) else t.__name__ for t in types)


def check_structure(obj: Any, structure: dict[str, Any], where: str) -> None:
    """Check that ``obj`` has every dotted attribute path of ``structure`` (``"norm1.linear"``)
    with a value of its type (a class or a tuple of classes; ``type(None)`` allows None).

    Raises:
        UnsupportedModelError: naming ``where``, each missing or mistyped path, what it is
            and what was expected.
    """
    problems = []
    for path, types in structure.items():
        value, missing = obj, None
        for part in path.split("."):
            if not hasattr(value, part):
                missing = part
                break
            value = getattr(value, part)
        if missing is not None:
            problems.append(f"{path} is missing")
        elif not isinstance(value, types):
            problems.append(f"{path} is a {type(value).__name__}, expected {_type_names(types)}")
    if problems:
        import diffusers

        raise UnsupportedModelError(
            f"{where} (diffusers {diffusers.__version__}): {'; '.join(problems)}: not the "
            "structure the CODA adapter replays (tested on diffusers "
            f"{TESTED_DIFFUSERS})")


def _check_params(fn: Callable, params, where: str) -> None:
    """Refuse (UnsupportedModelError) a forward ``fn`` without parameters named ``params``."""
    got = inspect.signature(fn).parameters
    missing = [p for p in params if p not in got]
    if missing:
        import diffusers

        raise UnsupportedModelError(
            f"{where} (diffusers {diffusers.__version__}) takes no parameter "
            f"{', '.join(map(repr, missing))}: not the forward the CODA adapter replays "
            f"(tested on diffusers {TESTED_DIFFUSERS})")


def _uncompiled(module: torch.nn.Module) -> torch.nn.Module:
    """The module a ``torch.compile(module)`` wrapper (an ``OptimizedModule``) compiled; any
    other module as is."""
    orig = getattr(module, "_orig_mod", None)
    return orig if isinstance(orig, torch.nn.Module) and type(module).__name__ == \
        "OptimizedModule" else module


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

    What a spec reads of a block is declared (:attr:`BlockSpec.structure`:
    submodules and attributes with their types; :attr:`BlockSpec.call_params`: the forward's
    parameters) and checked when the engine attaches (:meth:`Architecture.check_model`): a model
    that lacks any of it is refused naming what is missing. Another diffusers version whose blocks
    have that structure is served with an :class:`UntestedDiffusersWarning`; whether its code still
    computes what the spec replays is checked on the first call by ``coda.enable_cache``'s
    self-check (:mod:`coda.host.cache.pipeline`: a step that reuses nothing must give the
    unhooked model's bits).

    Layouts: the engine keeps each stream of a call's batch in a *canonical* layout
    ``[B, ..., C]`` whose per-sample flattening ``[T, C]`` is the token order of the cache slots;
    :meth:`BlockSpec.to_canonical` / :meth:`BlockSpec.from_canonical` convert from / to the layout
    the block receives and returns. They must accept a trailing dimension other than ``C`` (the
    engine runs them on a ``[..., 1]`` token-index probe to check that a block's input is the
    previous block's output, moved only by layout operations).

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
        structure: what the replay reads of a block: dotted attribute path -> its type (a
            class or a tuple; ``type(None)`` allows None), checked by
            :func:`check_structure` when the engine attaches.
        call_params: the block forward's parameters the replay reads by name (besides the
            streams'), checked against its signature.
    """
    block_class: str = ""
    ops: tuple[str, ...] = ()
    op_modules: dict[str, tuple[str, ...]] = {}
    ungated: frozenset[str] = frozenset()
    streams: dict[str, str] = {"hidden": "hidden_states"}
    returns_tuple: bool = False
    structure: dict[str, Any] = {}
    call_params: tuple[str, ...] = ()

    def check_block(self, block: torch.nn.Module, where: str) -> None:
        """Refuse (UnsupportedModelError, naming ``where`` and what is missing) a block
        without the :attr:`structure` and forward parameters the replay reads."""
        check_structure(block, self.structure, where)
        _check_params(type(block).forward, (*self.streams.values(), *self.call_params),
                      f"{where}.forward")

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
        config_keys: the model configuration's keys the adapter reads.
        call_params: the model forward's parameters the engine reads by name.
    """
    name: str = ""
    model_class: str = ""
    block_lists: tuple[tuple[str, BlockSpec], ...] = ()
    barriers: str = "none: the residual streams pass straight from block to block"
    config_keys: tuple[str, ...] = ()
    call_params: tuple[str, ...] = ("hidden_states", "timestep")

    def model_type(self) -> type:
        import diffusers

        return getattr(diffusers, self.model_class)

    def blocks(self, model: torch.nn.Module) -> list[BlockRef]:
        """The model's blocks in the order its forward calls them, with their layers
        (default: the lists one after the other, layers counting on). A block replaced by
        ``torch.compile(block)`` gives the module it compiled (``_orig_mod``), where the
        engine's hooks go: the compiled call reaches them."""
        out, layer = [], 0
        for attr, spec in self.block_lists:
            for i, block in enumerate(getattr(model, attr)):
                block = _uncompiled(block)
                out.append(BlockRef(f"{attr}.{i}", block, spec, layer))
                layer += 1
        return out

    def model_ops(self, model: torch.nn.Module) -> ModelOps:
        """The model's cacheable operators in forward order."""
        return ModelOps(self.name, tuple((ref.layer, op) for ref in self.blocks(model)
                                         for op in ref.spec.ops))

    def check_structure(self, model: torch.nn.Module) -> None:
        """Refuse a model without what the adapter reads: the block lists (``ModuleList`` s),
        the configuration keys, the forward's parameters, each block's class (by name, or a
        subclass of it), structure and parameters (:meth:`BlockSpec.check_block`).

        Raises:
            UnsupportedModelError: naming the model, the missing or mistyped part and what
                was expected; a diffusers without the cache-context API
                (:func:`check_diffusers_api`).
        """
        check_diffusers_api()
        cls = type(model).__name__
        check_structure(model, {attr: torch.nn.ModuleList for attr, _ in self.block_lists}, cls)
        config = getattr(model, "config", None)
        missing = [k for k in self.config_keys if not hasattr(config, k)]
        if missing:
            raise UnsupportedModelError(f"{cls}.config has no {', '.join(missing)}: not the "
                                        f"configuration the CODA {self.name} adapter reads")
        _check_params(type(model).forward, self.call_params, f"{cls}.forward")
        for ref in self.blocks(model):
            want = ref.spec.block_class
            if want not in {c.__name__ for c in type(ref.module).__mro__}:
                raise UnsupportedModelError(
                    f"{cls}.{ref.name} is a {type(ref.module).__name__}; the "
                    f"CODA {self.name} adapter replays {want} blocks only")
            ref.spec.check_block(ref.module, f"{cls}.{ref.name}")

    def check_model(self, model: torch.nn.Module) -> None:
        """Refuse a model the specs do not mirror; warn for an untested diffusers version.

        Checks :meth:`check_structure` (adapters add their configuration checks). With a
        diffusers other than :data:`TESTED_DIFFUSERS` warns
        (:class:`UntestedDiffusersWarning`, once per model) instead of refusing.

        Raises:
            UnsupportedModelError: as :meth:`check_structure`.
        """
        self.check_structure(model)
        if not diffusers_tested() and model not in _WARNED:
            _WARNED.add(model)
            import diffusers

            warnings.warn(
                f"diffusers {diffusers.__version__}: the CODA {self.name} adapter replays the "
                f"block code of diffusers {TESTED_DIFFUSERS}; this model has the structure it "
                "reads, but whether its blocks compute the same is checked only by "
                "coda.enable_cache's first-call self-check (a step that reuses nothing must "
                "give the unhooked model's bits)", UntestedDiffusersWarning, stacklevel=3)

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
