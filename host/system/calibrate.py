"""``coda calibrate``: time a video DiT's cacheable operators, the rest of its blocks, the cache
operators and the host link on a device, and write the table ``coda sim --gpu-table`` reads
(:mod:`coda.host.system.gputable`).

:func:`calibrate` builds the model from its published configuration
(:data:`coda.host.system.presets.MODELS`) with one block per block list
(:func:`coda.host.system.trace.with_layers`) and the class's own random initialisation
(seeded; no download) in its run dtype on the device, and times each forward, block,
operator, cache operator and host copy with :func:`measure` (CUDA events after warm-up, the
median of ``--repeat``; ``time.perf_counter`` on the CPU). Rows per call: 1, and 2 for a
model whose pipeline batches CFG. What is timed and how: ``docs/system-model.md``, "Measured
xPU times".
"""

from __future__ import annotations

import datetime
import platform as _platform
import statistics
import time
import dataclasses
from dataclasses import dataclass

from coda.jsonout import json_text
from coda.results import cpu_model
from coda.paths import write_file
from coda.host.cache.device import DEVICES, resolve_device
from coda.options import add_options, option

from .gputable import TABLE_KIND, TABLE_VERSION, GpuTimes, fit_copy
from .presets import MODELS, get_spec, shipped_presets, video_size

__all__ = ["CalibrateConfig", "calibratable", "measure",
           "calibrate", "configure", "main"]

#: segment lengths timed on the device (1 is the gated residual)
SEGMENT_TERMS = (2, 4, 8)


def calibratable() -> list[str]:
    """The presets with a diffusers class to build (every one but the hand-written
    Open-Sora): :data:`coda.host.system.presets.MODELS` and the shipped Lattes
    (:func:`coda.host.system.presets.shipped_presets`)."""
    return sorted(list(MODELS) + list(shipped_presets()))


@dataclass(frozen=True)
class CalibrateConfig:
    """Every option of ``coda calibrate`` with its default."""
    model: str = option(None, f"one of {', '.join(calibratable())}", type=str, required=True)
    resolution: str = option(None, "480p, 720p or WIDTHxHEIGHT (as the coda sim to compare "
                             "with)", type=str, required=True)
    seconds: float = option(None, "video length (as the coda sim to compare with)",
                            type=float, unit="s", required=True, exclusive="length")
    frames: int = option(None, "frames instead of --seconds", type=int, required=True,
                         exclusive="length")
    device: str = option("cpu", "where to time: cpu (time.perf_counter) or cuda (CUDA "
                         "events)", choices=DEVICES)
    warmup: int = option(3, "untimed runs before timing each operation", unit="runs")
    repeat: int = option(10, "timed runs of each operation (the table keeps the median)",
                         unit="runs")
    seed: int = option(0, "seed of the random weights and inputs")
    out: str = option("build/gpu_table.json", "the table (JSON)")


#: the configuration ``coda calibrate`` hands to :func:`main` (coda.cli)
CONFIG = CalibrateConfig


def configure(parser) -> None:
    add_options(parser, CalibrateConfig)


