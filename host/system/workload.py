"""The work of one generation, as the replay needs it: per step the transformer calls, per
call and operator what each row (CFG branch x sample) does, and the segments
(:class:`Workload`).

Two sources, one form: :func:`from_events`, the :class:`coda.host.cache.events.EventLog` of a
real cached generation (the shipped model), and :func:`synthesize`, the same event types made
from a :class:`coda.host.system.shapes.ModelShape` and a
:class:`coda.host.system.schedules.ModelSchedule` for models whose weights cannot run here
(no tensors; bytes as the driver moves them, NME cycles from the cycle model). How a
generation's rows group into transformer calls follows the model's pipeline
(``ModelShape.cfg``): ``batched`` (one call per step with both branches, diffusers' order
uncond then cond), ``two_pass`` (a call per branch, cond then uncond as ``WanPipeline``) or
``distilled`` (one call, cond only). How the cache mode and the cache format change the
work: :class:`Workload`.
"""

from __future__ import annotations

from coda.hw.nmp import NMP_DEPTH
from coda.hw.nme.isa import NMEConfig

from collections import defaultdict
from dataclasses import dataclass, field

from coda.host.cache.events import EventLog, OpEvent, SegmentEvent
from coda.host.cache.forecast import CACHE_MODES
from coda.host.nmp.link import check_segment_output, segment_bytes, tensor_bytes

from .formats import entry_bytes, entry_ratio, format_segment_bytes
from .nme import segment_timing
from .schedules import ModelSchedule, branches_of, segment_runs
from .shapes import ModelShape

__all__ = ["Action", "SegmentItem", "MonitorItem", "Call", "Workload", "segment_bytes",
           "tensor_bytes", "from_events", "synthesize", "check_cache", "CALL_ORDER"]

#: branch order inside a call / between calls, per CFG mode
CALL_ORDER = {"batched": ("uncond", "cond"), "two_pass": ("cond", "uncond"),
              "distilled": ("cond",)}


def check_cache(cache: str) -> str:
    """``cache`` if it is one of :data:`coda.host.cache.forecast.CACHE_MODES`, else
    ValueError naming the value and the choices."""
    if cache not in CACHE_MODES:
        raise ValueError(f"cache={cache!r}: expected one of {', '.join(CACHE_MODES)}")
    return cache


@dataclass
class Action:
    """What one row does at one operator: ``reused`` (in ``segment``) or computed, with
    the bytes written to the DIMMs for its cache store and kept input. A reused operator
    reads ``terms`` cached tensors per stream: 1 (its last computed output) or 2 (a forecast
    term, its last two)."""
    reused: bool
    segment: int | None = None
    store_bytes: int = 0
    kept_bytes: int = 0
    terms: int = 1


@dataclass
class SegmentItem:
    """One segment of one row: operator indices, its ``[T, C]``, bytes, NME cycles (as
    the events report them: the backend's, per launch the slowest rank) and ``terms``, the
    cached tensors it reads per stream (``SegmentEvent.terms``; 0: one per operator)."""
    id: int
    row: tuple[str, int]
    ops: list[int]
    tokens: int
    channels: int
    bytes_down: int
    bytes_up: int
    programs: int
    nme_cycles: int
    stream_tokens: tuple = ()
    terms: int = 0

    @property
    def k(self) -> int:
        """Terms of the segment's NME program per stream: ``terms``, or one per operator."""
        return self.terms or len(self.ops)

    @property
    def forecast_terms(self) -> int:
        """Reused operators of the segment read as forecast terms (two cached tensors)."""
        return self.k - len(self.ops)


@dataclass
class MonitorItem:
    row: tuple[str, int]
    index: int
    tokens: int
    channels: int
    bytes_down: int
    nme_cycles: int


@dataclass
class Call:
    """One transformer call: its rows and, per operator index, each row's action."""
    step: int
    rows: list[tuple[str, int]]
    actions: list[list[Action]]
    monitors: dict = field(default_factory=dict)     # op index -> [MonitorItem]

    @property
    def branches(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b for b, _ in self.rows))


