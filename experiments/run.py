"""``coda run``: the main job — cached CFG denoising of a shipped video DiT (``--model``:
digits or text), its cache operators executed by the NME RTL (Verilator cosimulation) or by
the torch backend.

For the prompts it generates, with the same seeds and CFG, the full-compute video and the
cached one under the cache policy (segments ``y = x + sum_k g_k * c_k`` on the NMP driver
over the backend; by default on the DRAM-timed DIMM-NMP cosimulation,
:mod:`coda.cosim.nmp.backend`), and, with the ``rtl`` backend, the cached generation again on
the ``torch`` backend, whose videos must be bit-identical to the RTL's. :func:`main` runs it
and writes GIFs and ``report.json`` (:func:`_report`): quality against full compute, prompt
adherence, counters and the generation replayed as the systems of the system model, beside
the same schedule at paper scale. The options, what each policy and memory does, and the
report's keys: ``docs/cli.md``, "coda run".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coda.host.cache.device import DEVICES
from coda.host.cache.policies import POLICIES, policy_names
from coda.host.model.choice import ModelOptions
from coda.host.model.defaults import DEFAULT_GUIDANCE, DEFAULT_STEPS
from coda.hw.dram.standards import DEFAULT_STANDARD
from coda.hw.nme.isa import NMEConfig
from coda.hw.nmp import DEFAULT_NME_MHZ
from coda.hw.verilog import NMEUnitsConfig
from coda.jsonout import json_text
from coda.paths import write_file
from coda.host.cache.compress import CACHE_FORMATS
from coda.host.cache.forecast import CACHE_MODES
from coda.options import add_options, option

GRID_COLUMNS = 5
#: the registry's policies but coda-lat (a schedule searched within uniform's modelled
#: latency: coda eval makes it; here --schedule gives any searched schedule as coda)
POLICY_CHOICES = ("coda", "coda+dra") + tuple(n for n in POLICIES
                                               if not n.startswith("coda"))
#: what the NMEs' rank memory is with --backend rtl (--memory)
MEMORIES = ("dram", "ideal")


@dataclass(frozen=True)
class RunConfig(NMEUnitsConfig, ModelOptions):
    """Every option of ``coda run`` with its default (the one source of them; the model and
    prompts are :class:`coda.host.model.choice.ModelOptions`, the NME's units
    :class:`coda.hw.verilog.NMEUnitsConfig`, as every NME command's). Every field has a
    default: ``main(RunConfig(backend="torch", prompts="0", steps=4, out="/tmp/r"))`` runs
    as ``coda run`` with those options does."""
    out: str = option("out", "output folder")
    steps: int = option(DEFAULT_STEPS, "DDIM steps, 1..1000 (the model's training timesteps)")
    guidance: float = option(DEFAULT_GUIDANCE, "CFG scale, finite and >= 0")
    backend: str = option("rtl", "where cache segments run (rtl = the Verilated NME; device = "
                          "the cache in --device memory, torch ops there)",
                          choices=("rtl", "torch", "device"))
    device: str = option("cpu", "where the DiT, the CFG loop and the cache hooks run (cuda: "
                         "a GPU, torch built with CUDA)", choices=DEVICES)
    rtl_videos: int = option(None, "rtl backend: how many of the prompts (the first ones) run "
                             "through the RTL and are checked bit for bit against torch; the "
                             "rest run on torch", type=int,
                             default_text="every prompt")
    policy: str = option(None, f"cache policy, one of {', '.join(POLICY_CHOICES)}", type=str,
                         default_text="coda: the shipped searched schedule; uniform if "
                         "--interval/--warmup are given")
    schedule: str = option(None, "coda / coda+dra: a schedule JSON of coda schedule search",
                           type=str, metavar="FILE", default_text="the shipped one, 50 steps")
    cache: str = option("reuse", "what a reused operator contributes: its last computed "
                        "output, or a forecast from its last two (static policies: uniform, "
                        "pab, coda; the alphas from the schedule file's \"forecast\" block, "
                        "else calibrated now on --profile's videos)", choices=CACHE_MODES)
    cache_format: str = option("bf16", "how computed outputs are kept in rank memory: the "
                               "NME's 16-bit format, or int8 with one scale per "
                               "--cache-group channels (quantised on the host, dequantised "
                               "on the NMEs in the segment)", choices=CACHE_FORMATS)
    cache_group: int = option(None, "--cache-format int8: channels per scale G, a divisor of "
                              "the hidden size and a multiple of --lanes", type=int,
                              metavar="G", default_text="the largest such G up to 64")
    profile: str = option(None, "profile.npz for teacache, magcache, fbcache, lemica, DRA "
                          "and --cache forecast (its calibration videos)", type=str,
                          metavar="FILE",
                          default_text="the shipped one, 50 steps")
    skip: float = option(None, "pab / teacache / magcache / fbcache / lemica: target skip "
                         "fraction in (0, 1)", type=float,
                         default_text="0.5; coda's is its schedule's, uniform's set by "
                         "--interval/--warmup")
    interval: int = option(None, "uniform policy: recompute every k steps (k >= 2)", type=int,
                           default_text="2")
    warmup: int = option(None, "uniform policy: first steps always computed (1..steps-2)",
                         type=int, default_text="min(5, steps-2)")
    memory: str = option("dram", "rtl backend: the NMEs' rank memory; dram = the DIMM-NMP "
                         "cosimulated with its DRAM timing (every rank's NME behind its own "
                         "JEDEC-timed controller and device of --dram, on its own clock "
                         "--nme-mhz, all ranks in lockstep in one simulator); ideal = NMEs on "
                         "an ideal 1-cycle memory, one simulator per rank (quicker)",
                         choices=MEMORIES)
    dram: str = option(None, "--memory dram: the DRAM preset of the DIMM-NMP", type=str,
                       metavar="STD", default_text=DEFAULT_STANDARD)
    nme_mhz: float = option(None, "--memory dram: the NMEs' own clock behind asynchronous "
                            "FIFOs, 1 .. the DRAM command clock (2400 MHz for DDR5-4800)",
                            type=float, metavar="F",
                            default_text=f"{DEFAULT_NME_MHZ:g} MHz, or the DRAM command clock "
                            "where slower",
                            source="coda.hw.nmp.DEFAULT_NME_MHZ: above the timing-closed NME's "
                            "100 MHz on ECP5, an FPGA lower bound, below the 2400 MHz command "
                            "clock of a DDR5 RCD / data buffer; the clock of SK hynix "
                            "GDDR6-AiM's bf16 MAC units, IEEE JSSC 58(1) 2023")
    dram_log: bool = option(False, "--memory dram: write every rank's DRAM command log "
                            "(OUT/dram_cmds.csv*, about 1 MB per rank per 1,000 segment "
                            "words) and price the DRAM energy per command and power state "
                            "from it; without it, the commands are the controllers' counters "
                            "and the background counts every bank open while a rank runs "
                            "(the system model's rule, an upper bound)")
    lanes: int = option(NMEConfig.lanes, "NME SIMD lanes (rtl / torch backends)")
    dimms: int = option(1, "DIMMs")
    ranks: int = option(2, "ranks per DIMM, one NME each")
    seed: int = option(0, "base noise seed: video i uses seed + i, each 0..2^31-1")
    threads: int = option(2, "torch CPU threads")


#: the configuration ``coda run`` hands to :func:`main` (coda.cli)
CONFIG = RunConfig


def configure(parser) -> None:
    """Options of ``coda run``: :class:`RunConfig` (with the NME's units, --preset and the
    units' latencies: every NME command's)."""
    add_options(parser, RunConfig)


def _driver(backend, cfg: RunConfig, preset, model, videos: int, inputs: bool,
            calibration: bool = False):
    """An NMP driver sized for ``videos`` videos of this run (``calibration``: for the 16-bit
    entries of a calibration run, whatever --cache-format says)."""
    from coda.host.nmp.driver import NMPDriver
    from coda.host.model.sample import cache_mem_words

    mem_words = cache_mem_words(model, videos, cfg.dimms * cfg.ranks, cfg.lanes, inputs,
                                history=2 if cfg.cache == "forecast" else 1,
                                cache_format="bf16" if calibration else cfg.cache_format,
                                cache_group=None if calibration else cfg.cache_group)
    nme = NMEConfig(lanes=cfg.lanes, mem_words=mem_words, trail_stores=cfg.trail_stores == "on",
                    **preset.units())
    return NMPDriver(backend, nme, dimms=cfg.dimms, ranks=cfg.ranks)


@dataclass
class _Setup:
    """What ``coda run``'s options decided (:func:`_setup`: every one checked before any work
    or any file), handed to the parts of :func:`main`."""
    prompts: list                # ints (prompt indices) and prompt texts (chosen_prompts)
    rtl_videos: int | None       # prompts through the RTL (the first ones); None: torch backend
    nme_mhz: float | None        # the NMEs' own clock (--nme-mhz, checked); None: not given
    dram: str | None             # the DRAM the run cosimulates (--memory dram: --dram's
    #                              canonical name, default DDR5-4800); None: no DRAM timing
    preset: Any                  # the NME (coda.hw.verilog.resolve_preset)
    out: Path
    model: Any                   # on --device
    model_name: str              # --model
    policy_name: str
    policy: Any
    backend: Any                 # where the cache segments run (--backend, --dram; None: device)
    modelled_dram: str           # the DRAM of the modelled systems: --dram, else DDR5-4800
    forecast: Any = None         # --cache forecast: the alphas (ForecastTable)
    forecast_source: str | None = None
    cache_format: str = "bf16"   # --cache-format
    cache_group: int | None = None   # --cache-format int8: G (resolved for the model)

    def cache_kwargs(self) -> dict:
        """cached_generate's cache mode, alphas and entry format for this run."""
        return {"cache_format": self.cache_format, "cache_group": self.cache_group,
                "cache": "forecast" if self.forecast is not None else "reuse",
                "forecast": self.forecast}

    @property
    def inputs(self) -> bool:
        """Whether the policy keeps operator inputs as monitor references (DRA, TeaCache,
        FBCache): they need room beside the cached outputs."""
        return self.policy_name in ("coda+dra", "teacache", "fbcache")


