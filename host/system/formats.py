"""Cache entry formats in the system model: ``bf16`` (the NME's 16-bit format) or ``int8``
(:mod:`coda.host.cache.compress`: q packed two per 16-bit element, one 16-bit scale per G
channels), as the cache engine stores them (``CodaCacheConfig(cache_format=, cache_group=)``).

An int8 entry of ``[T, C]`` holds ``T·C`` bytes of q and ``T·C/G`` scales of 2 bytes:
``0.5 + 1/G`` of the bf16 bytes (:func:`entry_ratio`). Where the driver moves it (the DIMMs,
rank tiles of whole words: :func:`entry_bytes`, :func:`coda.host.nmp.slots.int8_tile_words`)
and where a GPU or host cache holds it (:func:`dense_entry_bytes`, systems b and c). An int8
segment term is the ``segment_int8`` program's (:mod:`coda.host.nme.compiler`): 4 micro-ops
and 3 streams (q as INT8, the scales as GROUP, the gate as CHAN) instead of 2 and 2, at most
:func:`terms_per_program` terms per launch (7 at the default NME limits), longer segments
chain: :func:`format_segment_bytes` counts its host-link bytes as
:func:`coda.host.nmp.link.segment_bytes` counts the bf16 segment's.
"""

from __future__ import annotations

import functools

from coda.host.cache.compress import CACHE_FORMATS, check_format, resolve_group
from coda.host.nme.bits import words_for
from coda.host.nme.compiler import segment_terms
from coda.host.nmp.link import CMD_WORD_BYTES, check_segment_output, segment_bytes, tensor_bytes
from coda.host.nmp.slots import int8_tile_words
from coda.host.nmp.tiling import tile_bounds
from coda.hw.nme.isa import NMEConfig

__all__ = ["CACHE_FORMATS", "cache_group", "entry_ratio", "entry_bytes", "dense_entry_bytes",
           "terms_per_program", "format_segment_bytes"]

#: micro-ops of one segment term: ``segment`` (CHAN gate, MAC) and ``segment_int8`` (INT8 q,
#: GROUP scale, CHAN gate, ADD): :mod:`coda.host.nme.compiler`'s table
TERM_UOPS = {None: 2, "int8": 4}


def cache_group(cache_format: str, channels: int, lanes: int,
                group: int | None = None) -> int | None:
    """G of the cache's int8 entries for a hidden size of ``channels`` (C) on ``lanes``-lane
    NMEs (:func:`coda.host.cache.compress.resolve_group`: ``group`` if valid, else the
    largest multiple of the lanes up to 64 dividing C), or None for ``"bf16"``.

    Raises ValueError naming the value: a format not in :data:`CACHE_FORMATS`, a G with
    ``"bf16"``, or a G that does not divide C or is not a multiple of the lanes (naming G
    and C)."""
    try:
        check_format(cache_format)
    except ValueError:
        raise ValueError(f"--cache-format {cache_format!r}: expected one of "
                         f"{', '.join(CACHE_FORMATS)}") from None
    if cache_format == "bf16":
        if group is not None:
            raise ValueError(f"--cache-group {group}: an int8 option, expected none with "
                             "--cache-format bf16")
        return None
    try:
        return resolve_group(channels, lanes, group)
    except ValueError as err:
        raise ValueError(f"--cache-group {group}: {err}") from None


def entry_ratio(group: int | None) -> float:
    """Bytes of a cache entry against a bf16 entry's: 1, or ``0.5 + 1/G`` for int8."""
    return 1.0 if group is None else 0.5 + 1.0 / group


def dense_entry_bytes(tokens: int, channels: int, elem: int, group: int | None) -> int:
    """Bytes of one ``[tokens, channels]`` entry held densely (a GPU or host-memory cache):
    ``T·C·elem``, or int8 ``T·C`` + ``T·C/G`` scales of ``elem`` bytes."""
    n = int(tokens) * int(channels)
    return n * elem if group is None else n + n // group * elem


def entry_bytes(tokens: int, channels: int, n_ranks: int, lanes: int, group: int | None = None,
                stream_tokens: tuple = ()) -> int:
    """Bytes the driver writes for one cache entry of ``[tokens, channels]`` tiled over
    ``n_ranks`` ranks: :func:`coda.host.nmp.link.tensor_bytes` for bf16; for int8 each rank
    tile's q and scales (:func:`coda.host.nmp.slots.int8_tile_words`); with
    ``stream_tokens``, one entry per stream."""
    if group is None:
        return tensor_bytes(tokens, channels, n_ranks, lanes, stream_tokens)
    return _int8_bytes(int(tokens), int(channels), int(n_ranks), int(lanes), int(group),
                       tuple(stream_tokens))


@functools.lru_cache(maxsize=4096)
def _int8_bytes(tokens: int, channels: int, n_ranks: int, lanes: int, group: int,
                stream_tokens: tuple) -> int:
    if stream_tokens:
        return sum(_int8_bytes(t, channels, n_ranks, lanes, group, ()) for t in stream_tokens)
    return sum(int8_tile_words(r1 - r0, channels, group, lanes)[1] * 2 * lanes
               for r0, r1 in tile_bounds(tokens, n_ranks))


def terms_per_program(lanes: int, depth: int, group: int | None = None) -> int:
    """Terms one NME launch holds: :func:`coda.host.nme.compiler.segment_terms` of
    ``segment`` (8) or ``segment_int8`` (7 at the default limits: 4 micro-ops a term)."""
    return segment_terms(NMEConfig(lanes=lanes, depth=depth),
                         "segment" if group is None else "segment_int8")


def format_segment_bytes(tokens: int, channels: int, k: int, n_ranks: int, lanes: int,
                         depth: int, group: int | None = None, stream_tokens: tuple = (),
                         segment_output: str = "sum") -> dict:
    """Host-link bytes of a ``k``-term segment on entries of G ``group`` (None: bf16,
    exactly :func:`coda.host.nmp.link.segment_bytes`). An int8 segment sends the same x and
    gates, and ``1 + 4·kk + 2`` command words per rank and launch of ``kk`` terms, at most
    :func:`terms_per_program` terms a launch (chained in rank memory); its result is a
    16-bit tensor as the bf16 segment's. Same keys as ``segment_bytes``."""
    if group is None:
        return segment_bytes(tokens, channels, k, n_ranks, lanes, stream_tokens,
                             segment_output)
    check_segment_output(segment_output)
    if stream_tokens:
        parts = [format_segment_bytes(t, channels, k, n_ranks, lanes, depth, group, (),
                                      segment_output) for t in stream_tokens]
        return {key: sum(p[key] for p in parts) for key in parts[0]}
    ranks = sum(1 for r0, r1 in tile_bounds(tokens, n_ranks) if r1 > r0)
    t = tensor_bytes(tokens, channels, n_ranks, lanes)
    gate = words_for(channels, lanes) * 2 * lanes
    x = t if segment_output == "residual" else 0
    per = terms_per_program(lanes, depth, group)
    gates = cmd = programs = 0
    for i in range(0, k, per):
        kk = min(per, k - i)
        gates += kk * gate * ranks
        cmd += CMD_WORD_BYTES * (1 + TERM_UOPS["int8"] * kk + 2) * ranks
        programs += 1
    return {"x": x, "gates": gates, "cmd": cmd, "y": t, "down": x + gates + cmd, "up": t,
            "programs": programs}
