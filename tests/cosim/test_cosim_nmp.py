"""Multi-rank DIMM-NMP cosimulation (cocotb job server + Verilator) vs the torch reference.

One system for the whole module: 1 DIMM x 2 ranks of DDR5-4800, NMEs of 4 lanes (one 8-byte
word per NME cycle = the subchannel's peak 8 bytes per tCK), depth 32, 65536 words (512 KiB,
four DRAM rows per bank) per rank. Tensors are tiled over the two ranks with uneven splits;
the programs are long enough (tens of thousands of DRAM cycles) that refreshes (tREFI = 9360
tCK) fall inside them, and their streams cross row boundaries so that banks conflict. The
DRAM command logs of both ranks are checked by the independent JEDEC checker at the end.

The Verilator build is cached in build/cosim/nmp-<key>/ (about 3 minutes the first time).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coda.cosim.dram.check import check_file
from coda.cosim.nmp.backend import NMPRTLBackend
from coda.cosim.nmp.session import command_stream
from coda.cosim.toolchain import build_dir
from coda.host.nme import ops as ref
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, Status, UOp

CFG = NMEConfig(lanes=4, depth=32, mem_words=1 << 16)
STD = "DDR5-4800"
LOG_DIR = build_dir("cosim", "pytest", "nmp")
CMDS = LOG_DIR / "cmds.csv"


@pytest.fixture(scope="module")
def rtl():
    torch.set_num_threads(1)
    for old in LOG_DIR.glob("cmds.csv*"):
        old.unlink()
    backend = NMPRTLBackend(STD, dimms=1, ranks=2, commands=CMDS)
    yield backend
    backend.close()


def _bf16(rng: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=rng).to(torch.bfloat16)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy()


def test_command_stream_per_rank_headers():
    """Equal micro-ops, unequal lengths: one header per rank, micro-ops broadcast once; equal
    programs: one broadcast header; different micro-ops: one group per program."""
    u = (UOp(Op.MOV, RSrc.MEM, d=0, addr=0), UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=100))
    a, b = Program(10, u), Program(7, u)
    s = command_stream([a, b])
    assert [m for m, _ in s] == [1, 2, 3, 3]
    assert [w for _, w in s] == [a.words()[0], b.words()[0]] + a.words()[1:]
    assert command_stream([a, a]) == [(3, w) for w in a.words()]
    c = Program(10, u[:1] + (UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=200),))
    assert [m for m, _ in command_stream([a, c])] == [1, 1, 1, 2, 2, 2]


def test_segment_tiled_bit_exact(rtl):
    """A 4-term segment on cached slots [1001, 64] tiled 501/500 rows over the ranks: the same
    bits as the reference and as the torch backend; each rank slower than an ideal memory;
    refresh and bank conflicts happened."""
    rng = torch.Generator().manual_seed(3)
    T, C, K = 1001, 64, 4
    drivers = [NMPDriver(rtl, CFG, dimms=1, ranks=2), NMPDriver(TorchBackend(), CFG, 1, 2)]
    cs = [_bf16(rng, T, C) for _ in range(K)]
    gates = [_bf16(rng, C) for _ in range(K)]
    x = _bf16(rng, T, C)
    outs = []
    for drv in drivers:
        for k, c in enumerate(cs):
            drv.store(("c", k), c)
        outs.append(drv.segment(x, gates, [("c", k) for k in range(K)]))
    expect = ref.segment(x, torch.stack(gates), torch.stack(cs))
    assert np.array_equal(_bits(outs[0]), _bits(expect))
    assert np.array_equal(_bits(outs[0]), _bits(outs[1]))
    for k, c in enumerate(cs):
        assert np.array_equal(_bits(drivers[0].load(("c", k))), _bits(c))
    last = rtl.last
    assert last.status == [0, 0] and not last.error
    # DRAM timing: each rank is slower than the ideal 1-cycle memory is on the larger tile
    # (which rank finishes first is the DRAM's: refresh and conflicts outweigh one row)
    assert min(last.rank_cycles) > drivers[1].stats["nme_cycles"] > 15_000
    for st in last.stats:
        assert st["refreshes"] > 0, st
        assert st["row_conflicts"] > 0, st


@pytest.mark.parametrize("op", ["add", "mul", "l1_distance"])
def test_ops_tiled_bit_exact(rtl, op):
    """Elementwise operators on 31081 elements (15541 / 15540 per rank, tail words) match the
    torch backend and the reference bit for bit."""
    rng = torch.Generator().manual_seed(11)
    a, b = _bf16(rng, 31081), _bf16(rng, 31081)
    got = NMPDriver(rtl, CFG, 1, 2).run_op(op, a=a, b=b)
    want = NMPDriver(TorchBackend(), CFG, 1, 2).run_op(op, a=a, b=b)
    if op == "l1_distance":
        assert np.float32(got).view(np.uint32) == np.float32(want).view(np.uint32)
    else:
        assert np.array_equal(_bits(got), _bits(want))
        assert np.array_equal(_bits(got), _bits(getattr(ref, op)(a, b)))


def test_combined_error_and_different_programs(rtl):
    """Rank 1's program reaches past the memory (BAD_ADDR) while rank 0's runs: the combined
    error is set, per-rank statuses are exact, rank 1's memory is untouched; then ranks with
    different micro-ops (different addresses) run in one job and match the torch backend."""
    rng = np.random.default_rng(5)
    mems = [(rng.integers(0, 1 << 16, (CFG.mem_words, CFG.lanes), dtype=np.uint16) & 0x3FFF)
            | 0x3C00 for _ in range(2)]
    mems = [m.astype(np.uint16) for m in mems]
    good = Program(4 * 3000, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                              UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=3000),
                              UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=6000)))
    bad = Program(4 * 3000, good.uops[:2] + (
        UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=CFG.mem_words - 10),))
    res = rtl.execute_many(CFG, [(good, mems[0]), (bad, mems[1])])
    assert [r.status for r in res] == [Status.OK, Status.BAD_ADDR]
    assert rtl.last.error
    assert np.array_equal(res[1].mem, mems[1])
    assert np.array_equal(res[0].mem, TorchBackend().execute(CFG, good, mems[0]).mem)
    other = Program(4 * 2999 + 1, good.uops[:2] + (
        UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=40000),))
    res = rtl.execute_many(CFG, [(good, mems[0]), (other, mems[1])])
    assert not rtl.last.error
    for (p, m), r in zip([(good, mems[0]), (other, mems[1])], res):
        t = TorchBackend().execute(CFG, p, m)
        assert r.status == t.status == Status.OK
        assert np.array_equal(r.mem, t.mem)


def test_command_trace_obeys_jedec(rtl):
    """Closing the simulator flushes both ranks' command logs; the independent checker finds
    zero timing violations in either, and the logs hold REF and conflict PREs."""
    rtl.close()
    logs = [CMDS, CMDS.with_name(CMDS.name + ".c0r1")]
    for path in logs:
        text = path.read_text()
        assert ",REF," in text and ",PRE," in text and ",RD," in text and ",WR," in text
        violations = check_file(STD, path)
        assert violations == [], [str(v) for v in violations[:10]]


def test_clock_gating_changes_no_bit_and_no_cycle():
    """The ranks' NMEs run with gated lane clocks (the default); the same system built without
    gating, run from reset through the same jobs, gives the same results, L1 bits, cycles and
    DRAM counters on every operator that uses a gated register group (MUL, ADD, SUB, the L1
    accumulate, and MAC in the segment)."""
    rng = torch.Generator().manual_seed(5)
    a, b = _bf16(rng, 9001), _bf16(rng, 9001)
    cs = [_bf16(rng, 301, 64) for _ in range(3)]
    gates = [_bf16(rng, 64) for _ in range(3)]
    x = _bf16(rng, 301, 64)
    runs = []
    for gating in (True, False):
        got = []
        with NMPRTLBackend(STD, dimms=1, ranks=2, clock_gating=gating) as be:
            drv = NMPDriver(be, CFG, 1, 2)
            for k, c in enumerate(cs):
                drv.store(("c", k), c)
            for op in ("add", "sub", "mul", "l1_distance"):
                out = drv.run_op(op, a=a, b=b)
                out = np.float32(out).view(np.uint32) if op == "l1_distance" else _bits(out)
                got.append((op, out, be.last.rank_cycles, be.last.status, be.last.stats))
            out = drv.segment(x, gates, [("c", k) for k in range(3)])
            got.append(("segment", _bits(out), be.last.rank_cycles, be.last.status,
                        be.last.stats))
        runs.append(got)
    for gated, plain in zip(*runs):
        assert gated[0] == plain[0]
        assert np.array_equal(gated[1], plain[1]), gated[0]
        assert gated[2:] == plain[2:], gated[0]
    assert any(st["refreshes"] > 0 for st in runs[0][-1][4])


def test_system_shape_is_checked_before_any_build():
    """A shape the cosimulation top cannot load (its load mask holds 32 ranks) or a system
    beyond the tool's bound is refused at once, naming the shape; nothing is built."""
    from coda.cosim.nmp.build import MAX_COSIM_RANKS, build_nmp_sim
    from coda.hw.nmp import MAX_RANKS, check_shape
    assert MAX_COSIM_RANKS == 32
    with pytest.raises(ValueError, match=r"dimms=4 x ranks=9 = 36 ranks: expected at most 32"):
        NMPRTLBackend(STD, dimms=4, ranks=9)
    with pytest.raises(ValueError, match=r"dimms=0, ranks=2: expected >= 1 each"):
        build_nmp_sim(NMEConfig(lanes=8), STD, 0, 2)
    assert check_shape(16, 16) == (16, 16)
    with pytest.raises(ValueError, match=f"expected at most {MAX_RANKS}"):
        check_shape(16, 17)


