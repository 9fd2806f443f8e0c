"""Prompt adherence, identity and motion of the shipped video DiT: ``coda model eval``.

Full-compute CFG generations of ``per_digit`` videos of every digit 0..9 (initial-noise
seeds ``seed_base + i``; the default base, 10**6, is far from the noise seeds of
:mod:`.sample` and the demo, and generation seeds never enter training, which draws its noise
from one ``torch.Generator`` seeded by ``--seed``) are classified frame by frame with
:func:`.classifier.digit_classifier`. Figures: :func:`video_figures`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from coda.jsonout import json_text
from coda.paths import write_file
from coda.options import add_options, option

from .classifier import digit_classifier, frame_features
from .data import NUM_CLASSES, moving_digits
from .dit import MODELS
from .sample import DEFAULT_ETA, DEFAULT_GUIDANCE, DEFAULT_STEPS

__all__ = ["DEFAULT_SEED_BASE", "centroid_steps", "video_figures", "ink_centroids", "fitted_velocity",
           "nearest_direction", "prompt_figures", "motion_range", "evaluate", "ModelEvalConfig",
           "configure", "main"]

DEFAULT_SEED_BASE = 1_000_000
MOTION_REFERENCE_VIDEOS = 400
MOTION_REFERENCE_SEED = 21


def centroid_steps(videos: torch.Tensor) -> torch.Tensor:
    """Frame-to-frame distance of the ink's centre of mass.

    Args:
        videos: float [B, 1, F, H, W] in [-1, 1] (-1 = no ink), F >= 2.
    Returns:
        float32 [B, F - 1] in pixels (0 where a frame has no ink).
    Raises:
        ValueError: not 5-D with one channel and at least 2 frames.
    """
    if videos.ndim != 5 or videos.shape[1] != 1 or videos.shape[2] < 2:
        raise ValueError(f"videos shape {tuple(videos.shape)}: expected [B, 1, F>=2, H, W]")
    ink = ((videos[:, 0].detach().float().cpu() + 1) / 2).clamp(0, 1)
    mass = ink.sum(dim=(2, 3)).clamp_min(1e-6)
    h, w = ink.shape[-2:]
    rows = (ink.sum(3) * torch.arange(h, dtype=torch.float32)).sum(2) / mass
    cols = (ink.sum(2) * torch.arange(w, dtype=torch.float32)).sum(2) / mass
    return torch.hypot(rows.diff(dim=1), cols.diff(dim=1))


def motion_range(frames: int = 8, size: int = 32, digit_size: int = 16) -> tuple[float, float]:
    """2.5 % and 97.5 % quantiles (pixels) of the per-video median centroid step of
    :data:`MOTION_REFERENCE_VIDEOS` training-data videos (seed :data:`MOTION_REFERENCE_SEED`)."""
    videos, _ = moving_digits(MOTION_REFERENCE_VIDEOS, MOTION_REFERENCE_SEED, frames=frames,
                              size=size, digit_size=digit_size)
    med = centroid_steps(videos).median(dim=1).values.numpy()
    return float(np.quantile(med, 0.025)), float(np.quantile(med, 0.975))


def video_figures(videos: torch.Tensor, labels: torch.Tensor,
                  motion: tuple[float, float] | None = None) -> dict:
    """The figures of ``coda model eval`` for given videos.

    - ``label_accuracy``: fraction of all frames whose classified digit is the video's label,
      and the same per digit (``per_digit_accuracy``);
    - ``identity_kept``: fraction of videos whose classified digit is the same in every frame
      (``identity_correct``: ... and that digit is the label);
    - motion: the digit's intensity-weighted centroid per frame; a video *moves like the data*
      when its median frame-to-frame centroid step lies inside the 2.5 %..97.5 % range of the
      same statistic on training-data videos (``motion_in_range``); ``median_step_px`` of the
      generations and of the data are reported beside it.

    Args:
        videos: float [B, 1, F, H, W] in [-1, 1].
        labels: int64 [B] digits 0..9.
        motion: (low, high) pixels of :func:`motion_range`; computed when None.
    Returns:
        dict of floats (fractions in [0, 1], pixels) and ``per_digit_accuracy`` (10 floats,
        NaN for a digit without videos), ``predicted`` (int [B][F]).
    Raises:
        ValueError: mismatched shapes.
    """
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if videos.ndim != 5 or labels.shape[0] != videos.shape[0]:
        raise ValueError(f"videos {tuple(videos.shape)}, labels {tuple(labels.shape)}: expected "
                         f"[B, 1, F, H, W] and [B]")
    pred = digit_classifier().predict_frames(videos)                     # [B, F]
    lab = labels.numpy()[:, None]
    right = pred == lab
    same = (pred == pred[:, :1]).all(axis=1)
    per_digit = [float(right[labels.numpy() == d].mean()) if (labels.numpy() == d).any()
                 else float("nan") for d in range(NUM_CLASSES)]
    if motion is None:
        motion = motion_range(videos.shape[2], videos.shape[-1])
    med = centroid_steps(videos).median(dim=1).values.numpy()
    return {
        "label_accuracy": float(right.mean()),
        "per_digit_accuracy": per_digit,
        "min_digit_accuracy": float(np.nanmin(per_digit)),
        "identity_kept": float(same.mean()),
        "identity_correct": float((same & right[:, 0]).mean()),
        "motion_in_range": float(((med >= motion[0]) & (med <= motion[1])).mean()),
        "median_step_px": float(np.median(med)),
        "data_step_range_px": [motion[0], motion[1]],
        "predicted": pred.tolist(),
    }


def ink_centroids(videos: torch.Tensor) -> torch.Tensor:
    """The ink's centre of mass per frame, float32 [B, F, 2] (row, col) in pixels, for videos
    float [B, 1, F, H, W] in [-1, 1] (the frame centre where a frame has no ink)."""
    if videos.ndim != 5 or videos.shape[1] != 1:
        raise ValueError(f"videos shape {tuple(videos.shape)}: expected [B, 1, F, H, W]")
    ink = ((videos[:, 0].detach().float().cpu() + 1) / 2).clamp(0, 1)
    h, w = ink.shape[-2:]
    mass = ink.sum(dim=(2, 3))
    rows = (ink.sum(3) * torch.arange(h, dtype=torch.float32)).sum(2)
    cols = (ink.sum(2) * torch.arange(w, dtype=torch.float32)).sum(2)
    centre = torch.tensor([(h - 1) / 2, (w - 1) / 2])
    out = torch.stack([rows, cols], dim=-1) / mass.clamp_min(1e-6)[..., None]
    return torch.where((mass > 1e-6)[..., None], out, centre)


def fitted_velocity(centroids: torch.Tensor) -> torch.Tensor:
    """Least-squares slope of positions over frames: float32 [B, 2] pixels per frame of
    centroids [B, F, 2] (F >= 2)."""
    f = torch.arange(centroids.shape[1], dtype=torch.float32)
    f = f - f.mean()
    return (centroids * f[None, :, None]).sum(1) / f.square().sum()


def nearest_direction(velocity: torch.Tensor, still_px: float = 0.25) -> list[str | None]:
    """The :data:`~coda.host.model.prompts.DIRECTIONS` key closest in angle to each velocity
    [B, 2] (row, col); None below ``still_px`` pixels per frame."""
    from .prompts import DIRECTIONS

    names = list(DIRECTIONS)
    units = torch.tensor([DIRECTIONS[n] for n in names])
    cos = velocity @ units.T / velocity.norm(dim=1, keepdim=True).clamp_min(1e-9)
    best = cos.argmax(dim=1).tolist()
    return [names[k] if float(velocity[i].norm()) >= still_px else None
            for i, k in enumerate(best)]


def prompt_figures(videos: torch.Tensor, specs) -> dict:
    """Prompt adherence of videos generated for prompt specs (:mod:`.prompts`).

    - ``digit_accuracy``: fraction of named digits recognised by the frame classifier: a
      single digit once per frame; each of two digits drifting apart in the last frame, on
      its half of it (left for the first-named digit);
    - ``direction_accuracy``: a single moving digit: the direction of the least-squares
      velocity of its ink centroid is the prompt's (nearest of the eight, at least 0.25
      pixels per frame); two digits: the left half's centroid moves left and the right
      half's moves right, by at least 0.25 pixels per frame each;
    - ``speed_accuracy`` (single moving digits): the fitted speed is nearer the prompt's
      speed (:data:`~coda.host.model.prompts.SPEEDS`) than the other speed;
    - ``identity_kept`` (single digits): the classified digit is the same in every frame.

    Args:
        videos: float [B, 1, F, H, W] in [-1, 1], F >= 2.
        specs: B ``PromptSpec`` with digits.
    Returns:
        dict of the four fractions, the counts they are over (``digits_named``,
        ``moving_single``, ``pairs``), and ``per_video`` (a dict per video).
    Raises:
        ValueError: mismatched lengths, F < 2, a spec without digits.
    """
    from .prompts import SPEEDS

    specs = list(specs)
    if videos.ndim != 5 or videos.shape[0] != len(specs) or videos.shape[2] < 2:
        raise ValueError(f"videos {tuple(videos.shape)}, {len(specs)} specs: expected "
                         "[B, 1, F>=2, H, W] and B specs")
    if any(not s.digits for s in specs):
        raise ValueError("a spec without digits: expected prompts that name a digit")
    clf = digit_classifier()
    w = videos.shape[-1]
    per_video, hits, named = [], 0, 0
    for i, spec in enumerate(specs):
        v = videos[i:i + 1]
        row: dict = {"prompt": spec.text}
        if len(spec.digits) == 2:
            last = v[:, 0, -1]
            halves = [last[..., : w // 2], last[..., w // 2:]]
            got = [int(clf.svc.predict(frame_features(h))[0]) for h in halves]
            row["digits"] = got
            hits += sum(g == d for g, d in zip(got, spec.digits))
            named += 2
            left = fitted_velocity(ink_centroids(v[..., : w // 2]))[0, 1]
            right = fitted_velocity(ink_centroids(v[..., w // 2:]))[0, 1]
            row["direction_ok"] = bool(left <= -0.25 and right >= 0.25)
        else:
            pred = clf.predict_frames(v)[0]
            row["digits"] = pred.tolist()
            hits += int((pred == spec.digits[0]).sum())
            named += len(pred)
            row["identity_kept"] = bool((pred == pred[0]).all())
            if spec.direction is not None:
                vel = fitted_velocity(ink_centroids(v))
                row["direction_ok"] = nearest_direction(vel)[0] == spec.direction
                speed = float(vel.norm())
                nearest = min(SPEEDS, key=lambda k: abs(SPEEDS[k] - speed))
                row["speed_px"] = speed
                row["speed_ok"] = nearest == spec.speed
        per_video.append(row)

    def fraction(key: str) -> float:
        vals = [r[key] for r in per_video if key in r]
        return float(np.mean(vals)) if vals else float("nan")

    return {"digit_accuracy": hits / named, "direction_accuracy": fraction("direction_ok"),
            "speed_accuracy": fraction("speed_ok"), "identity_kept": fraction("identity_kept"),
            "digits_named": named, "moving_single": sum("speed_ok" in r for r in per_video),
            "pairs": sum(len(s.digits) == 2 for s in specs), "per_video": per_video}


def text_diagnostics(model, per_digit: int, guidance_scale: float, num_steps: int,
                     seed_base: int, eta: float) -> dict:
    """Where a text model's digit errors come from, apart from motion.

    - ``still_digit_accuracy``: single frames of the still prompts ``a zero`` .. ``a nine``
      (``per_digit`` each, noise seeds ``seed_base + i``), classified;
    - ``digit_word_cosine_max``: the largest cosine similarity between the text encoder's
      outputs at the digit word of two different still prompts (1 = two digit words the
      DiT cannot tell apart).
    """
    from .prompts import PromptSpec, tokenize
    from .sample import generate

    stills = [PromptSpec((d,)) for d in range(NUM_CLASSES) for _ in range(per_digit)]
    frames = generate(model, stills, num_steps=num_steps, guidance_scale=guidance_scale,
                      seed=seed_base, eta=eta, frames=1)
    pred = digit_classifier().predict_frames(frames)[:, 0]
    with torch.no_grad():
        seq, _ = model.text_encoder(tokenize([PromptSpec((d,)) for d in range(NUM_CLASSES)]))
    words = torch.nn.functional.normalize(seq[:, 1], dim=1)
    cos = (words @ words.T)[~torch.eye(NUM_CLASSES, dtype=torch.bool)]
    return {"still_digit_accuracy": float(np.mean(pred == [s.digits[0] for s in stills])),
            "digit_word_cosine_max": float(cos.max())}


def evaluate(model, per_digit: int = 5, guidance_scale: float | None = None,
             num_steps: int | None = None, seed_base: int = DEFAULT_SEED_BASE,
             eta: float | None = None) -> dict:
    """Generate ``10 * per_digit`` videos (full compute) and measure them.

    Args:
        model: :class:`.dit.DigitLatte` (videos of every digit, :func:`video_figures`) or
            :class:`.dit.TextLatte` (``10 * per_digit`` prompts drawn by
            :func:`.prompts.random_specs` from ``seed_base``, :func:`prompt_figures`), in eval
            mode.
        per_digit: videos per digit (>= 1).
        guidance_scale, num_steps, eta: CFG scale, DDIM steps and DDIM eta (default:
            :mod:`.sample`'s).
        seed_base: initial-noise seed of the first video; video i uses ``seed_base + i``.
    Returns:
        :func:`video_figures`' dict (a text model: :func:`prompt_figures`' and
        :func:`text_diagnostics`') plus ``videos``, ``guidance_scale``, ``steps``,
        ``generate_s`` (wall seconds).
    Raises:
        ValueError: per_digit < 1 (and whatever :func:`.sample.generate` raises).
    """
    from .sample import DEFAULT_ETA, DEFAULT_GUIDANCE, DEFAULT_STEPS, generate

    if per_digit < 1:
        raise ValueError(f"per_digit={per_digit}: expected >= 1")
    guidance_scale = DEFAULT_GUIDANCE if guidance_scale is None else float(guidance_scale)
    num_steps = DEFAULT_STEPS if num_steps is None else int(num_steps)
    eta = DEFAULT_ETA if eta is None else float(eta)
    data = model.config["data"]
    if model.config.get("conditioning") == "text":
        from .prompts import random_specs

        specs = random_specs(NUM_CLASSES * per_digit, torch.Generator().manual_seed(seed_base),
                             data.get("pair_fraction", 0.0))
        start = time.perf_counter()
        videos = generate(model, specs, num_steps=num_steps, guidance_scale=guidance_scale,
                          seed=seed_base, eta=eta)
        wall = time.perf_counter() - start
        return {"videos": len(specs), "guidance_scale": guidance_scale, "steps": num_steps,
                "eta": eta, "seed_base": seed_base, **prompt_figures(videos, specs),
                **text_diagnostics(model, per_digit, guidance_scale, num_steps, seed_base, eta),
                "generate_s": wall}
    labels = torch.arange(NUM_CLASSES).repeat_interleave(per_digit)
    start = time.perf_counter()
    videos = generate(model, labels, num_steps=num_steps, guidance_scale=guidance_scale,
                      seed=seed_base, eta=eta)
    wall = time.perf_counter() - start
    figures = video_figures(videos, labels, motion_range(data["frames"], data["size"],
                                                         data["digit_size"]))
    return {"videos": len(labels), "guidance_scale": guidance_scale, "steps": num_steps, "eta": eta,
            "seed_base": seed_base, **figures, "generate_s": wall}


@dataclass(frozen=True)
class ModelEvalConfig:
    """Every option of ``coda model eval`` with its default (the one source of them; the
    sampler's settings are None unless given: :func:`evaluate` takes :mod:`.sample`'s)."""
    per_digit: int = option(5, "videos per digit 0..9, >= 1")
    guidance: float = option(None, "CFG scale", type=float,
                             default_text=f"{DEFAULT_GUIDANCE:g}; coda.host.model.sample.DEFAULT_GUIDANCE")
    steps: int = option(None, "DDIM steps", type=int,
                        default_text=f"{DEFAULT_STEPS}; coda.host.model.sample.DEFAULT_STEPS")
    eta: float = option(None, "DDIM eta (1 = ancestral, better prompt adherence)", type=float,
                        default_text=f"{DEFAULT_ETA:g}; coda.host.model.sample.DEFAULT_ETA")
    seed_base: int = option(DEFAULT_SEED_BASE, "initial-noise seed of the first video; video i "
                            "uses seed_base + i", source="far from the seeds of the demo and "
                            "of training")
    model: str = option("digits", "which shipped model (text: 10 x --per-digit random prompts)",
                        choices=tuple(MODELS))
    weights: Path = option(None, "the model's weights (safetensors)", type=Path,
                           default_text="the --model's shipped file")
    config: Path = option(None, "the model's configuration (JSON)", type=Path,
                          default_text="the JSON file beside --weights")
    threads: int = option(1, "torch CPU threads")
    json: Path = option(None, "also write the report here", type=Path)


#: the configuration ``coda model eval`` hands to :func:`main` (coda.cli)
CONFIG = ModelEvalConfig


def configure(parser) -> None:
    """Options of ``coda model eval``: :class:`ModelEvalConfig`."""
    add_options(parser, ModelEvalConfig)


def main(cfg: ModelEvalConfig) -> int:
    """Print the JSON report of :func:`evaluate` for the shipped (or a given) model, as
    ``cfg`` says (what the command line gave, or a :class:`ModelEvalConfig` built in Python,
    e.g. ``main(ModelEvalConfig(per_digit=1))``). Bad options: ValueError before any
    generation (``coda: error:``, exit 2)."""
    from coda.paths import check_output_path

    from .dit import load_model

    if cfg.per_digit < 1:
        raise ValueError(f"--per-digit {cfg.per_digit}: expected >= 1")
    if cfg.threads < 1:
        raise ValueError(f"--threads {cfg.threads}: expected >= 1")
    json_path = None if cfg.json is None else Path(cfg.json)
    if json_path is not None:
        check_output_path(json_path, "--json")
    torch.set_num_threads(cfg.threads)
    default_weights = MODELS[cfg.model].weights
    weights = Path(cfg.weights) if cfg.weights is not None else default_weights
    config = Path(cfg.config) if cfg.config is not None else weights.with_suffix(".json")
    model, _ = load_model(weights=weights, config=config)
    report = evaluate(model, cfg.per_digit, cfg.guidance, cfg.steps, cfg.seed_base, cfg.eta)
    report["weights"] = str(weights)
    text = json_text({k: v for k, v in report.items() if k not in ("predicted", "per_video")},
                     indent=2)
    print(text)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        write_file(json_path, json_text(report, indent=2) + "\n")
    return 0
