"""The one rule for list values of every command (a base helper: it imports nothing of coda).

A comma-separated option (``--prompts 0,3``, ``--skip 0.3,0.5``, ``coda sweep --param
dimms=1,2``, a ``--grid`` TOML list) has no empty item and no value twice: a duplicate is a
typo or a misunderstanding, so it is refused, never silently dropped.
"""

from __future__ import annotations

__all__ = ["items", "no_duplicates", "parse_int_list", "parse_list"]


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


def parse_int_list(text, flag: str, lo: int, hi: int) -> list[int]:
    """``"0-9"``, ``"1,4,9"`` or ``"0-2,7"`` -> a list of ints in ``lo..hi``, order kept.
    Empty items and duplicates (also through overlapping ranges) are refused.

    Raises ValueError naming ``flag``."""
    expected = (f"distinct integers {lo}..{hi} as a comma-separated list or ranges, such as "
                "0-9 or 1,4,9")
    out: list[int] = []
    for part in items(text, flag, expected):
        try:
            if "-" in part[1:]:
                a, b = (part.split("-", 1) if not part.startswith("-") else (part, ""))
                a, b = int(a), int(b)
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {part!r} is not an integer or a range a-b "
                             f"(a <= b), expected {expected}") from None
    bad = [v for v in out if not lo <= v <= hi]
    if bad:
        raise ValueError(f"{flag} {text!r}: {bad[0]} is out of range, expected {expected}")
    no_duplicates(out, text, flag, expected)
    return out


def parse_list(text, flag: str, kind=str, *, choices=None, expected: str | None = None) -> list:
    """A comma-separated list of ``kind`` values (``str``: names, ``float``: numbers), order
    kept; empty items and duplicates are refused, and with ``choices`` any other name.

    Raises ValueError naming ``flag``."""
    expected = expected or (f"a comma-separated list of {', '.join(choices)}" if choices
                            else "a comma-separated list")
    out = []
    for part in items(text, flag, expected):
        try:
            value = kind(part)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {part!r} is not a {kind.__name__}, expected "
                             f"{expected}") from None
        if choices is not None and value not in choices:
            raise ValueError(f"{flag} {value!r}: unknown value, expected {expected}")
        out.append(value)
    no_duplicates(out, text, flag, expected)
    return out