@pytest.mark.parametrize("memory", ["dram", "ideal"])
def test_int8_segment_tiled_bit_exact(rtl, memory):
    """A 9-term segment on int8 cache slots [601, 64] (G = 16: four scales per token) tiled
    301/300 rows over the ranks, chained after 7 terms: the NMEs dequantise (INT8 and GROUP
    streams) with the bits of ops.segment on int8 terms and of the torch backend, behind the
    DDR5-4800 controller and on the ideal-memory Verilated NME (RTLBackend, stalls)."""
    from coda.cosim.nme.rtl_backend import RTLBackend
    from coda.host.nme.compiler import segment_terms

    rng = torch.Generator().manual_seed(5)
    T, C, K, G = 601, 64, 9, 16
    entries = [ref.quant_int8(torch.randn(T, C, generator=rng), G, torch.bfloat16)
               for _ in range(K)]
    gates = [_bf16(rng, C) for _ in range(K)]
    x = _bf16(rng, T, C)
    ideal = RTLBackend(latency=3, req_stall=0.1, rsp_stall=0.1, seed=2) if memory == "ideal" \
        else None
    try:
        drivers = [NMPDriver(ideal or rtl, CFG, dimms=1, ranks=2),
                   NMPDriver(TorchBackend(), CFG, 1, 2)]
        outs = []
        for drv in drivers:
            for k, (q, s) in enumerate(entries):
                drv.store_int8(("q", k), q, s, G)
            outs.append(drv.segment(x, gates, [("q", k) for k in range(K)]))
    finally:
        if ideal is not None:
            ideal.close()
    m = segment_terms(CFG, "segment_int8")
    want = x
    for i in range(0, K, m):
        part = entries[i:i + m]
        want = ref.segment(want, torch.stack(gates[i:i + m]), torch.stack([q for q, _ in part]),
                           torch.stack([s for _, s in part]), G)
    assert np.array_equal(_bits(outs[0]), _bits(want))
    assert np.array_equal(_bits(outs[0]), _bits(outs[1]))
    assert drivers[0].stats["programs"] == 2
    if memory == "dram":
        assert rtl.last.status == [0, 0] and not rtl.last.error


