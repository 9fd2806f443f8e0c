"""Several GPUs on one generation (``coda sim --gpus N --parallel MODE``): how a parallel mode
splits the operator/segment event stream over the GPUs, the inter-GPU transfers it adds, and
the SimPy replay of all GPUs in one environment.

Each GPU has its own PCIe link, its own host DIMMs with their NMEs (the machine of
:mod:`coda.host.system.platforms` repeated) and its own copy of the weights; the GPUs are
joined by a :class:`~coda.host.system.platforms.GPULink`, every GPU on its own port of a
switch, and systems a..g keep their meaning on every GPU. :func:`layout` places a mode
(:data:`PARALLEL_MODES`) on the GPUs, :class:`Comm` times a sequence-parallel GPU's
collectives, and :func:`run_parallel` / :func:`replay_parallel` replay one representative GPU
per group (the GPUs of a sequence-parallel group work on equal shards in lockstep), the CFG
groups side by side in one SimPy environment; totals (bytes, NME time, energy) count every
GPU. The modes, what each exchanges and how the cache follows the shards:
``docs/system-model.md``, "Several GPUs".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np
import simpy

from .platforms import GPU_LINKS, GPULink, Platform
from .replay import SYSTEMS, SystemResult, _Replay, gpu_time
from .shapes import ATTENTION, Kernels, ModelShape
from .workload import CALL_ORDER, Workload

__all__ = ["PARALLEL_MODES", "Layout", "layout", "shard_shape", "sequence_ops", "Comm",
           "branch_workload", "replay_parallel", "run_parallel", "gpu_link", "latent_bytes",
           "heads_of"]

#: the parallel modes of ``coda sim --parallel`` (``none``: one GPU, today's model); the
#: degrees as xDiT names them (Fang et al., arXiv 2411.01738: ``--ulysses_degree``,
#: ``--ring_degree``, ``--use_cfg_parallel``); ``ulysses``: DeepSpeed-Ulysses (Jacobs et al.,
#: arXiv 2309.14509); ``ring``: ring attention (Liu et al., arXiv 2310.01889)
PARALLEL_MODES = ("none", "cfg", "ulysses", "ring", "cfg+ulysses")
#: SystemResult's numbers that are not summed over the GPUs: the wall clock, the mean busy
#: time, one GPU's link wait, the table lookups (counted once per group)
_NOT_SUMMED = ("latency_s", "gpu_busy_s", "p2p_s", "gpu_measured", "gpu_roofline")
#: most GPUs one machine is modelled with (an 8-GPU NVSwitch board; PCIe switch boxes hold 8-10)
MAX_GPUS = 8


@dataclass(frozen=True)
class Layout:
    """How ``gpus`` GPUs split a generation: ``cfg`` CFG groups (1 or 2) of ``sp`` GPUs
    each (the sequence-parallel degree), in ``mode`` (:data:`PARALLEL_MODES`)."""
    gpus: int
    mode: str
    cfg: int
    sp: int

    @property
    def sequence(self) -> str | None:
        """``"ulysses"``, ``"ring"`` or None: how a group's GPUs exchange inside attention."""
        if self.sp == 1:
            return None
        return "ring" if self.mode == "ring" else "ulysses"

    def describe(self) -> dict:
        return {"gpus": self.gpus, "mode": self.mode, "cfg_degree": self.cfg,
                "sequence_degree": self.sp, "sequence": self.sequence}


def heads_of(name: str) -> int | None:
    """Attention heads of preset ``name`` (its published configuration), None if unknown."""
    from .presets import OPENSORA, get_spec

    if name == "opensora-1.2":
        return int(OPENSORA["heads"])
    try:
        return int(get_spec(name).config["num_attention_heads"])
    except (KeyError, TypeError):
        return None


def latent_bytes(shape: ModelShape) -> int:
    """Bytes of one sample's latent (frames x height x width x latent channels, in the
    model's dtype): what a denoising step's noise prediction holds."""
    from .presets import OPENSORA, get_spec

    ch = (OPENSORA["latent_channels"] if shape.name == "opensora-1.2"
          else get_spec(shape.name).latent_channels)
    return int(np.prod(shape.latent)) * int(ch) * shape.dtype_bytes


