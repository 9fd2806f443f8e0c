"""Cache slots of the NMP driver (:mod:`coda.host.nmp.driver`): where a slot's tiles lie in the
rank memories, and the int8 entries beside the 16-bit ones.

A 16-bit slot ``[T, C]`` holds each rank's rows as ``ceil(rows * C / lanes)`` words. An int8
slot (``qgroup`` = G channels per scale) holds each rank's rows as the int8 values packed
``2 * lanes`` per word (the NME's INT8 stream: :mod:`coda.hw.nme.isa`), then the rows'
``rows * C / G`` scales in the 16-bit format from the next word on (a GROUP stream), both in
one range: :func:`int8_tile_words`. A segment on int8 slots is the ``segment_int8`` program
(:func:`segment_format`, :func:`term_operands`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import numpy as np
import torch

from coda.hw.nme.isa import NMEConfig
from coda.host.nme import ops as ref
from coda.host.nme.bits import from_bits, int8_words_for, torch_dtype, unpack_int8_words, \
    unpack_words, words_for

__all__ = ["Slot", "check_cache_tensor", "check_gate", "check_qgroup", "int8_tile_words",
           "load_int8", "segment_format", "swap_slots", "term_operands"]


@dataclass
class Slot:
    """One cache slot: its shape ``[T, C]`` and dtype (the NME format), each rank's token
    range, word address (None: an empty tile) and words (int8: q and scales together);
    for an int8 entry ``qgroup`` (G) and each rank's scales' address."""
    shape: tuple[int, int]
    dtype: torch.dtype
    rows: list[tuple[int, int]]
    addrs: list[int | None]
    words: list[int]
    qgroup: int | None = None
    scale_addrs: list[int | None] | None = None

    @property
    def fmt(self) -> str:
        """``"bf16"`` (a 16-bit entry in the NME format) or ``"int8"``."""
        return "bf16" if self.qgroup is None else "int8"


def swap_slots(slots: dict, a: Hashable, b: Hashable) -> None:
    """Exchange the entries of keys ``a`` and ``b`` in a slot table (a key without one takes
    the other's and leaves none behind); KeyError if neither has one."""
    sa, sb = slots.pop(a, None), slots.pop(b, None)
    if sa is None and sb is None:
        raise KeyError(f"no cache slot {a!r} or {b!r} to swap")
    if sa is not None:
        slots[b] = sa
    if sb is not None:
        slots[a] = sb


def check_cache_tensor(what: str, t, fmt: str) -> torch.Tensor:
    """``t`` if it is a tensor [T, C] of the cache format ``fmt``'s dtype (a slot's value, a
    segment's x); else ValueError naming ``what``, what it is and what was expected."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what} is {type(t).__name__}, expected a torch.Tensor")
    if t.dtype != torch_dtype(fmt):
        raise ValueError(f"{what} has dtype {t.dtype}, expected {torch_dtype(fmt)} "
                         f"(the NME format {fmt!r})")
    if t.dim() != 2:
        raise ValueError(f"{what} has shape {tuple(t.shape)}, expected [T, C]")
    return t


def check_gate(i: int, g, channels: int, fmt: str) -> torch.Tensor:
    """Gate ``i`` of a segment if it is a [C] tensor of the format ``fmt``'s dtype; else
    ValueError naming it, what it is and what was expected."""
    dtype = torch_dtype(fmt)
    if not isinstance(g, torch.Tensor) or g.dtype != dtype or tuple(g.shape) != (channels,):
        desc = f"{getattr(g, 'dtype', type(g).__name__)} {list(getattr(g, 'shape', []))}"
        raise ValueError(f"segment: gate {i} is {desc}, expected {dtype} [{channels}]")
    return g


def check_qgroup(qgroup: int, channels: int, lanes: int) -> int:
    """``qgroup`` (G, channels per int8 scale) if it divides ``channels`` (C) and is a multiple
    of ``lanes`` (a GROUP stream's scale must cover whole words); else ValueError naming G
    and C."""
    qgroup = int(qgroup)
    if qgroup < 1 or channels % qgroup or qgroup % lanes:
        raise ValueError(f"cache_group G={qgroup} for C={channels} channels: expected a "
                         f"divisor of C={channels} that is a multiple of the NME's {lanes} "
                         "lanes")
    return qgroup


def int8_tile_words(rows: int, channels: int, qgroup: int, lanes: int) -> tuple[int, int]:
    """(words of q, words of q and scales) of one rank's tile of ``rows`` tokens of an int8
    entry; (0, 0) for no rows."""
    if rows == 0:
        return 0, 0
    n = rows * channels
    q = int8_words_for(n, lanes)
    return q, q + words_for(n // qgroup, lanes)


def load_int8(slot: Slot, tiles: list[tuple[int, np.ndarray]], cfg: NMEConfig) -> torch.Tensor:
    """An int8 slot's value ``[T, C]`` in the NME format: each rank's ``(rows, words)`` (q and
    scales, as :func:`int8_tile_words` lays them out) dequantised as the NMEs do
    (:func:`coda.host.nme.ops.dequant_int8`)."""
    c, g = slot.shape[1], slot.qgroup
    parts = []
    for rows, words in tiles:
        n = rows * c
        qw = int8_words_for(n, cfg.lanes)
        q = unpack_int8_words(words[:qw], n).reshape(rows, c)
        s = unpack_words(words[qw:], n // g).reshape(rows, c // g)
        parts.append(ref.dequant_int8(torch.from_numpy(q), from_bits(s, cfg.fmt), g))
    return torch.cat(parts) if parts else torch.empty(slot.shape, dtype=slot.dtype)


def segment_format(keys: list[Hashable], slots: list[Slot]) -> tuple[str, int | None]:
    """The segment operator of these slots: ``("segment", None)`` on 16-bit entries,
    ``("segment_int8", G)`` on int8 entries of one G; ValueError for a mix."""
    kinds = {(s.fmt, s.qgroup) for s in slots}
    if len(kinds) > 1:
        raise ValueError(f"segment: slots {keys!r} mix cache formats "
                         f"{sorted(f'{f} G={g}' if g else f for f, g in kinds)}, "
                         "expected one format (and one G) per segment")
    fmt, qgroup = kinds.pop()
    return ("segment", None) if fmt == "bf16" else ("segment_int8", qgroup)


def term_operands(slots: list[Slot]) -> dict[str, list[list[int | None]]]:
    """The cached operands of a segment program on ``slots``: per operand, each slot's
    per-rank word addresses (``c``; int8: ``q`` and ``scale``)."""
    if slots[0].qgroup is None:
        return {"c": [s.addrs for s in slots]}
    return {"q": [s.addrs for s in slots], "scale": [s.scale_addrs for s in slots]}
