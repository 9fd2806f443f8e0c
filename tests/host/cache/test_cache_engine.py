"""The cross-timestep cache engine on a small random Latte, with the real NMPDriver.

Each of the generation tests comes from a failure seen in public caching code: CFG branches
sharing one cache, state carried across generations, shape errors when the video size or
step count changes, per-sample results depending on the batch.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
import torch

from coda.host.nme.backend import TorchBackend
from coda.host.cache.engine import (CodaCacheConfig, apply_coda_cache, get_coda_cache_hook,
                                    remove_coda_cache, reset_coda_cache)
from coda.host.nmp.driver import NMPDriver
from coda.host.model.dit import DEFAULT_CONFIG, build_model
from coda.host.model.sample import generate
from coda.host.cache.policies import UniformIntervalPolicy
from coda.host.cache.schedule import OP_TYPES, Schedule, ScheduleError, operator_order, segment_runs
from coda.hw.nme.isa import NMEConfig
from reference_driver import TorchSegmentDriver

STEPS = 6
POLICY = UniformIntervalPolicy(intervals={"cross_attn": 3}, default_interval=2, warmup=1)
TINY = dict(num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
            num_layers=2, sample_size=16, video_length=4, caption_channels=16)

# Built in a fresh interpreter by the subprocess test: keep it in sync with tiny_model().
_TINY_SRC = f"""
import copy, torch
torch.set_num_threads(1)
from coda.host.model.dit import DEFAULT_CONFIG, build_model
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.host.cache.engine import CodaCacheConfig, apply_coda_cache
from coda.host.cache.policies import UniformIntervalPolicy
from coda.host.model.sample import generate
from coda.hw.nme.isa import NMEConfig
cfg = copy.deepcopy(DEFAULT_CONFIG)
cfg["transformer"].update({TINY!r})
cfg["data"].update(frames=4, size=16)
model = build_model(cfg, seed=1).eval()
driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
apply_coda_cache(model.transformer, CodaCacheConfig(driver, UniformIntervalPolicy(
    intervals={{"cross_attn": 3}}, default_interval=2, warmup=1)))
