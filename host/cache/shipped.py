"""The shipped model's searched schedules (``host/cache/schedules/``: one per skip fraction,
chosen on quality or within uniform reuse's modelled latency) and the profile they were
searched on; the schedule file format of ``coda schedule search``: the Schedule JSON
(:meth:`coda.host.cache.schedule.Schedule.to_json`) plus a ``"coda"`` block of search info,
and the blocks of what was calibrated for that schedule (``"dra"``: DRA's thresholds,
``"forecast"``: the forecast mode's alphas), written by :func:`save_schedule_block`.

A schedule file is untrusted input: :func:`read_schedule_file` reads it
(:func:`coda.jsonin.read_json`: size, UTF-8, nesting, JSON) and checks all of it against
:data:`SCHEDULE_FILE_SCHEMA` (the schedule, its blocks, no other field) before anything is
built from it; every reader of these files (:func:`load_schedule`, :func:`schedule_block`,
:func:`save_schedule_block`) goes through it.
"""

from __future__ import annotations

import json
from pathlib import Path

from coda.host.cache.forecast import FORECAST_SCHEMA
from coda.host.cache.policies.dra import DRA_SCHEMA
from coda.host.cache.schedule import SCHEDULE_SCHEMA, Schedule
from coda.jsonin import check, read_json
from coda.jsonout import json_text
from coda.paths import write_file

__all__ = ["SCHEDULES_DIR", "SHIPPED_SKIPS", "shipped_schedule", "SHIPPED_SCHEDULE",
           "SHIPPED_PROFILE", "shipped_profile", "SCHEDULE_FILE_SCHEMA", "save_schedule", "read_schedule_file",
           "load_schedule", "save_schedule_block", "schedule_block"]

#: a schedule file as a JSON schema (:func:`coda.jsonin.check`): the Schedule JSON's fields
#: (:data:`coda.host.cache.schedule.SCHEDULE_SCHEMA`), the search's ``"coda"`` block (an
#: object; its ``model_hash`` a string, the rest a record), the ``"forecast"`` block
#: (:data:`coda.host.cache.forecast.FORECAST_SCHEMA`) and the ``"dra"`` block
#: (:data:`coda.host.cache.policies.dra.DRA_SCHEMA`); no other field
SCHEDULE_FILE_SCHEMA: dict = {
    "type": "object",
    "properties": {
        # the schedule's own fields: Schedule.from_data checks them after the blocks
        **{key: True for key in SCHEDULE_SCHEMA["properties"]},
        "coda": {"type": "object",
                 "properties": {"model_hash": {"type": "string", "maxLength": 64}},
                 "expected": "an object (the search's record, written by coda schedule "
                             "search)"},
        "forecast": FORECAST_SCHEMA,
        "dra": DRA_SCHEMA,
    },
    "additionalProperties": False,
}

#: the searched schedule of the shipped model (50 steps) and the profile it was searched on
SCHEDULES_DIR = Path(__file__).resolve().parent / "schedules"
#: the skip fractions the shipped model has a searched schedule for (``make eval``'s targets)
SHIPPED_SKIPS = (0.3, 0.5, 0.6, 0.7)


def shipped_schedule(skip: float, latency: str | None = None, stem: str = "latte_digits") -> Path:
    """A shipped model's searched schedule file for ``skip`` (one of :data:`SHIPPED_SKIPS`;
    whether it exists is for the caller to check): chosen on quality alone (``latency``
    None), or within the uniform baseline's modelled latency (``latency="uniform"``,
    ``coda schedule search --latency uniform``). ``stem``: the model's weights file stem
    (``latte_digits``, ``latte_text``: :meth:`coda.host.model.dit.ShippedModel.schedule`).
    Raises ValueError for another ``latency``."""
    if latency not in (None, "uniform"):
        raise ValueError(f"latency={latency!r}: expected None or 'uniform'")
    suffix = "" if latency is None else "_latency-uniform"
    return SCHEDULES_DIR / f"coda_{stem}_50_skip{skip:g}{suffix}.json"


