"""Classifier-free-guidance sampling of the digit DiT with diffusers' ``DDIMScheduler``.

Every transformer call is wrapped in diffusers' ``transformer.cache_context(name,
step_index=i, num_inference_steps=n)`` so cache hooks (:mod:`coda.host.cache.engine`) know the
CFG branch and the step; without hooks the context is inert. Two CFG modes:

- ``"batched"``: one call per step on ``[uncond; cond]`` (context name ``"uncond|cond"``);
- ``"separate"``: two calls per step, ``"uncond"`` then ``"cond"``.

:func:`generate` denoises (DDIM, trailing spacing, x0 not clipped, eta = 0 and CFG scale 5 by
default: :data:`DEFAULT_ETA`, :data:`DEFAULT_GUIDANCE`; its docstring has the sampler and the
devices); :func:`cached_generate` does so with the cache engine on an NMP driver. Why these
settings: ``docs/model.md``, "Sampling".
"""

from __future__ import annotations

import math

import torch

from coda.host.cache.device import resolve_device

from .defaults import DEFAULT_ETA, DEFAULT_GUIDANCE, DEFAULT_STEPS

__all__ = ["MAX_SEED", "max_steps", "check_steps", "check_guidance", "check_seed", "CFG_MODES", "DEFAULT_STEPS", "DEFAULT_GUIDANCE", "DEFAULT_ETA", "make_scheduler", "initial_noise",
           "generate", "cache_mem_words", "video_psnr", "video_ssim", "side_by_side_gif",
           "cached_generate"]

CFG_MODES = ("batched", "separate")


def make_scheduler(config: dict):
    """The DDIM scheduler matching the training noise schedule in ``config["scheduler"]``."""
    from diffusers import DDIMScheduler

    return DDIMScheduler(**config["scheduler"], timestep_spacing="trailing", clip_sample=False,
                         set_alpha_to_one=False)


def initial_noise(seeds: list[int], frames: int, size: int) -> torch.Tensor:
    """float32 [len(seeds), 1, frames, size, size]: sample i from ``torch.Generator`` seeded
    ``seeds[i]`` (the first draw of that generator; :func:`generate` goes on drawing the
    sampler's per-step noise from it)."""
    return _draw([torch.Generator().manual_seed(int(s)) for s in seeds], (1, frames, size, size))


def _draw(generators: list[torch.Generator], shape: tuple[int, ...]) -> torch.Tensor:
    """float32 [len(generators), *shape]: one standard-normal sample from each generator."""
    return torch.cat([torch.randn((1, *shape), generator=g) for g in generators])


