"""Which videos a schedule loses, and why: the schedule against its two halves, per video.

For a schedule of the shipped model (e.g. a shipped CODA schedule) and a set of videos, the
per-video PSNR against full compute of three cached generations:

- ``schedule``: the schedule as it is;
- ``constant only``: only the operators it reuses at *every* step from step 1 on (the
  profile's constant types, e.g. the digit model's cross attention), nothing else: the cost
  of the cache format's rounding of an output that never changes;
- ``constant from K``: the same from step K on (K = the schedule's first reused step, and 10);
- ``steps only``: the schedule without those always-reused operators outside its reused steps.

A video on which ``constant only`` already loses most of what ``schedule`` loses is fragile:
its trajectory amplifies a perturbation too small to matter elsewhere, so no step computed
later (a DRA fallback) brings it back. Usage (2 threads, about 1 min per 10 videos per
variant on a 2-core machine)::

    .venv/bin/python scripts/fragile_videos.py \\
        --schedule host/cache/schedules/coda_latte_digits_50_skip0.5.json \\
        --prompts 0-9 --seeds 0-1 --out build/fragile/coda-0.5.json

Writes JSON (videos, variants, per-video PSNR dB) and prints a table.
"""

from __future__ import annotations

import json
from pathlib import Path

import schedule_videos


def main(argv=None) -> int:

    from coda.experiments.metrics import psnr_db
    from coda.experiments.rollouts import full_videos, rollout
    from coda.host.cache.schedule import BRANCHES, Schedule

    args = schedule_videos.parser(__doc__, "0-1").parse_args(argv)
    model, sched, labels, video_seeds = schedule_videos.load(args)
    steps = range(1, sched.num_steps)
    const = frozenset.intersection(*(sched.reused(s, b) for s in steps for b in BRANCHES))
    reused = [s for s in steps if any(sched.reused(s, b) - const for b in BRANCHES)]

    def variant(keep_const_from: int, with_steps: bool) -> Schedule:
        reuse = {}
        for s in steps:
            for b in BRANCHES:
                refs = (sched.reused(s, b) if with_steps and s in reused else frozenset()) | (
                    const if s >= keep_const_from else frozenset())
                if refs:
                    reuse[(s, b)] = refs
        return Schedule(sched.num_steps, sched.num_layers, reuse, "variant", sched.ops)

    never = sched.num_steps
    variants = {"schedule": sched, "constant only": variant(1, False)}
    for k in dict.fromkeys([min(reused), 10]):
        variants[f"constant from {k}"] = variant(k, False)
    variants["steps only"] = variant(never, True)
    full = full_videos(model, labels, video_seeds, num_steps=args.steps,
                       guidance_scale=args.guidance, cache_dir="build/refs")
    out = {"schedule": str(args.schedule), "constant": sorted(map(list, const)),
           "reused_steps": reused,
           "videos": [{"prompt": p, "seed": s} for p, s in zip(labels, video_seeds)],
           "psnr_db": {}}
    for name, sc in variants.items():
        v = rollout(model, sc, labels, video_seeds, num_steps=args.steps,
                    guidance_scale=args.guidance)
        out["psnr_db"][name] = [psnr_db(v[i:i + 1], full[i:i + 1]) for i in range(len(labels))]
        print(f"{name:>18}: " + " ".join(f"{x:5.1f}" for x in out["psnr_db"][name]),
              flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
