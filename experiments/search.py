"""The per-operator annealer of `coda schedule search --method anneal`: a static cache schedule by
simulated annealing over a profile (the whole-step search is :mod:`coda.experiments.step_search`).

The search space is every :class:`coda.host.cache.schedule.Schedule` of the profiled model: per
(step, CFG branch) the set of reused operators. Constraints hold by construction: exactly
``round(F * N)`` of the ``N`` operator executions are reused (the target skip fraction F),
step 0 computes everything (nothing is reused before it was computed), the branches have
schedules (and caches) of their own, and segments are cut at step ends and at Latte's
temporal position embedding (:func:`coda.host.cache.schedule.segment_runs`).

Cost (:class:`CostModel`), three terms, each divided by its value on a reference schedule
(the uniform-interval schedule closest to F) so that the weights are scale free::

    cost = Q / Q_ref + w_transfer * T / T_ref + w_mismatch * M / M_ref

- **Q, quality proxy**: per (step, operator), the error a reuse leaves in the *guided*
  prediction. A reused execution's error is the profiled relative L1 change of the
  operator's output accumulated since the step it was last computed (the cached output is
  that stale), times a per-operator weight (the output's mean magnitude relative to its
  input, from the profile: a small output changes the residual stream less) and a per-step
  weight (the profile's measured step sensitivity, smoothed: :func:`step_weights`). CFG
  combines the branches as ``g * cond + (1 - g) * uncond``, so the step's error is
  ``|g * e_cond + (1 - g) * e_uncond|`` with the guidance scale g of the profile: both
  branches' caches drift the same way (the same input, the same weights), so reusing an
  operator in both branches at once costs about one branch's error, and reusing it in one
  branch alone costs g (or g - 1) times it. Measured (``make eval`` setup, CFG 5, 0.5
  reused): the schedule annealed without this coupling, with the branches reusing apart,
  gave 34.58 dB; the same schedule with the uncond branch copying the cond branch's reuses
  37.45 dB, and the schedule annealed with it 35.31 dB. What the proxy still misses: reusing
  *all* operators of a step together is much better than mixing fresh and stale ones
  (uniform's schedule 40.50 dB; the same with half of each reused step's operators moved to
  the next step, every operator no staler than before, 35.87 dB).
- **T, transfer time** (s): per segment the host-link latency plus its bytes
  (:func:`coda.host.nmp.link.segment_bytes`: one gate vector per term and rank and the command
  words down, the result up, and x down too for ``"residual"`` segments), plus the bytes
  of every output stored for a reuse at the next step, at the link bandwidth
  (:class:`LinkModel`).
- **M, pipeline mismatch** (s): per segment, the part of its time (NME cycles of the
  compiled segment program, :func:`coda.hw.nme.cycles.model_cycles`, at the NME clock, plus
  its transfer) not covered by the *other* CFG branch's compute window at the same step and
  operator positions (CODA's CFG interleave hides a segment behind the other branch's xPU
  work). The window is a pluggable ``compute_time(op, shape) -> s``; the default counts FLOPs
  (:func:`flop_compute_time`); the system model can be plugged in.

The loop is our own Metropolis annealer (geometric cooling; a move swaps one reused execution
with one computed execution, either anywhere or next to it in step, operator or branch, or
moves an operator reused in both branches as a pair; the start is greedy, pairs first), with
incremental cost updates, seeded (``numpy.random.default_rng(seed)``): scipy's
``dual_annealing`` works on continuous boxes and ``simanneal`` has not been released since
2019, so neither fits a 2,000-bit schedule with exact-count moves.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from coda.host.nmp.link import check_segment_output, segment_bytes, tensor_bytes
from coda.host.cache.policies import check_seed, check_weight, uniform_for_skip
from coda.host.cache.schedule import ALL_OP_TYPES, BRANCHES, ModelOps, Schedule
from coda.host.cache.shipped import SHIPPED_PROFILE, save_schedule
# the proxy's weights live below the policies (LeMiCa reads them too); re-exported here
from coda.host.cache.weights import quality_weights, step_weights

__all__ = ["LinkModel", "NMEModel", "CostModel", "SearchResult", "anneal", "op_flops",
           "flop_compute_time", "segment_nme_cycles", "schedule_to_matrix", "matrix_to_schedule",
           "uniform_for_skip", "reusable_executions", "check_skip", "step_weights",
           "quality_weights"]

ComputeTime = Callable[[str, dict], float]

# ---------------------------------------------------------------- hardware models
@dataclass(frozen=True)
class LinkModel:
    """The host link (PCIe) between xPU and DIMMs.

    Attributes:
        bandwidth: bytes/s. Default 25 GB/s: PCIe 4.0 x16 measured host->device with pinned
            memory on an RTX 4090 (docs/design.md, Anchor figures: nvbandwidth issue 15; 31.5 GB/s
            theoretical).
        latency_s: fixed cost of one transfer (DMA setup + doorbell + completion), 5 us:
            an assumption of the order measured for small PCIe DMAs; replace with the system
            model's preset when it exists.
    """
    bandwidth: float = 25e9
    latency_s: float = 5e-6


@dataclass(frozen=True)
class NMEModel:
    """The NMEs that run segments: ``ranks`` ranks in lockstep, each an NME of ``lanes``
    lanes and ``depth`` words of buffer, at ``clock_hz``.

    ``clock_hz`` default 1.2 GHz: half the DDR5-4800 command clock (2.4 GHz), an assumption
    for buffer-chip logic (our ECP5 prototype closes at 24.6 MHz; an ASIC is not an FPGA)."""
    lanes: int = 8
    ranks: int = 2
    depth: int = 64
    clock_hz: float = 1.2e9
    fmt: str = "bf16"


def segment_nme_cycles(nme: NMEModel, tokens: int, channels: int, terms: int) -> int:
    """NME cycles of a segment of ``terms`` operators on the slowest rank: the programs the
    driver launches (at most 8 terms each, chained), compiled and timed by the RTL's cycle
    model."""
    from coda.host.nme.compiler import compile_op, plan_layout
    from coda.host.nme.ops import MAX_SEGMENT_TERMS
    from coda.hw.nme.isa import NMEConfig, Status
    from coda.hw.nme.cycles import model_cycles

    rows = -(-tokens // nme.ranks)                  # the largest tile (tile_bounds)
    total = 0
    left = terms
    while left > 0:
        k = min(left, MAX_SEGMENT_TERMS)
        shapes = {"x": (rows, channels), "g": (k, channels), "c": (k, rows, channels)}
        cfg = NMEConfig(lanes=nme.lanes, depth=nme.depth, fmt=nme.fmt, mem_words=1 << 24)
        prog = compile_op("segment", cfg, shapes, plan_layout("segment", cfg, shapes)[0])
        total += model_cycles(cfg, prog, Status.OK)
        left -= k
    return total


def op_flops(op: str, shape: dict) -> float:
    """Multiply-add FLOPs (2 per MAC) of one operator of one sample on the xPU: projections
    and attention products (norms, modulation and softmax are a few per element, left out).

    ``shape``: Latte's frames F, tokens_per_frame N, hidden C, ffn_inner, cond_tokens
    (:func:`coda.experiments.profile.model_shape`); another architecture's tokens (video),
    text_tokens (the text stream of a joint model), cond_tokens, hidden, ffn_inner, mlp_inner
    (:meth:`coda.experiments.cfg_loop.CFGLoop.shape`): ``attn`` is self-attention over the
    video tokens (Wan) or joint attention over video and text (CogVideoX, HunyuanVideo),
    ``ffn`` runs over both streams, ``single`` is HunyuanVideo's single-stream block (q/k/v,
    attention, ``proj_mlp`` and ``proj_out`` over the concatenated streams)."""
    c = shape["hidden"]
    if op in ("attn", "ffn", "single"):
        tt = shape["tokens"] + shape.get("text_tokens", 0)
        if op == "attn":
            return 2 * 4 * tt * c * c + 2 * 2 * tt * tt * c
        if op == "ffn":
            return 2 * 2 * tt * c * shape.get("ffn_inner", 4 * c)
        m = shape.get("mlp_inner", 4 * c)
        return 2 * 3 * tt * c * c + 2 * 2 * tt * tt * c + 2 * tt * c * m + 2 * tt * (c + m) * c
    t = shape["tokens"] if "tokens" in shape else shape["frames"] * shape["tokens_per_frame"]
    if op in ("spatial_attn", "temporal_attn"):
        f, n = shape["frames"], shape["tokens_per_frame"]
        if op == "spatial_attn":
            return 2 * 4 * t * c * c + 2 * 2 * f * n * n * c
        return 2 * 4 * t * c * c + 2 * 2 * n * f * f * c
    if op == "cross_attn":
        m = shape.get("cond_tokens", 1)
        return 2 * 2 * t * c * c + 2 * 2 * m * c * c + 2 * 2 * t * m * c
    if op in ("spatial_ffn", "temporal_ffn"):
        return 2 * 2 * t * c * shape.get("ffn_inner", 4 * c)
    raise ValueError(f"op {op!r}: expected one of {ALL_OP_TYPES}")


def flop_compute_time(op: str, shape: dict, peak_flops: float = 165e12,
                      efficiency: float = 0.4, launch_s: float = 4e-6) -> float:
    """Default compute window of one operator of one sample on the xPU (s): FLOPs at
    ``efficiency`` of ``peak_flops`` (165 TFLOPS: RTX 4090 bf16 dense, NVIDIA Ada
    whitepaper) plus ``launch_s`` per operator (a few kernel launches; assumption).
    Replace with the system model's estimate via ``CostModel(compute_time=...)``."""
    return op_flops(op, shape) / (peak_flops * efficiency) + launch_s