@torch.no_grad()
def generate(model, labels, *, num_steps: int = DEFAULT_STEPS,
             guidance_scale: float = DEFAULT_GUIDANCE, seeds: list[int] | None = None,
             seed: int = 0, eta: float = DEFAULT_ETA, frames: int | None = None, size: int | None = None,
             cfg_mode: str = "batched", progress: bool = False,
             reset_cache: bool = True, device=None) -> torch.Tensor:
    """Denoise videos of the given digits with CFG.

    Guidance: ``pred = uncond + scale * (cond - uncond)`` in float32. DDIM with
    ``"trailing"`` timestep spacing (so the first step starts from pure noise at t = 999), x0
    *not* clipped (clipping broke the deterministic sampler: ``docs/model.md``, "Sampling"),
    and eta = 0 by default (deterministic, the setting in which the field's cache methods and
    the shipped CODA schedule are made). ``eta=1`` adds fresh noise of DDPM's posterior
    variance at every step (Song et al., DDIM, eq. 16): ancestral sampling. The initial noise
    and every step's noise of sample i come from its own generator seeded ``seeds[i]``, so a
    sample does not depend on what else is in the batch.

    Device: ``device=...`` moves the model there (``model.to``) and runs the CFG loop there
    (the transformer, the guidance, the scheduler's update, the cache hooks); the noise is
    drawn on the host (CPU generators, so a video's noise is the same on every device) and
    moved, and the videos come back to the host. Without ``device`` it runs where the
    model's parameters are.

    Args:
        model: :class:`coda.host.model.dit.DigitLatte` or :class:`~coda.host.model.dit.TextLatte`
            (eval mode), cache hooks optional.
        labels: what to generate, B of them: digits 0..9 (int sequence or int64 tensor [B])
            for ``DigitLatte``, prompt texts or ``PromptSpec`` for ``TextLatte``
            (the model's ``conditions`` checks them).
        num_steps: DDIM steps (>= 1).
        guidance_scale: CFG scale s (1 = conditional only, still both branches run).
        seeds: per-sample noise seeds (default ``seed + i``).
        seed: base seed when ``seeds`` is None.
        eta: DDIM's eta in [0, 1]: 0 deterministic (default), 1 ancestral (DDPM posterior
            variance).
        frames, size: F and H = W (default: the training data's, from the model config);
            F is 1 (images) or the model's ``video_length``; size a multiple of the patch size
            (other sizes interpolate the patch position embedding, as diffusers does).
        cfg_mode: ``"batched"`` or ``"separate"``.
        progress: show a tqdm bar.
        reset_cache: reset stateful hooks (cache engine) before the first step, so no cache
            is carried over from an earlier generation.
        device: where the model (moved there) and the CFG loop run: ``"cpu"``, ``"cuda"``,
            ``"cuda:N"`` or a ``torch.device`` (default: the model's device).
    Returns:
        float32 [B, 1, F, size, size] on the CPU, clipped to [-1, 1].
    Raises:
        ValueError: bad labels, steps, mode, frames or size; a device that is not there
            (:func:`coda.host.cache.device.resolve_device`).
    """
    labels = model.conditions(labels)
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps}: expected >= 1")
    if cfg_mode not in CFG_MODES:
        raise ValueError(f"cfg_mode={cfg_mode!r}: expected one of {CFG_MODES}")
    if not 0.0 <= float(eta) <= 1.0:
        raise ValueError(f"eta={eta}: expected a value in [0, 1]")
    cfg = model.config
    frames = cfg["data"]["frames"] if frames is None else int(frames)
    size = cfg["data"]["size"] if size is None else int(size)
    patch, max_frames = cfg["transformer"]["patch_size"], cfg["transformer"]["video_length"]
    if frames not in (1, max_frames) or size < patch or size % patch:
        raise ValueError(f"frames={frames}, size={size}: expected 1 or {max_frames} frames (Latte's "
                         f"temporal embedding has video_length={max_frames} entries) and a size "
                         f"that is a positive multiple of the patch size {patch}")
    b = labels.shape[0]
    seeds = [seed + i for i in range(b)] if seeds is None else [int(s) for s in seeds]
    if len(seeds) != b:
        raise ValueError(f"{len(seeds)} seeds for {b} labels: expected one per sample")
    if device is not None:
        model.to(resolve_device(device))
    device = next(model.parameters()).device
    transformer = model.transformer
    if reset_cache:
        transformer._reset_stateful_cache()
    sched = make_scheduler(cfg)
    sched.set_timesteps(num_steps)
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    # = initial_noise(seeds, ...), drawn on the host
    x = _draw(generators, (1, frames, size, size)).to(device)
    labels = labels.to(device)
    null = model.null_conditions(b).to(device)
    steps = sched.timesteps
    if progress:
        from tqdm.auto import tqdm
        steps = tqdm(steps, desc="denoise", leave=False)
    from coda.host.cache.engine import coda_generation
    with coda_generation(transformer):    # ended by an exception: its cache slots are freed
        for i, t in enumerate(steps):
            uncond, cond = _predict(model, x, t, labels, null, i, num_steps, cfg_mode)
            pred = uncond + guidance_scale * (cond - uncond)
            noise = _draw(generators, x.shape[1:]).to(device) if eta > 0 else None
            x = sched.step(pred, t, x, eta=float(eta), variance_noise=noise).prev_sample
    return x.clamp(-1.0, 1.0).cpu()


def _predict(model, x, t, labels, null, step, num_steps, cfg_mode):
    transformer = model.transformer
    tt = torch.full((x.shape[0],), int(t), dtype=torch.long, device=x.device)
    temporal = x.shape[2] > 1      # single images skip the temporal blocks, as in training
    if cfg_mode == "batched":
        with transformer.cache_context("uncond|cond", step_index=step, num_inference_steps=num_steps):
            out = model(torch.cat([x, x]), torch.cat([tt, tt]), torch.cat([null, labels]),
                        temporal=temporal)
        return out.chunk(2)
    with transformer.cache_context("uncond", step_index=step, num_inference_steps=num_steps):
        uncond = model(x, tt, null, temporal=temporal)
    with transformer.cache_context("cond", step_index=step, num_inference_steps=num_steps):
        cond = model(x, tt, labels, temporal=temporal)
    return uncond, cond


