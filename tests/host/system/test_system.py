"""The system timing and energy model (coda.host.system): traced shapes against the
arithmetic, the NME time of every segment of a real cached generation against the cycles the
torch backend reported, synthesised events against real ones, ablation orderings derived from
parameters, and bad input."""

from __future__ import annotations

import json

import pytest
import torch

from coda.host.system import modelled
from coda.host.system.ablation import run_ablation
from coda.host.system.nme import segment_timing
from coda.host.system.platforms import platform
from coda.host.system.presets import model_shape, opensora_shape, shipped_shape
from coda.host.system.replay import SYSTEMS, replay
from coda.host.system.schedules import resolve, transfer, uniform
from coda.host.system.shapes import ATTENTION, GEMM
from coda.host.system.sim import parse_systems, simulate
from coda.host.system.workload import from_events, segment_bytes, synthesize, tensor_bytes

STEPS = 10


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def generation():
    """A real cached generation of the shipped model on the torch backend (1 x 2 ranks)."""
    from coda.host.nme.backend import TorchBackend
    from coda.host.nmp.driver import NMPDriver
    from coda.host.cache.events import EventLog
    from coda.host.model.dit import load_model
    from coda.host.model.sample import cache_mem_words, cached_generate
    from coda.host.cache.policies import UniformIntervalPolicy
    from coda.hw.nme.isa import NMEConfig

    torch.set_num_threads(1)
    model, _ = load_model()
    log = EventLog()
    cfg = NMEConfig(lanes=8, mem_words=cache_mem_words(model, 2, 2, 8))
    driver = NMPDriver(TorchBackend(), cfg, dimms=1, ranks=2)
    policy = UniformIntervalPolicy(intervals={"cross_attn": 3, "spatial_ffn": 1},
                                   default_interval=2, warmup=2)
    cached_generate(model, [3, 7], driver, policy, events=log, num_steps=STEPS)
    return {"log": log, "cfg": cfg, "policy": policy, "model": model}


@pytest.fixture(scope="module")
def digits_shape():
    return shipped_shape()


# ------------------------------------------------------------------------------ shapes
def test_wan14b_720p_4s_traced_matches_arithmetic():
    s = model_shape("wan2.1-14b", "720p", 4)
    assert s.frames == 65 and s.latent == (17, 90, 160)
    assert s.video_tokens == 61_200 and s.hidden == 5_120
    assert {(o.tokens, o.channels) for o in s.ops} == {(61_200, 5_120)}
    assert len(s.ops) == 3 * 40
    # per block: self-attn q,k,v,o 4*2TC^2 + scores 4T^2C; cross q,o 2*2TC^2, k,v 2*2LC^2,
    # scores 4TLC; FFN 2*2TCF
    t, c, f, L = 61_200, 5_120, 13_824, 512
    block = 8 * t * c * c + 4 * t * t * c + 4 * t * c * c + 4 * L * c * c + 4 * t * L * c \
        + 4 * t * c * f
    assert s.forward_flops == pytest.approx(40 * block, rel=2e-3)
    assert s.forward_flops / 1e15 == pytest.approx(4.56, abs=0.005)      # docs/system-model.md
    assert s.all_ops_cache_bytes(2) > 40e9                               # the CODA paper: > 40 GB


def test_opensora_hand_written_matches_traced_pixart_blocks():
    """STDiT3 and Latte-1 blocks are the same PixArt-alpha block (1152 wide, 16 heads):
    at 720p both have N = 3,600 tokens per frame, so per-token FLOPs must agree."""
    osr = opensora_shape(720, 1280, 102)
    latte = model_shape("latte-1", "720p", frames=16)
    assert osr.video_tokens == 30 * 3_600 and latte.video_tokens == 16 * 3_600

    def per_token(shape, op, classes=(GEMM, ATTENTION)):
        o = next(x for x in shape.ops if x.op == op)
        k = o.kernels
        mask = sum(k.cls == c for c in classes).astype(bool)
        return float(k.flops[mask].sum()) / o.tokens

    for op in ("spatial_attn", "spatial_ffn", "temporal_ffn"):
        assert per_token(osr, op) == pytest.approx(per_token(latte, op), rel=1e-3), op
    assert per_token(osr, "temporal_attn", (GEMM,)) == pytest.approx(
        per_token(latte, "temporal_attn", (GEMM,)), rel=1e-3)


