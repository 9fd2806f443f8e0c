"""The NME's cycle model: cycles of one program on :class:`coda.hw.nme.NME`, derived from its
RTL and kept exact against it (``tests/test_interp.py`` re-measures the Verilated NME).

It lives beside the RTL it models so that a pipeline change in ``hw/`` and its cycle model
change together.
"""

from __future__ import annotations

import numpy as np

from .isa import NMEConfig, Op, Program, RSrc, Status, UOp, validate
from .nme_iface import LaneTiming

__all__ = ["model_cycles"]


# Cycle costs of the NME RTL (hw/nme.py), read off the FSMs of its units (``intake``: IDLE,
# LOAD; ``check``: V_*; ``execute``: X_*, the hand-overs between them one cycle each, as one
# sequence; ``issue``: I_*, read requests ahead of execution) and its FIFOs; model_cycles says
# where each one is spent. Checked exactly against RTLBackend counts (tests/test_interp.py).
V_LEN_CYCLES = 1             # V_LEN: header length checks
BAD_LENGTH_REJECT_CYCLES = 1 # V_DIV's first cycle rejects a BAD_LENGTH program
DIV_CYCLES_POW2 = 1          # V_DIV for lanes a power of two: W = ceil(N/L) by a shift
DIV_CYCLES = 33              # V_DIV otherwise: restoring divider, 32 quotient bits + 1
CHECK_CYCLES_PER_UOP = 3     # V_FETCH, V_CHECK, V_DECIDE
GROUP_NEXT_CYCLES = 1        # V_NEXT after a scaled GROUP's multiply (V_GROUP)
V_END_CYCLES = 1             # V_END: stream count, start of execution
EXEC_START_CYCLES = 2        # X_BLOCK, X_FETCH (first block only; later blocks follow X_END)
PASS_CYCLES = 4              # X_LOAD, X_END, and the cycles after the last word's entry and
                             # after its drain stage; plus the words' span and the drain
                             # stage (_pass_cycles: blen + 6 with combinational units)
STORE_PASS_EXTRA = 2         # store FIFO (1) and request register (1) before the last write
FIFO_READ_CYCLES = 2         # read response -> SyncFIFOBuffered output (r_rdy)
ISSUE_BUF_PASS_CYCLES = 4    # issue side over a pass with no read: I_FETCH, I_LOAD, I_RUN, I_END
FINISH_CYCLES = 1            # FINISH: the done pulse
FAIL_CHECK_CYCLES = 3        # V_FETCH, V_CHECK, V_DECIDE of the micro-op that fails


def _div_cycles(cfg: NMEConfig) -> int:
    return DIV_CYCLES_POW2 if cfg.lanes & (cfg.lanes - 1) == 0 else DIV_CYCLES


def _multiply_cycles(cfg: NMEConfig, u: UOp) -> int:
    """V_GROUP: shift-add multiply of ``param * lanes``, one cycle per bit, one to decide
    (0 for a micro-op that is not a scaled GROUP)."""
    if u.rsrc != RSrc.GROUP or u.param == 0:
        return 0
    return (u.param * cfg.lanes).bit_length() + 1


def _group_cycles(cfg: NMEConfig, u: UOp) -> int:
    """Check cycles of a scaled GROUP that passes beyond the other micro-ops' 3: its
    multiply (V_GROUP) and V_NEXT."""
    g = _multiply_cycles(cfg, u)
    return g + GROUP_NEXT_CYCLES if g else 0


def _first_bad_uop(cfg: NMEConfig, program: Program) -> int:
    """Index of the micro-op whose check fails (opcode, operand or address rule)."""
    words = program.words()[1:]
    for k in range(len(words)):
        if validate(k + 1, program.n_elems, words[:k + 1], cfg) in (
                Status.BAD_OPCODE, Status.BAD_OPERAND, Status.BAD_ADDR):
            return k
    raise ValueError("no micro-op of the program fails its check")


def _reject_cycles(cfg: NMEConfig, program: Program, status: Status) -> int:
    n = len(program.uops)
    intake = 1 + n
    if status == Status.BAD_LENGTH:
        return intake + V_LEN_CYCLES + BAD_LENGTH_REJECT_CYCLES + FINISH_CYCLES
    check = intake + V_LEN_CYCLES + _div_cycles(cfg)
    if status == Status.TOO_MANY_STREAMS:
        return (check + sum(CHECK_CYCLES_PER_UOP + _group_cycles(cfg, u) for u in program.uops)
                + V_END_CYCLES + FINISH_CYCLES)
    k = _first_bad_uop(cfg, program)
    bad = program.uops[k]
    # a scaled GROUP whose start address is in memory fails after its multiply (V_GROUP)
    late = (status == Status.BAD_ADDR and bad.rsrc == RSrc.GROUP and bad.param != 0
            and bad.addr < cfg.mem_words)
    return (check + sum(CHECK_CYCLES_PER_UOP + _group_cycles(cfg, u) for u in program.uops[:k])
            + FAIL_CHECK_CYCLES + (_multiply_cycles(cfg, bad) if late else 0) + FINISH_CYCLES)