def layout(gpus: int, mode: str, shape: ModelShape | None) -> Layout:
    """The :class:`Layout` of ``--gpus gpus --parallel mode`` for ``shape`` (None: the
    checks that need no model, before one is traced). Raises
    ValueError naming the flag: a count outside 1..MAX_GPUS, an unknown mode, a mode that
    does not fit the count (``none``: 1; ``cfg``: 2; ``ulysses``/``ring``: >= 2;
    ``cfg+ulysses``: an even count >= 4), CFG parallelism for a guidance-distilled model (one
    branch), Ulysses over more GPUs than the heads divide into, or shards with no token."""
    if mode not in PARALLEL_MODES:
        raise ValueError(f"--parallel {mode!r}: expected one of {', '.join(PARALLEL_MODES)}")
    if not 1 <= int(gpus) <= MAX_GPUS:
        raise ValueError(f"--gpus {gpus}: expected 1..{MAX_GPUS}")
    gpus = int(gpus)
    need = {"none": (gpus == 1, "1"), "cfg": (gpus == 2, "2"),
            "ulysses": (gpus >= 2, ">= 2"), "ring": (gpus >= 2, ">= 2"),
            "cfg+ulysses": (gpus >= 4 and gpus % 2 == 0, "an even count >= 4")}[mode]
    if not need[0]:
        raise ValueError(f"--gpus {gpus} --parallel {mode}: {mode} needs {need[1]} GPUs"
                         + (" (--parallel none is one GPU)" if mode == "none" else ""))
    cfg = 2 if mode in ("cfg", "cfg+ulysses") else 1
    sp = gpus // cfg
    if shape is None:
        return Layout(gpus, mode, cfg, sp)
    if cfg == 2 and shape.cfg == "distilled":
        raise ValueError(f"--parallel {mode}: {shape.name} is guidance-distilled (one CFG "
                         "branch per step); expected ulysses or ring")
    if mode in ("ulysses", "cfg+ulysses"):
        heads = heads_of(shape.name)
        if heads is not None and heads % sp:
            raise ValueError(f"--gpus {gpus} --parallel {mode}: Ulysses degree {sp} must "
                             f"divide {shape.name}'s {heads} attention heads")
    smallest = min([shape.video_tokens] + [t for o in shape.ops for t in o.stream_tokens
                                           if t])
    if sp > smallest:
        raise ValueError(f"--gpus {gpus}: {sp} sequence shards of {smallest} tokens leave a "
                         "shard empty")
    return Layout(gpus, mode, cfg, sp)


def gpu_link(name: str) -> GPULink:
    """The :data:`~coda.host.system.platforms.GPU_LINKS` preset ``name`` (ValueError naming
    ``--gpu-link`` and the presets)."""
    if name not in GPU_LINKS:
        raise ValueError(f"--gpu-link {name!r}: expected one of {', '.join(GPU_LINKS)}")
    return GPU_LINKS[name]


def _scaled(k: Kernels, f: float) -> Kernels:
    """``k`` with each kernel's FLOPs and activation bytes times ``f`` (weights unchanged)."""
    return Kernels(k.flops * f, k.act_bytes * f, k.weight_bytes.copy(), k.cls.copy())


