"""``coda schedule search``: whole-step cache schedules, pruned on a profile, judged by rollouts.

Every operator of a reused step is reused together, in both CFG branches, after a warm-up of
computed steps and with the last step computed (why: ``docs/scheduler.md``, "Search"). The
search space and the stand-in are :mod:`coda.experiments.step_plans`; :func:`search_steps`
runs the search and :func:`judge` scores each candidate as a cached generation of the
calibration videos (the profile's prompts and seeds, never held-out ones) against their
full-compute videos (whole-set PSNR, :func:`coda.experiments.metrics.psnr_db`), as Ray tasks
(:func:`rollout_task`) or in this process with ``workers=0`` (the same bits); a first round
on a few videos prunes to the finalists, which run on all, and the most faithful wins.
``coda sweep schedule`` runs this search as a sweep kind (:func:`sweep_kind`).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from coda.host.cache.schedule import Schedule
from coda.host.system.cost import DEFAULT_TARGET
from coda.options import add_options, option

# the space and the stand-in live in coda.experiments.step_plans, the judge in
# coda.experiments.rollouts; both re-exported here
from coda.experiments.rollouts import (full_videos, judge, loop_judge, rollout, rollout_task,
                                       torch_driver)
from coda.experiments.step_plans import (StepPlan, candidate_plans,
                                         check_reachable, constant_op_types, plan_by_dp,
                                         refined_plans, reused_steps_for, step_change,
                                         uniform_plan)

__all__ = ["StepPlan", "constant_op_types", "step_change", "reused_steps_for", "check_reachable",
           "plan_by_dp", "uniform_plan", "candidate_plans", "refined_plans",
           "uniform_latency", "counts_within_latency",
           "rollout", "rollout_task", "full_videos", "judge", "search_steps", "SearchReport",
           "SearchConfig", "checked_search_steps", "sweep_point", "sweep_kind"]

#: Relative tolerance of a latency budget: plans with the same reused-step count differ by a
#: tiny fraction of the modelled generation depending on where the steps lie (and a figure
#: recomputed differs in its last bits), so ``<= budget * (1 + LATENCY_RTOL)``.
LATENCY_RTOL = 1e-4


def within_budget(latency_s: float, max_latency_s: float) -> bool:
    """``latency_s <= max_latency_s`` up to :data:`LATENCY_RTOL` (relative)."""
    return latency_s <= max_latency_s * (1.0 + LATENCY_RTOL)


def uniform_latency(profile, skip: float, target: str = DEFAULT_TARGET) -> float:
    """Seconds: the modelled system-f latency on ``target`` of the uniform baseline at
    ``skip`` (:func:`coda.host.cache.policies.uniform_for_skip`, the policy ``coda eval`` runs as
    ``uniform``), the budget of ``coda schedule search --latency uniform``."""
    from coda.host.cache.policies import uniform_for_skip
    from coda.host.system.cost import schedule_cost

    steps, layers = profile.num_steps, profile.num_layers
    sched = uniform_for_skip(skip, steps, layers).build(steps, layers)
    return float(schedule_cost(sched, target, "f")["latency_s"])


def counts_within_latency(profile, skip: float, max_latency_s: float, *,
                          target: str = DEFAULT_TARGET, cooldown: int = 1) -> dict:
    """Reused steps per choice of ``always`` (none, or the profile's constant operator types
    at every step) for a latency budget: for each, the fewest whole reused steps, at least
    as many as reach ``skip``, whose uniform plan (:func:`uniform_plan`, else the reused steps
    in one run before the cooldown) is modelled at most ``max_latency_s`` seconds in system f
    on ``target``. A choice that no count fits is left out; the modelled latency depends on
    where the steps lie by a few seconds, so the search filters its candidates again.

    Reusing an operator in a computed step costs a segment per layer on the host link, so on
    a large target it saves less time than its share of executions: a budget turns skip
    fraction into fewer reused steps for the plans that reuse the constant types."""
    from coda.host.system.cost import schedule_cost

    steps, layers = profile.num_steps, profile.num_layers
    most = steps - 1 - max(1, cooldown)
    out = {}
    for always in dict.fromkeys([(), constant_op_types(profile)]):
        try:
            first = reused_steps_for(skip, steps, len(always), cooldown)
        except ValueError:
            continue
        for n in range(first, most + 1):
            try:
                plan = uniform_plan(steps, layers, n, cooldown=cooldown, always=always)
            except ValueError:
                plan = StepPlan(steps, layers, frozenset(range(most - n + 1, most + 1)), always)
            if within_budget(schedule_cost(plan.schedule(), target, "f")["latency_s"],
                             max_latency_s):
                out[always] = n
                break
    return out


@dataclass
class SearchReport:
    """What :func:`search_steps` found: the chosen plan and every candidate's figures."""
    plan: StepPlan
    schedule: Schedule
    candidates: list
    seconds: float


