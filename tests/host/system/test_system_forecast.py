"""The system model in forecast mode (coda.host.system with cache="forecast"): a reused
operator's two entries, its extra segment terms and stores, the footprint that decides what
fits, system g (the forecast's history over PCIe), a real forecast generation against its
synthesis, and coda sim --cache."""

from __future__ import annotations

import json

import pytest
import torch

from coda.host.system import modelled
from coda.host.system.nme import segment_timing
from coda.host.system.platforms import platform
from coda.host.system.presets import model_shape, shipped_shape
from coda.host.system.replay import SYSTEMS, replay
from coda.host.system.schedules import transfer, uniform
from coda.host.system.sim import simulate
from coda.host.system.workload import from_events, segment_bytes, synthesize, tensor_bytes


STEPS = 10      # the steps of the real forecast generation


@pytest.fixture(scope="module")
def digits_shape():
    return shipped_shape()


# ------------------------------------------------------------------------------ forecast mode
#: a known small schedule: operator 0 reused at steps 2, 4 and 5 of 6 (computed at 0, 1, 3)
KNOWN_REUSE = (2, 4, 5)


def _known(shape, cache, n_ranks=2):
    from coda.host.cache.schedule import BRANCHES
    from coda.host.system.schedules import ModelSchedule

    ms = ModelSchedule(6, len(shape.ops), {(t, b): frozenset({0}) for t in KNOWN_REUSE
                                           for b in BRANCHES}, name="known")
    log = synthesize(shape, ms, n_ranks=n_ranks, lanes=8, depth=256, cache=cache)
    return ms, log, from_events(log, shape, cache=cache)


def test_forecast_terms_bytes_and_footprint_of_a_known_schedule(digits_shape):
    """Operator 0 computed at steps 0, 1, 3 and reused at 2, 4, 5: every reuse has two
    earlier computed steps, so each is a forecast term ((1, 0), (3, 1), (3, 1)): three per
    branch, each a 1-operator segment of 2 terms (two gate vectors, 2·2+2 micro-ops per rank
    down; one z up). Stores: reuse writes the outputs of steps 1 and 3 (the next step reuses
    them); history 2 also step 0's (step 2 reuses it). The footprint doubles: two entries of
    operator 0 per branch."""
    op = digits_shape.ops[0]
    t = tensor_bytes(op.tokens, op.channels, 2, 8)
    ms, _, reuse = _known(digits_shape, "reuse")
    assert ms.computed_pairs("cond", 0) == {2: (1, 0), 4: (3, 1), 5: (3, 1)}
    assert [s for s in range(6) if ms.store_after_compute(s, "cond", 0)] == [1, 3, 4]
    assert [s for s in range(6) if ms.store_after_compute(s, "cond", 0, 2)] == [0, 1, 2, 3, 4]
    _, log, fc = _known(digits_shape, "forecast")
    assert (reuse.history, fc.history) == (1, 2)
    assert reuse.forecast_terms == 0 and fc.forecast_terms == 3 * 2
    assert reuse.cache_bytes == 2 * t and fc.cache_bytes == 2 * 2 * t
    stored = lambda wl: sum(a.store_bytes for calls in wl.calls for c in calls  # noqa: E731
                            for acts in c.actions for a in acts)
    assert stored(reuse) == 2 * 2 * t and stored(fc) == 2 * 3 * t
    for wl, k in ((reuse, 1), (fc, 2)):
        segs = sorted(wl.segments.values(), key=lambda seg: seg.id)
        assert len(segs) == 3 * 2 and all(seg.k == k and seg.ops == [0] for seg in segs)
        sb = segment_bytes(op.tokens, op.channels, k, 2, 8)
        assert sb["gates"] == k * op.channels * 2 * 2 and sb["cmd"] == 8 * (2 * k + 3) * 2
        for seg in segs:
            first = seg.id == min(x.id for x in segs if x.row == seg.row)
            assert seg.bytes_down == sb["down"] + (t if first else 0)
            assert seg.bytes_up == sb["up"] == t
            assert seg.nme_cycles == segment_timing(op.tokens, op.channels, k, n_ranks=2,
                                                    lanes=8, depth=256).cycles_ideal
    assert all(e.terms == 2 for e in log.of("segment"))


