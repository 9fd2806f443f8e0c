"""Calibration of step-level DRA (:class:`coda.host.cache.policies.dra.StepDRAPolicy`) on
calibration videos, and its threshold table stored with the schedule.

:func:`calibrate_step_dra` sets each reused step's threshold to a quantile of the probe values
seen there on the calibration videos (never the held-out evaluation seeds), times a margin;
:func:`calibrate_default_dra` is what ``coda eval``, ``coda run`` and ``coda schedule dra``
(:func:`main`) calibrate, a budgeted table per probe and the one :func:`pick_probe` picks.
:func:`save_step_dra` / :func:`load_step_dra` keep the table as a ``"dra"`` block in the
schedule's JSON file. This module sits above the policies and the model (it generates videos), so the policies
package does not import it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from coda.host.cache.events import EventLog
from coda.host.cache.policies.dra import (DEFAULT_BUDGET, DEFAULT_GAMMA, DEFAULT_MARGIN,
                                          DEFAULT_MAX_EXTRA, DEFAULT_PROBES, DEFAULT_QUANTILE,
                                          StepDRAPolicy, StepThresholds)
from coda.host.cache.policies.static import SchedulePolicy
from coda.host.cache.schedule import BRANCHES, Schedule
from coda.experiments.schedule_files import ScheduleFilesConfig, load_for_calibration
from coda.options import add_options, option

__all__ = ["calibrate_step_dra", "calibrate_default_dra", "pick_probe", "describe_choice",
           "fallback_rates", "fallback_extra", "dra_videos", "probe_values", "probed_steps",
           "save_step_dra", "load_step_dra"]


def probe_values(model, schedule: Schedule, labels, seeds, *, num_steps: int,
                 guidance_scale: float, driver_factory: Callable,
                 probe: str = "l1") -> dict[int, list[float]]:
    """The probes of the static ``schedule`` run on every (label, seed) video: step -> the
    ``probe`` values (one per video that reuses the first operator there, read in the
    first CFG branch that asks, as DRA decides; ``"l1"``: the block-0 input's relative L1
    change, on the NMEs; ``"accel"``: its relative second difference, on the xPU, from step
    2; ``"output"``: the model output's relative second difference over the three steps
    before, on the xPU, from step 3). One generation per seed, all labels batched, with a
    fresh ``driver_factory(len(labels))``. Raises ValueError if ``num_steps`` is not the
    schedule's, no video is given or the probe is unknown."""
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
                      StepDRAPolicy(SchedulePolicy(schedule), probe=probe), events=log,
                      num_steps=num_steps, guidance_scale=guidance_scale,
                      seeds=[seed] * len(labels))
        for m in log.of("monitor"):
            if (m.layer, m.op) == first:
                values.setdefault(m.step, []).append(float(m.value))
    return values


def probed_steps(schedule: Schedule) -> list[int]:
    """The steps at which ``schedule`` reuses its first operator in some branch: where step
    DRA probes, in order."""
    first = schedule.order()[0]
    return [s for s in range(schedule.num_steps)
            if any(first in schedule.reused(s, b) for b in BRANCHES)]


#: the most times :func:`calibrate_step_dra` spreads a budget's rates again (each a run of
#: the calibration videos); the last table is kept
MAX_SPREADS = 4


