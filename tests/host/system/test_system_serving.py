"""coda serve (coda.host.system.serving): Poisson arrivals on a cluster of workers under FCFS
and shortest-job-first, the percentiles and throughput against queueing theory's limits."""

from __future__ import annotations

import numpy as np
import pytest

from coda.host.system.serving import (RequestClass, ServeConfig, parse_mix, serve,
                                      serve_curve, service_time)


def test_parse_mix():
    assert parse_mix("480p:50:0.5, 720p:25:1.5") == [RequestClass("480p", 50, 0.5),
                                                     RequestClass("720p", 25, 1.5)]
    for bad, match in (("480p:50", "RESOLUTION:STEPS:WEIGHT"), ("480p:x:1", "RESOLUTION"),
                       ("480p:0:1", "steps >= 1"), ("480p:5:-1", "weight > 0"),
                       ("480p:5:1,480p:5:2", "given twice"), ("", "at least one"),
                       ("480p:5:1:2", "RESOLUTION")):
        with pytest.raises(ValueError, match=f"--mix .*{match}"):
            parse_mix(bad)


def test_light_load_has_no_queue():
    """At a rate whose gaps (1,000 h on average) dwarf the service, every request finds a
    worker free: latency = its service time exactly, per class."""
    cls = [RequestClass("a", 1, 1.0), RequestClass("b", 1, 1.0)]
    r = serve(cls, {"a@1": 10.0, "b@1": 30.0}, rate_per_h=0.001, requests=200, workers=1)
    assert r["per_class"]["a@1"]["p50_s"] == pytest.approx(10.0)
    assert r["per_class"]["b@1"]["p99_s"] == pytest.approx(30.0)
    assert r["wait_p99_s"] == pytest.approx(0.0, abs=1e-9)
    assert r["per_class"]["a@1"]["n"] + r["per_class"]["b@1"]["n"] == 200


def test_one_worker_md1_mean_latency():
    """One class of deterministic service on one worker is M/D/1: the
    mean wait is rho S / (2 (1 - rho)) (Pollaczek-Khinchine); 20,000 requests at rho = 0.5
    come within 5 %."""
    s, rho = 100.0, 0.5
    rate = rho / s * 3600
    r = serve([RequestClass("x", 1, 1.0)], {"x@1": s}, rate_per_h=rate, requests=20000,
              workers=1, seed=3)
    want_wait = rho * s / (2 * (1 - rho))
    assert r["mean_s"] - s == pytest.approx(want_wait, rel=0.05)
    assert r["offered_load"] == pytest.approx(rho)
    assert r["utilisation"] == pytest.approx(rho, rel=0.05)
    assert r["throughput_per_h"] == pytest.approx(rate, rel=0.05)


def test_overload_throughput_is_the_capacity():
    """Arrivals at 4x what 2 workers serve: the throughput is the capacity (2 / S per
    second), workers always busy, and the queue makes p99 grow with the requests."""
    s = 60.0
    r = serve([RequestClass("x", 1, 1.0)], {"x@1": s}, rate_per_h=4 * 2 * 3600 / s,
              requests=2000, workers=2)
    assert r["throughput_per_h"] == pytest.approx(2 * 3600 / s, rel=0.01)
    assert r["utilisation"] == pytest.approx(1.0, rel=0.01)
    assert r["p99_s"] > 100 * s


def test_sjf_serves_short_jobs_first():
    """Same arrivals (same seed), a long and a short class under load: shortest-job-first
    lowers the short class's p50 and the mean (SJF minimises the mean wait of a
    non-preemptive single server among work-conserving orders of the same jobs), FCFS's
    total work is the same so both have the same throughput."""
    cls = [RequestClass("short", 1, 0.5), RequestClass("long", 1, 0.5)]
    svc = {"short@1": 20.0, "long@1": 200.0}
    kw = dict(rate_per_h=0.9 * 3600 / 110.0, requests=3000, workers=1, seed=7)
    f, j = serve(cls, svc, policy="fcfs", **kw), serve(cls, svc, policy="sjf", **kw)
    assert j["per_class"]["short@1"]["p50_s"] < f["per_class"]["short@1"]["p50_s"]
    assert j["mean_s"] < f["mean_s"]
    assert j["makespan_s"] == pytest.approx(f["makespan_s"], rel=0.02)


@pytest.mark.parametrize("kw, match", [
    (dict(policy="lifo"), "--policy 'lifo'"), (dict(requests=0), "--requests 0"),
    (dict(workers=0), "workers 0"), (dict(rate_per_h=0.0), "--rates"),
])
def test_bad_input_names_the_value(kw, match):
    args = dict(rate_per_h=1.0, requests=10, workers=1, policy="fcfs")
    with pytest.raises(ValueError, match=match):
        serve([RequestClass("x", 1, 1.0)], {"x@1": 1.0}, **{**args, **kw})


def test_service_time_is_the_systems_generation():
    """A class's service time is coda sim's latency of that system for that generation."""
    from coda.host.system.sim import simulate

    cls = RequestClass("832x480", 4, 1.0)
    t = service_time("wan2.1-1.3b", cls, system="e", seconds=1, dimms=2, ranks=4,
                     shape_cache=None)
    rep = simulate("wan2.1-1.3b", resolution="832x480", seconds=1, steps=4, dimms=2,
                   ranks=4, systems="e", record=False, shape_cache=None)["report"]
    assert t == rep["systems"]["e"]["latency_s"]
    t2 = service_time("wan2.1-1.3b", cls, system="e", seconds=1, dimms=2, ranks=4,
                      gpus=2, parallel="cfg", shape_cache=None)
    assert t / 2 < t2 < t


def test_serve_curve_refuses_bad_flags_first():
    for kw, match in ((dict(gpus=4, per_request=3), "--per-request 3"),
                      (dict(rates="10,-1"), "--rates"), (dict(policy="fcfs,x"), "--policy")):
        with pytest.raises(ValueError, match=match):
            serve_curve(ServeConfig(**kw))
