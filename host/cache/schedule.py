"""Cache schedules as data: which DiT operators are reused at each timestep, per CFG branch.

The cacheable operators of a Latte transformer in forward order: :func:`operator_order`.
Other architectures have other operators (:data:`ARCH_OP_TYPES`, one module each in
:mod:`coda.host.cache.arch`, which says per architecture what a segment barrier is); their forward
order is a :class:`ModelOps` (``coda.host.cache.arch.model_ops(transformer)``). Latte's stays the
default everywhere: a schedule, a query or a segment count without ``ops`` is Latte's.

A :class:`Schedule` maps every (step index, branch) to the frozenset of (layer, op) reused at
that step; everything else is computed. A *segment* is a maximal run of consecutive reused
operators in this order within one step and branch (docs/design.md, Terms); it runs on the
NMEs as one ``y = x + Σ g_k ⊙ c_k`` program.

Policies that make or follow schedules live in :mod:`coda.host.cache.policies`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from coda.jsonin import check, parse_json, short

__all__ = ["OP_TYPES", "ARCH_OP_TYPES", "ARCH_OP_KINDS", "PAB_CLASSES", "ALL_OP_TYPES",
           "BRANCHES", "OpRef", "ModelOps", "MAX_STEPS", "MAX_LAYERS", "MAX_OPS",
           "SCHEDULE_SCHEMA", "STEP_KEY", "operator_order", "maximal_runs", "segment_runs", "Schedule",
           "ScheduleError"]

OP_TYPES: tuple[str, ...] = ("spatial_attn", "cross_attn", "spatial_ffn",
                             "temporal_attn", "temporal_ffn")
BRANCHES: tuple[str, ...] = ("cond", "uncond")
OpRef = tuple[int, str]   # (layer, op type)

#: what each operator type of each architecture computes, in a block's forward order: the one
#: place the policies read it from (:class:`ModelOps`; ``coda.host.cache.arch.<name>``
#: documents which module computes it, its gate and its residual streams). Kinds:
#: ``spatial_attn`` / ``temporal_attn`` (Latte's factorised self-attention over the patches of
#: a frame / over the frames of a patch), ``self_attn`` (over every video token: Wan's 3-D
#: attention), ``joint_attn`` (over the video and text tokens together: CogVideoX's,
#: HunyuanVideo's dual-stream blocks), ``cross_attn`` (video queries, condition keys),
#: ``ffn``, ``joint_block`` (HunyuanVideo's single-stream block: joint attention and an MLP
#: in parallel, one operator: the block's ``proj_out`` mixes both). The policies read from it
#: what each operator is to them (PAB's class, the step and first-block probes); a schedule
#: file names only its architecture and operators, so the table is usable without the model.
ARCH_OP_KINDS: dict[str, dict[str, str]] = {
    "latte": {"spatial_attn": "spatial_attn", "cross_attn": "cross_attn", "spatial_ffn": "ffn",
              "temporal_attn": "temporal_attn", "temporal_ffn": "ffn"},
    "cogvideox": {"attn": "joint_attn", "ffn": "ffn"},
    "wan": {"attn": "self_attn", "cross_attn": "cross_attn", "ffn": "ffn"},
    "hunyuan_video": {"attn": "joint_attn", "ffn": "ffn", "single": "joint_block"},
}
#: operator types per architecture, in a block's forward order
ARCH_OP_TYPES: dict[str, tuple[str, ...]] = {arch: tuple(kinds)
                                             for arch, kinds in ARCH_OP_KINDS.items()}
#: PAB's broadcast class of each operator kind (Zhao et al. 2024; diffusers 0.42
#: ``hooks/pyramid_attention_broadcast.py`` classifies an attention that is not cross attention
#: and not in ``temporal_transformer_blocks`` as spatial, which covers Wan's 3-D self-attention
#: and the joint attention of CogVideoX and HunyuanVideo): ``spatial``, ``temporal``,
#: ``cross`` attention or ``mlp`` (PAB's MLP broadcast). HunyuanVideo's single-stream block is
#: one operator here, so broadcasting its attention broadcasts its parallel MLP with it.
PAB_CLASSES: dict[str, str] = {"spatial_attn": "spatial", "self_attn": "spatial",
                               "joint_attn": "spatial", "joint_block": "spatial",
                               "temporal_attn": "temporal", "cross_attn": "cross", "ffn": "mlp"}
#: every operator type of every architecture (a uniform interval may name any of them)
ALL_OP_TYPES: tuple[str, ...] = tuple(dict.fromkeys(
    op for ops in ARCH_OP_TYPES.values() for op in ops))

#: the bounds of a schedule read from a file, checked before anything is built from it
#: (building one is linear in steps x operators): steps (DDIM takes at most the model's
#: training timesteps, 1000 for every model here), layers (blocks in forward order),
#: operators of a model
MAX_STEPS = 1000
MAX_LAYERS = 256
MAX_OPS = 2048


def _integer(lo: int, hi: int, what: str) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi,
            "expected": f"an integer {lo}..{hi} ({what})"}


#: a step as a JSON object's key (a table's ``{"12": ...}``): 0..MAX_STEPS-1 written as
#: ``str(step)`` writes it, so that two keys cannot name one step (``\Z``: Python's end of
#: text; ``$`` would let a trailing newline through)
STEP_KEY = {"type": "string",
            "pattern": f"^(0|[1-9][0-9]{{0,{len(str(MAX_STEPS - 1)) - 1}}})\\Z",
            "expected": f"a step number 0..{MAX_STEPS - 1} as text, without leading zeros "
                        "or signs"}
# the [layer, operator type] lists (the bulk of a file) are checked by Schedule.from_data
_OP_REFS = {"type": "array", "maxItems": MAX_OPS,
            "expected": f"a list of at most {MAX_OPS} [layer, operator type]"}
#: the Schedule JSON (:meth:`Schedule.to_json`) as a JSON schema (:func:`coda.jsonin.check`);
#: other fields are left to the file that holds it (:mod:`coda.host.cache.shipped`)
SCHEDULE_SCHEMA: dict = {
    "type": "object",
    "required": ["num_steps", "num_layers", "reuse"],
    "properties": {
        "name": {"type": "string", "maxLength": 1000},
        "num_steps": _integer(1, MAX_STEPS, "denoising steps"),
        "num_layers": _integer(1, MAX_LAYERS, "layers"),
        "reuse": {"type": "array", "maxItems": 2 * MAX_STEPS,
                  "expected": "a list of {step, branch, reuse} entries",
                  "items": {"type": "object", "required": ["step", "branch", "reuse"],
                            "properties": {
                                "step": _integer(0, MAX_STEPS - 1, "a step"),
                                "branch": {"enum": list(BRANCHES)},
                                "reuse": _OP_REFS},
                            "additionalProperties": False}},
        "arch": {"enum": list(ARCH_OP_TYPES)},
        "ops": {**_OP_REFS, "minItems": 1},
    },
}

# Between layer 0's spatial and temporal blocks Latte adds the temporal position embedding:
# a computed operation, so no segment can run across it.
_BARRIER_AFTER: OpRef = (0, "spatial_ffn")


class ScheduleError(ValueError):
    """A schedule that cannot run (bad step, branch, operator, or a reuse of something
    never computed)."""


def operator_order(num_layers: int) -> list[OpRef]:
    """The cacheable operators of a ``num_layers``-layer Latte in forward order (other
    architectures: :attr:`ModelOps.ops`).

    With ``L`` layers they are::

        for layer in 0..L-1:
            (layer, "spatial_attn")   spatial self-attention       (gated by adaLN gate_msa)
            (layer, "cross_attn")     cross attention to the label (no gate: Latte adds it as is)
            (layer, "spatial_ffn")    FFN of the spatial block     (gated by gate_mlp)
            [layer 0 only, F > 1: temporal position embedding, not cacheable -> segment barrier]
            (layer, "temporal_attn")  temporal self-attention      (gated by gate_msa)
            (layer, "temporal_ffn")   FFN of the temporal block    (gated by gate_mlp)
    """
    if num_layers < 1:
        raise ScheduleError(f"num_layers={num_layers}: expected >= 1")
    return [(layer, op) for layer in range(num_layers) for op in OP_TYPES]


@dataclass(frozen=True)
class ModelOps:
    """The cacheable operators of one model, in forward order.

    Attributes:
        arch: architecture, a key of :data:`ARCH_OP_TYPES`.
        ops: the (layer, op) in the order the model's forward runs them; ``layer`` numbers
            the model's blocks in forward order (HunyuanVideo: dual-stream blocks
            0..L-1, then single-stream blocks L..L+S-1).
    Raises:
        ScheduleError: an unknown architecture, an op type of another architecture, a
            repeated operator or no operator.
    """
    arch: str
    ops: tuple[OpRef, ...]
    _index: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.arch not in ARCH_OP_TYPES:
            raise ScheduleError(f"arch {self.arch!r}: expected one of {sorted(ARCH_OP_TYPES)}")
        ops = tuple((int(layer), str(op)) for layer, op in self.ops)
        bad = sorted({op for _, op in ops} - set(ARCH_OP_TYPES[self.arch]))
        if bad or not ops or len(set(ops)) != len(ops) or min(l for l, _ in ops) < 0:
            raise ScheduleError(f"{self.arch} operators {list(ops)[:6]}...: expected distinct "
                                f"(layer >= 0, op) with ops in {ARCH_OP_TYPES[self.arch]}")
        object.__setattr__(self, "ops", ops)
        self._index.update((ref, i) for i, ref in enumerate(ops))

    @classmethod
    def latte(cls, num_layers: int) -> "ModelOps":
        """Latte's operators (:func:`operator_order`)."""
        return cls("latte", tuple(operator_order(num_layers)))

    @property
    def num_layers(self) -> int:
        """Blocks-in-forward-order count (1 + the largest layer)."""
        return 1 + max(layer for layer, _ in self.ops)

    @property
    def op_types(self) -> tuple[str, ...]:
        return ARCH_OP_TYPES[self.arch]

    def index(self, ref: OpRef) -> int:
        """Forward position of ``ref``. Raises KeyError for an operator the model lacks."""
        return self._index[ref]

    def kind(self, op: str) -> str:
        """What op type ``op`` computes (:data:`ARCH_OP_KINDS`). Raises KeyError for an op
        type of another architecture."""
        return ARCH_OP_KINDS[self.arch][op]

    def pab_class(self, op: str) -> str:
        """PAB's broadcast class of op type ``op`` (:data:`PAB_CLASSES`)."""
        return PAB_CLASSES[self.kind(op)]

    @property
    def step_probe(self) -> OpRef:
        """The operator whose input is the whole model's first block input (the first in
        forward order): what TeaCache and step-level DRA measure the change of a step by."""
        return self.ops[0]

    @property
    def block_probe(self) -> OpRef | None:
        """The first operator of the layer after the first one: its input is the first
        layer's output, FBCache's signal (None for a one-layer model)."""
        first = self.ops[0][0]
        return next((ref for ref in self.ops if ref[0] != first), None)

    def grid_index(self) -> tuple[int, ...]:
        """For each operator in forward order, its flat position ``layer * K + k`` in a
        ``[layers, K]`` grid of the op types (K = ``len(op_types)``): how a profile's
        ``[..., layers, op types]`` arrays hold it (a model whose layers have different op
        types, HunyuanVideo's, leaves the other cells empty)."""
        k = len(self.op_types)
        return tuple(layer * k + self.op_types.index(op) for layer, op in self.ops)

    def count(self, op_types=None) -> int:
        """Operators per step (of ``op_types`` only, when given)."""
        return len(self.ops) if op_types is None else sum(op in op_types for _, op in self.ops)

    def barriers(self, frames: int = 2) -> frozenset:
        """Operators after which a segment always ends, because the model's own code computes
        something between them and the next operator: Latte's temporal position embedding
        after layer 0's spatial FFN (videos of F > 1 frames). CogVideoX, Wan and
        HunyuanVideo pass their residual streams straight from block to block: none."""
        if self.arch == "latte" and frames > 1:
            return frozenset({_BARRIER_AFTER})
        return frozenset()