@dataclass
class _Generation:
    """The videos and counters of the run (:func:`_generate`), handed to the parts of
    :func:`main`. ``cached``, ``stats``, ``events`` and ``driver`` are those of the
    ``--backend`` run, or, where the RTL ran only the first prompts, of the torch run of every
    prompt (:func:`_check_rtl_bits`; the RTL run's events are then ``rtl_events``)."""
    labels: list                 # every prompt (the run's prompts)
    seeds: list[int]             # every prompt's noise seed
    full: torch.Tensor           # the full-compute videos of every prompt
    cached: torch.Tensor
    stats: dict                  # cached_generate's counters of ``cached``
    events: Any                  # the EventLog of ``cached``
    driver: Any                  # the NMP driver of ``cached``
    backend_prompts: int         # prompts of the --backend run (the first ones)
    cached_s: float              # seconds of the --backend run's cached generation
    sim: dict                    # the backend's simulator counters (cycles, seconds, ...)
    cosim_stats: dict            # the --backend driver's counters (CFG interleaving)
    rtl_events: Any = None


def main(cfg: RunConfig) -> int:
    """Run ``coda run`` (``docs/cli.md``, "coda run") as ``cfg`` says: what the command line
    gave (:mod:`coda.cli`), or a :class:`RunConfig` built in Python, e.g.
    ``main(RunConfig(backend="torch", prompts="0", steps=4, out="/tmp/r"))``. Check every
    option, generate the full-compute and the cached videos, check the RTL's bits against
    torch, model the systems, write the GIFs and ``report.json`` and print the summary.
    Returns 0, or 1 when the RTL and torch backends disagree."""
    from rich.console import Console

    from coda.host.cache.device import DeviceCache
    from coda.host.model.choice import prompt_slug

    run = _setup(cfg)
    torch.set_num_threads(cfg.threads)
    console = Console()
    # the top of the output: which NME runs the segments
    console.print(run.preset.describe() if run.backend is not None else
                  f"the cache in {cfg.device} memory, its segments torch ops there (no NME)")
    t_start = time.perf_counter()
    # bad --lanes etc. fail now
    driver = DeviceCache() if run.backend is None else _driver(
        run.backend, cfg, run.preset, run.model, run.rtl_videos or len(run.prompts), run.inputs)
    # whether the modelled systems can be computed for this NME (the system model has DRAM
    # utilisations only for measured lanes x depth): decided now, the run goes on without
    modelled_reason = _modelled_unavailable(cfg, getattr(driver.cfg, "depth", NMEConfig.depth),
                                            run.modelled_dram)
    run.out.mkdir(parents=True, exist_ok=True)
    gen = _generate(console, cfg, run, driver)
    bit_exact = rtl = None
    if cfg.backend == "rtl":
        bit_exact, rtl = _check_rtl_bits(console, cfg, run, gen, modelled_reason)
    gifs, grid = _write_gifs(run.out, [prompt_slug(run.model_name, p) for p in run.prompts],
                             gen.full, gen.cached)
    modelled = _modelled(cfg, run, gen, modelled_reason)
    report = _report(cfg, run, gen, bit_exact, rtl, modelled, gifs, grid, t_start)
    report["paper_scale"] = _paper_scale(cfg, run)   # the same schedule at paper scale
    write_file(run.out / "report.json", json_text(report, indent=2) + "\n")
    _print_summary(console, report, run.out / "report.json")
    _record(report, grid)
    if bit_exact is False:
        console.print("[red]RTL and torch backends disagree[/]")
        return 1
    return 0


