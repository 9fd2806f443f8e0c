"""What the commands that calibrate a block of schedule files share (``coda schedule
forecast``, :mod:`coda.experiments.forecast_calibration`; ``coda schedule dra``,
:mod:`coda.experiments.dra_calibration`): their options, and loading the shipped model, the
files' schedules and the profile whose prompts and seeds are the calibration videos."""

from __future__ import annotations

from dataclasses import dataclass

from coda.options import option

__all__ = ["ScheduleFilesConfig", "load_for_calibration"]


@dataclass(frozen=True)
class ScheduleFilesConfig:
    """The options of a command that writes a block into schedule files, with defaults."""
    schedule: tuple = option(None, "schedule JSONs (of coda schedule search), all of one step "
                             "count; each file's block is written in place", type=str,
                             metavar="FILE", nargs="+", required=True)
    profile: str = option(None, "profile.npz whose prompts and seeds are the calibration "
                          "videos", type=str, metavar="FILE",
                          default_text="the shipped one, 50 steps")
    guidance: float = option(None, "CFG scale, finite and >= 0", type=float,
                             default_text="the model's default")
    threads: int = option(2, "torch CPU threads")


def load_for_calibration(cfg: ScheduleFilesConfig):
    """(the model the profile was made with, path -> its :class:`coda.host.cache.schedule.Schedule`, the
    :class:`coda.host.cache.profile.Profile`, its path, the CFG scale) for ``cfg``, after
    setting torch's CPU threads. Raises ValueError: a guidance that is not finite and >= 0,
    threads < 1, a schedule file of another model, layer count or step count than the
    first's, a profile of another model or step count (each naming the file)."""
    import torch

    from coda.host.cache.profile import Profile, model_hash
    from coda.host.model.sample import check_guidance
    from coda.host.cache.shipped import SHIPPED_PROFILE, load_schedule
    from coda.host.model.choice import load_profiled
    from coda.host.model.sample import DEFAULT_GUIDANCE

    guidance = DEFAULT_GUIDANCE if cfg.guidance is None else cfg.guidance
    check_guidance(guidance)
    if cfg.threads < 1:
        raise ValueError(f"--threads {cfg.threads}: expected >= 1")
    torch.set_num_threads(cfg.threads)
    profile_path = cfg.profile or SHIPPED_PROFILE
    profile = Profile.load(profile_path)
    model = load_profiled(profile.meta, f"--profile {profile_path}")   # the model it profiled
    mhash, layers = model_hash(model), len(model.transformer.transformer_blocks)
    scheds = {}
    for path in cfg.schedule:
        steps = next(iter(scheds.values())).num_steps if scheds else None
        scheds[path] = load_schedule(path, model_id=mhash, num_layers=layers, num_steps=steps)
    steps = next(iter(scheds.values())).num_steps
    profile.check_for(mhash, steps, layers, what=f"--profile {profile_path}")
    return model, scheds, profile, profile_path, guidance
