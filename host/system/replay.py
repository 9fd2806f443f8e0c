"""Event-driven replay of a generation on GPU, PCIe, DIMMs and NMEs (SimPy), for the six
systems of the CODA ablation and a seventh, g, for the forecast mode of the cache.

:func:`replay` runs one system (:data:`SYSTEMS`, a..g) of a
:class:`~coda.host.system.workload.Workload` on a :class:`~coda.host.system.platforms.Platform`
and returns a :class:`SystemResult`; :func:`breakdown` says where its time went. The
resources (GPU stream, the two PCIe copy engines, host access to the NMP DIMMs, the NMEs in
lockstep) are FIFO ``simpy.Resource`` objects, so a replay is deterministic; the timeline and the
breakdown are computed from the busy intervals each work item records, not by peeking into
SimPy. :meth:`_Replay.op_time` and :meth:`_Replay.cache_kernel` are the one switch between
roofline and measured GPU times. The resources, the time of each work item, what each
system does and how the cache mode, the cache format and the segments' form change it:
``docs/system-model.md``, "The replay in detail".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from .formats import dense_entry_bytes, format_segment_bytes
from .nme import segment_timing
from .platforms import Platform, nmp_efficiency, segment_utilisation
from .shapes import ATTENTION, GEMM, Kernels
from .workload import CALL_ORDER, Call, Workload, tensor_bytes

__all__ = ["SYSTEMS", "SystemResult", "replay", "gpu_time", "Interval", "breakdown"]

SYSTEMS = {
    "a": "GPU only, no cache",
    "b": "cache in GPU memory",
    "c": "cache in host memory, cache ops on the GPU over PCIe",
    "d": "+ DIMM-NMP, one transfer per cached operator",
    "e": "+ scheduler: coalesced segments",
    "f": "+ CFG-interleaved pipelining",
    "g": "f, forecast history over PCIe (GPU applies the older entry)",
}
#: systems whose reused operators run as coalesced NMP segments
_COALESCED = ("e", "f", "g")
#: systems whose step's CFG branches are interleaved on the GPU
_INTERLEAVED = ("f", "g")


@dataclass(frozen=True)
class Interval:
    lane: str          # "gpu", "h2d", "d2h", "nme", "p2p" (inter-GPU, parallel modes)
    start: float
    end: float
    kind: str          # "compute", "other", "cache_op", "store", "load", "weights", "x", "y", "segment", "monitor"
    branch: str
    step: int


@dataclass
class SystemResult:
    """One system's replay.

    Attributes:
        system, name: letter and description. fits: False if the system cannot hold its
            cache (``reason`` says why; the other fields are then zero).
        latency_s: the generation. gpu_busy_s: GPU kernel time. nme_busy_s: NME time.
        h2d_bytes, d2h_bytes: PCIe bytes per direction. host_dram_bytes: bytes the host
            DIMMs / host memory served over PCIe. nme_rank_bytes: DRAM bytes the NMEs moved
            (all ranks); nme_write_bytes: the part of them written (for the DRAM energy).
            nme_flops: 16-bit FP operations on the NMEs (adds + muls).
        weights: ``"resident"`` or ``"streamed"``. segments: NME launches' segments.
        history_bytes: bytes of the forecast's older entries that crossed the host link
            (system g; part of ``h2d_bytes``).
        p2p_bytes, p2p_s: bytes this GPU sent to the other GPUs and the seconds its
            stream waited on them (a parallel mode's collectives,
            :mod:`coda.host.system.parallel`; 0 on one GPU).
        gpu_measured, gpu_roofline: with measured xPU times (``Platform.gpu_times``), the
            distinct kernels (operator and batch, cache kernel and shape) the replay timed
            from the table and those the table had no entry for (roofline); both 0 without
            a table.
        intervals: busy intervals (for the timeline).
    """
    system: str
    name: str
    fits: bool = True
    reason: str = ""
    latency_s: float = 0.0
    gpu_busy_s: float = 0.0
    nme_busy_s: float = 0.0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    host_dram_bytes: int = 0
    nme_rank_bytes: int = 0
    nme_write_bytes: int = 0
    nme_adds: int = 0
    nme_muls: int = 0
    weights: str = "resident"
    segments: int = 0
    nme_launches: int = 0
    history_bytes: int = 0
    gpu_measured: int = 0
    gpu_roofline: int = 0
    p2p_bytes: int = 0
    p2p_s: float = 0.0
    intervals: list = field(default_factory=list, repr=False)


def gpu_time(k: Kernels, batch: int, gpu) -> float:
    """Seconds of ``k``'s kernels for ``batch`` rows on ``gpu``: the roofline.

    ``max(b·F/(P·e_class), (b·A + W)/(BW·e_mem))`` per traced kernel (F FLOPs, A activation
    bytes per sample, W weight bytes, b rows batched, P peak FLOP/s, BW memory bandwidth, e
    the efficiency of the kernel's class), summed and bounded below by ``kernels x launch_s``.
    """
    if k.count == 0:
        return 0.0
    eff = np.where(k.cls == GEMM, gpu.eff_gemm, np.where(k.cls == ATTENTION,
                                                          gpu.eff_attention, 1.0))
    t_c = batch * k.flops / (gpu.peak_flops * eff)
    t_m = (batch * k.act_bytes + k.weight_bytes) / (gpu.mem_bw * gpu.eff_memory)
    return max(float(np.maximum(t_c, t_m).sum()), k.count * gpu.launch_s)


def _mem_kernel(nbytes: float, gpu) -> float:
    return max(nbytes / (gpu.mem_bw * gpu.eff_memory), gpu.launch_s)


class _Replay:
    def __init__(self, wl: Workload, plat: Platform, system: str, nme_timing: str,
                 prefetch: int, record: bool, env: simpy.Environment | None = None,
                 comm=None):
        self.wl, self.p, self.sys = wl, plat, system
        self.shape = wl.shape
        self.nme_timing, self.prefetch, self.record = nme_timing, max(0, prefetch), record
        # several GPUs share one environment, each with its own resources
        # (coda.host.system.parallel); ``comm(i, rows)``: seconds of inter-GPU transfer the
        # stream waits for around computed operator i (and bytes sent), or None
        self.env = env if env is not None else simpy.Environment()
        self.comm = comm
        self.gpu = simpy.PriorityResource(self.env, 1)
        self.h2d = simpy.Resource(self.env, 1)
        self.d2h = simpy.Resource(self.env, 1)
        self.dimm = simpy.Resource(self.env, 2)
        self.nme = simpy.Resource(self.env, 1)
        self.res = SystemResult(system, SYSTEMS[system])
        # f: the GPU serves the first branch of a step whenever it has work and the other
        # branch fills the gaps while the first waits on its segment (non-preemptive)
        order = CALL_ORDER[wl.cfg]
        self._priority = {b: i for i, b in enumerate(order)} if system in _INTERLEAVED else {}
        self._gpu_t: dict = {}
        self._seg_t: dict = {}
        self._zero_written: set = set()   # rows whose slot of zeros is in rank memory
        self.g = plat.gpu
        self.elem = self.shape.dtype_bytes
        self.lanes = plat.lanes
        # measured xPU times (coda calibrate); the cache kernels' are of bf16 entries
        self.times = plat.gpu_times
        self._looked: dict = {}           # kernel -> whether the table had its time

    def _measured(self, key, t):
        """``t`` (a time from the table, or None: the roofline serves), recorded under
        ``key`` for the result's ``gpu_measured`` / ``gpu_roofline``."""
        self._looked[key] = t is not None
        return t

    # ---------------------------------------------------------------- primitives
    def _log(self, lane, t0, kind, branch, step):
        if self.record:
            self.res.intervals.append(Interval(lane, t0, self.env.now, kind, branch, step))

    def gpu_run(self, seconds, kind, branch, step):
        with self.gpu.request(priority=self._priority.get(branch, 0)) as req:
            yield req
            t0 = self.env.now
            yield self.env.timeout(seconds)
            self.res.gpu_busy_s += seconds
            self._log("gpu", t0, kind, branch, step)

    def copy(self, direction, nbytes, kind, branch, step, dimm=True):
        """A PCIe copy (``"h2d"``/``"d2h"``); ``dimm``: its host end is the NMP DIMMs."""
        if nbytes <= 0:
            return
        engine = self.h2d if direction == "h2d" else self.d2h
        bw = min(self.p.pcie.h2d_bw if direction == "h2d" else self.p.pcie.d2h_bw,
                 self.p.host_channel_bw)
        dur = self.p.pcie.latency_s + nbytes / bw
        slot = self.dimm.request() if dimm else None
        if slot is not None:
            yield slot
        with engine.request() as req:
            yield req
            t0 = self.env.now
            yield self.env.timeout(dur)
            self._log(direction, t0, kind, branch, step)
        if slot is not None:
            self.dimm.release(slot)
        if direction == "h2d":
            self.res.h2d_bytes += nbytes
        else:
            self.res.d2h_bytes += nbytes
        self.res.host_dram_bytes += nbytes

    def nme_run(self, seconds, launches, kind, branch, step):
        # The NMEs first, then both host-access slots of the DIMMs: two launches (the two
        # CFG branches of system f) each holding one slot and waiting for the other would
        # deadlock; a copy holds at most one slot and never waits for the NMEs.
        with self.nme.request() as req:
            yield req
            a = self.dimm.request()
            yield a
            b = self.dimm.request()
            yield b
            t0 = self.env.now
            yield self.env.timeout(seconds + launches * self.p.pcie.latency_s)
            self.res.nme_busy_s += self.env.now - t0
            self._log("nme", t0, kind, branch, step)
            self.dimm.release(a)
            self.dimm.release(b)

    # ---------------------------------------------------------------- costs
    def op_time(self, index: int, batch: int) -> float:
        """Seconds of operator ``index`` (-1: the rest of a call) for ``batch`` rows: measured
        (``Platform.gpu_times``) where the table has it, else the roofline."""
        key = (index, batch)
        if key not in self._gpu_t:
            t = None
            if self.times is not None:
                t = self._measured(key, self.times.other_s(self.shape, batch) if index < 0
                                   else self.times.op_s(self.shape.ops[index].op, batch))
            if t is None:
                k = self.shape.other if index < 0 else self.shape.ops[index].kernels
                t = gpu_time(k, batch, self.g)
            self._gpu_t[key] = t
        return self._gpu_t[key]

    def cache_kernel(self, nbytes: float, name: str, op, terms=(1,)) -> float:
        """Seconds of a cache kernel on the xPU over operator ``op``'s ``[T, C]``: one run of
        measured kernel ``name`` (:meth:`coda.host.system.gputable.GpuTimes.cache_s`) per
        entry of ``terms`` (rows, each with its terms), when the table has them and the
        entries are bf16; else the roofline of one elementwise kernel moving ``nbytes``."""
        if self.times is not None and self.wl.cache_group is None:
            each = [self._measured((name, op.tokens, op.channels, k),
                                   self.times.cache_s(name, op.tokens, op.channels, k))
                    for k in terms]
            if all(t is not None for t in each):
                return sum(each)
        elif self.times is not None:        # int8 entries: the table times bf16 ones
            self._measured((name, op.tokens, op.channels, "int8"), None)
        return _mem_kernel(nbytes, self.g)

    def seg_cost(self, tokens, channels, k, events_cycles=None, streams=()):
        """(seconds, launches, rank bytes, adds, muls, rank bytes written) of a k-term
        segment on this
        platform (``streams``: per-stream tokens of a two-stream model)."""
        key = (tokens, channels, k, events_cycles, tuple(streams))
        if key not in self._seg_t:
            p = self.p
            t = segment_timing(tokens, channels, k, n_ranks=p.n_ranks, lanes=p.lanes,
                               depth=p.depth, clock_hz=p.nme_clock_hz,
                               rank_peak_bytes_per_cycle=p.rank_peak_bytes_per_nme_cycle,
                               dram_util=lambda kk, w, j: segment_utilisation(
                                   p.dram.name, p.lanes, p.depth, kk, w,
                                   segment_output=self.wl.segment_output, program=j),
                               stream_tokens=tuple(streams), group=self.wl.cache_group)
            seconds = t.seconds
            if events_cycles is not None and self.nme_timing == "events":
                seconds = events_cycles / p.nme_clock_hz
            self._seg_t[key] = (seconds, t.programs, t.rank_dram_bytes, t.adds, t.muls,
                                t.rank_write_bytes)
        return self._seg_t[key]

    # ---------------------------------------------------------------- work
    def store(self, nbytes, branch, step):
        yield from self.copy("d2h", nbytes, "store", branch, step)

    def segment(self, seg_ops, row, tokens, channels, step, events_cycles=None,
                bytes_down=None, bytes_up=None, streams=(), terms=0):
        """One segment's round trip (generator): ``terms`` NME terms per stream (0: one per
        operator of ``seg_ops``)."""
        branch = row[0]
        k = terms or len(seg_ops)
        form = self.wl.segment_output
        sb = format_segment_bytes(tokens, channels, k, self.p.n_ranks, self.lanes,
                                  self.p.depth, self.wl.cache_group, tuple(streams), form)
        # a real run's bytes are the driver's, on the run's ranks (a row's first "sum"
        # segment includes the row's slot of zeros)
        use_events = bytes_down is not None
        down = bytes_down if use_events else sb["down"]
        up = bytes_up if use_events else sb["up"]
        if form == "sum" and row not in self._zero_written:
            self._zero_written.add(row)
            if not use_events:
                down += tensor_bytes(tokens, channels, self.p.n_ranks, self.lanes,
                                     tuple(streams))
        seconds, launches, rank_bytes, adds, muls, write_bytes = self.seg_cost(
            tokens, channels, k, events_cycles, streams)
        yield from self.copy("d2h", down, "x", branch, step)
        yield from self.nme_run(seconds, launches, "segment", branch, step)
        self.res.nme_rank_bytes += rank_bytes * self.p.n_ranks
        self.res.nme_write_bytes += write_bytes * self.p.n_ranks
        self.res.nme_adds += adds
        self.res.nme_muls += muls
        self.res.segments += 1
        self.res.nme_launches += launches
        yield from self.copy("h2d", up, "y", branch, step)
        if form == "sum":                 # h = h + z on the xPU, in the model's dtype
            yield from self.gpu_run(self._residual_add(tokens, channels), "cache_op", branch,
                                    step)

    def _residual_add(self, tokens: int, channels: int) -> float:
        """Seconds of a sum segment's ``h = h + z`` on the xPU: one elementwise kernel that
        reads two ``[tokens, channels]`` tensors and writes one in the model's dtype, timed
        as every elementwise cache kernel here (:meth:`cache_kernel`)."""
        if self.times is not None:
            t = self._measured(("residual_add", tokens, channels),
                               self.times.cache_s("residual_add", tokens, channels))
            if t is not None:
                return t
        return _mem_kernel(3 * tokens * channels * self.elem, self.g)

    def monitor(self, m, step):
        ops = self.shape.ops[m.index]
        if self.sys in ("d",) + _COALESCED:
            yield from self.copy("d2h", m.bytes_down, "x", m.row[0], step)
            nbytes = 2 * tensor_bytes(ops.tokens, ops.channels, self.p.n_ranks, self.lanes,
                                      ops.stream_tokens)
            util = nmp_efficiency(self.p.dram.name, self.p.lanes, self.p.depth, 3)
            cyc = max(m.nme_cycles, nbytes / self.p.n_ranks
                      / (self.p.rank_peak_bytes_per_nme_cycle * util))
            yield from self.nme_run(cyc / self.p.nme_clock_hz, 1, "monitor", m.row[0], step)
            self.res.nme_rank_bytes += nbytes
        elif self.sys == "c":
            yield from self.copy("h2d", ops.tokens * ops.channels * self.elem, "load",
                                 m.row[0], step)
            yield from self.gpu_run(_mem_kernel(2 * ops.tokens * ops.channels * self.elem,
                                                self.g), "cache_op", m.row[0], step)
        elif self.sys == "b":
            yield from self.gpu_run(_mem_kernel(2 * ops.tokens * ops.channels * self.elem,
                                                self.g), "cache_op", m.row[0], step)

    def _load_bytes(self, i: int, act) -> int:
        """H2D bytes of reused operator ``i``'s cached tensors for one row (action ``act``)
        in this system: c loads its ``terms`` tensors, g the older entry of a forecast term;
        the others none."""
        n = {"c": act.terms, "g": act.terms - 1}.get(self.sys, 0)
        return n * self._entry(i)

    def _entry(self, i: int) -> int:
        """Bytes of one cache entry of operator ``i`` held densely (GPU or host memory):
        bf16, or int8 q and scales (:func:`coda.host.system.formats.dense_entry_bytes`)."""
        o = self.shape.ops[i]
        return dense_entry_bytes(o.tokens, o.channels, self.elem, self.wl.cache_group)

    def reuse_rows(self, call: Call, i: int, reuse: list, loads: dict, pending: dict):
        """The rows ``reuse`` of ``call`` that reuse operator ``i`` (generator): b and c run
        the cache operator on the GPU (c after its loads), d one segment per row, e/f/g
        join the row's open segment (g: then adds the forecast's older entries on the
        GPU)."""
        sys, step, rows = self.sys, call.step, call.rows
        op, acts = self.shape.ops[i], call.actions[i]
        label = "|".join(call.branches)
        tensor = op.tokens * op.channels * self.elem
        if sys in ("b", "c"):
            for j in reuse if sys == "c" else ():
                yield loads.pop((i, j))
            yield from self.gpu_run(self.cache_kernel(
                sum(2 * tensor + acts[j].terms * self._entry(i) for j in reuse), "cache_op",
                op, [acts[j].terms for j in reuse]), "cache_op", label, step)
        elif sys == "d":
            for j in reuse:
                yield from self.segment([i], rows[j], op.tokens, op.channels, step,
                                        streams=op.stream_tokens, terms=acts[j].terms)
        else:                                   # e, f, g: join the row's open segment
            for j in reuse:
                seg = self.wl.segments.get(acts[j].segment)
                if pending[rows[j]] is None:
                    pending[rows[j]] = seg if seg is not None else [i]
                elif isinstance(pending[rows[j]], list):
                    pending[rows[j]].append(i)
            history = [j for j in reuse if (i, j) in loads]         # g's older entries
            for j in history:
                yield loads.pop((i, j))
            if history:
                yield from self.gpu_run(self.cache_kernel(
                    len(history) * (2 * tensor + self._entry(i)), "cache_op", op,
                    [1] * len(history)), "cache_op", label, step)

    def flush(self, call: Call, j: int, pending: dict):
        """Run row ``j``'s open segment of ``call``, if any (generator): as the events
        give it, or in g with one term per operator (the newer entries only)."""
        row = call.rows[j]
        item, pending[row] = pending[row], None
        if item is None:
            return
        if isinstance(item, list):     # synthesized in-replay (no SegmentItem)
            o = self.shape.ops[item[0]]
            terms = 0 if self.sys == "g" else sum(call.actions[i][j].terms for i in item)
            yield from self.segment(item, row, o.tokens, o.channels, call.step,
                                    streams=o.stream_tokens, terms=terms)
        elif self.sys == "g" and item.forecast_terms:
            yield from self.segment(item.ops, row, item.tokens, item.channels, call.step,
                                    streams=item.stream_tokens)
        else:
            yield from self.segment(item.ops, row, item.tokens, item.channels, call.step,
                                    item.nme_cycles, item.bytes_down, item.bytes_up,
                                    item.stream_tokens, item.k)

    def call(self, call: Call):
        """One transformer call (generator)."""
        env, sys, step = self.env, self.sys, call.step
        rows, n_ops = call.rows, len(self.shape.ops)
        label = "|".join(call.branches)
        yield from self.gpu_run(self.op_time(-1, len(rows)), "other", label, step)
        pending: dict = {r: None for r in rows}       # row -> (segment item or ops list)
        loads: dict = {}
        weights: dict = {}
        nomodel = sys == "a"
        coalesced = sys in _COALESCED

        def reused(i, j):
            return (not nomodel) and call.actions[i][j].reused

        def issue_ahead(i):
            for ii in range(i, min(n_ops, i + self.prefetch + 1)):
                if self.res.weights == "streamed" and ii not in weights and any(
                        not reused(ii, j) for j in range(len(rows))):
                    wb = float(self.shape.ops[ii].kernels.weight_bytes.sum())
                    weights[ii] = env.process(self.copy("h2d", wb, "weights", label, step,
                                                        dimm=False))
                for j, r in enumerate(rows):
                    if not reused(ii, j) or (ii, j) in loads:
                        continue
                    nb = self._load_bytes(ii, call.actions[ii][j])
                    if nb:
                        if sys == "g":
                            self.res.history_bytes += nb
                        loads[(ii, j)] = env.process(self.copy("h2d", nb, "load", r[0],
                                                               step))

        for i in range(n_ops):
            op = self.shape.ops[i]
            acts = call.actions[i]
            issue_ahead(i)
            for m in call.monitors.get(i, ()):
                if coalesced:
                    yield from self.flush(call, rows.index(m.row), pending)
                yield from self.monitor(m, step)
            compute = [j for j in range(len(rows)) if not reused(i, j)]
            reuse = [j for j in range(len(rows)) if reused(i, j)]
            if reuse:
                yield from self.reuse_rows(call, i, reuse, loads, pending)
            if compute:
                if coalesced:
                    for j in compute:
                        yield from self.flush(call, j, pending)
                if i in weights:
                    yield weights.pop(i)
                yield from self.gpu_run(self.op_time(i, len(compute)), "compute", label, step)
                if self.comm is not None:
                    yield from self.p2p(i, len(compute), label, step)
                if sys != "a":
                    for j in compute:
                        sb = acts[j].store_bytes
                        if sb and sys == "b":
                            yield from self.gpu_run(self.cache_kernel(
                                op.tokens * op.channels * self.elem + self._entry(i),
                                "slot_copy", op), "store", rows[j][0], step)
                        elif sb:
                            env.process(self.store(sb + acts[j].kept_bytes, rows[j][0], step))
            if op.barrier_after and coalesced:
                for j in range(len(rows)):
                    yield from self.flush(call, j, pending)
        if coalesced:
            for j in range(len(rows)):
                yield from self.flush(call, j, pending)
        for ev in list(loads.values()) + list(weights.values()):
            yield ev

    def p2p(self, i: int, rows: int, label, step):
        """The stream waits on operator ``i``'s inter-GPU transfers for ``rows`` rows
        (generator): ``self.comm(i, rows)`` gives (exposed seconds, bytes sent); the GPU is
        held (no other kernel of this GPU runs) but not counted busy."""
        seconds, nbytes = self.comm(i, rows)
        if seconds <= 0:
            return
        with self.gpu.request(priority=self._priority.get(label, 0)) as req:
            yield req
            t0 = self.env.now
            yield self.env.timeout(seconds)
            self.res.p2p_s += seconds
            self.res.p2p_bytes += nbytes
            self._log("p2p", t0, "p2p", label, step)

    def step_calls(self, calls):
        """One step's calls (generator): in order, or in f/g the branches interleaved."""
        if self.sys in _INTERLEAVED:
            parts = [c2 for c in calls for c2 in self.wl.split_by_branch(c)]
            procs = [self.env.process(self.call(c)) for c in parts]
            yield simpy.AllOf(self.env, procs)
        else:
            for c in calls:
                yield from self.call(c)

    def finish(self):
        """Run the environment out (async stores still in flight end the generation
        too) and fill the result's totals."""
        self.env.run()
        self.res.latency_s = self.env.now
        self.res.gpu_measured = sum(self._looked.values())
        self.res.gpu_roofline = len(self._looked) - self.res.gpu_measured
        return self.res

    def run(self):
        def main():
            for calls in self.wl.calls:
                yield from self.step_calls(calls)
        done = self.env.process(main())
        self.env.run(until=done)
        return self.finish()


def replay(wl: Workload, plat: Platform, system: str, *, nme_timing: str = "model",
           prefetch: int = 1, record: bool = True, weights: str = "resident",
) -> SystemResult:
    """Replay ``wl`` on ``plat`` as system ``system`` (a..g, :data:`SYSTEMS`).

    Args:
        nme_timing: ``"model"`` (segment_timing on the platform's DRAM) or ``"events"`` (the
            cycles in the workload's SegmentEvents, at the NME clock; 1-term segments of
            system d are always modelled).
        prefetch: operators of look-ahead for H2D prefetches (cache loads in c, streamed
            weights).
        record: keep the busy intervals (for the timeline).
        weights: ``"resident"`` or ``"streamed"`` (decided by the ablation's memory check).
        chain: how a segment of more than 8 terms chains NME launches
            (:func:`coda.host.system.workload.segment_bytes`): ``"ranks"`` (the coalesced
            segment of the paper: one round trip) or ``"host"`` (today's driver).
    Returns:
        :class:`SystemResult`.
    Raises:
        ValueError: unknown system or nme_timing.
    """
    if system not in SYSTEMS:
        raise ValueError(f"--system {system!r}: expected one of {', '.join(SYSTEMS)} or all")
    if nme_timing not in ("model", "events"):
        raise ValueError(f"nme_timing={nme_timing!r}: expected 'model' or 'events'")
    r = _Replay(wl, plat, system, nme_timing, prefetch, record)
    r.res.weights = weights
    return r.run()


def breakdown(res: SystemResult) -> dict:
    """GPU time split into busy / stalled on the NMEs / stalled on PCIe / other idle (s),
    from the intervals: a GPU-idle instant counts as NME-stalled if an NME launch runs then,
    else PCIe-stalled if a copy runs, else other."""
    gpu = _union([(iv.start, iv.end) for iv in res.intervals if iv.lane == "gpu"])
    nme = _union([(iv.start, iv.end) for iv in res.intervals if iv.lane == "nme"])
    pcie = _union([(iv.start, iv.end) for iv in res.intervals if iv.lane in ("h2d", "d2h")])
    idle = _complement(gpu, 0.0, res.latency_s)
    on_nme = _intersect(idle, nme)
    rest = _subtract(idle, nme)
    on_pcie = _intersect(rest, pcie)
    total = lambda xs: sum(b - a for a, b in xs)   # noqa: E731
    busy = total(gpu)
    return {"gpu_busy_s": busy, "stall_nme_s": total(on_nme), "stall_pcie_s": total(on_pcie),
            "idle_other_s": max(0.0, res.latency_s - busy - total(on_nme) - total(on_pcie))}


def _union(xs):
    out = []
    for a, b in sorted(xs):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _complement(xs, lo, hi):
    out, t = [], lo
    for a, b in xs:
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < hi:
        out.append((t, hi))
    return out


def _intersect(xs, ys):
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(xs, ys):
    return _intersect(xs, _complement(ys, min((a for a, _ in xs), default=0.0),
                                      max((b for _, b in xs), default=0.0)))

