"""coda serve's batch policy (coda.host.system.serving) and the batched generation it serves
(coda.host.system.batching): a batch of one is FCFS exactly, a batch of b is one generation
of b samples (weights streamed once, cache and segments b times), never more than b single
generations, and under overload batching serves more per hour."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.host.system.serving import RequestClass, ServeConfig, serve, serve_curve

CLS = [RequestClass("short", 1, 0.5), RequestClass("long", 1, 0.5)]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), rate=st.floats(1.0, 200.0), workers=st.integers(1, 4),
       short=st.floats(1.0, 100.0), extra=st.floats(0.0, 500.0))
def test_batch_of_one_is_fcfs_exactly(seed, rate, workers, short, extra):
    svc = {"short@1": short, "long@1": short + extra}
    kw = dict(rate_per_h=rate, requests=200, workers=workers, seed=seed)
    f = serve(CLS, svc, policy="fcfs", **kw)
    b = serve(CLS, svc, policy="batch", max_batch=1, **kw)
    assert {**b, "policy": "fcfs"} == f
    assert b["generations"] == 200 and b["mean_batch"] == 1.0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), rate=st.floats(10.0, 500.0), workers=st.integers(1, 3),
       bmax=st.integers(1, 5), base=st.floats(5.0, 50.0),
       steps=st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5))
def test_batches_account_for_every_request(seed, rate, workers, bmax, base, steps):
    """Any batch table with t_1 <= t_2 <= ...: every request waits >= 0 and takes at least
    its class's single time, the batches account for every request, the busy time is the
    sum of the generations' times, and the energy the sum of theirs."""
    times = {c.name: tuple(k * base * (1 + sum(steps[:b])) for b in range(bmax))
             for k, c in zip((1, 3), CLS)}
    energy = {n: tuple(2.0 * t for t in v) for n, v in times.items()}
    svc = {n: v[0] for n, v in times.items()}
    r = serve(CLS, svc, rate_per_h=rate, requests=150, workers=workers, seed=seed,
              policy="batch", max_batch=bmax, batch_service=times, energy=energy)
    assert r["wait_p50_s"] >= 0 and r["p50_s"] >= min(svc.values())
    assert r["per_class"]["long@1"]["p50_s"] is None or (
        r["per_class"]["long@1"]["p50_s"] >= svc["long@1"])
    assert 1.0 <= r["mean_batch"] <= bmax
    assert r["generations"] * r["mean_batch"] == pytest.approx(150)
    assert r["energy_j"] == pytest.approx(2.0 * r["busy_s"])
    assert r["utilisation"] <= 1.0 + 1e-9


def test_overload_capacity_is_full_batches():
    """Arrivals far beyond what the workers serve: every batch is full, so the throughput is
    workers x B / t_B per second, more than FCFS's workers / t_1 when t_B < B t_1."""
    times = {"x@1": (100.0, 150.0, 190.0)}
    cls = [RequestClass("x", 1, 1.0)]
    kw = dict(rate_per_h=10 * 3 * 3600 / 100.0, requests=3000, workers=3, seed=1)
    b = serve(cls, {"x@1": 100.0}, policy="batch", max_batch=3, batch_service=times, **kw)
    f = serve(cls, {"x@1": 100.0}, policy="fcfs", **kw)
    assert b["throughput_per_h"] == pytest.approx(3 * 3 * 3600 / 190.0, rel=0.01)
    assert f["throughput_per_h"] == pytest.approx(3 * 3600 / 100.0, rel=0.01)
    assert b["mean_batch"] == pytest.approx(3.0, rel=0.01)


@pytest.mark.parametrize("kw, match", [
    (dict(max_batch=0), "--max-batch 0"), (dict(max_batch=65), "--max-batch 65"),
    (dict(max_batch=3, batch_service={"x@1": (1.0, 2.0)}), "class x@1 has 2 batch sizes"),
])
def test_bad_batch_input_names_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        serve([RequestClass("x", 1, 1.0)], {"x@1": 1.0}, rate_per_h=1.0, requests=10,
              workers=1, policy="batch", **kw)


def _replays(model, cls, system, batches, **kw):
    """(Workload, SystemResult) of ``cls`` batched b for each b, one GPU."""
    from coda.host.system.ablation import memory_plan
    from coda.host.system.replay import replay
    from coda.host.system.schedules import resolve
    from coda.host.system.sim import SimConfig, setup, workload

    shape, plat = setup(model, resolution=cls.resolution, shape_cache=None, **kw)
    sched = resolve("uniform", shape, cls.steps, interval=SimConfig.interval,
                    warmup=SimConfig.warmup, intervals=None)
    out = {}
    for b in batches:
        wl = workload(shape, plat, sched, samples=b)
        mem = memory_plan(wl, plat)
        out[b] = (wl, replay(wl, plat, system, record=False, weights=mem["weights"]), mem)
    return shape, plat, out