# ---------------------------------------------------------------- quality and the cached run
def video_psnr(test: torch.Tensor, reference: torch.Tensor, data_range: float = 2.0) -> float:
    """PSNR in dB of ``test`` against ``reference`` (same shape, values in [-1, 1], so the data
    range is 2): ``10 log10(range^2 / MSE)`` over all elements; ``inf`` if identical."""
    if test.shape != reference.shape:
        raise ValueError(f"shapes {tuple(test.shape)} vs {tuple(reference.shape)}: expected equal")
    mse = float(((test.double() - reference.double()) ** 2).mean())
    return float("inf") if mse == 0 else 10.0 * torch.log10(torch.tensor(data_range ** 2 / mse)).item()


def video_ssim(test: torch.Tensor, reference: torch.Tensor, data_range: float = 2.0) -> float:
    """Mean SSIM over all frames (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5,
    K1 = 0.01, K2 = 0.03, valid windows only). Inputs [B, 1, F, H, W] with H, W >= 11."""
    if test.shape != reference.shape or test.ndim != 5 or min(test.shape[-2:]) < 11:
        raise ValueError(f"shapes {tuple(test.shape)} vs {tuple(reference.shape)}: expected equal "
                         "[B, 1, F, H>=11, W>=11]")
    x = test.double().reshape(-1, 1, *test.shape[-2:])
    y = reference.double().reshape(-1, 1, *reference.shape[-2:])
    g = torch.exp(-((torch.arange(11, dtype=torch.float64) - 5) ** 2) / (2 * 1.5 ** 2))
    g = g / g.sum()
    win = (g[:, None] * g[None, :])[None, None]
    conv = lambda t: torch.nn.functional.conv2d(t, win)  # noqa: E731
    mx, my = conv(x), conv(y)
    vx, vy, cxy = conv(x * x) - mx ** 2, conv(y * y) - my ** 2, conv(x * y) - mx * my
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    ssim = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    return float(ssim.mean())


