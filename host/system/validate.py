"""Checks of the system model against the world, and its own speed.

``python -m coda.host.system.validate [--out build/system]``:

1. **Published full-generation latencies** (:data:`PUBLISHED`): each case is replayed as
   system a (GPU only) on the named GPU's preset, at the published model, resolution,
   frames and steps; predicted / published is reported. The model covers the transformer's
   denoising loop only: the published times also contain text encoding and VAE decoding
   (and, where the source says so, CPU offload), so a prediction somewhat below the
   published time is expected. Written to ``validation.json``.
2. **Simulation speed**: wall seconds to synthesise and replay a 50-step generation of
   Wan 2.1-14B at 720p x 4 s as each system (shapes traced once and cached). Written to
   ``bench.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

__all__ = ["PUBLISHED", "validate", "bench", "main"]

#: published generation times: model, size, frames, steps, GPU, seconds, source, quote
PUBLISHED = [
    dict(model="wan2.1-1.3b", resolution="832x480", frames=81, steps=50, gpu="rtx4090",
         seconds=240.0,
         source="https://github.com/Wan-Video/Wan2.1 (README)",
         quote="It can generate a 5-second 480P video on an RTX 4090 in about 4 minutes "
               "(without optimization techniques like quantization)",
         notes="run with --offload_model True --t5_cpu (T5 on the CPU), VAE decode included"),
    dict(model="wan2.1-1.3b", resolution="832x480", frames=81, steps=50, gpu="a800",
         seconds=175.0,
         source="https://github.com/ali-vilab/TeaCache (TeaCache4Wan2.1 README), as "
                "summarised at http://www.xdnf.cn/news/556939.html",
         quote="1.3B模型(480P):原始延迟~175秒 (single A800)",
         notes="Wan's generate.py, 81 frames default"),
    dict(model="wan2.1-14b", resolution="1280x720", frames=81, steps=50, gpu="a800",
         seconds=55 * 60.0,
         source="https://github.com/ali-vilab/TeaCache (TeaCache4Wan2.1 README), as "
                "summarised at http://www.xdnf.cn/news/556939.html",
         quote="14B模型(720P):原始延迟~55分钟 (single A800)",
         notes="Wan's generate.py, 81 frames default"),
    dict(model="cogvideox-5b", resolution="720x480", frames=49, steps=50, gpu="a100",
         seconds=180.0,
         source="https://github.com/THUDM/CogVideo (README model table), as mirrored at "
                "https://replicate.com/cuuupid/cogvideox-5b/readme",
         quote="Inference Speed (Step = 50, FP/BF16): Single A100: ~180 seconds",
         notes="diffusers with enable_model_cpu_offload() and VAE tiling; BF16"),
    dict(model="cogvideox-2b", resolution="720x480", frames=49, steps=50, gpu="a100",
         seconds=90.0,
         source="https://github.com/THUDM/CogVideo (README model table), as mirrored at "
                "https://replicate.com/cuuupid/cogvideox-5b/readme",
         quote="Inference Speed (Step = 50, FP/BF16): Single A100: ~90 seconds",
         notes="diffusers with enable_model_cpu_offload() and VAE tiling; FP16"),
    dict(model="hunyuanvideo", resolution="1280x720", frames=129, steps=50, gpu="a800",
         seconds=50 * 60.0,
         source="TeaCache4HunyuanVideo README (https://github.com/ali-vilab/TeaCache), as "
                "quoted in ../shared/SYSTEM.md; not re-verified (not in the search corpus)",
         quote="HunyuanVideo 720p, 129 frames, 50 steps on A800: ~50 min",
         notes="guidance-distilled: one transformer call per step"),
]


def validate(cases=PUBLISHED, shape_cache: Path | None = None) -> list[dict]:
    """Predicted (system a) against published seconds for every case."""
    from .sim import simulate

    rows = []
    for c in cases:
        r = simulate(c["model"], resolution=c["resolution"], frames=c["frames"],
                     steps=c["steps"], gpu=c["gpu"], dimms=8, ranks=8, systems="a",
                     record=False, shape_cache=shape_cache)
        a = r["report"]["systems"]["a"]
        rows.append({**c, "predicted_s": round(a["latency_s"], 1),
                     "ratio": round(a["latency_s"] / c["seconds"], 3),
                     "within_25pct": abs(a["latency_s"] / c["seconds"] - 1) <= 0.25,
                     "weights": r["report"]["memory"]["weights"],
                     "forward_tflop": round(r["report"]["model"]["forward_flops"] / 1e12, 1)})
    return rows


def bench(shape_cache: Path | None = None) -> dict:
    """Wall seconds of a 50-step Wan 2.1-14B 720p x 4 s simulation, per system."""
    from .ablation import memory_plan
    from .platforms import platform
    from .replay import replay
    from .schedules import uniform
    from .shapes import model_shape
    from .workload import from_events, synthesize

    t0 = time.perf_counter()
    shape = model_shape("wan2.1-14b", "720p", 4, cache_dir=shape_cache)
    t_shape = time.perf_counter() - t0
    plat = platform("rtx4090", "DDR5-4800", 4, 8)
    t0 = time.perf_counter()
    wl = from_events(synthesize(shape, uniform(shape, 50), n_ranks=plat.n_ranks), shape)
    t_events = time.perf_counter() - t0
    weights = memory_plan(wl, plat)["weights"]
    per = {}
    for s in "abcdef":
        t0 = time.perf_counter()
        replay(wl, plat, s, record=True, weights=weights)
        per[s] = round(time.perf_counter() - t0, 3)
    return {"model": "wan2.1-14b 1280x720 65 frames, 50 steps, uniform(2, warmup 5)",
            "platform": "rtx4090 + 4 x 8 DDR5-4800", "shape_s": round(t_shape, 3),
            "events_s": round(t_events, 3), "replay_s_per_system": per,
            "generation_s_max": round(t_events + max(per.values()), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coda.host.system.validate")
    parser.add_argument("--out", type=Path, default=Path("build/system"))
    args = parser.parse_args(argv)
    cache = args.out / "shapes"
    rows = validate(shape_cache=cache)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{'model':14} {'size':9} {'frames':>6} {'steps':>5} {'GPU':8} {'published':>10} "
          f"{'predicted':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['model']:14} {r['resolution']:9} {r['frames']:>6} {r['steps']:>5} "
              f"{r['gpu']:8} {r['seconds']:>9.0f}s {r['predicted_s']:>9.0f}s {r['ratio']:>6.2f}"
              f"{'' if r['within_25pct'] else '  (outside +-25 %)'}")
    b = bench(shape_cache=cache)
    (args.out / "bench.json").write_text(json.dumps(b, indent=1) + "\n")
    print(json.dumps(b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
