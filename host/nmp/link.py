"""Host-link (PCIe) bytes of the DIMM-NMP's tensors and segments, as
:class:`coda.host.nmp.driver.NMPDriver` moves them: the one formula the system model
(:mod:`coda.host.system.workload`, :mod:`coda.host.system.replay`) counts with.

A tensor ``[T, C]`` in the NME format (bf16 or fp16: 2 bytes an element) is tiled over the
ranks by tokens (:func:`coda.host.nmp.tiling.tile_bounds`), each rank tile whole words of
``lanes`` elements (:func:`coda.host.nme.bits.words_for`).

A segment (:mod:`coda.host.cache.engine`) has two forms (:data:`SEGMENT_OUTPUTS`):
``"sum"`` (the engine's default: ``z = Σ g_k ⊙ c_k`` comes up) and ``"residual"`` (``x`` goes
down, ``y`` comes up); what each moves: :func:`segment_bytes`.
"""

from __future__ import annotations

import functools

from coda.host.nme.bits import words_for
from coda.host.nmp.tiling import tile_bounds
from coda.host.nme.ops import MAX_SEGMENT_TERMS

__all__ = ["SEGMENT_OUTPUTS", "CMD_WORD_BYTES", "tensor_bytes", "segment_bytes",
           "check_segment_output"]

#: what a segment returns to the xPU: ``Σ g_k ⊙ c_k`` (``"sum"``, the default) or
#: ``x + Σ g_k ⊙ c_k`` (``"residual"``)
SEGMENT_OUTPUTS = ("sum", "residual")
#: bytes of one command word (a program header or micro-op word) per rank and launch
CMD_WORD_BYTES = 8


def check_segment_output(segment_output: str) -> str:
    """``segment_output`` if it is one of :data:`SEGMENT_OUTPUTS`, else ValueError naming
    the value and the choices."""
    if segment_output not in SEGMENT_OUTPUTS:
        raise ValueError(f"segment_output={segment_output!r}: expected one of "
                         f"{', '.join(repr(s) for s in SEGMENT_OUTPUTS)}")
    return segment_output


def tensor_bytes(tokens: int, channels: int, n_ranks: int, lanes: int,
                 stream_tokens: tuple = ()) -> int:
    """Bytes the driver moves for one 16-bit ``[tokens, channels]`` tensor tiled over
    ``n_ranks`` ranks (whole ``2·lanes``-byte words per rank tile); with ``stream_tokens``,
    one tensor per stream of that many tokens. (Memoised: a system-model replay asks for
    the same shapes thousands of times.)"""
    return _tensor_bytes(int(tokens), int(channels), int(n_ranks), int(lanes),
                         tuple(stream_tokens))


@functools.lru_cache(maxsize=4096)
def _tensor_bytes(tokens: int, channels: int, n_ranks: int, lanes: int,
                  stream_tokens: tuple) -> int:
    if stream_tokens:
        return sum(_tensor_bytes(t, channels, n_ranks, lanes, ()) for t in stream_tokens)
    return sum(words_for((r1 - r0) * channels, lanes) * 2 * lanes
               for r0, r1 in tile_bounds(tokens, n_ranks) if r1 > r0)


def segment_bytes(tokens: int, channels: int, k: int, n_ranks: int, lanes: int,
                  stream_tokens: tuple = (), segment_output: str = "sum") -> dict:
    """Host-link bytes of a ``k``-term segment on ``[tokens, channels]`` 16-bit tensors.

    A segment (:mod:`coda.host.cache.engine`) has two forms (:data:`SEGMENT_OUTPUTS`,
    ``CodaCacheConfig.segment_output``):

    - ``"sum"`` (the engine's default): the NME returns ``z = Σ g_k ⊙ c_k`` from a slot of zeros
      resident in rank memory; ``z`` comes up, nothing of the residual stream goes down. The
      slot of zeros is written once per generation, CFG branch, sample and stream
      (:func:`tensor_bytes` of the stream), by the sample's first segment in the branch,
      placed in the DRAM banks where the segment would put an x it sent;
    - ``"residual"``: ``x`` goes down and ``y = x + Σ g_k ⊙ c_k`` comes up.

    Both send the gates (one ``[C]`` vector per term, replicated to every rank) and the
    command words down.

    Down: ``x`` (``"residual"`` only: :func:`tensor_bytes`), the gates (``k`` vectors of
    ``channels`` elements, whole words, replicated to every rank with a tile) and the command
    words (:data:`CMD_WORD_BYTES` per header or micro-op word, per rank and launch; a launch
    of ``kk`` terms has ``2·kk + 2`` micro-ops). Up: the result (``z`` or ``y``, one
    tensor). A segment of more than :data:`coda.host.nme.ops.MAX_SEGMENT_TERMS` terms chains
    launches in rank memory (each reads the previous one's output there, as
    ``NMPDriver.segment_submit`` does), so its tensors cross the link once each way. The
    one-time write of ``"sum"``'s slot of zeros is not a segment's: see above.

    With ``stream_tokens`` (two residual streams), each stream is its own segment of that
    many tokens (its own gates and programs), as the cache engine runs them.

    Returns ``{"x", "gates", "cmd", "y", "down", "up", "programs"}`` (bytes; programs: NME
    launches). Raises ValueError for a ``segment_output`` not in :data:`SEGMENT_OUTPUTS`.
    """
    check_segment_output(segment_output)
    return dict(_segment_bytes(int(tokens), int(channels), int(k), int(n_ranks), int(lanes),
                               tuple(stream_tokens), segment_output))


@functools.lru_cache(maxsize=4096)
def _segment_bytes(tokens: int, channels: int, k: int, n_ranks: int, lanes: int,
                   stream_tokens: tuple, segment_output: str) -> tuple:
    """:func:`segment_bytes` as (key, value) pairs, memoised."""
    if stream_tokens:
        parts = [segment_bytes(t, channels, k, n_ranks, lanes, segment_output=segment_output)
                 for t in stream_tokens]
        return tuple((key, sum(p[key] for p in parts)) for key in parts[0])
    ranks = sum(1 for r0, r1 in tile_bounds(tokens, n_ranks) if r1 > r0)
    t = tensor_bytes(tokens, channels, n_ranks, lanes)
    gate = words_for(channels, lanes) * 2 * lanes
    x = t if segment_output == "residual" else 0
    y = t
    gates = cmd = programs = 0
    for i in range(0, k, MAX_SEGMENT_TERMS):
        kk = min(MAX_SEGMENT_TERMS, k - i)
        gates += kk * gate * ranks
        cmd += CMD_WORD_BYTES * (1 + 2 * kk + 2) * ranks
        programs += 1
    return (("x", x), ("gates", gates), ("cmd", cmd), ("y", y), ("down", x + gates + cmd),
            ("up", y), ("programs", programs))
