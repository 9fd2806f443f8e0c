"""The shipped model's searched schedules (``host/cache/schedules/``: one per skip fraction,
chosen on quality or within uniform reuse's modelled latency) and the profile they were
searched on; the schedule file format of ``coda schedule search``: the Schedule JSON
(:meth:`coda.host.cache.schedule.Schedule.to_json`) plus a ``"coda"`` block of search info,
and the blocks of what was calibrated for that schedule (``"dra"``: DRA's thresholds,
``"forecast"``: the forecast mode's alphas), written by :func:`save_schedule_block`.
"""

from __future__ import annotations

import json
from pathlib import Path

from coda.host.cache.schedule import Schedule, ScheduleError
from coda.jsonout import json_text

__all__ = ["SCHEDULES_DIR", "SHIPPED_SKIPS", "shipped_schedule", "SHIPPED_SCHEDULE",
           "SHIPPED_PROFILE", "save_schedule", "load_schedule", "save_schedule_block",
           "schedule_block"]

#: the searched schedule of the shipped model (50 steps) and the profile it was searched on
SCHEDULES_DIR = Path(__file__).resolve().parent / "schedules"
#: the skip fractions the shipped model has a searched schedule for (``make eval``'s targets)
SHIPPED_SKIPS = (0.3, 0.5, 0.6, 0.7)


def shipped_schedule(skip: float, latency: str | None = None) -> Path:
    """The shipped model's searched schedule file for ``skip`` (one of
    :data:`SHIPPED_SKIPS`; whether it exists is for the caller to check): chosen on quality
    alone (``latency`` None), or within the uniform baseline's modelled latency
    (``latency="uniform"``, ``coda schedule search --latency uniform``).
    Raises ValueError for another ``latency``."""
    if latency is None:
        return SCHEDULES_DIR / f"coda_latte_digits_50_skip{skip:g}.json"
    if latency != "uniform":
        raise ValueError(f"latency={latency!r}: expected None or 'uniform'")
    return SCHEDULES_DIR / f"coda_latte_digits_50_skip{skip:g}_latency-uniform.json"


#: ``coda run``'s default schedule
SHIPPED_SCHEDULE = shipped_schedule(0.5)
SHIPPED_PROFILE = SCHEDULES_DIR / "latte_digits_50_profile.npz"


def save_schedule(path: str | Path, schedule: Schedule, info: dict) -> None:
    """The Schedule JSON (:meth:`Schedule.to_json`) plus a ``"coda"`` block of search info
    (model hash, profile, target skip, cost terms); :meth:`Schedule.from_json` ignores it."""
    data = json.loads(schedule.to_json())
    data["coda"] = info
    Path(path).write_text(json_text(data, indent=1) + "\n")


def load_schedule(path: str | Path, *, model_id: str | None = None,
                  num_steps: int | None = None, num_layers: int | None = None) -> Schedule:
    """Read a schedule file; raise ValueError naming the file if it cannot be read, is not a
    schedule, or was made for another model (its ``coda.model_hash``), step or layer count."""
    path = Path(path)
    try:
        text = path.read_text()
        data = json.loads(text)
        sched = Schedule.from_json(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--schedule {path}: cannot read it ({exc.strerror or exc})") from None
    except ScheduleError as exc:
        raise ValueError(f"--schedule {path}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--schedule {path}: not a schedule JSON written by coda schedule "
                         f"search ({type(exc).__name__}: {exc})") from None
    made_for = (data.get("coda") or {}).get("model_hash")
    if model_id is not None and made_for is not None and made_for != model_id:
        raise ValueError(f"--schedule {path}: made for model {made_for!r}, expected the model "
                         f"in use ({model_id})")
    if num_steps is not None and sched.num_steps != num_steps:
        raise ValueError(f"--schedule {path}: made for {sched.num_steps} steps, expected "
                         f"{num_steps} (--steps)")
    if num_layers is not None and sched.num_layers != num_layers:
        raise ValueError(f"--schedule {path}: made for {sched.num_layers} layers, expected "
                         f"{num_layers}")
    return sched


def save_schedule_block(path: str | Path, schedule: Schedule, name: str, block: dict) -> None:
    """Write ``block`` (JSON-able) as the ``name`` block of the schedule file ``path``, its
    other blocks kept; the file is written fresh from ``schedule`` if it does not exist.

    Raises ValueError if the file is not a schedule JSON or holds another schedule."""
    path = Path(path)
    data = json.loads(schedule.to_json())
    if path.exists():
        try:
            old = json.loads(path.read_text())
            same = Schedule.from_json(json.dumps(old)) == schedule
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a schedule JSON ({type(exc).__name__}: {exc}); "
                             "expected the file of the calibrated schedule") from None
        if not same:
            raise ValueError(f"{path}: holds another schedule than the one calibrated")
        data = old
    data[name] = block
    path.write_text(json_text(data, indent=1) + "\n")


def schedule_block(path: str | Path, name: str) -> dict | None:
    """The ``name`` block of a schedule file (None if it has none). Raises ValueError naming
    the file if it cannot be read as JSON."""
    try:
        return json.loads(Path(path).read_text()).get(name)
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: cannot read its {name!r} block ({exc})") from None
