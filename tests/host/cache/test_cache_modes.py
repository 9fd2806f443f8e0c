"""The cache's two other modes on a small random Latte with the real NMPDriver: forecast
(a reused operator contributes (1 + alpha) c_k - alpha c_k' from its last two computed
outputs, coda.host.cache.forecast) and int8 entries (coda.host.cache.compress), each against
the torch reference driver, their bytes and their refusals."""

from __future__ import annotations

import pytest
import torch

from coda.host.cache.engine import (CodaCacheConfig, apply_coda_cache, get_coda_cache_hook,
                                    remove_coda_cache)
from coda.host.cache.policies import UniformIntervalPolicy
from coda.host.cache.schedule import OP_TYPES, Schedule, operator_order
from coda.host.model.sample import generate
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.hw.nme.isa import NMEConfig
from reference_driver import TorchSegmentDriver
from test_cache_engine import POLICY, STEPS, cached, nmp_driver, tiny_model


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------- forecast mode
def _forecast_table(sched: Schedule, alpha: float = 0.5):
    """alpha at every reused step for every operator type (a made-up table, not a fit)."""
    from coda.host.cache.forecast import ForecastTable
    steps = {s for (s, _), refs in sched.reuse.items() if refs}
    return ForecastTable({s: dict.fromkeys(OP_TYPES, alpha) for s in steps}, sched.num_steps,
                         "tiny", sched.digest())


class HistorySpy(TorchSegmentDriver):
    """The torch reference driver, checking each forecast segment's inputs: the newer entry
    of an operator must be its output of the last step that computed it, the older one that
    of the computed step before (what ForecastTable's alphas were fitted for)."""

    def __init__(self, transformer, sched):
        super().__init__()
        self.transformer, self.sched = transformer, sched
        self.stored = {}                       # (branch, sample, layer, op) -> [(step, tensor)]
        self.checked = 0

    def _step(self, branch):
        """The step running in ``branch`` (a call sets its branches' step as it begins)."""
        return get_coda_cache_hook(self.transformer).state.branches[branch].last_step

    def store(self, key, tensor, group=None, x_of=None):
        if key[3] != -1 and key[-1] != "in":
            self.stored.setdefault(key[1:5], []).append((self._step(key[1]), tensor.clone()))
        super().store(key, tensor, group)

    def segment(self, x, gates, keys):
        for key in keys:
            if key[-1] == "prev":
                continue
            history = self.stored[key[1:5]]
            pair = self.sched.computed_pairs(key[1], (key[3], key[4])).get(
                self._step(key[1]))
            done = {s: t for s, t in history}
            assert torch.equal(self.slots[key], done[pair[0]] if pair else history[-1][1])
            prev = key + ("prev",)
            if pair and prev in keys:
                assert torch.equal(self.slots[prev], done[pair[1]])
                self.checked += 1
        return super().segment(x, gates, keys)


