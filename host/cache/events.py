"""The operator events of a generation: what the cache engine did, operator by operator.

One generation of a cached DiT is a stream of typed, immutable events, in the order they
happened (forward order within a transformer call; calls in denoising order):
:class:`OpEvent` (one cacheable operator of one sample of one CFG branch at one step:
computed or reused, the bytes it wrote, its segment), :class:`SegmentEvent` (one coalesced
segment ``y = x + Σ g_k ⊙ c_k`` of one sample: its operators, link bytes, NME programs and
cycles) and :class:`MonitorEvent` (one run-time check on the NME, ``l1_distance`` of an
operator's input against a kept reference).

Policies (:mod:`coda.host.cache.policies`), the profiler, the timing model (:mod:`coda.host.system`)
and the reports read this stream; nothing else looks inside the engine. :class:`EventLog`
collects it and derives the usual counters (:meth:`EventLog.stats`); its docstring has the
units and where the cache lives (``cache_memory``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator

__all__ = ["OpEvent", "SegmentEvent", "MonitorEvent", "Event", "EventLog", "OpRef",
           "CACHE_MEMORIES"]

OpRef = tuple[int, str]   # (layer, op type)
#: where the cache slots live: the DIMM-NMP behind the host link, or the xPU's memory
CACHE_MEMORIES = ("nmp", "device")


@dataclass(frozen=True)
class OpEvent:
    """One cacheable operator of one sample at one step and CFG branch.

    Attributes:
        generation: index of the generation in the log (0, 1, ...).
        step: denoising step index (0 .. num_steps - 1). num_steps: steps of the generation.
        branch: CFG branch, ``"cond"`` or ``"uncond"``.
        sample: index of the sample within its branch's batch.
        layer: transformer layer. op: operator type (e.g. ``"spatial_attn"``).
        index: position of the operator in forward order (``layer * ops_per_layer + k``).
        reused: True if the cached output was reused (in segment ``segment``), False if the
            operator was computed on the xPU.
        reason: why, as the policy said it (e.g. ``"schedule"``, ``"fallback"``,
            ``"threshold"``, ``"no-cache"``).
        tokens, channels: the operator's output per sample, ``[T, C]``.
        dtype: the cache (NME) element format, ``"bf16"`` or ``"fp16"``.
        stored_bytes: bytes written to the cache for this operator's output (cache store:
            to the DIMMs, ``T * C * 2`` rounded up to whole words; to device memory with
            ``cache_memory="device"``, ``T * C * 2``; int8 entries: q and scales; 0 if not
            stored).
        kept_bytes: bytes written to keep its input as a monitor reference (0 if not).
        segment: the id of the segment it ran in (reused) or None (computed).
        cache_memory: where the cache lives (:data:`CACHE_MEMORIES`): ``"nmp"`` (the
            bytes crossed the host link) or ``"device"`` (they did not).
    """
    generation: int
    step: int
    num_steps: int
    branch: str
    sample: int
    layer: int
    op: str
    index: int
    reused: bool
    reason: str
    tokens: int
    channels: int
    dtype: str
    stored_bytes: int = 0
    kept_bytes: int = 0
    segment: int | None = None
    cache_memory: str = "nmp"
    kind: str = field(default="op", init=False)

    @property
    def ref(self) -> OpRef:
        return (self.layer, self.op)


@dataclass(frozen=True)
class SegmentEvent:
    """One coalesced segment of one sample: consecutive reused operators run on the NMEs as
    ``y = ((x + g0*c0) + g1*c1) + ...``.

    Attributes:
        generation, step, num_steps, branch, sample: as :class:`OpEvent`.
        segment: id, unique within the generation (the ``segment`` of its OpEvents).
        ops: the (layer, op) it applies, in forward order.
        first_index: forward position of its first operator.
        tokens, channels: ``[T, C]`` of x and y. dtype: the NME format.
        bytes_to_nmp: host -> DIMM bytes: x, the K gate vectors (replicated to every rank)
            and the command words.
        bytes_from_nmp: DIMM -> host bytes: y.
        programs: lockstep NME program launches (``ceil(K / 8)``: a program takes <= 8 terms;
            per residual stream).
        nme_cycles: NME clock cycles, per launch the slowest rank, summed.
        stream_tokens: for a model with more than one residual stream (CogVideoX and
            HunyuanVideo: video, then text tokens, each stream with its own gates and its own
            programs), the tokens of each stream (summing to ``tokens``); () for one stream.
        terms: the cached tensors it reads per stream (``len(ops)`` for plain reuse; a
            forecast term reads two, :mod:`coda.host.cache.forecast`); 0: ``len(ops)``.
        cache_memory: as :class:`OpEvent`; ``"device"``: the segment ran as torch ops in the
            xPU's memory (bytes, programs and cycles 0: no link, no NME).
    """
    generation: int
    step: int
    num_steps: int
    branch: str
    sample: int
    segment: int
    ops: tuple[OpRef, ...]
    first_index: int
    tokens: int
    channels: int
    dtype: str
    bytes_to_nmp: int
    bytes_from_nmp: int
    programs: int
    nme_cycles: int
    stream_tokens: tuple[int, ...] = ()
    terms: int = 0
    cache_memory: str = "nmp"
    kind: str = field(default="segment", init=False)


@dataclass(frozen=True)
class MonitorEvent:
    """One run-time check computed on the NMEs: the relative L1 change
    ``Σ|x - x_ref| / Σ|x_ref|`` of an operator's input (the numerator by the NME's
    ``l1_distance`` against the reference kept in rank memory; the denominator by the host
    when the reference was kept).

    Attributes:
        generation, step, num_steps, branch, sample, layer, op, index: as :class:`OpEvent`.
        reference_step: the step at which the reference input was kept.
        value: the relative L1 change (float; ``inf`` if the reference is all zeros).
        bytes_to_nmp: the input written to the ranks plus command words.
        programs: NME launches. nme_cycles: their cycles (slowest rank per launch, summed).
        cache_memory: as :class:`OpEvent` (``"device"``: computed in the xPU's memory).
        probe: ``"l1"`` (the above) or ``"accel"``: step DRA's acceleration probe, the
            relative second difference ``Σ|x_t - 2 x_{t-1} + x_{t-2}| / Σ|x_{t-1}|`` of the
            block-0 input, computed on the xPU in fp32 from the inputs it kept
            (``cache_memory="device"``, no NME work, no link bytes; a second difference is
            about 0.1 % of the input, below the 16-bit rounding of kept references); or
            ``"output"``: step DRA's output probe, the same second difference of the
            model's output (its prediction) over the three steps before, summed over the
            sample's CFG branches (``cache_memory="device"``, no NME work, no link bytes;
            ``layer``/``op`` name the first operator, where it is read).
    """
    generation: int
    step: int
    num_steps: int
    branch: str
    sample: int
    layer: int
    op: str
    index: int
    reference_step: int
    value: float
    bytes_to_nmp: int
    programs: int
    nme_cycles: int
    cache_memory: str = "nmp"
    probe: str = "l1"
    kind: str = field(default="monitor", init=False)


Event = OpEvent | SegmentEvent | MonitorEvent
_KINDS = {"op": OpEvent, "segment": SegmentEvent, "monitor": MonitorEvent}


class EventLog:
    """An append-only list of events with the counters reports need.

    ``log.generations`` counts the generations started; events carry their generation index.
    Iterating yields events in order; :meth:`of` filters by kind / generation.

    Units: bytes are bytes on the host link (PCIe in the modelled system), whole NME words as
    the driver moves them; cycles are NME clock cycles (per launch, the slowest rank).

    Where the cache lives (``cache_memory``, :data:`CACHE_MEMORIES`, on every event): ``"nmp"``
    (the DIMM-NMP's rank memories behind the host link: stores, kept inputs, segments and
    monitors cross it) or ``"device"`` (the xPU's own memory,
    :class:`coda.host.cache.device.DeviceCache`, system b of the ablation: nothing of the cache
    crosses a link; ``stored_bytes`` and ``kept_bytes`` are then the bytes written to device
    memory, and segments and monitors move, launch and count nothing on a link or an NME).
    """

    def __init__(self, events: Iterable[Event] = ()):
        self.events: list[Event] = list(events)
        self.generations = 1 + max((e.generation for e in self.events), default=-1)

    def start_generation(self) -> int:
        """Open a new generation; returns its index."""
        self.generations += 1
        return self.generations - 1

    def append(self, event: Event) -> None:
        self.events.append(event)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def of(self, kind: str | None = None, generation: int | None = None) -> list[Event]:
        """Events of one kind (``"op"``, ``"segment"``, ``"monitor"``) and/or generation."""
        if kind is not None and kind not in _KINDS:
            raise ValueError(f"kind {kind!r}: expected one of {sorted(_KINDS)}")
        return [e for e in self.events if (kind is None or e.kind == kind)
                and (generation is None or e.generation == generation)]

    def stats(self, generation: int | None = None) -> dict:
        """Counters over one generation (default: all events).

        Keys: ``ops_computed``, ``ops_reused`` (operator executions, per sample and branch),
        ``ops_skipped_fraction`` (reused / all), ``fallbacks`` (computed with reason
        ``"fallback"``), ``segments`` (per sample), ``segment_ops``, ``programs`` (segment
        and monitor launches), ``stores`` (outputs written), ``monitors``, ``nme_cycles``,
        ``pcie_bytes`` (host <-> DIMM bytes of stores, kept inputs, segments and monitors;
        a cache in device memory, ``cache_memory="device"``, adds none).
        """
        ops = self.of("op", generation)
        segs = self.of("segment", generation)
        mons = self.of("monitor", generation)
        reused = sum(e.reused for e in ops)
        return {
            "ops_computed": len(ops) - reused,
            "ops_reused": reused,
            "ops_skipped_fraction": reused / len(ops) if ops else 0.0,
            "fallbacks": sum(e.reason == "fallback" for e in ops),
            "segments": len(segs),
            "segment_ops": sum(len(s.ops) for s in segs),
            "programs": sum(s.programs for s in segs) + sum(m.programs for m in mons),
            "stores": sum(e.stored_bytes > 0 for e in ops),
            "monitors": len(mons),
            "nme_cycles": sum(s.nme_cycles for s in segs) + sum(m.nme_cycles for m in mons),
            "pcie_bytes": (sum(e.stored_bytes + e.kept_bytes for e in ops
                               if e.cache_memory == "nmp")
                           + sum(s.bytes_to_nmp + s.bytes_from_nmp for s in segs)
                           + sum(m.bytes_to_nmp for m in mons)),
        }

    # ---------------------------------------------------------------- files
    def to_jsonl(self) -> str:
        """One JSON object per line (``kind`` names the event type)."""
        return "".join(json.dumps(asdict(e)) + "\n" for e in self.events)

    @classmethod
    def from_jsonl(cls, text: str) -> "EventLog":
        """Read :meth:`to_jsonl` back. Raises ValueError naming a bad line."""
        events = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                kind = _KINDS[data.pop("kind")]
                if kind is SegmentEvent:
                    data["ops"] = tuple((int(l), str(o)) for l, o in data["ops"])
                    data["stream_tokens"] = tuple(int(t) for t in data.get("stream_tokens", ()))
                events.append(kind(**data))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"event line {n}: {exc}: expected an OpEvent, SegmentEvent "
                                 "or MonitorEvent as written by EventLog.to_jsonl") from None
        return cls(events)
