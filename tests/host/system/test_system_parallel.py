"""Several GPUs in the system model (coda.host.system.parallel, coda sim --gpus N --parallel):
one GPU through the multi-GPU engine is today's replay exactly; the parallel modes split the
work, the cache and the transfers as the formulas of the module docstring say."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from coda.host.system.ablation import run_ablation
from coda.host.system.parallel import (Comm, layout, latent_bytes, run_parallel,
                                       sequence_ops, shard_shape)
from coda.host.system.platforms import GPU_LINKS, platform
from coda.host.system.presets import model_shape
from coda.host.system.replay import SYSTEMS
from coda.host.system.schedules import resolve
from coda.host.system.sim import simulate, workload

STEPS = 8


@pytest.fixture(scope="module")
def wan():
    """Wan 2.1 1.3B at 480p x 2 s (two-pass CFG, 12 heads, 33 frames -> a 9 x 60 x 104
    latent, 2 x 2 patches: 9 x 30 x 52 = 14,040 video tokens), a uniform schedule of 8 steps
    on 2 x 4 ranks."""
    shape = model_shape("wan2.1-1.3b", "480p", 2)
    plat = platform("rtx4090", "DDR5-4800", 2, 4)
    sched = resolve("uniform", shape, STEPS, interval=2, warmup=3, intervals=None)
    return shape, plat, sched


def _wl(shape, plat, sched, sp=1):
    return workload(shard_shape(shape, sp), plat, sched)


def test_one_gpu_through_the_parallel_engine_is_todays_replay(wan):
    shape, plat, sched = wan
    wl = _wl(shape, plat, sched)
    ref = run_ablation(wl, plat, "abcdefg")
    got = run_parallel(wl, plat, layout(1, "none", shape), GPU_LINKS["nvlink4"], "abcdefg")
    for s in SYSTEMS:
        a, b = ref["systems"][s], got["systems"][s]
        for k in ("latency_s", "energy_j", "pcie_bytes", "h2d_bytes", "d2h_bytes",
                  "segments", "nme_busy_s", "gpu_busy_fraction", "breakdown"):
            assert a[k] == b[k], (s, k)
        assert {k: v for k, v in b["energy"].items() if k != "p2p_j"} == a["energy"]
        assert b["p2p_bytes"] == 0 and b["p2p_j"] == 0.0


def test_gpus_1_is_the_default_report(wan):
    kw = dict(resolution="480p", seconds=2, steps=STEPS, dimms=2, ranks=4, warmup=3,
              shape_cache=None, record=False)
    a = simulate("wan2.1-1.3b", **kw)["report"]
    b = simulate("wan2.1-1.3b", gpus=1, parallel="none", gpu_link="nvlink4", **kw)["report"]
    for s in SYSTEMS:
        assert a["systems"][s]["latency_s"] == b["systems"][s]["latency_s"]
        assert a["systems"][s]["energy_j"] == b["systems"][s]["energy_j"]
    assert "parallel" not in b and "one_gpu" not in b


def test_shard_divides_the_work_not_the_weights(wan):
    shape = wan[0]
    for sp in (2, 3, 4):
        sh = shard_shape(shape, sp)
        for o, p in zip(shape.ops, sh.ops):
            assert p.tokens == -(-o.tokens // sp)
            f = p.tokens / o.tokens
            np.testing.assert_allclose(p.kernels.flops, o.kernels.flops * f)
            np.testing.assert_allclose(p.kernels.act_bytes, o.kernels.act_bytes * f)
            np.testing.assert_array_equal(p.kernels.weight_bytes, o.kernels.weight_bytes)
        assert sh.weight_bytes == shape.weight_bytes
    # 14,040 tokens divide by 2 and 4: exactly half and a quarter of a forward's FLOPs
    assert shape.video_tokens == 14040
    assert shard_shape(shape, 2).forward_flops == pytest.approx(shape.forward_flops / 2)
    assert shard_shape(shape, 4).forward_flops == pytest.approx(shape.forward_flops / 4)


def test_sequence_ops_are_the_self_attentions(wan):
    shape = wan[0]
    ops = sequence_ops(shape)
    assert ops == {o.index for o in shape.ops if o.op == "attn"}     # not cross_attn, ffn
    assert len(ops) == 30                                            # one per Wan block


def test_cfg_parallel_runs_a_branch_per_gpu_and_exchanges_each_step(wan):
    """Two-pass CFG: one GPU runs both branches' identical calls in turn; with a branch per
    GPU the generation takes half as long plus one prediction exchange a step."""
    shape, plat, sched = wan
    link = GPU_LINKS["pcie4-p2p"]
    wl = _wl(shape, plat, sched)
    one = run_ablation(wl, plat, "a")["systems"]["a"]
    two = run_parallel(wl, plat, layout(2, "cfg", shape), link, "a")["systems"]["a"]
    exchange = latent_bytes(shape)
    assert exchange == 9 * 60 * 104 * 16 * 2     # latent (9, 60, 104) x 16 channels, bf16
    want = one["latency_s"] / 2 + STEPS * (link.latency_s + exchange / link.bw)
    assert two["latency_s"] == pytest.approx(want, rel=1e-9)
    assert two["p2p_bytes"] == STEPS * 2 * exchange
    assert two["p2p_j"] == pytest.approx(two["p2p_bytes"] * 8 * link.pj_per_bit * 1e-12)


def test_cfg_parallel_gives_each_gpu_its_branchs_cache(wan):
    shape, plat, sched = wan
    wl = _wl(shape, plat, sched)
    res = run_parallel(wl, plat, layout(2, "cfg", shape), GPU_LINKS["nvlink4"], "cf")
    per_branch = wl.cache_bytes_per_branch()
    assert res["memory"]["cache_bytes_per_gpu"] == max(per_branch.values())
    assert res["memory"]["cache_bytes_per_gpu"] == wl.cache_bytes // 2
    one = run_ablation(wl, plat, "f")["systems"]["f"]
    # every GPU's segments are its branch's: together as many as on one GPU
    assert res["systems"]["f"]["segments"] == one["segments"]


def test_ulysses_all_to_all_bytes_and_wait(wan):
    """Per computed self-attention per GPU: (N-1)/N of 4 [T/N, C] tensors, waited for with
    two collective latencies; shards of 14,040 / 2 tokens."""
    shape, plat, sched = wan
    link = GPU_LINKS["nvlink4"]
    n = 2
    sh = shard_shape(shape, n)
    comm = Comm(sh, n, "ulysses", link, plat.gpu)
    i = min(sequence_ops(sh))
    o = sh.ops[i]
    nbytes = 4 * 7020 * o.channels * 2 * (n - 1) / n
    assert comm(i, 1) == (pytest.approx(2 * link.latency_s + nbytes / link.bw), int(nbytes))
    assert comm(i + 1, 1) == (0.0, 0)                     # cross attention: nothing crosses
    # system a computes every self-attention of both branches every step on each GPU
    wl = workload(sh, plat, sched)
    res = run_parallel(wl, plat, layout(n, "ulysses", shape), link, "a")["systems"]["a"]
    gather = latent_bytes(shape) * (n - 1) // n
    per_gpu = STEPS * 2 * len(sequence_ops(sh)) * int(nbytes)
    assert res["p2p_bytes"] == n * per_gpu + n * gather
    assert res["p2p_s"] == pytest.approx(STEPS * 2 * len(sequence_ops(sh))
                                         * comm(i, 1)[0])


def test_ring_waits_only_beyond_the_attention_blocks(wan):
    shape, plat, _ = wan
    n = 4
    sh = shard_shape(shape, n)
    i = min(sequence_ops(sh))
    fast = Comm(sh, n, "ring", dataclasses.replace(GPU_LINKS["nvlink4"], latency_s=0.0),
                plat.gpu)
    assert fast(i, 1)[0] == 0.0                          # every pass hidden by a block
    slow_link = dataclasses.replace(GPU_LINKS["pcie4-p2p"], bw=1e6)
    slow = Comm(sh, n, "ring", slow_link, plat.gpu)
    block = 2 * sh.ops[i].tokens * sh.ops[i].channels * 2
    att = slow._attention_s(i, 1)
    want = (n - 1) * (slow_link.latency_s + block / slow_link.bw - att / n)
    assert slow(i, 1) == (pytest.approx(want), (n - 1) * block)


def test_sequence_parallel_cache_follows_the_shard(wan):
    shape, plat, sched = wan
    wl = _wl(shape, plat, sched)
    wl4 = _wl(shape, plat, sched, 4)
    assert wl4.cache_bytes == wl.cache_bytes // 4          # 14,040 tokens / 4, every entry
    seg1 = next(iter(wl.segments.values()))
    seg4 = next(iter(wl4.segments.values()))
    assert seg4.tokens == seg1.tokens // 4


def test_speedups_against_one_gpu_in_the_report(wan):
    rep = simulate("wan2.1-1.3b", resolution="480p", seconds=2, steps=STEPS, dimms=2,
                   ranks=4, warmup=3, systems="af", shape_cache=None, record=False, gpus=4,
                   parallel="cfg+ulysses", gpu_link="nvlink4")["report"]
    assert rep["parallel"]["cfg_degree"] == 2 and rep["parallel"]["sequence_degree"] == 2
    for s in "af":
        r = rep["systems"][s]
        assert r["speedup_vs_1gpu"] == pytest.approx(rep["one_gpu"][s]["latency_s"]
                                                     / r["latency_s"])
        assert 1.0 < r["speedup_vs_1gpu"] < 4.0


@pytest.mark.parametrize("gpus, mode, match", [
    (2, "none", "--parallel none is one GPU"),
    (3, "cfg", "cfg needs 2 GPUs"),
    (1, "ulysses", "needs >= 2 GPUs"),
    (9, "ring", "expected 1..8"),
    (2, "tensor", "--parallel 'tensor'"),
    (8, "ulysses", "Ulysses degree 8 must divide wan2.1-1.3b's 12 attention heads"),
])
def test_bad_layouts_name_the_value(wan, gpus, mode, match):
    shape = wan[0]
    with pytest.raises(ValueError, match=match):
        layout(gpus, mode, shape)


def test_layouts(wan):
    shape = wan[0]
    assert layout(6, "cfg+ulysses", shape) == layout(6, "cfg+ulysses", shape)
    lay = layout(6, "cfg+ulysses", shape)
    assert (lay.cfg, lay.sp, lay.sequence) == (2, 3, "ulysses")        # 3 divides 12 heads
    assert (layout(2, "cfg", shape).sp, layout(2, "cfg", shape).sequence) == (1, None)
    assert layout(8, "ring", shape).sequence == "ring"                 # ring: any degree


def test_distilled_model_refuses_cfg_parallel():
    shape = model_shape("hunyuanvideo", "32x32", frames=5, layers=1)
    with pytest.raises(ValueError, match="guidance-distilled"):
        layout(2, "cfg", shape)
    assert layout(2, "ulysses", shape).sp == 2


def test_cli_refuses_a_bad_parallel_mode(tmp_path, capsys):
    from coda.cli import main

    assert main(["sim", "--model", "wan2.1-1.3b", "--gpus", "2", "--parallel",
                 "cfg+ulysses", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["coda: error: --gpus 2 --parallel cfg+ulysses: cfg+ulysses needs an even "
                   "count >= 4 GPUs"]
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ validation (coda validate)
def test_published_scaling_cases_are_the_xdit_table_rows():
    """xDiT's HunyuanVideo report, Ulysses latency (s): the rows as published."""
    from coda.host.system.validate import PUBLISHED_SCALING

    got = {(c["gpu"], c["resolution"], c["gpus"]): (c["seconds_1"], c["seconds_n"])
           for c in PUBLISHED_SCALING}
    assert got == {("h100", "1280x720", 2): (1904.08, 925.04),
                   ("h100", "1280x720", 4): (1904.08, 514.08),
                   ("h100", "1280x720", 8): (1904.08, 337.58),
                   ("h20", "1280x720", 2): (6639.17, 3400.55),
                   ("h20", "1280x720", 4): (6639.17, 1762.86),
                   ("h20", "1280x720", 8): (6639.17, 940.97),
                   ("h100", "960x960", 2): (1735.01, 934.09),
                   ("h100", "960x960", 3): (1735.01, 645.45),
                   ("h100", "960x960", 6): (1735.01, 367.02)}
    for c in PUBLISHED_SCALING:
        assert c["source"].startswith("https://github.com/xdit-project/xDiT/")
        layout(c["gpus"], c["parallel"], None)        # every case is a valid layout