def test_forecast_segments_equal_the_torch_reference_and_read_the_last_two_outputs():
    """Forecast mode on the NMP driver (torch NME backend) gives the bits of the torch
    reference driver; every forecast term reads the operator's outputs of the schedule's
    last two computed steps; it differs from plain reuse; and it stores more (the older
    entry too) than reuse does."""
    model = tiny_model()
    sched = POLICY.build(STEPS, 2)
    table = _forecast_table(sched)
    runs, spy = {}, HistorySpy(model.transformer, sched)
    for name, driver in (("nmp", nmp_driver()), ("ref", spy)):
        remove_coda_cache(model.transformer)
        hook = apply_coda_cache(model.transformer, CodaCacheConfig(
            driver, sched, cache="forecast", forecast=table, interleave_cfg=False))
        runs[name] = (generate(model, [3, 7], num_steps=STEPS), dict(hook.stats), hook.events)
    assert torch.equal(runs["nmp"][0], runs["ref"][0])
    assert spy.checked > 0
    reuse = cached(model, nmp_driver(), sched)
    plain = generate(model, [3, 7], num_steps=STEPS)
    assert not torch.equal(plain, runs["nmp"][0])
    assert runs["nmp"][1]["ops_reused"] == reuse.stats["ops_reused"]
    assert runs["nmp"][1]["segment_ops"] == reuse.stats["segment_ops"]
    # the older entries: a computed output stored where only the step after next reuses it
    extra = sum(r not in sched.reused(s, b) and sched.store_after_compute(s, b, r, 2)
                and not sched.store_after_compute(s, b, r)
                for s in range(STEPS) for b in ("cond", "uncond") for r in operator_order(2))
    t, c = 4 * (16 // model.config["transformer"]["patch_size"]) ** 2, 32
    assert extra > 0
    stored = lambda log: sum(e.stored_bytes for e in log.of("op"))  # noqa: E731
    assert stored(runs["nmp"][2]) - stored(reuse.events) == 2 * extra * t * c * 2  # 2 samples


def test_forecast_with_alpha_zero_is_plain_reuse():
    model = tiny_model()
    sched = POLICY.build(STEPS, 2)
    hook = cached(model, nmp_driver(), sched)
    want = generate(model, [3, 7], num_steps=STEPS)
    assert hook.stats["segments"] > 0
    remove_coda_cache(model.transformer)
    apply_coda_cache(model.transformer, CodaCacheConfig(
        nmp_driver(), sched, cache="forecast", forecast=_forecast_table(sched, 0.0)))
    assert torch.equal(generate(model, [3, 7], num_steps=STEPS), want)


@pytest.mark.parametrize("bad, message", [
    (dict(cache="taylor"), "cache='taylor': expected one of reuse, forecast"),
    (dict(cache="forecast"), "cache='forecast' needs a ForecastTable"),
    (dict(cache="forecast", forecast="alphas.json"), "got str"),
])
def test_a_bad_cache_mode_is_refused_when_applied(bad, message):
    with pytest.raises(ValueError, match=message):
        apply_coda_cache(tiny_model().transformer, CodaCacheConfig(nmp_driver(), POLICY, **bad))


def test_forecast_needs_a_static_policy_and_its_own_schedule_and_step_count():
    from coda.host.cache.policies.fbcache import FBCachePolicy
    model = tiny_model()
    sched = POLICY.build(STEPS, 2)
    with pytest.raises(ValueError, match="policy 'fbcache': expected a static policy"):
        apply_coda_cache(model.transformer, CodaCacheConfig(
            nmp_driver(), FBCachePolicy(threshold=0.1), cache="forecast",
            forecast=_forecast_table(sched)))
    other = UniformIntervalPolicy(default_interval=3, warmup=1).build(STEPS, 2)
    for table, message in ((_forecast_table(other), "calibrated for schedule"),
                           (_forecast_table(POLICY.build(STEPS + 2, 2)),
                            f"calibrated for {STEPS + 2} steps, expected {STEPS}")):
        remove_coda_cache(model.transformer)
        apply_coda_cache(model.transformer, CodaCacheConfig(
            nmp_driver(), sched, cache="forecast", forecast=table))
        with pytest.raises(ValueError, match=message):
            generate(model, [3], num_steps=STEPS)


# ---------------------------------------------------------------- int8 cache entries
def test_int8_entries_on_the_nmp_equal_the_torch_reference_and_halve_the_stored_bytes():
    """cache_format="int8": outputs quantised on the host (quant_int8, G = 32 = C here),
    dequantised by the NMEs inside the segment: the torch reference driver's bits
    (ops.segment on int8 terms), not the bf16 cache's, with 0.5 + 1/G of its stored bytes."""
    model = tiny_model()
    runs = {}
    for name, driver, fmt in (("nmp", nmp_driver(), "int8"), ("ref", TorchSegmentDriver(), "int8"),
                              ("bf16", nmp_driver(), "bf16")):
        remove_coda_cache(model.transformer)
        hook = apply_coda_cache(model.transformer, CodaCacheConfig(driver, POLICY,
                                                                   cache_format=fmt))
        runs[name] = (generate(model, [3, 7], num_steps=STEPS), hook.events, hook.group)
    assert torch.equal(runs["nmp"][0], runs["ref"][0])
    assert not torch.equal(runs["nmp"][0], runs["bf16"][0])
    assert runs["nmp"][2] == 32 and runs["bf16"][2] is None
    stored = lambda log: sum(e.stored_bytes for e in log.of("op"))  # noqa: E731
    assert stored(runs["nmp"][1]) / stored(runs["bf16"][1]) == pytest.approx(0.5 + 1 / 32)
    psnr = lambda a, b: 10 * torch.log10(4 / ((a - b) ** 2).mean())  # noqa: E731
    assert psnr(runs["nmp"][0], runs["bf16"][0]) > 30


def test_int8_entries_compose_with_the_forecast():
    """cache="forecast" with cache_format="int8": both entries int8, the two-term segments
    dequantised on the NMEs, the torch reference's bits."""
    model = tiny_model()
    sched = POLICY.build(STEPS, 2)
    table = _forecast_table(sched)
    outs, segs = [], []
    for driver in (nmp_driver(), TorchSegmentDriver()):
        remove_coda_cache(model.transformer)
        hook = apply_coda_cache(model.transformer, CodaCacheConfig(
            driver, sched, cache="forecast", forecast=table, cache_format="int8",
            cache_group=16))
        outs.append(generate(model, [3, 7], num_steps=STEPS))
        segs.append(hook.events.of("segment"))
    assert torch.equal(outs[0], outs[1])
    assert any(s.terms > len(s.ops) for s in segs[0])


@pytest.mark.parametrize("bad, message", [
    (dict(cache_format="fp8"), "cache_format='fp8': expected one of bf16, int8"),
    (dict(cache_format="int8", cache_group=24),
     r"cache_group G=24 for C=32 channels: expected a divisor of C=32 that is a multiple "
     r"of the NME's 8 lanes"),
    (dict(cache_format="int8", cache_group=4), r"G=4 for C=32 channels"),
    (dict(cache_group=16), r"cache_group=16: an int8 option"),
])
def test_a_bad_cache_format_or_group_is_refused_when_applied(bad, message):
    with pytest.raises(ValueError, match=message):
        apply_coda_cache(tiny_model().transformer, CodaCacheConfig(nmp_driver(), POLICY, **bad))


def test_int8_needs_a_driver_that_stores_int8():
    class Plain:
        def store(self, key, tensor, group=None):
            pass
    with pytest.raises(ValueError, match="cache_format='int8' needs a driver with store_int8"):
        apply_coda_cache(tiny_model().transformer,
                         CodaCacheConfig(Plain(), POLICY, cache_format="int8"))


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("inputs, history", [(False, 1), (True, 2)])
def test_cache_mem_words_holds_an_int8_generation(ranks, inputs, history):
    """cache_mem_words(cache_format="int8") holds every int8 output slot (q and scales), the
    16-bit kept inputs and zeros, and a segment's scratch, as the driver places them; no
    more than the bf16 size."""
    from coda.host.model.sample import cache_mem_words
    from coda.host.cache.schedule import BRANCHES
    from coda.host.nme.ops import quant_int8
    model = tiny_model()
    tcfg, data = model.config["transformer"], model.config["data"]
    tokens = data["frames"] * (data["size"] // tcfg["patch_size"]) ** 2
    hidden = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
    layers = len(model.transformer.transformer_blocks)
    q, s = quant_int8(torch.zeros(tokens, hidden), 32, torch.bfloat16)
    zeros = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
    for videos in range(1, 5):
        words = cache_mem_words(model, videos, ranks, 8, inputs=inputs, history=history,
                                cache_format="int8")
        assert words <= cache_mem_words(model, videos, ranks, 8, inputs=inputs,
                                        history=history)
        driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=words), ranks=ranks)
        for v in range(videos):
            for br in BRANCHES:
                driver.store((br, v, "zero"), zeros, x_of=(br, v))
                for layer in range(layers):
                    for op in OP_TYPES:
                        for what in ("out", "prev")[:history]:
                            driver.store_int8((br, v, layer, op, what), q, s, 32, group=(br, v))
                        if inputs:
                            driver.store((br, v, layer, op, "in"), zeros, group=(br, v))
        k = len(OP_TYPES)
        shapes = {"x": (tokens, hidden), "g": (k, hidden), "q": (k, tokens, hidden),
                  "scale": (k, tokens, hidden // 32)}
        assert driver.fits("segment_int8", shapes, 32), (videos, words)
        assert driver.stats["placement_misses"] == 0