def test_streamed_weights_are_loaded_once_per_batch():
    """Wan 2.1-14B on a 24 GB RTX 4090 streams its weights: a batch of b loads them once per
    call (the PCIe bytes of a are n_calls x the weights, whatever b), every kernel's time is
    the roofline of b rows, and the batch takes less than b single generations."""
    from coda.host.system.replay import gpu_time

    cls = RequestClass("832x480", 2, 1.0)
    shape, plat, out = _replays("wan2.1-14b", cls, "a", (1, 2, 3), seconds=1, dimms=2,
                                ranks=4)
    calls = sum(len(c) for c in out[1][0].calls)
    weights = sum(float(o.kernels.weight_bytes.sum()) for o in shape.ops)
    t1 = out[1][1].latency_s
    for b, (wl, res, mem) in out.items():
        assert mem["weights"] == "streamed"
        assert res.h2d_bytes == pytest.approx(calls * weights, rel=1e-12)
        busy = calls * (gpu_time(shape.other, b, plat.gpu)
                        + sum(gpu_time(o.kernels, b, plat.gpu) for o in shape.ops))
        assert res.gpu_busy_s == pytest.approx(busy, rel=1e-9)
        assert t1 <= res.latency_s
        if b > 1:
            assert res.latency_s < b * t1


def test_batched_cache_and_segments_scale_with_the_batch():
    """System f, resident weights (Wan 2.1-1.3B): each of b rows has its own cache entries
    and segments (b times one request's), and the generation never takes more than b
    single ones."""
    from coda.host.system.batching import batch_generation

    cls = RequestClass("832x480", 8, 1.0)
    _, _, out = _replays("wan2.1-1.3b", cls, "f", (1, 2, 4), seconds=1, dimms=2, ranks=4)
    wl1, r1, _ = out[1]
    assert r1.segments > 0
    # coda serve's batch time is this replay
    assert batch_generation("wan2.1-1.3b", cls, 2, system="f", seconds=1, dimms=2, ranks=4,
                            shape_cache=None)["latency_s"] == out[2][1].latency_s
    for b, (wl, res, mem) in out.items():
        assert mem["weights"] == "resident" and wl.samples == b
        assert wl.cache_bytes == b * wl1.cache_bytes
        assert res.segments == b * r1.segments
        assert res.nme_rank_bytes == b * r1.nme_rank_bytes
        assert r1.latency_s <= res.latency_s <= b * r1.latency_s


def test_cfg_parallel_exchanges_every_samples_latent():
    """Two GPUs, a CFG branch each: a batch of b exchanges b latents after every step."""
    from coda.host.system.parallel import gpu_link, layout, replay_parallel

    cls = RequestClass("832x480", 4, 1.0)
    shape, plat, out = _replays("wan2.1-1.3b", cls, "a", (1, 3), seconds=1, dimms=2, ranks=4)
    lay = layout(2, "cfg", shape)
    p2p = {b: replay_parallel(wl, plat, "a", lay, gpu_link("pcie4-p2p"), record=False,
                              weights=mem["weights"])[0].p2p_bytes
           for b, (wl, _, mem) in out.items()}
    assert p2p[1] > 0 and p2p[3] == 3 * p2p[1]


def test_batch_that_does_not_fit_is_refused():
    from coda.host.system.batching import batch_generation

    cls = RequestClass("832x480", 2, 1.0)
    with pytest.raises(ValueError, match="a batch of 64 832x480@2 requests .*does not fit"):
        batch_generation("wan2.1-14b", cls, 64, system="c", seconds=1, dimms=1, ranks=1)
    with pytest.raises(ValueError, match="--max-batch: a batch of 0"):
        batch_generation("wan2.1-14b", cls, 0)


def test_serve_curve_batches_and_prices_each_run():
    """The batch policy reads batch times that are the batched generations' (a batch of one:
    the class's service time); at overload it serves more per hour than FCFS; each run's cost
    per video is the cluster's capital over the span plus its energy, per request."""
    from coda.host.system.energy import dimm_dram_energy
    from coda.host.system.platforms import platform
    from coda.host.system.prices import machine_capital, prices

    cfg = ServeConfig(model="latte-digits", mix="64x64:20:1", gpus=2, rates="100000",
                      policy="fcfs,batch", max_batch=3, requests=300)
    res = serve_curve(cfg, shape_cache=None)
    c = res["classes"][0]
    assert c["batch_service_s"][0] == c["service_s"] and len(c["batch_service_s"]) == 3
    assert all(a <= b for a, b in zip(c["batch_service_s"], c["batch_service_s"][1:]))
    f, b = res["runs"]
    assert b["throughput_per_h"] > f["throughput_per_h"] and b["mean_batch"] > 1
    pr = prices("rtx4090")
    cap = machine_capital(platform("rtx4090", "DDR5-4800", 4, 8), pr, "f", 2)
    plat = platform("rtx4090", "DDR5-4800", 4, 8)
    idle = 2 * f["makespan_s"] - f["busy_s"]       # GPU-seconds without a generation
    dimms = dimm_dram_energy(plat.dram, read_bytes=0, write_bytes=0, ranks=plat.n_ranks,
                             seconds=idle, busy_s=0.0)["total_j"]
    assert f["energy_j"] == pytest.approx(f["requests"] * c["energy_j"]
                                          + idle * plat.gpu.power_stall_w + dimms)
    for r in res["runs"]:
        want = (cap["total_usd"] * r["makespan_s"] / pr.lifetime_s
                + r["energy_j"] / 3.6e6 * pr.usd_per_kwh) / r["requests"]
        assert r["cost_per_video_usd"] == pytest.approx(want, rel=1e-12)
    assert b["cost_per_video_usd"] < f["cost_per_video_usd"]
