"""JSON text of command output (a base helper: it imports nothing of coda).

JSON has no Infinity or NaN: ``json.dumps`` writes them as bare ``Infinity`` / ``NaN``, which
strict readers (``jq``, browsers, most languages) refuse. Every command writes its JSON files
and JSON lines through :func:`json_text`, which writes a non-finite number as ``null`` (a
PSNR of identical videos, a ratio with nothing to divide) and never emits either token.
"""

from __future__ import annotations

import json
import math

__all__ = ["json_text", "finite_or_none"]


def finite_or_none(obj):
    """``obj`` with every non-finite float (Python or numpy scalar) replaced by None, in
    nested dicts, lists and tuples (tuples become lists); other values unchanged."""
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if type(obj).__module__ == "numpy" and hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return finite_or_none(obj.item())
    return obj


def json_text(obj, **kw) -> str:
    """``json.dumps(obj, **kw)`` with non-finite numbers written as ``null``
    (:func:`finite_or_none`); raises ValueError (``allow_nan=False``) should one remain in
    an object ``json.dumps`` reaches through ``default``, TypeError as ``json.dumps``."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kw)
