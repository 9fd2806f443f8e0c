"""The judge of ``coda schedule search``
(:mod:`coda.experiments.search`): candidate schedules rolled out as cached generations
of the calibration videos and scored against their full-compute videos (PSNR over the set,
torchmetrics via :func:`coda.experiments.metrics.psnr_db`).

For the shipped model the rollouts run as Ray tasks (:func:`rollout_task` loads the model in
each worker) or in this process (:func:`judge`, ``workers=0``: the same bits); for any other
model, a :class:`coda.experiments.cfg_loop.CFGLoop` over a diffusers transformer,
:func:`loop_judge` rolls out in this process with the drivers it is given.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from coda.host.cache.schedule import Schedule
from coda.hw.nme.isa import NMEConfig
from coda.paths import atomic_write

__all__ = ["torch_driver", "rollout", "full_videos", "rollout_task", "judge", "loop_judge"]


def torch_driver(model, videos: int, *, ranks: int = 2, lanes: int = NMEConfig.lanes,
                 inputs: bool = False):
    """An :class:`coda.host.nmp.driver.NMPDriver` on the torch backend: ``ranks`` ranks of
    ``lanes``-lane NMEs (default NME units), each with room for the cache of ``videos``
    videos of ``model`` (every operator's output; with ``inputs``, the kept inputs of
    monitors too: :func:`coda.host.model.sample.cache_mem_words`)."""
    from coda.host.model.sample import cache_mem_words
    from coda.host.nme.backend import TorchBackend
    from coda.host.nmp.driver import NMPDriver

    words = cache_mem_words(model, videos, ranks, lanes, inputs=inputs)
    return NMPDriver(TorchBackend(), NMEConfig(lanes=lanes, mem_words=words), ranks=ranks)


def rollout(model, schedule: Schedule, labels, seeds, *, num_steps: int,
            guidance_scale: float, batch: int = 10, ranks: int = 2) -> torch.Tensor:
    """Cached generations of (labels[i], seeds[i]) under ``schedule`` on the torch backend,
    ``batch`` videos per generation. Returns float32 [N, 1, F, H, W]."""
    from coda.host.model.sample import cached_generate

    out = []
    for i in range(0, len(labels), batch):
        lab, sd = list(labels[i:i + batch]), list(seeds[i:i + batch])
        driver = torch_driver(model, len(lab), ranks=ranks)
        v, _ = cached_generate(model, lab, driver, schedule, num_steps=num_steps,
                               guidance_scale=guidance_scale, seeds=sd)
        out.append(v)
    return torch.cat(out)


def full_videos(model, labels, seeds, *, num_steps: int, guidance_scale: float,
                batch: int = 10, cache_dir: str | Path | None = None) -> torch.Tensor:
    """Full-compute videos of (labels[i], seeds[i]), float32 [N, 1, F, H, W].

    ``cache_dir``: keep them there in a file named by a hash of the model (its
    :func:`coda.host.cache.profile.model_hash`), the videos, steps, guidance, the torch build,
    the CPU's name and the vector ISA torch's kernels use (``get_cpu_capability``: two
    machines with the same CPU name gave different bits here), and read it back when asked
    again (the bits of a generation depend on the CPU)."""
    from coda.experiments.cfg_loop import CFGLoop, generate_videos

    path = None
    if cache_dir is not None:
        import hashlib
        import platform

        from coda.host.cache.profile import model_hash
        from coda.results import cpu_model
        ident = model_hash(model)
        if isinstance(model, CFGLoop):   # its prompts are indices into its embeddings
            ident = [ident, list(model.latent_shape), _embeddings_digest(model)]
        key = json.dumps([ident, [x if isinstance(x, str) else int(x) for x in labels],
                          [int(x) for x in seeds],
                          num_steps, float(guidance_scale), torch.__version__,
                          platform.machine(), platform.processor(), cpu_model(),
                          torch.backends.cpu.get_cpu_capability()])
        path = Path(cache_dir) / f"full-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
        if path.exists():
            return torch.load(path)
    videos = torch.cat([generate_videos(model, list(labels[i:i + batch]),
                                 seeds=list(seeds[i:i + batch]), num_steps=num_steps,
                                 guidance_scale=guidance_scale)
                        for i in range(0, len(labels), batch)])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as fh:    # writers side by side: a temporary file each
            torch.save(videos, fh)
    return videos


def _embeddings_digest(loop) -> str:
    """A digest of a :class:`CFGLoop`'s prompt embeddings (what its prompt indices mean)."""
    import hashlib

    h = hashlib.sha256()
    for pair in loop.prompts:
        for branch in pair:
            for name in sorted(branch):
                h.update(name.encode())
                h.update(branch[name].detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _score(videos: torch.Tensor, full: torch.Tensor) -> dict:
    from coda.experiments.metrics import psnr_db
    per = [psnr_db(videos[i:i + 1], full[i:i + 1]) for i in range(len(videos))]
    return {"psnr_db": psnr_db(videos, full), "per_video_psnr_db": per,
            "mean_psnr_db": float(np.mean(per))}


def rollout_task(schedule_json: str, labels, seeds, full: torch.Tensor, num_steps: int,
                 guidance_scale: float, threads: int = 1, model: dict | None = None) -> dict:
    """One candidate's rollout and score (a Ray task body; also run in-process): loads the
    shipped model ``model`` names (a profile's :func:`coda.host.model.choice.model_identity`;
    None: the digits model), generates, scores against ``full``. Returns :func:`_score`'s
    dict plus ``wall_s``."""
    from coda.host.model.choice import load_profiled

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = load_profiled(model or {}, "the profile's model")
    videos = rollout(model, Schedule.from_json(schedule_json), labels, seeds,
                     num_steps=num_steps, guidance_scale=guidance_scale)
    return {**_score(videos, full), "wall_s": time.perf_counter() - t0}


def judge(schedules: list[Schedule], labels, seeds, full: torch.Tensor, *, num_steps: int,
          guidance_scale: float, workers: int = 2, model: dict | None = None) -> list[dict]:
    """Every schedule's rollout score on the videos (labels[i], seeds[i]) against ``full``,
    in order, on the shipped model ``model`` names (:func:`rollout_task`): Ray tasks on
    ``workers`` CPUs of a local Ray (one thread each), or in this process when ``workers``
    is 0 (the same bits)."""
    args = [(s.to_json(), list(labels), list(seeds), full, num_steps, guidance_scale, 1, model)
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
        refs = [task.remote(a[0], a[1], a[2], full_ref, *a[4:]) for a in args]
        return ray.get(refs)
    finally:
        if started:
            ray.shutdown()


def loop_judge(loop, driver_factory: Callable) -> Callable:
    """A judge for :func:`coda.experiments.search.search_steps` over ``loop`` (a
    :class:`coda.experiments.cfg_loop.CFGLoop`): ``judge(schedules, labels, seeds, full, *,
    num_steps, guidance_scale, workers)`` rolls out each schedule on the videos (labels[i],
    seeds[i]) in one batch, on a fresh ``driver_factory(videos)`` each, in this process
    (``workers`` is ignored), and scores the final latents against ``full``
    (:func:`_score`, PSNR with data range 2: a fidelity ranking, not a video quality)."""
    from coda.experiments.cfg_loop import cached_videos

    def run(schedules, labels, seeds, full, *, num_steps: int, guidance_scale: float,
            workers: int = 0) -> list[dict]:
        out = []
        for sched in schedules:
            t0 = time.perf_counter()
            videos, _ = cached_videos(loop, list(labels), driver_factory(len(labels)), sched,
                                      num_steps=num_steps, guidance_scale=guidance_scale,
                                      seeds=list(seeds))
            out.append({**_score(videos, full), "wall_s": time.perf_counter() - t0})
        return out
    return run