"""


def tiny_model():
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    cfg["transformer"].update(TINY)
    cfg["data"].update(frames=4, size=16)
    return build_model(cfg, seed=1).eval()


def nmp_driver():
    return NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)


class SpyDriver(NMPDriver):
    """The real driver, recording which CFG context wrote and read each slot."""

    def __init__(self, transformer):
        super().__init__(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
        self.transformer = transformer
        self.events = []

    def _context(self):
        return get_coda_cache_hook(self.transformer).context_manager.context.name

    def store(self, key, tensor, group=None, x_of=None):
        self.events.append(("store", self._context(), key[1]))
        super().store(key, tensor, group, x_of)

    def segment_submit(self, x, gates, keys):
        self.events.extend(("segment", self._context(), k[1]) for k in keys)
        return super().segment_submit(x, gates, keys)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cached(model, driver, policy=POLICY):
    remove_coda_cache(model.transformer)
    return apply_coda_cache(model.transformer, CodaCacheConfig(driver, policy))


# ---------------------------------------------------------------- exactness
def test_reusing_nothing_is_bit_identical_to_the_unhooked_model():
    model = tiny_model()
    plain = generate(model, [3, 7], num_steps=STEPS)
    hook = cached(model, nmp_driver(), Schedule(STEPS, 2))
    hooked = generate(model, [3, 7], num_steps=STEPS)
    assert torch.equal(hooked, plain)
    assert hook.stats["ops_reused"] == 0 and hook.stats["segments"] == 0


def test_nmp_segments_are_bit_identical_to_torch_and_skip_operators():
    model = tiny_model()
    plain = generate(model, [3, 7], num_steps=STEPS)
    hook = cached(model, nmp_driver())
    on_nmp = generate(model, [3, 7], num_steps=STEPS)
    stats = dict(hook.stats)
    cached(model, TorchSegmentDriver())
    in_torch = generate(model, [3, 7], num_steps=STEPS)
    assert torch.equal(on_nmp, in_torch)
    assert not torch.equal(on_nmp, plain)  # reuse really changed the computation
    sched = POLICY.build(STEPS, 2)
    reused = sum(len(sched.reused(s, b)) for s in range(STEPS) for b in ("cond", "uncond"))
    # counted per sample (2 samples): each sample's segments run on the NMEs separately
    assert stats["ops_reused"] == 2 * reused == stats["segment_ops"]
    assert stats["segments"] == 2 * sched.segment_count(frames=4)
    assert stats["ops_computed"] + stats["ops_reused"] == 2 * STEPS * 2 * len(operator_order(2))


# ---------------------------------------------------------------- CFG branches
def test_unconditional_branch_never_reads_conditional_cache_and_vice_versa():
    model = tiny_model()
    spy = SpyDriver(model.transformer)
    cached(model, spy)
    separate = generate(model, [3, 7], num_steps=STEPS, cfg_mode="separate")
    events = [e for e in spy.events]
    assert any(kind == "segment" for kind, _, _ in events)
    for kind, context, slot_branch in events:
        assert context == slot_branch, (kind, context, slot_branch)
    # Batched CFG splits the batch by branch: the same bits as separate calls.
    cached(model, nmp_driver())
    batched = generate(model, [3, 7], num_steps=STEPS, cfg_mode="batched")
    assert torch.equal(batched, separate)


def test_branch_specific_schedule_batched_equals_separate():
    # cond reuses at steps 2..3 while uncond computes: rows of one call follow two schedules.
    model = tiny_model()
    everything = frozenset(operator_order(2))
    sched = Schedule(4, 2, {(2, "cond"): everything, (3, "cond"): everything,
                            (3, "uncond"): frozenset({(1, "temporal_ffn")})})
    cached(model, nmp_driver(), sched)
    batched = generate(model, [5], num_steps=4)
    cached(model, nmp_driver(), sched)
    separate = generate(model, [5], num_steps=4, cfg_mode="separate")
    assert torch.equal(batched, separate)


# ---------------------------------------------------------------- generations
def test_batch_of_three_equals_three_batches_of_one():
    model = tiny_model()
    cached(model, nmp_driver())
    three = generate(model, [1, 4, 9], num_steps=STEPS, seeds=[10, 11, 12])
    for i, (label, seed) in enumerate(zip([1, 4, 9], [10, 11, 12])):
        one = generate(model, [label], num_steps=STEPS, seeds=[seed])
        assert torch.equal(three[i:i + 1], one), f"sample {i}"


def test_cache_is_not_carried_over_between_generations():
    model = tiny_model()
    driver = nmp_driver()
    hook = cached(model, driver)
    generate(model, [2], num_steps=STEPS, seed=5)
    assert hook.stats["stores"] > 0, "the schedule stores outputs for reuse"
    assert driver.keys() == [], "a finished generation frees its slots"
    second = generate(model, [8], num_steps=STEPS, seed=6)
    cached(model, nmp_driver())
    fresh = generate(model, [8], num_steps=STEPS, seed=6)
    assert torch.equal(second, fresh)
    # Slots kept after the last step (keep_slots) are dropped by step 0 of the next one.
    remove_coda_cache(model.transformer)
    hook = apply_coda_cache(model.transformer, CodaCacheConfig(driver, POLICY, keep_slots=True))
    generate(model, [2], num_steps=STEPS, seed=5)
    assert driver.keys(), "keep_slots keeps them"
    again = generate(model, [8], num_steps=STEPS, seed=6, reset_cache=False)
    assert torch.equal(again, fresh)
    reset_coda_cache(model.transformer)
    assert driver.keys() == [] and get_coda_cache_hook(model.transformer).stats["calls"] == 0
    assert hook is get_coda_cache_hook(model.transformer)


def test_stats_are_per_generation():
    model = tiny_model()
    hook = cached(model, nmp_driver())
    generate(model, [2], num_steps=STEPS, seed=5, reset_cache=False)
    first = hook.stats
    generate(model, [2], num_steps=STEPS, seed=5, reset_cache=False)
    assert hook.stats == first and first["calls"] == STEPS
    assert hook.events.generations == 2
    assert hook.events.stats(0) == hook.events.stats(1)


@pytest.mark.parametrize("keep_slots", [False, True])
def test_a_second_model_can_use_the_rank_memory_of_an_idle_one(keep_slots):
    # rank memories that hold one model's cache, not two
    from coda.host.nmp.driver import NMPCapacityError

    model_a, model_b = tiny_model(), tiny_model()
    driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 14), ranks=2)
    for model in (model_a, model_b):
        apply_coda_cache(model.transformer, CodaCacheConfig(driver, POLICY, keep_slots=keep_slots))
    a = generate(model_a, [1, 2, 3], num_steps=STEPS, reset_cache=False)
    if keep_slots:       # the idle model still holds its cache
        with pytest.raises(NMPCapacityError, match="rank 0: cannot allocate"):
            generate(model_b, [1, 2, 3], num_steps=STEPS, reset_cache=False)
    else:
        assert torch.equal(a, generate(model_b, [1, 2, 3], num_steps=STEPS, reset_cache=False))


def test_a_cache_dtype_other_than_the_drivers_is_refused_when_applied():
    model = tiny_model()
    with pytest.raises(ValueError, match="disagrees with the driver's NME format 'bf16'"):
        apply_coda_cache(model.transformer, CodaCacheConfig(nmp_driver(), POLICY,
                                                            cache_dtype=torch.float16))
    assert get_coda_cache_hook(model.transformer) is None


def test_changing_the_step_count_between_runs():
    model = tiny_model()
    cached(model, nmp_driver())
    generate(model, [6], num_steps=STEPS)
    shorter = generate(model, [6], num_steps=4)
    longer = generate(model, [6], num_steps=9)
    cached(model, nmp_driver())
    assert torch.equal(shorter, generate(model, [6], num_steps=4))
    cached(model, nmp_driver())
    assert torch.equal(longer, generate(model, [6], num_steps=9))


def test_second_generation_with_another_size_equals_a_fresh_process(tmp_path):
    """A generation of another size after a first one gives the bits of a fresh process;
    single images (which skip the temporal blocks, as in training) are refused by the
    engine, which runs the full spatio-temporal model, with the reason."""
    model = tiny_model()
    cached(model, nmp_driver())
    first = generate(model, [3], num_steps=STEPS, frames=4, size=16)
    with pytest.raises(ValueError, match="enable_temporal_attentions=False: the CODA cache "
                                         "engine runs the full spatio-temporal Latte only"):
        generate(model, [3], num_steps=STEPS, frames=1, size=8)
    second = generate(model, [3], num_steps=STEPS, frames=4, size=8)
    assert first.shape == (1, 1, 4, 16, 16) and second.shape == (1, 1, 4, 8, 8)
    out = tmp_path / "second.pt"
    script = _TINY_SRC + textwrap.dedent(f"""
        video = generate(model, [3], num_steps={STEPS}, frames=4, size=8)
        torch.save(video, {str(out)!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    assert torch.equal(second, torch.load(out))


# ---------------------------------------------------------------- errors
def test_run_rejects_a_schedule_for_another_step_count():
    model = tiny_model()
    cached(model, nmp_driver(), Schedule(STEPS, 2))
    with pytest.raises(ScheduleError, match="6 steps"):
        generate(model, [1], num_steps=4)


def test_steps_out_of_order_and_missing_context_are_errors():
    model = tiny_model()
    cached(model, nmp_driver())
    x = torch.zeros(1, 1, 4, 16, 16)
    with pytest.raises(ValueError, match="No cache context"):
        model(x, torch.tensor([10]), torch.tensor([1]))
    with model.transformer.cache_context("cond", step_index=0, num_inference_steps=3):
        model(x, torch.tensor([10]), torch.tensor([1]))
    with pytest.raises(ValueError, match="step 2 after step 0"):
        with model.transformer.cache_context("cond", step_index=2, num_inference_steps=3):
            model(x, torch.tensor([10]), torch.tensor([1]))
    with pytest.raises(ValueError, match="context name 'both'"):
        with model.transformer.cache_context("both", step_index=0, num_inference_steps=3):
            model(x, torch.tensor([10]), torch.tensor([1]))


# ---------------------------------------------------------------- schedules
def test_schedule_rejects_reuse_of_something_never_computed():
    with pytest.raises(ScheduleError, match=r"step 0, branch cond: reuses \(0, 'cross_attn'\)"):
        Schedule(4, 2, {(0, "cond"): frozenset({(0, "cross_attn")})})
    # Computed in the other branch only does not count.
    with pytest.raises(ScheduleError, match="branch uncond"):
        Schedule(4, 1, {(1, "cond"): frozenset({(0, "spatial_ffn")}),
                        (0, "uncond"): frozenset({(0, "spatial_ffn")})})
    with pytest.raises(ScheduleError, match="unknown operators"):
        Schedule(4, 2, {(1, "cond"): frozenset({(2, "cross_attn")})})
    with pytest.raises(ScheduleError, match="branch 'both'"):
        Schedule(4, 2, {(1, "both"): frozenset()})
    with pytest.raises(ScheduleError, match="warmup=0"):
        UniformIntervalPolicy(warmup=0)


def test_uniform_interval_schedule_known_case():
    sched = UniformIntervalPolicy(default_interval=2, warmup=2).build(10, 3)
    # Steps 3, 5, 7, 9 reuse everything; the others compute everything.
    assert [s for s in range(10) if sched.reused(s, "cond")] == [3, 5, 7, 9]
    assert sched.reused(5, "uncond") == frozenset(operator_order(3))
    assert sched.ops_skipped_fraction() == pytest.approx(0.4)
    # Each reusing step: two segments (layer 0's temporal embedding splits the run).
    assert sched.segment_count(frames=8) == 4 * 2 * 2
    assert sched.segment_count(frames=1) == 4 * 2 * 1
    assert sched.store_after_compute(2, "cond", (0, "cross_attn"))
    assert not sched.store_after_compute(3, "cond", (0, "cross_attn"))
    # forecast (history 2): step 3 reads steps 2 and 1, so step 1 stores too; step 0 does not
    assert [s for s in range(10) if sched.store_after_compute(s, "cond", (0, "cross_attn"), 2)
            and not sched.reused(s, "cond")] == [1, 2, 4, 6, 8]
    with pytest.raises(ValueError, match="history=3: expected 1"):
        sched.store_after_compute(2, "cond", (0, "cross_attn"), 3)
    assert Schedule.from_json(sched.to_json()) == sched


def test_uniform_interval_per_operator_type():
    policy = UniformIntervalPolicy(intervals={op: k for op, k in zip(OP_TYPES, [1, 2, 3, 4, 5])},
                                   warmup=1, cooldown=1)
    sched = policy.build(12, 1)
    for step in range(12):
        reused = {op for _, op in sched.reused(step, "cond")}
        expect = set() if step < 1 or step >= 11 else \
            {op for op, k in zip(OP_TYPES, [1, 2, 3, 4, 5]) if (step - 1) % k}
        assert reused == expect, step
    runs = segment_runs({(0, "spatial_ffn"), (0, "temporal_attn"), (0, "temporal_ffn")}, 1, frames=8)
    assert runs == [[(0, "spatial_ffn")], [(0, "temporal_attn"), (0, "temporal_ffn")]]


# ---------------------------------------------------------------- operator events
def test_events_follow_the_schedule_operator_by_operator():
    model = tiny_model()
    hook = cached(model, nmp_driver())
    generate(model, [3, 7], num_steps=STEPS)
    sched = POLICY.build(STEPS, 2)
    ops_ev = hook.events.of("op")
    assert len(ops_ev) == STEPS * 2 * 2 * len(operator_order(2))    # steps x branches x samples
    for e in ops_ev:
        assert e.reused == (e.ref in sched.reused(e.step, e.branch))
        assert (e.tokens, e.channels, e.dtype) == (4 * 16, 32, "bf16")   # F*N tokens, hidden
        assert operator_order(2)[e.index] == e.ref
        # stored exactly when the next step reuses it: [64, 32] bf16 = 4096 bytes
        assert e.stored_bytes == (4096 if sched.store_after_compute(e.step, e.branch, e.ref)
                                  and not e.reused else 0)
    for seg in hook.events.of("segment"):
        runs = segment_runs(sched.reused(seg.step, seg.branch), 2, frames=4)
        assert list(seg.ops) in runs
        members = [e for e in ops_ev if e.segment == seg.segment]
        assert [e.ref for e in members] == list(seg.ops)
        assert {(e.step, e.branch, e.sample) for e in members} == {(seg.step, seg.branch,
                                                                   seg.sample)}
        assert seg.bytes_from_nmp == 4096 and seg.programs == 1 and seg.nme_cycles > 0
    assert hook.stats["pcie_bytes"] == sum(e.stored_bytes for e in ops_ev) + sum(
        s.bytes_to_nmp + s.bytes_from_nmp for s in hook.events.of("segment"))
    from coda.host.cache.events import EventLog
    assert EventLog.from_jsonl(hook.events.to_jsonl()).events == hook.events.events


class _KeepAndWatch(UniformIntervalPolicy):
    """Keeps every stored operator's input and measures its change before each reuse."""

    def decide(self, q):
        d = super().decide(q)
        if d.reuse and not q.segment_open:
            self.seen.append((q.step, q.branch, q.sample, q.ref, q.input_change()))
        return type(d)(d.reuse, d.store, keep_input=d.store, reason=d.reason)

    def reset(self):
        self.seen = []


def test_input_change_runs_on_the_nme_against_the_kept_input():
    model = tiny_model()
    policy = _KeepAndWatch(intervals={"cross_attn": 3}, default_interval=2, warmup=1)
    cached(model, nmp_driver())
    expected = generate(model, [3], num_steps=STEPS)
    hook = cached(model, nmp_driver(), policy)
    watched = generate(model, [3], num_steps=STEPS)
    assert torch.equal(watched, expected)        # watching changes nothing
    mons = hook.events.of("monitor")
    assert len(mons) == len(policy.seen) > 0
    for m, (step, branch, sample, ref, value) in zip(mons, policy.seen):
        assert (m.step, m.branch, m.sample, (m.layer, m.op), m.value) == (step, branch, sample,
                                                                          ref, value)
        # the reference is the input at the last step the operator was computed
        computed = [e.step for e in hook.events.of("op") if not e.reused and e.step < m.step
                    and (e.branch, e.sample, e.layer, e.op) == (m.branch, m.sample, m.layer, m.op)]
        assert m.reference_step == max(computed) and 0 < m.value < float("inf")
        assert m.programs == 1 and m.nme_cycles > 0 and m.bytes_to_nmp > 0
    assert any(e.kept_bytes == 4096 for e in hook.events.of("op"))


# ---------------------------------------------------------------- CFG interleaving
def _longest_branch_run(events) -> int:
    longest = run = 0
    for prev, e in zip([None] + events[:-1], events):
        run = run + 1 if prev is not None and prev.branch == e.branch else 1
        longest = max(longest, run)
    return longest


def test_interleaved_cfg_gives_the_bits_of_the_plain_order():
    model = tiny_model()
    remove_coda_cache(model.transformer)
    plain_hook = apply_coda_cache(model.transformer, CodaCacheConfig(nmp_driver(), POLICY,
                                                                     interleave_cfg=False))
    plain = generate(model, [3, 7], num_steps=STEPS)
    hook = cached(model, nmp_driver())
    assert hook.config.interleave_cfg
    interleaved = generate(model, [3, 7], num_steps=STEPS)
    assert torch.equal(interleaved, plain)
    # Plain: each operator for every row of the batched call in turn (uncond, cond, ...).
    # Interleaved: a branch runs on alone until it launches a segment.
    step = [e for e in plain_hook.events.of("op") if e.step == 3 and not e.reused]
    assert _longest_branch_run(step) == 2        # the two samples of one branch
    step = [e for e in hook.events.of("op") if e.step == 3 and not e.reused]
    assert _longest_branch_run(step) > 2
    assert sorted(map(repr, hook.events)) == sorted(map(repr, plain_hook.events))


def test_interleaved_cfg_overlaps_the_rtl_nmes_with_the_other_branch():
    """On the Verilated NMEs (one simulator process per rank) a branch's segment is still
    running while the host computes the other branch: the overlap is measured; the bits, the
    events and the NME cycles are those of the torch backend."""
    from coda.host.nme.backend import get_backend

    model = tiny_model()
    cfg = NMEConfig(lanes=8, mem_words=1 << 19)    # test_run.py's build too (tests/experiments)
    reference = cached(model, NMPDriver(TorchBackend(), cfg, ranks=2))
    expected = generate(model, [3, 7], num_steps=4)
    with get_backend("rtl") as backend:
        driver = NMPDriver(backend, cfg, ranks=2)
        hook = cached(model, driver)
        got = generate(model, [3, 7], num_steps=4)
    assert torch.equal(got, expected)
    assert hook.events.events == reference.events.events
    assert hook.stats["segments"] > 0
    assert driver.stats["async_launches"] == driver.stats["programs"] >= hook.stats["segments"]
    assert driver.stats["overlap_s"] > 0


# ---------------------------------------------------------------- segment output: sum / residual
def _cross_attn_from_step_1(steps: int = STEPS, layers: int = 2) -> Schedule:
    reuse = {(s, b): frozenset((layer, "cross_attn") for layer in range(layers))
             for s in range(1, steps) for b in ("cond", "uncond")}
    return Schedule(steps, layers, reuse, "cross_attn from step 1")


def test_a_sum_segment_rounds_only_the_reused_output():
    """The cross attention of the digit model attends to one token (the label), so its output
    never changes between steps. Reused through sum segments, the only change is that its
    output enters the fp32 residual stream rounded to bf16 (the cache format; its gate is 1):
    the reference is the unhooked model with attn2's output rounded to bf16 from step 1 on."""
    model = tiny_model()
    calls = {"n": 0}
    blocks = len(model.transformer.transformer_blocks)

    def round_from_step_1(module, args, out):
        step = calls["n"] // blocks           # one batched-CFG call per step, attn2 per block
        calls["n"] += 1
        return out if step == 0 else out.to(torch.bfloat16).to(out.dtype)

    handles = [b.attn2.register_forward_hook(round_from_step_1)
               for b in model.transformer.transformer_blocks]
    reference = generate(model, [3, 7], num_steps=STEPS)
    for h in handles:
        h.remove()
    hook = cached(model, nmp_driver(), _cross_attn_from_step_1())
    assert torch.equal(generate(model, [3, 7], num_steps=STEPS), reference)
    assert hook.stats["ops_reused"] == 2 * 2 * 2 * (STEPS - 1)


def test_sum_segments_send_no_residual_and_residual_segments_do():
    """Per segment, "residual" sends x down ([T, C] bf16 tiled over the ranks) and "sum" does
    not; "sum" writes one slot of zeros per branch, sample and stream per generation
    instead."""
    model = tiny_model()
    seen = {}
    for form in ("sum", "residual"):
        remove_coda_cache(model.transformer)
        hook = apply_coda_cache(model.transformer, CodaCacheConfig(
            nmp_driver(), _cross_attn_from_step_1(), segment_output=form))
        generate(model, [3, 7], num_steps=STEPS)
        seen[form] = hook.events.of("segment")
    t, c = seen["sum"][0].tokens, seen["sum"][0].channels
    x_bytes = t * c * 2
    assert len(seen["sum"]) == len(seen["residual"]) == 2 * 2 * 2 * (STEPS - 1)
    assert [s.bytes_from_nmp for s in seen["sum"]] == [s.bytes_from_nmp for s in seen["residual"]]
    down = sum(s.bytes_to_nmp for s in seen["residual"]) - sum(s.bytes_to_nmp for s in seen["sum"])
    zero_slots = 2 * 2 * x_bytes    # per CFG branch and sample, written by its first segment
    assert down == len(seen["sum"]) * x_bytes - zero_slots


def test_an_unknown_segment_output_is_refused():
    with pytest.raises(ValueError, match="segment_output='y'"):
        apply_coda_cache(tiny_model().transformer, CodaCacheConfig(nmp_driver(), POLICY,
                                                                   segment_output="y"))

class _Abort(Exception):
    pass


@pytest.mark.parametrize("failure", ["interrupt", "capacity", "segment"])
def test_an_aborted_generation_frees_its_rank_memory(failure):
    """Two models share a driver that holds one generation's cache. The first generation ends
    by an exception at its 4th transformer call (Ctrl-C; the driver out of memory while
    storing; a launched segment abandoned); its slots and the scratch of segments it launched
    are freed then, so the second model generates the bits it generates on a fresh driver,
    and the aborted model's next generation starts again at step 0."""
    from coda.host.nmp.driver import NMPCapacityError

    model_a, model_b = tiny_model(), tiny_model()
    driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 14), ranks=2)
    hook_a = apply_coda_cache(model_a.transformer, CodaCacheConfig(driver, POLICY))
    apply_coda_cache(model_b.transformer, CodaCacheConfig(driver, POLICY))
    full = driver.free_bytes()
    want = generate(model_b, [1, 2, 3], num_steps=STEPS, reset_cache=False)
    assert driver.free_bytes() == full
    calls = []
    exc = {"interrupt": KeyboardInterrupt, "capacity": NMPCapacityError,
           "segment": _Abort}[failure]

    def fail_at_4th(module, args, kwargs):
        calls.append(1)
        if len(calls) == 4 and failure == "interrupt":
            raise KeyboardInterrupt

    real_store, real_segment = driver.store, driver.segment_submit

    def store(key, tensor, group=None, x_of=None):
        if len(calls) == 4 and failure == "capacity":
            raise NMPCapacityError("rank 0: cannot allocate (injected)")
        return real_store(key, tensor, group, x_of)

    def segment_submit(x, gates, keys):
        pending = real_segment(x, gates, keys)    # launched: its scratch is held
        if len(calls) == 4 and failure == "segment":
            raise _Abort
        return pending

    handle = model_a.transformer.register_forward_pre_hook(fail_at_4th, with_kwargs=True)
    driver.store, driver.segment_submit = store, segment_submit
    with pytest.raises(exc):
        generate(model_a, [1, 2, 3], num_steps=STEPS, reset_cache=False)
    handle.remove()
    del driver.store, driver.segment_submit
    assert len(calls) == 4 and hook_a.state.generation is None
    assert driver.free_bytes() == full and driver.keys() == []
    assert torch.equal(generate(model_b, [1, 2, 3], num_steps=STEPS, reset_cache=False), want)
    assert torch.equal(generate(model_a, [1, 2, 3], num_steps=STEPS, reset_cache=False), want)


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("inputs, history", [(False, 1), (True, 1), (False, 2), (True, 2)])
def test_cache_mem_words_holds_a_generation_as_the_driver_places_it(ranks, inputs, history):
    """cache_mem_words sizes rank memory for every slot of a generation (per video and CFG
    branch one slot group, per operator type and layer a slot, with ``inputs`` a second one)
    plus a segment's scratch, with ``history`` 2 (forecast) the older entries too; checked with
    the driver's own placement (bank colours, power-of-two alignment), for 1..4 videos."""
    from coda.host.model.sample import cache_mem_words
    from coda.host.cache.schedule import BRANCHES
    model = tiny_model()
    tcfg, data = model.config["transformer"], model.config["data"]
    tokens = data["frames"] * (data["size"] // tcfg["patch_size"]) ** 2
    hidden = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
    layers = len(model.transformer.transformer_blocks)
    for videos in range(1, 5):
        words = cache_mem_words(model, videos, ranks, 8, inputs=inputs, history=history)
        driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=words), ranks=ranks)
        zeros = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
        for v in range(videos):
            for br in BRANCHES:
                for layer in range(layers):
                    for op in OP_TYPES:
                        for what in ("out", "prev")[:history] + ("in",) * inputs:
                            driver.store((br, v, layer, op, what), zeros, group=(br, v))
        shapes = {"x": (tokens, hidden), "g": (len(OP_TYPES), hidden),
                  "c": (len(OP_TYPES), tokens, hidden)}
        assert driver.fits("segment", shapes), (videos, words)
        assert driver.stats["placement_misses"] == 0


