"""``coda schedule search``: whole-step cache schedules, pruned on a profile, judged by rollouts.

What a good static schedule looks like on a video DiT (measured on the shipped model, and the
finding of the 2025–26 step-level searches: LeMiCa's step graph, BudCache's annealing over
whole steps, ECAD's search on real generations): every operator of a reused step reused
together, in both CFG branches (a fresh operator computed on a residual stream that already
holds stale outputs costs more than it saves, and CFG multiplies an error that only one
branch makes by the guidance scale), a warm-up of computed steps, and the last step computed.

**Search space** (:class:`StepPlan`): the set of reused steps (both branches, every
operator), plus the operator types reused at *every* step from step 1 on (``always``): those
whose profiled output never changes between steps (the digit model's cross attention
attends to one token, the label, so its output is constant). With sum segments
(:mod:`coda.host.cache.engine`) reusing such an operator costs only the cache format's
rounding of its output, and every execution saved there is a step that need not be reused.
Uniform reuse with a warm-up is a point of this space; so are PAB-like step windows.

**Stand-in** (:func:`plan_by_dp`): for a reused step ``s`` whose caches were written at the
last computed step ``c``, the error proxy is ``w(s)^gamma * (D(s) - D(c))``: the profiled mean
relative output change accumulated since ``c`` (``D`` cumulative over steps of
:func:`step_change`), weighted by the profile's step sensitivity (``w``,
:func:`coda.host.cache.weights.step_weights`). An exact dynamic programme over the computed steps
(a path through the DAG of steps, as LeMiCa's) gives the cheapest plan with exactly the
number of reused steps the target needs, runs of at most ``max_run`` reused steps. The
proxy's step weights are uncertain, so several ``gamma`` and ``max_run`` and both choices of
``always`` make the candidates, with uniform's whole-step plan among them.

**Judge** (:func:`judge`): each candidate is a cached generation of the calibration videos
(the profile's prompts and seeds, never held-out ones) compared with their full-compute
videos (PSNR over the whole set, torchmetrics via :func:`coda.experiments.metrics.psnr_db`);
candidates run as Ray tasks (:func:`rollout_task`), or in this process with ``workers=0``
(the same bits). A first round on a few videos prunes to ``finalists``, which run on all.
The most faithful finalist wins.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from coda.host.cache.schedule import BRANCHES, OP_TYPES, Schedule, ScheduleError
from coda.host.system.cost import DEFAULT_TARGET
from coda.options import add_options, option

__all__ = ["StepPlan", "constant_op_types", "step_change", "reused_steps_for", "check_reachable",
           "plan_by_dp",
           "uniform_plan", "uniform_latency", "counts_within_latency", "candidate_plans", "rollout", "full_videos", "judge", "search_steps",
           "SearchReport"]


# ---------------------------------------------------------------- the space
@dataclass(frozen=True)
class StepPlan:
    """A whole-step schedule of a Latte model.

    Attributes:
        num_steps, num_layers: the model's run (steps 0..num_steps-1, layers).
        reused: the steps at which every operator is reused in both CFG branches.
        always: operator types (of :data:`coda.host.cache.schedule.OP_TYPES`) reused at every step
            from step 1 on, computed steps included.
        label: how the plan was made (for reports).
    Raises:
        ScheduleError: step 0 reused, a step out of range, an unknown operator type.
    """
    num_steps: int
    num_layers: int
    reused: frozenset
    always: tuple = ()
    label: str = ""

    def __post_init__(self):
        bad = [s for s in self.reused if not 1 <= s < self.num_steps]
        if bad:
            raise ScheduleError(f"reused steps {sorted(bad)}: expected 1..{self.num_steps - 1} "
                                "(step 0 computes the first caches)")
        unknown = [t for t in self.always if t not in OP_TYPES]
        if unknown:
            raise ScheduleError(f"always-reused types {unknown}: expected some of {OP_TYPES}")
        object.__setattr__(self, "reused", frozenset(int(s) for s in self.reused))
        object.__setattr__(self, "always", tuple(t for t in OP_TYPES if t in self.always))

    def schedule(self, name: str | None = None) -> Schedule:
        """The plan as a :class:`Schedule` (both branches alike)."""
        every = [(layer, op) for layer in range(self.num_layers) for op in OP_TYPES]
        const = frozenset(r for r in every if r[1] in self.always)
        reuse = {}
        for step in range(1, self.num_steps):
            refs = frozenset(every) if step in self.reused else const
            for branch in BRANCHES:
                if refs:
                    reuse[(step, branch)] = refs
        return Schedule(self.num_steps, self.num_layers, reuse, name or self.describe())

    def skip_fraction(self) -> float:
        """Reused / all operator executions."""
        k, a = len(OP_TYPES), len(self.always)
        n = len(self.reused)
        return (n * k + (self.num_steps - 1 - n) * a) / (self.num_steps * k)

    def describe(self) -> str:
        steps = sorted(self.reused)
        always = f"+{'+'.join(self.always)}" if self.always else ""
        return f"steps{always}[{','.join(map(str, steps))}]"


def constant_op_types(profile, tol: float = 0.0) -> tuple[str, ...]:
    """Operator types whose profiled relative output change is at most ``tol`` at every step
    >= 1, video, branch and layer (0.0: exactly constant)."""
    out = np.asarray(profile.out_change[:, 1:], np.float64)      # [V, S-1, B, L, K]
    worst = np.nanmax(np.nan_to_num(out, nan=np.inf).reshape(-1, out.shape[-1]), axis=0)
    return tuple(t for t, w in zip(OP_TYPES, worst) if w <= tol)


def step_change(profile, skip_types: tuple[str, ...] = ()) -> np.ndarray:
    """float64 [steps]: the profiled relative output change between step t-1 and t, the mean
    over videos, branches, layers and the operator types not in ``skip_types``; 0 at step 0."""
    keep = [i for i, t in enumerate(OP_TYPES) if t not in skip_types]
    out = np.asarray(profile.out_change, np.float64)[..., keep]
    d = np.zeros(out.shape[1])
    d[1:] = np.nanmean(out[:, 1:].reshape(out.shape[0], out.shape[1] - 1, -1), axis=(0, 2))
    return np.nan_to_num(d, nan=0.0)


def reused_steps_for(skip: float, num_steps: int, always: int = 0, cooldown: int = 1) -> int:
    """Whole steps to reuse so the plan's skip fraction is the closest to ``skip`` (ties: the
    larger), with ``always`` types of :data:`OP_TYPES` reused at every step from step 1 on and
    the last ``cooldown`` steps computed. Raises ValueError when no count in
    0..num_steps-1-cooldown comes within 1/num_steps of ``skip``."""
    k, most = len(OP_TYPES), max(0, num_steps - 1 - max(1, cooldown))
    frac = lambda n: (n * k + (num_steps - 1 - n) * always) / (num_steps * k)  # noqa: E731
    best = min(range(most + 1), key=lambda n: (abs(frac(n) - skip), -n))
    if abs(frac(best) - skip) > 1.0 / num_steps:
        raise ValueError(f"--skip {skip}: whole-step plans of {num_steps} steps (the last "
                         f"{max(1, cooldown)} computed, {always} operator types reused at every "
                         f"step) reach {frac(0):.3f}..{frac(most):.3f}")
    return best


def check_reachable(skip: float, num_steps: int, constant: tuple = (), cooldown: int = 1):
    """Raise ValueError (naming ``--skip`` and the ranges) unless a whole-step plan reaches
    ``skip``, with or without the ``constant`` operator types reused at every step."""
    ranges = []
    for always in dict.fromkeys([(), tuple(constant)]):
        try:
            reused_steps_for(skip, num_steps, len(always), cooldown)
            return
        except ValueError as exc:
            ranges.append(str(exc).rsplit(" reach ", 1)[1] + (
                f" with {'+'.join(always)} reused at every step" if always else ""))
    raise ValueError(f"--skip {skip}: whole-step plans of {num_steps} steps (the last "
                     f"{max(1, cooldown)} computed) reach {', or '.join(ranges)}")


# ---------------------------------------------------------------- the stand-in
def plan_by_dp(change: np.ndarray, weight: np.ndarray, count: int, *, cooldown: int = 1,
               gamma: float = 1.0, max_run: int = 5) -> tuple[frozenset, float]:
    """The exact cheapest set of ``count`` reused steps under the stand-in cost: the
    minimum-error path through the DAG of steps (:func:`coda.host.cache.policies.lemica.
    min_error_path`) whose edge ``i -> j`` reuses steps i+1..j-1 from step i's caches at
    ``Σ_s w(s)^gamma (D(s) - D(i))``.

    Args:
        change: float [S] profiled change per step (:func:`step_change`; index 0 unused).
        weight: float [S] step weights (> 0).
        count: reused steps wanted.
        cooldown: the last ``cooldown`` steps (>= 1) are computed.
        gamma: exponent of the weights.
        max_run: at most this many reused steps in a row.
    Returns:
        (reused steps, proxy cost). Raises ValueError when no plan has ``count`` reused steps
        under these constraints.
    """
    from coda.host.cache.policies.lemica import min_error_path

    s_n = len(change)
    cum = np.cumsum(np.asarray(change, np.float64))
    w = np.asarray(weight, np.float64) ** gamma
    last = s_n - max(1, cooldown)             # steps last..S-1 are computed
    cost = np.full((s_n, s_n), math.inf)
    for i in range(s_n):
        run = 0.0
        for j in range(i + 1, min(s_n, i + max_run + 2)):
            if j - 1 > i:                     # step j-1 joins the span reused from i
                if j - 1 >= last:
                    break
                run += w[j - 1] * (cum[j - 1] - cum[i])
            cost[i, j] = run
    try:
        path, total = min_error_path(cost, s_n - count)
    except ValueError:
        raise ValueError(f"no plan reuses {count} of {s_n} steps with runs <= {max_run} and "
                         f"the last {cooldown} computed") from None
    return frozenset(range(s_n)) - frozenset(path), total


def uniform_plan(num_steps: int, num_layers: int, count: int, *, cooldown: int = 1,
                 always: tuple = ()) -> StepPlan:
    """Uniform whole-step reuse: after the warm-up that makes the count fit, every k-th step
    computed, the reused steps spread as evenly as the count allows (DeepCache/FORA's rule
    as a :class:`StepPlan`)."""
    last = num_steps - max(1, cooldown)
    for k in range(2, num_steps):
        for warmup in range(1, last):
            span = range(warmup, last)
            reused = [s for s in span if (s - warmup) % k != 0]
            if len(reused) == count:
                return StepPlan(num_steps, num_layers, frozenset(reused), always,
                                f"uniform k={k} warmup={warmup}")
    raise ValueError(f"no uniform whole-step plan reuses {count} of {num_steps} steps")


def candidate_plans(profile, skip: float, *, cooldown: int = 1,
                    gammas=(0.0, 0.5, 1.0, 2.0, 3.0), max_runs=(2, 3, 5, 8),
                    counts: dict | None = None) -> list[StepPlan]:
    """The candidates for ``skip``: the stand-in's optimum for every ``gamma`` x ``max_run``,
    with and without the profile's constant operator types reused at every step, and
    uniform's plan; duplicates dropped, order kept.

    ``counts``: reused steps per choice of ``always`` (a tuple of operator types, as
    :func:`counts_within_latency` gives them); a choice missing from it is left out. None:
    the count that reaches ``skip`` (:func:`reused_steps_for`) for both choices."""
    from coda.host.cache.weights import step_weights

    steps, layers = profile.num_steps, profile.num_layers
    const = constant_op_types(profile)
    _, w = step_weights(profile)
    plans: list[StepPlan] = []
    for always in dict.fromkeys([(), const]):
        if counts is not None:
            if always not in counts:
                continue
            count = counts[always]
        else:
            try:
                count = reused_steps_for(skip, steps, len(always), cooldown)
            except ValueError:
                continue
        change = step_change(profile, always)
        try:
            plans.append(uniform_plan(steps, layers, count, cooldown=cooldown, always=always))
        except ValueError:
            pass
        for gamma in gammas:
            for run in max_runs:
                try:
                    reused, _ = plan_by_dp(change, w, count, cooldown=cooldown, gamma=gamma,
                                           max_run=run)
                except ValueError:
                    continue
                plans.append(StepPlan(steps, layers, reused, always,
                                      f"dp gamma={gamma:g} max_run={run}"))
    if not plans:
        check_reachable(skip, steps, const, cooldown)
        raise ValueError(f"--skip {skip}: no whole-step plan of {steps} steps with runs of at "
                         f"most {max(max_runs)} reused steps reaches it")
    unique: dict = {}
    for p in plans:
        unique.setdefault((p.reused, p.always), p)
    return list(unique.values())


#: Relative tolerance of a latency budget: plans with the same reused-step count differ by
#: hundredths of a second of a ~2,000 s modelled generation depending on where the steps lie
#: (and a figure recomputed differs in its last bits), so ``<= budget * (1 + LATENCY_RTOL)``.
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


# ---------------------------------------------------------------- the judge
def rollout(model, schedule: Schedule, labels, seeds, *, num_steps: int,
            guidance_scale: float, batch: int = 10, ranks: int = 2) -> torch.Tensor:
    """Cached generations of (labels[i], seeds[i]) under ``schedule`` on the torch backend,
    ``batch`` videos per generation. Returns float32 [N, 1, F, H, W]."""
    from coda.host.nme.backend import TorchBackend
    from coda.host.nmp.driver import NMPDriver
    from coda.host.model.sample import cache_mem_words, cached_generate
    from coda.hw.nme.isa import NMEConfig

    out = []
    for i in range(0, len(labels), batch):
        lab, sd = list(labels[i:i + batch]), list(seeds[i:i + batch])
        driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=cache_mem_words(
            model, len(lab), ranks=ranks, lanes=8)), ranks=ranks)
        v, _ = cached_generate(model, lab, driver, schedule, num_steps=num_steps,
                               guidance_scale=guidance_scale, seeds=sd)
        out.append(v)
    return torch.cat(out)


def full_videos(model, labels, seeds, *, num_steps: int, guidance_scale: float,
                batch: int = 10, cache_dir: str | Path | None = None) -> torch.Tensor:
    """Full-compute videos of (labels[i], seeds[i]), float32 [N, 1, F, H, W].

    ``cache_dir``: keep them there in a file named by a hash of the model (its
    :func:`coda.experiments.profile.model_hash`), the videos, steps, guidance, and the torch build
    and CPU, and read it back when asked again (the bits of a generation depend on the CPU)."""
    from coda.host.model.sample import generate

    path = None
    if cache_dir is not None:
        import hashlib
        import platform

        from coda.experiments.profile import model_hash
        from coda.host.system.calibrate import cpu_model
        key = json.dumps([model_hash(model), [int(x) for x in labels], [int(x) for x in seeds],
                          num_steps, float(guidance_scale), torch.__version__,
                          platform.machine(), platform.processor(), cpu_model()])
        path = Path(cache_dir) / f"full-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
        if path.exists():
            return torch.load(path)
    videos = torch.cat([generate(model, list(labels[i:i + batch]),
                                 seeds=list(seeds[i:i + batch]), num_steps=num_steps,
                                 guidance_scale=guidance_scale)
                        for i in range(0, len(labels), batch)])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")    # writers side by side: one each
        torch.save(videos, tmp)
        tmp.replace(path)
    return videos


def _score(videos: torch.Tensor, full: torch.Tensor) -> dict:
    from coda.experiments.metrics import psnr_db
    per = [psnr_db(videos[i:i + 1], full[i:i + 1]) for i in range(len(videos))]
    return {"psnr_db": psnr_db(videos, full), "per_video_psnr_db": per,
            "mean_psnr_db": float(np.mean(per))}


def rollout_task(schedule_json: str, labels, seeds, full: torch.Tensor, num_steps: int,
                 guidance_scale: float, threads: int = 1) -> dict:
    """One candidate's rollout and score (a Ray task body; also run in-process): loads the
    shipped model, generates, scores against ``full``. Returns :func:`_score`'s dict plus
    ``wall_s``."""
    from coda.host.model.dit import load_model

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model, _ = load_model()
    videos = rollout(model, Schedule.from_json(schedule_json), labels, seeds,
                     num_steps=num_steps, guidance_scale=guidance_scale)
    return {**_score(videos, full), "wall_s": time.perf_counter() - t0}


def judge(schedules: list[Schedule], labels, seeds, full: torch.Tensor, *, num_steps: int,
          guidance_scale: float, workers: int = 2) -> list[dict]:
    """Every schedule's rollout score on the videos (labels[i], seeds[i]) against ``full``,
    in order: Ray tasks on ``workers`` CPUs of a local Ray (one thread each), or in this
    process when ``workers`` is 0 (the same bits)."""
    args = [(s.to_json(), list(labels), list(seeds), full, num_steps, guidance_scale)
            for s in schedules]
    if workers <= 0:
        return [rollout_task(*a) for a in args]
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    try:
        task = ray.remote(num_cpus=1)(rollout_task)
        full_ref = ray.put(full)
        refs = [task.remote(a[0], a[1], a[2], full_ref, a[4], a[5]) for a in args]
        return ray.get(refs)
    finally:
        if started:
            ray.shutdown()


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
                 max_latency_s: float | None = None, log=print) -> SearchReport:
    """The whole-step search for ``skip``: candidates from the stand-in
    (:func:`candidate_plans`), a first round of rollouts on the first ``prune_videos``
    calibration videos, the best ``finalists`` on all of them; the finalist with the highest
    whole-set PSNR (ties: mean per-video PSNR) wins.

    ``labels``/``seeds``: the calibration videos (the profile's), ``full`` their full-compute
    videos. ``target``: every candidate's modelled latency and energy in system f for that
    target (:func:`coda.host.system.cost.schedule_cost`, the schedule transferred as ``coda
    sim`` transfers it; None: not modelled). ``max_latency_s``: only candidates modelled at
    most that slow there may be finalists (needs ``target``). Returns a
    :class:`SearchReport` (each candidate: label, skip, segments, the modelled cost, round-1
    and, for finalists, round-2 scores; ``pareto``: the candidates no other beats on both
    round-1 PSNR and modelled latency). Raises ValueError when no candidate meets
    ``max_latency_s``."""
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
    rows = [{"label": p.label, "always": list(p.always), "plan": p.describe(),
             "skip": p.skip_fraction(),
             "segments_per_video": s.segment_count(frames=full.shape[2])}
            for p, s in zip(plans, scheds)]
    if target is not None:
        from coda.host.system.cost import schedule_cost
        for row, s in zip(rows, scheds):
            c = schedule_cost(s, target, "f")
            row["modelled"] = {"target": target, "system": "f", "latency_s": c["latency_s"],
                               "energy_j": c["energy_j"], "segments": c["segments"],
                               "host_link_bytes": c["host_link_bytes"]}
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
    for row, score in zip(rows, judge(scheds, labels[:n1], seeds[:n1], full[:n1],
                                      num_steps=num_steps, guidance_scale=guidance_scale,
                                      workers=workers)):
        row["round1"] = score
    order = sorted(range(len(rows)), key=lambda i: -rows[i]["round1"]["psnr_db"])
    best = order[:finalists]
    log(f"skip {skip}: {len(best)} finalists on {len(labels)} videos")
    for i, score in zip(best, judge([scheds[i] for i in best], labels, seeds, full,
                                    num_steps=num_steps, guidance_scale=guidance_scale,
                                    workers=workers)):
        rows[i]["round2"] = score
    win = max(best, key=lambda i: (rows[i]["round2"]["psnr_db"],
                                   rows[i]["round2"]["mean_psnr_db"]))
    if target is not None:
        for i, row in enumerate(rows):
            row["pareto"] = not any(
                o["round1"]["psnr_db"] >= row["round1"]["psnr_db"]
                and o["modelled"]["latency_s"] <= row["modelled"]["latency_s"]
                and (o["round1"]["psnr_db"], -o["modelled"]["latency_s"])
                != (row["round1"]["psnr_db"], -row["modelled"]["latency_s"])
                for o in rows)
    plan = plans[win]
    name = f"coda-steps(skip={skip:g})"
    return SearchReport(plan, plan.schedule(name), rows, time.perf_counter() - t0)


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
METHODS = ("steps", "anneal")


@dataclass(frozen=True)
class SearchConfig:
    """Every option of ``coda schedule search`` with its default (the one source of them)."""
    profile: str = option(None, "profile.npz written by coda profile", type=str, required=True)
    skip: float = option(None, "target fraction of operator executions reused, in (0, 1)",
                         type=float, required=True)
    out: str = option(None, "schedule JSON to write", type=str, required=True)
    method: str = option("steps", "steps: whole-step plans judged by rollouts of the "
                         "calibration videos (the profile's; the shipped model only); anneal: "
                         "the per-operator annealer on the profile alone", choices=METHODS)
    cooldown: int = option(1, "last steps that compute everything, 0..steps-2 (steps: at least "
                           "1); --skip can reach at most (steps - 1 - cooldown) / steps",
                           unit="steps")
    workers: int = option(2, "Ray workers for the rollouts, one CPU each; 0 runs them in this "
                          "process (the same bits)", group="--method steps")
    prune_videos: int = option(6, "calibration videos of the first round", unit="videos",
                               group="--method steps")
    finalists: int = option(4, "candidates rolled out on every calibration video",
                            group="--method steps")
    target: str = option(DEFAULT_TARGET, "MODEL@RES whose modelled system-f latency and "
                         "energy every candidate reports (coda sim's transfer)",
                         group="--method steps")
    latency: str = option(None, "seconds, or 'uniform' (the uniform baseline's modelled "
                          "latency at --skip): only candidates modelled at most this slow on "
                          "--target (system f) may win; plans reusing the constant operator "
                          "types then reuse as many more whole steps as the budget needs",
                          type=str, default_text="any", group="--method steps")
    seed: int = option(0, "annealing seed, 0..2^31-1", group="--method anneal")
    moves: int = option(200_000, "annealing moves", group="--method anneal")
    w_transfer: float = option(0.1, "weight of the transfer term, finite and >= 0",
                               group="--method anneal")
    w_mismatch: float = option(0.1, "weight of the pipeline-mismatch term, finite and >= 0",
                               group="--method anneal")


def configure(parser) -> None:
    add_options(parser, SearchConfig)


def calibration_videos(profile) -> tuple[list[int], list[int]]:
    """(labels, seeds) of the profile's videos, seed-major (every prompt of the first seed,
    then the next seed)."""
    seeds, prompts = profile.meta["seeds"], profile.meta["prompts"]
    return ([int(p) for _ in seeds for p in prompts], [int(s) for s in seeds for _ in prompts])


def checked_search_steps(profile_path, skip: float, *, cooldown: int = SearchConfig.cooldown,
                         workers: int = SearchConfig.workers,
                         prune_videos: int = SearchConfig.prune_videos,
                         finalists: int = SearchConfig.finalists,
                         refs_dir: str | Path | None = "build/refs",
                         target: str | None = SearchConfig.target,
                         max_latency_s: float | str | None = None,
                         log=print) -> tuple[SearchReport, dict]:
    """:func:`search_steps` for the shipped model on the profile file after ``coda schedule
    search``'s checks; the calibration videos' full-compute videos are kept in ``refs_dir``
    (:func:`full_videos`). Returns (the report, the ``info`` saved beside the schedule). Raises
    ValueError naming the flag or the file (a profile of another model, a skip no whole-step
    plan reaches)."""
    from coda.host.model.dit import load_model
    from coda.experiments.profile import Profile, model_hash

    if not 0.0 < skip < 1.0:
        raise ValueError(f"--skip {skip}: expected a fraction in (0, 1)")
    for flag, value, lo in (("--workers", workers, 0), ("--prune-videos", prune_videos, 1),
                            ("--finalists", finalists, 1), ("--cooldown", cooldown, 1)):
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
    model, _ = load_model()
    prof.check_for(model_hash(model), what=f"--profile {profile_path}")
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
    rep = search_steps(prof, model, skip, labels=labels, seeds=seeds, full=full,
                       prune_videos=prune_videos, finalists=finalists, workers=workers,
                       cooldown=cooldown, guidance_scale=guidance, target=target,
                       max_latency_s=budget, log=log)
    rollouts = [c for c in rep.candidates for r in ("round1", "round2") if r in c]
    info = {"model_hash": prof.meta.get("model_hash"), "profile": str(profile_path),
            "profile_seeds": prof.meta.get("seeds"), "target_skip": skip, "method": "steps",
            "plan": rep.plan.describe(), "plan_label": rep.plan.label,
            "target": target, "max_latency_s": budget,
            "latency_budget": "uniform" if max_latency_s == "uniform" else budget,
            "always": list(rep.plan.always), "cooldown": cooldown,
            "calibration": {"prompts": prof.meta.get("prompts"), "seeds": prof.meta.get("seeds"),
                            "videos": len(labels), "guidance_scale": guidance,
                            "prune_videos": prune_videos, "finalists": finalists},
            "search_s": round(rep.seconds + full_s, 1), "full_compute_s": round(full_s, 1),
            "rollouts": len(rollouts), "workers": workers,
            "candidates": [{k: v for k, v in c.items()} for c in rep.candidates]}
    return rep, info


def main(args) -> int:
    from rich.console import Console

    from coda.experiments.search import checked_anneal
    from coda.host.cache.shipped import save_schedule
    from coda.paths import check_output_path

    out = check_output_path(args.out, "--out")
    console = Console()
    if args.method == "anneal":
        res, info = checked_anneal(args.profile, args.skip, seed=args.seed, moves=args.moves,
                                   cooldown=args.cooldown, w_transfer=args.w_transfer,
                                   w_mismatch=args.w_mismatch)
        info["method"] = "anneal"
        out.parent.mkdir(parents=True, exist_ok=True)
        save_schedule(out, res.schedule, info)
        t, r = res.terms, res.reference
        console.print(f"schedule {res.schedule.name} -> {out}  ({res.seconds:.1f} s, "
                      f"{res.moves} moves, {res.accepted} accepted)")
        console.print(f"  skip {t['skip']:.4f} | quality proxy {t['quality']:.3f} (uniform "
                      f"{r['quality']:.3f}) | segments {t['segments']} ({r['segments']}) | "
                      f"pcie bytes {t['pcie_bytes']} ({r['pcie_bytes']}) | transfer "
                      f"{t['transfer_s'] * 1e3:.3f} ms ({r['transfer_s'] * 1e3:.3f}) | mismatch "
                      f"{t['mismatch_s'] * 1e3:.3f} ms ({r['mismatch_s'] * 1e3:.3f}) | cost "
                      f"{res.cost:.4f} (uniform 1 + {args.w_transfer:g} + {args.w_mismatch:g})")
        return 0
    rep, info = checked_search_steps(args.profile, args.skip, cooldown=args.cooldown,
                                     workers=args.workers, prune_videos=args.prune_videos,
                                     finalists=args.finalists, target=args.target,
                                     max_latency_s=args.latency, log=console.print)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_schedule(out, rep.schedule, info)
    console.print(f"schedule {rep.schedule.name} -> {out}  ({info['search_s']:.0f} s, "
                  f"{info['rollouts']} rollouts)")
    for c in sorted(rep.candidates, key=lambda c: -c["round1"]["psnr_db"]):
        r2 = f" | all {c['round2']['psnr_db']:.2f} dB" if "round2" in c else ""
        lat = f" | f {c['modelled']['latency_s']:.0f} s" if "modelled" in c else ""
        front = " | Pareto" if c.get("pareto") else ""
        console.print(f"  {c['label']:<24} always {'+'.join(c['always']) or '-':<10} skip "
                      f"{c['skip']:.3f} | segments {c['segments_per_video']}{lat} | round 1 "
                      f"{c['round1']['psnr_db']:.2f} dB{r2}{front}")
    console.print(f"  chosen: {rep.plan.label}, {rep.plan.describe()}")
    return 0
