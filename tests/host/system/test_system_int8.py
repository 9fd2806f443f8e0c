"""The system model's int8 cache entries (coda.host.system.formats, ``coda sim --cache-format
int8 --cache-group G``): footprint, stores and loads at 0.5 + 1/G of the bf16 bytes, segments
as the ``segment_int8`` program (command words, cycle model, 7 terms a launch), the capacity
check, a real int8 generation against its synthesis, and bad G refused naming G and C."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import torch

from coda.host.nmp.link import segment_bytes, tensor_bytes
from coda.host.system import modelled
from coda.host.system.formats import (cache_group, dense_entry_bytes, entry_bytes, entry_ratio,
                                      format_segment_bytes, terms_per_program)
from coda.host.system.nme import segment_timing
from coda.host.system.platforms import platform
from coda.host.system.presets import shipped_shape
from coda.host.system.replay import replay
from coda.host.system.schedules import transfer
from coda.host.system.sim import simulate
from coda.host.system.workload import from_events, synthesize

STEPS = 10
#: the shipped model's default G: the largest multiple of 8 lanes up to 64 dividing C = 96
G = 48
#: operator 0 reused at steps 2, 4 and 5 of 6 (computed at 0, 1, 3), as test_system.py's
KNOWN_REUSE = (2, 4, 5)


@pytest.fixture(scope="module")
def digits_shape():
    return shipped_shape()


def _known(shape, cache="reuse", group=None):
    from coda.host.cache.schedule import BRANCHES
    from coda.host.system.schedules import ModelSchedule

    ms = ModelSchedule(6, len(shape.ops), {(t, b): frozenset({0}) for t in KNOWN_REUSE
                                           for b in BRANCHES}, name="known")
    log = synthesize(shape, ms, n_ranks=2, lanes=8, depth=256, cache=cache, cache_group=group)
    return log, from_events(log, shape, cache=cache, cache_group=group)


def _stored(wl):
    return sum(a.store_bytes for calls in wl.calls for c in calls for acts in c.actions
               for a in acts)


def test_int8_entry_is_half_plus_one_over_g_of_the_bytes(digits_shape):
    """The shipped model's [512, 96] outputs on 2 ranks: 256 rows a rank, q 256·96/16 = 1,536
    words, scales 256·96/48 = 512 elements = 64 words, against bf16's 3,072 words: exactly
    0.5 + 1/48 of the bytes in the footprint and the stores (reuse and forecast), and held
    densely (b, c) T·C bytes of q and T·C/G 2-byte scales."""
    assert cache_group("int8", 96, 8) == G and cache_group("bf16", 96, 8) is None
    op = digits_shape.ops[0]
    t = tensor_bytes(op.tokens, op.channels, 2, 8)
    q = entry_bytes(op.tokens, op.channels, 2, 8, G)
    assert (t, q) == (2 * 3_072 * 16, 2 * (1_536 + 64) * 16)         # two ranks
    assert Fraction(q, t) == Fraction(1, 2) + Fraction(1, G)
    assert entry_ratio(G) == pytest.approx(0.5 + 1 / G, rel=1e-15) and entry_ratio(None) == 1
    assert dense_entry_bytes(512, 96, 2, G) == 512 * 96 + 512 * 2 * 2
    for cache in ("reuse", "forecast"):
        _, bf = _known(digits_shape, cache)
        _, i8 = _known(digits_shape, cache, G)
        assert (bf.cache_format, i8.cache_format, i8.cache_group) == ("bf16", "int8", G)
        assert Fraction(i8.cache_bytes, bf.cache_bytes) == Fraction(1, 2) + Fraction(1, G)
        assert i8.cache_bytes == bf.cache_bytes // t * q
        assert _stored(i8) == _stored(bf) // t * q > 0
        assert i8.forecast_terms == bf.forecast_terms


def test_int8_segments_are_the_segment_int8_program(digits_shape):
    """An int8 term is 4 micro-ops (command words) and 3 streams; a launch holds 7 terms, so an
    8-term segment is two launches (7 + 1); the gates and the 16-bit result are as bf16's.
    The cycles are the cycle model's of the compiled ``segment_int8`` program, and the DRAM
    words a launch moves per rank are x, y and per term the gate (W, re-read per token), q
    (W/2: two words' int8 values a word) and the scales' extent (W/G: one scale per G
    elements, ``lanes`` scales a word), against bf16's gate and entry (2W)."""
    assert terms_per_program(8, 256) == 8 and terms_per_program(8, 256, G) == 7
    op = digits_shape.ops[0]
    for k in (1, 2, 7, 8):
        bf = segment_bytes(op.tokens, op.channels, k, 2, 8)
        i8 = format_segment_bytes(op.tokens, op.channels, k, 2, 8, 256, G)
        launches = [k] if k <= 7 else [7, k - 7]
        assert i8["programs"] == len(launches)
        assert i8["cmd"] == sum(8 * (1 + 4 * kk + 2) * 2 for kk in launches)
        assert (i8["gates"], i8["y"], i8["up"]) == (bf["gates"], bf["y"], bf["up"])
    words = 256 * 96 // 8                                   # W per rank and stream
    for k in (1, 2):
        bf = segment_timing(op.tokens, op.channels, k, n_ranks=2, lanes=8, depth=256)
        i8 = segment_timing(op.tokens, op.channels, k, n_ranks=2, lanes=8, depth=256, group=G)
        assert bf.rank_dram_bytes == (2 + 2 * k) * words * 16
        assert i8.rank_dram_bytes == (2 + k * (1 + Fraction(1, 2) + Fraction(1, G))) * words * 16
        assert i8.muls == 2 * bf.muls and i8.adds == bf.adds
    one, two = (segment_timing(op.tokens, op.channels, k, n_ranks=2, lanes=8, depth=256,
                               group=G).cycles_ideal for k in (1, 2))
    b1, b2 = (segment_timing(op.tokens, op.channels, k, n_ranks=2, lanes=8, depth=256
                             ).cycles_ideal for k in (1, 2))
    assert two - one > 1.9 * (b2 - b1)        # 4 passes a term against 2
    assert segment_timing(op.tokens, op.channels, 8, n_ranks=2, lanes=8, depth=256,
                          group=G).programs == 2


def test_int8_link_bytes_of_the_systems(digits_shape):
    """On the known schedule, reuse and forecast: c's stores down and loads up are 0.5 + 1/G
    of bf16's; f sends the stores at that ratio plus the segments' command words (two more
    per rank per term); g's history loads are int8 entries."""
    plat = platform("rtx4090", "DDR5-4800", 1, 2, depth=256)
    op = digits_shape.ops[0]
    t = tensor_bytes(op.tokens, op.channels, 2, 8)
    q = entry_bytes(op.tokens, op.channels, 2, 8, G)
    dense = op.tokens * op.channels * 2
    for cache in ("reuse", "forecast"):
        wl = {g: _known(digits_shape, cache, g)[1] for g in (None, G)}
        r = {(g, s): replay(wl[g], plat, s, record=False) for g in wl for s in "cfg"}
        assert r[(G, "c")].d2h_bytes == r[(None, "c")].d2h_bytes // t * q
        assert Fraction(r[(G, "c")].h2d_bytes, r[(None, "c")].h2d_bytes) == Fraction(q, t)
        assert r[(G, "c")].h2d_bytes == r[(None, "c")].h2d_bytes // dense * \
            dense_entry_bytes(op.tokens, op.channels, 2, G)
        terms = sum(s.k for s in wl[G].segments.values())
        stores = _stored(wl[G]), _stored(wl[None])
        assert r[(G, "f")].d2h_bytes - stores[0] - (
            r[(None, "f")].d2h_bytes - stores[1]) == 2 * 8 * 2 * terms
        assert r[(G, "g")].history_bytes == wl[G].forecast_terms * dense_entry_bytes(
            op.tokens, op.channels, 2, G)


def test_int8_capacity_on_wan_14b_720p():
    """Wan 2.1-14B at 720p × 4 s, uniform rule: its bf16 reuse cache does not fit 4 DIMMs ×
    4 ranks (128 GiB) and its int8 cache (G = 64, exactly 0.5 + 1/64 of the bytes: 3,825
    rows a rank) does; the does-not-fit rows name the format; a is the same."""
    kw = dict(resolution="720p", seconds=4, steps=12, dimms=4, ranks=4, warmup=2,
              systems="acf", record=False)
    rep = {f: simulate("wan2.1-14b", cache_format=f, **kw)["report"] for f in ("bf16", "int8")}
    bf, i8 = rep["bf16"], rep["int8"]
    assert i8["cache"]["group"] == 64 and i8["replay"]["cache_format"] == "int8"
    assert Fraction(i8["cache_bytes"], bf["cache_bytes"]) == Fraction(1, 2) + Fraction(1, 64)
    assert i8["cache_bytes"] <= 4 * 4 * 2**33 < bf["cache_bytes"]
    assert not bf["systems"]["c"]["fits"] and "exceeds the host DIMMs" in bf["systems"]["c"][
        "reason"]
    assert i8["systems"]["c"]["fits"] and i8["systems"]["f"]["fits"]
    assert bf["systems"]["a"]["latency_s"] == i8["systems"]["a"]["latency_s"]
    over = simulate("wan2.1-14b", cache_format="int8", cache="forecast",
                    **{**kw, "dimms": 2})["report"]
    assert "int8 G=64" in over["systems"]["c"]["reason"]


def test_a_real_int8_generation_equals_its_synthesis(digits_shape):
    """An int8 generation of the shipped model (the cache engine on the torch backend, G = 48)
    and the same schedule synthesised with int8 entries: the same segments (bytes, launches,
    the ideal-memory cycles of segment_int8), the same stores, the same footprint; modelled()
    checks every segment's cycles exactly."""
    from coda.host.cache.events import EventLog
    from coda.host.cache.policies import UniformIntervalPolicy
    from coda.host.model.dit import load_model
    from coda.host.model.sample import cache_mem_words, cached_generate
    from coda.host.nme.backend import TorchBackend
    from coda.host.nmp.driver import NMPDriver
    from coda.hw.nme.isa import NMEConfig

    torch.set_num_threads(1)
    model, _ = load_model()
    sched = UniformIntervalPolicy(intervals={"cross_attn": 3}, default_interval=2,
                                  warmup=2).build(STEPS, 4)
    cfg = NMEConfig(lanes=8, mem_words=cache_mem_words(model, 1, 2, 8, cache_format="int8",
                                                       cache_group=G))
    log = EventLog()
    cached_generate(model, [5], NMPDriver(TorchBackend(), cfg, dimms=1, ranks=2), sched,
                    events=log, num_steps=STEPS, cache_format="int8", cache_group=G)
    synth_log = synthesize(digits_shape, transfer(sched, digits_shape, STEPS), n_ranks=2,
                           lanes=8, depth=cfg.depth, cache_group=G)
    key = lambda e: (e.step, e.branch, e.ops, e.terms, e.bytes_to_nmp,  # noqa: E731
                     e.bytes_from_nmp, e.programs, e.nme_cycles)
    assert sorted(map(key, synth_log.of("segment"))) == sorted(map(key, log.of("segment")))
    assert any(e.terms > 7 for e in log.of("segment"))        # a chained int8 segment
    stores = lambda l: sorted((e.step, e.branch, e.index, e.stored_bytes)  # noqa: E731
                              for e in l.of("op") if not e.reused)
    assert stores(synth_log) == stores(log)
    real = from_events(log, digits_shape, cache_group=G)
    assert real.cache_bytes == from_events(synth_log, digits_shape, cache_group=G).cache_bytes
    out = modelled(log, depth=cfg.depth, cache_format="int8")
    assert (out["cache_format"], out["cache_group"]) == ("int8", G)
    assert out["nme_check"]["max_rel_error"] == 0.0


def test_a_bad_group_is_refused_naming_g_and_c(tmp_path, capsys):
    from coda.cli import main
    from coda.host.system.cost import schedule_cost
    from coda.host.cache.schedule import Schedule
    from coda.host.cache.shipped import SHIPPED_SCHEDULE

    with pytest.raises(ValueError, match=r"--cache-group 40: .*G=40 .*C=96"):
        simulate("latte-digits", steps=4, systems="a", cache_format="int8", cache_group=40)
    with pytest.raises(ValueError, match="--cache-group 48: an int8 option"):
        simulate("latte-digits", steps=4, systems="a", cache_group=48)
    with pytest.raises(ValueError, match="--cache-format 'fp8': expected one of bf16, int8"):
        simulate("latte-digits", steps=4, systems="a", cache_format="fp8")
    shipped = Schedule.from_json(SHIPPED_SCHEDULE.read_text())
    with pytest.raises(ValueError, match=r"G=36 .*C=5120"):
        schedule_cost(shipped, cache_format="int8", cache_group=36)
    for argv, words in ((["--cache-format", "int8", "--cache-group", "20"], ("G=20", "C=96")),
                        (["--cache-group", "48"], ("--cache-group 48", "bf16"))):
        try:
            rc = main(["sim", "--model", "latte-digits", *argv, "--out", str(tmp_path / "o")])
        except SystemExit as exc:            # argparse exits by itself
            rc = exc.code
        assert rc == 2 and not (tmp_path / "o").exists()
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("coda: error:"), err
        assert all(w in err[0] for w in words), err


def test_cli_cache_format_int8_with_forecast(tmp_path):
    from coda.cli import main

    out = tmp_path / "sim"
    assert main(["sim", "--model", "latte-digits", "--steps", "12", "--warmup", "2",
                 "--dimms", "1", "--ranks", "2", "--cache", "forecast", "--cache-format",
                 "int8", "--cache-group", "24", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["cache"]["mode"] == "forecast" and rep["cache"]["format"] == "int8"
    assert rep["cache"]["group"] == 24 and rep["cache"]["entry_ratio"] == 0.5 + 1 / 24
    assert rep["replay"]["cache_format"] == "int8" and rep["cache"]["forecast_terms"] > 0
    assert all(row["fits"] for row in rep["systems"].values())
