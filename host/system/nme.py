"""NME time of a cache segment: the RTL-exact cycle model on the compiled program of each
rank's tile, bounded by the rank's DRAM bandwidth as the DIMM-NMP cosimulation measured it.

:func:`segment_timing` times a segment ``y = x + Σ_k g_k ⊙ c_k`` over ``[T, C]`` as the
driver runs it (:meth:`coda.host.nmp.driver.NMPDriver.segment`: tiled over tokens across the
ranks, one program per rank in lockstep, launches chained beyond
:data:`coda.host.nme.ops.MAX_SEGMENT_TERMS` terms): each launch takes ``max(cycles_ideal,
cycles_dram)`` NME cycles at the DRAM command clock, the ideal-memory cycles being exactly
those of the torch backend's :class:`coda.host.cache.events.SegmentEvent`. The DRAM
utilisation comes from measurements
(:func:`coda.host.system.platforms.segment_utilisation`), so a configuration without one is
refused, never guessed. Why ``max``, and what the model cannot see: ``docs/system-model.md``,
"How it works".
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Callable

from coda.host.nme import compiler
from coda.host.nme.ops import MAX_SEGMENT_TERMS
from coda.hw.nme.isa import ADDR_BITS, NMEConfig, Program, RSrc, Status
from coda.hw.nme.cycles import model_cycles

from .formats import terms_per_program

__all__ = ["SegmentTiming", "segment_timing", "program_words", "launch_cycles"]


@dataclass(frozen=True)
class SegmentTiming:
    """NME time of one segment (all its launches).

    Attributes:
        seconds: NME time, s. cycles: NME cycles (sum over launches of the slowest rank).
        cycles_ideal: the same on an ideal memory (what the torch backend reports).
        cycles_dram: DRAM-bound cycles (measured utilisation).
        programs: lockstep launches. rank_dram_bytes: bytes one rank moves;
        rank_write_bytes: the part of them it writes (stores), for the DRAM energy.
        ops: 16-bit FP operations on all ranks (adds, muls), for the energy model.
    """
    seconds: float
    cycles: int
    cycles_ideal: int
    cycles_dram: int
    programs: int
    rank_dram_bytes: int
    adds: int
    muls: int
    rank_write_bytes: int = 0


def program_words(program: Program, lanes: int) -> int:
    """Words a program moves between its rank's DRAM and the NME (reads + stores): a MEM or
    CHAN stream and a store one per word (a gate vector re-read per token), an INT8 stream
    one per two words (two words' int8 values per memory word), a GROUP stream its extent
    (one scale per ``param·lanes`` elements, the ISA's BAD_ADDR extent: the word adapter
    serves the repeated reads of one scale word from its read line)."""
    words = -(-program.n_elems // lanes)
    total = 0
    for u in program.uops:
        if u.store or RSrc(u.rsrc) in (RSrc.MEM, RSrc.CHAN):
            total += words
        elif RSrc(u.rsrc) == RSrc.INT8:
            total += -(-words // 2)
        elif RSrc(u.rsrc) == RSrc.GROUP:     # one element per param*lanes (scalar: one word)
            total += (words - 1) // (u.param * lanes) + 1 if u.param else 1
    return total


@functools.lru_cache(maxsize=4096)
def _compiled(lanes: int, depth: int, fmt: str, rows: int, channels: int, k: int,
              group: int | None = None) -> Program:
    words = -(-rows * channels // lanes)
    cfg = NMEConfig(lanes=lanes, depth=depth, fmt=fmt,
                    mem_words=min(1 << ADDR_BITS, max(1 << 16, (2 * k + 2) * words + 2 * k)),
                    max_elems=(1 << 32) - 1)
    if group is None:
        op, shapes = "segment", {"x": (rows, channels), "g": (k, channels),
                                 "c": (k, rows, channels)}
    else:
        op, shapes = "segment_int8", {"x": (rows, channels), "g": (k, channels),
                                      "q": (k, rows, channels),
                                      "scale": (k, rows, channels // group)}
    layout, _ = compiler.plan_layout(op, cfg, shapes, group)
    return compiler.compile_op(op, cfg, shapes, layout, group)


@functools.lru_cache(maxsize=4096)
def launch_cycles(lanes: int, depth: int, fmt: str, rows: int, channels: int, k: int,
                  mem_latency: int = 1, group: int | None = None
                  ) -> tuple[int, int, int, int]:
    """(cycles_ideal, words moved, elements, words stored) of one segment launch of ``k``
    terms on a ``rows x channels`` rank tile (int8 entries of G ``group``: the
    ``segment_int8`` program), split in row chunks where the ISA needs it; the words stored
    (the program's store micro-ops, one word per stream word) are DRAM writes, the rest of the
    words moved reads (for the DRAM energy)."""
    limit = (1 << 24) - 1
    words_row = -(-channels // lanes)
    max_rows = max(1, min(limit // channels, ((1 << ADDR_BITS) - 2 * k - 1)
                          // ((2 * k + 2) * words_row)))
    cycles = words = stored = 0
    left = rows
    while left > 0:
        r = min(left, max_rows)
        prog = _compiled(lanes, depth, fmt, r, channels, k, group)
        cfg = NMEConfig(lanes=lanes, depth=depth, fmt=fmt)
        cycles += model_cycles(cfg, prog, Status.OK, mem_latency)
        words += program_words(prog, lanes)
        stored += sum(u.store for u in prog.uops) * -(-prog.n_elems // lanes)
        left -= r
    return cycles, words, rows * channels, stored


def _arity(fn) -> int:
    """Positional parameters ``fn`` takes (2 for ``f(k, words)``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
               for p in params)


def segment_timing(tokens: int, channels: int, k: int, *, n_ranks: int, lanes: int,
                   depth: int, fmt: str = "bf16", clock_hz: float | None = None,
                   rank_peak_bytes_per_cycle: float | None = None,
                   dram_util: float | Callable[[int], float] | None = None,
                   mem_latency: int = 1, stream_tokens: tuple = (),
                   group: int | None = None) -> SegmentTiming:
    """NME time of a ``k``-term segment over ``[tokens, channels]`` on ``n_ranks`` ranks.

    Args:
        tokens, channels: the segment's ``[T, C]`` (C a multiple of ``lanes``).
        k: terms (cached operators), >= 1; more than 8 chain launches as the driver does.
        n_ranks: ranks (NMEs) the tensors are tiled over.
        lanes, depth, fmt: the NME configuration.
        clock_hz: NME clock (Hz) for ``seconds``; None: seconds = 0 (cycles only).
        rank_peak_bytes_per_cycle, dram_util: one rank's peak DRAM bytes per NME cycle and
            the measured utilisation (a number, or a function of a launch's terms and
            words per stream and rank, ``f(k, words)``, of those and the launch's index in
            its chain, ``f(k, words, program)`` (0 for the first of a segment of more than 8
            terms; the streams of a chained launch are placed otherwise, see
            :func:`coda.host.system.platforms.segment_utilisation`), or of its terms only,
            ``f(k)``); None: ideal memory (``cycles = cycles_ideal``).
        mem_latency: memory latency of the ideal-memory cycle model.
        stream_tokens: two residual streams (CogVideoX, HunyuanVideo): each its own segment
            of that many tokens, one after the other (the cache engine's order).
        group: int8 cache entries of G channels per scale (:mod:`coda.host.system.formats`):
            the ``segment_int8`` program (4 micro-ops and 3 streams a term, at most
            :func:`coda.host.system.formats.terms_per_program` terms a launch; two
            multiplies and an add per element and term), timed by the same cycle model;
            its DRAM utilisation is the bf16 segment's of the same terms (``dram_util``: no
            DRAM-timed measurement of int8 programs). None: bf16.
    Raises:
        ValueError: k < 1, or shapes the compiler refuses (C not a multiple of lanes).

    Tiles: the first ``T mod n`` ranks hold one row more, and the host waits for the
    slowest rank. Per launch:

    - ``cycles_ideal``: :func:`coda.hw.nme.cycles.model_cycles` of
      ``compile_op("segment", ...)`` on the largest tile, at memory latency ``mem_latency``
      (1 = the torch backend's and the Verilated NME's ideal memory);
    - ``cycles_dram``: the words the program moves on one rank (every memory read micro-op
      and the store read or write the whole stream; a per-channel gate vector is re-read for
      every token, as the NME does) times ``2·lanes`` bytes, divided by the rank's peak bytes
      per cycle and by the DRAM utilisation the DRAM-timed DIMM-NMP cosimulation measured for
      compiled segment programs of that many terms, that tile length and the segments' form
      (:func:`coda.host.system.platforms.segment_utilisation`, the data file
      ``host/system/segment_util.json`` that ``coda validate --measure-nmp`` writes: long
      streams and the shipped model's 3,072-word tiles over placements as a generation makes
      them, per segment form; ``1/utilisation`` interpolated linearly in ``1/words`` between
      the two);
    - the launch takes ``max(cycles_ideal, cycles_dram)`` NME cycles at the DRAM command
      clock.

    Where a rank tile exceeds the ISA's limits (``max_elems`` = 2^24 - 1 elements per
    program, 2^24 words of address space), it runs as several programs of whole rows
    (``row_chunks``), each timed the same way: the paper-scale models need that; the shipped
    model never does.
    """
    if k < 1:
        raise ValueError(f"segment of {k} terms: expected >= 1")
    if stream_tokens:
        parts = [segment_timing(t, channels, k, n_ranks=n_ranks, lanes=lanes, depth=depth,
                                fmt=fmt, clock_hz=clock_hz,
                                rank_peak_bytes_per_cycle=rank_peak_bytes_per_cycle,
                                dram_util=dram_util, mem_latency=mem_latency, group=group)
                 for t in stream_tokens]
        return SegmentTiming(*(sum(getattr(p, f) for p in parts)
                               for f in SegmentTiming.__dataclass_fields__))
    rows = -(-int(tokens) // int(n_ranks))            # the slowest rank's tile
    util_of = None
    if callable(dram_util):
        arity = _arity(dram_util)
        util_of = (dram_util if arity >= 3 else
                   (lambda kk, w, j: dram_util(kk, w)) if arity == 2 else
                   (lambda kk, w, j: dram_util(kk)))
    stream_words = -(-rows * int(channels) // lanes)
    total = ideal = dram = programs = 0
    rank_bytes = write_bytes = 0
    per = MAX_SEGMENT_TERMS if group is None else terms_per_program(lanes, depth, group)
    for i in range(0, k, per):
        kk = min(per, k - i)
        cyc, words, _, stored = launch_cycles(lanes, depth, fmt, rows, int(channels), kk,
                                              mem_latency, group)
        nbytes = words * 2 * lanes
        if rank_peak_bytes_per_cycle is None:
            cd = 0
        else:
            util = util_of(kk, stream_words, programs) if util_of else dram_util
            cd = math.ceil(nbytes / (rank_peak_bytes_per_cycle * util))
        ideal += cyc
        dram += cd
        total += max(cyc, cd)
        rank_bytes += nbytes
        write_bytes += stored * 2 * lanes
        programs += 1
    elems = int(tokens) * int(channels)
    seconds = total / clock_hz if clock_hz else 0.0
    return SegmentTiming(seconds=seconds, cycles=total, cycles_ideal=ideal, cycles_dram=dram,
                         programs=programs, rank_dram_bytes=rank_bytes, adds=k * elems,
                         muls=(1 if group is None else 2) * k * elems,
                         rank_write_bytes=write_bytes)