@pytest.mark.parametrize("name, frames", [("wan2.1-1.3b", 5), ("cogvideox-2b", 9),
                                          ("hunyuanvideo", 5), ("latte-1", 16)])
def test_traced_operators_are_the_cache_engines(name, frames):
    """The traced operators, in forward order, are those the cache engine hooks
    (coda.host.cache.arch.model_ops), so a real EventLog of any of these models maps onto them."""
    from coda.host.cache.arch import model_ops
    from coda.host.system.presets import get_spec
    from coda.host.system.trace import build

    shape = model_shape(name, "256x256", frames=frames)
    model, _ = build(get_spec(name))
    assert [o.ref for o in shape.ops] == [tuple(r) for r in model_ops(model).ops]
    two = name in ("cogvideox-2b", "hunyuanvideo")
    assert all(bool(o.stream_tokens) == two for o in shape.ops)
    if two:
        assert all(o.stream_tokens == (shape.video_tokens, shape.text_tokens) for o in shape.ops)


def test_shipped_model_shape(digits_shape):
    s = digits_shape
    assert (s.video_tokens, s.hidden, len(s.ops)) == (512, 96, 20)
    assert [o.ref for o in s.ops[:5]] == [(0, "spatial_attn"), (0, "cross_attn"),
                                          (0, "spatial_ffn"), (0, "temporal_attn"),
                                          (0, "temporal_ffn")]
    assert [o.index for o in s.ops if o.barrier_after] == [2]


# ------------------------------------------------------------------------------ NME + events
def test_modelled_nme_cycles_equal_cosim_events(generation):
    """Every segment of a real cached generation: the cycle model of the compiled program
    of each rank's tile gives the cycles the torch backend reported (exact, < 2 %)."""
    segs = generation["log"].of("segment")
    assert len(segs) > 10
    cfg = generation["cfg"]
    zero = _zero_slot_writes(segs, 2, cfg.lanes)
    for s in segs:
        t = segment_timing(s.tokens, s.channels, len(s.ops), n_ranks=2, lanes=cfg.lanes,
                           depth=cfg.depth)
        assert t.cycles_ideal == pytest.approx(s.nme_cycles, rel=0.02)
        assert t.cycles_ideal == s.nme_cycles
        sb = segment_bytes(s.tokens, s.channels, len(s.ops), 2, cfg.lanes)
        assert (zero[s.segment, s.generation] + sb["down"], sb["up"], sb["programs"]) == (
            s.bytes_to_nmp, s.bytes_from_nmp, s.programs)


def _zero_slot_writes(segs, n_ranks: int, lanes: int) -> dict:
    """(segment, generation) -> bytes of the slots of zeros it wrote: the engine's sum
    segments (its default) write one per generation, branch, sample and stream, with the
    sample's first segment in the branch (coda.host.nmp.link)."""
    out, seen = {}, set()
    for s in segs:
        first = (s.generation, s.branch, s.sample) not in seen
        seen.add((s.generation, s.branch, s.sample))
        out[s.segment, s.generation] = tensor_bytes(s.tokens, s.channels, n_ranks, lanes,
                                                    s.stream_tokens) if first else 0
    return out


@pytest.mark.parametrize("depth,form", [
    (64, "sum"), pytest.param(64, "residual", marks=pytest.mark.slow),
    pytest.param(256, "sum", marks=pytest.mark.slow)])
def test_modelled_nme_time_against_a_dram_timed_generation(depth, form):
    """A short real generation (6 steps, PAB, one prompt) with every segment on the 1 x 2
    DDR5-4800 DIMM-NMP cosimulation (the build coda run --dram uses), its segments of the
    form ``form`` (the engine's default "sum": x a resident slot of zeros; "residual": x
    written by the host): the modelled NME cycles of every segment (cycle model bounded by
    the utilisation measured on the shipped model's tiles for that form) are within 2 % of
    the cycles the cosimulation measured, the sum within 1 %. The driver's bank-coloured
    placement makes equal segments cost equal cycles (what is left is the refresh phase):
    per K, max and min are within 2 % of their mean."""
    from coda.host.system.validate import run_check

    r = run_check("DDR5-4800", depth, steps=6, prompts=(5,), segment_output=form)
    assert r["segment_output"] == form
    assert r["segments"] > 20
    assert abs(r["total_rel_error"]) < 0.01
    by_k = {}
    for s in r["segments_detail"]:
        assert abs(s["rel_error"]) < 0.02, s
        by_k.setdefault(s["k"], []).append(s["cosim_cycles"])
    assert len(by_k) >= 3
    for k, cyc in by_k.items():
        assert (max(cyc) - min(cyc)) / (max(cyc) + min(cyc)) < 0.02, (k, cyc)
    assert r["placement_misses"] == 0


