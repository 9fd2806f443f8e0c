"""Reading the JSON files a user hands to coda (a base helper: it imports nothing of coda).

Schedule files (with their ``"coda"``, ``"forecast"`` and ``"dra"`` blocks) and GPU tables
are untrusted input. Every one is read by :func:`read_json` and checked by :func:`check`
against a JSON schema (``jsonschema``, Draft 2020-12) before anything is built from it
(the limits and the strict types: :func:`check`).

Every refusal is one ``ValueError`` naming the file (``what``, e.g. ``--schedule PATH``), the
field (``reuse[3].step``, ``dra.thresholds.12``) and what was expected; the CLI prints it as
``coda: error: ...`` with exit status 2. A schema may give a field's expectation in words
with the keyword ``"expected"`` (jsonschema ignores keywords it does not know); otherwise it
is written from the field's type and bounds.
"""

from __future__ import annotations

import json
import math
import os
import re
from itertools import accumulate
from pathlib import Path

from jsonschema import Draft202012Validator, validators

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_INT_DIGITS", "read_json", "parse_json", "check",
           "field_path", "short"]

#: the largest file read, bytes
MAX_BYTES = 16 * 2**20
#: the deepest nesting of objects and lists
MAX_DEPTH = 32
#: the most digits of an integer
MAX_INT_DIGITS = 30

# JSON strings (brackets inside them do not nest) and everything but brackets
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]+")


class _Refused(ValueError):
    """What the JSON parser's hooks refuse (a repeated key, a too long integer)."""


def read_json(path, what: str, expected: str = "a JSON file"):
    """The JSON value of the file ``path``.

    Args:
        path: str or Path. what: how the error names it (e.g. ``"--schedule PATH"``).
        expected: what the file should be, for the error.
    Raises:
        ValueError: ``"{what}: ..."``: the file cannot be read, is larger than
            :data:`MAX_BYTES`, is not UTF-8, is nested deeper than :data:`MAX_DEPTH`, is not
            JSON, repeats a key in an object, or holds an integer longer than
            :data:`MAX_INT_DIGITS` digits.
    """
    try:
        with open(Path(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw = b"" if size > MAX_BYTES else f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{what}: cannot read it ({exc.strerror or exc})") from None
    if size > MAX_BYTES or len(raw) > MAX_BYTES:
        raise ValueError(f"{what}: larger than {MAX_BYTES} bytes ({max(size, len(raw))} "
                         f"bytes or more); expected {expected}")
    return parse_json(raw, what, expected)


def parse_json(raw: bytes | str, what: str, expected: str = "JSON"):
    """The JSON value of ``raw`` (bytes: decoded as strict UTF-8). Raises ValueError as
    :func:`read_json` does (but for the size)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{what}: not a UTF-8 text file (byte 0x{raw[exc.start]:02x} at "
                             f"offset {exc.start}); expected {expected}") from None
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", raw))
    if max(accumulate(map(_NESTING.__getitem__, brackets)), default=0) > MAX_DEPTH:
        raise ValueError(f"{what}: nested deeper than {MAX_DEPTH} levels; expected "
                         f"{expected}")
    try:
        return json.loads(raw, object_pairs_hook=_object, parse_int=_integer,
                          parse_constant=float)
    except _Refused as exc:
        raise ValueError(f"{what}: not JSON: {exc}; expected {expected}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: not JSON: {exc.msg} at line {exc.lineno}, column "
                         f"{exc.colno}; expected {expected}") from None
    except (RecursionError, ValueError) as exc:     # cannot happen after the scan; kept safe
        raise ValueError(f"{what}: not JSON: {type(exc).__name__}; expected {expected}") \
            from None


def _object(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"the key {short(key)} twice in one object")
        out[key] = value
    return out


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-'))} digits (at most "
                       f"{MAX_INT_DIGITS})")
    return int(text)


# ------------------------------------------------------------------------------ the schema
def _is_integer(checker, value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(checker, value) -> bool:
    return _is_integer(checker, value) or (isinstance(value, float) and math.isfinite(value))


_Validator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "number": _is_number}))
_validators: dict = {}


def check(data, schema: dict, what: str) -> None:
    """Raise ValueError ``"{what}: FIELD: got VALUE; expected ..."`` for the first place
    where ``data`` (a parsed JSON value) breaks ``schema`` (a JSON schema, Draft 2020-12,
    with the strict ``integer`` and ``number`` below).

    What :func:`read_json` and this check refuse:

    - the file: at most :data:`MAX_BYTES` (its size is checked before it is read), strict UTF-8;
    - the text: containers nested at most :data:`MAX_DEPTH` deep (scanned before the parser
      recurses), no key twice in one object (``json`` would keep the last one silently),
      integers of at most :data:`MAX_INT_DIGITS` digits;
    - the values: the schema's types and ranges, where ``"integer"`` is an int only (not
      ``3.0``, ``3.9`` or ``true``) and ``"number"`` a finite int or float (not a bool, NaN or
      Infinity, which are parsed to floats so that the schema names the field holding them).
    """
    key = id(schema)
    if key not in _validators:
        _Validator.check_schema(schema)
        _validators[key] = (schema, _Validator(schema))
    error = next(_validators[key][1].iter_errors(data), None)
    if error is not None:
        raise ValueError(f"{what}: {_describe(error)}")


def field_path(parts) -> str:
    """``coda.steps[3].branch`` for the keys and indices ``("coda", "steps", 3,
    "branch")``; a key with other characters than letters, digits, ``_`` and ``-`` in
    brackets, as JSON text."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _PLAIN_KEY.fullmatch(p):
            out += ("." if out else "") + p
        else:
            out += f"[{json.dumps(p)}]"
    return out or "(the top level)"


def short(value, limit: int = 40) -> str:
    """``value`` as JSON text, cut to about ``limit`` characters, with its kind for a list
    or an object."""
    text = json.dumps(value)
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    kind = "a list " if isinstance(value, list) else "an object " if isinstance(value,
                                                                               dict) else ""
    return kind + text


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string",
               "object": "an object", "array": "a list", "boolean": "true or false",
               "null": "null"}