def maximal_runs(order: Sequence, reused, barriers=()) -> list[list]:
    """Maximal runs of consecutive ``reused`` items of ``order`` (forward order), a run also
    ending after an item of ``barriers`` (a computed, non-cacheable operation follows it):
    the segments of one step and branch, whatever names the operators (``(layer, op)`` here,
    forward indices in :func:`coda.host.system.schedules.segment_runs`)."""
    reused, barriers = set(reused), set(barriers)
    runs: list[list] = []
    current: list = []
    for item in order:
        if item in reused:
            current.append(item)
        elif current:
            runs.append(current)
            current = []
        if item in barriers and current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def segment_runs(reused: Iterable[OpRef], num_layers: int, frames: int = 2,
                 ops: ModelOps | None = None) -> list[list[OpRef]]:
    """The segments of one step and branch: maximal runs of consecutive reused operators
    (:func:`maximal_runs` over the model's operators and barriers).

    Args:
        reused: the (layer, op) reused at this step.
        num_layers: layers of the model.
        frames: frames of the video (with F = 1 Latte adds no temporal embedding, so
            layer 0's spatial FFN and temporal attention may share a segment).
        ops: the model's operators (default: Latte's of ``num_layers``).
    Returns:
        list of runs, each a list of (layer, op) in forward order.
    """
    ops = ModelOps.latte(num_layers) if ops is None else ops
    return maximal_runs(ops.ops, reused, ops.barriers(frames))