def fallback_rates(schedule: Schedule, profile, budget: float,
                   gamma: float = DEFAULT_GAMMA) -> dict[int, float]:
    """Per probed step of ``schedule`` (one where it reuses the first operator), the fraction
    of videos DRA should send back to computing (both CFG branches), so that the extra
    executions add up to ``budget`` (a fraction of a video's executions) on videos like the
    profile's.

    A fallback at step ``s`` computes what the schedule reuses there (``cost_s``: those
    executions in both branches over all of a video's). The rates are ``min(1, lam *
    value_s)`` with ``value_s`` what computing step ``s`` is worth to the profile's stand-in
    (:func:`coda.experiments.step_plans.step_values` with the profile's step change and
    weights to the power ``gamma``; the schedule's probed steps as the reused steps, the
    types it reuses at every step as ``always``) and ``lam`` set by bisection so that
    ``Σ rate_s cost_s = budget``; all 1 when even that is under the budget.

    Raises ValueError: a budget outside (0, 1], a gamma < 0, a profile of another step
    count, a schedule that probes no step."""
    from coda.experiments.step_plans import StepPlan, step_change, step_values
    from coda.host.cache.weights import step_weights

    if not 0.0 < budget <= 1.0:
        raise ValueError(f"budget={budget}: expected a fraction of the executions in (0, 1]")
    if not gamma >= 0:
        raise ValueError(f"gamma={gamma}: expected >= 0")
    if profile.num_steps != schedule.num_steps:
        raise ValueError(f"profile of {profile.num_steps} steps, schedule {schedule.name!r} "
                         f"of {schedule.num_steps}: expected the same step count")
    n = schedule.num_steps
    probed = probed_steps(schedule)
    if not probed:
        raise ValueError(f"schedule {schedule.name!r} reuses its first operator at no step: "
                         "nothing for DRA to fall back from")
    ops = schedule.model_ops()
    always = tuple(t for t in ops.op_types
                   if all((layer, t) in schedule.reused(s, b) for s in range(1, n)
                          for b in BRANCHES for layer, op in ops.ops if op == t))
    plan = StepPlan(n, schedule.num_layers, frozenset(probed), always, ops=schedule.ops)
    _, w = step_weights(profile)
    value = step_values(plan, step_change(profile, always), w, gamma)
    total = n * len(BRANCHES) * len(ops.ops)
    cost = {s: sum(len(schedule.reused(s, b)) for b in BRANCHES) / total for s in probed}

    def spent(lam: float) -> float:
        return sum(min(1.0, lam * value[s]) * cost[s] for s in probed)

    worth = [s for s in probed if value[s] > 0]
    if sum(cost[s] for s in worth) <= budget:     # every step worth anything, always
        return {s: float(s in worth) for s in probed}
    lo, hi = 0.0, 1.0
    while spent(hi) < budget:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if spent(mid) < budget else (lo, mid)
    return {s: min(1.0, lo * max(value[s], 0.0)) for s in probed}


def calibrate_step_dra(model, schedule: Schedule, labels, seeds, *, num_steps: int,
                       guidance_scale: float, driver_factory: Callable,
                       quantile: float = DEFAULT_QUANTILE,
                       margin: float = DEFAULT_MARGIN, budget: float | None = None,
                       profile=None, gamma: float = DEFAULT_GAMMA,
                       probe: str = "l1", max_extra: float | None = None) -> StepThresholds:
    """Step DRA's thresholds for ``schedule`` from calibration videos (every label with every
    seed): per step at which the schedule reuses the first operator (in any branch),
    ``margin * numpy.quantile(probes at that step, quantile)`` (:func:`probe_values`); with
    a ``budget``, the quantile at step ``s`` is ``1 - rate_s`` of :func:`fallback_rates`
    (threshold 0 where the rate is 1) and ``quantile`` is not used. A fallback moves the
    inputs of the steps after it, so a budgeted table is then run on the calibration videos
    (:func:`fallback_extra`); while it spends more than the budget (at most
    :data:`MAX_SPREADS` runs), the rates are spread again by the budget they were spread by
    times ``budget / spent``.

    Args:
        model: a DigitLatte, or a :class:`coda.experiments.cfg_loop.CFGLoop` over any
            transformer the cache engine serves (labels: its prompt indices).
        schedule: the static :class:`Schedule` DRA wraps (of that model's operators).
        labels, seeds: the calibration videos (e.g. the profile's; keep evaluation seeds out).
        num_steps, guidance_scale: as :func:`coda.host.model.sample.generate`.
        driver_factory: ``f(videos) -> NMPDriver`` with room for kept inputs.
        quantile: in [0, 1] (1: no calibration video would fall back). margin: > 0.
        budget: None (one quantile), or extra executions in (0, 1] (:data:`DEFAULT_BUDGET`
            is what ``coda eval`` and ``coda run`` use); then ``profile`` (the schedule's
            model's :class:`coda.host.cache.profile.Profile`) and ``gamma`` are
            :func:`fallback_rates`'.
        probe: what the thresholds bound (:data:`coda.host.cache.policies.dra.PROBES`;
            ``coda eval`` and ``coda run`` choose one of :data:`~coda.host.cache.policies.dra.
            DEFAULT_PROBES`: :func:`calibrate_default_dra`). A step the probe has no value
            at (``"accel"`` at step 1, ``"output"`` before step 3) has no threshold: DRA
            never falls back there.
        max_extra: None, or the most extra executions any one video may spend, in (0, 1]:
            the table's ``max_fallbacks`` is ``floor(max_extra * num_steps)`` per sample and
            branch.
    Returns:
        the :class:`StepThresholds` (model hash, schedule digest, calibration videos; with
        a budget its rates).
    Raises:
        ValueError: a quantile outside [0, 1], a margin <= 0, ``num_steps`` not the
            schedule's, no labels or seeds; a budget without a profile, and what
            :func:`fallback_rates` refuses.

    :func:`calibrate_step_dra` runs the static schedule with DRA's probes on the calibration
    videos (e.g. the profile's prompts and seeds, ``profile.meta["prompts"]``/``["seeds"]``; never
    the held-out evaluation seeds) and sets each reused step's threshold to a quantile of the
    probe values seen at that step (over videos and both CFG branches), times a margin: one
    quantile for every step, or, budgeted (``budget`` and the profile), the per-step quantile
    ``1 - rate`` of :func:`fallback_rates`, which spreads a budget of extra executions over the
    reused steps by what computing each is worth to the profile's stand-in.
    """
    from coda.host.cache.profile import model_hash

    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile={quantile}: expected a fraction in [0, 1]")
    if not margin > 0:
        raise ValueError(f"margin={margin}: expected > 0")
    if max_extra is not None and not 0.0 < max_extra <= 1.0:
        raise ValueError(f"max_extra={max_extra}: expected a fraction in (0, 1]")
    cap = None if max_extra is None else int(math.floor(max_extra * num_steps + 1e-9))
    if budget is not None and profile is None:
        raise ValueError(f"budget={budget}: a budgeted calibration needs the profile of the "
                         "schedule's model (profile=...)")
    rates = {} if budget is None else fallback_rates(schedule, profile, budget, gamma)
    runs = dict(num_steps=num_steps, guidance_scale=guidance_scale,
                driver_factory=driver_factory)
    values = probe_values(model, schedule, labels, seeds, probe=probe, **runs)
    probed = [s for s in probed_steps(schedule) if s in values]   # none before the history

    def table(rates: dict) -> StepThresholds:
        rates = {s: r for s, r in rates.items() if s in probed}
        q = {s: quantile if budget is None else 1.0 - rates[s] for s in probed}
        cut = {s: 0.0 if q[s] <= 0.0 else margin * float(np.quantile(values[s], q[s]))
               for s in probed}
        return StepThresholds(cut, num_steps, model_hash(model), schedule.digest(),
                              quantile if budget is None else None, margin,
                              tuple(int(x) for x in labels), tuple(int(s) for s in seeds),
                              float(guidance_scale), budget,
                              None if budget is None else float(gamma), rates, probe, cap)

    out = table(rates)
    if budget is None:
        return out
    # a fallback moves the inputs of the steps after it, so the probes there are not the
    # static run's: measure what the table spends on the calibration videos and spread the
    # rates by a budget scaled by budget / spent until it spends at most the budget
    spread = budget
    for _ in range(MAX_SPREADS):
        spent = fallback_extra(model, schedule, out, labels, seeds, **runs)
        if spent <= budget:
            break
        spread *= budget / spent
        out = table(fallback_rates(schedule, profile, spread, gamma))
    return out