def test_validate_scaling_row_arithmetic():
    from coda.host.system.validate import validate_scaling

    case = dict(model="wan2.1-1.3b", resolution="832x480", frames=9, steps=3, gpu="h100",
                gpu_link="nvlink4", parallel="cfg", gpus=2, seconds_1=100.0, seconds_n=50.0,
                source="test", quote="", notes="")
    row = validate_scaling([case], shape_cache=None)[0]
    assert row["published_speedup"] == 2.0
    assert row["predicted_speedup"] == pytest.approx(row["predicted_1_s"]
                                                     / row["predicted_n_s"], rel=1e-3)
    assert row["error"] == pytest.approx(row["predicted_speedup"] / 2.0 - 1, abs=1e-3)
    assert row["within_25pct"] == (abs(row["error"]) <= 0.25)
    # one branch per GPU: half the work, plus an exchange of the prediction a step
    assert 1.9 < row["predicted_speedup"] < 2.0


# ------------------------------------------------------------------ host link presets (--pcie)
def test_pcie_presets_scale_with_generation_and_lanes():
    """Rate per lane doubles each generation (8, 16, 32 GT/s, 128b/130b), and with the lanes;
    gen4-x16 is the measured PCIe 4.0 x16 link's figures."""
    from coda.host.system.platforms import PCIE4_X16, PCIE_PRESETS

    assert len(PCIE_PRESETS) == 9
    g4 = PCIE_PRESETS["gen4-x16"]
    assert g4.theoretical_bw == pytest.approx(PCIE4_X16.theoretical_bw, rel=1e-15)
    assert g4.h2d_bw == pytest.approx(PCIE4_X16.h2d_bw, rel=1e-12)
    assert g4.d2h_bw == pytest.approx(PCIE4_X16.d2h_bw, rel=1e-12)
    assert PCIE_PRESETS["gen3-x4"].theoretical_bw == pytest.approx(8e9 * 4 * 128 / 130 / 8)
    assert PCIE_PRESETS["gen5-x8"].h2d_bw == pytest.approx(g4.h2d_bw)       # 2x rate, 1/2 lanes
    assert PCIE_PRESETS["gen3-x16"].d2h_bw == pytest.approx(g4.d2h_bw / 2)


def test_sim_pcie_option(wan):
    kw = dict(resolution="480p", seconds=2, steps=STEPS, dimms=2, ranks=4, warmup=3,
              shape_cache=None, record=False, systems="c")
    base = simulate("wan2.1-1.3b", **kw)["report"]
    same = simulate("wan2.1-1.3b", pcie="gen4-x16", **kw)["report"]
    slow = simulate("wan2.1-1.3b", pcie="gen3-x4", **kw)["report"]
    assert same["systems"]["c"]["latency_s"] == pytest.approx(
        base["systems"]["c"]["latency_s"], rel=1e-9)
    assert slow["platform"]["pcie_h2d_bw"] == pytest.approx(base["platform"]["pcie_h2d_bw"] / 8)
    assert slow["systems"]["c"]["latency_s"] > base["systems"]["c"]["latency_s"]
    with pytest.raises(ValueError, match="--pcie 'gen6-x16'"):
        simulate("wan2.1-1.3b", pcie="gen6-x16", **kw)