def _setup(cfg: RunConfig) -> _Setup:
    """Every check before any work or any file: flags, output folder, policy, backend (whose
    simulators are built and started only when the first segment runs); loads the model (the
    policy's files are checked against it). Raises ValueError naming the flag."""
    from coda.host.cache.device import resolve_device
    from coda.host.nme.backend import get_backend
    from coda.host.model.choice import chosen_prompts, load_chosen
    from coda.host.model.sample import check_guidance, check_seed, check_steps
    from coda.hw.verilog import resolve_preset
    from coda.paths import check_output_path

    device = resolve_device(cfg.device, "--device")    # no CUDA: refused first
    _check_backend_options(cfg)
    prompts = chosen_prompts(cfg)
    check_steps(cfg.steps)
    check_guidance(cfg.guidance)
    check_seed(cfg.seed, count=len(prompts))
    rtl_videos = _rtl_videos(cfg, len(prompts))
    for flag in ("interval", "warmup", "lanes", "dimms", "ranks", "threads"):
        value = getattr(cfg, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} {value}: expected >= 1")
    nme_mhz, dram = _resolve_memory(cfg)   # before the model loads: a bad preset or clock fails
    preset = resolve_preset(cfg)   # bad or clashing --preset / latency flags fail here
    out = check_output_path(cfg.out, "--out", folder=True)
    model = load_chosen(cfg, device)
    group = _cache_group(cfg, model)
    policy_name, policy = _policy(cfg, model)
    forecast, source = _forecast(cfg, model, policy_name, policy)
    backend = None          # --backend device: no NME; bad --backend/--dram and presets fail here
    if cfg.backend != "device" or dram is not None:
        backend = get_backend(cfg.backend, dram=dram, dimms=cfg.dimms, ranks=cfg.ranks,
                              **({"nme_mhz": nme_mhz} if nme_mhz is not None else {}),
                              # the DRAM-timed DIMM-NMP logs every command for the energy
                              **({"commands": _command_log(out)} if dram and cfg.dram_log
                                 else {}))
    return _Setup(prompts, rtl_videos, nme_mhz, dram, preset, out, model, cfg.model,
                  policy_name, policy,
                  backend, modelled_dram=dram or DEFAULT_STANDARD, forecast=forecast,
                  forecast_source=source, cache_format=cfg.cache_format, cache_group=group)


#: options of the NME (coda.hw.verilog.NMEUnitsConfig, --lanes): none with --backend device
_NME_OPTIONS = ("preset", "mul_latency", "add_latency", "operand_latency", "trail_stores",
                "lanes")


def _check_backend_options(cfg: RunConfig) -> None:
    """Refuse, before any work, an option that would do nothing with ``--backend``, given on
    the command line (also at its default value), instead of ignoring it: with ``device``
    (no NME: the cache's segments are torch ops) the NME's options and ``--lanes``;
    ``--memory`` and ``--dram`` (and so ``--nme-mhz``, :func:`_resolve_memory`) with any
    backend but ``rtl``. Raises ValueError naming the option."""
    from coda.options import defaults, given

    default = defaults(RunConfig)
    if cfg.backend == "device":
        for name in _NME_OPTIONS:
            if given(cfg, name, default[name]):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {getattr(cfg, name)}: no NME runs with --backend "
                                 "device (its cache segments are torch ops in --device "
                                 f"memory), expected no {flag} with --backend device")
    if given(cfg, "memory", default["memory"]) and cfg.backend != "rtl":
        raise ValueError(f"--memory {cfg.memory}: the NMEs' rank memory of --backend rtl, "
                         f"expected no --memory with --backend {cfg.backend}")
    if cfg.dram is not None and cfg.backend != "rtl":
        raise ValueError(f"--dram {cfg.dram}: DRAM timing needs --backend rtl (got --backend "
                         f"{cfg.backend})")


def _resolve_memory(cfg: RunConfig) -> tuple[float | None, str | None]:
    """``--memory``, ``--dram`` and ``--nme-mhz`` checked and resolved before any work:
    (the NMEs' clock, the DRAM the run cosimulates). With ``--backend rtl --memory dram``:
    the clock in MHz (``--nme-mhz``, checked by :func:`coda.hw.nmp.check_nme_mhz`, default
    :func:`coda.hw.nmp.default_nme_mhz`) and the cosimulated preset's name (``--dram``,
    default :data:`DEFAULT_STANDARD`); otherwise (None, None). ``cfg`` is not changed:
    the run reads the DRAM from :class:`_Setup`'s ``dram``.
    Raises ValueError naming the flag: an unknown preset, a bad clock, ``--nme-mhz`` without
    DRAM timing, ``--dram`` with ``--memory ideal``."""
    from coda.hw.dram.standards import get_standard
    from coda.hw.nmp import check_nme_mhz, default_nme_mhz

    nme_mhz = getattr(cfg, "nme_mhz", None)
    if cfg.backend != "rtl" or getattr(cfg, "memory", "dram") == "ideal":
        if nme_mhz is not None:
            why = ("an ideal memory has no clock" if cfg.backend == "rtl"
                   else f"got --backend {cfg.backend}")
            raise ValueError(f"--nme-mhz {nme_mhz:g}: only with --dram timing (--backend rtl "
                             f"--memory dram: the NME's own clock meets the DRAM "
                             f"controller's; {why})")
        if cfg.dram is not None:
            raise ValueError(f"--dram {cfg.dram}: the DRAM preset of --memory dram, expected "
                             "no --dram with --memory ideal")
        return None, None
    dram = get_standard(cfg.dram or DEFAULT_STANDARD).name
    return (check_nme_mhz(nme_mhz, dram) if nme_mhz is not None else default_nme_mhz(dram),
            dram)