# ---------------------------------------------------------------- exceptions from user code
ERRORS = [TypeError, ValueError, KeyError, AttributeError, RuntimeError]


@dataclass(frozen=True, eq=False)
class _FailingPolicy(UniformIntervalPolicy):
    """POLICY's schedule; ``decide`` raises ``error`` for operator ``index`` at step 1."""
    error: BaseException | None = None
    index: int = 0

    def decide(self, q):
        if q.step == 1 and q.index == self.index:
            raise self.error
        return super().decide(q)


class _FailingStoreDriver(NMPDriver):
    """The real driver; its first ``store`` raises ``error``."""

    def __init__(self, error):
        super().__init__(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
        self.error = error

    def store(self, key, tensor, group=None, x_of=None):
        raise self.error


class _OtherStoreSignature(NMPDriver):
    """A driver subclass whose ``store`` takes no ``group``."""

    def __init__(self):
        super().__init__(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)

    def store(self, key, tensor):
        return super().store(key, tensor)


def _raises_itself(model, hook, driver, error, innermost: str):
    """A generation ends by ``error`` itself: not wrapped, nothing chained onto it, its
    traceback down to the frame that raised it; the generation is ended, its slots freed."""
    with pytest.raises(type(error)) as info:
        generate(model, [3, 7], num_steps=STEPS)
    assert info.value is error
    assert error.__cause__ is None and error.__context__ is None
    assert info.traceback[-1].name == innermost
    assert hook.state.generation is None and driver.keys() == []


@pytest.mark.parametrize("kind", ERRORS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("index", [0, -1], ids=["first_operator", "last_operator"])
def test_an_exception_in_policy_decide_reaches_the_caller_as_itself(kind, index):
    # the first operator's program runs inside Latte's `hidden_states + temp_pos_embed`,
    # where torch turns a TypeError into NotImplemented and tries the reflected operator
    model, driver, error = tiny_model(), nmp_driver(), kind("injected")
    n_ops = len(operator_order(2))
    policy = _FailingPolicy(intervals={"cross_attn": 3}, default_interval=2, warmup=1,
                            error=error, index=index % n_ops)
    hook = cached(model, driver, policy)
    _raises_itself(model, hook, driver, error, "decide")


@pytest.mark.parametrize("kind", ERRORS, ids=lambda e: e.__name__)
def test_an_exception_in_driver_store_reaches_the_caller_as_itself(kind):
    error = kind("injected")
    model, driver = tiny_model(), _FailingStoreDriver(error)
    hook = cached(model, driver)
    _raises_itself(model, hook, driver, error, "store")


def test_a_driver_store_of_another_signature_fails_with_its_own_type_error():
    model, driver = tiny_model(), _OtherStoreSignature()
    hook = cached(model, driver)
    with pytest.raises(TypeError, match="unexpected keyword argument 'group'") as info:
        generate(model, [3, 7], num_steps=STEPS)
    assert info.value.__cause__ is None and info.value.__context__ is None
    assert info.traceback[-1].name == "store" and info.traceback[-1].path.name == "step.py"
    assert hook.state.generation is None and driver.keys() == []


@pytest.mark.parametrize("kind", ERRORS[:2], ids=lambda e: e.__name__)
def test_an_exception_swallowed_by_model_code_still_reaches_the_caller(kind):
    """Model code between the blocks that catches the engine's exception (as torch's
    operators do with a TypeError) does not hide it: the call ends by it."""
    model, driver, error = tiny_model(), nmp_driver(), kind("injected")
    policy = _FailingPolicy(intervals={"cross_attn": 3}, default_interval=2, warmup=1,
                            error=error, index=0)
    hook = cached(model, driver, policy)

    def swallow(module, args, output):
        try:
            output.sum()
        except Exception:
            pass

    handle = model.transformer.transformer_blocks[0].register_forward_hook(swallow)
    try:
        _raises_itself(model, hook, driver, error, "decide")
    finally:
        handle.remove()


# ---------------------------------------------------------------- loops broken off
def _loop(model, calls=None, *, step_index=False, cfg_mode="batched", label=3, seed=0):
    """generate()'s CFG DDIM loop over STEPS steps, its cache contexts giving no
    num_inference_steps and (unless ``step_index``) no step; broken off after ``calls``
    transformer calls. Returns the latent where it stopped."""
    from coda.host.model.data import NULL_LABEL
    from coda.host.model.sample import initial_noise, make_scheduler
    sched = make_scheduler(model.config)
    sched.set_timesteps(STEPS)
    x = initial_noise([seed], 4, 16)
    done = 0
    for i, t in enumerate(sched.timesteps):
        tt = torch.full((1,), int(t), dtype=torch.long)
        ctx = dict(step_index=i) if step_index else {}
        if cfg_mode == "batched":
            if done == calls:
                return x
            with model.transformer.cache_context("uncond|cond", **ctx):
                uncond, cond = model(torch.cat([x, x]), torch.cat([tt, tt]),
                                     torch.tensor([NULL_LABEL, label])).chunk(2)
            done += 1
        else:
            out = {}
            for name, lab in (("uncond", NULL_LABEL), ("cond", label)):
                if done == calls:
                    return x
                with model.transformer.cache_context(name, **ctx):
                    out[name] = model(x, tt, torch.tensor([lab]))
                done += 1
            uncond, cond = out["uncond"], out["cond"]
        x = sched.step(uncond + 5.0 * (cond - uncond), t, x, eta=0.0).prev_sample
    return x


@pytest.mark.parametrize("step_index", [False, True], ids=["counted", "step_index"])
@pytest.mark.parametrize("cfg_mode, calls", [("batched", 2), ("batched", 1), ("separate", 4),
                                             ("separate", 3)])
def test_a_loop_broken_off_does_not_shift_the_next_generations_steps(cfg_mode, calls, step_index):
    """A loop stopped after ``calls`` transformer calls (2 steps, 1 step, mid-step), then a
    whole loop: the whole loop is a generation of its own, with a fresh engine's bits."""
    model = tiny_model()
    remove_coda_cache(model.transformer)
    hook = apply_coda_cache(model.transformer, CodaCacheConfig(nmp_driver(), POLICY,
                                                               num_inference_steps=STEPS))
    _loop(model, calls, step_index=step_index, cfg_mode=cfg_mode)
    got = _loop(model, step_index=step_index, cfg_mode=cfg_mode)
    assert hook.events.generations == 2
    assert hook.stats["calls"] == STEPS * (1 if cfg_mode == "batched" else 2)
    assert hook.stats["segments"] > 0
    remove_coda_cache(model.transformer)
    apply_coda_cache(model.transformer, CodaCacheConfig(nmp_driver(), POLICY,
                                                        num_inference_steps=STEPS))
    assert torch.equal(got, _loop(model, step_index=step_index, cfg_mode=cfg_mode))


def test_a_call_the_engine_cannot_place_is_refused():
    """Without step_index, a call while a generation runs is placed by its timestep; with
    none to compare (a NaN timestep, earlier calls that gave step_index) or branches that
    disagree (one call's timestep below one branch's last and above the other's), it is
    refused."""
    model = tiny_model()
    remove_coda_cache(model.transformer)
    hook = apply_coda_cache(model.transformer, CodaCacheConfig(nmp_driver(), POLICY,
                                                               num_inference_steps=STEPS))
    x, label = torch.zeros(1, 1, 4, 16, 16), torch.tensor([1])
    with model.transformer.cache_context("cond"):
        model(x, torch.tensor([900]), label)
    with pytest.raises(ValueError, match="cannot tell whether .* give step_index"):
        with model.transformer.cache_context("cond"):
            model(x, torch.tensor([float("nan")]), label)
    reset_coda_cache(model.transformer)
    with model.transformer.cache_context("cond", step_index=0):
        model(x, torch.tensor([900]), label)
    with pytest.raises(ValueError, match="cannot tell whether .* give step_index"):
        with model.transformer.cache_context("cond"):
            model(x, torch.tensor([800]), label)
    assert hook.state.branches["cond"].last_step == 0
    reset_coda_cache(model.transformer)
    for name, t in (("cond", 900), ("uncond", 800)):
        with model.transformer.cache_context(name):
            model(x, torch.tensor([t]), label)
    with pytest.raises(ValueError, match="cannot tell whether .* not below the last one of "
                                         r"branches \['uncond'\] but is below that of \['cond'\]"):
        with model.transformer.cache_context("uncond|cond"):
            model(torch.cat([x, x]), torch.tensor([850, 850]), torch.tensor([10, 1]))
