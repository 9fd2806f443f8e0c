"""The NME's cycle model: cycles of one program on :class:`coda.hw.nme.top.NME`, derived from its
RTL and kept exact against it (``tests/hw/test_nme_cycles.py`` re-measures the Verilated NME).

It lives beside the RTL it models so that a pipeline change in ``hw/`` and its cycle model
change together.
"""

from __future__ import annotations

import numpy as np

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, Status, UOp, validate
from coda.hw.nme.check import stores_may_trail
from coda.hw.nme.iface import LaneTiming, read_credits

__all__ = ["model_cycles"]


# Cycle costs of the NME RTL (hw/nme/top.py), read off the FSMs of its units (``intake``: IDLE,
# LOAD; ``check``: V_*; ``execute``: X_*, the hand-overs between them one cycle each, as one
# sequence; ``issue``: I_*, read requests ahead of execution) and its FIFOs; model_cycles says
# where each one is spent. Checked exactly against RTLBackend counts (tests/hw/test_nme_cycles.py).
V_LEN_CYCLES = 1             # V_LEN: header length checks
BAD_LENGTH_REJECT_CYCLES = 1 # V_DIV's first cycle rejects a BAD_LENGTH program
DIV_CYCLES_POW2 = 1          # V_DIV for lanes a power of two: W = ceil(N/L) by a shift
DIV_CYCLES = 33              # V_DIV otherwise: restoring divider, 32 quotient bits + 1
CHECK_CYCLES_PER_UOP = 3     # V_FETCH, V_CHECK, V_DECIDE
GROUP_NEXT_CYCLES = 1        # V_NEXT after a scaled GROUP's multiply (V_GROUP)
V_END_CYCLES = 1             # V_END: stream count, start of execution
EXEC_START_CYCLES = 2        # X_BLOCK, X_FETCH (first block only; later blocks follow X_END)
END_CYCLES = 2               # after a pass's last word entered (or drained): the cycle
                             # X_RUN sees it, X_END
LOAD_CYCLES = 1              # X_LOAD: the next micro-op's fields (X_RUN follows)
STORE_PASS_EXTRA = 2         # store FIFO (1) and request register (1) before the last write
STORES_LEFT_CYCLES = 3       # a drained pass's X_END after the last store's request cycle:
                             # its transfer, the store credit back, X_RUN sees none in use
FIFO_READ_CYCLES = 2         # read response -> SyncFIFOBuffered output (r_rdy)
ISSUE_BUF_PASS_CYCLES = 4    # issue side over a pass with no read: I_FETCH, I_LOAD, I_RUN, I_END
ISSUE_HANDOVER_MIN_WORDS = 3 # a read pass hands over at its last read from this block length
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


def _overlaps(t: LaneTiming, u: UOp, blen: int, last: bool, trail: bool) -> bool:
    """Does a pass hand over to the next one as its last word enters, without draining the
    lanes (X_RUN of hw/nme/execute.py)? Yes unless it stores in a program whose stores may not
    trail (``trail``), accumulates L1, is the program's last pass, or its block is not longer
    than the pipeline up to the result stage."""
    return not ((u.store and not trail) or u.op == Op.L1 or last or blen <= t.result_stage)


def _after_stores(issue: np.ndarray, slots: list) -> np.ndarray:
    """Read request cycles ``issue`` (increasing) moved past the cycles in which a store
    holds the request register (``slots``: increasing, disjoint ``(first, last)`` cycle
    intervals): stores go first, a read waits for the next free cycle, later reads follow
    one per cycle."""
    for first, last in slots:
        i = int(np.searchsorted(issue, first))
        if i < len(issue) and issue[i] <= last:
            issue[i:] = np.maximum(issue[i:], last + 1 + np.arange(len(issue) - i))
    return issue


