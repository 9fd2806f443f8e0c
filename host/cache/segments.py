"""Segments of the cache engine: each maximal run of a sample's consecutive reused operators
(within one step, branch and program), computed on the NMEs as ``x + Σ g_k ⊙ c_k`` per
residual stream.

A reused operator queues a :class:`ReusedOp` (its current adaLN gates and where it is) on
its row; :func:`launch` sends a row's queue to the driver (``segment_submit``: chained in
rank memory beyond the NME's :data:`~coda.host.nme.ops.MAX_SEGMENT_TERMS` terms per program,
running while the host goes on), with x a slot of zeros resident in rank memory
(:func:`zero_input`, ``segment_output="sum"``) or the row itself (``"residual"``);
:func:`finish` takes the results into the row and emits the operators' and the segment's
events. Between the two the step's other CFG branch computes (:mod:`coda.host.cache.step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from coda.host.cache.events import OpEvent, SegmentEvent
from coda.host.cache.forecast import forecast_gates
from coda.host.cache.schedule import ScheduleError
from coda.host.nme.ops import MAX_SEGMENT_TERMS
from coda.host.nmp.launch import PendingOp

__all__ = ["ReusedOp", "LaunchedSegment", "launch", "zero_input", "finish"]


class ReusedOp(NamedTuple):
    """One reused operator of a row, queued for the row's segment: ``gates`` (stream -> the
    row's gate [C] in the cache dtype), its ``layer``, ``op``, ``index`` (in the model's
    operator order) and the policy's ``reason``."""
    gates: dict[str, torch.Tensor]
    layer: int
    op: str
    index: int
    reason: str


@dataclass
class LaunchedSegment:
    """A row's segment on the NMEs: its reused operators, per stream the launches
    (:class:`~coda.host.nmp.launch.PendingOp` s, one per chunk for a driver without
    chaining), and the bytes written for its slot of zeros (0 once the slot is there)."""
    row: int
    ops: list[ReusedOp]
    launches: dict[str, list]
    zero_bytes: int = 0
    terms: int = 0


def launch(run: Any, row: int) -> LaunchedSegment:
    """Launch a row's pending reused operators (``run``: the step's
    :class:`coda.host.cache.step.StepRun`) as one segment per residual stream,
    ``x + Σ g_k ⊙ c_k`` with x = 0 (``"sum"``) or the row (``"residual"``). The NME takes at
    most MAX_SEGMENT_TERMS terms per program: the driver chains longer ones in rank memory
    (one round trip); a driver without ``segment_submit`` gets one call per
    MAX_SEGMENT_TERMS terms (the same rounding).
    Raises ScheduleError for a reuse whose cached tensor is missing or of another shape."""
    ops, run.pending[row] = run.pending[row], []
    hook, driver = run.hook, run.driver
    br, j = run.branch_of[row], run.sample_of[row]
    slots = hook.state.branches[br].slots
    submit = getattr(driver, "segment_submit", None)
    native = submit is not None
    if submit is None:      # a driver without asynchronous launches or chaining
        submit = lambda *a: PendingOp.done(driver.segment(*a))  # noqa: E731
    launches: dict[str, list] = {}
    zero_bytes = 0
    terms = 0
    for stream, h in run.h.items():
        x16 = h[row].reshape(-1, run.c).to(run.dtype).contiguous()
        keys = [hook.key(br, j, r.layer, r.op, stream=stream) for r in ops]
        for key, r in zip(keys, ops):
            if key not in slots or slots[key][0] != tuple(x16.shape) or key not in driver:
                raise ScheduleError(
                    f"step {run.step}, branch {br}, sample {j}: reuse of ({r.layer}, {r.op!r}) "
                    f"needs a cached tensor of shape {tuple(x16.shape)}, found "
                    f"{slots[key][0] if key in slots else None}")
        gates, keys = _terms(run, br, j, stream, ops, keys, tuple(x16.shape))
        terms = len(keys)
        chunk = len(keys) if native else MAX_SEGMENT_TERMS
        y = x16
        if hook.config.segment_output == "sum":
            y, written = zero_input(run, br, j, stream, x16, in_place=native)
            zero_bytes += written
        pending = []
        for i in range(0, len(keys), chunk):
            if pending:
                y = pending[-1].result()
            pending.append(submit(y, gates[i:i + chunk], keys[i:i + chunk]))
        launches[stream] = pending
    return LaunchedSegment(row, ops, launches, zero_bytes, terms)