def search_steps(profile, model, skip: float, *, labels, seeds, full: torch.Tensor,
                 prune_videos: int = 6, finalists: int = 4, workers: int = 2,
                 cooldown: int = 1, num_steps: int | None = None,
                 guidance_scale: float | None = None, target: str | None = DEFAULT_TARGET,
                 max_latency_s: float | None = None, refine: int = 1, log=print,
                 judge_with: Callable | None = None) -> SearchReport:
    """The whole-step search for ``skip``: candidates from the stand-in
    (:func:`candidate_plans`), a first round of rollouts on the first ``prune_videos``
    calibration videos, the best ``finalists`` on all of them, then the ``refine`` best
    finalists refined (:func:`refined_plans`: operators computed inside a reused step, as
    many as keep the plan at ``skip`` and within ``max_latency_s``) and their refinements
    rolled out on all of them too; the plan with the highest whole-set PSNR on all
    calibration videos (ties: mean per-video PSNR) wins. Round 1 on a few videos does not
    rank plans as all of them do, so refinements are judged on all.

    ``labels``/``seeds``: the calibration videos (the profile's), ``full`` their full-compute
    videos. ``target``: every candidate's modelled latency and energy in system f for that
    target (:func:`coda.host.system.cost.schedule_cost`, the schedule transferred as ``coda
    sim`` transfers it; None: not modelled). ``max_latency_s``: only candidates modelled at
    most that slow there may be finalists (needs ``target``). Returns a
    :class:`SearchReport` (each candidate: label, skip, segments, the modelled cost, round-1
    and, for finalists, round-2 scores; ``pareto``: the candidates no other beats on both
    round-1 PSNR and modelled latency). ``judge_with``: the rollouts (default
    :func:`coda.experiments.rollouts.judge` on the shipped model the profile names;
    :func:`coda.experiments.rollouts.loop_judge` for any other model, with ``target=None``).
    Raises ValueError when no candidate meets ``max_latency_s``."""
    if judge_with is None:      # the rollouts on the profile's model
        from coda.host.model.choice import model_identity
        judge_with = functools.partial(judge, model=model_identity(profile.meta))
    t0 = time.perf_counter()
    num_steps = num_steps or profile.num_steps
    guidance_scale = profile.meta.get("guidance", 5.0) if guidance_scale is None \
        else guidance_scale
    if max_latency_s is not None and target is None:
        raise ValueError("a latency budget needs a target to model the latency on")
    counts = None if max_latency_s is None else counts_within_latency(
        profile, skip, max_latency_s, target=target, cooldown=cooldown)
    plans = candidate_plans(profile, skip, cooldown=cooldown, counts=counts) if counts != {} \
        else []
    scheds = [p.schedule() for p in plans]
    rows = [_row(p, s, full.shape[2], target) for p, s in zip(plans, scheds)]
    if max_latency_s is not None:       # only what the budget allows is rolled out
        keep = [i for i, r in enumerate(rows)
                if within_budget(r["modelled"]["latency_s"], max_latency_s)]
        if not keep:
            raise ValueError(f"--latency {max_latency_s:g}: no candidate for skip {skip} is "
                             f"modelled that fast on {target} (the fastest reaching it: "
                             f"{_fastest_latency(profile, skip, target, cooldown):.1f} s)")
        plans, scheds, rows = ([x[i] for i in keep] for x in (plans, scheds, rows))
    n1 = min(prune_videos, len(labels))
    log(f"skip {skip}: {len(plans)} candidates, round 1 on {n1} videos")
    for row, score in zip(rows, judge_with(scheds, labels[:n1], seeds[:n1], full[:n1],
                                      num_steps=num_steps, guidance_scale=guidance_scale,
                                      workers=workers)):
        row["round1"] = score
    order = sorted(range(len(rows)), key=lambda i: -rows[i]["round1"]["psnr_db"])
    best = order[:finalists]
    log(f"skip {skip}: {len(best)} finalists on {len(labels)} videos")
    for i, score in zip(best, judge_with([scheds[i] for i in best], labels, seeds, full,
                                    num_steps=num_steps, guidance_scale=guidance_scale,
                                    workers=workers)):
        rows[i]["round2"] = score
    final = lambda i: (rows[i]["round2"]["psnr_db"], rows[i]["round2"]["mean_psnr_db"])  # noqa: E731
    best = sorted(best, key=final, reverse=True)
    if target is not None:              # the front of the whole-step plans' first round
        for i, row in enumerate(rows):
            row["pareto"] = not any(
                o["round1"]["psnr_db"] >= row["round1"]["psnr_db"]
                and o["modelled"]["latency_s"] <= row["modelled"]["latency_s"]
                and (o["round1"]["psnr_db"], -o["modelled"]["latency_s"])
                != (row["round1"]["psnr_db"], -row["modelled"]["latency_s"])
                for o in rows)
    fits = _fits(skip, target, max_latency_s)
    more = [q for i in best[:refine] for q in refined_plans(plans[i], profile, fits)]
    if more:
        log(f"skip {skip}: {len(more)} refined plans (operators computed inside a reused "
            f"step) of the best {min(refine, len(best))} finalists on {len(labels)} videos")
        more_scheds = [q.schedule() for q in more]
        for q, sc, score in zip(more, more_scheds, judge_with(
                more_scheds, labels, seeds, full, num_steps=num_steps,
                guidance_scale=guidance_scale, workers=workers)):
            best.append(len(rows))
            plans.append(q)
            rows.append(dict(_row(q, sc, full.shape[2], target), round2=score))
    win = max(best, key=final)
    plan = plans[win]
    name = f"coda-steps(skip={skip:g})"
    return SearchReport(plan, plan.schedule(name), rows, time.perf_counter() - t0)


