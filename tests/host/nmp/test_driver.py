"""The NMP driver: tiling over ranks, cache slots, capacity, lockstep launches, statistics."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coda.hw.nme.isa import NMEConfig, Status
from coda.host.nme import ops
from coda.hw.nme.executor import ExecResult
from coda.host.nme.backend import TorchBackend
from coda.host.nme.bits import from_bits, same_bits, to_bits
from coda.host.nmp.driver import NMPCapacityError, NMPDriver
from coda.host.nmp.tiling import tile_bounds

RANK_SHAPES = [(1, 1), (1, 2), (3, 1), (2, 2), (1, 5), (2, 3)]  # 1..6 ranks


def rand(gen, *shape, fmt="bf16"):
    bits = torch.randint(0, 1 << 16, shape, generator=gen, dtype=torch.int32).numpy()
    return from_bits(bits.astype(np.uint16), fmt)


class CountingBackend(TorchBackend):
    """TorchBackend that records each lockstep launch and makes the ranks' cycles differ."""

    def __init__(self):
        super().__init__()
        self.launches = []

    def execute_many(self, cfg, jobs, **kw):
        self.launches.append(len(jobs))
        out = super().execute_many(cfg, jobs, **kw)
        return [ExecResult(r.mem, r.status, r.l1, r.cycles + 10 * i) for i, r in enumerate(out)]


def test_tile_bounds_are_even_and_cover():
    assert tile_bounds(11, 3) == [(0, 4), (4, 8), (8, 11)]
    assert tile_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    for n in range(0, 30):
        for parts in range(1, 7):
            b = tile_bounds(n, parts)
            sizes = [e - s for s, e in b]
            assert b[0][0] == 0 and b[-1][1] == n and max(sizes) - min(sizes) <= 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(RANK_SHAPES), st.sampled_from(["bf16", "fp16"]),
       st.integers(1, 13), st.integers(1, 3), st.integers(1, 8), st.integers(0, 2 ** 31))
def test_segment_on_cached_slots_is_bit_exact_over_ranks(ranks, fmt, t, cw, k, seed):
    dimms, per_dimm = ranks
    cfg = NMEConfig(lanes=4, fmt=fmt, depth=3, mem_words=2048)
    drv = NMPDriver(TorchBackend(), cfg, dimms=dimms, ranks=per_dimm)
    gen = torch.Generator().manual_seed(seed)
    c = 4 * cw
    x, cs = rand(gen, t, c, fmt=fmt), [rand(gen, t, c, fmt=fmt) for _ in range(k)]
    gates = [rand(gen, c, fmt=fmt) for _ in range(k)]
    for i, ck in enumerate(cs):
        drv.store(("blk", i), ck)
    y = drv.segment(x, gates, [("blk", i) for i in range(k)])
    want = ops.segment(x, torch.stack(gates), torch.stack(cs))
    assert same_bits(to_bits(y), to_bits(want), fmt)
    for i, ck in enumerate(cs):
        assert np.array_equal(to_bits(drv.load(("blk", i))), to_bits(ck))
    assert drv.stats["programs"] == 1
    assert drv.stats["rank_programs"] == min(t, dimms * per_dimm)


