"""coda.host.system.prices: the sourced prices, the cost of a video in coda sim (capital over
the generation + electricity) and of a served video, each against its formula."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.host.system.platforms import GPUS, platform
from coda.host.system.prices import (DRAM_USD_PER_GIB, GPU_PRICES, LIFETIME_YEARS,
                                     NME_AREA_MM2, NME_USD, NMP_SYSTEMS, SOURCES,
                                     USD_PER_KWH, WAFER_USD, YEAR_S, machine_capital, prices,
                                     serving_cost, video_cost)

TAGS = ("list:", "market:", "statistic:", "measured", "assumed:", "no price sourced")


def test_every_gpu_preset_has_a_sourced_price_entry():
    assert set(GPU_PRICES) == set(GPUS)
    for name, (usd, source) in GPU_PRICES.items():
        assert source.startswith(TAGS), name
        assert (usd is None) == source.startswith("no price sourced"), name
    for name in ("rtx4090", "l4", "a10", "h100", "h20"):
        assert GPU_PRICES[name][0] > 0
    for key, source in SOURCES.items():
        assert source.startswith(TAGS), key


def test_derived_constants():
    """The NME's price is its area at the wafer's price per mm^2 of a 300 mm wafer; the
    electricity is EIA's revenue over sales."""
    assert NME_USD == pytest.approx(NME_AREA_MM2 * WAFER_USD / (math.pi * 150.0 ** 2))
    assert USD_PER_KWH == pytest.approx(172_257e6 / 1_390_873e6)
    assert 0.05 < NME_USD < 0.1 and 0.1 < USD_PER_KWH < 0.15


def _capital(plat, pr, system, gpus):
    nme = plat.n_ranks * pr.nme_usd if system in "defg" else 0.0
    return gpus * (pr.gpu_usd + plat.host_bytes / 2**30 * pr.dram_usd_per_gib + nme)


@pytest.mark.parametrize("system", list("acf"))
@pytest.mark.parametrize("gpus", [1, 2])
def test_video_cost_formula(system, gpus):
    plat = platform("rtx4090", "DDR5-4800", 4, 8)
    pr = prices("rtx4090", utilisation=0.5)
    lat, joules = 2500.0, 1.2e6
    cap = machine_capital(plat, pr, system, gpus)
    assert cap["total_usd"] == pytest.approx(_capital(plat, pr, system, gpus))
    assert (cap["nme_usd"] > 0) == (system in NMP_SYSTEMS)
    c = video_cost(lat, joules, cap, pr)
    want_cap = _capital(plat, pr, system, gpus) * lat / (LIFETIME_YEARS * YEAR_S * 0.5)
    want_e = joules / 3.6e6 * USD_PER_KWH
    assert c["capital_usd"] == pytest.approx(want_cap)
    assert c["energy_usd"] == pytest.approx(want_e)
    assert c["usd"] == pytest.approx(want_cap + want_e)
    assert c["gpu_usd"] + c["dimm_usd"] + c["nme_usd"] == pytest.approx(c["capital_usd"])
    assert c["machine_usd"] == cap["total_usd"]


@settings(max_examples=50, deadline=None)
@given(l1=st.floats(0, 1e5), l2=st.floats(0, 1e5), e1=st.floats(0, 1e8),
       e2=st.floats(0, 1e8))
def test_video_cost_is_linear_in_time_and_energy(l1, l2, e1, e2):
    plat = platform("l4", "DDR5-4800", 2, 2)
    pr = prices("l4")
    cap = machine_capital(plat, pr, "f", 1)
    both = video_cost(l1 + l2, e1 + e2, cap, pr)["usd"]
    apart = video_cost(l1, e1, cap, pr)["usd"] + video_cost(l2, e2, cap, pr)["usd"]
    assert both == pytest.approx(apart, rel=1e-9, abs=1e-12)