@dataclass
class Workload:
    """A generation ready to replay.

    Attributes:
        shape: the model. num_steps: steps. cfg: CFG mode of the calls.
        calls: per step, the calls in order. segments: id -> :class:`SegmentItem`.
        cache_slots: (branch, sample, op index) -> bytes of the operator's cache entries
            (one stored tensor's bytes times the entries kept: 1, or with history 2 two
            once it has been stored twice).
        source: ``"events"`` (a real generation) or ``"synthesized"``.
        schedule: the schedule's description (synthesized) or the log's stats.
        segment_output: the segments' form (:data:`coda.host.nmp.link.SEGMENT_OUTPUTS`):
            ``"sum"`` segments are followed by the xPU's residual add.
        cache: the cache mode (:data:`coda.host.cache.forecast.CACHE_MODES`).
        cache_group: G of int8 cache entries, None for bf16 (:mod:`coda.host.system.formats`).

    The cache mode (``cache``, :data:`coda.host.cache.forecast.CACHE_MODES`): ``"reuse"`` reads
    one cached tensor per reused operator; ``"forecast"`` (:mod:`coda.host.cache.forecast`) reads
    two, ``(1 + alpha) c_k - alpha c_k'``, where the operator's last two computed outputs are in
    the cache (a *forecast term*: two terms of its segment, one more ``[T, C]`` stream on the
    NMEs), keeps two entries per stored operator (history 2: the footprint doubles for every
    operator stored more than once) and stores a computed output when either of the next two
    steps reuses it (:meth:`coda.host.system.schedules.ModelSchedule.store_after_compute`,
    the cache engine's rule). A synthesised forecast generation has no alpha table (the
    paper-scale models' alphas are not calibrated here), so every reuse with two earlier computed
    steps is a forecast term, alpha = 0 steps included (the engine runs those as plain 1-term
    reuses): an upper bound of the forecast's cost.

    The cache format (``cache_group``: None for bf16 entries, else G of int8 entries,
    :mod:`coda.host.system.formats`): an int8 entry is ``0.5 + 1/G`` of the bf16 bytes in the
    footprint and in every store, and an int8 segment is the ``segment_int8`` program (its
    command words and NME cycles, at most 7 terms a launch). It composes with the forecast mode
    (both entries int8).
    """
    shape: ModelShape
    num_steps: int
    cfg: str
    calls: list[list[Call]]
    segments: dict
    cache_slots: dict
    source: str
    schedule: dict = field(default_factory=dict)
    segment_output: str = "sum"
    cache: str = "reuse"
    cache_group: int | None = None

    @property
    def cache_format(self) -> str:
        """``"bf16"`` or ``"int8"`` (:data:`coda.host.cache.compress.CACHE_FORMATS`)."""
        return "bf16" if self.cache_group is None else "int8"

    @property
    def entry_ratio(self) -> float:
        """Bytes of an entry against a bf16 entry's: 1, or ``0.5 + 1/G`` for int8."""
        return entry_ratio(self.cache_group)

    @property
    def history(self) -> int:
        """Cache entries kept per stored operator: 2 in forecast mode, else 1."""
        return 2 if self.cache == "forecast" else 1

    @property
    def forecast_terms(self) -> int:
        """Reused operator executions (all rows, steps) read as forecast terms."""
        return sum(a.terms - 1 for calls in self.calls for c in calls for acts in c.actions
                   for a in acts if a.reused)

    @property
    def samples(self) -> int:
        return 1 + max((s for c in self.calls[0] for _, s in c.rows), default=0)

    @property
    def cache_bytes(self) -> int:
        """Bytes of all cache entries (the footprint: entries are kept for the generation;
        with history 2 two per operator stored more than once), B."""
        return sum(self.cache_slots.values())

    def cache_bytes_per_branch(self) -> dict:
        out: dict = defaultdict(int)
        for (b, _, _), n in self.cache_slots.items():
            out[b] += n
        return dict(out)

    def rows(self) -> list[tuple[str, int]]:
        return sorted({r for calls in self.calls for c in calls for r in c.rows})

    def split_by_branch(self, call: Call) -> list[Call]:
        """``call`` as one call per branch (for CFG interleaving)."""
        out = []
        for b in call.branches:
            keep = [i for i, r in enumerate(call.rows) if r[0] == b]
            out.append(Call(call.step, [call.rows[i] for i in keep],
                            [[acts[i] for i in keep] for acts in call.actions],
                            {ix: [m for m in ms if m.row[0] == b]
                             for ix, ms in call.monitors.items()}))
        return out


def _group_rows(rows: list[tuple[str, int]], cfg: str) -> list[list[tuple[str, int]]]:
    order = CALL_ORDER[cfg]
    rows = sorted(rows, key=lambda r: (order.index(r[0]) if r[0] in order else 9, r[1]))
    if cfg == "two_pass":
        return [[r for r in rows if r[0] == b] for b in order if any(r[0] == b for r in rows)]
    return [rows]