def _terms(run: Any, branch: str, sample: int, stream: str, ops: list[ReusedOp], keys: list,
           shape: tuple) -> tuple[list, list]:
    """The segment's (gates, slot keys) on one stream: one term ``g c_k`` per reused operator,
    or in forecast mode two, ``(g (1 + alpha)) c_k`` and ``(-g alpha) c_k'``
    (:func:`coda.host.cache.forecast.forecast_gates`), where alpha at this step is not 0 and
    the previous entry ``c_k'`` is in rank memory (else plain reuse)."""
    config = run.hook.config
    if config.cache != "forecast":
        return [r.gates[stream] for r in ops], keys
    slots = run.hook.state.branches[branch].slots
    gates, out = [], []
    for r, key in zip(ops, keys):
        alpha = config.forecast.alpha(run.step, r.op)
        prev = run.hook.key(branch, sample, r.layer, r.op, "prev", stream)
        if alpha == 0.0 or prev not in slots or slots[prev][0] != shape:
            gates.append(r.gates[stream])
            out.append(key)
            continue
        g_now, g_prev = forecast_gates(r.gates[stream], alpha, run.dtype)
        gates += [g_now, g_prev]
        out += [key, prev]
    return gates, out


def zero_input(run: Any, branch: str, sample: int, stream: str, x16: torch.Tensor,
               in_place: bool):
    """The x of a sum segment: with ``in_place`` (a driver with ``segment_submit``, which
    reads x from a slot) the key of the sample's slot of zeros of ``x16``'s shape, placed
    where the segment would put an x it sent (``store(..., x_of=group)``: the same DRAM
    banks as a residual segment), written once per generation and kept with the
    branch's slots (its bytes go to the first segment that needs it); else a zero
    tensor. Returns (x, bytes written)."""
    if not in_place:
        return torch.zeros_like(x16), 0
    key = run.hook.key(branch, sample, -1, "zero", stream=stream)
    slots = run.hook.state.branches[branch].slots
    if key in slots and slots[key][0] == tuple(x16.shape) and key in run.driver:
        return key, 0
    before = run.bytes_written()
    run.driver.store(key, torch.zeros_like(x16), x_of=(branch, sample, stream))
    slots[key] = (tuple(x16.shape), run.step)
    return key, run.bytes_written() - before


def finish(run: Any, seg: LaunchedSegment) -> None:
    """Take a launched segment's results into its row (``"sum"``: added to it in the
    model's dtype; ``"residual"``: in place of it); emit its OpEvents and SegmentEvent."""
    hook, row = run.hook, seg.row
    add = hook.config.segment_output == "sum"
    for stream, pending in seg.launches.items():
        y = pending[-1].result()
        h = run.h[stream]
        y = y.to(h.dtype).reshape(h.shape[1:])
        h[row] = h[row] + y if add else y
    every = [p for pending in seg.launches.values() for p in pending]
    per_stream = run.tokens()
    tokens = sum(per_stream.values())
    number = hook.state.segments
    hook.state.segments += 1
    fields = run.event_fields(row)
    for r in seg.ops:
        hook.emit(OpEvent(**fields, layer=r.layer, op=r.op, index=r.index, reused=True,
                          reason=r.reason, tokens=tokens, channels=run.c,
                          dtype=hook.fmt, segment=number))
    hook.emit(SegmentEvent(
        **fields, segment=number, ops=tuple((r.layer, r.op) for r in seg.ops),
        first_index=seg.ops[0].index, tokens=tokens, channels=run.c, dtype=hook.fmt,
        bytes_to_nmp=seg.zero_bytes + sum(p.bytes_to_nmp for p in every),
        bytes_from_nmp=sum(p.bytes_from_nmp for p in every),
        programs=sum(p.programs for p in every),
        nme_cycles=sum(p.nme_cycles for p in every), terms=seg.terms,
        stream_tokens=tuple(per_stream.values()) if len(per_stream) > 1 else ()))