def test_serving_cost_formula():
    plat = platform("rtx4090", "DDR5-4800", 4, 8)
    pr = prices("rtx4090", lifetime_years=3, usd_per_kwh=0.2)
    cap = machine_capital(plat, pr, "f", 8)
    c = serving_cost(cap, 3600.0, 5e6, 10, pr)
    want = (cap["total_usd"] * 3600.0 / (3 * YEAR_S) + 5e6 / 3.6e6 * 0.2) / 10
    assert c["usd"] == pytest.approx(want)


def test_given_prices_replace_the_constants():
    pr = prices("a100")
    assert pr.gpu_usd is None
    assert video_cost(10.0, 10.0, machine_capital(platform("a100"), pr, "a"), pr) == {
        "usd": None, "reason": "no price of the a100 GPU (give --price-gpu)"}
    pr = prices("a100", price_gpu=10_000, price_dram_gb=4.0, price_nme=0, usd_per_kwh=0.3)
    assert (pr.gpu_usd, pr.dram_usd_per_gib, pr.nme_usd, pr.usd_per_kwh) == (10_000, 4.0, 0, 0.3)
    assert pr.sources["gpu_usd"] == "given" and pr.sources["lifetime_years"] == SOURCES[
        "lifetime_years"]
    assert prices("rtx4090").dram_usd_per_gib == DRAM_USD_PER_GIB


@pytest.mark.parametrize("kw, match", [
    (dict(price_gpu=-1), "--price-gpu -1: expected a finite number > 0"),
    (dict(price_dram_gb=0), "--price-dram-gb 0"), (dict(price_nme=-0.1), "--price-nme -0.1"),
    (dict(usd_per_kwh=float("inf")), "--usd-per-kwh inf"),
    (dict(lifetime_years=0), "--lifetime-years 0"),
    (dict(utilisation=1.5), "--utilisation 1.5: expected a number > 0 and <= 1"),
])
def test_bad_prices_name_the_flag(kw, match):
    with pytest.raises(ValueError, match=match):
        prices("rtx4090", **kw)
    with pytest.raises(ValueError, match="--platform 'x'"):
        prices("x")


def test_sim_reports_the_cost_of_every_system():
    """coda sim's report: every fitting system's cost is the formula of its own latency and
    energy; f's machine is c's plus one NME per rank; on 2 GPUs (cfg) twice the machine,
    and the one-GPU figures priced as one GPU."""
    from coda.host.system.sim import checked_simulate

    kw = dict(model="wan2.1-1.3b", resolution="832x480", seconds=1, steps=4, dimms=2,
              ranks=4, system="a,c,f", shape_cache=None)
    rep = checked_simulate(**kw, utilisation=0.25)["report"]
    plat = platform("rtx4090", "DDR5-4800", 2, 4)
    pr = prices("rtx4090", utilisation=0.25)
    assert rep["prices"]["utilisation"] == 0.25 and rep["prices"]["gpu_usd"] == 1599.0
    for s, r in rep["systems"].items():
        want = (_capital(plat, pr, s, 1) * r["latency_s"] / (pr.lifetime_s * 0.25)
                + r["energy_j"] / 3.6e6 * pr.usd_per_kwh)
        assert r["cost"]["usd"] == pytest.approx(want, rel=1e-12)
    rep2 = checked_simulate(**kw, gpus=2, parallel="cfg")["report"]
    pr1 = prices("rtx4090")
    for s, r in rep2["systems"].items():
        assert r["cost"]["capital_usd"] == pytest.approx(
            _capital(plat, pr1, s, 2) * r["latency_s"] / pr1.lifetime_s)
        one = rep2["one_gpu"][s]
        assert one["cost"]["capital_usd"] == pytest.approx(
            _capital(plat, pr1, s, 1) * one["latency_s"] / pr1.lifetime_s)
    with pytest.raises(ValueError, match="--price-gpu 0"):
        checked_simulate(**kw, price_gpu=0)


def test_sim_sweep_point_records_the_cost(tmp_path):
    from coda.host.system.sim import sweep_point

    (tmp_path / "pts" / "p").mkdir(parents=True)
    fig = sweep_point(dict(model="latte-digits", system="a,f", price_gpu=1000.0),
                      tmp_path / "pts" / "p")
    assert fig["a.cost_usd"] > 0 and fig["f.cost_usd"] > 0
