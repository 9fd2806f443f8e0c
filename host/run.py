"""``coda run``: the main job — cached CFG denoising of the shipped video DiT, its cache
operators executed by the NME RTL (Verilator cosimulation) or by the torch backend.

For a few digit prompts it generates, with the same seeds and CFG:

1. the full-compute video (every operator of every step computed by the DiT);
2. the cached video with the cache segments ``y = x + sum_k g_k * c_k`` run on the NMP
   driver over the ``--backend`` (default ``rtl``: every segment through the Verilated NME
   with an ideal 1-cycle memory, one simulator process per rank, in parallel; with ``--dram STD`` the
   whole DIMM-NMP instead: every rank's NME behind its own DRAM controller timed by the
   ``STD`` preset, all ranks in lockstep in one simulator, so ``nme_cycles`` include DRAM
   timing);
3. when the backend is ``rtl``, the same cached generation on the ``torch`` backend, to check
   that latents and videos are bit-identical.

It writes ``DIR/<digit>_<i>.gif`` (full compute | cached, side by side) and ``DIR/report.json``
and prints a summary table. Quality: PSNR (dB, data range 2 for pixels in [-1, 1]) and SSIM of
the cached videos against the full-compute ones; prompt adherence: the scikit-learn digit
classifier's per-frame accuracy (:func:`coda.host.model.classifier.label_accuracy`).
"""

from __future__ import annotations

import json
import time

import torch

DEFAULT_PROMPTS = "0,3,7"