def calibrate_default_dra(model, schedule: Schedule, profile, *, num_steps: int,
                          guidance_scale: float, driver_factory: Callable,
                          probes=DEFAULT_PROBES) -> tuple[StepThresholds, dict]:
    """The thresholds ``coda eval``, ``coda run`` and ``coda schedule dra`` use, on the
    profile's calibration videos
    (its prompts and seeds) only: for each of ``probes``, :func:`calibrate_step_dra` with the
    default budget spread by the profile (:data:`~coda.host.cache.policies.dra.
    DEFAULT_BUDGET`) and every video's extra executions bounded
    (:data:`~coda.host.cache.policies.dra.DEFAULT_MAX_EXTRA`); each table's videos
    (:func:`dra_videos`) and the static schedule's judged against the full-compute ones
    (per-video PSNR, :func:`coda.experiments.metrics.psnr_db`), and the table of the probe
    :func:`pick_probe` picks kept.

    Returns:
        (the chosen :class:`StepThresholds`, a report: ``"probe"``, the one chosen;
        ``"videos"``, the calibration videos; ``"static_psnr_db"``, per video; ``"probes"``,
        per probe :func:`pick_probe`'s figures plus ``"extra_executions"`` (a fraction of the
        calibration videos' executions) and ``"psnr_db"`` per video).
    Raises:
        ValueError: no probe, an unknown probe, and what :func:`calibrate_step_dra` raises.

    :func:`calibrate_default_dra` is what ``coda eval``, ``coda run`` and ``coda schedule dra``
    (:func:`main`) calibrate: a budgeted table per probe of
    :data:`coda.host.cache.policies.dra.DEFAULT_PROBES`, each rolled out on the calibration videos
    against their full-compute videos, and the table of the probe :func:`pick_probe` picks (the
    best gain on the quarter of those videos the static schedule loses most).
    """
    from coda.experiments.cfg_loop import generate_videos
    from coda.experiments.metrics import psnr_db
    from coda.host.cache.policies.dra import PROBES

    probes = tuple(probes)
    bad = [p for p in probes if p not in PROBES]
    if not probes or bad:
        raise ValueError(f"probes={probes}: expected one or more of {', '.join(PROBES)}")
    labels, seeds = profile.meta["prompts"], profile.meta["seeds"]
    runs = dict(num_steps=num_steps, guidance_scale=guidance_scale,
                driver_factory=driver_factory)
    full = [generate_videos(model, list(labels), seeds=[int(s)] * len(labels),
                            num_steps=num_steps, guidance_scale=guidance_scale)
            for s in seeds]
    full = torch.cat(full)

    def psnr(videos) -> list[float]:
        return [psnr_db(videos[i:i + 1], full[i:i + 1]) for i in range(len(full))]

    static = psnr(dra_videos(model, schedule, None, labels, seeds, **runs)[0])
    tables, judged = {}, {}
    for probe in probes:
        tables[probe] = calibrate_step_dra(model, schedule, labels, seeds, budget=DEFAULT_BUDGET,
                                           profile=profile, probe=probe,
                                           max_extra=DEFAULT_MAX_EXTRA, **runs)
        videos, extra = dra_videos(model, schedule, tables[probe], labels, seeds, **runs)
        judged[probe] = {"psnr_db": psnr(videos), "extra_executions": extra}
    choice, figures = pick_probe(static, {p: j["psnr_db"] for p, j in judged.items()})
    report = {"probe": choice, "videos": [[int(p), int(s)] for s in seeds for p in labels],
              "static_psnr_db": static,
              "probes": {p: {**figures[p], **judged[p]} for p in probes}}
    return tables[choice], report