def _pass_cycles(t: LaneTiming, u: UOp, blen: int) -> int:
    """X_LOAD to the next X_LOAD of a pass of ``blen`` words that never waits for a read:
    the words enter one per cycle (one per ``l1_gap`` for L1), X_RUN ends the cycle after
    the last word has left the drain stage (:meth:`LaneTiming.drain_stage`); a store pass
    waits 2 more for its last request (store FIFO and request register)."""
    l1 = u.op == Op.L1
    gap = t.l1_gap if l1 else 1
    return ((blen - 1) * gap + t.drain_stage(l1) + PASS_CYCLES
            + (STORE_PASS_EXTRA if u.store else 0))


def _sync_stalls(t: LaneTiming, uops: tuple, blen: int, next_blen: int | None,
                 latency: int) -> int:
    """Execution stall (cycles) of the first read pass after each store pass of one block.

    The issue side holds at a store pass until execution has finished it (X_END), then needs
    I_END, [I_BLOCK,] and per pass without a read 4 cycles, then I_FETCH, I_LOAD before its
    first request; the data reaches the lanes ``1 + latency + FIFO_READ_CYCLES`` later.
    Execution meanwhile starts the next passes at once (:func:`_pass_cycles` each).
    """
    total = 0
    walk = [(u, blen, 0) for u in uops]
    if next_blen is not None:
        walk += [(u, next_blen, 1) for u in uops]
    for i, u in enumerate(uops):
        if not u.store:
            continue
        # cycles after the store's X_END: the issue side sees it one cycle later, then
        # I_END; execution goes X_LOAD, X_RUN at once
        issue, x_run = 3, 2
        for v, bl, crossed in walk[i + 1:]:
            if v.store:
                break
            if v.rsrc != RSrc.BUF:
                first_read = issue + crossed + 2               # [I_BLOCK,] I_FETCH, I_LOAD
                ready = first_read + 1 + latency + FIFO_READ_CYCLES
                total += max(0, ready - x_run)
                break
            issue += ISSUE_BUF_PASS_CYCLES
            x_run += _pass_cycles(t, v, bl)
    return total


def _walk_cycles(cfg: NMEConfig, uops: tuple, n_words: int, v_end: int, latency: int) -> int:
    """Index of the last X_END, from the execute and issue FSMs word by word (O(passes)
    numpy steps).

    Used where the read credits may hold the issue side back (``latency > blen + 2``): the
    issue side's m-th read of the program may go out only one cycle after execution took
    read ``m - RF`` (``RF = max(D, 3)`` response-FIFO entries). Sequences of one word per
    cycle are running maxima: ``t_j = j + max_{i<=j}(earliest_i - i)`` (an L1 pass takes one
    word per ``g = l1_gap`` cycles: ``t_j = g*j + max_{i<=j}(earliest_i - g*i)``). Cost: one
    numpy step
    per pass (tens of microseconds), e.g. about 10 s for 100 000 words x 18 micro-ops at
    depth 4.
    """
    depth = cfg.depth
    t = LaneTiming.of(cfg)
    credits = max(depth, 3)
    recent = np.zeros(0, dtype=np.int64)    # take cycles of the last `credits` reads
    fetch, x_load = v_end + 2, v_end + 3    # I_FETCH and X_LOAD of the first pass
    x_end = 0
    for base in range(0, n_words, depth):
        blen = min(depth, n_words - base)
        if base:
            fetch += 1                      # I_BLOCK
        for u in uops:
            x_run = x_load + 1
            j = np.arange(blen)
            l1 = u.op == Op.L1
            gap = t.l1_gap if l1 else 1
            # X_END is this many cycles after the last word's entry (see _pass_cycles)
            after = t.drain_stage(l1) + 2
            if u.rsrc != RSrc.BUF:
                # read j's credit comes back one cycle after the take of the read `credits`
                # before it (blen <= credits, so that one is among the recent ones)
                m = len(recent) + j - credits
                earliest = np.full(blen, fetch + 2, dtype=np.int64)
                freed = m >= 0
                earliest[freed] = np.maximum(earliest[freed], recent[m[freed]] + 1)
                issue = j + np.maximum.accumulate(earliest - j)
                ready = issue + 1 + latency + FIFO_READ_CYCLES
                take = gap * j + np.maximum.accumulate(np.maximum(ready, x_run) - gap * j)
                recent = np.concatenate([recent, take])[-credits:]
                x_end = int(take[-1]) + after
                fetch = int(issue[-1]) + 3
            elif u.store:
                x_end = x_run + (blen - 1) * gap + after + STORE_PASS_EXTRA
                fetch = max(fetch + 2, x_end + 1) + 2
            else:
                x_end = x_run + (blen - 1) * gap + after
                fetch += ISSUE_BUF_PASS_CYCLES
            x_load = x_end + 1
    return x_end


