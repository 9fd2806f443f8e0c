"""coda.host.system.cost.schedule_cost: a schedule's modelled latency and energy as coda sim
reports them, for sum and residual segments, and its refusals."""

from __future__ import annotations

import pytest

from coda.host.system.sim import simulate
from coda.host.system.workload import tensor_bytes


# ------------------------------------------------------------------------------ schedule_cost
def _shipped_schedules():
    from coda.host.cache.schedule import Schedule
    from coda.host.cache.shipped import SHIPPED_SCHEDULE

    shipped = Schedule.from_json(SHIPPED_SCHEDULE.read_text())
    return shipped, Schedule(shipped.num_steps, shipped.num_layers, {}, "nothing reused")


COST_ARGS = dict(target="wan2.1-1.3b@480p", seconds=2, steps=12, dimms=2, ranks=4,
                 shape_cache=None)


def test_schedule_cost_is_what_coda_sim_reports(tmp_path):
    """A schedule given to schedule_cost and written to a file for coda sim --schedule FILE
    gives the same figures for every system; reusing nothing, every system that fits takes
    system a's time (nothing is cached, no segment runs, no byte crosses the link for
    the cache)."""
    from coda.host.system.cost import schedule_cost

    kw = {k: v for k, v in COST_ARGS.items() if k != "target"}
    for sched in _shipped_schedules():
        path = tmp_path / f"{len(sched.reuse)}.json"
        path.write_text(sched.to_json())
        rep = simulate("wan2.1-1.3b", resolution="480p", seconds=2, steps=12, dimms=2,
                       ranks=4, schedule=str(path), shape_cache=None,
                       record=False)["report"]["systems"]
        for s, row in rep.items():
            got = schedule_cost(sched, COST_ARGS["target"], s, **kw)
            assert got["fits"] == row["fits"], s
            if not row["fits"]:
                assert got["latency_s"] == float("inf") and got["reason"] == row["reason"]
                continue
            assert (got["latency_s"], got["energy_j"], got["segments"],
                    got["host_link_bytes"]) == (row["latency_s"], row["energy_j"],
                                                row["segments"], row["pcie_bytes"]), s
            if not sched.reuse:
                assert got["segments"] == 0 and got["ops_skipped_fraction"] == 0.0
                assert got["latency_s"] == pytest.approx(rep["a"]["latency_s"], rel=1e-12)


def test_schedule_cost_of_sum_and_residual_segments():
    """sum and residual differ in host-link bytes by exactly segments x (one [T, C] tensor)
    less the two branches' slots of zeros (one sample each); more reuse means less GPU work; system a
    ignores the schedule."""
    from coda.host.system.cost import parse_target, schedule_cost, target_setup
    from coda.host.system.platforms import DEFAULT_PLATFORM

    shipped, nothing = _shipped_schedules()
    kw = {k: v for k, v in COST_ARGS.items() if k != "target"}
    shape, plat = target_setup(*parse_target(COST_ARGS["target"]), 2, DEFAULT_PLATFORM,
                               "DDR5-4800", 2, 4, 8, 256, None, None)
    x = tensor_bytes(shape.ops[0].tokens, shape.hidden, plat.n_ranks, plat.lanes)
    for s in "ef":
        r = {f: schedule_cost(shipped, COST_ARGS["target"], s, segment_output=f, **kw)
             for f in ("sum", "residual")}
        n = r["sum"]["segments"]
        assert n == r["residual"]["segments"] > 0
        assert r["residual"]["host_link_bytes"] - r["sum"]["host_link_bytes"] == (n - 2) * x
        none = schedule_cost(nothing, COST_ARGS["target"], s, **kw)
        assert none["gpu_busy_s"] > r["sum"]["gpu_busy_s"]
        assert none["host_link_bytes"] < r["sum"]["host_link_bytes"]
    a = [schedule_cost(sch, COST_ARGS["target"], "a", **kw)["latency_s"]
         for sch in (shipped, nothing)]
    assert a[0] == a[1]


def test_schedule_cost_refuses_bad_input():
    from coda.host.system.cost import parse_target, schedule_cost

    shipped, _ = _shipped_schedules()
    assert parse_target("wan2.1-14b@720p") == ("wan2.1-14b", "720p")
    assert parse_target("latte-digits") == parse_target("latte-digits@32x32") == (
        "latte-digits", None)
    with pytest.raises(ValueError, match=r"resolution '1080p' is not one of 480p, 720p"):
        parse_target("wan2.1-14b@1080p")
    with pytest.raises(ValueError, match=r"model 'wan3' is not one of .*wan2.1-14b"):
        parse_target("wan3@720p")
    with pytest.raises(ValueError, match=r"resolution '' is not one of"):
        parse_target("wan2.1-14b")
    with pytest.raises(ValueError, match=r"latte-digits runs at its preset's resolution "
                                         r"only: expected 'latte-digits' or 'latte-digits@32x32'"):
        parse_target("latte-digits@720p")
    with pytest.raises(ValueError, match="system 'h': expected one of a, b, c, d, e, f, g"):
        schedule_cost(shipped, system="h")
    with pytest.raises(ValueError, match="cache='taylor': expected one of reuse, forecast"):
        schedule_cost(shipped, cache="taylor")
    with pytest.raises(ValueError, match="segment_output='z'"):
        schedule_cost(shipped, segment_output="z")
    with pytest.raises(ValueError, match="steps 0: expected 1..1000"):
        schedule_cost(shipped, steps=0)
    with pytest.raises(TypeError, match="expected a coda.host.cache.schedule.Schedule, got dict"):
        schedule_cost({})
