"""Calibration of step-level DRA (:class:`coda.host.cache.policies.dra.StepDRAPolicy`) on
calibration videos, and its threshold table stored with the schedule.

:func:`calibrate_step_dra` runs the static schedule with DRA's probes on the calibration
videos (e.g. the profile's prompts and seeds, ``profile.meta["prompts"]``/``["seeds"]``; never
the held-out evaluation seeds) and sets each reused step's threshold to a quantile of the
probe values seen at that step (over videos and both CFG branches), times a margin.

:func:`save_step_dra` writes the table as a ``"dra"`` block into the schedule's JSON file
(beside the ``"coda"`` block of the search; :meth:`Schedule.from_json` ignores both);
:func:`load_step_dra` reads the schedule and its table back and refuses a table of another
model hash, step count or schedule with a ValueError naming the file.

This module sits above the policies and the model (it generates videos), so the policies
package does not import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from coda.host.cache.events import EventLog
from coda.host.cache.policies.dra import (DEFAULT_MARGIN, DEFAULT_QUANTILE, StepDRAPolicy,
                                    StepThresholds)
from coda.host.cache.policies.static import SchedulePolicy
from coda.host.cache.schedule import BRANCHES, Schedule

__all__ = ["calibrate_step_dra", "probe_values", "save_step_dra", "load_step_dra"]


def probe_values(model, schedule: Schedule, labels, seeds, *, num_steps: int,
                 guidance_scale: float, driver_factory: Callable) -> dict[int, list[float]]:
    """The probes of the static ``schedule`` run on every (label, seed) video: step -> the
    relative L1 changes of the block-0 input (one per video and branch that reuses the first
    operator there), measured on the NMEs. One generation per seed, all labels batched, with
    a fresh ``driver_factory(len(labels))``. Raises ValueError if ``num_steps`` is not the
    schedule's or no video is given."""
    if schedule.num_steps != num_steps:
        raise ValueError(f"num_steps={num_steps}: the schedule {schedule.name!r} is for "
                         f"{schedule.num_steps} steps")
    labels, seeds = [int(x) for x in labels], [int(s) for s in seeds]
    if not labels or not seeds:
        raise ValueError(f"labels {labels}, seeds {seeds}: expected at least one of each")
    from coda.experiments.cfg_loop import cached_videos

    first = schedule.order()[0]
    values: dict[int, list[float]] = {}
    for seed in seeds:
        log = EventLog()
        cached_videos(model, labels, driver_factory(len(labels)),
                      StepDRAPolicy(SchedulePolicy(schedule)), events=log,
                      num_steps=num_steps, guidance_scale=guidance_scale,
                      seeds=[seed] * len(labels))
        for m in log.of("monitor"):
            if (m.layer, m.op) == first:
                values.setdefault(m.step, []).append(float(m.value))
    return values


def calibrate_step_dra(model, schedule: Schedule, labels, seeds, *, num_steps: int,
                       guidance_scale: float, driver_factory: Callable,
                       quantile: float = DEFAULT_QUANTILE,
                       margin: float = DEFAULT_MARGIN) -> StepThresholds:
    """Step DRA's thresholds for ``schedule`` from calibration videos (every label with every
    seed): per step at which the schedule reuses the first operator (in any branch),
    ``margin * numpy.quantile(probes at that step, quantile)`` (:func:`probe_values`).

    Args:
        model: a DigitLatte, or a :class:`coda.experiments.cfg_loop.CFGLoop` over any
            transformer the cache engine serves (labels: its prompt indices).
        schedule: the static :class:`Schedule` DRA wraps (of that model's operators).
        labels, seeds: the calibration videos (e.g. the profile's; keep evaluation seeds out).
        num_steps, guidance_scale: as :func:`coda.host.model.sample.generate`.
        driver_factory: ``f(videos) -> NMPDriver`` with room for kept inputs.
        quantile: in [0, 1] (1: no calibration video would fall back). margin: > 0.
    Returns:
        the :class:`StepThresholds` (model hash, schedule digest, calibration videos).
    Raises:
        ValueError: a quantile outside [0, 1], a margin <= 0, ``num_steps`` not the
            schedule's, no labels or seeds.
    """
    from coda.experiments.profile import model_hash

    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile={quantile}: expected a fraction in [0, 1]")
    if not margin > 0:
        raise ValueError(f"margin={margin}: expected > 0")
    values = probe_values(model, schedule, labels, seeds, num_steps=num_steps,
                          guidance_scale=guidance_scale, driver_factory=driver_factory)
    first = schedule.order()[0]
    probed = sorted({s for s in range(num_steps) for b in BRANCHES
                     if first in schedule.reused(s, b)})
    table = {s: margin * float(np.quantile(values[s], quantile)) for s in probed}
    return StepThresholds(table, num_steps, model_hash(model), schedule.digest(),
                          quantile, margin, tuple(int(x) for x in labels),
                          tuple(int(s) for s in seeds), float(guidance_scale))


def save_step_dra(path: str | Path, schedule: Schedule, thresholds: StepThresholds) -> None:
    """Write ``thresholds`` as the ``"dra"`` block of the schedule file ``path`` (kept: its
    ``"coda"`` block; written fresh from ``schedule`` if the file does not exist).

    Raises ValueError if the table was not calibrated on ``schedule``, or the file is not a
    schedule JSON or holds another schedule."""
    from coda.host.cache.shipped import save_schedule_block

    thresholds.check_for(schedule=schedule, what=f"DRA thresholds for {path}")
    save_schedule_block(path, schedule, "dra", thresholds.to_dict())


def load_step_dra(path: str | Path, *, model_id: str | None = None,
                  num_steps: int | None = None) -> tuple[Schedule, StepThresholds]:
    """(schedule, thresholds) of a file written by :func:`save_step_dra`.

    Raises ValueError naming the file: unreadable, not a schedule, no ``"dra"`` block, or a
    table of another model hash, step count or schedule than the file's."""
    from coda.host.cache.shipped import load_schedule, schedule_block

    path = Path(path)
    sched = load_schedule(path, model_id=model_id, num_steps=num_steps)
    block = schedule_block(path, "dra")
    if block is None:
        raise ValueError(f"{path}: no DRA thresholds (a \"dra\" block); calibrate them with "
                         "calibrate_step_dra and write them with save_step_dra")
    table = StepThresholds.from_dict(block, what=f"{path} DRA thresholds")
    table.check_for(model_id, num_steps if num_steps is not None else sched.num_steps,
                    sched, what=f"{path} DRA thresholds")
    return sched, table
