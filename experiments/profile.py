"""``coda profile``: how much each DiT operator changes between denoising steps.

Full-compute CFG generations of the shipped model (or any Latte) record, per video, step,
CFG branch, layer and operator type, the relative L1 change ``Σ|a_s - a_{s-1}| / Σ|a_{s-1}|``
of the operator's **output** and of its **input** against the previous step. Both numerators
run on the NMEs with the ``l1_distance`` operator against the previous step's tensor, which
stays in rank memory (``NMPDriver.l1_to_slot``: only the new tensor crosses the host link): inputs through the cache engine's own monitor, outputs by
:class:`ProfilingDriver` before it overwrites an operator's cache slot
(:func:`profile_model`). Everything is per video; :meth:`Profile.mean` averages over videos.
Files: ``DIR/profile.npz`` (arrays ``[videos, steps, branches, layers, op types]``, NaN at step
0), ``DIR/profile.json`` (metadata: model hash, prompts, seeds, steps, shapes, the stability
ranking) and ``DIR/heatmap.png`` (operators x steps, one panel per operator type).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from coda.host.cache.device import DEVICES
from coda.host.model.sample import MAX_SEED, check_guidance, check_steps
from coda.lists import parse_int_list
from coda.host.cache.profile import (InputNormDriver, Profile, ProfileBuilder, ProfilePolicy,
                                     ProfilingDriver, model_hash)
from coda.host.cache.schedule import BRANCHES
from coda.host.model.choice import ModelOptions
from coda.hw.verilog import NMEUnitsConfig
from coda.host.model.defaults import DEFAULT_GUIDANCE, DEFAULT_STEPS
from coda.hw.nme.isa import NMEConfig
from coda.paths import save_figure
from coda.options import add_options, option

__all__ = ["profile_model", "step_sensitivity", "stability_ranking", "depth_table",
           "plot_heatmap"]


def model_shape(model) -> dict:
    """The shapes the cost model needs: frames, tokens per frame, hidden, heads, FFN width,
    condition tokens, layers."""
    cfg = model.config
    t = cfg["transformer"]
    frames, size = cfg["data"]["frames"], cfg["data"]["size"]
    hidden = t["num_attention_heads"] * t["attention_head_dim"]
    block = model.transformer.transformer_blocks[0]
    ffn_inner = block.ff.net[-1].in_features
    cond_tokens = 1                  # the digits model's one label token
    if cfg.get("conditioning") == "text":
        from coda.host.model.prompts import MAX_TOKENS as cond_tokens
    return {"frames": frames, "tokens_per_frame": (size // t["patch_size"]) ** 2,
            "hidden": hidden, "heads": t["num_attention_heads"], "ffn_inner": ffn_inner,
            "cond_tokens": cond_tokens, "layers": len(model.transformer.transformer_blocks)}


# ---------------------------------------------------------------- profiling generations
def profile_model(model, labels, seeds, driver_factory, *, num_steps: int,
                  guidance_scale: float, progress: bool = False) -> Profile:
    """Profile full-compute CFG generations: one generation per seed, all labels batched
    (video (label, seed) starts from the noise of ``seed``).

    The relative L1 changes' numerators run on the NMEs against the previous step's tensor:

    - inputs through the cache engine's own monitor (:meth:`OpQuery.input_change` of
      :class:`ProfilePolicy`, which keeps every operator's input every step; one
      :class:`coda.host.cache.events.MonitorEvent` each);
    - outputs by :class:`ProfilingDriver`, an :class:`NMPDriver` that, before it overwrites an
      operator's cache slot with this step's output, runs ``l1_to_slot`` of the new output against
      the slot (the policy stores every output every step).

    The denominators ``Σ|a_{s-1}|`` are taken on the host when the tensor is written (as the engine
    does for kept inputs). Also recorded: the mean absolute value of each output and input
    (``out_abs``, ``in_abs``), for the cost model's weights. Everything is per video (relative L1
    per sample, never pooled over a batch); :meth:`Profile.mean` averages over videos.

    Args:
        model: a shipped model (DigitLatte, TextLatte), or a
            :class:`coda.experiments.cfg_loop.CFGLoop` over any diffusers transformer the
            cache engine serves (labels: its prompt indices).
        labels: prompts (indices: digits or demo prompts; texts for the text model,
            :func:`coda.host.model.choice.chosen_prompts`). seeds: noise seeds.
        driver_factory: ``f(videos) -> ProfilingDriver`` (a fresh driver per generation).
        num_steps, guidance_scale: as :func:`coda.host.model.sample.generate`.
    Returns:
        the :class:`Profile` (videos in order seed-major, then label). Its arrays hold the
        architecture's op types (:attr:`Profile.model_ops`; a cell of an operator the model
        lacks stays NaN); a joint model's operators are measured on their video stream.
    """
    from coda.experiments.cfg_loop import CFGLoop, cached_videos
    from coda.host.cache.arch import model_ops

    labels = [x if isinstance(x, str) else int(x) for x in labels]
    ops = model_ops(model.transformer)
    builder = ProfileBuilder(ops, len(labels) * len(seeds), num_steps)
    for si, seed in enumerate(seeds):
        driver = driver_factory(len(labels))
        policy = ProfilePolicy()
        cached_videos(model, labels, driver, policy, num_steps=num_steps,
                      guidance_scale=guidance_scale, seeds=[seed] * len(labels),
                      progress=progress)
        builder.add(driver, policy, first_video=si * len(labels))
    return builder.build({
        "model_hash": model_hash(model), "prompts": labels, "seeds": [int(s) for s in seeds],
        "videos": [[p, int(s)] for s in seeds for p in labels], "steps": num_steps,
        "guidance_scale": guidance_scale,
        "shape": model.shape() if isinstance(model, CFGLoop) else model_shape(model)})


def step_sensitivity(model, profile: Profile, driver_factory, *, blocks: int = 10,
                     videos: int = 2) -> np.ndarray:
    """How much the final video suffers, per unit of the schedule search's quality proxy, when
    operators are reused at each part of the run: for each of ``blocks`` blocks of steps, a
    generation of the profile's first ``videos`` videos that reuses every operator at every
    other step of the block (a one-step-old cache), against full compute:
    ``sensitivity = MSE(final video) / proxy(the reuses)``, the proxy the profiled one-step
    output change x |output| / |input| (:func:`coda.host.cache.weights.quality_weights`).
    Early steps weigh more than their change says (a deviation there moves the whole
    remaining trajectory); returned per step, normalised to mean 1.
    """
    from coda.experiments.cfg_loop import cached_videos, generate_videos
    from coda.host.cache.schedule import Schedule
    from coda.host.cache.weights import quality_weights

    steps, ops = profile.num_steps, profile.model_ops
    pairs = profile.meta["videos"][:videos]
    labels, seeds = [p for p, _ in pairs], [s for _, s in pairs]
    kw = dict(num_steps=steps, guidance_scale=profile.meta["guidance_scale"], seeds=seeds)
    full = generate_videos(model, labels, **kw)
    change = np.nan_to_num(profile.per_op(profile.mean("out_change")))       # [S, B, ops]
    weight = quality_weights(profile)                                        # [B, ops]
    everything = frozenset(ops.ops)
    edges = np.linspace(0, steps, blocks + 1).round().astype(int)
    sens = np.ones(steps)
    per_block = []
    for b0, b1 in zip(edges[:-1], edges[1:]):
        reuse_steps = [s for s in range(b0 + 1, b1, 2)]
        if not reuse_steps:
            per_block.append(None)
            continue
        sched = Schedule(steps, ops.num_layers, {(s, br): everything for s in reuse_steps
                                                 for br in BRANCHES}, name="sensitivity",
                         ops=ops)
        video, _ = cached_videos(model, labels, driver_factory(len(labels)), sched, **kw)
        mse = float(((video.double() - full.double()) ** 2).mean())
        proxy = float(sum((change[s] * weight).sum() for s in reuse_steps))
        per_block.append(mse / proxy if proxy > 0 else None)
    known = [v for v in per_block if v is not None]
    fill = float(np.mean(known)) if known else 1.0
    for (b0, b1), v in zip(zip(edges[:-1], edges[1:]), per_block):
        sens[b0:b1] = fill if v is None else v
    if not sens.mean() > 0:
        return np.ones(steps)        # no reuse changed the video: nothing to weigh
    return sens / sens.mean()


# ---------------------------------------------------------------- reading a profile
def stability_ranking(profile: Profile, skip_first: int = 1) -> list[dict]:
    """Operator types from most to least stable: the mean relative output change over videos,
    steps ``>= skip_first`` (step 0 has no previous step), branches and layers; also the
    input change and the median over steps. Returns dicts with ``op``, ``out_change``,
    ``out_change_median``, ``in_change``."""
    rows = []
    for k, op in enumerate(profile.model_ops.op_types):
        out = profile.mean("out_change")[skip_first:, :, :, k]
        inp = profile.mean("in_change")[skip_first:, :, :, k]
        rows.append({"op": op, "out_change": float(np.nanmean(out)),
                     "out_change_median": float(np.nanmedian(out.mean(axis=(1, 2)))),
                     "in_change": float(np.nanmean(inp))})
    return sorted(rows, key=lambda r: r["out_change"])


def depth_table(profile: Profile, skip_first: int = 1) -> list[dict]:
    """Mean relative output change per block index (depth) and operator type, over videos,
    steps ``>= skip_first``, and branches. Returns one dict per depth, in forward order:
    ``layer`` and, per operator type the model has at that depth, its ``out_change`` (a
    dict op -> float)."""
    mean = profile.mean("out_change")[skip_first:]            # [S, B, L, K]
    present = {(layer, op) for layer, op in profile.model_ops.ops}
    rows = []
    for layer in range(profile.num_layers):
        with np.errstate(invalid="ignore"):
            change = {op: float(np.nanmean(mean[:, :, layer, k]))
                      for k, op in enumerate(profile.model_ops.op_types)
                      if (layer, op) in present}
        rows.append({"layer": layer, "out_change": change})
    return rows


def plot_heatmap(profile: Profile, path: str | Path) -> None:
    """Heat map of log10 mean relative output change: one panel per operator type, rows =
    (branch, layer), columns = steps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean = profile.mean("out_change")          # [S, B, L, K]
    steps, _, layers, _ = mean.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        logm = np.log10(np.where(mean > 0, mean, np.nan))
    finite = logm[np.isfinite(logm)]
    vmin, vmax = (np.percentile(finite, 1), np.percentile(finite, 99)) if finite.size else (-3, 0)
    kinds = profile.model_ops.op_types
    fig, axes = plt.subplots(len(kinds), 1, figsize=(10, 2.0 * len(kinds)), sharex=True)
    for k, (ax, op) in enumerate(zip(np.atleast_1d(axes), kinds)):
        grid = np.concatenate([logm[:, b, :, k].T for b in range(len(BRANCHES))])
        raw = np.concatenate([mean[:, b, :, k].T for b in range(len(BRANCHES))])
        grid = np.where(raw == 0, vmin, grid)        # exactly constant: the darkest colour
        im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax,
                       interpolation="nearest")
        zero = np.nanmax(raw[:, 1:]) == 0 if raw.shape[1] > 1 else False
        ax.set_title(op + ("  (output exactly constant between steps: change 0)" if zero
                           else ""), fontsize=9)
        ax.set_yticks(range(len(BRANCHES) * layers))
        ax.set_yticklabels([f"{b[:4]} L{l}" for b in BRANCHES for l in range(layers)], fontsize=6)
    np.atleast_1d(axes)[-1].set_xlabel("denoising step")
    fig.colorbar(im, ax=axes, label="log10 relative L1 change of the output vs previous step")
    fig.suptitle(f"operator output change between steps ({len(profile.meta.get('videos', []))} "
                 f"videos, NME l1_distance)", fontsize=10)
    save_figure(fig, path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- the command
@dataclass(frozen=True)
class ProfileConfig(ModelOptions, NMEUnitsConfig):
    """Every option of ``coda profile`` with its default (the one source of them; the model
    and prompts are :class:`coda.host.model.choice.ModelOptions`, the NME's units
    :class:`coda.hw.verilog.NMEUnitsConfig`, as every NME command's)."""
    seeds: str = option("100", "distinct noise seeds 0..2^31-1, e.g. 100 or 100-101; evaluate "
                        "on other seeds")
    steps: int = option(DEFAULT_STEPS, "DDIM steps, 2..1000 (the model's training timesteps)")
    guidance: float = option(DEFAULT_GUIDANCE, "CFG scale, finite and >= 0")
    out: str = option(None, "output folder", type=str, required=True)
    device: str = option("cpu", "where the DiT, the CFG loop and the cache hooks run (cuda: "
                         "a GPU, torch built with CUDA)", choices=DEVICES)
    backend: str = option("torch", "where l1_distance runs (same numbers)",
                          choices=("torch", "rtl"))
    lanes: int = option(NMEConfig.lanes, "NME SIMD lanes")
    ranks: int = option(2, "ranks (1 DIMM)")
    threads: int = option(1, "torch CPU threads")
    sensitivity_blocks: int = option(None, "blocks of steps of the step-sensitivity runs, "
                                     "0..steps/2 (each block needs 2 steps: one computed, one "
                                     "reusing it; 0: none)", type=int,
                                     default_text="min(10, steps/2): 10 for 50 steps")
    sensitivity_videos: int = option(None, "profiled videos the step-sensitivity runs "
                                     "generate, 1..prompts x seeds", type=int,
                                     default_text="min(4, prompts x seeds)")


#: the config ``coda profile``'s main starts from (coda.cli)
CONFIG = ProfileConfig


def configure(parser) -> None:
    add_options(parser, ProfileConfig)


def _sensitivity_plan(blocks: int | None, videos: int | None, steps: int,
                      profiled: int) -> tuple[int, int]:
    """(blocks, videos) of the step-sensitivity runs from ``--sensitivity-blocks`` /
    ``--sensitivity-videos`` (None: the defaults). A block needs 2 steps (one computed, one
    reusing its one-step-old cache), so at most ``steps // 2`` blocks; at most the
    ``profiled`` videos. Raises ValueError naming the flags."""
    most = steps // 2
    if blocks is None:
        blocks = min(10, most)
    elif not 0 <= blocks <= most:
        raise ValueError(f"--sensitivity-blocks {blocks}: expected 0..{most} with --steps "
                         f"{steps} (each block needs 2 steps: one computed, one reusing it; "
                         "0: no step-sensitivity runs)")
    if videos is None:
        videos = min(4, profiled)
    elif not 1 <= videos <= profiled:
        raise ValueError(f"--sensitivity-videos {videos}: expected 1..{profiled}, the videos "
                         f"profiled (--prompts x --seeds)")
    elif blocks == 0:
        raise ValueError(f"--sensitivity-videos {videos}: has no effect with "
                         "--sensitivity-blocks 0, expected no --sensitivity-videos")
    return blocks, videos


def make_driver_factory(model, backend, lanes: int, ranks: int, **nme):
    """``f(videos) -> ProfilingDriver`` sized for outputs and inputs of every operator, on
    NMEs of ``lanes`` lanes and the other :class:`coda.hw.nme.isa.NMEConfig` fields ``nme``
    (e.g. a preset's ``mul_latency``, ``add_latency``, ``operand_latency``)."""
    from coda.host.model.sample import cache_mem_words

    def factory(videos: int) -> ProfilingDriver:
        words = cache_mem_words(model, videos, ranks, lanes, inputs=True)   # outputs and inputs
        return InputNormDriver(backend, NMEConfig(lanes=lanes, mem_words=words, **nme),
                                ranks=ranks)
    return factory


def main(cfg: ProfileConfig) -> int:
    """Run ``coda profile`` on ``cfg`` (docs/cli.md, "coda profile"). Returns 0."""
    from rich.console import Console

    from coda.host.cache.device import resolve_device
    from coda.host.nme.backend import get_backend
    from coda.experiments.pipeline_model import check_model_options, load_model
    from coda.hw.verilog import resolve_preset
    from coda.paths import check_output_path
    from coda.results import record

    device = resolve_device(cfg.device, "--device")     # no CUDA: refused first
    texts = check_model_options(cfg)
    if texts is None:
        from coda.host.model.choice import chosen_prompts
        texts = chosen_prompts(cfg)
    seeds = parse_int_list(cfg.seeds, "--seeds", 0, MAX_SEED)
    check_steps(cfg.steps, lo=2)
    check_guidance(cfg.guidance)
    for flag in ("lanes", "ranks", "threads"):
        if getattr(cfg, flag) < 1:
            raise ValueError(f"--{flag} {getattr(cfg, flag)}: expected >= 1")
    blocks, videos = _sensitivity_plan(cfg.sensitivity_blocks, cfg.sensitivity_videos,
                                       cfg.steps, len(texts) * len(seeds))
    preset = resolve_preset(cfg)   # bad or clashing --preset / latency flags fail here
    nme = {**preset.units(), "trail_stores": cfg.trail_stores == "on"}
    out = check_output_path(cfg.out, "--out", folder=True)
    backend = get_backend(cfg.backend)
    torch.set_num_threads(cfg.threads)
    console = Console()
    console.print(preset.describe())    # the top of the output: which NME runs l1_distance
    model, prompts, meta = load_model(cfg, device)
    t0 = time.perf_counter()
    prof = profile_model(model, prompts, seeds,
                         make_driver_factory(model, backend, cfg.lanes, cfg.ranks, **nme),
                         num_steps=cfg.steps, guidance_scale=cfg.guidance, progress=True)
    if blocks:
        console.print(f"step sensitivity: {blocks} blocks x {videos} videos")
        plain = make_driver_factory(model, backend, cfg.lanes, cfg.ranks, **nme)
        prof.sensitivity = step_sensitivity(model, prof, plain, blocks=blocks, videos=videos)
    if hasattr(backend, "close"):
        backend.close()
    ranking = stability_ranking(prof)
    prof.meta.update(**meta, backend=cfg.backend, lanes=cfg.lanes, ranks=cfg.ranks,
                     stability_ranking=ranking, depth_table=depth_table(prof),
                     wall_s=time.perf_counter() - t0)
    path = prof.save(out)
    plot_heatmap(prof, out / "heatmap.png")
    console.print(f"profile of {len(prof.meta['videos'])} videos x {cfg.steps} steps -> {path}")
    console.print("operator types, most stable first (mean relative L1 change of the output "
                  "between steps; input change):")
    for r in ranking:
        console.print(f"  {r['op']:14s} out {r['out_change']:.4f} (median over steps "
                      f"{r['out_change_median']:.4f})  in {r['in_change']:.4f}")
    record("profile", f"profile of {len(prof.meta['videos'])} videos x {cfg.steps} steps",
           {**{f"{r['op']}: mean output change": round(r["out_change"], 4) for r in ranking},
            **{f"{r['op']}: mean input change": round(r["in_change"], 4) for r in ranking}},
           pictures={"relative output change per operator and step": out / "heatmap.png"})
    return 0