def from_events(log: EventLog, shape: ModelShape, generation: int | None = None,
                cfg: str | None = None, segment_output: str = "sum",
                cache: str = "reuse", cache_group: int | None = None) -> Workload:
    """The :class:`Workload` of one generation of ``log`` (default: the last one; the shipped
    model's log: ``coda.host.model.sample.cached_generate(..., events=log)``), whose
    segments had the form ``segment_output`` and whose cache the mode ``cache`` (the events
    do not say them: the cache engine's ``CodaCacheConfig.segment_output`` and ``.cache``,
    or what :func:`synthesize` was given).

    In forecast mode an operator's footprint is two entries once it has been stored twice
    (the engine keeps the older one, ``StepRun.keep_previous``). A segment's forecast terms
    (``SegmentEvent.terms`` beyond one per operator) go to its operators that had two
    stored outputs before the step, in forward order (the events count them per segment,
    not per operator; the operators of a segment share its ``[T, C]``, so every total is
    exact). ``cache_group``: G of the generation's int8 entries (None: bf16; the engine's
    ``CodaCacheConfig.cache_group`` as resolved): its segments run the ``segment_int8``
    program; the events' bytes are the driver's, int8 already.

    Raises ValueError if the log has no such generation or names operators ``shape`` lacks,
    for a ``segment_output`` not in :data:`coda.host.nmp.link.SEGMENT_OUTPUTS`, a ``cache``
    not in :data:`coda.host.cache.forecast.CACHE_MODES`, or forecast terms with
    ``cache="reuse"``.
    """
    check_segment_output(segment_output)
    check_cache(cache)
    history = 2 if cache == "forecast" else 1
    if log.generations == 0:
        raise ValueError("the event log holds no generation")
    gen = log.generations - 1 if generation is None else generation
    ops = [e for e in log.of("op", gen)]
    if not ops:
        raise ValueError(f"generation {gen}: no operator events")
    cfg = cfg or shape.cfg
    if cfg not in CALL_ORDER:
        raise ValueError(f"cfg={cfg!r}: expected one of {sorted(CALL_ORDER)}")
    index = {o.ref: o.index for o in shape.ops}
    num_steps = ops[0].num_steps
    per_step: dict = defaultdict(dict)            # step -> (row, op index) -> Action
    slots: dict = {}
    stores: dict = defaultdict(int)               # (branch, sample, op index) -> stores so far
    in_segment: dict = defaultdict(list)          # segment -> [(Action, two entries stored)]
    for e in ops:
        if e.ref not in index:
            raise ValueError(f"event operator {e.ref} is not an operator of {shape.name}")
        i = index[e.ref]
        row, key = (e.branch, e.sample), (e.branch, e.sample, i)
        act = Action(e.reused, e.segment, e.stored_bytes, e.kept_bytes)
        per_step[e.step][(row, i)] = act
        if e.reused:
            in_segment[e.segment].append((act, stores[key] >= 2))
        if e.stored_bytes:
            stores[key] += 1
            slots[key] = e.stored_bytes * min(history, stores[key])
    segments = {}
    for s in log.of("segment", gen):
        seg = segments[s.segment] = SegmentItem(
            s.segment, (s.branch, s.sample), [index[tuple(r)] for r in s.ops], s.tokens,
            s.channels, s.bytes_to_nmp, s.bytes_from_nmp, s.programs, s.nme_cycles,
            tuple(getattr(s, "stream_tokens", ()) or ()), getattr(s, "terms", 0))
        _assign_forecast_terms(seg, in_segment.get(s.segment, []), cache)
    monitors: dict = defaultdict(lambda: defaultdict(list))
    for m in log.of("monitor", gen):
        monitors[m.step][index[(m.layer, m.op)]].append(MonitorItem(
            (m.branch, m.sample), index[(m.layer, m.op)], 0, 0, m.bytes_to_nmp, m.nme_cycles))
    calls = []
    for step in range(num_steps):
        acts = per_step.get(step, {})
        rows = sorted({r for r, _ in acts})
        step_calls = []
        for group in _group_rows(rows, cfg):
            table = [[acts.get((r, o.index), Action(False)) for r in group] for o in shape.ops]
            mons = {ix: [m for m in ms if m.row in group]
                    for ix, ms in monitors.get(step, {}).items()}
            step_calls.append(Call(step, group, table, mons))
        calls.append(step_calls)
    return Workload(shape, num_steps, cfg, calls, segments, slots, "events",
                    schedule=log.stats(gen), segment_output=segment_output, cache=cache,
                    cache_group=cache_group)


def _assign_forecast_terms(seg: SegmentItem, acts: list, cache: str) -> None:
    """Give ``seg.forecast_terms`` of the segment's reused operators ``acts`` ((Action, two
    entries stored) in forward order) two terms: those with two stored entries first."""
    extra = seg.forecast_terms
    if extra and cache != "forecast":
        raise ValueError(f"segment {seg.id}: {seg.k} terms for {len(seg.ops)} operators "
                         "(forecast terms) in a generation read with cache='reuse'; expected "
                         "cache='forecast'")
    if not 0 <= extra <= len(acts):
        raise ValueError(f"segment {seg.id}: {seg.k} terms for {len(seg.ops)} operators: "
                         "expected one or two per operator")
    for act, _ in sorted(acts, key=lambda pair: not pair[1])[:extra]:
        act.terms = 2


