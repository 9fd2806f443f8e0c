"""Measured xPU times: ``coda calibrate`` on the CPU at tiny sizes (what a table holds, that it
is measured), ``coda sim --gpu-table`` replacing the roofline exactly where the table has
entries (latencies derived from the table's numbers), refusals, the H200 preset and PCIe 5.0."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from coda.host.cache.arch import ARCHITECTURES
from coda.host.system.calibrate import calibratable, calibrate
from coda.host.system.gputable import GpuTimes, fit_copy
from coda.host.system.platforms import GPU, GPUS, PCIE4_X16, PCIE5_X16, platform
from coda.host.system.presets import get_spec, model_shape
from coda.host.system.sim import simulate

TINY = dict(resolution="32x32", frames=5)        # Wan / CogVideoX: 8 video tokens


@pytest.fixture(scope="module")
def wan_table():
    return calibrate("wan2.1-1.3b", **TINY, device="cpu", warmup=1, repeat=2)


def _wan_shape(layers=2):
    return model_shape("wan2.1-1.3b", "32x32", frames=5, layers=layers)


# ------------------------------------------------------------------------------ the table
def test_a_cpu_table_holds_measured_times_of_the_adapters_operators(wan_table):
    t = wan_table
    spec = ARCHITECTURES["WanTransformer3DModel"].block_lists[0][1]
    assert t["timer"] == "perf_counter" and t["device"]["type"] == "cpu"
    assert t["device"]["torch"] == torch.__version__ and t["date"] and t["command"]
    assert t["per"] == "block" and t["batches"] == [1]           # Wan: two CFG passes
    assert set(t["ops"]) == set(spec.ops)
    assert all(s > 0 for per in t["ops"].values() for s in per.values())
    blk = t["blocks"]["blocks"]                    # WanTransformer3DModel.blocks
    assert blk["class"] == spec.block_class and blk["ops"] == list(spec.ops)
    # the block's forward is its operators plus a rest (timer noise clamps it at 0)
    assert blk["rest_s"]["1"] == pytest.approx(
        max(0.0, blk["block_s"]["1"] - sum(t["ops"][op]["1"] for op in spec.ops)))
    shape = _wan_shape()
    assert (t["height"], t["width"], t["frames"], t["video_tokens"], t["hidden"]) == (
        shape.height, shape.width, shape.frames, shape.video_tokens, shape.hidden)
    c = t["cache_ops"]
    assert (c["tokens"], c["channels"]) == (shape.ops[0].tokens, shape.ops[0].channels)
    assert c["gated_residual_s"] > 0 and set(c["segment_s"]) == {"2", "4", "8"}
    assert t["copies"] is None                     # a CPU has no host link to time
    GpuTimes(json.loads(json.dumps(t)))            # survives JSON and its own check


def test_a_batched_cfg_model_is_timed_at_one_and_two_rows_with_its_text_tokens():
    t = calibrate("cogvideox-2b", **TINY, device="cpu", warmup=0, repeat=1)
    assert t["batches"] == [1, 2]
    assert all(set(per) == {"1", "2"} for per in t["ops"].values())
    assert set(t["other_s"]) == {"1", "2"}
    shape = model_shape("cogvideox-2b", "32x32", frames=5, layers=1)
    # joint text-video attention: the cached [T, C] holds both streams, as the trace says
    assert t["cache_ops"]["tokens"] == shape.ops[0].tokens == shape.video_tokens + 226


# ------------------------------------------------------------------------------ coda sim
def _exact(table, **changes):
    """``table`` with every operator, rest, other and cache time replaced by round values."""
    t = copy.deepcopy(table)
    for i, op in enumerate(t["ops"]):
        t["ops"][op] = {"1": (i + 1) * 1e-3}
    for blk in t["blocks"].values():
        blk["rest_s"] = {"1": 5e-4}
    t["other_s"] = {"1": 2e-3}
    t["cache_ops"].update(gated_residual_s=1e-4, residual_add_s=3e-5, slot_copy_s=7e-5)
    for k, v in changes.items():
        t["cache_ops"][k] = v
    return GpuTimes(t)


def _sim(table, systems="ab", **kw):
    return simulate("wan2.1-1.3b", **TINY, steps=6, gpu="h200", interval=2, warmup=1,
                    systems=systems, layers=2, shape_cache=None, gpu_table=table,
                    record=False, **kw)


def test_measured_times_replace_the_roofline_exactly(wan_table):
    """System a with a table: per call the rest (other + each block's rest) and every
    operator's measured time, nothing of the roofline."""
    times = _exact(wan_table)
    res = _sim(times, systems="a")
    shape = res["shape"]
    per_call = (times.table["other_s"]["1"] + shape.num_layers * 5e-4
                + sum(times.table["ops"][o.op]["1"] for o in shape.ops))
    calls = 6 * 2                                      # steps x (cond, uncond) passes
    assert res["report"]["systems"]["a"]["latency_s"] == pytest.approx(calls * per_call,
                                                                        rel=1e-12)
    assert res["report"]["replay"]["gpu_timing"] == "measured"
    assert res["report"]["platform"]["gpu_times"]["device"] == wan_table["device"]["name"]
    roof = _sim(None, systems="a")["report"]
    assert roof["replay"]["gpu_timing"] == "roofline"
    assert roof["systems"]["a"]["latency_s"] != res["report"]["systems"]["a"]["latency_s"]


def test_system_b_reads_the_measured_cache_operator_once_per_reused_operator(wan_table):
    base, slow = (_sim(_exact(wan_table, gated_residual_s=g))["report"] for g in (1e-4, 1.0))
    reused = base["cache"]["reused_ops"]
    assert reused > 0
    assert (slow["systems"]["b"]["latency_s"] - base["systems"]["b"]["latency_s"]
            == pytest.approx(reused * (1.0 - 1e-4), rel=1e-9))
    assert slow["systems"]["a"]["latency_s"] == base["systems"]["a"]["latency_s"]


def test_measured_copies_set_the_host_link(wan_table):
    t = copy.deepcopy(wan_table)
    fit = fit_copy(3072, 2e-5, 3072 + 5e8, 2e-5 + 1e-2)         # 50 GB/s, 20 us
    t["copies"] = {d: {"small_bytes": 3072, "small_s": 2e-5, "bytes": 3072 + 5e8,
                       "s": 2e-5 + 1e-2, **fit} for d in ("h2d", "d2h")}
    p = platform("h200", gpu_times=GpuTimes(t))
    assert (p.pcie.h2d_bw, p.pcie.d2h_bw) == (fit["bw"], fit["bw"])
    assert p.pcie.latency_s == fit["latency_s"]
    assert platform("h200", gpu_times=GpuTimes(t), h2d_bw=1e15).pcie.h2d_bw == 1e15


def test_a_table_of_another_shape_is_refused(wan_table, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"measured for wan2.1-1.3b 32x32, 5 frames.*"
                                         r"calibrate at that shape"):
        simulate("wan2.1-1.3b", resolution="32x32", frames=9, steps=4, layers=2,
                 gpu_table=GpuTimes(wan_table), shape_cache=None, systems="a")
    from coda.cli import main

    path = tmp_path / "table.json"
    path.write_text(json.dumps(wan_table))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    for table, message in ((path, "calibrate at that shape"), (bad, "not a CODA GPU table")):
        assert main(["sim", "--model", "latte-digits", "--steps", "4", "--gpu-table",
                     str(table), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("coda: error:") and message in err[0], err


# ------------------------------------------------------------------------------ the command
def test_cli_writes_a_table_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    from coda.cli import main

    out = tmp_path / "t.json"
    frames = int(get_spec("latte-digits").frame_rule.split(":")[1])
    assert main(["calibrate", "--model", "latte-digits", "--resolution", "32x32", "--frames",
                 str(frames), "--warmup", "0", "--repeat", "1", "--out", str(out)]) == 0
    table = GpuTimes.load(out).table
    assert table["model"] == "latte-digits" and table["command"].startswith("coda calibrate")
    # the command's options, nothing else (not the config's record of the options given)
    assert "--resolution 32x32" in table["command"] and "_coda" not in table["command"]
    # Latte's spatial and temporal blocks are one class in two block lists: one entry each
    lists = ARCHITECTURES["LatteTransformer3DModel"].block_lists
    assert {k: v["ops"] for k, v in table["blocks"].items()} == {
        attr: list(spec.ops) for attr, spec in lists}
    capsys.readouterr()
    cases = [(["--model", "sora"], "expected one of " + ", ".join(calibratable())),
             (["--model", "opensora-1.2"], "no diffusers class"),
             (["--model", "wan2.1-1.3b", "--seed", "-1"], "--seed -1: expected >= 0"),
             (["--model", "wan2.1-1.3b", "--device", "cuda"], "--device cuda: CUDA is not available")]
    for extra, message in cases:
        if "cuda" in extra and torch.cuda.is_available():
            continue
        assert main(["calibrate", *TINY_ARGS, *extra, "--out", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("coda: error:") and message in err[0], err
    assert not (tmp_path / "x.json").exists()


TINY_ARGS = ["--resolution", "32x32", "--frames", "5"]


def test_ctrl_c_ends_a_command_in_one_line_with_status_130(monkeypatch, capsys):
    """coda's exit status 130 (coda.cli): an interrupt is not a bug, so no traceback."""
    import coda.host.system.calibrate as calibrate_module
    from coda.cli import main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(calibrate_module, "main", interrupted)
    assert main(["calibrate", "--model", "latte-digits", *TINY_ARGS]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["coda: interrupted"]


# ------------------------------------------------------------------------------ presets
def test_h200_preset_has_a_source_for_every_figure_and_a_pcie5_link():
    h200 = GPUS["h200"]
    figures = {f.name for f in dataclasses.fields(GPU)} - {"name", "sources"}
    assert figures <= set(h200.sources)
    assert all("spec:" in h200.sources[k] for k in ("peak_flops", "mem_bw", "mem_bytes",
                                                     "power_busy_w"))
    assert platform("h200").pcie == PCIE5_X16
    assert platform("a100").pcie == PCIE4_X16
    # 32 GT/s against 16 GT/s, same lanes and encoding
    assert PCIE5_X16.theoretical_bw == pytest.approx(2 * PCIE4_X16.theoretical_bw, rel=1e-15)
    assert (PCIE5_X16.h2d_bw / PCIE5_X16.theoretical_bw
            == pytest.approx(PCIE4_X16.h2d_bw / PCIE4_X16.theoretical_bw, rel=1e-12))


def test_a_model_cut_to_fewer_layers():
    full, cut = model_shape("wan2.1-1.3b", "32x32", frames=5), _wan_shape(2)
    assert (full.num_layers, cut.num_layers) == (30, 2)
    assert [(o.op, o.tokens) for o in cut.ops] == [(o.op, o.tokens) for o in full.ops[:6]]
    with pytest.raises(ValueError, match="layers=0"):
        model_shape("wan2.1-1.3b", "32x32", frames=5, layers=0)


@settings(max_examples=50, deadline=None)
@given(latency=st.floats(0, 1e-3), bw=st.floats(1e9, 1e13),
       small=st.integers(2, 10**4), big=st.integers(10**6, 10**10))
def test_fit_copy_recovers_the_line_through_two_copies(latency, bw, small, big):
    fit = fit_copy(small, latency + small / bw, big, latency + big / bw)
    assert fit["bw"] == pytest.approx(bw, rel=1e-6)
    assert fit["latency_s"] == pytest.approx(latency, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("edit, where", [
    (lambda t: t["ops"].__setitem__("attn", 5), "ops.attn"),
    (lambda t: t.__setitem__("ops", []), "ops: got a list"),
    (lambda t: t["other_s"].__setitem__("1", float("nan")), "other_s.1"),
    (lambda t: t["other_s"].__setitem__("1", -1.0), "other_s.1"),
    (lambda t: t["cache_ops"].__setitem__("segment_s", {"2": "x"}), "cache_ops.segment_s.2"),
    (lambda t: t["blocks"][next(iter(t["blocks"]))]["rest_s"].__setitem__("1", -0.5),
     "rest_s.1"),
])
def test_a_table_with_a_bad_time_is_refused_naming_it(wan_table, tmp_path, edit, where):
    """Every time of a hand-edited table is checked (finite, > 0; the differences rest_s and
    other_s may be 0): the refusal names --gpu-table, the file and the entry."""
    table = copy.deepcopy(wan_table)
    edit(table)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=rf"--gpu-table {path}: .*{where}.*expected measured"):
        GpuTimes.load(path)


def test_an_unreadable_table_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "b.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="--gpu-table .*b.json: not a UTF-8"):
        GpuTimes.load(tmp_path / "b.json")
    with pytest.raises(ValueError, match="--gpu-table .*none.json: cannot read it"):
        GpuTimes.load(tmp_path / "none.json")