def measure(fn, device, warmup: int, repeat: int) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` untimed ones: CUDA
    events on a CUDA ``device`` (the stream synchronised before each run), else
    ``time.perf_counter``."""
    import torch

    cuda = getattr(device, "type", device) == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if cuda:
            torch.cuda.synchronize(device)
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _State:
    """The engine state a block spec sees (:class:`coda.host.cache.arch.base.StepState`) when
    every row computes: ``take`` / ``put`` / ``rows`` on all ``b`` rows."""

    def __init__(self, b: int, h: dict):
        self.b, self.h = b, h

    def take(self, stream, samples):
        return self.h[stream]

    def put(self, stream, samples, value):
        self.h[stream] = value.contiguous()

    def rows(self, t, samples, per: int = 1):
        return t


def _time_block(ref, args, kwargs, batch, timing) -> dict:
    """One block's forward and each of its operators (BlockSpec.compute), seconds; the
    operators' cached ``[tokens, channels]`` per sample."""
    import torch

    from coda.host.cache.arch.base import BlockCall

    spec, block = ref.spec, ref.module
    block_s = timing(lambda: block(*args, **kwargs))
    bound = spec.bind(block, args, kwargs)
    streams = {s: bound.pop(param) for s, param in spec.streams.items()}
    call = BlockCall(spec, block, ref.layer, bound)
    spec.check(call)
    call.prep = spec.prepare(call, batch)
    state = _State(batch, {s: spec.to_canonical(s, x, batch) for s, x in streams.items()})
    samples = torch.arange(batch)
    ops, cached = {}, None
    for op in spec.ops:
        before = dict(state.h)

        def run(op=op, before=before):
            state.h = dict(before)
            return spec.compute(state, call, op, samples)

        ops[op] = timing(run)
        out = run()
        if cached is None:
            c = next(iter(out.values())).shape[-1]
            cached = (sum(t[0].numel() for t in out.values()) // c, c)
    return {"block_s": block_s, "ops": ops, "cached": cached}


def _time_model(name, spec, latent, device, batch, seed, timing) -> dict:
    """Forward, blocks and operators of ``spec`` (one block per list) for ``batch`` rows."""
    import torch

    from coda.host.cache.arch import ARCHITECTURES

    from .trace import build, inputs, with_layers

    model, dtype = build(with_layers(spec, 1), device, seed=seed)
    kwargs = inputs(name, spec, latent, dtype, device, batch, seed)
    refs = ARCHITECTURES[spec.cls].blocks(model)
    caught: dict = {}
    hooks = [r.module.register_forward_pre_hook(
        lambda m, a, kw, name=r.name: caught.setdefault(name, (a, kw)), with_kwargs=True)
        for r in refs]
    with torch.no_grad():
        model(**kwargs)
        for h in hooks:
            h.remove()
        forward_s = timing(lambda: model(**kwargs))
        blocks = {r.name: (r, _time_block(r, *caught[r.name], batch, timing)) for r in refs}
    return {"forward_s": forward_s, "blocks": blocks, "dtype": dtype}


def _time_cache_ops(tokens, channels, dtype, device, seed, timing) -> dict:
    """The cache operators of :mod:`coda.host.nme.ops` and their copies at ``[T, C]``."""
    import torch

    from coda.host.nme import ops

    gen = torch.Generator(device).manual_seed(seed)
    k = max(SEGMENT_TERMS)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    x, c, g, slot = draw(tokens, channels), draw(k, tokens, channels), draw(k, channels), \
        draw(tokens, channels)
    table = {"tokens": tokens, "channels": channels, "dtype": str(dtype).split(".")[-1],
             "gated_residual_s": timing(lambda: ops.gated_residual(x, g[0], c[0])),
             "segment_s": {str(n): timing(lambda n=n: ops.segment(x, g[:n], c[:n]))
                           for n in SEGMENT_TERMS},
             "residual_add_s": timing(lambda: x + c[0]),
             "slot_copy_s": timing(lambda: slot.copy_(c[0]))}
    return table


def _time_copies(tokens, channels, dtype, device, timing) -> dict | None:
    """H2D and D2H of a ``[T, C]`` and a ``[C]`` tensor through pinned host memory (CUDA
    only: a CPU has no host link, None)."""
    import torch

    if device.type != "cuda":
        return None
    out = {}
    for name in ("h2d", "d2h"):
        rows = {}
        for what, shape in (("small", (channels,)), ("big", (tokens, channels))):
            host = torch.zeros(shape, dtype=dtype).pin_memory()
            dev = torch.zeros(shape, dtype=dtype, device=device)
            src, dst = (host, dev) if name == "h2d" else (dev, host)
            rows[what] = (host.numel() * host.element_size(),
                          timing(lambda d=dst, s=src: d.copy_(s, non_blocking=True)))
        (nb_s, t_s), (nb_b, t_b) = rows["small"], rows["big"]
        out[name] = {"small_bytes": nb_s, "small_s": t_s, "bytes": nb_b, "s": t_b,
                     **fit_copy(nb_s, t_s, nb_b, t_b)}
    return out


def _device_info(device) -> dict:
    import diffusers
    import torch

    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else _cpu_name())
    return {"name": name, "type": device.type, "torch": torch.__version__,
            "cuda": torch.version.cuda, "diffusers": diffusers.__version__}


def _cpu_name() -> str:
    return cpu_model() or _platform.processor() or _platform.machine()


def calibrate(model: str, *, resolution, seconds=None, frames=None, device: str = "cpu",
              warmup: int = CalibrateConfig.warmup, repeat: int = CalibrateConfig.repeat,
              seed: int = CalibrateConfig.seed, command: str | None = None) -> dict:
    """The table (``docs/system-model.md``, "Measured xPU times";
    :mod:`coda.host.system.gputable`) of ``model`` at
    ``resolution`` and ``seconds`` / ``frames`` (:func:`coda.host.system.presets.video_size`)
    on ``device``, checked by :class:`~coda.host.system.gputable.GpuTimes`.

    Raises ValueError naming the bad value: an unknown model (the message lists the known
    ones), a size the model cannot take, a device this torch cannot use, ``warmup < 0``,
    ``repeat < 1`` or ``seed < 0``.
    """
    import torch

    if model not in calibratable():
        raise ValueError(f"--model {model!r}: expected one of {', '.join(calibratable())}"
                         + (" (opensora-1.2 has no diffusers class to time)"
                            if model == "opensora-1.2" else ""))
    if warmup < 0 or repeat < 1:
        raise ValueError(f"--warmup {warmup} / --repeat {repeat}: expected >= 0 / >= 1")
    if seed < 0:
        raise ValueError(f"--seed {seed}: expected >= 0 (torch would wrap a negative seed to "
                         "2**64 + seed)")
    dev = resolve_device(device, "--device")
    spec = get_spec(model)
    if seconds is not None and frames is not None:
        raise ValueError("--seconds and --frames: give one of them")
    height, width, n = video_size(model, resolution, seconds, frames)
    latent = spec.latent(model, height, width, n)
    p = spec.patch
    video_tokens = (latent[0] // p[0]) * (latent[1] // p[1]) * (latent[2] // p[2])

    def timing(fn):
        return measure(fn, dev, warmup, repeat)

    batches = (1, 2) if spec.cfg == "batched" else (1,)
    runs = {b: _time_model(model, spec, latent, dev, b, seed, timing) for b in batches}
    first = runs[batches[0]]
    tokens, channels = next(iter(first["blocks"].values()))[1]["cached"]
    ops: dict = {}
    blocks: dict = {}
    other: dict = {}
    for b, run in runs.items():
        in_blocks = 0.0
        for ref, t in run["blocks"].values():
            for op, s in t["ops"].items():
                ops.setdefault(op, {})[str(b)] = s
            # keyed by block list: Latte's spatial and temporal blocks share a class
            blk = blocks.setdefault(ref.name.rsplit(".", 1)[0], {
                "class": ref.spec.block_class, "ops": list(ref.spec.ops), "block_s": {},
                "rest_s": {}})
            blk["block_s"][str(b)] = t["block_s"]
            blk["rest_s"][str(b)] = max(0.0, t["block_s"] - sum(t["ops"].values()))
            in_blocks += t["block_s"]
        other[str(b)] = max(0.0, run["forward_s"] - in_blocks)
    dtype = first["dtype"] if first["dtype"] in (torch.bfloat16, torch.float16) \
        else torch.bfloat16
    with torch.no_grad():
        cache_ops = _time_cache_ops(tokens, channels, dtype, dev, seed, timing)
        copies = _time_copies(tokens, channels, dtype, dev, timing)
    table = {
        "kind": TABLE_KIND, "version": TABLE_VERSION, "device": _device_info(dev),
        "timer": "cuda_events" if dev.type == "cuda" else "perf_counter",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or f"coda calibrate --model {model} --resolution {width}x{height} "
                              f"--frames {n} --device {device}",
        "statistic": "median", "warmup": warmup, "repeat": repeat, "seed": seed,
        "model": model, "cls": spec.cls, "dtype": spec.dtype, "height": height,
        "width": width, "frames": n, "latent": list(latent), "video_tokens": video_tokens,
        "text_tokens": spec.text_tokens, "hidden": channels, "per": "block",
        "batches": list(batches), "ops": ops, "blocks": blocks, "other_s": other,
        "cache_ops": cache_ops, "copies": copies,
        "host_cpu": _cpu_name(),
    }
    GpuTimes(table)          # the table's own check
    return table


def main(cfg: CalibrateConfig) -> int:
    """Run ``coda calibrate`` as ``cfg`` says (what the command line gave, or a
    :class:`CalibrateConfig` built in Python, e.g. ``main(CalibrateConfig(device="cuda"))``):
    time the model's blocks (:func:`calibrate`), write the table to ``--out`` and print it.
    Returns 0; a bad option: ValueError naming it."""
    from coda.paths import check_output_path

    out = check_output_path(cfg.out, "--out")
    # the options as fields (vars() would also hold the command line's given-options record)
    command = ("coda calibrate " + " ".join(
        f"--{f.name.replace('_', '-')} {getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
        if getattr(cfg, f.name) is not None))
    table = calibrate(cfg.model, resolution=cfg.resolution, seconds=cfg.seconds,
                      frames=cfg.frames, device=cfg.device, warmup=cfg.warmup,
                      repeat=cfg.repeat, seed=cfg.seed, command=command)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, json_text(table, indent=1) + "\n")
    print(f"{table['model']} {table['width']}x{table['height']}, {table['frames']} frames on "
          f"{table['device']['name']} ({table['timer']}), per block:")
    for op, per in table["ops"].items():
        print(f"  {op:<14} " + ", ".join(f"batch {b}: {1e3 * s:.3f} ms" for b, s in per.items()))
    print("  other          " + ", ".join(f"batch {b}: {1e3 * s:.3f} ms"
                                          for b, s in table["other_s"].items()))
    print(f"table: {out}")
    return 0