def describe_choice(report: dict) -> str:
    """One line of :func:`calibrate_default_dra`'s report: the probe chosen, on how many
    videos, and each probe's corner and mean gains (dB) and extra executions (%)."""
    return (f"probe {report['probe']!r} chosen on {len(report['videos'])} calibration videos ("
            + "; ".join(f"{p}: corner {f['corner_gain_db']:+.2f} dB, mean "
                        f"{f['mean_gain_db']:+.2f} dB, extra {100 * f['extra_executions']:.1f} %"
                        for p, f in report["probes"].items()) + ")")


def pick_probe(static_psnr, probe_psnr: dict) -> tuple[str, dict]:
    """The probe whose DRA gains most on the corner of the calibration videos: per probe, the
    per-video gain ``probe_psnr[p] - static_psnr`` (dB; 0 where both are equal, e.g. both
    ``inf``), its mean over all videos (``"mean_gain_db"``) and over the quarter the static
    schedule loses most (:func:`coda.experiments.metrics.worst_quarter`,
    ``"corner_gain_db"``). Of the probes with a mean gain >= 0 (all if none has), the one
    with the highest corner gain; the first in ``probe_psnr``'s order on a tie. Returns
    (the probe, probe -> its figures). Raises ValueError for no probe or a per-video list
    of another length than ``static_psnr``."""
    from coda.experiments.metrics import worst_quarter

    static = np.asarray(static_psnr, dtype=float)
    if not probe_psnr:
        raise ValueError("probe_psnr is empty: expected one per-video PSNR list per probe")
    corner = worst_quarter(static)
    figures = {}
    for probe, psnr in probe_psnr.items():
        psnr = np.asarray(psnr, dtype=float)
        if psnr.shape != static.shape:
            raise ValueError(f"probe {probe!r}: {psnr.shape[0] if psnr.ndim else 0} PSNR "
                             f"values, expected one per video ({len(static)})")
        with np.errstate(invalid="ignore"):
            gain = np.where(psnr == static, 0.0, psnr - static)
        figures[probe] = {"mean_gain_db": float(gain.mean()),
                          "corner_gain_db": float(gain[corner].mean())}
    keep = [p for p in probe_psnr if figures[p]["mean_gain_db"] >= 0] or list(probe_psnr)
    return max(keep, key=lambda p: figures[p]["corner_gain_db"]), figures


