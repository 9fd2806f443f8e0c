"""``coda eval``: cache policies compared on the same engine, seeds and metrics (Pareto).

For every policy x target skip fraction, :func:`main` runs the cached CFG generations of
``prompts x seeds`` (seeds held out from the profile's) through :func:`evaluate_policy` and
compares them with full compute (skipped operators, PSNR and SSIM, prompt adherence,
segments, host-link bytes, modelled latency). Each policy is calibrated to the target on the
profile; the CODA schedule is the whole-step search's (:func:`coda_schedule`). DRA is scored
on corner cases picked after the run, its thresholds and probe chosen on the profile's own
videos, never on the held-out ones. What is measured, the corner cases and the files
written: ``docs/scheduler.md``, "How the policies compare".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coda.experiments.metrics import motion_px, psnr_db, ssim, worst_quarter
from coda.host.cache.device import DEVICES
from coda.host.model.choice import ADHERENCE, ModelOptions
from coda.hw.verilog import NMEUnitsConfig
from coda.host.model.defaults import DEFAULT_GUIDANCE, DEFAULT_STEPS
from coda.hw.nme.isa import NMEConfig
from coda.host.cache.compress import CACHE_FORMATS
from coda.host.cache.forecast import CACHE_MODES
from coda.jsonout import json_text
from coda.paths import save_figure, write_file
from coda.options import add_options, option
from coda.host.cache.policies import POLICIES, policy_names

__all__ = ["psnr_db", "ssim", "motion_px", "evaluate_policy", "pareto_plot", "POLICY_NAMES"]

#: every policy of the registry
POLICY_NAMES = tuple(POLICIES)
DEFAULT_POLICIES = ("uniform", "pab", "teacache", "coda", "coda+dra")
#: calibrated on the profile, or searched on it (the coda schedules)
_NEEDS_PROFILE = policy_names("needs_profile") + policy_names("needs_schedule")
#: the static policies whose schedules --cache forecast calibrates alphas for
FORECAST_POLICIES = policy_names("serves_forecast")


# ---------------------------------------------------------------- one policy
def evaluate_policy(model, policy, labels, seeds, full, *, num_steps, guidance_scale,
                    driver_factory, batch: int = 2, forecast=None, cache_format: str = "bf16",
                    cache_group: int | None = None) -> dict:
    """Cached generations of every (label, seed) video under ``policy``, in chunks of
    ``batch`` videos (each chunk one generation with a fresh driver), against ``full``;
    with ``forecast`` (a :class:`coda.host.cache.forecast.ForecastTable`) in forecast mode;
    cache entries in ``cache_format`` (``"bf16"`` or ``"int8"`` with ``cache_group``
    channels per scale, :mod:`coda.host.cache.compress`).

    ``model``: a shipped model or a pipeline's :class:`coda.experiments.cfg_loop.CFGLoop`
    (reuse mode, 16-bit entries). Returns a dict: videos [N, 1, F, H, W] (a loop's final
    latents), per-video PSNR, executions per video (computed,
    reused, fallbacks), totals over all generations (EventLog.stats) and ``schedules``: per
    video the :class:`coda.host.cache.schedule.Schedule` it followed (its reused operators;
    a dynamic policy's differ from video to video)."""
    from coda.host.cache.arch import model_ops
    from coda.host.cache.events import EventLog
    from coda.host.cache.schedule import Schedule
    from coda.experiments.cfg_loop import cached_videos

    log = EventLog()
    videos = []
    vid_seeds = [s for s in seeds for _ in labels]
    vid_labels = [p for _ in seeds for p in labels]
    gen_of = []
    for i in range(0, len(vid_labels), batch):
        lab, sd = vid_labels[i:i + batch], vid_seeds[i:i + batch]
        mode = {"cache": "forecast", "forecast": forecast} if forecast is not None else {}
        fmt = {"cache_format": cache_format, "cache_group": cache_group}
        driver = driver_factory(len(lab), 2 if mode else 1, **fmt)
        if fmt == {"cache_format": "bf16", "cache_group": None}:
            fmt = {}                 # the default entries: what a pipeline's loop runs
        v, _ = cached_videos(model, lab, driver, policy, events=log, num_steps=num_steps,
                             guidance_scale=guidance_scale, seeds=sd, **mode, **fmt)
        gen_of.extend((log.generations - 1, j) for j in range(len(lab)))
        videos.append(v)
    videos = torch.cat(videos)
    per_video = []
    index = {g: n for n, g in enumerate(gen_of)}
    counts = np.zeros((len(gen_of), 3), np.int64)   # computed, reused, fallback
    mon_cycles = np.zeros(len(gen_of), np.int64)
    for e in log.of("op"):
        n = index[(e.generation, e.sample)]
        counts[n, 1 if e.reused else 0] += 1
        counts[n, 2] += e.reason == "fallback"
    for e in log.of("monitor"):
        mon_cycles[index[(e.generation, e.sample)]] += e.nme_cycles
    by_video: list[list] = [[] for _ in gen_of]
    for e in log.of("op"):
        by_video[index[(e.generation, e.sample)]].append(e)
    ops = model_ops(model.transformer)
    schedules = [Schedule.from_events(ev, ops.num_layers, ops) for ev in by_video]
    for n in range(len(gen_of)):
        per_video.append({"prompt": vid_labels[n], "seed": vid_seeds[n],
                          "psnr_db": psnr_db(videos[n:n + 1], full[n:n + 1]),
                          "computed": int(counts[n, 0]), "reused": int(counts[n, 1]),
                          "fallbacks": int(counts[n, 2]),
                          "monitor_nme_cycles": int(mon_cycles[n])})
    stats = log.stats()
    mons = log.of("monitor")
    stats["monitor_nme_cycles"] = sum(m.nme_cycles for m in mons)
    stats["monitor_bytes"] = sum(m.bytes_to_nmp for m in mons)
    stats["kept_bytes"] = sum(e.kept_bytes for e in log.of("op"))
    stats["stored_bytes"] = sum(e.stored_bytes for e in log.of("op"))
    return {"videos": videos, "per_video": per_video, "stats": stats, "schedules": schedules}


def pareto_plot(rows: list[dict], path) -> None:
    """PSNR against the modelled system-f latency (the primary axis: equal latency is equal
    cost; rows without a finite one left out) and PSNR and SSIM against the achieved skip
    fraction (equal operator count), one line per policy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        timed = sorted((_latency_s(r), r["psnr_db"]) for r in mine
                       if math.isfinite(_latency_s(r)))
        if timed:
            axes[0].plot([t for t, _ in timed], [q for _, q in timed], "o-", label=name)
        pts = sorted((r["ops_skipped_fraction"], r["psnr_db"], r["ssim"]) for r in mine)
        x = [p[0] for p in pts]
        axes[1].plot(x, [p[1] for p in pts], "o-", label=name)
        axes[2].plot(x, [p[2] for p in pts], "o-", label=name)
    target = next((r["modelled"]["target"] for r in rows if "modelled" in r), "the target")
    axes[0].set_xlabel(f"modelled latency on {target}, system f (s)")
    axes[0].set_ylabel("PSNR vs full compute (dB)")
    axes[1].set_ylabel("PSNR vs full compute (dB)")
    axes[2].set_ylabel("SSIM vs full compute")
    for ax in axes[1:]:
        ax.set_xlabel("operator executions skipped (fraction)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("cache policies (held-out seeds): at equal modelled latency (left), at "
                 "equal operator count (middle, right)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def _latency_s(row: dict) -> float:
    """A row's modelled system-f latency (s); NaN where not modelled."""
    return float(row["modelled"]["latency_s"]) if "modelled" in row else math.nan


def latency_order(rows: list[dict]) -> list[dict]:
    """The rows as the tables list them: by target skip, then by modelled system-f latency
    (fastest first; not modelled, or not fitting, last), then by PSNR (best first)."""
    def key(r):
        lat = _latency_s(r)
        return (r["target_skip"], lat if math.isfinite(lat) else math.inf, -r["psnr_db"])
    return sorted(rows, key=key)


# ---------------------------------------------------------------- the command
@dataclass(frozen=True)
class EvalConfig(ModelOptions, NMEUnitsConfig):
    """Every option of ``coda eval`` with its default (the one source of them; the model and
    prompts are :class:`coda.host.model.choice.ModelOptions`, the NME's units
    :class:`coda.hw.verilog.NMEUnitsConfig`, as every NME command's)."""
    policy: str = option(",".join(DEFAULT_POLICIES), "comma-separated policies of "
                         + ", ".join(POLICY_NAMES))
    skip: str = option("0.3,0.5,0.6", "comma-separated distinct target skip fractions in (0, 1)")
    seeds: str = option("0", "distinct noise seeds 0..2^31-1, e.g. 0 or 0-3, disjoint from the "
                        "profile's")
    steps: int = option(DEFAULT_STEPS, "DDIM steps, 1..1000 (the model's training timesteps)")
    guidance: float = option(DEFAULT_GUIDANCE, "CFG scale, finite and >= 0")
    cache: str = option("reuse", "comma-separated cache modes of "
                        + ", ".join(CACHE_MODES) + " (forecast: a row NAME+forecast per static "
                        "policy, its alphas calibrated on the profile's videos)")
    cache_format: str = option("bf16", "comma-separated cache entry formats of "
                               + ", ".join(CACHE_FORMATS) + " (int8: a row NAME+int8 per "
                               "policy, entries quantised per group of --cache-group channels "
                               "and dequantised on the NMEs)")
    cache_group: int = option(None, "int8: channels per scale G, a divisor of the hidden size "
                              "and a multiple of the lanes", type=int,
                              default_text="the largest such G up to 64")
    profile: str = option(None, "profile.npz of coda profile", type=str,
                          default_text="the --model's shipped one for 50 steps")
    backend: str = option("torch", "where segments and monitors run", choices=("torch", "rtl"))
    device: str = option("cpu", "where the DiT, the CFG loop and the cache hooks run (cuda: "
                         "a GPU, torch built with CUDA; the schedule search stays on the CPU)",
                         choices=DEVICES)
    batch: int = option(2, "videos per generation")
    workers: int = option(2, "Ray workers of the coda search's rollouts when no shipped "
                          "schedule fits (0: in this process)")
    out: str = option(None, "output folder", type=str, required=True)
    threads: int = option(1, "torch CPU threads")


#: the config ``coda eval``'s main starts from (coda.cli)
CONFIG = EvalConfig


def configure(parser) -> None:
    add_options(parser, EvalConfig)


def main(cfg: EvalConfig) -> int:
    """Run ``coda eval`` on ``cfg`` (docs/cli.md, "coda eval"). Returns 0."""
    from rich.console import Console

    from coda.experiments.pipeline_model import is_pipeline
    from coda.experiments.search import full_videos

    s = _checked_setup(cfg)
    console = Console()
    console.print(s.preset.describe())    # the top of the output: which NME runs the segments
    driver_factory = _driver_factory(s.model, s.backend, s.nme)
    policies_at, dra_probes = _calibrated(s.policies, s.skips, s.profile, Path(s.profile_path),
                                          s.model, cfg, driver_factory, console, s.modes)
    s.out.mkdir(parents=True, exist_ok=True)
    if dra_probes:
        write_file(s.out / "dra_probes.json", json_text(dra_probes, indent=1) + "\n")

    common = dict(num_steps=cfg.steps, guidance_scale=cfg.guidance)
    vid_labels = [p for _ in s.seeds for p in s.prompts]
    vid_seeds = [seed for seed in s.seeds for _ in s.prompts]
    t0 = time.perf_counter()
    console.print(f"[bold]full compute[/] {len(vid_labels)} videos x {cfg.steps} steps")
    on_cpu = cfg.device == "cpu"    # kept videos are the CPU's (full_videos keys them so)
    full = full_videos(s.model, vid_labels, vid_seeds,
                       cache_dir="build/refs" if on_cpu else None, **common)
    shipped = not is_pipeline(cfg.model)      # a pipeline's videos are latents: no motion
    motion = motion_px(full) if shipped else None   # of ink, no prompt classifier
    from coda.host.model.choice import adherence
    adhere_full = adherence(s.model, full, vid_labels) if shipped else {}

    rows, per_video = _evaluate_all(cfg, s, policies_at, full, vid_labels, driver_factory,
                                    console)
    _count_wins(rows, per_video)
    corner = _corner_cases(per_video, s.skips, motion)
    videos = [{"prompt": vid_labels[i], "seed": vid_seeds[i],
               **({"motion_px": float(motion[i])} if shipped else {}),
               **{f"{name}@{skip}": pv[i] for (name, skip), pv in per_video.items()}}
              for i in range(len(vid_labels))]
    summary = {"model": cfg.model, **{f"{k}_full": v for k, v in adhere_full.items()},
               "profile": str(s.profile_path),
               "prompts": s.prompts, "seeds": s.seeds, "steps": cfg.steps,
               "wall_s": time.perf_counter() - t0}
    out = s.out
    write_file(out / "pareto.json", json_text(rows, indent=1) + "\n")
    write_file(out / "videos.json", json_text({"summary": summary, "videos": videos},
                                              indent=1) + "\n")
    write_file(out / "corner_cases.json", json_text(corner, indent=1) + "\n")
    pareto_plot(rows, out / "pareto.png")
    write_file(out / "table.md", markdown_table(rows))
    _print_summary(rows, corner, out, adhere_full, console)
    from coda.results import record
    figures = {}
    for r in rows:
        at = f"{r['policy']} @ {r['target_skip']:g}"
        figures[f"{at}: skipped"] = round(r["ops_skipped_fraction"], 3)
        figures[f"{at}: PSNR (dB)"] = round(r["psnr_db"], 2)
        figures[f"{at}: SSIM"] = round(r["ssim"], 4)
        if _latency(r):
            figures[f"{at}: system f latency (s)"] = _latency(r)
    record("eval-" + "-".join(f"{round(100 * k)}" for k in s.skips),
           f"coda eval: {len(vid_labels)} videos, skip {', '.join(f'{k:g}' for k in s.skips)}",
           figures, pictures={"quality against operators skipped": out / "pareto.png"})
    return 0


@dataclass
class _EvalSetup:
    """What ``coda eval``'s options decided (:func:`_checked_setup`: every check before any
    work), handed to the parts of :func:`main`."""
    policies: list[str]
    modes: list[str]             # --cache: reuse and/or forecast
    formats: list[str]           # --cache-format: bf16 and/or int8
    skips: list[float]
    prompts: list                # ints (prompt indices) and prompt texts (chosen_prompts)
    seeds: list[int]
    preset: Any                  # the NME (coda.hw.verilog.resolve_preset)
    nme: dict                    # the NME's units and trail_stores, as NMEConfig fields
    out: Path
    profile: Any                 # the Profile, or None when no policy reads one
    profile_path: Path
    backend: Any
    model: Any
    layers: int


def _checked_setup(cfg: "EvalConfig") -> _EvalSetup:
    """Every check of ``coda eval``'s options, then the model, the profile and the backend.
    Raises ValueError naming the flag."""
    from coda.host.cache.profile import Profile, model_hash
    from coda.host.cache.device import resolve_device
    from coda.host.cache.policies import check_cached_steps
    from coda.host.model.sample import MAX_SEED, check_guidance, check_steps
    from coda.lists import parse_int_list, parse_list
    from coda.experiments.pipeline_model import check_model_options, load_model
    from coda.host.model.choice import chosen_prompts
    from coda.host.model.dit import shipped_model
    from coda.host.nme.backend import get_backend
    from coda.hw.verilog import resolve_preset
    from coda.paths import check_output_path

    # ---- every check before any work
    device = resolve_device(cfg.device, "--device")     # no CUDA: refused first
    policies = parse_list(cfg.policy, "--policy", str, choices=POLICY_NAMES)
    modes = parse_list(cfg.cache, "--cache", str, choices=CACHE_MODES)
    formats = parse_list(cfg.cache_format, "--cache-format", str, choices=CACHE_FORMATS)
    if cfg.cache_group is not None and "int8" not in formats:
        raise ValueError(f"--cache-group {cfg.cache_group}: an int8 option, expected "
                         f"--cache-format int8 (got {cfg.cache_format})")
    if "forecast" in modes and not set(policies) & set(FORECAST_POLICIES):
        raise ValueError(f"--cache {cfg.cache} --policy {cfg.policy}: forecast serves the "
                         f"static policies ({', '.join(FORECAST_POLICIES)}), none given")
    skips = parse_list(cfg.skip, "--skip", float,
                       expected="comma-separated distinct fractions in (0, 1)")
    for s in skips:
        if not 0.0 < s < 1.0:
            raise ValueError(f"--skip {s}: expected fractions in (0, 1)")
    texts = check_model_options(cfg)         # a diffusers pipeline's prompts, else None
    if texts is None:
        prompts = chosen_prompts(cfg)
    else:
        prompts = list(range(len(texts)))     # indices into the loop's encoded prompts
        if "forecast" in modes or "int8" in formats or cfg.profile is None:
            raise ValueError(f"--model {cfg.model}: a diffusers pipeline is compared in reuse "
                             "mode with 16-bit entries on a profile of it; expected --cache "
                             "reuse, --cache-format bf16 and --profile FILE (coda profile "
                             f"--model {cfg.model})")
    seeds = parse_int_list(cfg.seeds, "--seeds", 0, MAX_SEED)
    check_steps(cfg.steps)
    for name in policies:            # a policy that would cache nothing: nothing to compare
        check_cached_steps(cfg.steps, "--steps", name)
    check_guidance(cfg.guidance)
    if cfg.workers < 0:
        raise ValueError(f"--workers {cfg.workers}: expected >= 0")
    for flag in ("batch", "threads"):
        if getattr(cfg, flag) < 1:
            raise ValueError(f"--{flag} {getattr(cfg, flag)}: expected >= 1")
    preset = resolve_preset(cfg)    # bad or clashing --preset / latency flags fail here
    nme = {**preset.units(), "trail_stores": cfg.trail_stores == "on"}
    out = check_output_path(cfg.out, "--out", folder=True)
    profile = None
    profile_path = cfg.profile or shipped_model(cfg.model).profile   # a pipeline: given
    # a given --profile is always checked (also when no policy reads it); the shipped one
    # only when a policy needs it
    if (cfg.profile is not None or "forecast" in modes
            or any(p in _NEEDS_PROFILE for p in policies)):
        if cfg.profile is None and not Path(profile_path).exists():
            raise ValueError(f"--policy {cfg.policy}: the {cfg.model} model has no shipped "
                             f"profile ({Path(profile_path).name}) yet; give --profile "
                             f"(coda profile --model {cfg.model})")
        profile = Profile.load(profile_path)
    backend = get_backend(cfg.backend)
    torch.set_num_threads(cfg.threads)
    model, _, _ = load_model(cfg, device)
    layers = _layers(model)
    if profile is not None:
        profile.check_for(model_hash(model), cfg.steps, layers,
                          what=f"--profile {profile_path}")
        profiled = [int(s) for s in profile.meta.get("seeds", [])]
        overlap = [s for s in seeds if s in profiled]
        if overlap:
            raise ValueError(f"--seeds {cfg.seeds}: seeds {overlap} were profiled "
                             f"(--profile {profile_path} has seeds {profiled}); expected "
                             "held-out seeds, disjoint from the profile's")
    if any(name.startswith("coda") for name in policies):
        from coda.experiments.search import check_reachable, constant_op_types
        for skip in skips:       # the search's bound, for every skip before any search
            check_reachable(skip, cfg.steps, constant_op_types(profile))
    if "int8" in formats:
        from coda.host.cache.compress import resolve_group
        tcfg = model.config["transformer"]
        resolve_group(tcfg["num_attention_heads"] * tcfg["attention_head_dim"], NMEConfig.lanes,
                      cfg.cache_group)      # a bad G is refused before any work
    return _EvalSetup(policies, modes, formats, skips, prompts, seeds, preset, nme, out, profile,
                      Path(profile_path), backend, model, layers)


def _evaluate_all(cfg: "EvalConfig", s: _EvalSetup, policies_at: dict, full, vid_labels,
                  driver_factory, console) -> tuple[list[dict], dict]:
    """One row per (skip, policy): the cached videos of every prompt and seed against
    ``full``, their quality, counters per video and modelled cost; pareto.json rewritten
    after each. Returns (rows, per-video results by (policy, skip))."""
    from coda.host.cache.arch import model_ops
    from coda.host.model.choice import adherence

    common = dict(num_steps=cfg.steps, guidance_scale=cfg.guidance)
    headline = ADHERENCE.get(cfg.model, (None,))[0]    # None: a pipeline (no classifier)
    model, prompts, seeds, out = s.model, s.prompts, s.seeds, s.out
    rows, per_video = [], {}
    for skip in s.skips:
        names = [n for n in s.policies if "reuse" in s.modes] + \
            [f"{n}+forecast" for n in s.policies if (f"{n}+forecast", skip) in policies_at]
        for base, fmt in [(b, f) for b in names for f in s.formats]:
            name = base + ("+int8" if fmt == "int8" else "")
            t1 = time.perf_counter()
            policy, table = policies_at[(base, skip)], None
            if base.endswith("+forecast"):
                policy, table = policy
            res = evaluate_policy(model, policy, prompts, seeds, full, forecast=table,
                                  driver_factory=driver_factory, batch=cfg.batch,
                                  cache_format=fmt, cache_group=cfg.cache_group, **common)
            st, n = res["stats"], len(vid_labels)
            row = {"policy": name, "target_skip": skip, "cache_format": fmt,
                   "stored_bytes": st["stored_bytes"] / n,
                   "ops_skipped_fraction": st["ops_skipped_fraction"],
                   "flops_skipped_fraction": (flops_skipped(res["schedules"], model.config)
                                              if headline else None),
                   "psnr_db": psnr_db(res["videos"], full),
                   "mean_psnr_db": float(np.mean([v["psnr_db"] for v in res["per_video"]])),
                   "ssim": ssim(res["videos"], full),
                   **(adherence(model, res["videos"], vid_labels) if headline else {}),
                   "segments": st["segments"] / n, "pcie_bytes": st["pcie_bytes"] / n,
                   "videos": n, "per_video_counts": True,
                   "fallbacks": st["fallbacks"] / n, "monitors": st["monitors"] / n,
                   "nme_cycles": st["nme_cycles"] / n,
                   "monitor_nme_cycles": st["monitor_nme_cycles"] / n,
                   "monitor_bytes": st["monitor_bytes"] / n, "kept_bytes": st["kept_bytes"] / n,
                   "params": policy.describe(), "seconds": time.perf_counter() - t1,
                   **({"forecast": table.describe()} if table is not None else {}),
                   **_modelled(policy, cfg.steps, model_ops(model.transformer),
                               cache="forecast" if table is not None else "reuse",
                               schedules=res["schedules"])}
            rows.append(row)
            per_video[(name, skip)] = res["per_video"]
            console.print(f"  {name:9s} skip {skip:.2f}: achieved {row['ops_skipped_fraction']:.3f}"
                          f"  PSNR {row['psnr_db']:.2f} dB  SSIM {row['ssim']:.4f}  "
                          + (f"{headline} {row[headline]:.3f}  " if headline else "")
                          + f"({row['seconds']:.0f} s)")
            write_file(out / "pareto.json", json_text(rows, indent=1) + "\n")
    return rows, per_video


def _print_summary(rows: list[dict], corner: list[dict], out: Path, adhere_full: dict,
                   console) -> None:
    """The comparison table and the corner cases, on the console; ``adhere_full``: the
    full-compute videos' prompt adherence (:func:`coda.host.model.choice.adherence`), whose
    first figure each row shows too."""
    from rich.table import Table

    headline, acc_full = next(iter(adhere_full.items()), (None, None))
    table = Table(title=f"coda eval — {out / 'pareto.json'}" + (
        f" (full compute: {headline.replace('_', ' ')} {acc_full:.3f})" if headline else ""))
    for col in ("policy", "target", "f latency s", "PSNR dB", "mean PSNR", "SSIM",
                *([headline] if headline else []), "skipped", "FLOPs skipped", "segments/video", "PCIe MB/video",
                "fallbacks/video", "coda wins", "coda-lat wins"):
        table.add_column(col, justify="right")
    for r in latency_order(rows):
        table.add_row(r["policy"], f"{r['target_skip']:.2f}", _latency(r),
                      f"{r['psnr_db']:.2f}", f"{r['mean_psnr_db']:.2f}", f"{r['ssim']:.4f}",
                      *([f"{r[headline]:.3f}"] if headline else []),
                      f"{r['ops_skipped_fraction']:.3f}", _fraction(r),
                      f"{r['segments']:.0f}", f"{r['pcie_bytes'] / 1e6:.1f}",
                      f"{r['fallbacks']:.1f}", *(_wins(r, key) for _, key in WIN_COLUMNS))
    console.print(table)
    for c in corner:
        console.print(f"corner cases ({c['set']}, skip {c['target_skip']}): PSNR coda "
                      f"{c['psnr_coda']:.2f} -> coda+dra {c['psnr_coda_dra']:.2f} dB, extra "
                      f"executions {100 * c['extra_executions']:.2f} %")


def _fraction(row: dict) -> str:
    """The FLOPs-skipped column: the fraction, or "–" where not modelled (a pipeline)."""
    value = row.get("flops_skipped_fraction")
    return "–" if value is None else f"{value:.3f}"


def markdown_table(rows: list[dict]) -> str:
    """The rows as the Markdown table the docs show (``DIR/table.md``), in
    :func:`latency_order`: per policy and target the modelled system-f latency (s; a dynamic
    policy's the mean over its videos), whole-set and mean per-video PSNR (dB), SSIM, prompt
    adherence (the model's headline figure, :data:`coda.host.model.choice.ADHERENCE`), the
    operator executions and FLOPs skipped (the secondary axes), segments and host-link MB
    per video, DRA's fallbacks per video and the videos on which CODA (CODA within uniform's
    latency) beats the policy."""
    headline = next((k for keys in ADHERENCE.values() for k in keys[:1] if rows and k in rows[0]),
                    None)            # None: a pipeline's rows (no prompt classifier)
    adh = f" {headline.replace('_', ' ')} |" if headline else ""
    head = (f"| policy | target | f latency s | PSNR dB | mean PSNR dB | SSIM |{adh} skipped "
            "| FLOPs skipped | segments | PCIe MB | fallbacks | CODA wins | CODA-lat wins |")
    lines = [head, "|" + "---|" * (14 if headline else 13)]
    for r in latency_order(rows):
        fb = f"{r['fallbacks']:.1f}" if r["fallbacks"] else ""
        lines.append(f"| {r['policy']} | {r['target_skip']:g} | {_latency(r)} "
                     f"| {r['psnr_db']:.2f} | {r['mean_psnr_db']:.2f} | {r['ssim']:.4f} "
                     + (f"| {r[headline]:.3f} " if headline else "")
                     + f"| {r['ops_skipped_fraction']:.3f} "
                     f"| {_fraction(r)} | {r['segments']:.0f} "
                     f"| {r['pcie_bytes'] / 1e6:.1f} | {fb} | "
                     + " | ".join(_wins(r, key) for _, key in WIN_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def _layers(model) -> int:
    """The transformer layers of a shipped model or a pipeline's loop."""
    from coda.host.cache.arch import model_ops
    return model_ops(model.transformer).num_layers


def coda_schedule(profile, profile_path: Path, model, skip: float, *, workers: int = 2,
                  latency: str | None = None, log=print):
    """The CODA schedule for ``skip``: the shipped one when ``profile_path`` is the shipped
    profile and a schedule was shipped for ``skip``; else the whole-step search on the
    profile's calibration videos. ``latency``: None (chosen on quality) or ``"uniform"``
    (within the uniform baseline's modelled system-f latency at ``skip``, ``coda-lat``).
    Returns (Schedule, a line saying where it came from).
    Raises ValueError as :func:`coda.experiments.search.checked_search_steps`."""
    from coda.host.cache.profile import model_hash
    from coda.host.cache.shipped import load_schedule
    from coda.host.model.dit import shipped_model
    from coda.experiments.search import checked_search_steps

    from coda.experiments.pipeline_model import is_pipeline

    name = profile.meta.get("model", "digits")
    shipped = None if is_pipeline(name) else shipped_model(name)
    path = None if shipped is None else shipped.schedule(skip, latency)
    if shipped is not None and profile_path.resolve() == shipped.profile.resolve() \
            and path.exists():
        return (load_schedule(path, model_id=model_hash(model), num_steps=profile.num_steps,
                              num_layers=profile.num_layers), f"shipped {path.name}")
    rep, info = checked_search_steps(profile_path, skip, workers=workers,
                                     max_latency_s=latency, log=log)
    return rep.schedule, (f"searched in {info['search_s']:.0f} s ({info['rollouts']} rollouts): "
                          f"{rep.plan.label}, {rep.plan.describe()}")


def flops_skipped(schedules, model_config: dict) -> float:
    """The fraction of the cacheable operators' FLOPs the videos skipped (equal FLOPs, a
    secondary axis: operators differ in cost, e.g. cross attention over a few text tokens is
    cheap): per video its schedule's reused operators, each weighted by its FLOPs on the
    shipped model (:func:`coda.host.system.presets.shipped_shape`), over every step and CFG
    branch of every video."""
    from coda.host.cache.schedule import BRANCHES
    from coda.host.system.presets import shipped_shape

    shape = shipped_shape(model_config)
    flops = {(o.layer, o.op): o.kernels.total_flops() for o in shape.ops}
    per_pass = sum(flops.values())
    skipped = total = 0.0
    for sched in schedules:
        total += per_pass * sched.num_steps * len(BRANCHES)
        skipped += sum(flops[ref] for (_, _), refs in sched.reuse.items() for ref in refs)
    return skipped / total if total else 0.0


#: what a row's ``modelled`` block keeps of :func:`coda.host.system.cost.schedule_cost`
_COST_KEYS = ("latency_s", "energy_j", "segments", "host_link_bytes")


def _modelled(policy, steps: int, ops, target: str | None = None,
              cache: str = "reuse", schedules=None) -> dict:
    """``{"modelled": {...}}``: for a run of ``steps`` steps of the model of ``ops`` (its
    :class:`coda.host.cache.schedule.ModelOps`), the modelled latency (s), energy (J), segments and host-link
    bytes in system f, cache mode ``cache``, for ``target`` (default:
    :data:`coda.host.system.cost.DEFAULT_TARGET`), each schedule transferred as ``coda sim``
    does: a static policy's schedule (``"from": "schedule"``); a dynamic policy's per video,
    the schedule each video followed (``schedules``, from its recorded events), then the
    mean over the videos (``"from": "events"``, ``per_video_latency_s``). ``{}`` for a
    dynamic policy without ``schedules``."""
    from coda.host.system.cost import DEFAULT_TARGET, schedule_cost

    target = target or DEFAULT_TARGET
    build = getattr(policy, "build_for", None)      # a static policy, on the model's operators
    if build is not None:
        c = schedule_cost(build(steps, ops), target, "f", cache=cache)
        return {"modelled": {"target": target, "system": "f", "from": "schedule",
                             **{k: c[k] for k in _COST_KEYS}}}
    if not schedules:
        return {}
    costs: dict[str, dict] = {}      # videos that followed the same schedule: costed once
    per_video = []
    for sched in schedules:
        key = sched.to_json()
        if key not in costs:
            costs[key] = schedule_cost(sched, target, "f", cache=cache)
        per_video.append(costs[key])
    mean = {k: float(np.mean([c[k] for c in per_video])) for k in _COST_KEYS}
    return {"modelled": {"target": target, "system": "f", "from": "events", **mean,
                         "per_video_latency_s": [c["latency_s"] for c in per_video],
                         "distinct_schedules": len(costs)}}


def _latency(row: dict) -> str:
    """A row's modelled system-f latency (s) as the tables show it: blank where not
    modelled, "does not fit" where the cache exceeds the target's DIMMs."""
    if "modelled" not in row:
        return ""
    lat = row["modelled"]["latency_s"]
    return f"{lat:.0f}" if math.isfinite(lat) else "does not fit"


#: the CODA rows whose wins over every other policy are counted: (policy, row key)
WIN_COLUMNS = (("coda", "coda_wins"), ("coda-lat", "coda_lat_wins"))


def _count_wins(rows: list[dict], per_video: dict) -> None:
    """For every policy row at a target where ``coda`` (``coda-lat``) ran too:
    ``coda_wins`` (``coda_lat_wins``), the videos on which that schedule's PSNR is above this
    policy's (added to the row in place)."""
    for ref, key in WIN_COLUMNS:
        for r in rows:
            mine, coda = per_video[(r["policy"], r["target_skip"])], \
                per_video.get((ref, r["target_skip"]))
            if coda is None or r["policy"] == ref:
                continue
            r[key] = int(sum(c["psnr_db"] > m["psnr_db"] for c, m in zip(coda, mine)))


def _wins(row: dict, key: str) -> str:
    return f"{row[key]}/{row['videos']}" if key in row else ""


def _driver_factory(model, backend, nme: dict):
    """``f(videos, history=1, cache_format="bf16", cache_group=None) -> NMPDriver`` with slots
    for outputs (``history`` per operator: 2 in forecast mode; int8 or 16-bit) and kept inputs (DRA, TeaCache, FBCache), 2 ranks of 8 lanes, the NME
    of ``nme`` (the preset's units)."""
    from coda.host.nmp.driver import NMPDriver
    from coda.host.model.sample import cache_mem_words

    def factory(videos: int, history: int = 1, cache_format: str = "bf16",
                cache_group: int | None = None):
        words = cache_mem_words(model, videos, 2, 8, inputs=True, history=history,
                                cache_format=cache_format, cache_group=cache_group)
        return NMPDriver(backend, NMEConfig(mem_words=words, **nme), ranks=2)
    return factory


def _calibrated(policies, skips, profile, profile_path: Path, model, cfg, driver_factory,
                console, modes=("reuse",)) -> tuple[dict, dict]:
    """(name, skip) -> the policy, every one calibrated before any evaluated generation: the
    coda schedules (:func:`coda_schedule`), DRA's thresholds and probe chosen on the
    profile's own videos (:func:`coda.experiments.dra_calibration.calibrate_default_dra`),
    the others by :func:`coda.host.cache.policies.get_policy`; and ``"skip S"`` -> the DRA
    probe choice's report at S (none without coda+dra)."""
    from coda.experiments.dra_calibration import calibrate_default_dra, describe_choice
    from coda.host.cache.policies import get_policy

    layers = _layers(model)
    policies_at, dra_probes = {}, {}
    for skip in skips:
        table = None
        scheds = {}
        for name, latency in (("coda", None), ("coda-lat", "uniform")):
            if name in policies or (name == "coda" and "coda+dra" in policies):
                scheds[name], source = coda_schedule(profile, profile_path, model, skip,
                                                     workers=cfg.workers, latency=latency,
                                                     log=console.print)
                console.print(f"{name} schedule for skip {skip}: {source}")
        sched = scheds.get("coda")
        if "coda+dra" in policies:
            t0 = time.perf_counter()
            table, report = calibrate_default_dra(model, sched, profile, num_steps=cfg.steps,
                                                  guidance_scale=cfg.guidance,
                                                  driver_factory=driver_factory)
            dra_probes[f"skip {skip}"] = {**report, "wall_s": time.perf_counter() - t0,
                                          "table": table.to_dict()}
            console.print(f"coda+dra at skip {skip}: {describe_choice(report)} in "
                          f"{time.perf_counter() - t0:.0f} s")
        for name in policies:
            extra = {"thresholds": table} if name == "coda+dra" else {}
            policies_at[(name, skip)] = get_policy(name, skip=skip, profile=profile,
                                                   schedule=scheds.get(name, sched),
                                                   num_steps=cfg.steps,
                                                   num_layers=layers, **extra)
    if "forecast" in modes:
        _forecast_tables(policies_at, profile, model, cfg, driver_factory, console)
    return policies_at, dra_probes


def _forecast_tables(policies_at: dict, profile, model, cfg, driver_factory, console) -> None:
    """Add ``(NAME+forecast, skip) -> (policy, ForecastTable)`` for every static policy of
    :data:`FORECAST_POLICIES` in ``policies_at``, every table calibrated at once on the
    profile's videos (:func:`coda.experiments.forecast_calibration.calibrate_forecast`)."""
    from coda.experiments.forecast_calibration import calibrate_forecast

    layers = _layers(model)
    static = {f"{name}@{skip}": (name, skip) for name, skip in policies_at
              if name in FORECAST_POLICIES}
    t0 = time.perf_counter()
    tables = calibrate_forecast(
        model, {k: policies_at[v]._schedule(cfg.steps, layers) for k, v in static.items()},
        profile.meta["prompts"], profile.meta["seeds"], num_steps=cfg.steps,
        guidance_scale=cfg.guidance, driver_factory=driver_factory)
    console.print(f"forecast alphas of {len(tables)} schedules calibrated on the profile's "
                  f"{len(profile.meta['prompts']) * len(profile.meta['seeds'])} videos in "
                  f"{time.perf_counter() - t0:.0f} s")
    for key, (name, skip) in static.items():
        policies_at[(f"{name}+forecast", skip)] = (policies_at[(name, skip)], tables[key])


def _corner_cases(per_video: dict, skips, motion) -> list[dict]:
    out = []
    for skip in skips:
        if ("coda", skip) not in per_video or ("coda+dra", skip) not in per_video:
            continue
        static, dra = per_video[("coda", skip)], per_video[("coda+dra", skip)]
        n = len(static)
        quarter = max(1, n // 4)
        sets = {"worst-static-psnr": list(worst_quarter([v["psnr_db"] for v in static])),
                "fastest-motion": (None if motion is None
                                   else list(np.argsort(-np.asarray(motion))[:quarter])),
                "all": list(range(n))}
        sets = {k: v for k, v in sets.items() if v is not None}
        for label, idx in sets.items():
            execs = sum(static[i]["computed"] + static[i]["reused"] for i in idx)
            extra = sum(dra[i]["computed"] - static[i]["computed"] for i in idx)
            out.append({"set": label, "target_skip": skip, "videos": [int(i) for i in idx],
                        "psnr_coda": float(np.mean([static[i]["psnr_db"] for i in idx])),
                        "psnr_coda_dra": float(np.mean([dra[i]["psnr_db"] for i in idx])),
                        "extra_executions": extra / execs if execs else 0.0,
                        "fallbacks": int(sum(dra[i]["fallbacks"] for i in idx))})
    return out