@torch.no_grad()
def test_two_stream_segments_equal_the_engine_on_hunyuanvideo():
    """HunyuanVideo keeps a video and a text stream, each with its own gates and NME programs
    (host/cache/arch): the modelled cycles and bytes of every segment, per stream, equal the
    engine's events on a small random configuration."""
    from diffusers import HunyuanVideoTransformer3DModel

    from coda.host.nme.backend import TorchBackend
    from coda.host.cache.engine import CodaCacheConfig, apply_coda_cache
    from coda.host.nmp.driver import NMPDriver
    from coda.host.cache.events import EventLog
    from coda.host.cache.policies import UniformIntervalPolicy
    from coda.hw.nme.isa import NMEConfig

    torch.manual_seed(1)
    model = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
        num_layers=2, num_single_layers=2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2,
        patch_size_t=1, guidance_embeds=False, text_embed_dim=16, pooled_projection_dim=8,
        rope_axes_dim=(4, 6, 6)).eval()
    cfg = NMEConfig(lanes=8, mem_words=1 << 15)
    log = EventLog()
    apply_coda_cache(model, CodaCacheConfig(NMPDriver(TorchBackend(), cfg, ranks=2),
                                            UniformIntervalPolicy(default_interval=2, warmup=1),
                                            events=log))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 3, 8, 8, generator=g)
    kw = dict(encoder_hidden_states=torch.randn(1, 6, 16, generator=g),
              encoder_attention_mask=torch.ones(1, 6, dtype=torch.long),
              pooled_projections=torch.randn(1, 8, generator=g))
    for i in range(4):
        with model.cache_context("cond", step_index=i, num_inference_steps=4):
            x = x - 0.1 * model(hidden_states=x, timestep=torch.tensor([900 - 200 * i]), **kw,
                                return_dict=False)[0]
    segs = log.of("segment")
    assert segs and all(len(s.stream_tokens) == 2 for s in segs)
    zero = _zero_slot_writes(segs, 2, 8)
    for s in segs:
        k = len(s.ops)
        t = segment_timing(s.tokens, s.channels, k, n_ranks=2, lanes=8, depth=cfg.depth,
                           stream_tokens=s.stream_tokens)
        sb = segment_bytes(s.tokens, s.channels, k, 2, 8, stream_tokens=s.stream_tokens)
        assert (t.cycles_ideal, zero[s.segment, s.generation] + sb["down"], sb["up"],
                sb["programs"]) == (s.nme_cycles, s.bytes_to_nmp, s.bytes_from_nmp,
                                    s.programs)


def test_synthesized_events_equal_real_ones(generation, digits_shape):
    """The engine's schedule on the traced shape, synthesised without tensors, gives the
    same operators, segments, bytes and cycles as the real generation (per sample)."""
    log, cfg = generation["log"], generation["cfg"]
    sched = generation["policy"].build(STEPS, 4)
    ms = transfer(sched, digits_shape, STEPS)
    assert ms.source.startswith("identity") and ms.fixups == 0
    synth = synthesize(digits_shape, ms, n_ranks=2, lanes=cfg.lanes, depth=cfg.depth,
                       samples=2)
    key = lambda e: (e.step, e.branch, e.sample, e.ops, e.bytes_to_nmp, e.bytes_from_nmp,  # noqa
                     e.programs, e.nme_cycles)
    assert sorted(map(key, synth.of("segment"))) == sorted(map(key, log.of("segment")))
    ops = lambda l: sorted((e.step, e.branch, e.sample, e.index, e.reused, e.stored_bytes)  # noqa
                           for e in l.of("op"))
    assert ops(synth) == ops(log)


