"""JSON output never holds Infinity or NaN: one writer (coda.jsonout.json_text) for all."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from coda.jsonout import finite_or_none, json_text

ROOT = Path(__file__).resolve().parents[2]


def strict_loads(text):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_null_everywhere():
    values = [math.inf, -math.inf, math.nan, np.float32("nan"), np.float64("inf")]
    obj = {"a": values, "b": {"c": (1.5, values[0])}, "d": np.float32(2.5), "e": "inf"}
    got = strict_loads(json_text(obj, indent=1))
    assert got == {"a": [None] * len(values), "b": {"c": [1.5, None]}, "d": 2.5, "e": "inf"}
    assert finite_or_none(3) == 3 and finite_or_none(np.int64(7)) == 7


def test_every_command_writes_json_through_json_text():
    """No module writes json.dumps text to a file or stdout (where Infinity / NaN would go
    out as bare tokens); hashing and protocol uses of json.dumps are not output (the
    cosimulation server's socket lines: Python at both ends, NaN carried as NaN)."""
    pattern = re.compile(r"(write_text|print|\.write|np\.array)\(\s*\(?json\.dumps\(")
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in ("coda", "host", "cosim", "hw", "synth")
             for p in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)
             and p.relative_to(ROOT).as_posix() != "cosim/nme/server.py"]
    assert found == []


def test_nan_json_cannot_slip_through_default():
    with pytest.raises(ValueError):
        json_text({"x": object()}, default=lambda o: math.nan)
