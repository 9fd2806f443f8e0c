"""The GPU check: the system model's xPU side against a device, in one run
(``scripts/gpu_check.py`` runs it on a GPU machine; ``scripts/README.md`` says how).

:func:`run_check` calibrates the model's operators on the device
(:func:`coda.host.system.calibrate.calibrate`), times a full-compute generation and a cached
one (uniform policy, the cache in the device's memory: :func:`choose_cache_backend`), and
compares both with ``coda sim``'s systems a and b, with the roofline and with the calibrated
table; it writes ``OUT/gpu_check.json`` and ``OUT/gpu_check.txt``. Errors of a simulated
system b are ``sim / measured - 1``. The steps in detail: :func:`run_check`; the narrative:
``docs/system-model.md``, "The GPU check".
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from coda.jsonout import json_text
from coda.paths import write_file
from coda.options import add_options, from_args, option

__all__ = ["GpuCheckConfig", "CPU_CHECK", "choose_cache_backend", "denoise",
           "run_check", "main"]

#: the check at a tiny size on a CPU (Wan 2.1 1.3B cut to 2 layers, 32x32 pixels x 5 frames,
#: 3 steps): what tests/experiments/test_gpu_check.py runs, and what ``coda bench`` times
CPU_CHECK = ("--device", "cpu", "--resolution", "32x32", "--frames", "5", "--layers", "2",
             "--steps", "3", "--warmup", "1", "--repeat", "2")


@dataclass(frozen=True)
class GpuCheckConfig:
    """Every option of the GPU check with its default (a GPU machine, Wan 2.1 1.3B 480p)."""
    model: str = option("wan2.1-1.3b", "the model (coda calibrate's presets)")
    resolution: str = option("480p", "480p, 720p or WIDTHxHEIGHT")
    frames: int = option(81, "frames of the video (Wan: 4k+1)")
    layers: int = option(None, "blocks per block list (a check at a small size)", type=int,
                         default_text="the published depth")
    steps: int = option(5, "denoising steps of each timed generation", unit="steps")
    interval: int = option(2, "uniform policy: recompute every k steps", unit="steps")
    warmup_steps: int = option(1, "uniform policy: first steps always computed", unit="steps")
    device: str = option("cuda", "cuda or cpu", choices=("cpu", "cuda"))
    platform: str = option("h200", "the coda sim GPU preset to compare with")
    warmup: int = option(2, "coda calibrate: untimed runs", unit="runs")
    repeat: int = option(5, "coda calibrate: timed runs (median)", unit="runs")
    seed: int = option(0, "seed of weights and inputs")
    out: str = option("build/gpu_check", "output folder")


def choose_cache_backend():
    """THE place where the cached generation's cache backend is chosen: ``(name, make
    config, note)`` with ``make(policy) -> CodaCacheConfig``: the device-resident cache
    (:class:`coda.host.cache.device.DeviceCache`, system b of the ablation)."""
    from coda.host.cache.device import DeviceCache
    from coda.host.cache.engine import CodaCacheConfig

    return ("device", lambda policy: CodaCacheConfig(DeviceCache(), policy),
            "device-resident cache (DeviceCache: system b)")


def denoise(model, cfg: str, cond: dict, uncond: dict, steps: int):
    """A CFG loop as the diffusers pipelines run one (``cfg``: ``"two_pass"`` cond then uncond
    calls, ``"batched"`` one ``"uncond|cond"`` call, ``"distilled"`` cond only), each call
    under ``cache_context`` with its step; guidance 5, and an Euler-like update
    ``x - 0.1 * eps``. ``cond`` / ``uncond``: the calls' keyword arguments (``cond`` has the
    latent ``hidden_states``). Returns the last latent."""
    import torch

    x, rest = cond["hidden_states"], {k: v for k, v in cond.items() if k != "hidden_states"}
    n = x.shape[0]
    with torch.no_grad():
        for i in range(steps):
            t = torch.full((n,), 900 - 800 * i // max(1, steps), dtype=torch.long,
                           device=x.device)
            ctx = dict(step_index=i, num_inference_steps=steps)

            def call(name, kw, h, tt):
                with model.cache_context(name, **ctx):
                    out = model(**{**kw, "hidden_states": h, "timestep": tt})[0]
                return out[:, :x.shape[1]] if out.shape != h.shape else out

            if cfg == "two_pass":
                c = call("cond", rest, x, t)
                u = call("uncond", {**rest, **uncond}, x, t)
            elif cfg == "batched":
                both = {k: torch.cat([uncond.get(k, v), v]) if torch.is_tensor(v) else v
                        for k, v in rest.items()}
                u, c = call("uncond|cond", both, torch.cat([x, x]), torch.cat([t, t])).chunk(2)
            else:
                c = call("cond", rest, x, t)
                u = c
            x = x - 0.1 * (u + 5.0 * (c - u))
    return x


def _generations(model_name, spec, latent, dev, steps, policy, seed, timing):
    """Full compute and cached generation of ``spec`` on ``dev``: (full, cached) dicts."""
    import torch

    from coda.host.cache.arch import model_ops
    from coda.host.cache.engine import apply_coda_cache, remove_coda_cache
    from coda.host.system.trace import build, inputs

    model, dtype = build(spec, dev, seed=seed)
    cond = inputs(model_name, spec, latent, dtype, dev, 1, seed)
    uncond = {"encoder_hidden_states": inputs(model_name, spec, latent, dtype, dev, 1,
                                              seed + 1)["encoder_hidden_states"]}
    branches = 1 if spec.cfg == "distilled" else 2
    executions = steps * branches * len(model_ops(model).ops)
    with torch.no_grad():
        model(**cond)                                    # one untimed call
    result = {}
    full_s = timing(lambda: result.__setitem__("full", denoise(model, spec.cfg, cond, uncond,
                                                                steps)))
    full = {"seconds": full_s, "per_step_s": full_s / steps, "op_executions": executions}
    backend, make, note = choose_cache_backend()
    cached = {"backend": backend, "backend_note": note, "comparable_to_b": backend == "device"}
    hook = apply_coda_cache(model, make(policy))
    try:
        cached_s = timing(lambda: result.__setitem__("cached", denoise(
            model, spec.cfg, cond, uncond, steps)))
    except Exception as exc:          # the engine as it is may not run on this device
        return full, {**cached, "ran": False, "reason": f"{type(exc).__name__}: {exc}"}
    finally:
        stats = dict(hook.stats)
        remove_coda_cache(model)
    a, b = result["full"].float(), result["cached"].float()
    return full, {**cached, "ran": True, "seconds": cached_s, "per_step_s": cached_s / steps,
                  "ops_computed": stats["ops_computed"], "ops_reused": stats["ops_reused"],
                  "segments": stats["segments"],
                  "skipped_fraction": stats["ops_reused"] / executions,
                  "relative_l2_to_full": float((b - a).norm() / a.norm())}


def _simulated(cfg: GpuCheckConfig, table, out: Path) -> dict:
    """coda sim's systems a and b of the checked generation, roofline and calibrated."""
    from coda.host.system.gputable import GpuTimes
    from coda.host.system.sim import simulate

    res = {}
    for name, gpu_table in (("roofline", None), ("calibrated", GpuTimes(table))):
        rep = simulate(cfg.model, resolution=cfg.resolution, frames=cfg.frames,
                       steps=cfg.steps, gpu=cfg.platform, interval=cfg.interval,
                       warmup=cfg.warmup_steps, systems="ab", layers=cfg.layers,
                       gpu_table=gpu_table, shape_cache=out / "shapes", record=False)["report"]
        res[name] = {s: (r["latency_s"] if r["fits"] else None)
                     for s, r in rep["systems"].items()}
    return {**res, "cache_bytes": rep["cache_bytes"], "reused_ops": rep["cache"]["reused_ops"],
            "memory": rep["memory"]}


