"""One transformer forward under the cache engine (:mod:`coda.host.cache.engine`): a step
of one or two CFG branches, as :class:`StepRun` runs it.

The hooked blocks' calls are recorded, not run: consecutive calls whose residual streams pass
straight from block to block form a program (:class:`_Program`), run when something other
than the next block needs its outputs (:class:`coda.host.cache.arch.deferred.Deferred`).
A program runs one trunk per CFG branch, operator by operator: for every operator and row
the policy decides (:class:`~coda.host.cache.policies.base.Decision`); a computed operator
runs on the xPU (its output stored to its cache slot, its input kept as a monitor reference,
as the decision says), a reused one joins its row's segment
(:mod:`coda.host.cache.segments`). CFG interleaving: a trunk pauses right after launching
segments, so the other branch computes on the xPU while the NMEs run them. :class:`StepRun` is also what the
architectures' block specs see of the engine.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from coda.host.cache import segments
from coda.host.cache.arch.base import BlockCall, BlockSpec
from coda.host.cache.arch.deferred import Deferred, continues, materialized
from coda.host.cache.events import MonitorEvent, OpEvent
from coda.host.cache.policies.base import Decision, OpQuery
from coda.host.cache.schedule import ScheduleError
from coda.host.cache.segments import ReusedOp
from coda.host.nme.ops import quant_int8

__all__ = ["StepRun", "PRIMARY"]

PRIMARY = "hidden"      # the video-token stream: monitors and the Latte-compatible slot keys


@dataclass(eq=False)
class _Node:
    """One recorded block call of a program; ``lazies``: its deferred outputs still alive;
    ``values``: its real outputs per stream once the program ran."""
    call: BlockCall
    lazies: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    values: dict[str, torch.Tensor] | None = None


@dataclass(eq=False)
class _Program:
    """Consecutive block calls whose residual streams pass straight from one to the next:
    run together, one trunk per CFG branch, segments spanning their boundaries.

    inputs: stream -> the real tensor entering the first block; canon: their canonical
    shapes; nodes: the calls in order; executed: it ran (or is running)."""
    inputs: dict[str, torch.Tensor]
    canon: dict[str, torch.Size]
    nodes: list[_Node] = field(default_factory=list)
    executed: bool = False


class StepRun:
    """One transformer forward (one step, one or two branches) under the hook's policy: the
    programs its block calls form, their execution, and the engine state the block specs see
    (:class:`coda.host.cache.arch.base.StepState`: ``b``, ``h``, ``take``, ``put``, ``rows``).

    Rows are the batch indices; row ``i`` is sample ``sample_of[i]`` of branch ``branch_of[i]``;
    ``pending[i]``: the row's reused operators queued for its segment
    (:class:`~coda.host.cache.segments.ReusedOp`). ``hook``: the
    :class:`~coda.host.cache.engine.CodaCacheHook` (config, state, policy, events).
    ``failure``: the first exception raised in the engine where the model's code called it
    (a block hook, a deferred tensor), ``failure_traceback`` its traceback then; once set,
    no recorded output is computed any more and the hook's forward raises it (:meth:`fail`).
    """

    def __init__(self, hook, model, branches, step):
        self.hook, self.m = hook, model
        self.driver, self.dtype = hook.config.driver, hook.dtype
        self.ops = hook.model_ops
        self.step, self.num_steps = step, hook.state.num_steps
        self.branch_of = branches
        counters: dict[str, int] = {}
        self.sample_of = []
        for br in branches:
            self.sample_of.append(counters.get(br, 0))
            counters[br] = counters.get(br, 0) + 1
        self.b = len(branches)
        self.pending: list[list[ReusedOp]] = [[] for _ in branches]
        self.h: dict[str, torch.Tensor] = {}
        self.program: _Program | None = None
        self._called: set[int] = set()
        self.failure: BaseException | None = None
        self.failure_traceback = None

    def fail(self, exc: BaseException) -> None:
        """Record an exception raised in the engine under the model's code (the first one
        counts). That code may catch it or replace it (torch's binary operators turn a
        TypeError into NotImplemented and try the reflected operator), so the hook's forward
        raises the recorded one, as itself, when the model's forward ends."""
        if self.failure is None:
            self.failure, self.failure_traceback = exc, exc.__traceback__

    def event_fields(self, row: int) -> dict:
        """The event fields that place a row: generation, step, branch, sample."""
        return dict(generation=self.hook.state.generation, step=self.step,
                    num_steps=self.num_steps, branch=self.branch_of[row],
                    sample=self.sample_of[row], cache_memory=self.hook.cache_memory)

    # ---- StepState: what the block specs see ------------------------------------------
    def take(self, stream: str, samples: torch.Tensor) -> torch.Tensor:
        h = self.h[stream]
        return h if len(samples) == self.b else h.index_select(0, samples)

    def put(self, stream: str, samples: torch.Tensor, value: torch.Tensor) -> None:
        if len(samples) == self.b:
            self.h[stream] = value.contiguous()
        else:   # the same values, on these rows only
            self.h[stream] = self.h[stream].index_copy(0, samples, value.contiguous())

    def rows(self, t, samples: torch.Tensor, per: int = 1):
        if t is None or len(samples) == self.b:
            return t
        if per == 1:
            return t.index_select(0, samples)
        return t.reshape(self.b, per, *t.shape[1:]).index_select(0, samples).reshape(-1, *t.shape[1:])

    @property
    def c(self) -> int:
        return self.h[PRIMARY].shape[-1]

    @property
    def device(self) -> torch.device:
        """Where the model's residual streams are (the engine's index tensors and gates go
        there)."""
        return self.h[PRIMARY].device

    def tokens(self) -> dict[str, int]:
        """Tokens per sample of each stream."""
        return {s: h[0].numel() // h.shape[-1] for s, h in self.h.items()}

    # ---- the model's blocks: record, run on demand ------------------------------------
    def block_call(self, spec: BlockSpec, block: torch.nn.Module, layer: int, args, kwargs):
        """A hooked block's call: recorded into the open program (or a new one); returns its
        outputs as :class:`Deferred` tensors."""
        if id(block) in self._called:
            raise ValueError(f"layer {layer} ({spec.block_class}) called twice in one forward: "
                             "the CODA cache engine needs each block once per step")
        self._called.add(id(block))
        bound = spec.bind(block, args, kwargs)
        streams = {s: bound.pop(param) for s, param in spec.streams.items()}
        # anything else deferred that a block gets is computed now: the spec needs real values
        bound = {k: materialized(v) for k, v in bound.items()}
        call = BlockCall(spec, block, layer, bound)
        spec.check(call)
        if not self._continues(spec, streams):
            real = {s: materialized(x) for s, x in streams.items()}
            self.run_open()
            self.program = _Program(real, {s: spec.to_canonical(s, x, self.b).shape
                                           for s, x in real.items()})
        call.prep = spec.prepare(call, self.b)
        node = _Node(call)
        self.program.nodes.append(node)
        outs = [Deferred(self, node, s, x.shape, x.dtype, x.device) for s, x in streams.items()]
        return tuple(outs) if spec.returns_tuple else outs[0]

    def _continues(self, spec: BlockSpec, streams: dict) -> bool:
        """Whether a block with these stream inputs continues the open program: each input is
        the last block's output of that stream, moved at most by layout operations that land
        on the same canonical tokens (:func:`coda.host.cache.arch.deferred.continues`)."""
        p = self.program
        if p is None or p.executed or not p.nodes:
            return False
        last = p.nodes[-1]
        if set(streams) != set(last.call.spec.streams):
            return False
        return all(isinstance(x, Deferred) and x._owner is self and x._node is last
                   and x._stream == s and x._value is None
                   and continues(x, last.call.spec, spec, s, p.canon[s], self.b)
                   for s, x in streams.items())

    def node_value(self, node: _Node, stream: str) -> torch.Tensor:
        """A recorded block's real output (runs its program first). Raises RuntimeError for
        an output dropped when its program ran (the engine keeps every one still referenced)
        or after the step failed (:meth:`fail`)."""
        if node.values is None:
            if self.failure is not None:
                raise RuntimeError("CODA cache engine: a block output was needed after the step "
                                   f"failed by {type(self.failure).__name__}")
            p = self.program
            if p is None or p.executed or not any(n is node for n in p.nodes):
                raise RuntimeError("CODA cache engine: a block output was needed after its "
                                   "program ran without keeping it")
            self._execute(p)
        return node.values[stream]

    def run_open(self) -> None:
        """Run the open program, if any (a step's programs run in the order recorded)."""
        if self.program is not None and not self.program.executed:
            self._execute(self.program)

    def finish(self, output):
        """After the model's forward: run what is still recorded; the output with any deferred
        tensor replaced by its value."""
        self.run_open()
        assert not any(self.pending), "segments left pending after a step"
        if isinstance(output, Deferred):
            output = output.materialize()
        elif isinstance(output, tuple):
            output = type(output)(materialized(o) for o in output)
        elif isinstance(output, dict):    # diffusers' ModelOutput
            for k, v in list(output.items()):
                if isinstance(v, Deferred):
                    output[k] = v.materialize()
        if self.hook.policy.output_history:
            self.record_output(output)
        return output

    def _execute(self, p: _Program) -> None:
        """Run a program: one trunk per CFG branch over its blocks, operator by operator. It is
        cut after a block whose outputs someone else still holds (their values are kept)."""
        p.executed = True
        nodes = p.nodes
        first = nodes[0].call.spec
        # a copy the engine owns (segments write rows in place)
        self.h = {s: first.to_canonical(s, x, self.b).clone(memory_format=torch.contiguous_format)
                  for s, x in p.inputs.items()}
        p.inputs = {}
        cuts = [i for i, n in enumerate(nodes[:-1]) if len(n.lazies)] + [len(nodes) - 1]
        start = 0
        for cut in cuts:
            self._run_trunks(nodes[start:cut + 1])
            node, last = nodes[cut], cut == len(nodes) - 1
            node.values = {s: node.call.spec.from_canonical(s, h if last else h.clone())
                           for s, h in self.h.items()}
            start = cut + 1

    def _run_trunks(self, nodes: list[_Node]) -> None:
        branches = list(dict.fromkeys(self.branch_of))
        if self.hook.config.interleave_cfg and len(branches) > 1:
            groups = [[r for r, br in enumerate(self.branch_of) if br == name] for name in branches]
        else:
            groups = [list(range(self.b))]
        # CFG interleaving: each branch's trunk pauses right after launching a segment, so the
        # other branch computes on the xPU while the NMEs run it (the RTL simulators are
        # processes of their own); the program ends when both trunks are done.
        trunks = [self._trunk(nodes, rows) for rows in groups]
        while trunks:
            for trunk in list(trunks):
                try:
                    next(trunk)
                except StopIteration:
                    trunks.remove(trunk)

    def _trunk(self, nodes: list[_Node], rows: list[int]):
        """The blocks ``nodes`` for ``rows`` (a generator: it yields after launching
        segments, so another branch's trunk may run meanwhile)."""
        for node in nodes:
            for op in node.call.spec.ops:
                yield from self.operator(node.call, op, rows)
        yield from self.flush_rows(rows)

    # ---- one operator for some rows of the call -------------------------------------
    def operator(self, call: BlockCall, op: str, rows: list[int]):
        """Decide, then compute or queue for a segment, ``(call.layer, op)`` for ``rows`` (a
        generator, see :meth:`flush_rows`)."""
        hook, st = self.hook, self.hook.state
        layer, spec = call.layer, call.spec
        index = self.ops.index((layer, op))
        decisions: dict[int, Decision] = {}
        history = index == 0 and hook.policy.input_history
        for row in rows:
            br, j = self.branch_of[row], self.sample_of[row]
            bstate = st.branches[br]
            out_key, in_key = hook.key(br, j, layer, op), hook.key(br, j, layer, op, "in")
            slot, kept = bstate.slots.get(out_key), bstate.kept.get(in_key)
            q = OpQuery(step=self.step, num_steps=self.num_steps, branch=br, sample=j,
                        layer=layer, op=op, index=index, num_layers=self.ops.num_layers,
                        cached_step=None if slot is None else slot[1],
                        kept_step=None if kept is None else kept[1],
                        segment_open=bool(self.pending[row]), model_ops=self.ops,
                        history=hook.config.history,
                        _input_change=lambda row=row: self.input_change(row, layer, op, index),
                        _input_accel=(lambda row=row: self.input_accel(row, layer, op))
                        if history else None,
                        _output_accel=(lambda row=row: self.output_accel(row, layer, op))
                        if index == 0 and hook.policy.output_history else None)
            if history:
                self.record_input(row)
            d = hook.policy.decide(q)
            if d.reuse and slot is None:
                raise ScheduleError(
                    f"step {self.step}, branch {br}, sample {j}: reuse of ({layer}, {op!r}) "
                    "needs a cached output, but none was stored")
            decisions[row] = d
        compute = [row for row in rows if not decisions[row].reuse]
        reuse = [row for row in rows if decisions[row].reuse]
        if reuse:
            picked = torch.tensor(reuse, dtype=torch.long, device=self.device)
            gates = {s: g.to(self.device, self.dtype)   # an ungated residual's ones: host-made
                     for s, g in spec.gates(self, call, op, picked).items()}
            for pos, row in enumerate(reuse):
                self.pending[row].append(ReusedOp({s: g[pos] for s, g in gates.items()}, layer,
                                                  op, index, decisions[row].reason))
        if not compute:
            return
        yield from self.flush_rows(compute)
        samples = torch.tensor(compute, dtype=torch.long, device=self.device)
        x_before = {row: self.h[PRIMARY][row] for row in compute if decisions[row].keep_input}
        out = spec.compute(self, call, op, samples)
        tokens = sum(self.tokens().values())
        for pos, row in enumerate(compute):
            d = decisions[row]
            stored = self.store(row, layer, op, {s: o[pos] for s, o in out.items()}) if d.store else 0
            kept = self.keep_input(row, layer, op, x_before[row]) if d.keep_input else 0
            hook.emit(OpEvent(**self.event_fields(row), layer=layer, op=op, index=index,
                              reused=False, reason=d.reason, tokens=tokens,
                              channels=self.c, dtype=hook.fmt, stored_bytes=stored,
                              kept_bytes=kept))

    def bytes_written(self) -> int:
        """The driver's ``bytes_written`` so far (host -> rank memories)."""
        return self.driver.stats["bytes_written"]

    def store(self, row: int, layer: int, op: str, outs: dict[str, torch.Tensor]) -> int:
        """Write one row's pre-gate outputs (per stream, canonical [..., C]) to their slots, in
        the NME format or, with ``cache_format="int8"``, quantised per group of G channels
        (:func:`coda.host.nme.ops.quant_int8`, from the model's dtype); returns the bytes
        written (int8: q and scales). In forecast mode (``history`` 2) the entry there becomes
        the older one first (:meth:`keep_previous`)."""
        br, j = self.branch_of[row], self.sample_of[row]
        slots = self.hook.state.branches[br].slots
        before = self.bytes_written()
        for stream, out in outs.items():
            key = self.hook.key(br, j, layer, op, stream=stream)
            if self.hook.config.history == 2:
                self.keep_previous(slots, key, self.hook.key(br, j, layer, op, "prev", stream))
            tensor = out.reshape(-1, self.c)
            if self.hook.group is not None:     # int8 entry: quantised here, on the xPU
                q, scale = quant_int8(tensor, self.hook.group, self.dtype)
                self.driver.store_int8(key, q, scale, self.hook.group, group=(br, j, stream))
            else:
                tensor = tensor.to(self.dtype).contiguous()
                self.driver.store(key, tensor, group=(br, j, stream))
            slots[key] = (tuple(tensor.shape), self.step)
        return self.bytes_written() - before

    def keep_previous(self, slots: dict, key, prev) -> None:
        """Make the entry at ``key`` the older entry ``prev`` of a forecast: the driver swaps
        the two slots (host-side slot table, no data moves), so the next store at ``key``
        overwrites the entry older than both in place."""
        if key not in slots:
            return
        self.driver.swap(key, prev)
        slots[key], slots[prev] = slots.get(prev), slots[key]
        if slots[key] is None:
            del slots[key]

    def keep_input(self, row: int, layer: int, op: str, x: torch.Tensor) -> int:
        """Keep one row's operator input (video stream, canonical) in rank memory as a monitor
        reference, with ``Σ|x|`` in fp32; returns the bytes written."""
        br, j = self.branch_of[row], self.sample_of[row]
        tensor = x.reshape(-1, self.c).to(self.dtype).contiguous()
        key = self.hook.key(br, j, layer, op, "in")
        before = self.bytes_written()
        self.driver.store(key, tensor, group=(br, j, PRIMARY))
        norm = float(tensor.float().abs().sum())
        self.hook.state.branches[br].kept[key] = (tuple(tensor.shape), self.step, norm)
        return self.bytes_written() - before

    def input_change(self, row: int, layer: int, op: str, index: int) -> float:
        """The relative L1 change of a row's operator input (video stream) against its kept
        reference, the numerator on the NMEs (``driver.l1_to_slot``); emits a MonitorEvent."""
        self.flush(row)
        br, j = self.branch_of[row], self.sample_of[row]
        key = self.hook.key(br, j, layer, op, "in")
        shape, ref_step, norm = self.hook.state.branches[br].kept[key]
        x16 = self.h[PRIMARY][row].reshape(-1, self.c).to(self.dtype).contiguous()
        self.driver.wait()      # so the counters below see this check alone
        s = self.driver.stats
        before, cycles, programs = (s["bytes_written"] + s["cmd_bytes"], s["nme_cycles"],
                                    s["programs"])
        l1 = self.driver.l1_to_slot(x16, key)
        value = _relative(l1, norm)
        self.hook.emit(MonitorEvent(
            **self.event_fields(row), layer=layer, op=op, index=index, reference_step=ref_step,
            value=value, bytes_to_nmp=s["bytes_written"] + s["cmd_bytes"] - before,
            programs=self.driver.stats["programs"] - programs,
            nme_cycles=self.driver.stats["nme_cycles"] - cycles))
        return value

    def record_input(self, row: int) -> None:
        """Keep a row's block-0 input (video stream, fp32) of this step on the xPU, the last
        three steps per sample and branch (:meth:`OpQuery.input_accel`)."""
        _keep(self.hook.state.branches[self.branch_of[row]].inputs, self.sample_of[row],
              self.step, self.h[PRIMARY][row])

    def input_accel(self, row: int, layer: int, op: str) -> float | None:
        """The relative second difference of a row's block-0 input over this step and the
        two before, on the xPU in fp32 (:meth:`OpQuery.input_accel`); None without both
        earlier steps. Emits a MonitorEvent (``probe="accel"``)."""
        br, j = self.branch_of[row], self.sample_of[row]
        hist = self.hook.state.branches[br].inputs.get(j, [])
        if [s for s, _ in hist] != [self.step - 2, self.step - 1, self.step]:
            return None
        value = _relative(*_second_difference(hist))
        self.hook.emit(MonitorEvent(
            **{**self.event_fields(row), "cache_memory": "device"}, layer=layer, op=op,
            index=0, reference_step=self.step - 1, value=value, bytes_to_nmp=0, programs=0,
            nme_cycles=0, probe="accel"))
        return value

    def record_output(self, output) -> None:
        """Keep every row's model output (its first tensor, batch-first, fp32) of this step on
        the xPU, the last three steps per sample and branch (:meth:`OpQuery.output_accel`)."""
        y = output
        while not isinstance(y, torch.Tensor):     # (sample, ...) or a ModelOutput
            y = next(iter(y.values())) if isinstance(y, dict) else y[0]
        for row in range(self.b):
            _keep(self.hook.state.branches[self.branch_of[row]].outputs, self.sample_of[row],
                  self.step, y[row])

    def output_accel(self, row: int, layer: int, op: str) -> float | None:
        """The relative second difference of a row's sample's model outputs over the three
        steps before this one, summed over the sample's CFG branches that have all three, on
        the xPU in fp32 (:meth:`OpQuery.output_accel`); None when no branch has them. Emits
        a MonitorEvent (``probe="output"``)."""
        j, want = self.sample_of[row], [self.step - 3, self.step - 2, self.step - 1]
        num = norm = 0.0
        found = False
        for bstate in self.hook.state.branches.values():
            hist = bstate.outputs.get(j, [])
            if [s for s, _ in hist] != want:
                continue
            d, n = _second_difference(hist)
            num, norm, found = num + d, norm + n, True
        if not found:
            return None
        value = _relative(num, norm)
        self.hook.emit(MonitorEvent(
            **{**self.event_fields(row), "cache_memory": "device"}, layer=layer, op=op,
            index=0, reference_step=self.step - 1, value=value, bytes_to_nmp=0, programs=0,
            nme_cycles=0, probe="output"))
        return value

    # ---- segments (:mod:`coda.host.cache.segments`) ---------------------------------
    def flush_rows(self, rows: list[int]):
        """Run the pending segments of ``rows`` (a generator): launch them on the NMEs, yield
        once so another branch's trunk computes meanwhile, then take their results."""
        launched = [segments.launch(self, row) for row in rows if self.pending[row]]
        if launched:
            yield
        for seg in launched:
            segments.finish(self, seg)

    def flush(self, row: int) -> None:
        """Run a row's pending segment now (no other work overlaps it)."""
        if self.pending[row]:
            segments.finish(self, segments.launch(self, row))


def _keep(history: dict, sample: int, step: int, x: torch.Tensor) -> None:
    """Append (step, an fp32 copy of ``x``) to ``history[sample]``, keeping the last three."""
    hist = history.setdefault(sample, [])
    hist.append((step, x.detach().to(torch.float32, copy=True)))
    del hist[:-3]


def _second_difference(hist) -> tuple[float, float]:
    """(Σ|x_new - 2 x_mid + x_old|, Σ|x_mid|) of three kept (step, tensor) pairs, oldest
    first: the numerator and denominator of a relative second difference."""
    (_, old), (_, mid), (_, new) = hist
    return float((new - 2.0 * mid + old).abs().sum()), float(mid.abs().sum())


def _relative(num: float, norm: float) -> float:
    """``num / norm`` of a monitor's relative change; 0 for 0 / 0, inf for x / 0 (x > 0)."""
    return num / norm if norm > 0 else (0.0 if num == 0 else float("inf"))
