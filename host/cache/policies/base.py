"""The policy interface of the cache engine: decide before each operator, observe after it,
reset between generations.

The engine (:mod:`coda.host.cache.engine`) asks its policy, for every cacheable operator of
every sample of every CFG branch at every step, in forward order, one question
(:class:`OpQuery`) and gets one :class:`Decision`: reuse the cached output or compute; after
computing, whether to write the output to the cache and whether to keep the operator's input
as a reference for a later :meth:`OpQuery.input_change`. Afterwards it hands the policy each
event it emitted (:mod:`coda.host.cache.events`). A policy never sees the engine's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

__all__ = ["OpQuery", "Decision", "CachePolicy", "PolicyInputs", "COMPUTE", "MIN_CACHED_STEPS",
           "calibrate_threshold", "refuse_short_run"]


@dataclass(frozen=True)
class Decision:
    """What to do with one operator of one sample.

    Attributes:
        reuse: True: apply the cached output (in a segment on the NMEs); False: compute.
        store: (computed only) write the output to its cache slot for a later reuse.
        keep_input: (computed only) keep the operator's input in rank memory as the reference
            of later :meth:`OpQuery.input_change` calls (costs its bytes on the host link).
        reason: a short label recorded in the event (e.g. ``"schedule"``, ``"fallback"``).
    """
    reuse: bool
    store: bool = False
    keep_input: bool = False
    reason: str = "schedule"


#: compute, keep nothing
COMPUTE = Decision(False, reason="compute")


@dataclass(frozen=True)
class OpQuery:
    """The engine's question about one operator of one sample.

    Attributes:
        step, num_steps: denoising step index and step count of the generation.
        branch: ``"cond"`` or ``"uncond"``. sample: index within the branch's batch.
        layer, op: the operator ((layer, op type)); index: its forward position.
        num_layers: layers of the model.
        cached_step: the step whose output the cache slot holds (None: nothing cached).
        kept_step: the step whose input was kept as reference (None: none kept).
        segment_open: the previous operator of this sample was reused and its segment has
            not run yet (this operator's input exists only after that segment).
        model_ops: the model's operators in forward order
            (:class:`coda.host.cache.schedule.ModelOps`; None: Latte's of ``num_layers``).
        history: computed outputs per operator the cache reads: 1 (reuse) or 2 (forecast,
            :mod:`coda.host.cache.forecast`); a static policy stores for it.
    """
    step: int
    num_steps: int
    branch: str
    sample: int
    layer: int
    op: str
    index: int
    num_layers: int
    cached_step: int | None
    kept_step: int | None
    segment_open: bool
    model_ops: Any = field(default=None, repr=False, compare=False)
    history: int = 1
    _input_change: Callable[[], float] | None = field(default=None, repr=False, compare=False)
    _input_accel: Callable[[], float | None] | None = field(default=None, repr=False,
                                                           compare=False)
    _output_accel: Callable[[], float | None] | None = field(default=None, repr=False,
                                                            compare=False)

    @property
    def ref(self) -> tuple[int, str]:
        return (self.layer, self.op)

    @property
    def cached(self) -> bool:
        return self.cached_step is not None

    def input_change(self) -> float:
        """Relative L1 change ``Σ|x - x_ref| / Σ|x_ref|`` of this operator's input against the
        input kept at step :attr:`kept_step`, computed on the NMEs (``l1_distance``); an
        open segment is run first (the input must exist). Emits a MonitorEvent.

        Raises ValueError if no input was kept (``kept_step is None``)."""
        if self._input_change is None or self.kept_step is None:
            raise ValueError(f"step {self.step}, {self.branch} sample {self.sample}, "
                             f"({self.layer}, {self.op!r}): no kept input to compare with "
                             "(decide keep_input=True when it is computed)")
        return self._input_change()

    def input_accel(self) -> float | None:
        """The relative second difference of the first operator's input (the block-0 input)
        over the last three steps, ``Σ|x_t - 2 x_{t-1} + x_{t-2}| / Σ|x_{t-1}|``, in fp32 on
        the xPU from the inputs it kept of the two steps before (the engine keeps them for a
        policy whose ``input_history`` is true); None before step 2. Emits a MonitorEvent
        (``probe="accel"``, no NME work, no host-link bytes). Raises ValueError for another
        operator than the first, or when the policy did not ask for the history."""
        return self._at_first_op(self._input_accel, "the input acceleration is of the first "
                                 "operator's input, kept for a policy with input_history = True")

    def output_accel(self) -> float | None:
        """The relative second difference of this sample's model output (the transformer's
        prediction, every CFG branch of the sample) over the three steps before this one,
        ``Σ_branches |y_{t-1} - 2 y_{t-2} + y_{t-3}| / Σ_branches |y_{t-2}|``, in fp32 on the
        xPU from the outputs it kept (the engine keeps them for a policy whose
        ``output_history`` is true); None before step 3. Emits a MonitorEvent
        (``probe="output"``, no NME work, no host-link bytes). Raises ValueError for another
        operator than the first, or when the policy did not ask for the history."""
        return self._at_first_op(self._output_accel, "the output acceleration is read at the "
                                 "first operator, from outputs kept for a policy with "
                                 "output_history = True")

    def _at_first_op(self, probe: Callable[[], float | None] | None, what: str) -> float | None:
        """``probe()`` at the first operator; ValueError naming ``what`` it needs otherwise
        (another operator, or no history kept: ``probe`` is None)."""
        if probe is None or self.index != 0:
            raise ValueError(f"step {self.step}, ({self.layer}, {self.op!r}): {what}")
        return probe()


class CachePolicy:
    """Base class of cache policies (one file each in :mod:`coda.host.cache.policies`).

    Subclasses implement :meth:`decide`; :meth:`reset` clears per-generation state (called
    when a generation starts); :meth:`observe` receives every event the engine emits.
    ``name`` labels reports.
    """
    name = "policy"
    #: the engine keeps the block-0 input of the last three steps per sample and branch on the
    #: xPU for :meth:`OpQuery.input_accel` (step DRA's acceleration probe)
    input_history = False
    #: the engine keeps the model output of the last three steps per sample and branch on the
    #: xPU for :meth:`OpQuery.output_accel` (step DRA's output probe)
    output_history = False
    #: what the registry (:data:`coda.host.cache.policies.POLICIES`) and the commands know of
    #: a policy class before building one: calibrated on a profile; built from a searched
    #: schedule; ``skip`` calibrates its parameters; ``--cache forecast`` serves it (a static
    #: policy: which steps compute is known in advance)
    needs_profile: ClassVar[bool] = False
    needs_schedule: ClassVar[bool] = False
    skip_calibrated: ClassVar[bool] = False
    serves_forecast: ClassVar[bool] = False

    @classmethod
    def from_inputs(cls, inputs: "PolicyInputs", **params) -> "CachePolicy":
        """The policy of this class for a run: calibrated to ``inputs.skip`` on
        ``inputs.profile`` or the run's shape, or built from ``inputs.schedule``, with the
        class's own keyword ``params`` (:func:`coda.host.cache.policies.get_policy`).
        Raises ValueError for a missing input; TypeError for a class not built by name."""
        raise TypeError(f"{cls.__name__} is not built by name (no from_inputs)")

    def reset(self) -> None:
        """Forget everything of the previous generation."""

    def decide(self, q: OpQuery) -> Decision:
        raise NotImplementedError

    def observe(self, event) -> None:
        """An event of the current generation (:mod:`coda.host.cache.events`)."""

    def describe(self) -> dict:
        """Parameters for reports (JSON-serialisable)."""
        return {"name": self.name}


def calibrate_threshold(make: Callable[[float], Any], skip_of: Callable[[Any], float],
                        skip: float, iters: int = 40):
    """The policy ``make(threshold)`` whose skip fraction ``skip_of(policy)`` is closest to
    ``skip``, by bisection on the threshold (TeaCache, MagCache, FBCache calibrate with it):
    the bracket [0, hi] starts at hi = 1 and doubles until ``skip_of(make(hi)) >= skip`` or hi
    reaches 1e6; then ``iters`` halvings; of the two ends the closer one (the lower on a tie).
    ``skip_of`` must not decrease with the threshold. Returns the policy."""
    lo, hi = 0.0, 1.0
    while skip_of(make(hi)) < skip and hi < 1e6:
        hi *= 2
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if skip_of(make(mid)) < skip:
            lo = mid
        else:
            hi = mid
    a, b = make(lo), make(hi)
    return a if abs(skip_of(a) - skip) <= abs(skip_of(b) - skip) else b


#: the fewest DDIM steps in which a rule-based policy (uniform, PAB, TeaCache, MagCache)
#: reuses anything: the first step computes every operator, and the step after the warmup
#: computes before any reuse. (A coda schedule says itself what it reuses: coda schedule
#: search makes one only if something can be reused.)
MIN_CACHED_STEPS = 3


def refuse_short_run(steps: int, flag: str = "--steps", policy: str | None = None) -> int:
    """``steps`` if a rule-based policy can reuse anything in that many DDIM steps (>=
    :data:`MIN_CACHED_STEPS`); ValueError naming ``flag`` (and ``policy``) otherwise: nothing
    would be cached."""
    if steps < MIN_CACHED_STEPS:
        with_policy = f" with --policy {policy}" if policy else ""
        raise ValueError(f"{flag} {steps}{with_policy}: nothing would be cached (the first "
                         "step computes every operator, the next one computes before any "
                         f"reuse); expected --steps >= {MIN_CACHED_STEPS}")
    return steps


@dataclass(frozen=True)
class PolicyInputs:
    """What a run knows when it builds a policy by name (:func:`coda.host.cache.policies.get_policy`).

    Attributes:
        name: the policy's registry name (errors name it).
        skip: target fraction of operator executions reused, in (0, 1), or None.
        profile: a :class:`coda.host.cache.profile.Profile` of the model, or None.
        schedule: a :class:`coda.host.cache.schedule.Schedule` (coda, coda+dra), or None.
        num_steps, num_layers: the run's DDIM steps and transformer blocks, or None.
        ops: the model's operators (:class:`coda.host.cache.schedule.ModelOps`), or None.
    """
    name: str
    skip: float | None = None
    profile: Any = None
    schedule: Any = None
    num_steps: int | None = None
    num_layers: int | None = None
    ops: Any = None

    def need(self, attr: str, what: str | None = None):
        """The value of ``attr``; ValueError naming the policy and ``what`` it needs if None."""
        value = getattr(self, attr)
        if value is None:
            raise ValueError(f"policy {self.name!r} needs {what or attr}")
        return value

    def calibration_profile(self):
        """The profile a policy is calibrated on (needed), of a run long enough to reuse
        anything (:func:`refuse_short_run` on its steps)."""
        profile = self.need("profile", "a profile")
        refuse_short_run(profile.num_steps, "profile --steps", self.name)
        return profile

    def shape_ops(self):
        """The run's operators: ``ops``, else Latte's of ``num_layers`` (needed)."""
        from coda.host.cache.schedule import ModelOps
        return self.ops if self.ops is not None else ModelOps.latte(self.need("num_layers"))