def _shard(t: int, sp: int) -> int:
    return -(-int(t) // sp)


def shard_shape(shape: ModelShape, sp: int) -> ModelShape:
    """One GPU's share of ``shape`` at sequence-parallel degree ``sp``: every operator's
    tokens ``ceil(T/sp)`` (each residual stream on its own), its kernels' FLOPs and
    activation bytes times the shard's fraction of the tokens (attention included: Ulysses
    runs all tokens for 1/sp of the heads, ring attention 1/sp of the queries against all
    keys, 1/sp of the FLOPs either way), the rest of a forward the video shard's fraction;
    weights whole. ``sp = 1``: ``shape`` itself."""
    if sp == 1:
        return shape
    ops = []
    for o in shape.ops:
        streams = tuple(_shard(t, sp) for t in o.stream_tokens)
        tokens = sum(streams) if streams else _shard(o.tokens, sp)
        ops.append(replace(o, tokens=tokens, stream_tokens=streams,
                           kernels=_scaled(o.kernels, tokens / o.tokens)))
    video = _shard(shape.video_tokens, sp)
    return replace(shape, ops=ops, video_tokens=video,
                   text_tokens=_shard(shape.text_tokens, sp),
                   other=_scaled(shape.other, video / shape.video_tokens),
                   activation_bytes=int(math.ceil(shape.activation_bytes / sp)))


def sequence_ops(shape: ModelShape) -> frozenset:
    """Indices of the operators whose attention spans the sequence (attention kernels, not
    cross attention): the ones a sequence-parallel mode exchanges around."""
    return frozenset(o.index for o in shape.ops
                     if o.kind != "cross_attn" and np.any(o.kernels.cls == ATTENTION))


class Comm:
    """The inter-GPU transfers of one GPU of a sequence-parallel group around its computed
    operators: ``comm(i, rows)`` -> (seconds its stream waits, bytes it sends); ``shard``
    is its share of the shape (:func:`shard_shape`), ``sp`` the group's GPUs.

    Around every sequence attention (an operator with attention kernels that is not cross
    attention: text keys and values are replicated, nothing crosses):

    - ``ulysses``: two all-to-alls, Q, K, V before and the output after, each GPU sending
      ``(N-1)/N`` of ``4 x rows x T/N x C`` elements; the GPU waits for them (two collective
      latencies + bytes / link bandwidth);
    - ``ring``: the attention runs in N blocks, and the N-1 passes of the K, V block
      (``2 x rows x T/N x C`` elements each) overlap the blocks' compute: the GPU waits only
      for what a pass takes beyond a block, ``(N-1) x max(0, pass - attention / N)``.
    """

    def __init__(self, shard: ModelShape, sp: int, kind: str, link: GPULink, gpu):
        if kind not in ("ulysses", "ring"):
            raise ValueError(f"sequence exchange {kind!r}: expected ulysses or ring")
        self.shard, self.sp, self.kind, self.link, self.gpu = shard, sp, kind, link, gpu
        self.ops = sequence_ops(shard)
        self._memo: dict = {}

    def _attention_s(self, i: int, rows: int) -> float:
        k = self.shard.ops[i].kernels
        m = k.cls == ATTENTION
        sub = Kernels(k.flops[m], k.act_bytes[m], k.weight_bytes[m], k.cls[m])
        return gpu_time(sub, rows, self.gpu)

    def __call__(self, i: int, rows: int) -> tuple[float, int]:
        if i not in self.ops:
            return 0.0, 0
        key = (i, rows)
        if key not in self._memo:
            o, n, ln = self.shard.ops[i], self.sp, self.link
            shard_elems = rows * o.tokens * o.channels * self.shard.dtype_bytes
            if self.kind == "ulysses":
                nbytes = 4 * shard_elems * (n - 1) / n
                wait = 2 * ln.latency_s + nbytes / ln.bw
            else:
                block = 2 * shard_elems
                nbytes = (n - 1) * block
                step = ln.latency_s + block / ln.bw
                wait = (n - 1) * max(0.0, step - self._attention_s(i, rows) / n)
            self._memo[key] = (wait, int(nbytes))
        return self._memo[key]


def branch_workload(wl: Workload, branches: tuple[str, ...]) -> Workload:
    """``wl`` restricted to the rows of ``branches`` (one CFG group's GPUs): calls split by
    branch and kept if theirs, cache entries of those branches only."""
    calls = [[part for c in step for part in wl.split_by_branch(c)
              if part.branches and part.branches[0] in branches] for step in wl.calls]
    slots = {k: v for k, v in wl.cache_slots.items() if k[0] in branches}
    return replace(wl, calls=calls, cache_slots=slots)


def _groups(wl: Workload, lay: Layout) -> list[tuple[str, ...]]:
    if lay.cfg == 1:
        return [tuple(b for b, _ in wl.rows())]
    order = [b for b in CALL_ORDER[wl.cfg] if any(r[0] == b for r in wl.rows())]
    return [(b,) for b in order]


def replay_parallel(wl: Workload, plat: Platform, system: str, lay: Layout, link: GPULink,
                    *, nme_timing: str = "model", prefetch: int = 1, record: bool = True,
                    weights: str = "resident") -> tuple[SystemResult, list[SystemResult]]:
    """Replay ``wl`` (already one GPU's shard: :func:`shard_shape`) as system ``system`` on
    ``lay``'s GPUs, each a ``plat``, joined by ``link``.

    Returns ``(total, per_group)``: ``per_group`` the representative GPU of each CFG group
    (its own counters); ``total`` a :class:`SystemResult` with the wall-clock latency, every
    GPU's bytes, segments, NME time and operations summed (a group's GPUs count ``sp``
    times), ``gpu_busy_s`` the mean over GPUs, the inter-GPU bytes of all GPUs
    (``p2p_bytes``, step exchanges and the final gather included) and ``p2p_s`` the longest
    wait of one GPU, and the first group's intervals.
    """
    if system not in SYSTEMS:
        raise ValueError(f"--system {system!r}: expected one of {', '.join(SYSTEMS)} or all")
    env = simpy.Environment()
    groups = _groups(wl, lay)
    comm = None
    if lay.sequence is not None:
        comm = Comm(wl.shape, lay.sp, lay.sequence, link, plat.gpu)
    devs = []
    for g in groups:
        gwl = wl if len(groups) == 1 else branch_workload(wl, g)
        d = _Replay(gwl, plat, system, nme_timing, prefetch, record, env=env, comm=comm)
        d.res.weights = weights
        devs.append(d)
    # every sample of a batched generation exchanges (and gathers) its own latent
    latents = latent_bytes(wl.shape) * wl.samples
    exchange = latents // lay.sp if lay.cfg > 1 else 0
    gather = latents * (lay.sp - 1) // lay.sp if lay.sp > 1 else 0
    extra = {"bytes": 0}

    def main():
        for s in range(wl.num_steps):
            if len(devs) == 1:
                yield from devs[0].step_calls(devs[0].wl.calls[s])
            else:
                procs = [env.process(d.step_calls(d.wl.calls[s])) for d in devs]
                yield simpy.AllOf(env, procs)
            if exchange:
                # every GPU sends its prediction shard to its partner, both at once
                yield env.timeout(link.latency_s + exchange / link.bw)
                extra["bytes"] += exchange * lay.gpus
        if gather:
            yield env.timeout(link.latency_s + gather / link.bw)
            extra["bytes"] += gather * lay.gpus

    env.run(until=env.process(main()))
    per = [d.finish() for d in devs]
    tot = SystemResult(system, SYSTEMS[system], weights=weights, latency_s=env.now)
    n = lay.sp
    # every counter (bytes, operations, segments, NME time) summed over the GPUs
    counters = [f.name for f in fields(SystemResult)
                if f.type in ("int", "float", int, float) and f.name not in _NOT_SUMMED]
    for r in per:
        for f in counters:
            setattr(tot, f, getattr(tot, f) + n * getattr(r, f))
        tot.gpu_busy_s += r.gpu_busy_s / len(per)
        tot.gpu_measured += r.gpu_measured
        tot.gpu_roofline += r.gpu_roofline
    tot.p2p_bytes += extra["bytes"]
    tot.p2p_s = max(r.p2p_s for r in per)
    tot.intervals = per[0].intervals
    return tot, per


def run_parallel(wl: Workload, plat: Platform, lay: Layout, link: GPULink,
                 systems: str = "abcdefg", *, nme_timing: str = "model", prefetch: int = 1,
                 record: bool = True) -> dict:
    """The ablation (:func:`coda.host.system.ablation.run_ablation`: rows, speedups against
    a and c, bottlenecks) of systems ``systems`` on ``lay``'s GPUs, ``wl`` one GPU's shard.
    Memory checks per GPU (its shard, its CFG group's cache entries, its own DIMMs); energy
    the sum over GPUs (:func:`gpu_energy`) plus the inter-GPU link's. Rows gain
    ``p2p_bytes`` (all GPUs, B), ``p2p_s`` (one GPU's longest wait on the link, s) and
    ``p2p_j`` (J)."""
    from .ablation import memory_plan, run_ablation

    groups = _groups(wl, lay)
    plans = [memory_plan(wl if len(groups) == 1 else branch_workload(wl, g), plat)
             for g in groups]
    mem = dict(plans[0])
    mem["fits"] = {s: next((p["fits"][s] for p in plans if not p["fits"][s][0]),
                           plans[0]["fits"][s]) for s in SYSTEMS}
    mem["cache_bytes_per_gpu"] = max(p["cache_bytes"] for p in plans)

    def one(system, weights):
        tot, per = replay_parallel(wl, plat, system, lay, link, nme_timing=nme_timing,
                                   prefetch=prefetch, record=record, weights=weights)
        return tot, gpu_energy(tot, per, lay, plat, link)

    abl = run_ablation(wl, plat, systems, nme_timing=nme_timing, prefetch=prefetch,
                       record=record, memory=mem, replayer=one)
    for s, row in abl["systems"].items():
        if row.get("fits"):
            r = abl["results"][s]
            row.update(p2p_bytes=r.p2p_bytes, p2p_s=r.p2p_s, p2p_j=row["energy"]["p2p_j"],
                       gpus=lay.gpus)
    return abl


def gpu_energy(tot: SystemResult, per: list[SystemResult], lay: Layout, plat: Platform,
               link: GPULink) -> dict:
    """Joules of a parallel replay by component: each GPU's machine
    (:func:`coda.host.system.energy.energy` of its group's representative over the whole
    generation, times the group's ``sp`` GPUs: every GPU draws its stalled power until the
    last finishes) summed per component, plus the inter-GPU link's ``p2p_j`` (all GPUs'
    bytes x 8 x ``link.pj_per_bit``); ``total_j`` all of it."""
    from .energy import energy

    out: dict = {}
    total = 0.0
    for r in per:
        e = energy(replace(r, latency_s=tot.latency_s, intervals=[]), plat)
        total += lay.sp * e["total_j"]
        _accumulate(out, {k: v for k, v in e.items() if k != "total_j"}, lay.sp)
    out["p2p_j"] = tot.p2p_bytes * 8 * link.pj_per_bit * 1e-12
    out["total_j"] = total + out["p2p_j"]
    return out


def _accumulate(out: dict, part: dict, times: float) -> None:
    """``out += times x part`` for every number in ``part``, nested dicts by key."""
    for k, v in part.items():
        if isinstance(v, dict):
            _accumulate(out.setdefault(k, {}), v, times)
        elif isinstance(v, (int, float)):
            out[k] = out.get(k, 0.0) + times * v