def _walk_cycles(cfg: NMEConfig, uops: tuple, n_words: int, v_end: int, latency: int,
                 jump: bool = True, trail: bool = False) -> int:
    """Cycle of the last X_END, from the execute and issue FSMs word by word (numpy: one
    step per pass).

    Execution: each pass takes its words one per cycle (an L1 pass one per ``g = l1_gap``)
    from its first cycle on, a read pass each word once its response is out of the response
    FIFO. A pass that overlaps the next (:func:`_overlaps`) hands over as its last word
    enters: the next pass's words may enter from the next cycle on. Any other pass drains:
    X_END is ``2 + drain`` cycles after the last word's entry (a store pass 2 more; any
    pass at least 3 after the last store's request), the next X_LOAD one after, the next
    pass's first cycle one after that. A store word holds the memory request register
    ``result_stage + 1`` cycles after its entry; reads wait for those cycles
    (:func:`_after_stores`).

    The issue side: I_FETCH, I_LOAD, then the reads of a read pass one per cycle; a read
    pass over at least :data:`ISSUE_HANDOVER_MIN_WORDS` words that is not the walk's last
    hands over as its last read goes out (the next pass's first read may go out in the next
    cycle), any other ends X_END-like ``+ 3`` after its last read (and an I_BLOCK at a
    block's end). Where the program's stores may trail (``trail``:
    :func:`coda.hw.nme.check.stores_may_trail`) it visits only the passes that read, and
    execution's store passes hand over like the others; otherwise it takes 4 cycles for a
    pass without reads, and at a store pass it waits for execution's X_END (memory order).
    Its m-th read of the program may go out only one cycle after execution took read
    ``m - RF`` (``RF = max(D, 3) + result_stage`` response-FIFO entries). Sequences of one
    word per cycle are running maxima: ``t_j = j + max_{i<=j}(earliest_i - i)`` (``g*j``
    for L1).

    Blocks of ``D`` words repeat: where the state at a block's start (the issue side's, the
    recent reads' and the pending stores' cycles relative to the block's first pass)
    recurs, every later block up to the last one repeats the same cycles, so the walk jumps
    over them (exact; a program of 10^6 words costs a few blocks' steps). ``jump=False``
    walks every block (the tests compare).
    """
    depth = cfg.depth
    t = LaneTiming.of(cfg)
    credits = read_credits(cfg)
    recent = np.zeros(0, dtype=np.int64)    # take cycles of the last `credits` reads
    slots: list = []                        # (first, last) cycles of store passes' requests
    # the issue side's last pass of a block: the last micro-op, or with trailing stores the
    # last one that reads (it visits only those)
    last_visit = max((i for i, u in enumerate(uops) if u.rsrc != RSrc.BUF or not trail),
                     default=len(uops) - 1)
    i_fast = False
    fetch, x_run = v_end + 2, v_end + 4     # I_FETCH and first X_RUN cycle of the first pass
    x_end = 0
    blocks = -(-n_words // depth)
    seen: dict = {}
    b = 0
    while b < blocks:
        base = b * depth
        blen = min(depth, n_words - base)
        slots = [s for s in slots if s[1] >= fetch + 2]    # reads go out from fetch + 2
        if jump and 0 < b < blocks - 1:
            key = (fetch - x_run, tuple(recent - x_run),
                   tuple((s0 - x_run, s1 - x_run) for s0, s1 in slots))
            if key in seen:                 # the same start as block b0: a period
                b0, x0 = seen.pop(key)
                period, shift = b - b0, x_run - x0
                periods = (blocks - 1 - b) // period
                if periods:
                    b += periods * period
                    fetch, x_run = fetch + periods * shift, x_run + periods * shift
                    recent = recent + periods * shift
                    slots = [(s0 + periods * shift, s1 + periods * shift) for s0, s1 in slots]
                    continue
            else:
                seen[key] = (b, x_run)
        for i, u in enumerate(uops):
            j = np.arange(blen)
            gap = t.l1_gap if u.op == Op.L1 else 1
            last = b == blocks - 1 and i == len(uops) - 1
            overlap = _overlaps(t, u, blen, last, trail)
            # X_END is this many cycles after the last word's entry (a drained pass)
            after = t.drain_stage(u.op == Op.L1) + END_CYCLES
            if u.rsrc != RSrc.BUF:
                # read j's credit comes back one cycle after the take of the read `credits`
                # before it (blen <= credits, so that one is among the recent ones)
                m = len(recent) + j - credits
                earliest = np.full(blen, fetch + 2, dtype=np.int64)
                freed = m >= 0
                earliest[freed] = np.maximum(earliest[freed], recent[m[freed]] + 1)
                issue = _after_stores(j + np.maximum.accumulate(earliest - j), slots)
                ready = issue + 1 + latency + FIFO_READ_CYCLES
                take = gap * j + np.maximum.accumulate(np.maximum(ready, x_run) - gap * j)
                recent = np.concatenate([recent, take])[-credits:]
                last_in = int(take[-1])
                # the issue side hands over as the last read goes out (the next I_RUN in
                # the next cycle), or I_END, I_FETCH follow
                i_fast = blen >= ISSUE_HANDOVER_MIN_WORDS and not (
                    b == blocks - 1 and i == last_visit)
                fetch = int(issue[-1]) + (-1 if i_fast else 3)
            else:
                i_fast = i_fast and trail       # a walk of the reading passes skips it
                last_in = x_run + (blen - 1) * gap
            if u.store:
                first = x_run + t.result_stage + 1
                slots.append((first, first + blen - 1))
                x_end = last_in + after + STORE_PASS_EXTRA
                if not trail:
                    fetch = max(fetch + 2, x_end + 1) + 2
            elif u.rsrc == RSrc.BUF and not trail:
                fetch += ISSUE_BUF_PASS_CYCLES
            if overlap:
                x_run = last_in + 1
            else:
                if not u.store:
                    x_end = last_in + after
                if slots:                   # and the stores so far have left
                    x_end = max(x_end, slots[-1][1] + STORES_LEFT_CYCLES)
                x_run = x_end + LOAD_CYCLES + 1
        if not i_fast:
            fetch += 1                      # I_BLOCK of the next block
        b += 1
    return x_end


def model_cycles(cfg: NMEConfig, program: Program, status: Status, mem_latency: int = 1) -> int:
    """Cycle count of one program on the NME (hw/nme/top.py), in NME clock cycles from the header
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
    - accepted: ``n + 5 + div + sum_i(3 + g_i) + 2`` to the first X_LOAD, then the passes
      as execution and the issue side take them (:func:`_walk_cycles`): a pass takes one
      word per cycle (an L1 pass one per ``la + 1``, ``la = cfg.add_latency``); it hands
      over to the next pass as its last word enters (no store unless the program's stores
      may trail, :func:`coda.hw.nme.check.stores_may_trail`; no L1, not the last pass, a
      block of more than ``LaneTiming.result_stage`` words), else it ends 3 cycles after
      the lanes drained (``result_stage``: ``3 + operand_latency + lm + la``; an L1 pass to
      the stage before its accumulate; a store pass 2 more for its last request; any pass
      3 cycles after the last store's request) and the next one starts 2 cycles later; a
      read pass waits for its responses (the issue side runs ahead: a read pass one read
      per cycle, handing over at its last read when its block has at least 3 words, else
      4 cycles more; where the stores may trail it skips every pass without reads, else
      it takes 4 cycles per such pass and holds at a store pass until execution finished
      it; it has at most ``max(D, 3) + result_stage`` reads not yet taken, and leaves the
      request register to the stores: a store word's request goes out
      ``result_stage + 1`` cycles after its entry); then ``+ L (la + 1)`` if there is an
      L1 micro-op (lanes summed in order), ``+ 1`` (FINISH).

    Agreement with the Verilated RTL (tests/hw/test_nme_cycles.py: 88 programs per configuration,
    every compiled operator, both formats, lanes 2/3/8, depth 3/4/5/64, all error classes,
    combinational and pipelined units): exact at memory latency 1, 4 and 20;
    tests/hw/test_nme_sim_timing.py checks lanes 1/2/5 at depth 1/2 exactly against the amaranth.sim
    NME at latency 1. DRAM stalls (``mem_req_ready`` low, late responses) are not modelled.

    Args:
        cfg: the NME configuration.
        program: the program (its micro-ops as :class:`coda.hw.nme.isa.UOp`).
        status: the program's :class:`coda.hw.nme.isa.Status` (from :func:`coda.hw.nme.isa.validate`).
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
    l1_sum = cfg.lanes * t.sum_cycles_per_lane if any(u.op == Op.L1 for u in uops) else 0
    v_end = cycles - EXEC_START_CYCLES - 1
    trail = cfg.trail_stores and stores_may_trail(uops, n_words)
    return (_walk_cycles(cfg, uops, n_words, v_end, mem_latency, trail=trail) + 1 + l1_sum
            + FINISH_CYCLES)