def _cache_group(cfg: RunConfig, model) -> int | None:
    """--cache-format int8: G (--cache-group, or the default for the model's hidden size and
    --lanes), checked; None for bf16. Raises ValueError naming G and C."""
    from coda.host.cache.compress import resolve_group

    if cfg.cache_format != "int8":
        if cfg.cache_group is not None:
            raise ValueError(f"--cache-group {cfg.cache_group}: an int8 option, expected "
                             "--cache-format int8")
        return None
    tcfg = model.config["transformer"]
    return resolve_group(tcfg["num_attention_heads"] * tcfg["attention_head_dim"], cfg.lanes,
                         cfg.cache_group)


def _sampling(cfg: RunConfig) -> dict:
    """The keyword arguments of every generation of the run (steps, CFG, base seed)."""
    return dict(num_steps=cfg.steps, guidance_scale=cfg.guidance, seed=cfg.seed,
                progress=True)


def _generate(console, cfg: RunConfig, run: _Setup, driver) -> _Generation:
    """The full-compute videos of every prompt, then the cached videos of the prompts that
    go through ``--backend`` (with ``rtl`` the first ``--rtl-videos``) with their segments
    on ``driver``; closes the backend."""
    from coda.host.cache.events import EventLog
    from coda.host.model.sample import cached_generate, generate

    labels, backend = run.prompts, run.backend
    console.print(f"[bold]full compute[/] {len(labels)} prompts × {cfg.steps} steps (CFG)")
    full = generate(run.model, labels, **_sampling(cfg))

    seeds = [cfg.seed + i for i in range(len(labels))]
    run_labels = labels[:run.rtl_videos] if run.rtl_videos else labels
    where = (f"{cfg.dimms} DIMM × {cfg.ranks} ranks, {cfg.lanes} lanes, "
             + (f"{run.dram}, NMEs at {run.nme_mhz:g} MHz" if run.dram else "ideal memory")
             if backend is not None else cfg.device)
    console.print(f"[bold]cached[/] {len(run_labels)} prompts, segments on the "
                  f"[cyan]{cfg.backend}[/] backend ({where})")
    t0 = time.perf_counter()
    events = EventLog()
    cached, stats = cached_generate(run.model, run_labels, driver, run.policy, events=events,
                                    **run.cache_kwargs(), **_sampling(cfg),
                                    seeds=seeds[:len(run_labels)])
    cached_s = time.perf_counter() - t0
    sim = dict(getattr(backend, "stats", {}))
    if hasattr(backend, "close"):
        backend.close()
    # CFG interleaving: the cosimulation's (torch never overlaps)
    return _Generation(labels, seeds, full, cached, stats, events, driver, len(run_labels),
                       cached_s, sim, cosim_stats=driver.stats)


def _check_rtl_bits(console, cfg: RunConfig, run: _Setup, gen: _Generation,
                    modelled_reason: str | None) -> tuple[bool, dict]:
    """With ``--backend rtl``: the torch backend generates every prompt once, and its first
    videos check the RTL's bit for bit (a video's bits do not depend on the others of its
    batch: the model's conditioning is batch-invariant, every policy decides per sample).
    Where the RTL ran only some prompts, the report's figures and GIFs are of this run:
    ``gen`` takes its videos, counters, driver and events (the RTL run's events kept as
    ``gen.rtl_events``), and the RTL run's own replay as systems a..f goes in the RTL section.
    Returns (bit_exact, the report's ``rtl`` section)."""
    from coda.host.nme.backend import get_backend
    from coda.host.cache.events import EventLog
    from coda.host.model.sample import cached_generate
    from coda.host.system import modelled as modelled_systems

    n, prompts = gen.backend_prompts, run.prompts
    console.print(f"[bold]cached[/] all {len(prompts)} prompts, segments on the "
                  f"[cyan]torch[/] backend (its first {n} checked against "
                  f"the RTL's bits)")
    ref_driver = _driver(get_backend("torch"), cfg, run.preset, run.model, len(prompts), run.inputs)
    ref_events = EventLog()
    reference, ref_stats = cached_generate(run.model, gen.labels, ref_driver, run.policy,
                                           events=ref_events, **run.cache_kwargs(),
                                           **_sampling(cfg),
                                           seeds=gen.seeds)
    bit_exact = bool(torch.equal(reference[:n].view(torch.int32), gen.cached.view(torch.int32)))
    rtl = {"prompts": prompts[:n], "nme_cycles": gen.driver.stats["nme_cycles"],
           "nme_programs": gen.driver.stats["programs"], "cached_generation_s": gen.cached_s}
    if run.dram:   # the DIMM-NMP's jobs: NME clock, both clocks' cycles, time
        rtl.update(nme_mhz=getattr(run.backend, "nme_mhz", None),
                   job_nme_cycles=gen.sim.get("cycles", 0),
                   job_dram_cycles=gen.sim.get("dram_cycles", 0), job_ns=gen.sim.get("ns", 0.0),
                   dram_energy=_dram_energy(cfg, run, n))
    if n < len(prompts):
        gen.rtl_events = gen.events
        gen.cached, gen.stats, gen.driver, gen.events = (reference, ref_stats, ref_driver,
                                                         ref_events)
        if modelled_reason is None:   # the RTL run's replay: its nme_check compares the
            # cycle model with the cycles the cosimulation measured (ideal memory), or
            # the DRAM-timed NMEs time it (--dram)
            rtl["modelled"] = modelled_systems(
                gen.rtl_events, run.model.config, lanes=cfg.lanes, depth=gen.driver.cfg.depth,
                dimms=cfg.dimms, ranks=cfg.ranks, dram=run.modelled_dram,
                nme_mhz=run.nme_mhz, nme_timing="events" if run.dram else "model",
                cache=cfg.cache, cache_format=run.cache_format, cache_group=run.cache_group)
    return bit_exact, rtl


