"""Calibration of the cache's forecast mode (:mod:`coda.host.cache.forecast`) on calibration
videos: alpha per reused step and operator type, for one or more static schedules at once.

:func:`record_outputs` generates the calibration videos with full compute, every operator's
output stored every step through a recording NMP driver (so the recorded tensors are exactly
the cache entries a run would hold: the NME format, bf16 or fp16). :func:`fit_tables` then fits alpha per schedule, reused step and operator type in closed
form (least squares of the full-compute output against the extrapolation). The calibration videos are the profile's
prompts and seeds (``profile.meta["prompts"]`` / ``["seeds"]``); never evaluation seeds.

This module generates videos, so it sits with the experiments, above the cache and the
model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from coda.host.cache.forecast import ForecastTable, fit_alpha
from coda.host.cache.policies.base import CachePolicy, Decision, OpQuery
from coda.host.cache.schedule import Schedule
from coda.experiments.schedule_files import ScheduleFilesConfig, load_for_calibration
from coda.options import add_options

__all__ = ["record_outputs", "fit_tables", "calibrate_forecast", "save_forecast", "load_forecast"]


@dataclass(eq=False)
class _StoreEveryOutput(CachePolicy):
    """Compute every operator and store its output every step (what the recording reads)."""
    name = "forecast-calibration"

    def decide(self, q: OpQuery) -> Decision:
        return Decision(False, store=True, reason="calibration")


def _recording(driver):
    """``driver`` with its ``store`` wrapped: every stored operator output (not kept inputs,
    not the zero slots of sum segments) is appended, as stored, to ``driver.recorded[key]``
    in step order."""
    driver.recorded = {}
    store = driver.store

    def recording_store(key, tensor, *args, **kwargs):
        if isinstance(key, tuple) and key[-1] != "in" and key[3] != -1:
            driver.recorded.setdefault(key, []).append(tensor.detach().clone())
        return store(key, tensor, *args, **kwargs)
    driver.store = recording_store
    return driver


def record_outputs(model, labels: Sequence[int], seed: int, *, num_steps: int,
                   guidance_scale: float, driver_factory: Callable) -> dict:
    """One full-compute generation of ``labels`` (one video each, all with noise seed
    ``seed``). Returns ``{(branch, sample, layer, op, stream): [c_0, ..., c_{T-1}]}``, the
    stored outputs per step (tensors [tokens, C] in the NME format; ``stream`` None for the
    primary stream)."""
    from coda.host.model.sample import cached_generate

    driver = _recording(driver_factory(len(labels)))
    cached_generate(model, list(labels), driver, _StoreEveryOutput(), num_steps=num_steps,
                    guidance_scale=guidance_scale, seeds=[seed] * len(labels))
    out = {}
    for key, seq in driver.recorded.items():
        _, branch, sample, layer, op, *rest = key
        if len(seq) != num_steps:
            raise RuntimeError(f"forecast calibration: {key} stored {len(seq)} times, expected "
                               f"{num_steps} (one per step)")
        out[(branch, sample, layer, op, rest[0] if rest else None)] = seq
    return out


def _sums(outputs: dict, schedules: dict, acc: dict) -> None:
    """Add one generation's sums to ``acc[name][(t, op)] = [num, den, err_reuse, norm]`` for
    every schedule (batched over the schedule's reused steps per recorded operator)."""
    import torch

    for (branch, _, layer, op, _), seq in outputs.items():
        c = torch.stack(seq).flatten(1).float()          # [steps, tokens * C]
        for name, schedule in schedules.items():
            pairs = schedule.computed_pairs(branch, (layer, op))
            if not pairs:
                continue
            t, k, k2 = (torch.tensor(x) for x in zip(*((t, k, k2)
                                                        for t, (k, k2) in pairs.items())))
            e, d = c[t] - c[k], c[k] - c[k2]
            sums = torch.stack([(e * d).sum(1), (d * d).sum(1), (e * e).sum(1),
                                (c[t] * c[t]).sum(1)], 1).double().tolist()
            for step, row in zip(t.tolist(), sums):
                a = acc[name].setdefault((step, op), [0.0, 0.0, 0.0, 0.0])
                for i, v in enumerate(row):
                    a[i] += v


def fit_tables(acc_by_schedule: dict, schedules: dict, *, num_steps: int, model_hash: str,
               videos: Sequence) -> dict:
    """One :class:`ForecastTable` per schedule name from the accumulated sums.

    Fits, per schedule, per step ``t`` that reuses an operator and per operator type, the closed
    form least-squares alpha of the full-compute output against the extrapolation of the
    schedule's last two computed steps ``k`` and ``k'`` before ``t``:

        alpha = sum <c_t - c_k, c_k - c_k'> / sum |c_k - c_k'|^2

    over videos, CFG branches, samples, layers and residual streams, clipped to
    :data:`coda.host.cache.forecast.ALPHA_RANGE`.
    """
    tables = {}
    for name, acc in acc_by_schedule.items():
        alphas, fit = {}, {}
        for (t, op), (num, den, err, norm) in sorted(acc.items()):
            a = fit_alpha(num, den)
            alphas.setdefault(t, {})[op] = a
            if norm > 0:
                fit[f"{t}:{op}"] = {"reuse": err / norm,
                                    "forecast": (err - 2 * a * num + a * a * den) / norm}
        tables[name] = ForecastTable(alphas, num_steps, model_hash,
                                     schedules[name].digest(),
                                     tuple(tuple(v) for v in videos), fit)
    return tables


def calibrate_forecast(model, schedules: dict, labels: Sequence[int], seeds: Sequence[int], *,
                       num_steps: int, guidance_scale: float,
                       driver_factory: Callable) -> dict:
    """:class:`ForecastTable` for each of ``schedules`` (name -> :class:`Schedule`, every one
    of ``num_steps`` steps) from the calibration videos (every label with every seed: one
    full-compute generation per seed). ``driver_factory(videos)`` makes an NMP driver with
    room for every operator's output (:func:`coda.host.model.sample.cache_mem_words`).
    Raises ValueError for a schedule of another step count or no video."""
    from coda.host.cache.profile import model_hash as hash_of

    labels, seeds = [int(x) for x in labels], [int(s) for s in seeds]
    if not labels or not seeds:
        raise ValueError(f"labels {labels}, seeds {seeds}: expected at least one of each")
    for name, s in schedules.items():
        if s.num_steps != num_steps:
            raise ValueError(f"schedule {name!r} has {s.num_steps} steps, expected {num_steps}")
    acc = {name: {} for name in schedules}
    for seed in seeds:
        outputs = record_outputs(model, labels, seed, num_steps=num_steps,
                                 guidance_scale=guidance_scale, driver_factory=driver_factory)
        _sums(outputs, schedules, acc)
        del outputs
    videos = [(p, s) for s in seeds for p in labels]
    return fit_tables(acc, schedules, num_steps=num_steps, model_hash=hash_of(model),
                      videos=videos)


def save_forecast(path: str | Path, schedule: Schedule, table: ForecastTable) -> None:
    """Write ``table`` as the ``"forecast"`` block of the schedule file ``path`` (its other
    blocks kept; written fresh from ``schedule`` if the file does not exist).

    Raises ValueError if the table was not calibrated for ``schedule`` or has an alpha it
    never applies (:meth:`ForecastTable.check_applies`), or the file is not a schedule JSON
    or holds another schedule."""
    from coda.host.cache.shipped import save_schedule_block

    table.check_for(None, schedule.num_steps, schedule, what=f"forecast table for {path}")
    table.check_applies(schedule, what=f"forecast table for {path}")
    save_schedule_block(path, schedule, "forecast", table.to_dict())


def load_forecast(path: str | Path, *, model_id: str | None = None,
                  num_steps: int | None = None) -> tuple[Schedule, ForecastTable] | None:
    """(schedule, alphas) of a schedule file with a ``"forecast"`` block
    (:func:`save_forecast`), or None if it has no such block.

    Raises ValueError naming the file: unreadable, not a schedule, a malformed block (naming
    the field), a table of another model hash, step count or schedule than the file's, or an
    alpha the schedule never applies (:meth:`ForecastTable.check_applies`)."""
    from coda.host.cache.shipped import load_schedule, schedule_block

    sched = load_schedule(path, model_id=model_id, num_steps=num_steps)
    block = schedule_block(path, "forecast")
    if block is None:
        return None
    table = ForecastTable.from_dict(block, what=f"{path} forecast table")
    table.check_for(model_id, sched.num_steps, sched, what=f"{path} forecast table")
    table.check_applies(sched, what=f"{path} forecast table")
    return sched, table


# ---------------------------------------------------------------- the command
@dataclass(frozen=True)
class ForecastConfig(ScheduleFilesConfig):
    """Every option of ``coda schedule forecast`` with its default (all schedules calibrated
    on the same videos at once; each file's ``"forecast"`` block written)."""


#: the configuration ``coda schedule forecast`` hands to :func:`main` (coda.cli)
CONFIG = ForecastConfig


def configure(parser) -> None:
    add_options(parser, ForecastConfig)


def main(cfg: ForecastConfig) -> int:
    """``coda schedule forecast`` as ``cfg`` says (what the command line gave, or a
    :class:`ForecastConfig` built in Python): alphas for each schedule file's schedule,
    calibrated on the profile's videos (torch backend; one full-compute recording serves
    every file), written as its ``"forecast"`` block. Raises ValueError naming the file for a
    schedule of another model, layer count or step count than the first's."""
    from coda.experiments.rollouts import torch_driver

    model, scheds, profile, profile_path, guidance = load_for_calibration(cfg)
    steps = next(iter(scheds.values())).num_steps
    t0 = time.perf_counter()
    tables = calibrate_forecast(model, scheds, profile.meta["prompts"], profile.meta["seeds"],
                                num_steps=steps, guidance_scale=guidance,
                                driver_factory=lambda n: torch_driver(model, n))
    for path, table in tables.items():
        save_forecast(path, scheds[path], table)
        d = table.describe()
        print(f"{path}: forecast alphas at {d['steps']} reused steps (mean "
              f"{d['alpha_mean']:.3f}, max {d['alpha_max']:.3f}) from {d['videos']} videos")
    print(f"calibrated on {profile_path} in {time.perf_counter() - t0:.0f} s")
    return 0