def test_a_long_segment_crosses_the_link_once_as_the_driver_chains_it():
    """More than 8 terms: programs chain in rank memory; the modelled bytes and programs are
    those the driver moves (measured on a 20-term segment)."""
    from coda.host.nme.backend import TorchBackend
    from coda.host.nmp.driver import NMPDriver
    from coda.hw.nme.isa import NMEConfig

    drv = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 18), ranks=2)
    x = torch.zeros(512, 96, dtype=torch.bfloat16)
    for i in range(20):
        drv.store(i, x)
    drv.store("zero", x)
    # "residual": x goes down; "sum": x is the slot of zeros, read in place
    for form, x_in in (("residual", x), ("sum", "zero")):
        pending = drv.segment_submit(x_in, [x[0]] * 20, list(range(20)))
        pending.result()
        sb = segment_bytes(512, 96, 20, 2, 8, segment_output=form)
        assert (sb["down"], sb["up"], sb["programs"]) == (
            pending.bytes_to_nmp, pending.bytes_from_nmp, pending.programs), form
        one = segment_bytes(512, 96, 8, 2, 8, segment_output=form)
        assert sb["programs"] == 3 and (sb["x"], sb["y"]) == (one["x"], one["y"])
    assert sb["x"] == 0 and one["y"] == tensor_bytes(512, 96, 2, 8) == 512 * 96 * 2


def test_modelled_for_coda_run(generation):
    out = modelled(generation["log"])
    assert out["nme_check"]["max_rel_error"] == 0.0
    assert out["nme_check"]["events_nme_cycles"] == out["nme_check"]["model_ideal_cycles"] > 0
    assert set(out["systems"]) == set("abcdef")       # g (forecast history) only in forecast
    assert out["cache"] == "reuse"
    for s, row in out["systems"].items():
        assert row["fits"], s
        assert row["latency_s"] > 0 and 0 < row["gpu_busy_fraction"] <= 1
    json.dumps(out)                                   # JSON-able for coda run's report


# ------------------------------------------------------------------------------ ablation
def _digits_workload(shape, **kw):
    sched = uniform(shape, 20, interval=2, warmup=2, **kw)
    return from_events(synthesize(shape, sched, n_ranks=2, lanes=8, depth=256), shape)


def test_no_reuse_makes_every_system_system_a(digits_shape):
    wl = _digits_workload(digits_shape)
    wl_none = from_events(synthesize(digits_shape, uniform(digits_shape, 20, interval=1),
                                     n_ranks=2, lanes=8, depth=256), digits_shape)
    plat = platform("rtx4090", "DDR5-4800", 1, 2)
    a = replay(wl_none, plat, "a").latency_s
    for s in "bcde":
        assert replay(wl_none, plat, s).latency_s == pytest.approx(a, rel=1e-12), s
    assert replay(wl, plat, "a").latency_s == pytest.approx(a, rel=1e-12)


def test_infinite_pcie_makes_c_approach_b():
    shape = model_shape("wan2.1-1.3b", "480p", 2)
    sched = uniform(shape, 12, interval=2, warmup=2)
    wl = from_events(synthesize(shape, sched, n_ranks=16, lanes=8, depth=256), shape)
    # 16 DIMMs: the host channels (16 x 38.4 GB/s) do not bound the copies either
    slow = platform("a800", "DDR5-4800", 16, 4)
    fast = platform("a800", "DDR5-4800", 16, 4, h2d_bw=1e18, d2h_bw=1e18, latency_s=0.0)
    b = replay(wl, slow, "b").latency_s
    c_slow, c_fast = replay(wl, slow, "c").latency_s, replay(wl, fast, "c").latency_s
    assert c_fast < c_slow
    assert abs(c_fast - b) / b < 0.01              # only b's on-GPU store copies differ


def test_orderings_from_parameters():
    """Coalescing never moves more bytes than one transfer per operator (e <= d); CFG
    interleaving hides round trips when branches alternate compute and segments (f < e);
    a guidance-distilled model has nothing to interleave (f = e)."""
    shape = model_shape("wan2.1-1.3b", "480p", 2)
    sched = uniform(shape, 14, interval=2, warmup=2, intervals={"cross_attn": 3,
                                                                 "spatial_ffn": 4})
    wl = from_events(synthesize(shape, sched, n_ranks=8, lanes=8, depth=256), shape)
    res = run_ablation(wl, platform("rtx4090", "DDR5-4800", 2, 4), "abcdef")["systems"]
    assert res["e"]["pcie_bytes"] <= res["d"]["pcie_bytes"]
    assert res["e"]["latency_s"] <= res["d"]["latency_s"]
    assert res["f"]["latency_s"] < res["e"]["latency_s"]
    assert res["a"]["speedup"] == 1.0 and res["c"]["speedup_vs_c"] == 1.0
    for row in res.values():
        b = row["breakdown"]
        assert sum(b.values()) == pytest.approx(row["latency_s"], rel=1e-9)
    hy = model_shape("hunyuanvideo", "480x272", frames=9)
    wlh = from_events(synthesize(hy, uniform(hy, 8, interval=2, warmup=2), n_ranks=4), hy)
    ph = platform("rtx4090", "DDR5-4800", 2, 2)
    assert replay(wlh, ph, "f").latency_s == pytest.approx(replay(wlh, ph, "e").latency_s)