def shipped_profile(stem: str = "latte_digits") -> Path:
    """The profile a shipped model's schedules were searched on (``stem`` as in
    :func:`shipped_schedule`)."""
    return SCHEDULES_DIR / f"{stem}_50_profile.npz"


#: the digits model's: ``coda run``'s default schedule and its profile
SHIPPED_SCHEDULE = shipped_schedule(0.5)
SHIPPED_PROFILE = shipped_profile()


def save_schedule(path: str | Path, schedule: Schedule, info: dict) -> None:
    """The Schedule JSON (:meth:`Schedule.to_json`) plus a ``"coda"`` block of search info
    (model hash, profile, target skip, cost terms); :meth:`Schedule.from_json` ignores it."""
    data = json.loads(schedule.to_json())
    data["coda"] = info
    write_file(Path(path), json_text(data, indent=1) + "\n")


def read_schedule_file(path: str | Path, what: str | None = None) -> tuple[Schedule, dict]:
    """(the schedule, the file's parsed JSON) of the schedule file ``path``, every field of
    it checked (:data:`SCHEDULE_FILE_SCHEMA`, then the schedule's by
    :meth:`coda.host.cache.schedule.Schedule.from_data`) before the schedule is built.

    Raises:
        ValueError: ``"{what}: ..."`` (default ``what``: ``--schedule PATH``): the file
            cannot be read or is not JSON (:func:`coda.jsonin.read_json`), a field breaks
            the schema (naming the field and what was expected), or the schedule cannot run.
    """
    what = f"--schedule {path}" if what is None else what
    data = read_json(path, what, "a schedule JSON (coda schedule search)")
    check(data, SCHEDULE_FILE_SCHEMA, what)
    return Schedule.from_data(data, what), data


def load_schedule(path: str | Path, *, model_id: str | None = None,
                  num_steps: int | None = None, num_layers: int | None = None,
                  what: str | None = None) -> Schedule:
    """Read a schedule file (:func:`read_schedule_file`); raise ValueError naming the file
    (``what``, default ``--schedule PATH``) if it cannot be read, is not a schedule file, or
    was made for another model (its ``coda.model_hash``), step or layer count."""
    what = f"--schedule {path}" if what is None else what
    sched, data = read_schedule_file(path, what)
    made_for = data.get("coda", {}).get("model_hash")
    if model_id is not None and made_for is not None and made_for != model_id:
        raise ValueError(f"{what}: made for model {made_for!r}, expected the model in use "
                         f"({model_id})")
    if num_steps is not None and sched.num_steps != num_steps:
        raise ValueError(f"{what}: made for {sched.num_steps} steps, expected {num_steps} "
                         "(--steps)")
    if num_layers is not None and sched.num_layers != num_layers:
        raise ValueError(f"{what}: made for {sched.num_layers} layers, expected {num_layers}")
    return sched


def save_schedule_block(path: str | Path, schedule: Schedule, name: str, block: dict) -> None:
    """Write ``block`` (JSON-able) as the ``name`` block of the schedule file ``path``, its
    other blocks kept; the file is written fresh from ``schedule`` if it does not exist.

    Raises ValueError naming the file if it is not a schedule file
    (:func:`read_schedule_file`) or holds another schedule."""
    path = Path(path)
    data = json.loads(schedule.to_json())
    if path.exists():
        old_schedule, old = read_schedule_file(path, str(path))
        if old_schedule != schedule:
            raise ValueError(f"{path}: holds another schedule than the one calibrated")
        data = old
    data[name] = block
    write_file(path, json_text(data, indent=1) + "\n")


def schedule_block(path: str | Path, name: str) -> dict | None:
    """The ``name`` block of a schedule file (None if it has none), the whole file checked
    (:func:`read_schedule_file`). Raises ValueError naming the file and the field for one
    that is not a schedule file."""
    return read_schedule_file(path, str(path))[1].get(name)