def _row(plan: StepPlan, sched: Schedule, frames: int, target: str | None) -> dict:
    """A candidate's report: label, plan, skip, segments and, with a ``target``, its
    modelled system-f cost there."""
    row = {"label": plan.label, "always": list(plan.always), "plan": plan.describe(),
           "skip": plan.skip_fraction(), "segments_per_video": sched.segment_count(frames)}
    if target is not None:
        from coda.host.system.cost import schedule_cost
        c = schedule_cost(sched, target, "f")
        row["modelled"] = {"target": target, "system": "f", "latency_s": c["latency_s"],
                           "energy_j": c["energy_j"], "segments": c["segments"],
                           "host_link_bytes": c["host_link_bytes"]}
    return row


def _fits(skip: float, target: str | None, max_latency_s: float | None) -> Callable:
    """Whether a refined plan may be a candidate: it reuses at least ``skip`` of the operator
    executions and, with a budget, is modelled at most ``max_latency_s`` on ``target``."""
    def fits(plan: StepPlan) -> bool:
        if plan.skip_fraction() < skip:
            return False
        if max_latency_s is None:
            return True
        from coda.host.system.cost import schedule_cost
        return within_budget(schedule_cost(plan.schedule(), target, "f")["latency_s"],
                             max_latency_s)
    return fits


