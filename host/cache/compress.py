"""Compressed cache entries: the format a computed output is kept in rank memory
(``cache_format``, :data:`CACHE_FORMATS`).

- ``"bf16"`` (default): the NME's own 16-bit format (bf16, or fp16 on an fp16 NME), the output
  rounded once to it; a segment reads it as a plain stream (:func:`coda.host.nme.ops.segment`);
- ``"int8"``: per token and group of G channels, a scale ``max|c| / 127`` in the NME format
  and int8 ``q`` (:func:`coda.host.nme.ops.quant_int8`, on the xPU where the output is
  computed), packed by :meth:`coda.host.nmp.driver.NMPDriver.store_int8`: ``0.5 + 1/G`` of
  the bytes of a 16-bit entry; a segment dequantises on the NMEs
  (:func:`coda.host.nme.ops.segment_int8`). An int8 entry holds finite values only (an output
  with inf or NaN is refused); ``bf16`` keeps every value as it is. More:
  ``docs/cache-engine.md``, "int8 entries".

:func:`resolve_group` picks G: a divisor of the hidden size C and a multiple of the NME's
lanes, by default the largest such G up to :data:`DEFAULT_GROUP`.
"""

from __future__ import annotations

from coda.host.nmp.slots import check_qgroup

__all__ = ["CACHE_FORMATS", "DEFAULT_GROUP", "check_format", "resolve_group"]

#: what a cached operator output is stored as in rank memory
CACHE_FORMATS = ("bf16", "int8")
#: the largest default group of channels per int8 scale
DEFAULT_GROUP = 64


def check_format(cache_format: str) -> str:
    """``cache_format`` if it is one of :data:`CACHE_FORMATS`; else ValueError naming them."""
    if cache_format not in CACHE_FORMATS:
        raise ValueError(f"cache_format={cache_format!r}: expected one of "
                         f"{', '.join(CACHE_FORMATS)}")
    return cache_format


def resolve_group(channels: int, lanes: int, group: int | None = None) -> int:
    """The int8 group G (channels per scale) for a hidden size of ``channels`` (C) on an NME
    of ``lanes`` lanes: ``group`` if given and valid, else the largest multiple of ``lanes``
    up to :data:`DEFAULT_GROUP` that divides C.

    Raises:
        ValueError: a given G that does not divide C or is not a multiple of the lanes, or no
            default G (C has no divisor that is a multiple of the lanes), naming G and C.
    """
    channels, lanes = int(channels), int(lanes)
    if group is not None:
        return check_qgroup(group, channels, lanes)
    for g in range(DEFAULT_GROUP - DEFAULT_GROUP % lanes, 0, -lanes):
        if channels % g == 0:
            return g
    raise ValueError(f"cache_format='int8' on C={channels} channels: no group G <= "
                     f"{DEFAULT_GROUP} divides C={channels} and is a multiple of the NME's "
                     f"{lanes} lanes; give cache_group")
