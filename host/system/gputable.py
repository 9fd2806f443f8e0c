"""Measured xPU times: the table ``coda calibrate`` writes (:mod:`coda.host.system.calibrate`)
and what the replay reads of it (``coda sim --gpu-table FILE``).

The table is a small JSON object, per *block* of the model (one block of each block type is
timed; the replay counts the model's blocks from its shape), at one model, resolution and
frame count; :data:`TABLE_SCHEMA` checks it and :class:`GpuTimes` reads it. Its fields:
``docs/system-model.md``, "Measured xPU times". Seconds throughout. Lookups return None
where the table has no entry, and the replay then keeps the roofline
(:mod:`coda.host.system.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coda.jsonin import check, field_path, read_json

__all__ = ["TABLE_KIND", "TABLE_VERSION", "TABLE_SCHEMA", "GpuTimes", "fit_copy"]

TABLE_KIND = "coda-gpu-table"
TABLE_VERSION = 1
#: top-level fields every table has
FIELDS = ("kind", "version", "device", "timer", "date", "command", "statistic", "warmup",
          "repeat", "model", "cls", "dtype", "height", "width", "frames", "latent",
          "video_tokens", "text_tokens", "hidden", "per", "batches", "ops", "blocks",
          "other_s", "cache_ops", "copies")
TIMERS = ("cuda_events", "perf_counter")


def fit_copy(small_bytes: int, small_s: float, big_bytes: int, big_s: float) -> dict:
    """``latency_s + bytes / bw`` through two timed copies (a small and a big one):
    ``{"bw": bytes/s, "latency_s": s}``. When the big copy was not slower than the small one
    (timer noise) the line cannot be fitted: bw = big_bytes / big_s and latency 0."""
    if big_bytes <= small_bytes or big_s <= small_s:
        return {"bw": big_bytes / big_s, "latency_s": 0.0}
    bw = (big_bytes - small_bytes) / (big_s - small_s)
    return {"bw": bw, "latency_s": max(0.0, small_s - small_bytes / bw)}


def _times(zero_ok: bool = False) -> dict:
    """{batch: seconds}: measured times, finite, > 0 (>= 0 with ``zero_ok``: a block's
    ``rest_s`` and ``other_s`` are differences that coda calibrate clips at 0)."""
    bound = {"minimum": 0} if zero_ok else {"exclusiveMinimum": 0}
    more = "= 0" if zero_ok else " 0"
    return {"type": "object", "maxProperties": 2,
            "propertyNames": {"enum": ["1", "2"], "expected": 'a batch size "1" or "2"'},
            "additionalProperties": {"type": "number", **bound,
                                     "expected": f"measured seconds >{more} (a finite number)"},
            "expected": f"measured times >{more} s, one per batch size ({{batch: seconds}})"}


def _seconds(zero_ok: bool = False) -> dict:
    bound = {"minimum": 0} if zero_ok else {"exclusiveMinimum": 0}
    return {"type": "number", **bound,
            "expected": f"measured seconds >{'= 0' if zero_ok else ' 0'} (a finite number)"}


def _count(lo: int = 1) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": 10**9}


_TEXT = {"type": "string", "maxLength": 1000}
_BYTES = {"type": "number", "exclusiveMinimum": 0}        # a copy's bytes or bytes/s
_COPY = {"type": "object",
         "required": ["small_bytes", "small_s", "bytes", "s", "bw", "latency_s"],
         "properties": {"small_bytes": _BYTES, "small_s": _seconds(), "bytes": _BYTES,
                        "s": _seconds(), "bw": _BYTES,
                        "latency_s": _seconds(zero_ok=True)},
         "additionalProperties": False}
#: the table (its fields: docs/system-model.md, "Measured xPU times") as a JSON schema (:func:`coda.jsonin.check`), after its
#: ``kind`` and ``version``
TABLE_SCHEMA: dict = {
    "type": "object",
    "required": list(FIELDS),
    "properties": {
        "kind": {"const": TABLE_KIND}, "version": {"const": TABLE_VERSION},
        "device": {"type": "object", "required": ["name", "type", "torch", "cuda"],
                   "properties": {"name": _TEXT, "type": {"enum": ["cuda", "cpu"]},
                                  "torch": _TEXT, "cuda": {"type": ["string", "null"]},
                                  "diffusers": _TEXT},
                   "additionalProperties": False},
        "timer": {"enum": list(TIMERS)}, "date": _TEXT, "command": _TEXT,
        "statistic": {"const": "median"}, "warmup": _count(0), "repeat": _count(),
        "seed": _count(0), "model": _TEXT, "cls": _TEXT, "dtype": _TEXT,
        "height": _count(), "width": _count(), "frames": _count(),
        "latent": {"type": "array", "maxItems": 8, "items": _count()},
        "video_tokens": _count(), "text_tokens": _count(0), "hidden": _count(),
        "per": {"const": "block"},
        "batches": {"type": "array", "items": {"type": "integer"}, "enum": [[1], [1, 2]],
                    "expected": "[1] or [1, 2] (the rows per call coda calibrate times)"},
        "ops": {"type": "object", "minProperties": 1, "maxProperties": 64,
                "propertyNames": {"maxLength": 64}, "additionalProperties": _times(),
                "expected": "measured times > 0 s per operator and batch size "
                            "({operator: {batch: seconds}})"},
        "blocks": {"type": "object", "minProperties": 1, "maxProperties": 64,
                   "additionalProperties": {
                       "type": "object", "required": ["class", "ops", "block_s", "rest_s"],
                       "properties": {"class": _TEXT,
                                      "ops": {"type": "array", "minItems": 1, "maxItems": 64,
                                              "items": _TEXT},
                                      "block_s": _times(), "rest_s": _times(zero_ok=True)},
                       "additionalProperties": False}},
        "other_s": _times(zero_ok=True),
        "cache_ops": {"type": ["object", "null"],
                      "required": ["tokens", "channels", "gated_residual_s", "segment_s",
                                   "residual_add_s", "slot_copy_s"],
                      "properties": {
                          "tokens": _count(), "channels": _count(), "dtype": _TEXT,
                          "gated_residual_s": _seconds(),
                          "segment_s": {"type": "object", "maxProperties": 64,
                                        "propertyNames": {"pattern": "^[1-9][0-9]?\\Z",
                                                          "expected": "a term count 1..99"},
                                        "additionalProperties": _seconds(),
                                        "expected": "{terms: measured seconds > 0}"},
                          "residual_add_s": _seconds(), "slot_copy_s": _seconds()},
                      "additionalProperties": False},
        "copies": {"type": ["null", "object"], "required": ["h2d", "d2h"],
                   "properties": {"h2d": _COPY, "d2h": _COPY},
                   "additionalProperties": False,
                   "expected": "null (no host link timed) or the timed copies {h2d, d2h}"},
        "host_cpu": _TEXT,
    },
    "additionalProperties": False,
}


def _batch_objects(t: dict):
    """(field path, {batch: seconds}) of every per-batch object of a table."""
    for op, per in t["ops"].items():
        yield field_path(["ops", op]), per
    for name, block in t["blocks"].items():
        for key in ("block_s", "rest_s"):
            yield field_path(["blocks", name, key]), block[key]
    yield "other_s", t["other_s"]


@dataclass(frozen=True)
class GpuTimes:
    """A checked table of measured xPU times (its fields: ``docs/system-model.md``, "Measured
    xPU times"), as the replay reads it.

    Attributes:
        table: the JSON object. path: where it was read from (None: built in memory).
    """
    table: dict
    path: str | None = None
    _ops: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        t, where = self.table, f"--gpu-table {self.path}" if self.path else "the GPU table"
        if not isinstance(t, dict) or t.get("kind") != TABLE_KIND:
            raise ValueError(f"{where}: not a CODA GPU table (expected \"kind\": "
                             f"\"{TABLE_KIND}\", written by coda calibrate)")
        if t.get("version") != TABLE_VERSION:
            raise ValueError(f"{where}: table version {t.get('version')!r}, expected "
                             f"{TABLE_VERSION}: calibrate again with this coda")
        check(t, TABLE_SCHEMA, where)
        # every time is of a batch size the table says it timed, and of each one: a lookup
        # the replay makes then finds its entry (else it would keep the roofline)
        rows = [str(b) for b in t["batches"]]
        for name, per in _batch_objects(t):
            if sorted(per) != rows:
                raise ValueError(f"{where}: {name}: batch sizes [{', '.join(sorted(per))}]; "
                                 f"expected one time per batch size of batches "
                                 f"[{', '.join(rows)}]")

    @classmethod
    def load(cls, path) -> "GpuTimes":
        """Read and check a table (:func:`coda.jsonin.read_json`, then the checks of the
        class). Raises ValueError naming ``--gpu-table``, the file and the field (missing,
        unreadable, too large, not UTF-8 JSON, nested too deep, not a table, a field of
        the wrong type or range, bad times)."""
        where = f"--gpu-table {path}"
        return cls(read_json(path, where, "a GPU table (JSON, written by coda calibrate)"),
                   str(path))

    # ------------------------------------------------------------------ the workload
    def check_shape(self, shape) -> None:
        """Refuse (ValueError naming both) a table measured for another model, size or frame
        count than the :class:`~coda.host.system.shapes.ModelShape` ``shape``, or naming an
        operator the model does not have (a block whose first operator is none of the
        model's would add its rest to no call)."""
        t = self.table
        have = (t["model"], t["width"], t["height"], t["frames"], t["hidden"],
                t["video_tokens"])
        want = (shape.name, shape.width, shape.height, shape.frames, shape.hidden,
                shape.video_tokens)
        if have != want:
            raise ValueError(
                f"--gpu-table {self.path or ''}: measured for {t['model']} {t['width']}x"
                f"{t['height']}, {t['frames']} frames ({t['video_tokens']} tokens, hidden "
                f"{t['hidden']}); the simulated workload is {shape.name} {shape.width}x"
                f"{shape.height}, {shape.frames} frames ({shape.video_tokens} tokens, hidden "
                f"{shape.hidden}): calibrate at that shape (coda calibrate --model "
                f"{shape.name} --resolution {shape.width}x{shape.height} --frames "
                f"{shape.frames})")
        known = {o.op for o in shape.ops}
        named = [(field_path(["ops", op]), op) for op in t["ops"]] + [
            (field_path(["blocks", name, "ops", i]), op)
            for name, blk in t["blocks"].items() for i, op in enumerate(blk["ops"])]
        for where, op in named:
            if op not in known:
                raise ValueError(f"--gpu-table {self.path or ''}: {where}: operator {op!r}; "
                                 f"expected one of {shape.name}'s: {', '.join(sorted(known))}")

    def op_s(self, op: str, batch: int) -> float | None:
        """Seconds of operator ``op`` (the adapter's name) for ``batch`` rows, or None."""
        return self.table["ops"].get(op, {}).get(str(batch))

    def other_s(self, shape, batch: int) -> float | None:
        """Seconds of one forward's work outside the cacheable operators for ``batch`` rows:
        the forward outside the blocks plus, per block of ``shape`` (counted by its first
        operator), the block's rest; None if a part is not in the table."""
        t = self.table
        total = t["other_s"].get(str(batch))
        if total is None:
            return None
        for blk in t["blocks"].values():
            rest = blk["rest_s"].get(str(batch))
            if rest is None:
                return None
            total += rest * sum(o.op == blk["ops"][0] for o in shape.ops)
        return total

    def cache_s(self, name: str, tokens: int, channels: int, terms: int = 1) -> float | None:
        """Seconds of one cache kernel on ``[tokens, channels]`` 16-bit tensors: ``name``
        ``"cache_op"`` (``x + sum of terms g*c``: the gated residual, or the K-term segment),
        ``"residual_add"`` or ``"slot_copy"``; None if not measured at that shape."""
        c = self.table["cache_ops"]
        if c is None or (c["tokens"], c["channels"]) != (tokens, channels):
            return None
        if name == "cache_op":
            return c["gated_residual_s"] if terms == 1 else c["segment_s"].get(str(terms))
        return c.get(f"{name}_s")

    def link(self) -> dict:
        """The host link's fields the measured copies give (``h2d_bw``, ``d2h_bw``,
        ``latency_s``: the mean of both directions' fits); {} without copies."""
        cp = self.table["copies"]
        if not cp:
            return {}
        return {"h2d_bw": cp["h2d"]["bw"], "d2h_bw": cp["d2h"]["bw"],
                "latency_s": (cp["h2d"]["latency_s"] + cp["d2h"]["latency_s"]) / 2}

    # ------------------------------------------------------------------ reports
    def describe(self) -> dict:
        t = self.table
        return {"table": self.path, "device": t["device"]["name"], "timer": t["timer"],
                "date": t["date"], "model": t["model"],
                "size": f"{t['width']}x{t['height']}, {t['frames']} frames",
                "measured": sorted(t["ops"]) + ["other", "block rest"]
                + (["cache ops"] if t["cache_ops"] else [])
                + (["copies"] if t["copies"] else [])}

    def source(self) -> str:
        t, d = self.table, self.table["device"]
        return (f"measured: {t['command']} on {d['name']} (torch {d['torch']}, CUDA "
                f"{d['cuda']}), {t['date']}, {t['timer']}, median of {t['repeat']} after "
                f"{t['warmup']} warm-up runs ({self.path or 'in memory'})")