def _fastest_latency(profile, skip: float, target: str, cooldown: int) -> float:
    """The modelled latency of the fastest plan reaching ``skip``: the most reused steps
    the cooldown allows, with the constant operator types at every step."""
    from coda.host.system.cost import schedule_cost

    steps = profile.num_steps
    most = steps - 1 - max(1, cooldown)
    plan = StepPlan(steps, profile.num_layers, frozenset(range(1, most + 1)),
                    constant_op_types(profile))
    return float(schedule_cost(plan.schedule(), target, "f")["latency_s"])


# ---------------------------------------------------------------- the command
@dataclass(frozen=True)
class SearchConfig:
    """Every option of ``coda schedule search`` with its default (the one source of them)."""
    profile: str = option(None, "profile.npz written by coda profile", type=str, required=True)
    skip: float = option(None, "target fraction of operator executions reused, in (0, 1)",
                         type=float, required=True)
    out: str = option(None, "schedule JSON to write", type=str, required=True)
    cooldown: int = option(1, "last steps that compute everything, 1..steps-2; --skip can "
                           "reach at most (steps - 1 - cooldown) / steps", unit="steps")
    workers: int = option(2, "Ray workers for the rollouts, one CPU each; 0 runs them in this "
                          "process (the same bits)")
    prune_videos: int = option(6, "calibration videos of the first round", unit="videos")
    finalists: int = option(4, "candidates rolled out on every calibration video")
    refine: int = option(1, "best finalists refined with operators computed inside a reused "
                         "step, as many as --skip and --latency allow, judged on every "
                         "calibration video; 0: whole steps only")
    target: str = option(DEFAULT_TARGET, "MODEL@RES whose modelled system-f latency and "
                         "energy every candidate reports (coda sim's transfer)")
    latency: str = option(None, "seconds, or 'uniform' (the uniform baseline's modelled "
                          "latency at --skip): only candidates modelled at most this slow on "
                          "--target (system f) may win; plans reusing the constant operator "
                          "types then reuse as many more whole steps as the budget needs",
                          type=str, default_text="any")


#: the config ``coda schedule search``'s main starts from (coda.cli)
CONFIG = SearchConfig


def configure(parser) -> None:
    add_options(parser, SearchConfig)


def calibration_videos(profile) -> tuple[list[int], list[int]]:
    """(labels, seeds) of the profile's videos, seed-major (every prompt of the first seed,
    then the next seed)."""
    seeds, prompts = profile.meta["seeds"], profile.meta["prompts"]
    return ([p if isinstance(p, str) else int(p) for _ in seeds for p in prompts],
            [int(s) for s in seeds for _ in prompts])