def test_forecast_history_over_pcie_costs_its_tensors_on_the_link(digits_shape):
    """On the known schedule: system g's history bytes are the forecast terms x one [T, C]
    tensor in the model's dtype, all of them H2D on top of f's; f sends the second gate
    vector and two more command words per rank per forecast term down, g does not; c loads
    both entries of each forecast term; the NMEs stream one more tensor per forecast term in
    f (not in g); with plain reuse g is f."""
    plat = platform("rtx4090", "DDR5-4800", 1, 2)
    op = digits_shape.ops[0]
    tensor = op.tokens * op.channels * digits_shape.dtype_bytes
    wl = {m: _known(digits_shape, m)[2] for m in ("reuse", "forecast")}
    r = {(m, s): replay(wl[m], plat, s, record=False) for m in wl for s in "cfg"}
    terms = wl["forecast"].forecast_terms
    g, f = r[("forecast", "g")], r[("forecast", "f")]
    assert g.history_bytes == terms * tensor > 0
    assert g.h2d_bytes - f.h2d_bytes == g.history_bytes
    one = segment_bytes(op.tokens, op.channels, 1, 2, 8)["down"]
    two = segment_bytes(op.tokens, op.channels, 2, 2, 8)["down"]
    assert f.d2h_bytes - g.d2h_bytes == terms * (two - one)
    assert r[("forecast", "c")].h2d_bytes - r[("reuse", "c")].h2d_bytes == terms * tensor
    assert f.nme_busy_s > g.nme_busy_s == pytest.approx(r[("reuse", "f")].nme_busy_s)
    assert f.nme_rank_bytes > g.nme_rank_bytes
    rf, rg = r[("reuse", "f")], r[("reuse", "g")]
    assert (rg.latency_s, rg.h2d_bytes, rg.d2h_bytes, rg.history_bytes) == (
        rf.latency_s, rf.h2d_bytes, rf.d2h_bytes, 0)


def test_forecast_footprint_decides_what_fits():
    """Wan 2.1-14B at 720p with the uniform rule: every stored operator is stored more than
    once, so the forecast's footprint is twice reuse's, and the host DIMMs that hold the
    reuse cache (4 x 8 ranks, 256 GiB) do not hold it: c..g become "does not fit" rows."""
    kw = dict(resolution="720p", seconds=4, steps=12, dimms=4, ranks=8, warmup=2,
              systems="acefg", record=False)
    rep = {m: simulate("wan2.1-14b", cache=m, **kw)["report"] for m in ("reuse", "forecast")}
    assert rep["forecast"]["cache_bytes"] == 2 * rep["reuse"]["cache_bytes"]
    assert rep["reuse"]["cache_bytes"] <= 4 * 8 * 2**33 < rep["forecast"]["cache_bytes"]
    assert rep["forecast"]["cache"]["mode"] == "forecast" and rep["forecast"]["cache"][
        "forecast_terms"] > 0
    for s in "cefg":
        assert rep["reuse"]["systems"][s]["fits"] and rep["reuse"]["systems"][s]["cache"] == \
            "reuse"
        row = rep["forecast"]["systems"][s]
        assert row["fits"] is False and row["cache"] == "forecast"
        assert "forecast, up to 2 entries per operator" in row["reason"]
    assert rep["forecast"]["systems"]["a"]["latency_s"] == rep["reuse"]["systems"]["a"][
        "latency_s"]