def test_nme_clock_of_the_system_model():
    """``nme_mhz``: at the DRAM command clock the same figures as no clock given; far below
    the knee a segment is NME-bound, ideal cycles / f exactly; a slower NME never makes a
    system faster, and systems without NMEs (a, b, c) do not change."""
    shape = model_shape("wan2.1-1.3b", "480p", 2)
    wl = from_events(synthesize(shape, uniform(shape, 10, interval=2, warmup=2), n_ranks=4,
                                lanes=8, depth=256), shape)
    same = platform("rtx4090", "DDR5-4800", 2, 2)
    at_tck = platform("rtx4090", "DDR5-4800", 2, 2, nme_mhz=1000 / same.dram.tCK_ns)
    assert same.nme_clock_hz == pytest.approx(at_tck.nme_clock_hz, rel=1e-12)
    assert same.rank_peak_bytes_per_nme_cycle == same.dram.burst_bytes / same.dram.nBL
    slow = platform("rtx4090", "DDR5-4800", 2, 2, nme_mhz=100)
    assert slow.rank_peak_bytes_per_nme_cycle == pytest.approx(
        same.rank_peak_bytes_per_nme_cycle * same.nme_clock_hz / 100e6)
    t = segment_timing(4096, 1536, 4, n_ranks=4, lanes=8, depth=256, clock_hz=100e6,
                       rank_peak_bytes_per_cycle=slow.rank_peak_bytes_per_nme_cycle,
                       dram_util=0.88)
    assert t.cycles_dram < t.cycles_ideal == t.cycles       # 16 B/cycle against 192 B/cycle
    assert t.seconds == t.cycles_ideal / 100e6
    fig = {p: run_ablation(wl, p, "abcdef")["systems"] for p in (same, at_tck, slow)}
    for s in "abcdef":
        assert fig[at_tck][s]["latency_s"] == pytest.approx(fig[same][s]["latency_s"],
                                                            rel=1e-12), s
    for s in "abc":
        assert fig[slow][s]["latency_s"] == pytest.approx(fig[same][s]["latency_s"],
                                                          rel=1e-12), s
    for s in "def":
        assert fig[slow][s]["latency_s"] > fig[same][s]["latency_s"], s
    with pytest.raises(ValueError, match=r"--nme-mhz: nme_mhz=5000: .*DDR5-4800 command"):
        platform("rtx4090", "DDR5-4800", 2, 2, nme_mhz=5000)
    with pytest.raises(ValueError, match=r"--nme-mhz: nme_mhz=0: expected a positive"):
        platform("rtx4090", "DDR5-4800", 2, 2, nme_mhz=0)


def test_deterministic(digits_shape):
    wl = _digits_workload(digits_shape, intervals={"cross_attn": 3})
    plat = platform("l4", "LPDDR5-6400", 1, 4)
    r1, r2 = replay(wl, plat, "f"), replay(wl, plat, "f")
    assert r1.latency_s == r2.latency_s and r1.intervals == r2.intervals