def _error(sim, measured):
    return None if sim is None or not measured else sim / measured - 1.0


def run_check(cfg: GpuCheckConfig, command: str = "") -> dict:
    """Everything the check measures and models, as a dict (the steps below); writes
    ``OUT/gpu_table.json``. Raises ValueError for bad input (a device this torch cannot
    use, a model or size coda calibrate refuses, counts below 1).

    On ``--model`` (default Wan 2.1 1.3B) at ``--resolution`` x ``--frames`` (default 480p x 81),
    with the published configuration (``--layers`` cuts it to fewer blocks per block list, for a
    check at a small size) and random weights (no download), on ``--device``:

    1. ``coda calibrate`` at that shape (:func:`coda.host.system.calibrate.calibrate`) writes
       ``OUT/gpu_table.json``;
    2. a full-compute generation of ``--steps`` steps (the pipeline's CFG loop: ``cache_context``
       per branch, as the cache engine expects) is timed end to end (CUDA events, or
       ``time.perf_counter`` on a CPU) after one untimed transformer call;
    3. the same generation under the cache engine (``apply_coda_cache``) with the uniform policy
       (``--interval`` 2: every other step after ``--warmup-steps`` reused, half of the steps
       after the warm-up) is timed the same way, with the cache in the GPU's memory
       (:class:`~coda.host.cache.device.DeviceCache`, system b: slots as device tensors, the
       cache operators as torch ops there), chosen in one place, :func:`choose_cache_backend`;
    4. ``coda sim`` of the same generation (:func:`coda.host.system.sim.simulate`, systems a and b,
       ``--platform``, default the H200 preset) with the roofline and with the calibrated table;

    and writes ``OUT/gpu_check.json`` (every figure, the versions, date, command, machine) and
    ``OUT/gpu_check.txt`` (the comparison as a short table), and prints the table.
    Errors of a simulated system b are ``sim / measured - 1``.
    """
    from coda.host.cache.policies import UniformIntervalPolicy
    from coda.host.system.calibrate import calibrate, measure
    from coda.host.cache.device import resolve_device
    from coda.host.system.presets import get_spec, video_size
    from coda.host.system.trace import with_layers

    from coda.host.system.platforms import GPUS
    from coda.paths import check_output_path

    for flag, v in (("steps", cfg.steps), ("warmup-steps", cfg.warmup_steps),
                    ("repeat", cfg.repeat), ("layers", cfg.layers)):
        if v is not None and v < 1:
            raise ValueError(f"--{flag} {v}: expected >= 1")
    if cfg.interval < 2:
        raise ValueError(f"--interval {cfg.interval}: expected >= 2 (every k-th step computed)")
    if cfg.platform not in GPUS:
        raise ValueError(f"--platform {cfg.platform!r}: expected one of {', '.join(GPUS)}")
    dev = resolve_device(cfg.device, "--device")
    spec = with_layers(get_spec(cfg.model), cfg.layers)   # a bad model fails here, before work
    video_size(cfg.model, cfg.resolution, None, cfg.frames)
    out = check_output_path(cfg.out, "--out", folder=True)
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    table = calibrate(cfg.model, resolution=cfg.resolution, frames=cfg.frames,
                      device=cfg.device, warmup=cfg.warmup, repeat=cfg.repeat, seed=cfg.seed,
                      command=f"{command} (its coda calibrate step)")
    write_file(out / "gpu_table.json", json_text(table, indent=1) + "\n")
    sim = _simulated(cfg, table, out)
    h, w, n = video_size(cfg.model, cfg.resolution, None, cfg.frames)
    latent = spec.latent(cfg.model, h, w, n)
    policy = UniformIntervalPolicy(default_interval=cfg.interval, warmup=cfg.warmup_steps)
    full, cached = _generations(cfg.model, spec, latent, dev, cfg.steps, policy, cfg.seed,
                                lambda fn: measure(fn, dev, 0, 1))
    rows = [{"what": "full compute", "system": "a", "measured_s": full["seconds"],
             "roofline_s": sim["roofline"]["a"], "calibrated_s": sim["calibrated"]["a"],
             "comparable": True},
            {"what": f"cached, uniform interval {cfg.interval} ({cached['backend']})",
             "system": "b", "measured_s": cached.get("seconds"),
             "roofline_s": sim["roofline"].get("b"), "calibrated_s": sim["calibrated"].get("b"),
             "comparable": cached["comparable_to_b"] and cached["ran"]}]
    for r in rows:
        r["roofline_error"] = _error(r["roofline_s"], r["measured_s"])
        r["calibrated_error"] = _error(r["calibrated_s"], r["measured_s"])
    return {
        "check": "coda GPU check (scripts/gpu_check.py)", "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": table["device"], "timer": table["timer"], "host_cpu": table["host_cpu"],
        "python": sys.version.split()[0],
        "model": cfg.model, "layers": cfg.layers,
        "size": {"height": h, "width": w, "frames": n, "latent": list(latent),
                 "video_tokens": table["video_tokens"]},
        "steps": cfg.steps, "dtype": spec.dtype,
        "policy": {"name": "uniform", "interval": cfg.interval, "warmup": cfg.warmup_steps},
        "platform": cfg.platform, "table": str(out / "gpu_table.json"),
        "full": full, "cached": cached, "sim": sim, "comparison": rows,
        "speedup": {"measured": (full["seconds"] / cached["seconds"]) if cached["ran"]
                    else None,
                    **{k: (sim[k]["a"] / sim[k]["b"]) if sim[k].get("b") else None
                       for k in ("roofline", "calibrated")}},
        "wall_s": time.perf_counter() - t0,
    }