def _expected(schema: dict) -> str:
    """What ``schema`` asks for, in words."""
    if not isinstance(schema, dict):
        return "nothing here" if schema is False else "anything"
    if "expected" in schema:
        return schema["expected"]
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    types = schema.get("type", [])
    text = " or ".join(_TYPE_WORDS[t] for t in ([types] if isinstance(types, str) else types))
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if lo is not None and hi is not None:
        text += f" {lo!r}..{hi!r}"
    elif lo is not None:
        text += f" >= {lo!r}"
    elif hi is not None:
        text += f" <= {hi!r}"
    if "exclusiveMinimum" in schema:
        text += f" > {schema['exclusiveMinimum']!r}"
    if "maxItems" in schema:
        text += f" of at most {schema['maxItems']} items"
    if "maxLength" in schema:
        text += f" of at most {schema['maxLength']} characters"
    if "maxProperties" in schema:
        text += f" of at most {schema['maxProperties']} fields"
    return text.strip() or "something else"


def _describe(error) -> str:
    path = list(error.absolute_path)
    schema = error.schema
    if "propertyNames" in error.absolute_schema_path:      # a key of an object
        return f"{field_path(path)}: key {json.dumps(error.instance)}; expected " \
               f"{_expected(schema)}"
    if error.validator == "required":
        name = next(k for k in error.validator_value if k not in error.instance)
        sub = schema.get("properties", {}).get(name, {})
        return f"{field_path(path + [name])}: missing; expected {_expected(sub)}"
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = schema.get("properties", {})
        extra = sorted(k for k in error.instance if k not in known)[0]
        return (f"{field_path(path + [extra])}: unknown field; expected one of "
                f"{', '.join(known)}")
    return f"{field_path(path)}: got {short(error.instance)}; expected {_expected(schema)}"