@dataclass(frozen=True)
class Schedule:
    """Per (step, branch) the frozenset of reused (layer, op); validated on construction.

    Attributes:
        num_steps: denoising steps the schedule covers (step indices 0..num_steps-1).
        num_layers: layers of the model it was made for.
        reuse: mapping (step, branch) -> frozenset of (layer, op); missing entries reuse nothing.
        name: a label for reports.
        ops: the model's operators (:class:`ModelOps`) for an architecture other than Latte;
            None (the default) is Latte's of ``num_layers`` (a Latte ``ModelOps`` given here
            is stored as None, so equal schedules compare equal).
    Raises:
        ScheduleError: unknown branch or operator, step or layer out of range, or an operator
            reused at a step before it was ever computed in that branch; ``ops`` whose layer
            count is not ``num_layers``.
    """
    num_steps: int
    num_layers: int
    reuse: Mapping[tuple[int, str], frozenset] = field(default_factory=dict)
    name: str = "custom"
    ops: ModelOps | None = None

    def __post_init__(self):
        if self.num_steps < 1:
            raise ScheduleError(f"num_steps={self.num_steps}: expected >= 1")
        if self.ops is not None:
            if self.ops.num_layers != self.num_layers:
                raise ScheduleError(f"{self.ops.arch} operators span {self.ops.num_layers} layers, "
                                    f"the schedule says num_layers={self.num_layers}")
            if self.ops.arch == "latte" and self.ops == ModelOps.latte(self.num_layers):
                object.__setattr__(self, "ops", None)
        ops = set(self.order())
        clean = {}
        for (step, branch), refs in self.reuse.items():
            if branch not in BRANCHES:
                raise ScheduleError(f"branch {branch!r}: expected one of {BRANCHES}")
            if not 0 <= step < self.num_steps:
                raise ScheduleError(f"step {step}: expected 0..{self.num_steps - 1}")
            refs = frozenset((int(layer), str(op)) for layer, op in refs)
            bad = refs - ops
            if bad:
                kinds = OP_TYPES if self.ops is None else self.ops.op_types
                raise ScheduleError(f"step {step}, branch {branch}: unknown operators {sorted(bad)}; "
                                    f"expected layers 0..{self.num_layers - 1} and ops {kinds}")
            if refs:
                clean[(int(step), branch)] = refs
        object.__setattr__(self, "reuse", clean)
        self._check_computed_before_reuse()

    def _check_computed_before_reuse(self) -> None:
        order = set(self.order())
        for branch in BRANCHES:
            computed: set[OpRef] = set()
            for step in range(self.num_steps):
                reused = self.reused(step, branch)
                never = reused - computed
                if never:
                    layer, op = sorted(never)[0]
                    raise ScheduleError(
                        f"step {step}, branch {branch}: reuses ({layer}, {op!r}) which was never "
                        f"computed at an earlier step of this branch")
                computed |= order - reused

    def order(self) -> list[OpRef]:
        """The model's operators in forward order."""
        return operator_order(self.num_layers) if self.ops is None else list(self.ops.ops)

    def model_ops(self) -> ModelOps:
        """The model's operators as a :class:`ModelOps` (Latte's when ``ops`` is None)."""
        return ModelOps.latte(self.num_layers) if self.ops is None else self.ops

    def reused(self, step: int, branch: str) -> frozenset:
        """The (layer, op) reused at ``step`` in ``branch`` (empty frozenset if none)."""
        return self.reuse.get((step, branch), frozenset())

    def store_after_compute(self, step: int, branch: str, ref: OpRef, history: int = 1) -> bool:
        """Whether a computed operator's output must be written to its cache slot: only if the
        next step reuses it (a later reuse implies this one, or a recompute in between).
        With ``history=2`` (the forecast mode, :mod:`coda.host.cache.forecast`, which reads
        the last two computed outputs) also if the step after next reuses it: this output is
        then the older of the two."""
        if history not in (1, 2):
            raise ValueError(f"history={history}: expected 1 (reuse) or 2 (forecast)")
        return any(s < self.num_steps and ref in self.reused(s, branch)
                   for s in range(step + 1, step + 1 + history))

    def computed_pairs(self, branch: str, ref) -> dict[int, tuple[int, int]]:
        """For each step ``t`` at which ``ref`` is reused in ``branch`` and two earlier steps
        computed it: ``t -> (k, k')``, the last and the one before: the steps at which the
        forecast mode extrapolates (:mod:`coda.host.cache.forecast`)."""
        pairs, computed = {}, []
        for t in range(self.num_steps):
            if ref in self.reused(t, branch):
                if len(computed) >= 2:
                    pairs[t] = (computed[-1], computed[-2])
            else:
                computed.append(t)
        return pairs

    def ops_skipped_fraction(self) -> float:
        """Reused operator executions / all cacheable operator executions, both branches."""
        total = self.num_steps * len(BRANCHES) * len(self.order())
        return sum(len(v) for v in self.reuse.values()) / total

    def segment_count(self, frames: int = 2) -> int:
        """Segments over all steps and both branches (see :func:`segment_runs`)."""
        return sum(len(segment_runs(self.reused(s, b), self.num_layers, frames, self.ops))
                   for s in range(self.num_steps) for b in BRANCHES)

    def digest(self) -> str:
        """sha256 (first 16 hex digits) of :meth:`to_json`: a table calibrated on one schedule
        (DRA's thresholds, the forecast's alphas) is refused for another."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def to_json(self) -> str:
        """JSON text; :meth:`from_json` reads it back."""
        items = [{"step": s, "branch": b, "reuse": sorted([list(r) for r in refs])}
                 for (s, b), refs in sorted(self.reuse.items())]
        data = {"name": self.name, "num_steps": self.num_steps, "num_layers": self.num_layers,
                "reuse": items}
        if self.ops is not None:        # Latte's files keep their format
            data.update(arch=self.ops.arch, ops=[list(r) for r in self.ops.ops])
        return json.dumps(data)

    @classmethod
    def from_events(cls, events, num_layers: int, ops: ModelOps | None = None,
                    name: str = "recorded") -> "Schedule":
        """The schedule one video followed: ``events`` are its operator events
        (:class:`coda.host.cache.events.OpEvent` of one generation and sample, e.g. a dynamic
        policy's decisions); each reused one goes into ``reuse`` at its step and branch. So a
        dynamic policy's run can be costed as a static schedule (:func:`coda.host.system.cost.
        schedule_cost`). Raises ValueError: no event, events of more than one video or of
        different step counts, or what the schedule's own checks raise."""
        events = list(events)
        videos = {(e.generation, e.sample) for e in events}
        steps = {e.num_steps for e in events}
        if len(videos) != 1 or len(steps) != 1:
            raise ValueError(f"{len(events)} events of {len(videos)} videos and step counts "
                             f"{sorted(steps)}: expected the events of one video")
        reuse: dict = {}
        for e in events:
            if e.reused:
                reuse.setdefault((e.step, e.branch), set()).add((e.layer, e.op))
        return cls(steps.pop(), num_layers, {k: frozenset(v) for k, v in reuse.items()},
                   name=name, ops=ops)

    @classmethod
    def from_json(cls, text: str, what: str = "schedule JSON") -> "Schedule":
        """The schedule of :meth:`to_json`'s text (other fields are ignored). Raises
        ValueError naming ``what`` and the field (:meth:`from_data`), or text that is not
        JSON (:func:`coda.jsonin.parse_json`)."""
        return cls.from_data(parse_json(text, what, "a schedule JSON"), what)

    @classmethod
    def from_data(cls, data, what: str = "schedule JSON") -> "Schedule":
        """The schedule of the parsed JSON ``data`` (:meth:`to_json`'s fields; others are
        ignored), checked before anything is built: :data:`SCHEDULE_SCHEMA` (types,
        :data:`MAX_STEPS`, :data:`MAX_LAYERS`, :data:`MAX_OPS`), then every step below
        ``num_steps``, every operator a ``[layer, op]`` of an integer layer below
        ``num_layers`` and an operator type of the architecture, one entry per (step,
        branch), each operator once per entry.

        Raises:
            ValueError: ``"{what}: FIELD: got VALUE; expected ..."`` for the first field
                that breaks one of those rules; ScheduleError (a ValueError) for a schedule
                that cannot run (:class:`Schedule`, :class:`ModelOps`).
        """
        check(data, SCHEDULE_SCHEMA, what)
        steps, layers = data["num_steps"], data["num_layers"]
        arch = data.get("arch", "latte")
        types = ARCH_OP_TYPES[arch]

        def check_refs(refs, where):
            seen = set()
            for j, ref in enumerate(refs):
                if not (isinstance(ref, list) and len(ref) == 2):
                    raise ValueError(f"{what}: {where}[{j}]: got {short(ref)}; expected "
                                     "[layer, operator type]")
                layer, op = ref
                if type(layer) is not int or not 0 <= layer < layers:
                    raise ValueError(f"{what}: {where}[{j}][0]: got {short(layer)}; expected "
                                     f"an integer layer 0..{layers - 1} (num_layers "
                                     f"{layers})")
                if not isinstance(op, str) or op not in types:
                    raise ValueError(f"{what}: {where}[{j}][1]: got {short(op)}; expected "
                                     f"one of {', '.join(types)} (the {arch} operator "
                                     "types)")
                if (layer, op) in seen:
                    raise ValueError(f"{what}: {where}[{j}]: {json.dumps([layer, op])} again; "
                                     "expected each operator once")
                seen.add((layer, op))
            return seen

        if arch != "latte" and "ops" not in data:
            raise ValueError(f"{what}: ops: missing; expected the {arch} model's operators, "
                             "a list of [layer, operator type]")
        if "ops" in data:
            check_refs(data["ops"], "ops")
        reuse, first = {}, {}
        for i, entry in enumerate(data["reuse"]):
            step, branch = entry["step"], entry["branch"]
            if step >= steps:
                raise ValueError(f"{what}: reuse[{i}].step: got {step}; expected a step "
                                 f"0..{steps - 1} (num_steps {steps})")
            if (step, branch) in first:
                raise ValueError(f"{what}: reuse[{i}]: a second entry for step {step}, branch "
                                 f"{branch!r} (the first: reuse[{first[step, branch]}]); "
                                 "expected one entry per step and branch")
            first[step, branch] = i
            reuse[step, branch] = frozenset(check_refs(entry["reuse"], f"reuse[{i}].reuse"))
        try:
            ops = ModelOps(arch, tuple(map(tuple, data["ops"]))) if "ops" in data else None
            return cls(steps, layers, reuse, data.get("name", "custom"), ops)
        except ScheduleError as exc:
            raise ScheduleError(f"{what}: {exc}") from None