def _record(report: dict, grid: Path) -> None:
    """The run's headline figures and grid as the ``demo`` result record
    (:func:`coda.results.record`: written only with ``CODA_RECORD_DIR`` set)."""
    from coda.results import record

    keys = ("model", "backend", "memory", "dram", "nme_mhz", "policy",
            "bit_exact_rtl_vs_torch", "psnr_db", "ssim", *_adherence_keys(report),
            "ops_skipped_fraction", "segments", "pcie_bytes", "nme_cycles", "sim_cycles_per_s",
            "cached_generation_s", "wall_s")
    figures = {k: (round(v, 4) if isinstance(v, float) else v) for k in keys
               if isinstance(v := report.get(k), (bool, int, float, str))}
    energy = (report.get("rtl") or {}).get("dram_energy")
    if energy:
        figures.update({f"DRAM energy per video, {k} (uJ)": round(v * 1e6, 2)
                        for k, v in energy["per_video_j"].items()})
    record("demo", f"coda run: {len(report['prompts'])} prompts x {report['steps']} steps",
           figures, pictures={"full compute | cached, every prompt": grid})


def _command_log(out: Path) -> Path:
    """Path prefix of the DRAM-timed DIMM-NMP's command logs in the report folder (one CSV
    per rank: ``dram_cmds.csv``, ``dram_cmds.csv.c<dimm>r<rank>``)."""
    return out / "dram_cmds.csv"


def _dram_energy(cfg: RunConfig, run: _Setup, videos: int) -> dict:
    """The report's ``rtl.dram_energy``: J split into activation/precharge, read + write,
    refresh and background, in total and per video (``videos`` through the RTL), with the
    per-rank detail. From the controllers' counters (ACTs = row misses + row conflicts, RD
    and WR bursts, REFs, cycles) priced per command (:func:`coda.hw.dram.power.dram_energy`),
    every bank counted open while its rank runs (an upper bound on the background); with
    ``--dram-log``, from the command logs of the cached generation (one per rank) priced per
    command and power state (:func:`coda.cosim.dram.energy.energy_files`), the counters'
    split kept beside it as ``counters_split_j``."""
    from coda.cosim.dram.energy import energy_files, split_j
    from coda.hw.dram.power import command_energy, dram_energy
    from coda.hw.dram.standards import get_standard

    std = get_standard(run.dram)
    banks = command_energy(std).banks
    ranks = {}
    stats = run.backend.last.stats        # per rank, cumulative since the simulator started
    for k, s in enumerate(stats):
        rank_s = s["cycles"] * std.tCK_ns * 1e-9
        ranks[f"c{k // cfg.ranks}r{k % cfg.ranks}"] = dram_energy(
            std, acts=s["row_misses"] + s["row_conflicts"], reads=s["reads"],
            writes=s["writes"], refreshes=s["refreshes"], rank_s=rank_s,
            bank_open_s=rank_s * banks)
    total = {k: sum(r[k] for r in ranks.values()) for k in next(iter(ranks.values()))}
    out = {"method": "per command from the controllers' counters and the device's IDD/IPP "
                     "currents (coda.hw.dram.power); background with every bank open while a "
                     "rank runs (an upper bound; --dram-log measures it per power state)",
           "standard": run.dram, "cycles": max(s["cycles"] for s in stats),
           "split_j": split_j(total), "ranks": ranks}
    if cfg.dram_log:
        base = _command_log(run.out)
        logs = [base if (d, r) == (0, 0) else base.with_name(f"{base.name}.c{d}r{r}")
                for d in range(cfg.dimms) for r in range(cfg.ranks)]
        result = energy_files(run.dram, logs)
        out.update(method=result["method"], logs=[str(p) for p in logs],
                   cycles=result["cycles"], counters_split_j=out["split_j"],
                   split_j=result["split_j"], ranks=result["ranks"])
    out["per_video_j"] = {k: v / videos for k, v in out["split_j"].items()}
    return out


def _write_gifs(out: Path, names: list[str], full, cached) -> tuple[list[str], Path]:
    """``<name>_<i>.gif`` per prompt (``names``: :func:`coda.host.model.choice.prompt_slug`,
    a digit or the prompt's words) and ``grid.gif`` (every prompt, full compute | cached,
    :data:`GRID_COLUMNS` pairs per row) in ``out``; returns the prompts' GIFs and the grid."""
    from coda.host.model.sample import side_by_side_gif

    gifs = []
    for i, name in enumerate(names):
        path = out / f"{name}_{i}.gif"
        side_by_side_gif(path, full[i:i + 1], cached[i:i + 1])
        gifs.append(str(path))
    grid = out / "grid.gif"
    side_by_side_gif(grid, full, cached, scale=3, columns=min(GRID_COLUMNS, len(names)))
    return gifs, grid


def _modelled(cfg: RunConfig, run: _Setup, gen: _Generation, reason: str | None) -> dict:
    """The report's ``modelled``: the run's events replayed on the default platform (RTX
    4090, PCIe 4.0 x16, these DIMMs with DDR5-4800 unless --dram says otherwise) as the
    systems of the ablation (a..f; a..g with ``--cache forecast``), ``"available": true``; or ``{"available": false,
    "reason": reason}``."""
    from coda.host.system import modelled as modelled_systems

    if reason is not None:
        return {"available": False, "reason": reason}
    modelled = modelled_systems(     # a device cache has no NME: the default depth
        gen.events, run.model.config, lanes=cfg.lanes,
        depth=getattr(gen.driver.cfg, "depth", NMEConfig.depth),
        dimms=cfg.dimms, ranks=cfg.ranks, dram=run.modelled_dram, nme_mhz=run.nme_mhz,
        # the events' NME cycles (counted at nme_mhz) time the NMEs when they all came
        # from the DRAM-timed DIMM-NMP
        nme_timing="events" if run.dram and gen.rtl_events is None else "model",
        cache=cfg.cache, cache_format=run.cache_format, cache_group=run.cache_group)
    modelled["available"] = True
    return modelled


