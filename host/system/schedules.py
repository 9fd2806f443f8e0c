"""Cache schedules for any traced model: which operators are reused at each step and branch.

:class:`coda.host.cache.schedule.Schedule` names the shipped Latte's operators ``(layer, op)``;
paper-scale models have other operators (Wan: self/cross attention and FFN per block;
HunyuanVideo: dual- and single-stream blocks), so a schedule here is per (step, branch) a set
of operator *indices* of a :class:`coda.host.system.shapes.ModelShape`
(:class:`ModelSchedule`). Three ways to get one
(:func:`resolve`: ``uniform``, a shipped-model schedule ``FILE`` transferred by
:func:`transfer`, or ``coda``, the shipped searched schedule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from coda.host.cache.policies.uniform import UniformIntervalPolicy
from coda.host.cache.schedule import BRANCHES, Schedule, ScheduleError, maximal_runs

from .shapes import ModelShape

__all__ = ["ModelSchedule", "coda_schedule_path", "uniform", "transfer", "resolve",
           "branches_of", "segment_runs", "parse_intervals"]



def coda_schedule_path() -> Path:
    """Where ``--schedule coda`` finds the searched schedule (a Schedule JSON written by
    ``coda schedule search``, issue 13): :data:`coda.host.cache.shipped.SHIPPED_SCHEDULE`."""
    from coda.host.cache.shipped import SHIPPED_SCHEDULE

    return Path(SHIPPED_SCHEDULE)


def branches_of(shape: ModelShape) -> tuple[str, ...]:
    """The CFG branches a generation of ``shape`` runs (guidance-distilled: cond only)."""
    return ("cond",) if shape.cfg == "distilled" else BRANCHES


@dataclass(frozen=True)
class ModelSchedule:
    """Per (step, branch) the indices of ``shape.ops`` that are reused.

    Attributes:
        num_steps: denoising steps. num_ops: cacheable operators of the model.
        reuse: (step, branch) -> frozenset of operator indices.
        name: label. source: how it was made (``"uniform rule"``, ``"transferred from
            FILE (S steps x L layers)"``, ``"identity"``). fixups: reuses turned into
            computes because nothing was cached yet (transfer only).
    """
    num_steps: int
    num_ops: int
    reuse: Mapping[tuple[int, str], frozenset] = field(default_factory=dict)
    name: str = "custom"
    source: str = ""
    fixups: int = 0

    def reused(self, step: int, branch: str) -> frozenset:
        return self.reuse.get((step, branch), frozenset())

    def store_after_compute(self, step: int, branch: str, index: int, history: int = 1) -> bool:
        """Whether operator ``index``'s output computed at ``step`` is written to the cache:
        the cache engine's rule, :meth:`coda.host.cache.schedule.Schedule.store_after_compute`
        (applied to operator indices, not re-derived): if the next step reuses it, and with
        ``history=2`` (the forecast mode, :mod:`coda.host.cache.forecast`) also if the step
        after next does. Raises ValueError for a history other than 1 or 2."""
        return Schedule.store_after_compute(self, step, branch, index, history)

    def computed_pairs(self, branch: str, index: int) -> dict[int, tuple[int, int]]:
        """The steps at which operator ``index`` is a forecast term in ``branch``, ``t ->
        (k, k')`` (:meth:`coda.host.cache.schedule.Schedule.computed_pairs`, on operator
        indices)."""
        return Schedule.computed_pairs(self, branch, index)

    def ops_skipped_fraction(self, branches: tuple[str, ...] = BRANCHES) -> float:
        total = self.num_steps * len(branches) * self.num_ops
        return sum(len(self.reused(s, b)) for s in range(self.num_steps) for b in branches) / total

    def stored(self, branch: str, history: int = 1) -> set[int]:
        """Operators whose output is written to the cache at some step of ``branch`` (with
        ``history`` as in :meth:`store_after_compute`)."""
        return {i for s in range(self.num_steps) for i in range(self.num_ops)
                if i not in self.reused(s, branch)
                and self.store_after_compute(s, branch, i, history)}

    def describe(self, branches: tuple[str, ...] = BRANCHES) -> dict:
        return {"name": self.name, "source": self.source, "num_steps": self.num_steps,
                "ops_skipped_fraction": round(self.ops_skipped_fraction(branches), 4),
                "fixups": self.fixups}


def segment_runs(shape: ModelShape, reused) -> list[list[int]]:
    """Maximal runs of consecutive reused operators (forward indices), split where a computed
    non-cacheable operation follows an operator (:attr:`OpShape.barrier_after`):
    :func:`coda.host.cache.schedule.maximal_runs` over the shape's operators."""
    return maximal_runs([op.index for op in shape.ops], reused,
                        [op.index for op in shape.ops if op.barrier_after])


def _check_and_fix(shape: ModelShape, num_steps: int, reuse: dict, branches) -> tuple[dict, int]:
    fixed, fixups = {}, 0
    for b in branches:
        computed: set[int] = set()
        for s in range(num_steps):
            want = set(reuse.get((s, b), ()))
            never = want - computed
            fixups += len(never)
            want -= never
            if want:
                fixed[(s, b)] = frozenset(want)
            computed |= set(range(len(shape.ops))) - want
    return fixed, fixups


def uniform(shape: ModelShape, num_steps: int, interval: int = 2, warmup: int = 5,
            cooldown: int = 0, intervals: Mapping[str, int] | None = None) -> ModelSchedule:
    """:class:`UniformIntervalPolicy` (``default_interval=interval``, per-type ``intervals``)
    on ``shape``'s operators: after ``warmup`` steps an operator of kind ``t`` is recomputed
    when ``(s - warmup) % k_t == 0``. Defaults are ``coda run``'s (interval 2, warmup 5).

    Raises ScheduleError (a ValueError) for an interval < 1, warmup < 1 or an unknown type.
    """
    policy = UniformIntervalPolicy(intervals=dict(intervals or {}), default_interval=interval,
                                   warmup=warmup, cooldown=cooldown)
    if num_steps < 1:
        raise ScheduleError(f"--steps {num_steps}: expected >= 1")
    reuse = {}
    for s in range(policy.warmup, max(policy.warmup, num_steps - policy.cooldown)):
        refs = frozenset(o.index for o in shape.ops
                         if (s - policy.warmup) % policy.interval(o.kind) != 0)
        for b in branches_of(shape):
            if refs:
                reuse[(s, b)] = refs
    per = ",".join(f"{k}={v}" for k, v in sorted((intervals or {}).items()))
    label = (f"uniform(interval={interval}{',' + per if per else ''},warmup={warmup},"
             f"cooldown={cooldown})")
    return ModelSchedule(num_steps, len(shape.ops), reuse, name=label,
                         source="uniform rule on the model's own operators (not transferred)")


def transfer(schedule: Schedule, shape: ModelShape, num_steps: int,
             label: str = "") -> ModelSchedule:
    """``schedule`` (made for the shipped model) mapped onto ``shape`` at ``num_steps`` steps
    by operator type, relative depth and relative step (the rule: :func:`resolve`)."""
    if num_steps < 1:
        raise ScheduleError(f"--steps {num_steps}: expected >= 1")
    src_s, src_l = schedule.num_steps, schedule.num_layers
    tgt_l = shape.num_layers
    reuse: dict = {}
    for b in branches_of(shape):
        for s in range(num_steps):
            ss = min(src_s - 1, int((s + 0.5) * src_s / num_steps))
            src = schedule.reused(ss, b)
            refs = frozenset(o.index for o in shape.ops
                             if (min(src_l - 1, int((o.layer + 0.5) * src_l / tgt_l)), o.kind) in src)
            if refs:
                reuse[(s, b)] = refs
    reuse, fixups = _check_and_fix(shape, num_steps, reuse, branches_of(shape))
    from .presets import shipped_presets

    identity = (shape.name in shipped_presets() and num_steps == src_s and tgt_l == src_l)
    how = ("identity (the shipped model at the schedule's own steps)" if identity else
           f"transferred from {label or schedule.name} ({src_s} steps x {src_l} layers of the "
           f"shipped model) by operator type, relative depth and relative step")
    return ModelSchedule(num_steps, len(shape.ops), reuse, name=schedule.name, source=how,
                         fixups=fixups)


def resolve(spec: str, shape: ModelShape, num_steps: int, *, interval: int = 2,
            warmup: int = 5, intervals: Mapping[str, int] | None = None,
            coda_path: Path | None = None) -> ModelSchedule:
    """``--schedule`` value -> :class:`ModelSchedule` for ``shape``.

    - ``uniform``: :class:`coda.host.cache.policies.uniform.UniformIntervalPolicy`'s rule applied to
      the model's operators directly (each operator recomputed every ``k`` steps of its kind,
      after ``warmup`` steps): nothing is transferred;
    - ``FILE``: a :class:`Schedule` JSON made for the shipped model, *transferred*: target
      operator ``(layer l of L, kind)`` at step ``s of S`` is reused iff the source schedule
      reuses ``(floor((l + 1/2) L_src / L), kind)`` at step ``floor((s + 1/2) S_src / S)`` in the
      same branch (relative depth, relative step, operator type; ``kind`` is the shipped
      operator type each target operator corresponds to, :attr:`OpShape.kind`). A reuse of
      something not computed at an earlier step of the branch is turned into a compute and
      counted (``fixups``). For the shipped model at the schedule's own steps the mapping is the
      identity;
    - ``coda``: the searched schedule of the shipped model that ``coda schedule search`` ships
      (issue 13) at :data:`coda.host.cache.shipped.SHIPPED_SCHEDULE`, transferred like a file;
      refused while that file does not exist.

    Args:
        spec: ``"uniform"``, ``"coda"`` or a path to a :class:`Schedule` JSON.
        shape: the model. num_steps: denoising steps.
        interval, warmup, intervals: the uniform rule's (intervals: op type -> k).
        coda_path: where the searched schedule lives (default :func:`coda_schedule_path`).
    Raises:
        ValueError: ``coda`` before the searched schedule exists, an unreadable or invalid
            file (message names the value and what is expected).
    """
    from coda.host.cache.shipped import load_schedule

    if spec == "uniform":
        return uniform(shape, num_steps, interval, warmup, intervals=intervals)
    if spec == "coda":
        path = Path(coda_path or coda_schedule_path())
        if not path.is_file():
            raise ValueError(f"--schedule coda: the searched CODA schedule is not shipped yet "
                             f"(expected {path}, written by `coda schedule search`, issue 13); "
                             "use --schedule uniform or --schedule FILE")
        label = f"coda ({path.name})"
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--schedule {spec!r}: expected 'coda', 'uniform' or a Schedule "
                             "JSON file (coda.host.cache.schedule.Schedule.to_json)")
        label = str(path)
    sched = load_schedule(path, what=f"--schedule {spec}" if spec != "coda"
                          else f"--schedule coda ({path})")
    return transfer(sched, shape, num_steps, label)


def parse_intervals(text: str | None) -> dict[str, int]:
    """``"cross_attn=6,temporal_attn=4"`` -> {op type: k}. Raises ValueError naming the value."""
    from coda.host.cache.schedule import OP_TYPES

    out: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, _, val = part.partition("=")
        key = key.strip()
        try:
            k = int(val)
        except ValueError:
            k = 0
        if key not in OP_TYPES or k < 1:
            raise ValueError(f"--intervals {text!r}: expected TYPE=K pairs, TYPE one of "
                             f"{', '.join(OP_TYPES)} and K >= 1")
        out[key] = k
    return out