def configure(parser) -> None:
    from coda.host.model.sample import DEFAULT_GUIDANCE, DEFAULT_STEPS

    parser.add_argument("--out", default="out", help="output folder (default: out/)")
    parser.add_argument("--prompts", default=DEFAULT_PROMPTS,
                        help=f"comma-separated digits 0..9 (default: {DEFAULT_PROMPTS})")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="DDIM steps")
    parser.add_argument("--guidance", type=float, default=DEFAULT_GUIDANCE, help="CFG scale")
    parser.add_argument("--backend", choices=("rtl", "torch"), default="rtl",
                        help="where cache segments run (default: rtl = Verilated NME)")
    parser.add_argument("--interval", type=int, default=2,
                        help="uniform-interval policy: recompute every k steps (k >= 1)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="first steps always computed (>= 1)")
    parser.add_argument("--dram", default=None, metavar="STD",
                        help="cosimulate the DIMM-NMP with this DRAM preset (e.g. DDR5-4800; "
                             "rtl backend only; default: NMEs on an ideal 1-cycle memory)")
    parser.add_argument("--lanes", type=int, default=8, help="NME SIMD lanes")
    parser.add_argument("--dimms", type=int, default=1)
    parser.add_argument("--ranks", type=int, default=2, help="ranks per DIMM")
    parser.add_argument("--seed", type=int, default=0, help="base noise seed")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")


def _parse_prompts(text: str) -> list[int]:
    try:
        digits = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--prompts {text!r}: expected comma-separated digits 0..9") from None
    if not digits or any(not 0 <= d <= 9 for d in digits):
        raise ValueError(f"--prompts {text!r}: expected comma-separated digits 0..9")
    return digits


def _driver(backend, args, model, videos: int):
    from coda.host.driver import NMPDriver
    from coda.host.model.sample import cache_mem_words
    from coda.hw.isa import NMEConfig

    mem_words = cache_mem_words(model, videos, args.dimms * args.ranks, args.lanes)
    cfg = NMEConfig(lanes=args.lanes, mem_words=mem_words)
    return NMPDriver(backend, cfg, dimms=args.dimms, ranks=args.ranks)


def main(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from coda.paths import check_output_path
    from coda.host.backend import get_backend
    from coda.host.model.classifier import label_accuracy
    from coda.host.model.dit import load_model
    from coda.host.model.sample import (cached_generate, generate, side_by_side_gif,
                                        video_psnr, video_ssim)
    from coda.host.policies import UniformIntervalPolicy

    # every check before any work or any file: flags, output folder, backend, driver
    digits = _parse_prompts(args.prompts)
    for flag in ("steps", "interval", "warmup", "lanes", "dimms", "ranks", "threads"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} {getattr(args, flag)}: expected >= 1")
    out = check_output_path(args.out, "--out", folder=True)
    # bad --backend/--dram combinations and presets fail here (simulators are built and
    # started only when the first segment runs)
    backend = get_backend(args.backend, dram=args.dram, dimms=args.dimms, ranks=args.ranks)
    torch.set_num_threads(args.threads)
    console = Console()
    t_start = time.perf_counter()

    model, _ = load_model()
    labels = torch.tensor(digits, dtype=torch.int64)
    common = dict(num_steps=args.steps, guidance_scale=args.guidance, seed=args.seed,
                  progress=True)
    policy = UniformIntervalPolicy(default_interval=args.interval, warmup=args.warmup)

    driver = _driver(backend, args, model, len(digits))   # bad --lanes etc. fail before work
    out.mkdir(parents=True, exist_ok=True)

    console.print(f"[bold]full compute[/] {len(digits)} prompts × {args.steps} steps (CFG)")
    full = generate(model, labels, **common)

    console.print(f"[bold]cached[/], segments on the [cyan]{args.backend}[/] backend "
                  f"({args.dimms} DIMM × {args.ranks} ranks, {args.lanes} lanes, "
                  f"{args.dram or 'ideal memory'})")
    t0 = time.perf_counter()
    cached, stats = cached_generate(model, labels, driver, policy, **common)
    cached_s = time.perf_counter() - t0
    sim = dict(getattr(backend, "stats", {}))
    if hasattr(backend, "close"):
        backend.close()

    bit_exact = None
    if args.backend == "rtl":
        console.print("[bold]cached[/], segments on the [cyan]torch[/] backend (bit-exactness check)")
        ref_driver = _driver(get_backend("torch"), args, model, len(digits))
        reference, _ = cached_generate(model, labels, ref_driver, policy, **common)
        bit_exact = bool(torch.equal(reference.view(torch.int32), cached.view(torch.int32)))

    gifs = []
    for i, d in enumerate(digits):
        path = out / f"{d}_{i}.gif"
        side_by_side_gif(path, full[i:i + 1], cached[i:i + 1])
        gifs.append(str(path))

    sim_cycles = sim.get("cycles", 0)
    sim_seconds = sim.get("seconds", 0.0)
    report = {
        "prompts": digits,
        "steps": args.steps,
        "guidance_scale": args.guidance,
        "backend": args.backend,
        "dram": args.dram,
        "dimms": args.dimms, "ranks": args.ranks, "lanes": args.lanes,
        "policy": {"name": "uniform-interval", "interval": args.interval, "warmup": args.warmup},
        "bit_exact_rtl_vs_torch": bit_exact,
        "psnr_db": video_psnr(cached, full),
        "ssim": video_ssim(cached, full),
        "label_accuracy_full": label_accuracy(full, labels),
        "label_accuracy_cached": label_accuracy(cached, labels),
        "ops_skipped_fraction": stats["ops_skipped_fraction"],
        "segments": stats["segments"],
        "nme_programs": driver.stats["programs"],
        "nme_cycles": driver.stats["nme_cycles"],
        "sim_cycles_per_s": sim_cycles / sim_seconds if sim_seconds else None,
        "cached_generation_s": cached_s,
        "wall_s": time.perf_counter() - t_start,
        "gifs": gifs,
        "machine": _machine(),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")

    table = Table(title=f"coda run — report in {out / 'report.json'}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("bit_exact_rtl_vs_torch", "psnr_db", "ssim", "label_accuracy_full",
                "label_accuracy_cached", "ops_skipped_fraction", "segments", "nme_cycles",
                "sim_cycles_per_s", "wall_s"):
        value = report[key]
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    if bit_exact is False:
        console.print("[red]RTL and torch backends disagree[/]")
        return 1
    return 0


def _machine() -> str:
    import os
    import platform

    return f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs".strip()