#: the policies whose schedule ``paper_scale`` transfers: a schedule file of the shipped model
#: (coda, coda+dra) or the uniform rule; the others decide from the run's own calibration
_PAPER_SCALE_POLICIES = ("coda", "coda+dra", "uniform")


def _paper_scale(cfg: RunConfig, run: _Setup) -> dict:
    """The report's ``paper_scale``: the run's schedule transferred to the paper-scale target
    (:data:`coda.host.system.sim.PAPER_SCALE`: Wan 2.1-14B, 720p x 4 s, the edge GPU preset,
    4 DIMMs x 8 ranks of DDR5-4800) and replayed as systems a..g by
    :func:`coda.host.system.sim.paper_scale`, what ``coda sim`` with its ``argv`` computes,
    ``"available": true``; or ``{"available": false, "reason": ...}`` for a policy without a
    schedule to transfer, or one the system model refuses. At the shipped model's size
    every kernel is launch-bound, so its modelled systems say little about the design; this
    is the figure the design is for."""
    from coda.host.model.dit import shipped_model
    from coda.host.system.sim import paper_scale

    if run.policy_name not in _PAPER_SCALE_POLICIES:
        return {"available": False,
                "reason": f"--policy {run.policy_name} has no static schedule to transfer (it "
                          "decides from this run's calibration); the transfer takes "
                          f"{', '.join(_PAPER_SCALE_POLICIES)}"}
    if run.policy_name == "uniform":
        spec = {"schedule": "uniform", "interval": run.policy.default_interval,
                "warmup": run.policy.warmup}
    else:
        spec = {"schedule": str(cfg.schedule or shipped_model(cfg.model).schedule())}
    note = ("DRA's run-time fallbacks not modelled" if run.policy_name == "coda+dra"
            else None)
    try:
        out = paper_scale(**spec, steps=cfg.steps, cache=cfg.cache,
                          cache_format=run.cache_format, note=note)
    except ValueError as exc:
        return {"available": False, "reason": str(exc)}
    return {"available": True, **out}


def _report(cfg: RunConfig, run: _Setup, gen: _Generation, bit_exact: bool | None,
            rtl: dict | None, modelled: dict, gifs: list[str], grid: Path,
            t_start: float) -> dict:
    """``report.json`` (``docs/cli.md``, "coda run"): the options, the policy, the bit check, quality
    (PSNR, SSIM) and prompt adherence of the cached videos, the counters, the cosimulation's
    speed and CFG interleaving, the files, the machine and the modelled systems."""
    from coda.experiments.evaluate import psnr_db, ssim
    from coda.host.model.choice import adherence

    full, cached, stats, driver = gen.full, gen.cached, gen.stats, gen.driver
    # NME cycles summed over the ranks (the DIMM-NMP's jobs count each rank's: rank_cycles)
    sim_cycles = gen.sim.get("rank_cycles", gen.sim.get("cycles", 0))
    sim_seconds = gen.sim.get("seconds", 0.0)
    preset = run.preset
    adhere = {f"{k}_{which}": v for which, videos in (("full", full), ("cached", cached))
              for k, v in adherence(run.model, videos, gen.labels).items()}
    return {
        "model": run.model_name,
        "prompts": run.prompts,
        "steps": cfg.steps,
        "guidance_scale": cfg.guidance,
        "backend": cfg.backend,
        "device": cfg.device,
        "memory": cfg.memory if cfg.backend == "rtl" else None,
        "dram": run.dram,
        "nme_mhz": run.nme_mhz,
        "dimms": cfg.dimms, "ranks": cfg.ranks, "lanes": cfg.lanes,
        "nme": {"preset": preset.name, **preset.units(), "fmax": preset.fmax,
                "trail_stores": cfg.trail_stores == "on"},
        "policy": run.policy_name,
        "policy_params": run.policy.describe(),
        "cache": cfg.cache,
        "cache_format": run.cache_format, "cache_group": run.cache_group,
        "forecast": None if run.forecast is None else {"source": run.forecast_source,
                                                       **run.forecast.describe()},
        "bit_exact_rtl_vs_torch": bit_exact,
        "rtl": rtl,
        "psnr_db": psnr_db(cached, full),
        "ssim": ssim(cached, full),
        **adhere,
        "ops_skipped_fraction": stats["ops_skipped_fraction"],
        "segments": stats["segments"],
        "dra_fallbacks": stats["fallbacks"],
        "monitors": stats["monitors"],
        "pcie_bytes": stats["pcie_bytes"],
        "nme_programs": driver.stats["programs"],
        "nme_cycles": driver.stats["nme_cycles"],
        # CFG interleaving in the cosimulation: segments launched while the host went on
        # computing the other branch, host seconds spent meanwhile, seconds then waited
        "interleave": {k: gen.cosim_stats.get(k, 0)     # none on a device cache
                       for k in ("async_launches", "overlap_s", "wait_s")},
        "sim_cycles_per_s": sim_cycles / sim_seconds if sim_seconds else None,
        "cached_generation_s": gen.cached_s,
        "wall_s": time.perf_counter() - t_start,
        "gifs": gifs,
        "grid_gif": str(grid),
        "machine": _machine(),
        "modelled": modelled,
    }