def model_cycles(cfg: NMEConfig, program: Program, status: Status, mem_latency: int = 1) -> int:
    """Cycle count of one program on the NME (hw/nme.py), in NME clock cycles from the header
    being presented to ``done`` inclusive, with a memory that is always ready and answers
    every read ``mem_latency`` cycles after accepting it.

    Derived from the RTL (n = micro-ops, L = lanes, D = depth, W = ceil(N/L) words in
    blocks of ``blen <= D`` words; constants above):

    - intake: ``1 + n`` (header, one micro-op word per cycle);
    - rejected: BAD_LENGTH ``n + 4``; a failing micro-op ``k``: ``n + 6 + div +
      sum_{i<k}(3 + g_i)`` (``+ g_k - 1`` when a scaled GROUP fails its multiply);
      TOO_MANY_STREAMS ``n + 4 + div + sum_i(3 + g_i)``; ``div`` = 1 (L a power of two)
      or 33 (divider), ``g_i = bitlen(param*L) + 2`` for a scaled GROUP micro-op (its
      multiply and V_NEXT), else 0;
    - accepted: ``n + 5 + div + sum_i(3 + g_i) + 2`` to the first X_LOAD, then each pass
      ``blen + 6 + lm + la`` (X_LOAD, one word per cycle, the lane pipeline's drain: 4
      cycles with combinational units, one more per register stage of FPMul (``lm =
      cfg.mul_latency``) and of FPAdd (``la = cfg.add_latency``); X_END), ``+ 2`` for a
      store pass (store FIFO and request register before the last write); an L1 pass
      ``(blen - 1)(la + 1) + 7 + max(lm + la, 2 la)`` (one word per ``la + 1`` cycles,
      the fp32 subtract and accumulate); ``+ L (la + 1)`` if there is an L1 micro-op
      (lanes summed in order), ``+ 1`` (FINISH);
    - read stalls: the issue side runs ahead of execution (reads of the next passes go out
      during the current one, ``blen + 4`` cycles per read pass, 4 per other pass), so a
      read pass waits only where the issue side had to wait: the program's first pass
      (a read: ``3 + latency`` cycles), and the first read pass after each store pass
      (the issue side holds at a store until its last write): ``6 + latency`` cycles,
      ``+ 1`` if it starts the next block, ``+ 4 - pass`` per pass without a read
      in between (``pass`` its cycles above), never below 0;
    - read credits: the issue side may have at most ``max(D, 3)`` reads not yet taken by
      execution. That never delays a read pass while ``latency <= blen + 2`` (the closed
      form above); for longer latencies the model follows execution and the issue side word by word
      (:func:`_walk_cycles`, the same cycle costs plus the credit rule), which equals the
      closed form wherever both apply.

    Agreement with the Verilated RTL (tests/test_interp.py: 304 programs, every compiled
    operator, both formats, lanes 2/3/8, depth 3/4/5/64, all error classes): exact at memory
    latency 1, 4 and 20 (closed form at 1 and 4, the walk at 20 for depth <= 5);
    tests/test_nme_sim.py checks lanes 1/2/5 at depth 1/2 exactly against the amaranth.sim
    NME at latency 1; both include NMEs with pipelined units (``mul_latency``,
    ``add_latency``). DRAM stalls (``mem_req_ready`` low, late responses) are not modelled.

    Args:
        cfg: the NME configuration.
        program: the program (its micro-ops as :class:`coda.hw.isa.UOp`).
        status: the program's :class:`coda.hw.isa.Status` (from :func:`coda.hw.isa.validate`).
        mem_latency: memory read latency in cycles (>= 1).
    Returns:
        Cycles (int).
    """
    if status != Status.OK:
        return _reject_cycles(cfg, program, status)
    uops = program.uops
    n = len(uops)
    t = LaneTiming.of(cfg)
    cycles = (1 + n + V_LEN_CYCLES + _div_cycles(cfg)
              + sum(CHECK_CYCLES_PER_UOP + _group_cycles(cfg, u) for u in uops)
              + V_END_CYCLES + EXEC_START_CYCLES)
    n_words = -(-program.n_elems // cfg.lanes)
    blocks = -(-n_words // cfg.depth)
    last = n_words - (blocks - 1) * cfg.depth
    l1_sum = cfg.lanes * t.sum_cycles_per_lane if any(u.op == Op.L1 for u in uops) else 0
    if mem_latency > min(cfg.depth, last) + 2:   # read credits may bind: walk the words
        v_end = cycles - EXEC_START_CYCLES - 1
        return _walk_cycles(cfg, uops, n_words, v_end, mem_latency) + 1 + l1_sum + FINISH_CYCLES
    cycles += sum((blocks - 1) * _pass_cycles(t, u, cfg.depth) + _pass_cycles(t, u, last)
                  for u in uops)
    cycles += 1 + mem_latency + FIFO_READ_CYCLES      # the first pass reads: nothing ahead
    if blocks == 1:
        cycles += _sync_stalls(t, uops, last, None, mem_latency)
    else:
        cycles += (blocks - 2) * _sync_stalls(t, uops, cfg.depth, cfg.depth, mem_latency)
        cycles += _sync_stalls(t, uops, cfg.depth, last, mem_latency)
        cycles += _sync_stalls(t, uops, last, None, mem_latency)
    return cycles + l1_sum + FINISH_CYCLES