def checked_search_steps(profile_path, skip: float, *, cooldown: int = SearchConfig.cooldown,
                         workers: int = SearchConfig.workers,
                         prune_videos: int = SearchConfig.prune_videos,
                         finalists: int = SearchConfig.finalists,
                         refine: int = SearchConfig.refine,
                         refs_dir: str | Path | None = "build/refs",
                         target: str | None = SearchConfig.target,
                         max_latency_s: float | str | None = None,
                         log=print) -> tuple[SearchReport, dict]:
    """:func:`search_steps` for the model the profile file was made with (a shipped model, or a
    diffusers pipeline's loop: :func:`coda.experiments.pipeline_model.load_profiled_model`)
    after ``coda schedule search``'s checks; the calibration videos' full-compute videos are kept in ``refs_dir``
    (:func:`full_videos`). Returns (the report, the ``info`` saved beside the schedule). Raises
    ValueError naming the flag or the file (a profile of another model, a skip no whole-step
    plan reaches)."""
    from coda.experiments.cfg_loop import CFGLoop
    from coda.experiments.pipeline_model import load_profiled_model
    from coda.host.cache.profile import Profile

    if not 0.0 < skip < 1.0:
        raise ValueError(f"--skip {skip}: expected a fraction in (0, 1)")
    for flag, value, lo in (("--workers", workers, 0), ("--prune-videos", prune_videos, 1),
                            ("--finalists", finalists, 1), ("--cooldown", cooldown, 1),
                            ("--refine", refine, 0)):
        if value < lo:
            raise ValueError(f"{flag} {value}: expected >= {lo}")
    if target is not None:
        from coda.host.system.cost import parse_target
        parse_target(target)
    budget = max_latency_s
    if budget is not None and budget != "uniform":
        try:
            budget = float(budget)
        except (TypeError, ValueError):
            budget = math.nan
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"--latency {max_latency_s}: expected a finite time > 0 (seconds) "
                             "or 'uniform'")
    if budget is not None and target is None:
        raise ValueError("--latency needs a --target to model the latency on")
    prof = Profile.load(profile_path)
    model = load_profiled_model(prof.meta, f"--profile {profile_path}")   # the one profiled
    if cooldown > prof.num_steps - 2:
        raise ValueError(f"--cooldown {cooldown}: expected 1..{prof.num_steps - 2} steps for a "
                         f"profile of {prof.num_steps} steps")
    check_reachable(skip, prof.num_steps, constant_op_types(prof), cooldown)
    candidate_plans(prof, skip, cooldown=cooldown)      # every plan the search would try
    if budget == "uniform":
        budget = uniform_latency(prof, skip, target)
    labels, seeds = calibration_videos(prof)
    guidance = float(prof.meta.get("guidance_scale", 5.0))
    t0 = time.perf_counter()
    full = full_videos(model, labels, seeds, num_steps=prof.num_steps, guidance_scale=guidance,
                       cache_dir=refs_dir)
    full_s = time.perf_counter() - t0
    judge_with = None            # the shipped model's: Ray tasks loading it
    if isinstance(model, CFGLoop):   # a pipeline's loop: rolled out in this process
        judge_with = loop_judge(model, lambda videos: torch_driver(model, videos))
    rep = search_steps(prof, model, skip, labels=labels, seeds=seeds, full=full,
                       prune_videos=prune_videos, finalists=finalists, workers=workers,
                       cooldown=cooldown, guidance_scale=guidance, target=target,
                       max_latency_s=budget, refine=refine, log=log, judge_with=judge_with)
    rollouts = [c for c in rep.candidates for r in ("round1", "round2") if r in c]
    info = {"model_hash": prof.meta.get("model_hash"), "profile": str(profile_path),
            "profile_seeds": prof.meta.get("seeds"), "target_skip": skip, "method": "steps",
            "plan": rep.plan.describe(), "plan_label": rep.plan.label,
            "target": target, "max_latency_s": budget,
            "latency_budget": "uniform" if max_latency_s == "uniform" else budget,
            "always": list(rep.plan.always), "cooldown": cooldown,
            "refresh": [[step, layer, op] for step, (layer, op) in sorted(rep.plan.refresh)],
            "calibration": {"prompts": prof.meta.get("prompts"), "seeds": prof.meta.get("seeds"),
                            "videos": len(labels), "guidance_scale": guidance,
                            "prune_videos": prune_videos, "finalists": finalists,
                            "refine": refine},
            "search_s": round(rep.seconds + full_s, 1), "full_compute_s": round(full_s, 1),
            "rollouts": len(rollouts), "workers": workers,
            "candidates": [{k: v for k, v in c.items()} for c in rep.candidates]}
    return rep, info


def main(cfg: SearchConfig) -> int:
    """Run ``coda schedule search`` on ``cfg`` (docs/cli.md). Returns 0."""
    from rich.console import Console

    from coda.host.cache.shipped import save_schedule
    from coda.paths import check_output_path

    out = check_output_path(cfg.out, "--out")
    console = Console()
    rep, info = checked_search_steps(cfg.profile, cfg.skip, cooldown=cfg.cooldown,
                                     workers=cfg.workers, prune_videos=cfg.prune_videos,
                                     finalists=cfg.finalists, refine=cfg.refine,
                                     target=cfg.target,
                                     max_latency_s=cfg.latency, log=console.print)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_schedule(out, rep.schedule, info)
    console.print(f"schedule {rep.schedule.name} -> {out}  ({info['search_s']:.0f} s, "
                  f"{info['rollouts']} rollouts)")
    for c in sorted(rep.candidates, key=lambda c: (-c["round2"]["psnr_db"] if "round2" in c
                                                   else math.inf, -c.get("round1", {}).get(
                                                       "psnr_db", -math.inf))):
        r1 = f" | round 1 {c['round1']['psnr_db']:.2f} dB" if "round1" in c else ""
        r2 = f" | all {c['round2']['psnr_db']:.2f} dB" if "round2" in c else ""
        lat = f" | f {c['modelled']['latency_s']:.0f} s" if "modelled" in c else ""
        front = " | Pareto" if c.get("pareto") else ""
        console.print(f"  {c['label']:<24} always {'+'.join(c['always']) or '-':<10} skip "
                      f"{c['skip']:.3f} | segments {c['segments_per_video']}{lat}{r1}{r2}{front}")
    console.print(f"  chosen: {rep.plan.label}, {rep.plan.describe()}")
    return 0