def side_by_side_gif(path, *videos: torch.Tensor, scale: int = 4, frame_ms: int = 150,
                     gap: int = 2, columns: int = 1) -> None:
    """Write an animated GIF: for each frame index, the given videos' frames side by side
    (left to right in argument order) and the batch's samples laid out in a grid of
    ``columns`` columns, row by row (sample i in row i // columns, column i % columns;
    missing cells of the last row stay black).

    Args:
        path: output file (``.gif``).
        *videos: float [B, 1, F, H, W] in [-1, 1], all the same shape (e.g. full, cached).
        scale: integer upscaling (nearest) of each pixel.
        frame_ms: display time of one frame in milliseconds.
        gap: mid-grey pixels between panels (before scaling).
        columns: samples per row (>= 1; 1 stacks them top to bottom).
    Raises:
        ValueError: no videos, different shapes, or columns < 1.
        OSError: the file cannot be written (naming ``path``; it is then left as it was,
            :func:`coda.paths.atomic_write`).
    """
    from PIL import Image

    from coda.paths import atomic_write

    if not videos or any(v.shape != videos[0].shape or v.ndim != 5 for v in videos):
        raise ValueError(f"videos {[tuple(v.shape) for v in videos]}: expected one or more of one "
                         "shape [B, 1, F, H, W]")
    if columns < 1:
        raise ValueError(f"columns={columns}: expected >= 1")
    b, _, f, h, w = videos[0].shape
    pad = lambda t, dim: torch.nn.functional.pad(t, (0, gap) if dim == 1 else (0, 0, 0, gap),  # noqa: E731
                                                 value=0.0)
    blank = torch.full((h, w), -1.0)
    frames = []
    for i in range(f):
        cells = [torch.cat([pad(v[s, 0, i] if s < b else blank, 1) for v in videos], dim=1)
                 for s in range(-(-b // columns) * columns)]
        rows = [torch.cat(cells[r:r + columns], dim=1) for r in range(0, len(cells), columns)]
        grid = torch.cat([pad(r, 0) for r in rows], dim=0)
        pixels = ((grid.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
        img = Image.fromarray(pixels)  # uint8 [H, W] -> mode "L"
        frames.append(img.resize((img.width * scale, img.height * scale), Image.NEAREST))
    with atomic_write(path) as fh:        # the whole GIF or, on an error, no change
        frames[0].save(fh, format="GIF", save_all=True, append_images=frames[1:],
                       duration=frame_ms, loop=0)


def cached_generate(model, labels, driver, policy=None, *, events=None,
                    segment_output: str = "sum", cache: str = "reuse", forecast=None,
                    cache_format: str = "bf16", cache_group: int | None = None,
                    **kwargs) -> tuple[torch.Tensor, dict]:
    """Generate with the CODA cache engine attached for this call only.

    Args:
        model: the DigitLatte or TextLatte.
        labels: what :func:`generate` takes (digits, or prompts for the text model).
        driver: an ``NMPDriver`` (its backend decides torch or RTL execution of segments) or
            a :class:`coda.host.cache.device.DeviceCache` (the cache in device memory).
        policy: a cache policy or ``Schedule`` (default ``UniformIntervalPolicy()``).
        events: an :class:`coda.host.cache.events.EventLog` that receives the operator events
            (default: a fresh one, dropped).
        segment_output: the segments' form (``CodaCacheConfig.segment_output``).
        cache, forecast: reuse or forecast, and the forecast's alpha table
            (``CodaCacheConfig.cache`` / ``.forecast``).
        cache_format, cache_group: how computed outputs are kept, ``"bf16"`` or ``"int8"``
            with G channels per scale (``CodaCacheConfig.cache_format`` / ``.cache_group``).
        **kwargs: passed to :func:`generate` (num_steps, guidance_scale, seeds, cfg_mode,
            device, ...): with ``device="cuda"`` the model and the engine run on the GPU, an
            ``NMPDriver`` takes the segments' tensors over to the host and back, a
            :class:`coda.host.cache.device.DeviceCache` keeps the cache on the GPU.
    Returns:
        (videos [B, 1, F, H, W], stats): the generation's counters
        (:meth:`coda.host.cache.events.EventLog.stats`: ops_computed, ops_reused,
        ops_skipped_fraction, segments, programs, stores, nme_cycles, pcie_bytes, ...; and
        calls).
    """
    from coda.host.cache.engine import CodaCacheConfig, apply_coda_cache, remove_coda_cache

    hook = apply_coda_cache(model.transformer, CodaCacheConfig(
        driver, policy, events=events, segment_output=segment_output, cache=cache,
        forecast=forecast, cache_format=cache_format, cache_group=cache_group))
    try:
        videos = generate(model, labels, **kwargs)
        stats = hook.stats
    finally:
        remove_coda_cache(model.transformer)
    return videos, stats


def cache_mem_words(model, videos: int, ranks: int, lanes: int, inputs: bool = False,
                    history: int = 1, cache_format: str = "bf16",
                    cache_group: int | None = None) -> int:
    """Words of rank memory (a power of two, >= 2**18) that hold the cache of ``videos``
    videos of ``model`` (a shipped model, or a :class:`coda.experiments.cfg_loop.CFGLoop`:
    its measured shape and operators) generated at once, tiled over ``ranks`` ranks of ``lanes``-element (16-bit) words.

    Per video, every CFG branch x operator type x layer keeps a slot of [F*N tokens, hidden]
    16-bit elements (``history`` of them: 2 in forecast mode, :mod:`coda.host.cache.forecast`,
    which reads an operator's last two outputs), and with ``inputs`` one more for the
    operator's input (the monitor references of DRA and TeaCache, the profiler's inputs), plus the slot of zeros its sum
    segments read as x (:mod:`coda.host.cache.engine`; placed in another colour, but every
    colour holds as many of them as groups). The driver places each rank's tile of a slot at a power-of-two-aligned
    base and all slots of one branch of one video (a slot group) in one DRAM bank colour
    (:mod:`coda.host.nmp.placement`), a quarter of the memory for the 4 banks per bank group of
    every DRAM preset (JEDEC JESD79-4 / JESD79-5 / JESD209-5): the groups fill the colours
    in turn, so the fullest colour holds ``ceil(groups / 4)`` groups. 1.5x that leaves room
    for the operators' scratch and fragmentation. With ``cache_format="int8"`` an output slot
    holds the int8 values (two per 16-bit element) and one 16-bit scale per ``cache_group``
    channels (:mod:`coda.host.cache.compress`), about half a 16-bit slot; kept inputs and the
    slot of zeros stay 16-bit.
    Raises ValueError if videos, ranks or lanes < 1, history is not 1 or 2, or as
    :func:`coda.host.cache.compress.resolve_group` (an unknown format, a bad G).
    """
    from coda.host.nmp.placement import DEFAULT_STANDARD
    from coda.host.cache.schedule import BRANCHES, OP_TYPES
    from coda.hw.dram.standards import get_standard
    from coda.host.cache.compress import check_format, resolve_group

    check_format(cache_format)
    if min(videos, ranks, lanes) < 1:
        raise ValueError(f"videos={videos}, ranks={ranks}, lanes={lanes}: expected >= 1 each")
    if history not in (1, 2):
        raise ValueError(f"history={history}: expected 1 (reuse) or 2 (forecast)")
    if callable(getattr(model, "shape", None)):  # a CFGLoop over a diffusers transformer
        from coda.host.cache.arch import model_ops

        shape = model.shape()        # a joint model's slots hold its text stream too
        tokens, hidden = shape["tokens"] + shape["text_tokens"], shape["hidden"]
        ops = len(model_ops(model.transformer).ops)
    else:
        cfg = model.config
        tcfg = cfg["transformer"]
        tokens = cfg["data"]["frames"] * (cfg["data"]["size"] // tcfg["patch_size"]) ** 2
        hidden = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
        ops = len(OP_TYPES) * len(model.transformer.transformer_blocks)
    rows = -(-tokens // ranks)
    tile = -(-(rows * hidden) // lanes)           # words of the largest 16-bit tile
    region = 1 << (tile - 1).bit_length()
    out_region = region
    if cache_format == "int8":
        group = resolve_group(hidden, lanes, cache_group)
        words8 = -(-(rows * hidden) // (2 * lanes)) + -(-(rows * hidden // group) // lanes)
        out_region = 1 << (words8 - 1).bit_length()
    colours = get_standard(DEFAULT_STANDARD).banks_per_group
    groups = videos * len(BRANCHES)
    per_group = ops * (history * out_region + inputs * region) + region
    words = 1.5 * colours * -(-groups // colours) * per_group
    return 1 << max(18, math.ceil(math.log2(words)))


# ---------------------------------------------------------------- the commands' generation values
#: the largest seed the commands take (seeds are 0..MAX_SEED)
MAX_SEED = 2**31 - 1


def max_steps(config: dict | None = None) -> int:
    """The most DDIM steps a run can take: the noise schedule's ``num_train_timesteps``
    (``config["scheduler"]``, default: the shipped model's configuration file)."""
    if config is None:
        import json

        from coda.host.model.dit import CONFIG_FILE
        config = json.loads(CONFIG_FILE.read_text())
    return int(config["scheduler"]["num_train_timesteps"])


def check_steps(steps: int, flag: str = "--steps", *, lo: int = 1,
                config: dict | None = None) -> int:
    """``steps`` in ``lo..max_steps(config)`` (DDIM cannot take more steps than the model
    was trained with timesteps). Raises ValueError naming ``flag``."""
    hi = max_steps(config)
    if not lo <= steps <= hi:
        raise ValueError(f"{flag} {steps}: expected {lo}..{hi} (at least {lo}; at most the "
                         f"model's {hi} training timesteps, num_train_timesteps of its "
                         "noise schedule)")
    return steps


def check_guidance(value: float, flag: str = "--guidance") -> float:
    """A CFG scale: finite and >= 0 (0: the unconditional branch alone, 1: the conditional
    one; a negative scale would push the video away from its prompt). Raises ValueError."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{flag} {value}: expected a finite CFG scale >= 0 (0 = unconditional "
                         "only, 1 = conditional only, > 1 = classifier-free guidance)")
    return value


def check_seed(value: int, flag: str = "--seed", count: int = 1) -> int:
    """A seed in ``0..MAX_SEED``; with ``count`` > 1 the run uses ``value .. value + count -
    1``, all in range. Raises ValueError naming ``flag``."""
    hi = MAX_SEED - (count - 1)
    if not 0 <= value <= hi:
        extra = (f" (the run's {count} videos take seeds {flag} .. {flag} + {count - 1}, "
                 f"each <= {MAX_SEED})" if count > 1 else "")
        raise ValueError(f"{flag} {value}: expected an integer 0..{hi}{extra}")
    return value
