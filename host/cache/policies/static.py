"""Static policies: the decisions of a precomputed :class:`coda.host.cache.schedule.Schedule`.

Reuse exactly what the schedule lists at (step, branch); write a computed output to its cache
slot only when the next step reuses it. The uniform-interval, PAB-style and searched (CODA)
schedules are all static: they differ only in how the schedule is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coda.host.cache.schedule import ModelOps, Schedule, ScheduleError

from .base import CachePolicy, Decision, OpQuery

__all__ = ["StaticPolicy", "SchedulePolicy"]


class StaticPolicy(CachePolicy):
    """Base of the static policies: subclasses give :meth:`schedule_for`."""

    def build(self, num_steps: int, num_layers: int) -> Schedule:
        """The schedule of a run of ``num_steps`` steps on a ``num_layers``-layer model.
        Raises ScheduleError if the policy has none for that shape."""
        raise NotImplementedError

    def build_for(self, num_steps: int, ops: ModelOps) -> Schedule:
        """The schedule of a run on a model of another architecture than Latte (its operators
        ``ops``). Raises ScheduleError unless the policy knows that architecture (the base
        knows Latte only)."""
        raise ScheduleError(f"policy {self.name!r} makes Latte schedules only; this model is "
                            f"{ops.arch} (a uniform policy or a Schedule with its ops works)")

    def schedule_for(self, num_steps: int, ops: ModelOps) -> Schedule:
        """The schedule of a run of ``num_steps`` steps on the model of ``ops`` (any
        architecture; Latte's through :meth:`build`), built once per shape. Raises
        ScheduleError as :meth:`build` / :meth:`build_for`."""
        return self._schedule(num_steps, ops.num_layers, ops)

    def _schedule(self, num_steps: int, num_layers: int, ops: ModelOps | None = None) -> Schedule:
        cache = self.__dict__.setdefault("_built", {})
        if ops is not None and ops.arch == "latte" and ops == ModelOps.latte(num_layers):
            ops = None          # Latte: the classic build, so every static policy serves it
        key = (num_steps, num_layers) if ops is None else (num_steps, ops)
        if key not in cache:
            cache[key] = (self.build(num_steps, num_layers) if ops is None
                          else self.build_for(num_steps, ops))
        return cache[key]

    def decide(self, q: OpQuery) -> Decision:
        sched = self._schedule(q.num_steps, q.num_layers, q.model_ops)
        if q.ref in sched.reused(q.step, q.branch):
            return Decision(True, reason="schedule")
        return Decision(False, store=sched.store_after_compute(q.step, q.branch, q.ref,
                                                               q.history),
                        reason="schedule")


@dataclass(frozen=True, eq=False)
class SchedulePolicy(StaticPolicy):
    """A fixed :class:`Schedule` (e.g. one read from a file made by ``coda schedule search``).

    Raises ScheduleError when run with another step count or layer count than it was made for.
    """
    schedule: Schedule
    _built: dict = field(default_factory=dict, repr=False, compare=False)
    needs_schedule = True
    serves_forecast = True

    @classmethod
    def from_inputs(cls, inputs) -> "SchedulePolicy":
        """The run's searched schedule, ``inputs.schedule`` (a :class:`Schedule`); ValueError
        for anything else."""
        return cls(schedule_of(inputs))

    @property
    def name(self) -> str:
        return self.schedule.name

    def build_for(self, num_steps: int, ops: ModelOps) -> Schedule:
        s = self.schedule
        if s.num_steps != num_steps or s.model_ops() != ops:
            raise ScheduleError(
                f"schedule {s.name!r} is for {s.num_steps} steps of a {s.model_ops().arch} model "
                f"with {s.num_layers} layers; this run has {num_steps} steps of a {ops.arch} "
                f"model with {ops.num_layers} layers")
        return s

    def build(self, num_steps: int, num_layers: int) -> Schedule:
        s = self.schedule
        if s.ops is not None:
            return self.build_for(num_steps, ModelOps.latte(num_layers))
        if (s.num_steps, s.num_layers) != (num_steps, num_layers):
            raise ScheduleError(
                f"schedule {s.name!r} is for {s.num_steps} steps x {s.num_layers} layers; "
                f"this run has {num_steps} steps x {num_layers} layers")
        return s

    def describe(self) -> dict:
        return {"name": self.name, "ops_skipped_fraction": self.schedule.ops_skipped_fraction()}


def schedule_of(inputs) -> Schedule:
    """``inputs.schedule`` if it is a :class:`Schedule`; ValueError naming the policy and
    where a schedule comes from otherwise."""
    if not isinstance(inputs.schedule, Schedule):
        raise ValueError(f"policy {inputs.name!r} needs a schedule "
                         "(coda.host.cache.shipped.load_schedule or "
                         "coda.experiments.search.search_steps), got "
                         f"{type(inputs.schedule).__name__}")
    return inputs.schedule