def test_a_real_forecast_generation_equals_its_synthesis(digits_shape):
    """A forecast generation of the shipped model (the cache engine, alpha 0.5 at every
    reused step) and the same schedule synthesised in forecast mode: the same segments with
    the same terms, bytes and cycles, the same stores (history 2), the same footprint; the
    modelled systems include g and every segment's cycles are the model's."""
    from coda.host.cache.events import EventLog
    from coda.host.cache.forecast import ForecastTable
    from coda.host.cache.policies import UniformIntervalPolicy
    from coda.host.cache.schedule import OP_TYPES
    from coda.host.model.dit import load_model
    from coda.host.model.sample import cache_mem_words, cached_generate
    from coda.host.nme.backend import TorchBackend
    from coda.host.nmp.driver import NMPDriver
    from coda.hw.nme.isa import NMEConfig

    torch.set_num_threads(1)
    model, _ = load_model()
    sched = UniformIntervalPolicy(intervals={"cross_attn": 3}, default_interval=2,
                                  warmup=2).build(STEPS, 4)
    steps = {s for (s, _), refs in sched.reuse.items() if refs}
    table = ForecastTable({s: dict.fromkeys(OP_TYPES, 0.5) for s in steps}, STEPS, "test",
                          sched.digest())
    cfg = NMEConfig(lanes=8, mem_words=cache_mem_words(model, 1, 2, 8, history=2))
    log = EventLog()
    cached_generate(model, [5], NMPDriver(TorchBackend(), cfg, dimms=1, ranks=2), sched,
                    events=log, num_steps=STEPS, cache="forecast", forecast=table)
    real = from_events(log, digits_shape, cache="forecast")
    ms = transfer(sched, digits_shape, STEPS)
    synth_log = synthesize(digits_shape, ms, n_ranks=2, lanes=8, depth=cfg.depth,
                           cache="forecast")
    synth = from_events(synth_log, digits_shape, cache="forecast")
    key = lambda e: (e.step, e.branch, e.ops, e.terms, e.bytes_to_nmp,  # noqa: E731
                     e.bytes_from_nmp, e.programs, e.nme_cycles)
    assert sorted(map(key, synth_log.of("segment"))) == sorted(map(key, log.of("segment")))
    assert any(e.terms > len(e.ops) for e in log.of("segment"))
    stores = lambda l: sorted((e.step, e.branch, e.index, e.stored_bytes)  # noqa: E731
                              for e in l.of("op") if not e.reused)
    assert stores(synth_log) == stores(log)
    assert real.cache_bytes == synth.cache_bytes and real.forecast_terms == synth.forecast_terms
    with pytest.raises(ValueError, match="read with cache='reuse'; expected cache='forecast'"):
        from_events(log, digits_shape)
    out = modelled(log, depth=cfg.depth, cache="forecast")
    assert set(out["systems"]) == set(SYSTEMS) and out["cache"] == "forecast"
    assert out["nme_check"]["max_rel_error"] == 0.0
    assert out["systems"]["g"]["history_bytes"] > 0


def test_a_bad_cache_mode_is_refused(tmp_path, capsys):
    from coda.cli import main

    with pytest.raises(ValueError, match="--cache 'taylor': expected one of reuse, forecast"):
        simulate("latte-digits", steps=4, systems="a", cache="taylor")
    with pytest.raises(ValueError, match="cache='taylor'"):
        synthesize(model_shape("latte-digits"), uniform(model_shape("latte-digits"), 4),
                   n_ranks=2, cache="taylor")
    try:
        rc = main(["sim", "--model", "latte-digits", "--cache", "taylor", "--out",
                   str(tmp_path / "o")])
    except SystemExit as exc:            # argparse exits by itself
        rc = exc.code
    assert rc == 2 and not (tmp_path / "o").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("coda: error:"), err
    assert "--cache" in err[0] and "'taylor'" in err[0]
    assert "reuse" in err[0] and "forecast" in err[0]


def test_cli_cache_forecast(tmp_path):
    from coda.cli import main

    out = tmp_path / "sim"
    assert main(["sim", "--model", "latte-digits", "--steps", "12", "--warmup", "2",
                 "--dimms", "1", "--ranks", "2", "--cache", "forecast", "--out",
                 str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["cache"]["mode"] == "forecast" and rep["replay"]["cache"] == "forecast"
    assert set(rep["systems"]) == set(SYSTEMS)
    assert all(row["cache"] == "forecast" for row in rep["systems"].values())
