"""What the schedule scripts of this folder share: the options that name a schedule of the
shipped model and a set of videos, and reading them (the model, the schedule, the videos as
every prompt with every seed, seed-major). Imported by ``fragile_videos.py`` and
``step_gains.py`` (run from this folder: Python puts it first on the path)."""

from __future__ import annotations

import argparse


def parser(doc: str, seeds: str) -> argparse.ArgumentParser:
    """An argument parser with --schedule, --prompts, --seeds (default ``seeds``), --steps,
    --guidance and --out; ``doc``'s first line describes it."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--schedule", required=True, help="schedule JSON of the shipped model")
    ap.add_argument("--prompts", default="0-9", help="digits, e.g. 0-9")
    ap.add_argument("--seeds", default=seeds, help=f"seeds, e.g. {seeds}")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--out", required=True, help="JSON to write")
    return ap


def load(args):
    """(model, schedule, labels, video seeds) of parsed :func:`parser` options; 2 torch
    threads. Raises ValueError naming a bad --prompts, --seeds or schedule."""
    import torch

    from coda.host.model.sample import MAX_SEED
    from coda.lists import parse_int_list
    from coda.host.cache.shipped import load_schedule
    from coda.host.model.dit import load_model

    torch.set_num_threads(2)
    prompts = parse_int_list(args.prompts, "--prompts", 0, 9)
    seeds = parse_int_list(args.seeds, "--seeds", 0, MAX_SEED)
    model, _ = load_model()
    sched = load_schedule(args.schedule, num_steps=args.steps)
    return (model, sched, [p for _ in seeds for p in prompts],
            [s for s in seeds for _ in prompts])