def text_table(rep: dict) -> str:
    """The comparison as a few lines of text."""
    def f(v, pct=False):
        return "-" if v is None else (f"{100 * v:+.1f} %" if pct else f"{v:.4g}")

    lines = [f"{rep['model']} {rep['size']['width']}x{rep['size']['height']}, "
             f"{rep['size']['frames']} frames, layers {rep['layers'] or 'all'}, "
             f"{rep['steps']} steps on {rep['device']['name']} ({rep['timer']}), "
             f"torch {rep['device']['torch']}, {rep['date']}; simulated: {rep['platform']}",
             f"{'generation':<46} {'measured s':>11} {'sim':>4} {'roofline s':>11} "
             f"{'err':>9} {'calibrated s':>13} {'err':>9}"]
    for r in rep["comparison"]:
        lines.append(f"{r['what']:<46} {f(r['measured_s']):>11} {r['system']:>4} "
                     f"{f(r['roofline_s']):>11} {f(r['roofline_error'], True):>9} "
                     f"{f(r['calibrated_s']):>13} {f(r['calibrated_error'], True):>9}"
                     + ("" if r["comparable"] else "  (not comparable)"))
    c = rep["cached"]
    lines.append(f"cache backend: {c['backend_note']}" + ("" if c["ran"] else
                                                          f"; not run: {c['reason']}"))
    s = rep["speedup"]
    lines.append(f"speed-up full/cached: measured {f(s['measured'])}, roofline "
                 f"{f(s['roofline'])}, calibrated {f(s['calibrated'])}")
    return "\n".join(lines) + "\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"gpu_check: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """The check from a command line (``scripts/gpu_check.py``'s options). Bad input: one
    line ``gpu_check: error: ...``, exit 2."""
    parser = _Parser(prog="gpu_check", description=__doc__.splitlines()[0])
    add_options(parser, GpuCheckConfig)
    argv = sys.argv[1:] if argv is None else argv
    cfg = from_args(GpuCheckConfig, parser.parse_args(argv))
    command = "scripts/gpu_check.py " + " ".join(argv)
    try:
        rep = run_check(cfg, command)
    except ValueError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    out = Path(cfg.out)
    write_file(out / "gpu_check.json", json_text(rep, indent=1) + "\n")
    text = text_table(rep)
    write_file(out / "gpu_check.txt", text)
    print(text, end="")
    print(f"written: {out / 'gpu_check.json'}, {out / 'gpu_check.txt'}, {out / 'gpu_table.json'}")
    return 0