def _op_inputs(op, gen, t, c, n, fmt):
    f = lambda *s: rand(gen, *s, fmt=fmt)  # noqa: E731
    return {
        "add": lambda: {"a": f(n), "b": f(n)}, "sub": lambda: {"a": f(n), "b": f(n)},
        "mul": lambda: {"a": f(n), "b": f(n)}, "l1_distance": lambda: {"a": f(n), "b": f(n)},
        "scale": lambda: {"a": f(t, c), "s": f(c)},
        "gated_residual": lambda: {"x": f(t, c), "g": f(c), "c": f(t, c)},
        "segment": lambda: {"x": f(t, c), "g": f(3, c), "c": f(3, t, c)},
        "cfg_combine": lambda: {"u": f(t, c), "c": f(t, c), "s": f()},
        "dequant_int8": lambda: {"q": torch.randint(-128, 128, (t, c), generator=gen,
                                                    dtype=torch.int8),
                                 "scale": f(t, c // 8), "group": 8},
        "segment_int8": lambda: {"x": f(t, c), "g": f(3, c),
                                 "q": torch.randint(-127, 128, (3, t, c), generator=gen,
                                                    dtype=torch.int8),
                                 "scale": f(3, t, c // 8), "group": 8},
    }[op]()


@pytest.mark.parametrize("op", sorted(ops.OPS) + sorted(ops.ENGINE_OPS))
@pytest.mark.parametrize("ranks", RANK_SHAPES)
def test_run_op_over_ranks_is_bit_exact(op, ranks):
    fmt = "fp16" if sum(ranks) % 2 else "bf16"
    cfg = NMEConfig(lanes=8, fmt=fmt, depth=2, mem_words=1024)
    drv = NMPDriver(TorchBackend(), cfg, *ranks)
    gen = torch.Generator().manual_seed(7)
    inputs = _op_inputs(op, gen, t=7, c=16, n=61, fmt=fmt)
    got = drv.run_op(op, **inputs)
    want = ops.get_op(op)(**inputs)
    if op == "l1_distance":
        want = want.item()
        assert (np.isnan(got) and np.isnan(want)) or got == pytest.approx(want, rel=1e-5)
    else:
        assert got.shape == want.shape and got.dtype == want.dtype
        assert same_bits(to_bits(got), to_bits(want), fmt)
    assert drv.free_bytes() == [1024 * 16] * (ranks[0] * ranks[1])  # scratch released


def test_lockstep_launch_and_stats():
    cfg = NMEConfig(lanes=8, fmt="bf16", depth=4, mem_words=1024)
    backend = CountingBackend()
    drv = NMPDriver(backend, cfg, dimms=2, ranks=2)
    gen = torch.Generator().manual_seed(1)
    x, c, g = rand(gen, 10, 16), rand(gen, 10, 16), rand(gen, 16)
    drv.store("c", c)
    assert drv.stats["bytes_written"] == 10 * 16 * 2  # 3+3+2+2 rows of 2 words
    drv.segment(x, [g], ["c"])
    assert backend.launches == [4]
    rows = [3, 3, 2, 2]
    per_rank = [TorchBackend().execute(cfg, p, np.zeros((1024, 8), np.uint16)).cycles
                for p in _segment_programs(cfg, rows)]
    assert drv.stats["nme_cycles"] == max(cy + 10 * i for i, cy in enumerate(per_rank))
    # x tiles + the gate on every rank; y tiles back
    assert drv.stats["bytes_written"] == 320 + 320 + 4 * 32
    assert drv.stats["bytes_read"] == 320
    assert drv.stats["cmd_bytes"] == 4 * 8 * 5
    drv.load("c")
    assert drv.stats["bytes_read"] == 640
    drv.reset_stats()
    assert drv.stats["programs"] == 0


def _segment_programs(cfg, rows):
    from coda.host.nme import compiler
    progs = []
    for r in rows:
        sh = {"x": (r, 16), "g": (1, 16), "c": (1, r, 16)}
        progs.append(compiler.compile_op("segment", cfg, sh,
                                         compiler.plan_layout("segment", cfg, sh)[0]))
    return progs


def test_capacity_error_names_bytes_and_rolls_back():
    cfg = NMEConfig(lanes=8, fmt="bf16", mem_words=64)  # 1024 bytes per rank
    drv = NMPDriver(TorchBackend(), cfg, ranks=2)
    gen = torch.Generator().manual_seed(2)
    drv.store("a", rand(gen, 40, 16))       # 20 rows = 40 words per rank
    assert drv.free_bytes() == [384, 384]
    with pytest.raises(NMPCapacityError, match=r"rank 0: cannot allocate 1024 bytes "
                                               r"\(64 words\) for slot 'b' \[64, 16\]; "
                                               r"384 bytes free"):
        drv.store("b", rand(gen, 64, 16))
    assert drv.free_bytes() == [384, 384] and "b" not in drv
    with pytest.raises(MemoryError):
        drv.segment(rand(gen, 40, 16), [rand(gen, 16)], ["a"])  # scratch x + y does not fit
    assert drv.free_bytes() == [384, 384]


def test_first_fit_reuses_freed_ranges():
    cfg = NMEConfig(lanes=8, fmt="bf16", mem_words=64)
    drv = NMPDriver(TorchBackend(), cfg)
    gen = torch.Generator().manual_seed(3)
    slabs = {k: rand(gen, 16, 8) for k in "abcd"}  # 16 words each: memory full
    for k, v in slabs.items():
        drv.store(k, v)
    assert drv.free_bytes() == [0]
    drv.free("b")
    drv.free("c")                                   # b and c merge into 32 free words
    drv.store("e", rand(gen, 32, 8))
    assert drv.free_bytes() == [0] and drv.keys() == ["a", "d", "e"]
    for k in "ad":
        assert np.array_equal(to_bits(drv.load(k)), to_bits(slabs[k]))
    new = rand(gen, 16, 8)
    drv.store("a", new)                             # same shape: overwritten in place
    assert np.array_equal(to_bits(drv.load("a")), to_bits(new))
    drv.reset()
    assert drv.keys() == [] and drv.free_bytes() == [1024] and not drv.mems[0].any()


def test_swap_exchanges_slots_without_moving_data():
    """swap: the forecast mode's newer and older entries trade places in the slot table; the
    next store at the newer key overwrites the entry older than both in place."""
    drv = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=256), ranks=2)
    a, b = (torch.full((4, 16), v, dtype=torch.bfloat16) for v in (1.0, 2.0))
    drv.store("new", a)
    written = drv.stats["bytes_written"]
    drv.swap("new", "old")                   # "old" had no slot: it takes "new"'s
    assert drv.keys() == ["old"] and torch.equal(drv.load("old"), a)
    drv.store("new", b)
    drv.swap("new", "old")
    assert torch.equal(drv.load("new"), a) and torch.equal(drv.load("old"), b)
    assert drv.stats["bytes_written"] == 2 * written
    with pytest.raises(KeyError, match="no cache slot 'x' or 'y' to swap"):
        drv.swap("x", "y")


def test_slot_and_operand_errors():
    cfg = NMEConfig(lanes=8, fmt="bf16", mem_words=256)
    drv = NMPDriver(TorchBackend(), cfg, ranks=2)
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    drv.store("c", x)
    with pytest.raises(ValueError, match=r"slot 'h' has dtype torch.float16, expected "
                                         r"torch.bfloat16 \(the NME format 'bf16'\)"):
        drv.store("h", x.half())
    with pytest.raises(ValueError, match=r"slot 'v' has shape \(16,\), expected \[T, C\]"):
        drv.store("v", x[0])
    with pytest.raises(KeyError, match=r"no cache slot 'missing'"):
        drv.segment(x, [x[0]], ["missing"])
    with pytest.raises(ValueError, match=r"segment: slot 'c' has shape \[4, 16\], "
                                         r"expected \[3, 16\]"):
        drv.segment(x[:3], [x[0]], ["c"])
    with pytest.raises(ValueError, match=r"segment: K=0 terms, expected at least one"):
        drv.segment(x, [], [])
    with pytest.raises(ValueError, match=r"segment: gate 0 is torch.bfloat16 \[8\], "
                                         r"expected torch.bfloat16 \[16\]"):
        drv.segment(x, [x[0, :8]], ["c"])
    with pytest.raises(ValueError, match=r"add: argument 'a' has dtype torch.float16, expected "
                                         r"torch.bfloat16 \(the NME format 'bf16'\)"):
        drv.run_op("add", a=x[0].half(), b=x[0].half())
    with pytest.raises(ValueError, match=r"scale: argument 's' has shape"):
        drv.run_op("scale", a=x, s=x[0, :3])
    with pytest.raises(ValueError, match=r"unknown op 'fma'"):
        drv.run_op("fma", a=x)
    with pytest.raises(ValueError, match=r"dimms=0, ranks=1: expected >= 1 each"):
        NMPDriver(TorchBackend(), cfg, dimms=0)


def test_rejected_program_is_reported():
    class Rejecting(TorchBackend):
        def execute(self, cfg, program, mem, **kw):
            return ExecResult(mem, Status.BAD_ADDR, 0.0, 1)
    drv = NMPDriver(Rejecting(), NMEConfig(lanes=8, mem_words=64))
    x = torch.zeros(8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"rank 0: NME rejected a compiled program with "
                                           r"status BAD_ADDR"):
        drv.run_op("add", a=x, b=x)
    assert drv.free_bytes() == [1024]


@pytest.mark.parametrize("op", sorted(ops.OPS))
@pytest.mark.parametrize("t, c, n", [(7, 0, 0), (0, 16, 0)])
def test_empty_operands_run_no_program(op, t, c, n):
    """Zero tokens or zero channels: the reference's (empty) result, nothing launched."""
    cfg = NMEConfig(lanes=8, fmt="bf16", depth=2, mem_words=1024)
    backend = CountingBackend()
    drv = NMPDriver(backend, cfg, 1, 2)
    inputs = _op_inputs(op, torch.Generator().manual_seed(3), t=t, c=c, n=n, fmt="bf16")
    got = drv.run_op(op, **inputs)
    want = ops.OPS[op](**inputs)
    if op == "l1_distance":
        assert got == want.item() == 0.0
    else:
        assert got.shape == want.shape and got.dtype == want.dtype
    assert backend.launches == [] and drv.stats["rank_programs"] == 0


@pytest.mark.parametrize("dimms, ranks", [(1, 1), (1, 3), (2, 2)])
def test_l1_to_slot_is_the_rank_order_sum_of_each_tiles_l1(dimms, ranks):
    gen = torch.Generator().manual_seed(7)
    cfg = NMEConfig(lanes=4, mem_words=4096)
    x = torch.randn(13, 8, generator=gen).to(torch.bfloat16)
    c = torch.randn(13, 8, generator=gen).to(torch.bfloat16)
    drv = NMPDriver(TorchBackend(), cfg, dimms=dimms, ranks=ranks)
    drv.store("c", c)
    free, written = drv.free_bytes(), drv.stats["bytes_written"]
    got = drv.l1_to_slot(x, "c")
    tiles = [(r0, r1) for r0, r1 in tile_bounds(13, dimms * ranks) if r1 > r0]
    # only x crossed the link (whole 4-lane words per rank tile); c was read in place
    assert drv.stats["bytes_written"] - written == sum(-(-(r1 - r0) * 8 // 4) * 8
                                                       for r0, r1 in tiles)
    assert drv.free_bytes() == free          # the scratch for x is released
    one = NMPDriver(TorchBackend(), cfg)
    total = np.float32(0.0)
    for r0, r1 in tiles:
        part = one.run_op("l1_distance", a=x[r0:r1].flatten(), b=c[r0:r1].flatten())
        total = np.float32(total + np.float32(part))
    assert np.float32(got).tobytes() == total.tobytes()
    assert got == pytest.approx(float(ops.l1_distance(x.flatten(), c.flatten())), rel=1e-5)
    with pytest.raises(ValueError, match=r"slot 'c' has shape \[13, 8\], expected \[12, 8\]"):
        drv.l1_to_slot(x[:12], "c")
    with pytest.raises(KeyError, match="no cache slot 'd'"):
        drv.l1_to_slot(x, "d")


@pytest.mark.parametrize("k, ranks", [(9, 2), (17, 3), (16, 1)])
def test_a_long_segment_chains_programs_in_rank_memory(k, ranks):
    """K > 8 terms: programs of <= 8 terms, each reading the previous one's output in place.
    The bits are the reference's left-to-right evaluation; only x goes down and y comes up."""
    gen = torch.Generator().manual_seed(k)
    cfg = NMEConfig(lanes=8, mem_words=1 << 14)
    x = torch.randn(11, 16, generator=gen).to(torch.bfloat16)
    gates = [torch.randn(16, generator=gen).to(torch.bfloat16) for _ in range(k)]
    caches = [torch.randn(11, 16, generator=gen).to(torch.bfloat16) for _ in range(k)]
    drv = NMPDriver(TorchBackend(), cfg, ranks=ranks)
    for i, c in enumerate(caches):
        drv.store(i, c)
    expect = x
    for i in range(0, k, 8):
        expect = ops.segment(expect, torch.stack(gates[i:i + 8]), torch.stack(caches[i:i + 8]))
    free, before = drv.free_bytes(), dict(drv.stats)
    pending = drv.segment_submit(x, gates, list(range(k)))
    got = pending.result()
    assert torch.equal(got.view(torch.int16), expect.view(torch.int16))
    programs = -(-k // 8)
    assert pending.programs == programs == drv.stats["programs"] - before["programs"]
    x_bytes = sum(-(-(r1 - r0) * 16 // 8) * 16 for r0, r1 in tile_bounds(11, ranks))
    assert pending.bytes_from_nmp == drv.stats["bytes_read"] - before["bytes_read"] == x_bytes
    gate_bytes = k * 16 * 2 * ranks            # each gate replicated to every rank
    assert drv.stats["bytes_written"] - before["bytes_written"] == x_bytes + gate_bytes
    assert pending.nme_cycles == drv.stats["nme_cycles"] - before["nme_cycles"] > 0
    assert drv.free_bytes() == free


def test_more_ranks_than_a_dimm_nmp_holds_are_refused_before_any_memory():
    with pytest.raises(ValueError, match="100000 ranks: expected at most 256"):
        NMPDriver(TorchBackend(), NMEConfig(lanes=8), dimms=1, ranks=100_000)



@pytest.mark.parametrize("op, shapes, ranks", [
    ("add", {"a": (n,), "b": (n,)}, r) for n in (40_000, 40_920, 81_840) for r in (1, 3)] + [
    ("segment", {"x": (t, 64), "g": (3, 64), "c": (3, t, 64)}, r) for t in (700, 1_023)
    for r in (1, 2)] + [
    ("gated_residual", {"x": (t, 96), "g": (96,), "c": (t, 96)}, 2) for t in (333, 1_365)])
def test_fit_mem_words_is_the_smallest_size_the_placement_holds(op, shapes, ranks):
    """fit_mem_words sizes from the driver's own placement: at its size run_op runs (bit-exact
    to the reference), at half that size it raises NMPCapacityError, and fits() says so."""
    from dataclasses import replace

    from coda.host.nmp.driver import fit_mem_words
    cfg = NMEConfig(lanes=8)
    words = fit_mem_words(TorchBackend(), cfg, op, shapes, ranks=ranks, min_words=1 << 8)
    assert 1 << 8 < words < 1 << 24
    gen = torch.Generator().manual_seed(words)
    tensors = {n: rand(gen, *s).nan_to_num(0.0) for n, s in shapes.items()}
    fit = NMPDriver(TorchBackend(), replace(cfg, mem_words=words), ranks=ranks)
    small = NMPDriver(TorchBackend(), replace(cfg, mem_words=words // 2), ranks=ranks)
    assert fit.fits(op, shapes) and not small.fits(op, shapes)
    assert same_bits(to_bits(fit.run_op(op, **tensors)), to_bits(ops.OPS[op](**tensors)), "bf16")
    with pytest.raises(NMPCapacityError):
        small.run_op(op, **tensors)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(RANK_SHAPES), st.sampled_from(["bf16", "fp16"]),
       st.integers(1, 13), st.integers(1, 3), st.integers(1, 2), st.integers(1, 16),
       st.integers(0, 2 ** 31))
def test_int8_slots_segment_is_bit_exact_over_ranks(ranks, fmt, t, groups, per, k, seed):
    """int8 cache slots (q packed for the INT8 stream, scales beside it, tiled over the
    ranks): a segment dequantises them on the NMEs with the bits of ops.segment on int8
    terms, chained beyond segment_terms (7) terms; load dequantises the same way; the bytes
    written are q and scales, whole words per rank."""
    from coda.host.nme.compiler import segment_terms
    dimms, per_dimm = ranks
    cfg = NMEConfig(lanes=4, fmt=fmt, depth=3, mem_words=4096)
    drv = NMPDriver(TorchBackend(), cfg, dimms=dimms, ranks=per_dimm)
    gen = torch.Generator().manual_seed(seed)
    group = 4 * per
    c = group * groups
    dtype = torch.bfloat16 if fmt == "bf16" else torch.float16
    entries = [ops.quant_int8(torch.randn(t, c, generator=gen), group, dtype) for _ in range(k)]
    gates = [rand(gen, c, fmt=fmt) for _ in range(k)]
    x = rand(gen, t, c, fmt=fmt)
    for i, (q, s) in enumerate(entries):
        drv.store_int8(("blk", i), q, s, group)
    y = drv.segment(x, gates, [("blk", i) for i in range(k)])
    want, m = x, segment_terms(cfg, "segment_int8")
    for i in range(0, k, m):
        part = entries[i:i + m]
        want = ops.segment(want, torch.stack(gates[i:i + m]), torch.stack([q for q, _ in part]),
                           torch.stack([s for _, s in part]), group)
    assert same_bits(to_bits(y), to_bits(want), fmt)
    assert drv.stats["programs"] == -(-k // m)
    for i, (q, s) in enumerate(entries):
        assert same_bits(to_bits(drv.load(("blk", i))), to_bits(ops.dequant_int8(q, s, group)),
                         fmt)


def test_int8_slot_errors_name_g_and_c():
    drv = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1024), ranks=2)
    q, s = ops.quant_int8(torch.ones(4, 48), 16, torch.bfloat16)
    with pytest.raises(ValueError, match=r"cache_group G=20 for C=48 channels: expected a "
                                         r"divisor of C=48 that is a multiple of the NME's 8"):
        drv.store_int8("a", q, s, 20)
    with pytest.raises(ValueError, match=r"G=12 for C=48"):
        drv.store_int8("a", q, s, 12)
    with pytest.raises(ValueError, match=r"scale has shape \[4, 3\], expected \[T, C/G\] = "
                                         r"\[4, 6\]"):
        drv.store_int8("a", q, s, 8)
    with pytest.raises(ValueError, match="expected torch.int8"):
        drv.store_int8("a", q.float(), s, 16)
    drv.store_int8("a", q, s, 16)
    drv.store("b", torch.ones(4, 48, dtype=torch.bfloat16))
    g = torch.ones(48, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"mix cache formats \['bf16', 'int8 G=16'\]"):
        drv.segment(torch.zeros(4, 48, dtype=torch.bfloat16), [g, g], ["a", "b"])