def dra_videos(model, schedule: Schedule, thresholds: StepThresholds | None, labels, seeds,
               *, num_steps: int, guidance_scale: float,
               driver_factory: Callable) -> tuple[torch.Tensor, float]:
    """Every (label, seed) video generated by step DRA with ``thresholds`` around
    ``schedule`` (None: the static schedule alone), seed-major (the labels of ``seeds[0]``
    first), one generation per seed with a fresh ``driver_factory(len(labels))``; and the
    extra operator executions DRA spent, a fraction of all of the videos' (float). Videos
    as :func:`coda.experiments.cfg_loop.cached_videos` returns them (float32 [N, ...])."""
    from coda.experiments.cfg_loop import cached_videos

    log, out = EventLog(), []
    for seed in seeds:
        policy = SchedulePolicy(schedule)
        if thresholds is not None:
            policy = StepDRAPolicy(policy, thresholds)
        videos, _ = cached_videos(model, list(labels), driver_factory(len(labels)), policy,
                                  events=log, num_steps=num_steps,
                                  guidance_scale=guidance_scale,
                                  seeds=[int(seed)] * len(labels))
        out.append(videos)
    ops = log.of("op")
    return torch.cat(out), (sum(e.reason == "fallback" for e in ops) / len(ops) if ops else 0.0)


def fallback_extra(model, schedule: Schedule, thresholds: StepThresholds, labels, seeds, *,
                   num_steps: int, guidance_scale: float, driver_factory: Callable) -> float:
    """The extra operator executions (a fraction of all of the videos') that step DRA with
    ``thresholds`` around ``schedule`` spends on every (label, seed) video
    (:func:`dra_videos`)."""
    return dra_videos(model, schedule, thresholds, labels, seeds, num_steps=num_steps,
                      guidance_scale=guidance_scale, driver_factory=driver_factory)[1]


def save_step_dra(path: str | Path, schedule: Schedule, thresholds: StepThresholds) -> None:
    """Write ``thresholds`` as the ``"dra"`` block of the schedule file ``path`` (kept: its
    ``"coda"`` block; written fresh from ``schedule`` if the file does not exist).

    :func:`save_step_dra` writes the table as a ``"dra"`` block into the schedule's JSON file
    (beside the ``"coda"`` block of the search; :meth:`Schedule.from_json` ignores both);
    :func:`load_step_dra` reads the schedule and its table back and refuses a table of another
    model hash, step count or schedule with a ValueError naming the file.

    Raises ValueError if the table was not calibrated on ``schedule`` or has a threshold at
    a step it never probes (:meth:`StepThresholds.check_probed`), or the file is not a
    schedule JSON or holds another schedule."""
    from coda.host.cache.shipped import save_schedule_block

    thresholds.check_for(schedule=schedule, what=f"DRA thresholds for {path}")
    thresholds.check_probed(schedule, what=f"DRA thresholds for {path}")
    save_schedule_block(path, schedule, "dra", thresholds.to_dict())


def load_step_dra(path: str | Path, *, model_id: str | None = None,
                  num_steps: int | None = None) -> tuple[Schedule, StepThresholds]:
    """(schedule, thresholds) of a file written by :func:`save_step_dra`.

    Raises ValueError naming the file: unreadable, not a schedule, no ``"dra"`` block, a
    malformed block (naming the field), a table of another model hash, step count or
    schedule than the file's, or a threshold at a step the schedule never probes
    (:meth:`StepThresholds.check_probed`)."""
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
    table.check_probed(sched, what=f"{path} DRA thresholds")
    return sched, table


# ---------------------------------------------------------------- the command
@dataclass(frozen=True)
class DRAConfig(ScheduleFilesConfig):
    """Every option of ``coda schedule dra`` with its default (each file's ``"dra"`` block
    written)."""
    threads: int = option(1, "torch CPU threads (1: the bits of coda eval's calibration)")


#: the configuration ``coda schedule dra`` hands to :func:`main` (coda.cli)
CONFIG = DRAConfig


def configure(parser) -> None:
    add_options(parser, DRAConfig)


def main(cfg: DRAConfig) -> int:
    """``coda schedule dra`` as ``cfg`` says (what the command line gave, or a
    :class:`DRAConfig` built in Python): for each schedule file, step DRA's probe and
    thresholds chosen on the profile's videos (:func:`calibrate_default_dra`, torch backend,
    what ``coda eval`` calibrates), written as its ``"dra"`` block, which ``coda run --policy
    coda+dra --schedule FILE`` then reads instead of calibrating. Raises ValueError naming the
    file for a schedule of another model or layer count, or the option for a bad value."""
    from coda.experiments.rollouts import torch_driver

    model, scheds, profile, profile_path, guidance = load_for_calibration(cfg)
    for path, sched in scheds.items():
        t0 = time.perf_counter()
        table, report = calibrate_default_dra(
            model, sched, profile, num_steps=sched.num_steps, guidance_scale=guidance,
            driver_factory=lambda n: torch_driver(model, n, inputs=True))
        save_step_dra(path, sched, table)
        print(f"{path}: {describe_choice(report)} ({profile_path}, "
              f"{time.perf_counter() - t0:.0f} s)")
    return 0
