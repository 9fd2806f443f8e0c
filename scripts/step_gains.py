"""What computing a schedule's reused steps is worth, per video: the measurement behind step
DRA's budget (:func:`coda.experiments.dra_calibration.fallback_rates`).

For a schedule of the shipped model, its reused steps (those where it reuses the first
operator) in groups of ``--group`` consecutive ones; for each group, the schedule with that
group computed (both branches, every operator), rolled out on the videos (Ray tasks, the
search's judge, :func:`coda.experiments.rollouts.judge`) and scored per video against full
compute. Prints, per group, the mean PSNR gain on the quarter of the videos the schedule
loses most, on the others and on all. ``--branch cond`` / ``uncond`` computes the group in
that CFG branch only (the other reuses as scheduled); ``--groups K`` keeps the first K
groups. ``--probes output,accel`` also runs the schedule with step DRA's probes (no
fallback) and prints, per probe and step of each group, how well the probe ranks the videos
by that group's gain (Spearman) and the mean gain of the quarter it ranks highest: what a
budget spent on that step buys with that probe. Usage (6 min 46 s for 16 groups of 20
videos on a 2-core machine)::

    .venv/bin/python scripts/step_gains.py \\
        --schedule host/cache/schedules/coda_latte_digits_50_skip0.7.json \\
        --prompts 0-9 --seeds 100-101 --group 2 --out build/gains/coda-0.7.json

Writes JSON (groups, the videos, per-video PSNR dB of the schedule and of each variant;
with ``--probes`` the probe values, probe -> step -> one per video).
"""

from __future__ import annotations

import json
from pathlib import Path

import schedule_videos


def main(argv=None) -> int:
    import numpy as np

    from coda.experiments.metrics import worst_quarter
    from coda.experiments.rollouts import full_videos, judge
    from coda.host.cache.schedule import BRANCHES, Schedule

    ap = schedule_videos.parser(__doc__, "100-101")
    ap.add_argument("--group", type=int, default=2, help="reused steps per variant (>= 1)")
    ap.add_argument("--groups", type=int, default=None,
                    help="only the first K groups (default: all)")
    ap.add_argument("--branch", choices=("both", *BRANCHES), default="both",
                    help="the CFG branches a variant computes its group in (default both)")
    ap.add_argument("--workers", type=int, default=2, help="Ray workers")
    ap.add_argument("--probes", default="",
                    help="step DRA probes to rank the videos by, e.g. output,accel")
    args = ap.parse_args(argv)
    from coda.host.cache.policies.dra import PROBES

    probes = [p for p in args.probes.split(",") if p]
    bad = [p for p in probes if p not in PROBES]
    if bad:
        ap.error(f"--probes {args.probes}: {bad[0]!r} is not one of {', '.join(PROBES)}")
    if args.group < 1:
        ap.error(f"--group {args.group}: expected >= 1")
    if args.groups is not None and args.groups < 1:
        ap.error(f"--groups {args.groups}: expected >= 1")
    computed = BRANCHES if args.branch == "both" else (args.branch,)
    model, sched, labels, video_seeds = schedule_videos.load(args)
    first = sched.order()[0]
    reused = [s for s in range(sched.num_steps)
              if any(first in sched.reused(s, b) for b in BRANCHES)]
    groups = [reused[i:i + args.group] for i in range(0, len(reused), args.group)]
    groups = groups[:args.groups]

    def computing(steps) -> Schedule:
        reuse = {(s, b): sched.reused(s, b) for s in range(sched.num_steps) for b in BRANCHES
                 if not (s in steps and b in computed) and sched.reused(s, b)}
        return Schedule(sched.num_steps, sched.num_layers, reuse, f"compute {steps}", sched.ops)

    full = full_videos(model, labels, video_seeds, num_steps=args.steps,
                       guidance_scale=args.guidance, cache_dir="build/refs")
    res = judge([sched] + [computing(set(g)) for g in groups], labels, video_seeds, full,
                num_steps=args.steps, guidance_scale=args.guidance, workers=args.workers)
    base = np.array(res[0]["per_video_psnr_db"])
    worst = worst_quarter(base)
    rest = np.setdiff1d(np.arange(len(base)), worst)
    print(f"computed in {args.branch} branch{'es' if args.branch == 'both' else ''}")
    print(f"{'computed steps':>16} | gain, worst quarter (dB) | gain, the others (dB) | "
          "gain, all (dB)")
    for g, r in zip(groups, res[1:]):
        d = np.array(r["per_video_psnr_db"]) - base
        others = f"{d[rest].mean():+21.2f}" if len(rest) else f"{'-':>21}"
        print(f"{str(g):>16} | {d[worst].mean():+24.2f} | {others} | {d.mean():+14.2f}")
    out = {"schedule": str(args.schedule), "branch": args.branch, "groups": groups,
           "videos": [{"prompt": p, "seed": s} for p, s in zip(labels, video_seeds)],
           "psnr_db": {"schedule": base.tolist(),
                       **{str(g): r["per_video_psnr_db"] for g, r in zip(groups, res[1:])}}}
    if probes:
        gains = {tuple(g): np.array(r["per_video_psnr_db"]) - base
                 for g, r in zip(groups, res[1:])}
        out["probes"] = ranking(model, sched, labels, video_seeds, probes, gains, args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def ranking(model, sched, labels, video_seeds, probes, gains: dict, args) -> dict:
    """Run ``sched`` with each of step DRA's ``probes`` (no thresholds: it never falls back)
    on the videos; print, per group of ``gains`` (group -> per-video gain, dB) and per step of
    it, the Spearman correlation of the probe with the gain and the mean gain of the quarter
    of the videos with the highest probe. Returns probe -> step -> value per video."""
    import numpy as np
    from scipy.stats import spearmanr

    from coda.experiments.dra_calibration import probe_values
    from coda.experiments.rollouts import torch_driver

    prompts, seeds = list(dict.fromkeys(labels)), list(dict.fromkeys(video_seeds))
    assert labels == [p for _ in seeds for p in prompts], "videos are every prompt x seed"
    def driver(videos: int):
        return torch_driver(model, videos, inputs=True)

    values = {p: probe_values(model, sched, prompts, seeds, num_steps=args.steps,
                              guidance_scale=args.guidance, driver_factory=driver, probe=p)
              for p in probes}    # per step, one per video, seed-major as the rollouts
    top = max(1, len(labels) // 4)
    print(f"{'computed steps':>16} | {'probe':>6} | step | Spearman with the gain | "
          "gain of its top quarter (dB)")
    for g, gain in gains.items():
        for p in probes:
            for step in g:
                v = np.array(values[p].get(step, []))
                if len(v) != len(gain):     # not probed there (before the history)
                    continue
                rho = spearmanr(v, gain).statistic
                print(f"{str(list(g)):>16} | {p:>6} | {step:4d} | {rho:+22.2f} | "
                      f"{gain[np.argsort(-v)[:top]].mean():+28.2f}")
    return {p: {str(s): v for s, v in vals.items()} for p, vals in values.items()}


if __name__ == "__main__":
    raise SystemExit(main())
