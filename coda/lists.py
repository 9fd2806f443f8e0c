"""The one rule for list values of every command (a base helper: it imports nothing of coda).

A comma-separated option (``--prompts 0,3``, ``--skip 0.3,0.5``, ``coda sweep --param
dimms=1,2``, a ``--grid`` TOML list) has no empty item and no value twice: a duplicate is a
typo or a misunderstanding, so it is refused, never silently dropped.
"""

from __future__ import annotations

__all__ = ["items", "no_duplicates"]


def items(text, flag: str, expected: str) -> list[str]:
    """The comma-separated items of ``text``, stripped; an empty item (``1,,2``, a leading or
    trailing comma, an empty list) is refused: ValueError naming ``flag``."""
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise ValueError(f"{flag} {text!r}: empty, expected {expected}")
    if not all(parts):
        raise ValueError(f"{flag} {text!r}: an empty item, expected {expected}")
    return parts


def no_duplicates(values: list, text, flag: str, expected: str) -> None:
    """ValueError naming ``flag``, ``text`` and the first value of ``values`` given twice
    (values compared after conversion: ``0.3,0.30`` holds 0.3 twice)."""
    seen: set = set()
    for v in values:
        if v in seen:
            raise ValueError(f"{flag} {text!r}: {v!r} given twice, expected {expected}")
        seen.add(v)