# ------------------------------------------------------------------------------ input
def test_cache_that_does_not_fit_is_a_row_not_an_error():
    out = simulate("wan2.1-14b", resolution="720p", seconds=4, steps=12, dimms=1, ranks=2,
                   warmup=2, systems="abcdef", record=False)["report"]
    assert out["cache_bytes"] > 40e9
    assert out["systems"]["a"]["fits"]
    for s in "bcdef":
        assert out["systems"][s]["fits"] is False and "GiB" in out["systems"][s]["reason"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(model="sora-2"), "--model"),
    (dict(model="wan2.1-14b", resolution="1000x720"), "multiples of 16"),
    (dict(model="wan2.1-14b", resolution="huge"), "--resolution"),
    (dict(model="wan2.1-14b", seconds=None, frames=64), "4k\\+1"),
    (dict(model="latte-1", frames=24), "exactly 16 frames"),
    (dict(model="opensora-1.2", seconds=3), "2, 4, 8 or 16"),
    (dict(model="wan2.1-14b", gpu="b200"), "--platform"),
    (dict(model="wan2.1-14b", dram="DDR3"), "DRAM standard"),
    (dict(model="wan2.1-14b", lanes=4, depth=64), "no DIMM-NMP measurement"),
    (dict(model="wan2.1-14b", dimms=0), "--dimms"),
    (dict(model="wan2.1-14b", schedule="/nonexistent.json"), "Schedule JSON"),
    # bounds: beyond them a trace takes minutes, overflows, or the replay never ends
    (dict(model="wan2.1-14b", seconds=float("inf")), r"--seconds inf: expected a duration"),
    (dict(model="wan2.1-14b", seconds=float("nan")), r"--seconds nan: expected a duration"),
    (dict(model="wan2.1-14b", seconds=1e9), r"expected a duration in \(0, 60.0\] s"),
    (dict(model="wan2.1-14b", resolution="100000x100000"), "each side 1..4096"),
    (dict(model="wan2.1-14b", dimms=1_000_000), "2000000 ranks: expected at most 256"),
    (dict(model="wan2.1-14b", steps=100_000), r"--steps 100000: expected 1..1000"),
])
def test_bad_input_names_the_value(kwargs, match):
    kwargs = {"steps": 4, "systems": "a", **kwargs}
    with pytest.raises(ValueError, match=match):
        simulate(**kwargs)


def test_schedule_coda_refused_until_shipped(tmp_path, digits_shape):
    with pytest.raises(ValueError, match="coda: the searched CODA schedule is not shipped"):
        resolve("coda", digits_shape, 10, coda_path=tmp_path / "coda.json")
    from coda.host.cache.policies import UniformIntervalPolicy
    (tmp_path / "coda.json").write_text(UniformIntervalPolicy(warmup=3).build(50, 4).to_json())
    wan = model_shape("wan2.1-1.3b", "480p", 2)
    ms = resolve("coda", wan, 30, coda_path=tmp_path / "coda.json")
    assert ms.source.startswith("transferred") and ms.num_steps == 30
    assert 0 < ms.ops_skipped_fraction() < 1


def test_segment_utilisation_table():
    from coda.host.system.platforms import (NMP_EFFICIENCY, SEGMENT_UTIL, SEGMENT_UTIL_TILE,
                                            segment_utilisation)

    t = SEGMENT_UTIL["sum"][("DDR5-4800", 8, 256)]
    assert segment_utilisation("DDR5-4800", 8, 256, 4) == t[4]
    assert segment_utilisation("ddr5_4800", 8, 256, 5) == pytest.approx((t[4] + t[6]) / 2)
    # without a segment table: the 4-stream segment's of the lanes sweep
    assert segment_utilisation("DDR5-4800", 2, 256, 3) == NMP_EFFICIENCY["DDR5-4800"].util[(2, 256)][1]
    with pytest.raises(ValueError, match="no DIMM-NMP measurement"):
        segment_utilisation("DDR5-4800", 4, 64, 1)
    # each form its own measurement: the tile table for the shipped model's tiles
    for form in ("sum", "residual"):
        words, tab = SEGMENT_UTIL_TILE[form][("DDR5-4800", 8, 64)]
        assert segment_utilisation("DDR5-4800", 8, 64, 3, words, segment_output=form) == tab[3]
        assert segment_utilisation("DDR5-4800", 8, 64, 3, segment_output=form) == \
            SEGMENT_UTIL[form][("DDR5-4800", 8, 64)][3]
    with pytest.raises(ValueError, match="segment_output='both'"):
        segment_utilisation("DDR5-4800", 8, 64, 1, segment_output="both")


def test_parse_systems():
    assert parse_systems("all") == "abcdefg" and parse_systems("f,c") == "cf"
    with pytest.raises(ValueError, match="--system 'h'"):
        parse_systems("h")