def synthesize(shape: ModelShape, schedule: ModelSchedule, *, n_ranks: int, lanes: int = NMEConfig.lanes,
               depth: int = NMP_DEPTH, samples: int = 1, fmt: str = "bf16",
               segment_output: str = "sum", cache: str = "reuse",
               cache_group: int | None = None) -> EventLog:
    """The :class:`EventLog` a cached generation of ``shape`` under ``schedule`` would emit
    on a ``n_ranks``-rank DIMM-NMP (no tensors: bytes and ideal-memory NME cycles from the
    shapes): operators in forward order, segments as the cache engine forms them (maximal
    runs, flushed before the row's next computed operator, at a barrier and at the end of the
    call), bytes as the driver moves them (:func:`coda.host.nmp.link.segment_bytes`,
    re-exported here) and NME cycles from the cycle model
    (:func:`coda.host.system.nme.segment_timing`, ideal memory, as the torch backend
    reports). One generation, ``samples`` samples per branch. ``segment_output``: the
    segments' form (:data:`coda.host.nmp.link.SEGMENT_OUTPUTS`); with ``"sum"`` a sample's
    first segment in a branch also writes its slot of zeros (one tensor per stream), as the
    cache engine counts it. ``cache``: the cache mode
    (:data:`coda.host.cache.forecast.CACHE_MODES`): with ``"forecast"`` a reused operator
    with two earlier computed steps (:meth:`ModelSchedule.computed_pairs`) is two terms of
    its segment (every such reuse: no alpha table, :class:`Workload`) and a computed output
    is stored when either of the next two steps reuses it. ``cache_group``: G of int8 entries
    (None: bf16, :mod:`coda.host.system.formats`): stores of ``0.5 + 1/G`` of the bytes and
    ``segment_int8`` segments (command words, cycles, 7 terms a launch). Raises ValueError for
    another ``segment_output`` or ``cache``."""
    check_segment_output(segment_output)
    history = 2 if check_cache(cache) == "forecast" else 1
    log = EventLog()
    gen = log.start_generation()
    seg_id = 0
    zero_written: set = set()           # (branch, sample): slot of zeros in rank memory
    n = schedule.num_steps
    forecast = {(b, o.index): set(schedule.computed_pairs(b, o.index))
                for b in branches_of(shape) for o in shape.ops} if history == 2 else {}
    for step in range(n):
        for branch in branches_of(shape):
            reused = schedule.reused(step, branch)
            runs = {run[0]: run for run in segment_runs(shape, reused)}
            for sample in range(samples):
                base = dict(generation=gen, step=step, num_steps=n, branch=branch,
                            sample=sample)
                for op in shape.ops:
                    if op.index in runs:
                        run = runs[op.index]
                        k = sum(1 + (step in forecast.get((branch, i), ())) for i in run)
                        st = op.stream_tokens
                        sb = format_segment_bytes(op.tokens, op.channels, k, n_ranks, lanes,
                                                  depth, cache_group, st, segment_output)
                        zero = 0
                        if segment_output == "sum" and (branch, sample) not in zero_written:
                            zero_written.add((branch, sample))
                            zero = tensor_bytes(op.tokens, op.channels, n_ranks, lanes, st)
                        t = segment_timing(op.tokens, op.channels, k, n_ranks=n_ranks,
                                           lanes=lanes, depth=depth, fmt=fmt,
                                           stream_tokens=st, group=cache_group)
                        for i in run:
                            o = shape.ops[i]
                            log.append(OpEvent(**base, layer=o.layer, op=o.op, index=i,
                                               reused=True, reason="schedule",
                                               tokens=o.tokens, channels=o.channels,
                                               dtype=fmt, segment=seg_id))
                        log.append(SegmentEvent(
                            **base, segment=seg_id,
                            ops=tuple(shape.ops[i].ref for i in run), first_index=run[0],
                            tokens=op.tokens, channels=op.channels, dtype=fmt,
                            bytes_to_nmp=zero + sb["down"], bytes_from_nmp=sb["up"],
                            programs=sb["programs"], nme_cycles=t.cycles_ideal, terms=k,
                            **({"stream_tokens": st} if st else {})))
                        seg_id += 1
                    elif op.index not in reused:
                        store = schedule.store_after_compute(step, branch, op.index, history)
                        log.append(OpEvent(
                            **base, layer=op.layer, op=op.op, index=op.index, reused=False,
                            reason="schedule", tokens=op.tokens, channels=op.channels,
                            dtype=fmt,
                            stored_bytes=entry_bytes(op.tokens, op.channels, n_ranks, lanes,
                                                     cache_group, op.stream_tokens)
                            if store else 0))
    return log