def _print_summary(console, report: dict, path: Path) -> None:
    """The summary table of ``report`` (written to ``path``): its headline figures, the
    prompts through the RTL, the grid GIF and the modelled systems."""
    from rich.table import Table

    table = Table(title=f"coda run — report in {path}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("model", "policy", "bit_exact_rtl_vs_torch", "psnr_db", "ssim",
                *_adherence_keys(report), "ops_skipped_fraction", "segments", "dra_fallbacks",
                "pcie_bytes", "nme_cycles", "sim_cycles_per_s", "wall_s"):
        value = report[key]
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    if report["rtl"] is not None:
        from coda.host.model.choice import prompt_name

        rtl = [prompt_name(report["model"], p) for p in report["rtl"]["prompts"]]
        which = (f"digits {','.join(rtl)}" if report["model"] == "digits" else "; ".join(rtl))
        table.add_row("prompts through the RTL", f"{len(rtl)} of {len(report['prompts'])}: {which}")
    table.add_row("grid GIF", report["grid_gif"])
    modelled = report["modelled"]
    if not modelled["available"]:
        table.add_row("modelled systems", f"not available: {modelled['reason']}")
    if modelled["available"]:
        table.add_row("modelled systems", "this generation of the shipped model, speedup "
                      "against a (launch-bound at this size)")
    for letter, row in modelled.get("systems", {}).items():
        if row.get("fits", True):
            table.add_row(f"modelled {letter}: {row['name']}",
                          f"{row['latency_s']:.4g} s, {row['speedup']:.3g}x")
        else:
            table.add_row(f"modelled {letter}: {row['name']}", "does not fit")
    paper = report.get("paper_scale", {"available": False, "reason": "not computed"})
    if not paper["available"]:
        table.add_row("paper scale", f"not available: {paper['reason']}")
    else:
        table.add_row("paper scale", paper["label"] + "; coda " + " ".join(paper["argv"]))
    for letter, row in paper.get("systems", {}).items():
        table.add_row(f"paper scale {letter}: {row['name']}",
                      f"{row['latency_s']:.4g} s, {row['speedup']:.3g}x" if row["fits"]
                      else "does not fit")
    console.print(table)


def _adherence_keys(report: dict) -> tuple[str, ...]:
    """The report's prompt-adherence keys (``<figure>_full``, ``<figure>_cached``: the
    model's :func:`coda.host.model.choice.adherence` figures), in report order."""
    from coda.host.model.choice import ADHERENCE

    return tuple(f"{k}_{which}" for k in ADHERENCE[report["model"]]
                 for which in ("full", "cached"))


def _rtl_videos(cfg: RunConfig, prompts: int) -> int | None:
    """How many prompts (the first ones) run through the RTL: None with ``--backend torch``.
    Raises ValueError: ``--rtl-videos`` with the torch backend, or outside 1..prompts."""
    if cfg.backend != "rtl":
        if cfg.rtl_videos is not None:
            raise ValueError(f"--rtl-videos {cfg.rtl_videos}: an option of --backend rtl, "
                             f"expected no --rtl-videos with --backend {cfg.backend}")
        return None
    if cfg.rtl_videos is None:
        return prompts
    if not 1 <= cfg.rtl_videos <= prompts:
        raise ValueError(f"--rtl-videos {cfg.rtl_videos}: expected 1..{prompts} (the number of "
                         f"--prompts)")
    return cfg.rtl_videos


def _modelled_unavailable(cfg: RunConfig, depth: int, dram: str) -> str | None:
    """None when the report's ``modelled`` section (the generation replayed as systems a..f,
    :func:`coda.host.system.modelled`) can be computed for this run's NMEs (``--lanes``,
    the driver's buffer ``depth``, ``--dimms``, ``--ranks``, ``dram``), else why not (the
    system model's own message, e.g. no DIMM-NMP measurement for these lanes)."""
    from coda.host.system.platforms import DEFAULT_PLATFORM, platform

    try:
        platform(DEFAULT_PLATFORM, dram, cfg.dimms, cfg.ranks, lanes=cfg.lanes, depth=depth)
    except ValueError as exc:
        return str(exc)
    return None


#: the policies --skip calibrates (uniform's run options are --interval / --warmup instead);
#: --profile is read by those calibrated on a profile and by coda+dra (the videos its
#: thresholds are calibrated on when the schedule file has none)
_SKIP_POLICIES = tuple(n for n in policy_names("skip_calibrated") if n != "uniform")
_PROFILE_POLICIES = ("coda+dra",) + policy_names("needs_profile")
#: the static policies --cache forecast serves
_FORECAST_POLICIES = tuple(n for n in policy_names("serves_forecast") if n in POLICY_CHOICES)


def _policy(cfg: RunConfig, model):
    """(name, policy) from the flags; every file is read and checked here, before any work.
    A flag the chosen policy does not read is refused, not ignored."""
    from coda.host.cache.policies import check_cached_steps, get_policy
    from coda.host.cache.profile import model_hash
    from coda.host.cache.shipped import load_schedule
    from coda.host.model.dit import shipped_model

    uniform_flags = cfg.interval is not None or cfg.warmup is not None
    if cfg.policy is not None and not cfg.policy.strip():
        raise ValueError(f"--policy {cfg.policy!r}: empty, expected one of "
                         f"{', '.join(POLICY_CHOICES)} (or no --policy: coda)")
    name = cfg.policy if cfg.policy is not None else ("uniform" if uniform_flags else "coda")
    if name not in POLICY_CHOICES:
        raise ValueError(f"--policy {name!r}: unknown policy, expected one of "
                         f"{', '.join(POLICY_CHOICES)}")
    if uniform_flags and name != "uniform":
        raise ValueError(f"--interval/--warmup: options of --policy uniform, expected no "
                         f"--interval/--warmup with --policy {name}")
    if cfg.schedule is not None and not name.startswith("coda"):
        raise ValueError(f"--schedule {cfg.schedule}: a coda / coda+dra option, expected no "
                         f"--schedule with --policy {name}")
    if cfg.skip is not None and name not in _SKIP_POLICIES:
        how = ("its schedule's (--schedule)" if name.startswith("coda")
               else "set by --interval/--warmup")
        raise ValueError(f"--skip {cfg.skip}: a {' / '.join(_SKIP_POLICIES)} "
                         f"option (the skip "
                         f"of {name} is {how}), expected no --skip with --policy {name}")
    if cfg.cache == "forecast" and name not in _FORECAST_POLICIES:
        raise ValueError(f"--cache forecast with --policy {name}: expected a static policy "
                         f"({', '.join(_FORECAST_POLICIES)}; the alphas are calibrated for "
                         "a schedule's computed steps)")
    if cfg.profile is not None and name not in _PROFILE_POLICIES and cfg.cache != "forecast":
        raise ValueError(f"--profile {cfg.profile}: read by {' / '.join(_PROFILE_POLICIES)} "
                         f"only, expected no --profile with --policy {name}")
    skip = 0.5 if cfg.skip is None else cfg.skip
    if not 0.0 < skip < 1.0:
        raise ValueError(f"--skip {skip}: expected a fraction in (0, 1)")
    check_cached_steps(cfg.steps, "--steps", name)   # any rule-based policy: else no reuse
    layers = len(model.transformer.transformer_blocks)
    mhash = model_hash(model)
    if name == "uniform":
        interval = 2 if cfg.interval is None else cfg.interval
        # default 5, fewer for a short run (the last two steps: one computed, one reused)
        warmup = max(1, min(5, cfg.steps - 2)) if cfg.warmup is None else cfg.warmup
        if interval < 2:
            raise ValueError(f"--interval {interval}: recomputes every step, nothing would be "
                             "cached; expected >= 2")
        if warmup > cfg.steps - 2:
            given = "" if cfg.warmup is not None else " (the default)"
            raise ValueError(f"--warmup {warmup}{given} with --steps {cfg.steps}: nothing "
                             "would be cached (the uniform policy computes the --warmup first "
                             "steps and the step after them before any reuse); expected "
                             f"--warmup 1..{cfg.steps - 2} (--steps - 2)")
        return name, get_policy("uniform", interval=interval, warmup=warmup)
    profile = None
    if name in _PROFILE_POLICIES:
        profile = _profile(cfg, mhash, layers, f"--policy {name}")[0]
    if name in _SKIP_POLICIES:
        return name, get_policy(name, skip=skip, profile=profile,
                                num_steps=cfg.steps, num_layers=layers)
    if cfg.schedule is None and cfg.steps != 50:
        raise ValueError(f"--policy {name} --steps {cfg.steps}: the shipped schedule is for "
                         "50 steps; give --schedule of coda schedule search for "
                         f"{cfg.steps} steps, or --policy uniform")
    path = cfg.schedule or _shipped_file(shipped_model(cfg.model).schedule(),
                                          f"--policy {name}", "--schedule",
                                          "coda schedule search")
    sched = load_schedule(path, model_id=mhash, num_steps=cfg.steps, num_layers=layers)
    if name == "coda":
        return name, get_policy(name, schedule=sched)
    return name, get_policy(name, schedule=sched,
                            thresholds=_dra_thresholds(cfg, model, sched, profile, path))


