"""NME in amaranth.sim (tests/nme_sim_harness.py): reset in mid-program, operand isolation
and its toggle counter, pipelined units (same bits, more cycles), store backpressure and
memory latency, and the cycle model against the NME's cycles."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import numpy as np
import pytest

from coda.hw.nme.isa import (MAX_ADD_LATENCY, MAX_MUL_LATENCY, MAX_OPERAND_LATENCY, NME_PRESETS,
                             NMEConfig, Op, Program, RSrc, Status, UOp)
from nme_sim_harness import (ALWAYS_READY_1CYCLE, SMALL, MemTiming, _canon_nan, _random_program,
                             check, random_image, reference, simulate)


# ---------------------------------------------------------------------------------------
# reset, stalls, operand isolation, cycles
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reset_at", [2, 14, 40])
def test_reset_mid_program(reset_at):
    """rst during intake / check / execution: no write afterwards, stale read data dropped,
    the next program correct."""
    cfg = NMEConfig(lanes=2, fmt="bf16", **SMALL)
    mem = random_image(cfg, 13)
    victim = Program(2 * 12, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                              UOp(Op.MUL, RSrc.MEM, d=0, p=0, addr=12),
                              UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=48)))
    good = Program(2 * 10 - 1, (UOp(Op.MOV, RSrc.MEM, d=1, addr=24),
                                UOp(Op.SUB, RSrc.MEM, d=2, p=1, addr=0),
                                UOp(Op.MOV, RSrc.BUF, store=True, r=2, addr=36)))
    slow = MemTiming(lat_min=30, lat_max=45, p_ready=0.8, p_gap=0.1)
    got, outcomes, log = simulate(cfg, [victim.words(), good.words()], mem, seed=reset_at,
                                  timing=slow, reset_after={0: reset_at})
    assert outcomes[0] is None and outcomes[1].status == Status.OK
    assert log["writes_after_reset"] == len(range(36, 46))     # only the good program's
    want, _, _ = reference(cfg, good, mem)
    np.testing.assert_array_equal(got[36:46], want[36:46])


def test_operand_isolation_toggles():
    """Isolation on: a MOV-only program toggles no FU operand register, and an ADD program
    toggles fewer bits than with isolation off; results are identical."""
    progs = [Program(2 * 7 - 1, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                 UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=40))),
             Program(2 * 7 - 1, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                 UOp(Op.ADD, RSrc.MEM, d=1, p=0, addr=20),
                                 UOp(Op.MOV, RSrc.BUF, store=True, r=1, addr=40)))]
    runs = {}
    for iso in (True, False):
        cfg = NMEConfig(lanes=2, fmt="fp16", operand_isolation=iso, **SMALL)
        runs[iso] = check(cfg, progs, random_image(cfg, 14), seed=5)
    (mem_on, (mov_on, add_on)), (mem_off, (mov_off, add_off)) = runs[True], runs[False]
    np.testing.assert_array_equal(mem_on, mem_off)
    assert mov_on.toggles == 0 < mov_off.toggles
    assert 0 < add_on.toggles < add_off.toggles - mov_off.toggles


def test_toggle_measurement_is_an_option_that_changes_nothing_else():
    """The toggle counter is simulation-only: without ``measure_toggles`` the NME has no
    ``dbg_fu_toggles`` (nor the lanes' shadow registers) and gives the same bits, statuses,
    L1 sums and cycles under the same random memory timing."""
    cfg = NMEConfig(lanes=3, fmt="bf16", **SMALL)
    rng = random.Random(21)
    progs = [_random_program(rng, cfg).words() for _ in range(4)]
    mem = random_image(cfg, 21)
    runs = [simulate(cfg, progs, mem, seed=21, measure_toggles=on) for on in (True, False)]
    (mem_on, outs_on, _), (mem_off, outs_off, _) = runs
    np.testing.assert_array_equal(mem_on, mem_off)
    assert [(o.status, o.l1, o.cycles) for o in outs_on] == \
        [(o.status, o.l1, o.cycles) for o in outs_off]
    assert sum(o.toggles for o in outs_on) > 0 == sum(o.toggles for o in outs_off)


#: ``make test``: every mul_latency and every add_latency once (a diagonal through the
#: grid), the deepest multiplier with the combinational adder, the operand stage alone, with
#: the shortest and with the deepest units; ``make verify-long``: half the (lm, la) grid
#: (every lm and la with every parity of the other)
_FAST_GRID = ([(k % (MAX_MUL_LATENCY + 1), k, 0) for k in range(1, MAX_ADD_LATENCY + 1)]
              + [(MAX_MUL_LATENCY, 0, 0), (0, 0, 1), (1, 1, 1),
                 (MAX_MUL_LATENCY, MAX_ADD_LATENCY, MAX_OPERAND_LATENCY)])
_HALF_GRID = ([(lm, la, 0) for lm in range(MAX_MUL_LATENCY + 1)
               for la in range(MAX_ADD_LATENCY + 1) if (lm or la) and (lm + la) % 2 == 0]
              + [(0, 0, 1), (1, 1, 1), (MAX_MUL_LATENCY, MAX_ADD_LATENCY, MAX_OPERAND_LATENCY)])


@pytest.mark.parametrize("grid", [pytest.param(_FAST_GRID, id="diagonal"),
                                  pytest.param(_HALF_GRID, id="half-grid",
                                               marks=pytest.mark.slow)])
def test_pipelined_units_change_no_bits(grid):
    """Every (mul_latency, add_latency, operand_latency) of ``grid`` gives the
    combinational NME's memory bits, statuses, L1 sums and toggle counts under the same random
    memory timing (stalls on both sides); only the cycles differ: never downwards with a
    memory that is always ready (with random stalls a deeper pipeline meets other stalls, so
    it may finish a few cycles sooner)."""
    rng = random.Random(31)
    # the reference: the combinational units (no register stage), named (the default NME is
    # the timing-closed preset)
    base = NMEConfig(lanes=2, fmt="fp16", **SMALL, **NME_PRESETS["combinational"].units())
    progs = [_random_program(rng, base).words() for _ in range(4)]
    progs.append(Program(2 * 9 - 1, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                     UOp(Op.L1, RSrc.MEM, p=0, addr=20))).words())
    mem = random_image(base, 31)
    timing = MemTiming(lat_min=1, lat_max=6, p_ready=0.7, p_gap=0.3)
    ref_mem, ref_outs, _ = simulate(base, progs, mem, seed=31, timing=timing)
    ref_cycles = [o.cycles for o in simulate(base, progs, mem, timing=ALWAYS_READY_1CYCLE)[1]]
    for lm, la, lo in grid:
        cfg = replace(base, mul_latency=lm, add_latency=la, operand_latency=lo)
        got, outs, _ = simulate(cfg, progs, mem, seed=31, timing=timing)
        np.testing.assert_array_equal(got, ref_mem, err_msg=f"lm={lm} la={la} lo={lo}")
        assert [(o.status, o.l1, o.toggles) for o in outs] == \
            [(o.status, o.l1, o.toggles) for o in ref_outs], (lm, la, lo)
        cycles = [o.cycles for o in simulate(cfg, progs, mem, timing=ALWAYS_READY_1CYCLE)[1]]
        assert all(c >= r for c, r in zip(cycles, ref_cycles)), (lm, la, lo)


def test_pipeline_latency_errors():
    for bad in (-1, MAX_MUL_LATENCY + 1, 1.5, True):
        with pytest.raises(ValueError, match=f"mul_latency={bad!r}"):
            NMEConfig(mul_latency=bad)
    for bad in (-1, MAX_ADD_LATENCY + 1, "2", False):
        with pytest.raises(ValueError, match=f"add_latency={bad!r}"):
            NMEConfig(add_latency=bad)
    for bad in (-1, MAX_OPERAND_LATENCY + 1, None):
        with pytest.raises(ValueError, match=f"operand_latency={bad!r}"):
            NMEConfig(operand_latency=bad)


@pytest.mark.parametrize("trail", [False, True])
def test_store_backpressure_and_latency(trail):
    """Long store pass against a memory that is rarely ready, with long read latency (with
    ``trail_stores``: the store passes hand over and the stores trail the next block's
    reads)."""
    cfg = NMEConfig(lanes=2, fmt="bf16", depth=16, nbuf=2, imem_depth=4, max_streams=4,
                    mem_words=96, trail_stores=trail)
    prog = Program(2 * 30, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                            UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=40)))
    check(cfg, [prog], random_image(cfg, 15), timing=MemTiming(3, 12, 0.25, 0.3))


def test_gated_residual_cycles_1000_elements():
    """Default config, always-ready memory: y = x + g*c over 1000 elements (C = 40 channels)
    runs one word per cycle per pass plus per-pass overhead; a 20-cycle read latency costs
    about once per block (2 blocks), not once per pass (the issue side reads ahead)."""
    cfg = NMEConfig()
    mem = random_image(cfg, 16)
    prog = Program(1000, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                          UOp(Op.MOV, RSrc.CHAN, d=1, addr=400, param=5),
                          UOp(Op.MAC, RSrc.MEM, d=0, p=0, q=1, addr=200),
                          UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=1000)))
    t0 = time.perf_counter()
    _, (fast,) = check(cfg, [prog], mem, timing=ALWAYS_READY_1CYCLE)
    _, (slow,) = check(cfg, [prog], mem, timing=MemTiming(20, 20, 1.0, 0.0))
    words, passes, blocks = 125, 4 * 2, 2
    print(f"gated residual 1000 elems: {fast.cycles} cycles at latency 1, {slow.cycles} at "
          f"latency 20 ({4 * words} word-passes, {time.perf_counter() - t0:.1f} s sim)")
    assert 4 * words <= fast.cycles <= 4 * words + passes * 10 + 16
    assert slow.cycles - fast.cycles <= blocks * (20 + 1)


def _cycle_programs(cfg: NMEConfig) -> list[Program]:
    """Compiled operators at 1 and 2*depth+1 words, stores followed by buffer passes, and a
    few rejected programs."""
    from coda.host.nme import compiler
    L, D = cfg.lanes, cfg.depth
    progs = []
    for words in (1, 2 * D + 1):
        t, c, n = words, L, words * L
        shapes = {"add": {"a": (n,), "b": (n,)}, "scale": {"a": (t, c), "s": (c,)},
                  "gated_residual": {"x": (t, c), "g": (c,), "c": (t, c)},
                  "segment": {"x": (t, c), "g": (2, c), "c": (2, t, c)},
                  "cfg_combine": {"u": (t, c), "c": (t, c), "s": ()},
                  "l1_distance": {"a": (n,), "b": (n,)},
                  "dequant_int8": {"q": (t, 2 * c), "scale": (t, 1)}}
        for op, sh in shapes.items():
            group = 2 * L if op == "dequant_int8" else None
            layout, _ = compiler.plan_layout(op, cfg, sh, group)
            progs.append(compiler.compile_op(op, cfg, sh, layout, group))
        progs.append(Program(n - (L > 1), (
            UOp(Op.MOV, RSrc.MEM, d=0, addr=0), UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=64),
            UOp(Op.ADD, RSrc.BUF, d=1, p=0, r=0), UOp(Op.MOV, RSrc.GROUP, d=2, addr=9, param=7),
            UOp(Op.MUL, RSrc.BUF, store=True, p=1, r=2, addr=96))))
    progs += [Program(4, ()),
              Program(4, (UOp(Op.MOV, RSrc.GROUP, d=0, addr=0, param=3),
                          UOp(Op.SUB, RSrc.MEM, d=1, p=1, addr=0))),
              Program(64 * L, (UOp(Op.MOV, RSrc.GROUP, d=0, addr=cfg.mem_words - 1, param=3),))]
    return progs


@pytest.mark.parametrize("lanes,depth,fmt,lm,la", [
    (1, 1, "bf16", 0, 0), (2, 2, "fp16", 0, 0), (5, 1, "fp16", 0, 0),
    # pipelined units: the L1 path longer than the result path (la > lm) and shorter
    (2, 2, "fp16", 2, 3), (1, 1, "bf16", 3, 1), (5, 1, "fp16", 1, 4)])
def test_cycle_model_matches_the_nme(lanes, depth, fmt, lm, la):
    """coda.hw.nme.cycles.model_cycles == the NME's cycles with a 1-cycle always-ready memory,
    for configurations the Verilator cosim cannot build (lanes 1, depth <= 2: zero-width
    wires), with combinational and pipelined units (same results); tests/hw/test_nme_cycles.py
    checks the others against Verilated counts."""
    from coda.hw.nme.cycles import model_cycles
    cfg = NMEConfig(lanes=lanes, fmt=fmt, depth=depth, nbuf=4, imem_depth=8, max_streams=8,
                    mem_words=128, mul_latency=lm, add_latency=la)
    progs = _cycle_programs(cfg)
    mem = random_image(cfg, 17)
    got, outs, _ = simulate(cfg, [p.words() for p in progs], mem, timing=ALWAYS_READY_1CYCLE)
    want = mem
    for prog, out in zip(progs, outs):
        want, status, _l1 = reference(cfg, prog, want)
        assert out.status == status
    # later programs read earlier results, some inf - inf: NaNs are compared by class
    np.testing.assert_array_equal(_canon_nan(got, fmt), _canon_nan(want, fmt))
    assert {o.status for o in outs} == {Status.OK, Status.BAD_LENGTH, Status.BAD_OPERAND,
                                        Status.BAD_ADDR}
    assert [o.cycles for o in outs] == [model_cycles(cfg, p, o.status)
                                        for p, o in zip(progs, outs)]