# ----------------------------------------------------------------------------- sweeps
def sweep_point(params: dict, workdir: Path) -> dict:
    """One ``coda sweep schedule`` point: :func:`checked_search_steps` with ``params``, the
    rollouts in this process (the point is one task of one CPU); writes
    ``workdir/schedule.json`` as ``coda schedule search`` does. The full-compute videos are
    kept in the sweep folder's ``refs/`` (``workdir`` is ``OUT/points/<point>``), shared by its
    points. Returns the chosen plan's figures (its skip, whole-set and mean per-video PSNR,
    segments, modelled latency and energy with a ``target``), plus ``timing``."""
    from coda.host.cache.shipped import save_schedule

    workdir = Path(workdir)
    rep, info = checked_search_steps(
        params["profile"], params["skip"], cooldown=params["cooldown"], workers=0,
        prune_videos=params["prune_videos"], finalists=params["finalists"],
        refine=params["refine"], refs_dir=workdir.parent.parent / "refs",
        target=params["target"], max_latency_s=params["latency"], log=lambda *a, **k: None)
    save_schedule(workdir / "schedule.json", rep.schedule, info)
    win = max((c for c in rep.candidates if "round2" in c and c["plan"] == info["plan"]),
              key=lambda c: c["round2"]["psnr_db"])
    figures = {"plan": rep.plan.label, "skip": win["skip"],
               "reused_steps": len(rep.plan.reused), "always": "+".join(rep.plan.always),
               "refreshed": len(rep.plan.refresh), "psnr_db": win["round2"]["psnr_db"],
               "mean_psnr_db": win["round2"]["mean_psnr_db"],
               "segments_per_video": win["segments_per_video"],
               "candidates": len(rep.candidates), "rollouts": info["rollouts"]}
    if "modelled" in win:
        figures["latency_s"] = win["modelled"]["latency_s"]
        figures["energy_j"] = win["modelled"]["energy_j"]
    figures["timing"] = {"search_s": info["search_s"], "full_compute_s": info["full_compute_s"]}
    return figures


def sweep_kind():
    """The ``schedule`` sweep kind (coda.sweep.SweepKind): whole-step searches over skip
    fractions, latency budgets, targets and the search's own settings, one schedule per
    point."""
    import coda.host
    from coda.host.cache.shipped import SHIPPED_PROFILE
    from coda.sweep import Param, SweepKind, sources_digest

    here = Path(__file__).parent
    return SweepKind(
        name="schedule", run=sweep_point,
        version=sources_digest(Path(__file__), here / "step_plans.py", here / "rollouts.py",
                               here / "metrics.py", here / "profile.py",
                               Path(coda.host.__file__).parent),
        description="search a whole-step cache schedule judged by rollouts (coda schedule "
                    "search)",
        params=(Param("profile", str, str(SHIPPED_PROFILE)), Param("skip", float, 0.5),
                Param("cooldown", int, SearchConfig.cooldown),
                Param("prune_videos", int, SearchConfig.prune_videos),
                Param("finalists", int, SearchConfig.finalists),
                Param("refine", int, SearchConfig.refine),
                Param("target", str, SearchConfig.target), Param("latency", str)),
        headline=("plan", "skip", "psnr_db", "mean_psnr_db", "segments_per_video",
                  "latency_s"))