def _dra_thresholds(cfg: RunConfig, model, sched, profile, path):
    """coda+dra's thresholds: the schedule file's ``"dra"`` block if it has one (checked
    against the model, steps and schedule), else calibrated now on the profile's videos
    (:func:`coda.experiments.dra_calibration.calibrate_default_dra`, torch backend)."""
    from coda.host.nme.backend import TorchBackend
    from coda.hw.verilog import resolve_preset
    from coda.experiments.dra_calibration import calibrate_default_dra, load_step_dra
    from coda.host.cache.profile import model_hash
    from coda.host.cache.shipped import schedule_block

    if schedule_block(path, "dra") is not None:
        return load_step_dra(path, model_id=model_hash(model), num_steps=cfg.steps)[1]
    return calibrate_default_dra(
        model, sched, profile, num_steps=cfg.steps, guidance_scale=cfg.guidance,
        driver_factory=lambda n: _driver(TorchBackend(), cfg, resolve_preset(cfg), model, n,
                                         True, True))[0]


def _profile(cfg: RunConfig, mhash: str, layers: int, who: str):
    """(the profile, its path): --profile or the shipped one (50 steps), checked against the
    model, --steps and the layers; ``who`` names the option that reads it in the error."""
    from coda.host.cache.profile import Profile
    from coda.host.model.dit import shipped_model

    if cfg.profile is None and cfg.steps != 50:
        raise ValueError(f"{who} --steps {cfg.steps}: the shipped profile is for 50 steps; "
                         f"give --profile of coda profile --steps {cfg.steps}")
    path = cfg.profile or _shipped_file(shipped_model(cfg.model).profile, who, "--profile",
                                         "coda profile")
    profile = Profile.load(path)
    profile.check_for(mhash, cfg.steps, layers, what=f"--profile {path}")
    return profile, path


def _forecast(cfg: RunConfig, model, name: str, policy) -> tuple[Any, str | None]:
    """--cache forecast: (alphas, where they came from); (None, None) for reuse. The alphas
    are the schedule file's ``"forecast"`` block (coda: --schedule or the shipped one) if it
    has one (checked against the model, steps and schedule), else calibrated now on the
    profile's videos (--profile or the shipped one;
    :func:`coda.experiments.forecast_calibration.calibrate_forecast`, torch backend)."""
    from coda.host.nme.backend import TorchBackend
    from coda.hw.verilog import resolve_preset
    from coda.experiments.forecast_calibration import calibrate_forecast, load_forecast
    from coda.host.cache.profile import model_hash
    from coda.host.model.dit import shipped_model

    if cfg.cache != "forecast":
        return None, None
    mhash, layers = model_hash(model), len(model.transformer.transformer_blocks)
    sched = policy._schedule(cfg.steps, layers)
    if name == "coda":
        path = cfg.schedule or shipped_model(cfg.model).schedule()
        found = load_forecast(path, model_id=mhash, num_steps=cfg.steps)
        if found is not None:
            return found[1], f"{path} (\"forecast\" block)"
    profile, path = _profile(cfg, mhash, layers, "--cache forecast")
    table = calibrate_forecast(
        model, {name: sched}, profile.meta["prompts"], profile.meta["seeds"],
        num_steps=cfg.steps, guidance_scale=cfg.guidance,
        driver_factory=lambda n: _driver(TorchBackend(), cfg, resolve_preset(cfg), model, n,
                                         False, True))[name]
    return table, f"calibrated on {path}'s {len(table.videos)} videos"


def _shipped_file(path: Path, who: str, flag: str, command: str) -> Path:
    """``path`` (a shipped schedule or profile of ``--model``) if it exists. Raises
    ValueError naming ``who`` (the option that needs it), ``flag`` to give one instead and
    the ``command`` that makes it."""
    if not Path(path).exists():
        raise ValueError(f"{who}: the model has no shipped {path.name} yet; give {flag} "
                         f"(made by {command}) or another --policy")
    return path


def _machine() -> str:
    from coda.results import machine
    return machine()
