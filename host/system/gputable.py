"""Measured xPU times: the table ``coda calibrate`` writes (:mod:`coda.host.system.calibrate`)
and what the replay reads of it (``coda sim --gpu-table FILE``).

The table is a small JSON object, per *block* of the model (one block of each block type is
timed; the replay counts the model's blocks from its shape), at one model, resolution and
frame count:

============  ==============================================================================
``kind``      ``"coda-gpu-table"``; ``version``: :data:`TABLE_VERSION`
``device``    ``name`` (``torch.cuda.get_device_name`` or the CPU's model name), ``type``
              (``"cuda"`` / ``"cpu"``), ``torch``, ``cuda`` (None on a CPU build),
              ``diffusers``
``timer``     ``"cuda_events"`` (CUDA events after warm-up) or ``"perf_counter"`` (CPU)
``date``      UTC, ISO 8601; ``command``: the ``coda calibrate`` command line
``statistic`` ``"median"`` of ``repeat`` timed runs after ``warmup`` untimed ones
``model``     preset name; ``cls``, ``dtype``, ``height``, ``width``, ``frames``,
              ``latent``, ``video_tokens``, ``text_tokens``, ``hidden``
``per``       ``"block"``; ``batches``: the rows per call timed (1, and 2 for batched CFG)
``ops``       operator name (the adapter's, :mod:`coda.host.cache.arch`) -> {batch: s}: the
              operator as the cache engine computes it (norm, modulation, module, residual)
``blocks``    block list (the model's attribute, e.g. ``"blocks"``) -> ``class``, ``ops``
              (its operators), ``block_s`` {batch: s} (the block's forward), ``rest_s``
              {batch: s} (``block_s`` less its operators, >= 0)
``other_s``   {batch: s}: one forward less its blocks (embeddings, output head)
``cache_ops`` at ``tokens`` x ``channels`` (an operator's cached ``[T, C]``, ``dtype``):
              ``gated_residual_s`` (``x + g*c``), ``segment_s`` {K: s} (``segment`` of K
              terms, :mod:`coda.host.nme.ops`), ``residual_add_s`` (``h + z``),
              ``slot_copy_s`` (a ``[T, C]`` copy into a cache slot)
``copies``    None on a CPU (no host link), else ``h2d`` / ``d2h``: ``bytes`` and ``s`` of a
              ``[T, C]`` and of a ``[C]`` copy (pinned host memory), the fitted ``bw``
              (bytes/s) and ``latency_s``
============  ==============================================================================

Seconds throughout. Lookups return None where the table has no entry, and the replay then
keeps the roofline (:mod:`coda.host.system.replay`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TABLE_KIND", "TABLE_VERSION", "GpuTimes", "fit_copy"]

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


def _positive(s) -> bool:
    return isinstance(s, (int, float)) and not isinstance(s, bool) and 0 < s < float("inf")


def _per_batch(name: str, per) -> list[tuple[str, object]]:
    """(name.batch, seconds) of a {batch: seconds} object; (name, None), a bad value, when
    it is not one."""
    if not isinstance(per, dict) or not per:
        return [(name, None)]
    return [(f"{name}.{b}", s) for b, s in per.items()]


def _times(t: dict) -> list[tuple[str, object]]:
    """Every measured time of table ``t`` (its ops, blocks, other_s and cache operators) as
    (where, value), a non-object where an object belongs counting as a bad value."""
    out = []
    if not isinstance(t["ops"], dict) or not t["ops"]:
        return [("ops", t["ops"])]
    for op, per in t["ops"].items():
        out += _per_batch(f"ops.{op}", per)
    for name, block in (t["blocks"].items() if isinstance(t["blocks"], dict) else
                        [("", t["blocks"])]):
        if not isinstance(block, dict):
            out.append((f"blocks.{name}", block))
            continue
        for key in ("block_s", "rest_s"):
            out += _per_batch(f"blocks.{name}.{key}", block.get(key))
    out += _per_batch("other_s", t["other_s"])
    cache = t["cache_ops"]
    if cache is not None:
        if not isinstance(cache, dict):
            return out + [("cache_ops", cache)]
        for key, value in cache.items():
            if key.endswith("_s"):
                out += (_per_batch(f"cache_ops.{key}", value) if isinstance(value, dict)
                        else [(f"cache_ops.{key}", value)])
    return out


@dataclass(frozen=True)
class GpuTimes:
    """A checked table of measured xPU times (module docstring), as the replay reads it.

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
        missing = [f for f in FIELDS if f not in t]
        if missing:
            raise ValueError(f"{where}: missing fields {missing}")
        if t["timer"] not in TIMERS or t["per"] != "block":
            raise ValueError(f"{where}: timer {t['timer']!r} / per {t['per']!r}: expected "
                             f"one of {TIMERS} / 'block'")
        # a block's rest_s (its forward less its operators) and other_s (the forward less
        # its blocks) are differences, clipped at 0 by coda calibrate: 0 is allowed there
        bad = [name for name, s in _times(t)
               if not (_positive(s) or ((".rest_s." in name or name.startswith("other_s."))
                                        and s == 0))]
        if bad:
            raise ValueError(f"{where}: {bad[:6]}: expected measured times > 0 s (finite "
                             f"numbers, one per batch size)")

    @classmethod
    def load(cls, path) -> "GpuTimes":
        """Read and check a table. Raises ValueError naming ``--gpu-table`` and the file
        (missing, unreadable, not UTF-8 JSON, not a table, bad times)."""
        try:
            table = json.loads(Path(path).read_bytes().decode("utf-8"))
        except OSError as exc:
            raise ValueError(f"--gpu-table {path}: cannot be read ({exc.strerror or exc})") \
                from None
        except UnicodeDecodeError:
            raise ValueError(f"--gpu-table {path}: not a UTF-8 text file (a coda calibrate "
                             f"table is JSON)") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"--gpu-table {path}: not JSON ({exc.msg} at line "
                             f"{exc.lineno})") from None
        return cls(table, str(path))

    # ------------------------------------------------------------------ the workload
    def check_shape(self, shape) -> None:
        """Refuse (ValueError naming both) a table measured for another model, size or frame
        count than the :class:`~coda.host.system.shapes.ModelShape` ``shape``."""
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