def test_rank_images_are_the_dram_devices_memories():
    """The DRAM devices keep their bursts in the rank memories the host maps: a job on rank
    1's image runs on rank 1 (rank 0 idles), its results are written into that very array
    (the torch backend's bits) and the memory lists exactly the words it stored; an image of
    the caller's own sent to rank 0, whose image the caller holds, is copied in, its result
    is a read-only copy, and rank 0's image gets its contents back."""
    rng = np.random.default_rng(9)
    prog = Program(4 * 3000, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                              UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=3000),
                              UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=6000)))
    with NMPRTLBackend(STD, dimms=1, ranks=2) as be:
        images = [be.rank_image(CFG, r) for r in range(2)]
        assert be.rank_image(CFG, 1) is images[1]
        for img in images:       # finite bf16 values in [1, 2) * 2^k
            img[:] = (rng.integers(0, 1 << 16, img.shape, dtype=np.uint16) & 0x3FFF) | 0x3C00
        before = [img.copy() for img in images]
        want = TorchBackend().execute(CFG, prog, before[1]).mem
        res = be.execute(CFG, prog, images[1])
        assert res.status == Status.OK and res.mem is images[1]
        assert np.array_equal(images[1], want) and not np.array_equal(want, before[1])
        memory = be.sessions[CFG].memories[1]
        assert memory.dirty_addrs().tolist() == list(range(6000, 9000))
        assert np.array_equal(images[0], before[0])            # rank 0 idled
        assert be.last.rank_cycles[0] > 0 and len(be.last.rank_cycles) == 1
        own = images[0].copy()
        own[:100] ^= 1
        res = be.execute(CFG, prog, own)
        assert res.mem is not images[0] and not res.mem.flags.writeable
        assert np.array_equal(res.mem, TorchBackend().execute(CFG, prog, own).mem)
        assert np.array_equal(images[0], before[0])            # given back
        with pytest.raises(ValueError, match="two jobs of one launch on the same rank image"):
            be.execute_many(CFG, [(prog, images[1]), (prog, images[1])])