# ---------------------------------------------------------------- schedules as matrices
def schedule_to_matrix(s: Schedule) -> np.ndarray:
    """bool [steps, branches, operators] (True = reused), operators in forward order."""
    order = {ref: i for i, ref in enumerate(s.order())}
    m = np.zeros((s.num_steps, len(BRANCHES), len(order)), bool)
    for (step, branch), refs in s.reuse.items():
        for ref in refs:
            m[step, BRANCHES.index(branch), order[ref]] = True
    return m


def matrix_to_schedule(m: np.ndarray, num_layers: int, name: str,
                       ops: ModelOps | None = None) -> Schedule:
    """The :class:`Schedule` of a reuse matrix (:func:`schedule_to_matrix`) of the model of
    ``ops`` (default: Latte's of ``num_layers``)."""
    ops = ModelOps.latte(num_layers) if ops is None else ops
    order = ops.ops
    reuse = {(s, b): frozenset(order[i] for i in np.flatnonzero(m[s, bi]))
             for s in range(m.shape[0]) for bi, b in enumerate(BRANCHES) if m[s, bi].any()}
    return Schedule(m.shape[0], ops.num_layers, reuse, name=name, ops=ops)


# ---------------------------------------------------------------- cost model
@dataclass
class CostModel:
    """The three cost terms of a schedule matrix (see the module docstring), kept
    incrementally: per (branch, operator) row (quality, stores) and per step (segments,
    bytes, mismatch).

    Args:
        change: mean relative output change [steps, branches, ops] (step 0 ignored).
        weight: per-(branch, op) weight of the quality term [branches, ops].
        shape: the model's shapes (:func:`coda.experiments.profile.model_shape`).
        link, nme: hardware models. compute_time: the xPU window model.
        guidance_scale: CFG scale g; the quality term weighs branch ``cond`` by g and
            ``uncond`` by 1 - g (:data:`coda.host.cache.schedule.BRANCHES`), signed, per step.
        segment_output: the segments' form, ``"sum"`` (the cache engine's default) or
            ``"residual"``: their host-link bytes are :func:`coda.host.nmp.link.segment_bytes`
            (16-bit tensors tiled over ``nme.ranks`` ranks); the one-time write of a
            branch's slot of zeros (``"sum"``) does not depend on the schedule and is left
            out. Stores are :func:`coda.host.nmp.link.tensor_bytes` each.
        ops: the model's operators (default: Latte's, ``L*5`` of them); a segment ends at
            their barriers (:meth:`ModelOps.barriers` for ``shape["frames"]``, 1 if absent),
            and a joint model's segment is one NME program per residual stream (the video's
            ``shape["tokens"]`` and the text's ``shape["text_tokens"]``), as its stores.
    Raises:
        ValueError: a non-finite guidance scale, an unknown ``segment_output``, ``change``
            of another operator count than ``ops``.
    """
    change: np.ndarray
    weight: np.ndarray
    shape: dict
    guidance_scale: float
    link: LinkModel = field(default_factory=LinkModel)
    nme: NMEModel = field(default_factory=NMEModel)
    compute_time: ComputeTime = flop_compute_time
    segment_output: str = "sum"
    model_ops: ModelOps | None = None

    def __post_init__(self):
        check_segment_output(self.segment_output)
        g = float(self.guidance_scale)
        if not math.isfinite(g):
            raise ValueError(f"guidance_scale={self.guidance_scale}: expected a finite number")
        self.cfg_coef = np.array([g if b == "cond" else 1.0 - g for b in BRANCHES])
        self.steps, _, self.n_ops = self.change.shape
        if self.model_ops is None:
            self.model_ops = ModelOps.latte(self.n_ops // 5)
        if len(self.model_ops.ops) != self.n_ops:
            raise ValueError(f"change of {self.n_ops} operators, expected the model's "
                             f"{len(self.model_ops.ops)}")
        self.layers = self.model_ops.num_layers
        self.weight = np.asarray(self.weight, np.float64)
        self.d = np.nan_to_num(np.asarray(self.change, np.float64), nan=0.0)
        self.d[0] = 0.0
        self.cum = np.cumsum(self.d, axis=0)                   # [S, B, K]
        self.ops = [op for _, op in self.model_ops.ops]
        self.barrier_at = {self.model_ops.index(r)
                           for r in self.model_ops.barriers(self.shape.get("frames", 1))}
        streams = ([self.shape["tokens"], self.shape.get("text_tokens", 0)]
                   if "tokens" in self.shape
                   else [self.shape["frames"] * self.shape["tokens_per_frame"]])
        streams = [t for t in streams if t > 0]
        c = self.shape["hidden"]
        lanes, ranks = self.nme.lanes, self.nme.ranks
        self.tensor_bytes = sum(tensor_bytes(t, c, ranks, lanes) for t in streams)
        self.op_time = np.array([self.compute_time(op, self.shape) for op in self.ops])
        self.op_time_cum = np.concatenate([[0.0], np.cumsum(self.op_time)])
        self.seg_time = [0.0]
        self.seg_bytes = [0]
        for k in range(1, self.n_ops + 1):
            nbytes, seconds = 0, 0.0
            for tokens in streams:           # one NME program (chain) per residual stream
                cycles = segment_nme_cycles(self.nme, tokens, c, k)
                sb = segment_bytes(tokens, c, k, ranks, lanes,
                                   segment_output=self.segment_output)
                nbytes += sb["down"] + sb["up"]
                seconds += (cycles / self.nme.clock_hz + sb["programs"] * self.link.latency_s
                            + (sb["down"] + sb["up"]) / self.link.bandwidth)
            self.seg_bytes.append(nbytes)
            self.seg_time.append(seconds)
        self.seg_bytes = np.array(self.seg_bytes)
        self.seg_time = np.array(self.seg_time)

    # ---- per operator (both branches): quality and stores
    def op_terms(self, m: np.ndarray, k: int) -> tuple[float, int]:
        """(quality, stores) of operator ``k``: ``sum_s |sum_b coef_b e_b(s)|`` with
        ``e_b(s)`` the weighted change accumulated since branch b last computed it (0 where
        computed), and the outputs stored for a reuse at the next step."""
        idx = np.arange(self.steps)
        err = np.zeros(self.steps)
        stores = 0
        for b in range(m.shape[1]):
            r = m[:, b, k]
            if not r.any():
                continue
            last = np.maximum.accumulate(np.where(r, 0, idx))  # last computed step <= s
            acc = (self.cum[:, b, k] - self.cum[last, b, k]) * self.weight[b, k]
            err += self.cfg_coef[b] * np.where(r, acc, 0.0)
            stores += int((~r[:-1] & r[1:]).sum())
        return float(np.abs(err).sum()), stores

    # ---- per step: segments, their bytes and the mismatch
    def runs(self, row: np.ndarray) -> list[tuple[int, int]]:
        out, start = [], None
        for i in range(self.n_ops):
            if row[i]:
                if start is None:
                    start = i
            elif start is not None:
                out.append((start, i))
                start = None
            if i in self.barrier_at and start is not None:
                out.append((start, i + 1))
                start = None
        if start is not None:
            out.append((start, self.n_ops))
        return out

    def step_terms(self, m: np.ndarray, s: int) -> tuple[int, int, float, float]:
        """(segments, segment bytes, link time, mismatch) of step ``s``, both branches."""
        segs = nbytes = 0
        link = mism = 0.0
        for b in range(len(BRANCHES)):
            other = m[s, 1 - b]
            for i, j in self.runs(m[s, b]):
                k = j - i
                segs += 1
                nbytes += int(self.seg_bytes[k])
                link += self.link.latency_s + self.seg_bytes[k] / self.link.bandwidth
                window = float(self.op_time[i:j][~other[i:j]].sum())
                mism += max(0.0, float(self.seg_time[k]) - window)
        return segs, nbytes, link, mism

    def evaluate(self, m: np.ndarray) -> dict:
        """All terms of a matrix: quality, stores, segments, pcie_bytes, transfer_s,
        mismatch_s (per video)."""
        q = stores = 0
        for k in range(self.n_ops):
            qq, ss = self.op_terms(m, k)
            q += qq
            stores += ss
        segs = nbytes = 0
        link = mism = 0.0
        for s in range(self.steps):
            a, bb, c, d = self.step_terms(m, s)
            segs, nbytes, link, mism = segs + a, nbytes + bb, link + c, mism + d
        store_bytes = stores * self.tensor_bytes
        return {"quality": float(q), "stores": int(stores), "segments": int(segs),
                "pcie_bytes": int(nbytes + store_bytes),
                "transfer_s": float(link + store_bytes / self.link.bandwidth),
                "mismatch_s": float(mism),
                "skip": float(m.mean())}


# ---------------------------------------------------------------- the annealer
def reusable_executions(num_steps: int, num_layers: int, cooldown: int = 1,
                        ops: ModelOps | None = None) -> int:
    """How many operator executions a searched schedule can reuse at most: every operator of
    both branches at steps 1 .. ``num_steps - cooldown - 1`` (step 0 computes everything,
    nothing was computed before it; the last ``cooldown`` steps compute everything).
    ``ops``: the model's operators (default: Latte's of ``num_layers``)."""
    per_step = num_layers * 5 if ops is None else len(ops.ops)
    return max(0, num_steps - 1 - cooldown) * len(BRANCHES) * per_step


def check_skip(skip: float, num_steps: int, num_layers: int, cooldown: int = 1,
               ops: ModelOps | None = None) -> int:
    """The number of reused executions ``round(skip * N)`` a search for ``skip`` anneals, if
    it is possible: ``skip`` in (0, 1), ``cooldown`` in 0 .. ``num_steps - 2`` and 1 ..
    :func:`reusable_executions` reused (``ops``: the model's operators, default Latte's of
    ``num_layers``). Raises ValueError naming ``--skip`` / ``--cooldown``, with the allowed
    range."""
    if not 0.0 < skip < 1.0:        # NaN too
        raise ValueError(f"--skip {skip}: expected a fraction in (0, 1)")
    if not 0 <= cooldown <= num_steps - 2:
        raise ValueError(f"--cooldown {cooldown}: expected 0..{num_steps - 2} steps for a "
                         f"profile of {num_steps} steps (step 0 computes everything and at "
                         "least one step must be left to reuse)")
    total = num_steps * len(BRANCHES) * (num_layers * 5 if ops is None else len(ops.ops))
    target = int(round(skip * total))
    most = reusable_executions(num_steps, num_layers, cooldown, ops)
    if not 1 <= target <= most:
        raise ValueError(
            f"--skip {skip}: {target} reused of {total} executions, expected 1..{most} reused, "
            f"a --skip of {1 / total:.3g}..{most / total:.4g} (step 0 and the last {cooldown} "
            f"step{'s' if cooldown != 1 else ''} (--cooldown {cooldown}) of the {num_steps} "
            "compute everything)")
    return target


@dataclass
class SearchResult:
    schedule: Schedule
    terms: dict          # the chosen schedule's cost terms (with the step-weight exponent)
    reference: dict      # the reference (uniform) schedule's terms
    cost: float
    seconds: float
    moves: int
    accepted: int


def _greedy_start(cm: CostModel, target: int, steps: int, n_b: int, n_k: int,
                  cooldown: int) -> np.ndarray:
    """The start of the walk, a reuse matrix [steps, branches, ops] of ``target`` True: the
    (step, operator) pairs cheapest to reuse in both CFG branches (one step stale), then, for
    an odd count, the cheapest single execution; never step 0 or the last ``cooldown``."""
    one = cm.d * cm.weight[None]                                       # [S, B, K]
    pair = np.abs((one * cm.cfg_coef[None, :, None]).sum(axis=1))      # [S, K]
    single = one * np.abs(cm.cfg_coef)[None, :, None]
    for sc in (pair, single):
        sc[0] = np.inf
        if cooldown:
            sc[steps - cooldown:] = np.inf
    m = np.zeros((steps, n_b, n_k), bool)
    ps, pk = np.unravel_index(np.argsort(pair, axis=None, kind="stable")[:target // n_b],
                              pair.shape)
    m[ps, :, pk] = True
    single[m] = np.inf
    m.reshape(-1)[np.argsort(single, axis=None, kind="stable")[:target - int(m.sum())]] = True
    return m


def _temperature(it: int, moves: int, t_start: float = 0.02, t_end: float = 1e-5) -> float:
    """The geometric cooling schedule: ``t_start`` at move 0 down to ``t_end`` at the last."""
    return t_start * (t_end / t_start) ** (it / max(1, moves - 1))


def _metropolis(delta: float, temp: float, rng: np.random.Generator) -> bool:
    """Accept a move whose cost changes by ``delta``: always when it does not rise, else with
    probability ``exp(-delta / temp)`` (draws from ``rng`` only then)."""
    return delta <= 0 or rng.random() < math.exp(-delta / temp)


@dataclass
class _Move:
    """One proposed move, applied to the matrix while it is judged: its ``(reused, free)``
    flat-index swaps, the operator rows and steps it touches with their new terms, the
    changes of the four summed terms and the total cost after it."""
    swaps: list[tuple[int, int]]
    rows: dict
    steps: dict
    deltas: tuple[float, float, float, float]
    cost: float


class _Walk:
    """The annealing's state: the reuse matrix ``m`` [steps, branches, ops], its reused and
    free executions (lists with positions, so a move draws one in O(1)), and the cost terms
    kept per operator row (quality, stores) and per step (link time, mismatch), so a move
    re-evaluates only the rows and steps it touches.

    ``objective(quality, stores, link_s, mismatch_s)`` -> the normalised total cost."""

    def __init__(self, cm: CostModel, m: np.ndarray, cooldown: int,
                 objective: Callable[[float, float, float, float], float]):
        steps, n_b, n_k = m.shape
        self.cm, self.m, self.flat_m, self.objective = cm, m, m.reshape(-1), objective
        self.steps, self.n_b, self.n_k, self.cooldown = steps, n_b, n_k, cooldown
        self.rowq = np.zeros(n_k)
        self.rows_st = np.zeros(n_k, int)
        for k in range(n_k):
            self.rowq[k], self.rows_st[k] = cm.op_terms(m, k)
        st = [cm.step_terms(m, s) for s in range(steps)]
        self.step_link = np.array([x[2] for x in st])
        self.step_mism = np.array([x[3] for x in st])
        self.cost = objective(self.rowq.sum(), self.rows_st.sum(), self.step_link.sum(),
                              self.step_mism.sum())
        self.sums = (self.rowq.sum(), self.rows_st.sum(), self.step_link.sum(),
                     self.step_mism.sum())
        self.reused = list(np.flatnonzero(m.reshape(-1)))
        last = (steps - cooldown) * n_b * n_k
        self.free = [i for i in np.flatnonzero(~m.reshape(-1))
                     if n_b * n_k <= i < last]   # steps >= 1
        self.pos_r = {c: i for i, c in enumerate(self.reused)}
        self.pos_f = {c: i for i, c in enumerate(self.free)}

    def propose(self, rng: np.random.Generator) -> list[tuple[int, int]] | None:
        """(reused, free) position swaps of one move, or None for a move off the grid:
        one execution to anywhere or next to it (+-1 step, +-1 operator, the other branch),
        or an operator reused in both branches moved as a pair (anywhere or +-1 step/op)."""
        m, reused, free = self.m, self.reused, self.free
        steps, n_b, n_k, cooldown = self.steps, self.n_b, self.n_k, self.cooldown
        a = reused[rng.integers(len(reused))]
        s, b, k = np.unravel_index(a, m.shape)
        if n_b == 2 and rng.random() < 0.5:
            if not m[s, 1 - b, k]:
                return None
            if rng.random() < 0.5:
                s2, k2 = int(rng.integers(1, steps - cooldown)), int(rng.integers(n_k))
            else:
                kind = rng.integers(4)
                s2, k2 = s + (-1, 1, 0, 0)[kind], k + (0, 0, -1, 1)[kind]
            if not (1 <= s2 < steps - cooldown and 0 <= k2 < n_k) or m[s2, :, k2].any():
                return None
            return [(np.ravel_multi_index((s, bb, k), m.shape),
                     np.ravel_multi_index((s2, bb, k2), m.shape)) for bb in range(n_b)]
        if rng.random() < 0.5:
            return [(a, free[rng.integers(len(free))])]
        kind = rng.integers(5)
        s2 = s + (-1, 1, 0, 0, 0)[kind]
        k2 = k + (0, 0, -1, 1, 0)[kind]
        b2 = 1 - b if kind == 4 else b
        if not (1 <= s2 < steps - cooldown and 0 <= k2 < n_k) or m[s2, b2, k2]:
            return None
        return [(a, np.ravel_multi_index((s2, b2, k2), m.shape))]

    def try_move(self, swaps: list[tuple[int, int]]) -> _Move:
        """Apply ``swaps`` to the matrix and cost the rows and steps they touch."""
        cm, m, flat_m = self.cm, self.m, self.flat_m
        rows, steps_hit = set(), set()
        for a, c in swaps:
            flat_m[a], flat_m[c] = False, True
            for pos in (a, c):
                sp, _, kp = np.unravel_index(pos, m.shape)
                rows.add(kp)
                steps_hit.add(sp)
        new_rows = {r: cm.op_terms(m, r) for r in rows}
        new_steps = {s: cm.step_terms(m, s) for s in steps_hit}
        dq = sum(new_rows[r][0] - self.rowq[r] for r in rows)
        dst = sum(new_rows[r][1] - self.rows_st[r] for r in rows)
        dl = sum(new_steps[s][2] - self.step_link[s] for s in steps_hit)
        dm = sum(new_steps[s][3] - self.step_mism[s] for s in steps_hit)
        q_sum, st_sum, l_sum, m_sum = self.sums
        new = self.objective(q_sum + dq, st_sum + dst, l_sum + dl, m_sum + dm)
        return _Move(swaps, new_rows, new_steps, (dq, dst, dl, dm), new)

    def accept(self, move: _Move) -> None:
        """Keep the move: its cost, terms and the reused / free lists follow it."""
        self.cost = move.cost
        self.sums = tuple(total + d for total, d in zip(self.sums, move.deltas))
        for r, terms in move.rows.items():
            self.rowq[r], self.rows_st[r] = terms
        for s, terms in move.steps.items():
            self.step_link[s], self.step_mism[s] = terms[2], terms[3]
        for a, c in move.swaps:
            i = self.pos_r.pop(a)
            self.reused[i] = c
            self.pos_r[c] = i
            j = self.pos_f.pop(c)
            self.free[j] = a
            self.pos_f[a] = j

    def reject(self, move: _Move) -> None:
        """Undo the move's swaps on the matrix."""
        for a, c in move.swaps:
            self.flat_m[a], self.flat_m[c] = True, False


def anneal(profile, skip: float, *, seed: int = 0, moves: int = 200_000,
           w_transfer: float = 0.1, w_mismatch: float = 0.1,
           compute_time: ComputeTime = flop_compute_time, link: LinkModel | None = None,
           nme: NMEModel | None = None, cooldown: int = 1,
           progress: Callable[[int, float], None] | None = None,
           segment_output: str = "sum") -> SearchResult:
    """Anneal a schedule skipping ``round(skip * N)`` operator executions; the last
    ``cooldown`` steps compute everything (the last step writes the video: a stale output
    there stays in it as residual noise: on 6 held-out videos, 0.5 skipped, SSIM 0.944 with
    cooldown 0 and 0.973 with 1; TeaCache and MagCache compute their last step too).
    ``segment_output``: the segments' form the transfer term counts (:class:`CostModel`).

    Raises ValueError for a skip outside (0, 1) or more reuse than the steps allow
    (:func:`check_skip`), or an unknown ``segment_output``. Any architecture: the
    profile's operators (:attr:`Profile.model_ops`) and shapes."""
    steps, layers, ops = profile.num_steps, profile.num_layers, profile.model_ops
    n_b, n_k = len(BRANCHES), len(ops.ops)
    target = check_skip(skip, steps, layers, cooldown, ops)
    t0 = time.perf_counter()
    change = profile.per_op(profile.mean("out_change"))                   # [S, B, ops]
    decay, weights = step_weights(profile)
    change = change * weights[:, None, None]
    cm = CostModel(change, quality_weights(profile), profile.meta["shape"],
                   guidance_scale=profile.meta["guidance_scale"], link=link or LinkModel(),
                   nme=nme or NMEModel(), compute_time=compute_time,
                   segment_output=segment_output, model_ops=ops)
    rng = np.random.default_rng(seed)

    # reference for normalisation: the closest uniform-interval schedule
    ref_sched = uniform_for_skip(skip, steps, layers, ops=ops).schedule_for(steps, ops)
    ref = cm.evaluate(schedule_to_matrix(ref_sched))
    norm_q = ref["quality"] or 1.0
    norm_t = ref["transfer_s"] or 1.0
    norm_m = ref["mismatch_s"] or max(1e-12, ref["transfer_s"] or 1.0)
    tb, bw = cm.tensor_bytes, cm.link.bandwidth

    def total_cost(q, stores, link_s, mism):
        return (q / norm_q + w_transfer * (link_s + stores * tb / bw) / norm_t
                + w_mismatch * mism / norm_m)

    walk = _Walk(cm, _greedy_start(cm, target, steps, n_b, n_k, cooldown), cooldown,
                 total_cost)
    best, best_m = walk.cost, walk.m.copy()
    accepted = 0
    if not walk.free:   # every reusable execution is reused: the schedule is determined
        moves = 0
    for it in range(moves):
        temp = _temperature(it, moves)
        swaps = walk.propose(rng)
        if swaps is None:
            continue
        move = walk.try_move(swaps)
        if _metropolis(move.cost - walk.cost, temp, rng):
            accepted += 1
            walk.accept(move)
            if walk.cost < best - 1e-12:
                best, best_m = walk.cost, walk.m.copy()
        else:
            walk.reject(move)
        if progress is not None and it % 20000 == 0:
            progress(it, walk.cost)
    terms = cm.evaluate(best_m)
    terms["step_decay"] = decay
    name = f"coda(skip={skip:g},seed={seed})"
    sched = matrix_to_schedule(best_m, layers, name, ops)
    return SearchResult(sched, terms, ref, float(best), time.perf_counter() - t0, moves,
                        accepted)


# ---------------------------------------------------------------- the command's annealing
def checked_anneal(profile: str | Path, skip: float, *, seed: int = 0, moves: int = 200_000,
                   cooldown: int = 1, w_transfer: float = 0.1,
                   w_mismatch: float = 0.1) -> tuple[SearchResult, dict]:
    """:func:`anneal` on the profile file ``profile`` after ``coda schedule search``'s checks
    of its flags. Returns (the result, the ``info`` saved beside the schedule). Raises
    ValueError naming the flag (or the profile file)."""
    from coda.experiments.profile import Profile

    if not 0.0 < skip < 1.0:
        raise ValueError(f"--skip {skip}: expected a fraction in (0, 1)")
    if moves < 1:
        raise ValueError(f"--moves {moves}: expected >= 1")
    check_seed(seed)
    if cooldown < 0:
        raise ValueError(f"--cooldown {cooldown}: expected >= 0 steps")
    check_weight(w_transfer, "--w-transfer")
    check_weight(w_mismatch, "--w-mismatch")
    prof = Profile.load(profile)
    check_skip(skip, prof.num_steps, prof.num_layers, cooldown, prof.model_ops)
    res = anneal(prof, skip, seed=seed, moves=moves, w_transfer=w_transfer,
                 w_mismatch=w_mismatch, cooldown=cooldown)
    info = {"model_hash": prof.meta.get("model_hash"), "profile": str(profile),
            "profile_seeds": prof.meta.get("seeds"), "target_skip": skip,
            "seed": seed, "moves": res.moves, "accepted": res.accepted,
            "cooldown": cooldown,
            "search_s": res.seconds, "cost": res.cost, "terms": res.terms,
            "reference_uniform_terms": res.reference,
            "weights": {"transfer": w_transfer, "mismatch": w_mismatch}}
    return res, info


# ----------------------------------------------------------------------------- sweeps
def sweep_point(params: dict, workdir: Path) -> dict:
    """One ``coda sweep schedule`` point (an annealing restart): :func:`checked_anneal` with
    ``params``; writes ``workdir/schedule.json``. Returns the cost and the schedule's cost
    terms (skip fraction, quality proxy, segments, stores, PCIe bytes, transfer and
    mismatch seconds), plus ``timing`` (the search's wall seconds)."""
    res, info = checked_anneal(**params)
    save_schedule(Path(workdir) / "schedule.json", res.schedule, info)
    figures = {"cost": float(res.cost), "accepted": int(res.accepted)}
    for k, v in res.terms.items():
        if isinstance(v, (int, float, np.integer, np.floating)):
            figures[k] = v.item() if hasattr(v, "item") else v
    figures["timing"] = {"search_s": round(res.seconds, 3)}
    return figures


def sweep_kind():
    """The ``schedule`` sweep kind (coda.sweep.SweepKind): annealing restarts over seeds,
    skip fractions and cost weights, one schedule per point."""
    import coda.host
    from coda.sweep import Param, SweepKind, sources_digest
    return SweepKind(
        name="schedule", run=sweep_point,
        version=sources_digest(Path(__file__), Path(coda.host.__file__).parent),
        description="anneal a static cache schedule from a profile (coda schedule search)",
        params=(Param("profile", str, str(SHIPPED_PROFILE)), Param("skip", float, 0.5),
                Param("seed", int, 0), Param("moves", int, 200_000), Param("cooldown", int, 1),
                Param("w_transfer", float, 0.1), Param("w_mismatch", float, 0.1)),
        headline=("cost", "skip", "quality", "segments", "pcie_bytes", "transfer_s",
                  "mismatch_s"))