def test_schedule_file_is_transferred(tmp_path, generation):
    path = tmp_path / "sched.json"
    path.write_text(generation["policy"].build(STEPS, 4).to_json())
    rep = simulate("wan2.1-1.3b", resolution="480p", seconds=1, steps=7, schedule=str(path),
                   systems="ce", record=False, shape_cache=None)["report"]
    assert rep["schedule"]["transferred"] is True
    assert "relative depth" in rep["schedule"]["source"]
    assert rep["systems"]["e"]["segments"] > 0
    own = simulate("latte-digits", steps=STEPS, schedule=str(path), systems="e",
                   record=False, shape_cache=None)["report"]
    assert own["schedule"]["transferred"] is False       # the identity on its own model


def test_cli(tmp_path, capsys):
    from coda.cli import main

    out = tmp_path / "sim"
    rc = main(["sim", "--model", "latte-digits", "--steps", "12", "--warmup", "2",
               "--dimms", "1", "--ranks", "2", "--intervals", "cross_attn=3",
               "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["cache_bytes"] > 0 and set(rep["systems"]) == set(SYSTEMS)
    for row in rep["systems"].values():
        for key in ("name", "latency_s", "energy_j", "speedup", "energy_efficiency",
                    "pcie_bytes", "gpu_busy_fraction"):
            assert key in row
    assert (out / "timeline.png").stat().st_size > 0
    none = tmp_path / "none"          # nothing requested fits: rows say so, exit 0
    assert main(["sim", "--model", "wan2.1-14b", "--steps", "8", "--warmup", "2", "--dimms",
                 "1", "--ranks", "1", "--system", "e", "--out", str(none)]) == 0
    row = json.loads((none / "report.json").read_text())["systems"]["e"]
    assert row["fits"] is False and "host DIMMs" in row["reason"]
    bad = tmp_path / "file"
    bad.write_text("x")
    assert main(["sim", "--model", "latte-digits", "--out", str(bad)]) == 2
    assert main(["sim", "--model", "latte-digits", "--system", "z", "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("coda: error:") for line in err)
    assert not (tmp_path / "o").exists()


def test_interleaved_replay_of_a_monitored_generation_completes(generation):
    """System f with both branches launching segments and DRA monitors on the NMEs at the
    same time: the replay ends (it used to deadlock: two launches each holding one of the
    DIMMs' two host-access slots)."""
    from coda.host.nme.backend import TorchBackend
    from coda.host.nmp.driver import NMPDriver
    from coda.host.cache.events import EventLog
    from coda.host.model.sample import cache_mem_words, cached_generate
    from coda.host.cache.policies.dra import StepDRAPolicy, StepThresholds
    from coda.hw.nme.isa import NMEConfig

    model = generation["model"]
    cfg = NMEConfig(lanes=8, mem_words=cache_mem_words(model, 2, 2, 8, inputs=True))
    # step DRA around the uniform policy (the first operator reused at steps 3, 5, 7, 9):
    # the probes of steps 5 and 9 fall back (threshold 0), the others never do
    table = StepThresholds({s: 0.0 if s % 4 == 1 else 1e9 for s in range(STEPS)}, STEPS,
                           "any", "any", 1.0, 1.0)
    log = EventLog()
    cached_generate(model, [3, 7], NMPDriver(TorchBackend(), cfg, dimms=1, ranks=2),
                    StepDRAPolicy(generation["policy"], table), events=log, num_steps=STEPS)
    stats = log.stats()
    assert stats["monitors"] > 0 and stats["fallbacks"] > 0 and stats["segments"] > 0
    out = modelled(log)
    assert all(out["systems"][s]["latency_s"] > 0 for s in "abcdef")


def test_two_nme_launches_at_once_share_the_dimms_without_deadlock(generation, digits_shape):
    """Both CFG branches (system f) may launch on the NMEs at the same instant; each launch
    needs both host-access slots of the DIMMs. Taken one at a time, each would hold one and
    wait for the other forever."""
    from coda.host.system.replay import _Replay

    wl = from_events(generation["log"], digits_shape)
    r = _Replay(wl, platform("rtx4090", "DDR5-4800", 1, 2, lanes=8, depth=64), "f",
                "model", prefetch=1, record=True)
    runs = [r.env.process(r.nme_run(1e-6, 1, "segment", br, 0)) for br in ("uncond", "cond")]
    r.env.run(until=r.env.all_of(runs))
    assert [i.branch for i in r.res.intervals] == ["uncond", "cond"]
    assert r.res.intervals[1].start >= r.res.intervals[0].end


def test_the_cli_refuses_with_one_line(tmp_path, capsys, monkeypatch):
    """argparse's own refusals (a value of the wrong type, an unknown option) and '-' as an
    output folder read like every other: one ``coda: error:`` line, exit 2, nothing written."""
    from coda.cli import main

    def run(argv):
        try:
            return main(argv)
        except SystemExit as exc:        # argparse exits by itself
            return exc.code

    monkeypatch.chdir(tmp_path)
    for argv, message in ((["sim", "--dimms", "abc"], "argument --dimms: invalid int value"),
                          (["sim", "--bogus"], "unrecognized arguments: --bogus"),
                          (["sim", "--out", "-"], "--out '-': expected a folder path")):
        assert run(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("coda: error: ") and message in err, err
        assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ sum segments
def _wan_small():
    shape = model_shape("wan2.1-1.3b", "480p", 2)
    sched = uniform(shape, 14, interval=2, warmup=2, intervals={"cross_attn": 3,
                                                                 "spatial_ffn": 4})
    return shape, sched


def test_sum_segments_send_no_residual_and_the_gpu_adds_it():
    """Per segment, "residual" sends x down ([T, C] 16-bit, tiled over the ranks) and "sum"
    does not; "sum" writes one slot of zeros per branch (one sample) instead, and the GPU runs one
    elementwise add per segment (h + z, three [T, C] tensors in the model's dtype). The bytes
    up and the segments are the same; the NME time of each is its segments' modelled time
    with that form's measured DRAM utilisation (the driver places their streams apart)."""
    from coda.host.system.nme import segment_timing
    from coda.host.system.platforms import segment_utilisation
    from coda.host.system.replay import _mem_kernel

    def nme_s(wl, form, system):
        """the NME time of the launches: d one per reused operator, e and f the segments"""
        out = 0.0
        launches = [(shape.ops[i].tokens, shape.ops[i].channels, 1)
                    for seg in wl.segments.values() for i in seg.ops] if system == "d" else \
            [(seg.tokens, seg.channels, seg.k) for seg in wl.segments.values()]
        for tokens, channels, k in launches:
            t = segment_timing(tokens, channels, k, n_ranks=plat.n_ranks,
                               lanes=plat.lanes, depth=plat.depth, clock_hz=plat.nme_clock_hz,
                               rank_peak_bytes_per_cycle=plat.rank_peak_bytes_per_nme_cycle,
                               dram_util=lambda kk, w, j: segment_utilisation(
                                   plat.dram.name, plat.lanes, plat.depth, kk, w,
                                   segment_output=form, program=j))
            out += t.seconds + t.programs * plat.pcie.latency_s
        return out

    shape, sched = _wan_small()
    plat = platform("rtx4090", "DDR5-4800", 2, 4)
    wl = {f: from_events(synthesize(shape, sched, n_ranks=plat.n_ranks, segment_output=f),
                         shape, segment_output=f) for f in ("sum", "residual")}
    op = shape.ops[0]
    assert all(o.tokens == op.tokens and not o.stream_tokens for o in shape.ops)
    x = tensor_bytes(op.tokens, op.channels, plat.n_ranks, plat.lanes)
    add = _mem_kernel(3 * op.tokens * op.channels * shape.dtype_bytes, plat.gpu)
    branches = 2                                   # Wan: true CFG, both branches reuse
    for s in "def":
        r = {f: replay(wl[f], plat, s, record=False) for f in wl}
        n = r["sum"].segments
        assert n == r["residual"].segments > 0
        assert r["residual"].d2h_bytes - r["sum"].d2h_bytes == n * x - branches * x, s
        assert r["residual"].h2d_bytes == r["sum"].h2d_bytes
        for f in wl:
            assert r[f].nme_busy_s == pytest.approx(nme_s(wl[f], f, s), rel=1e-9), (s, f)
        assert r["sum"].gpu_busy_s - r["residual"].gpu_busy_s == pytest.approx(n * add,
                                                                                rel=1e-9)
    for s in "ac":                                 # no NMP segments: the form is moot
        assert (replay(wl["sum"], plat, s).latency_s
                == replay(wl["residual"], plat, s).latency_s)


def test_segment_output_is_checked():
    from coda.host.system.sim import checked_simulate

    with pytest.raises(ValueError, match="--segment-output 'y': expected one of sum, residual"):
        checked_simulate(model="wan2.1-1.3b", segment_output="y")
    with pytest.raises(ValueError, match="segment_output='y'"):
        segment_bytes(512, 96, 2, 2, 8, segment_output="y")
