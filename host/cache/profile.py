"""A profile: how much each operator of a model changes between denoising steps, as the
cache policies and the schedule search read it (:class:`Profile`), and the model identity a
profile or schedule is made for (:func:`model_hash`).

``coda profile`` (:mod:`coda.experiments.profile`) measures one; the calibrated policies
(TeaCache, MagCache, FBCache, LeMiCa), the search and DRA read it. Files: ``profile.npz``
(the arrays and the metadata JSON) and ``profile.json`` (the metadata alone).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coda.host.cache.policies.base import CachePolicy, Decision, OpQuery
from coda.host.cache.schedule import ARCH_OP_TYPES, BRANCHES, ModelOps
from coda.host.nmp.driver import NMPDriver
from coda.jsonout import json_text
from coda.paths import atomic_write, write_file

__all__ = ["Profile", "ProfileBuilder", "ProfilingDriver", "ProfilePolicy", "InputNormDriver",
           "model_hash", "ARRAYS", "PROFILE_VERSION"]

#: the arrays of a profile, each [videos, steps, branches, layers, op types] float32
ARRAYS = ("out_change", "in_change", "out_abs", "in_abs")
PROFILE_VERSION = 1

def model_hash(model) -> str:
    """sha256 (first 16 hex digits) of the model's configuration and weights: a profile or
    schedule made for one model is refused for another."""
    h = hashlib.sha256(json.dumps(model.config, sort_keys=True).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class Profile:
    """Per-operator change between steps of a set of full-compute generations.

    Attributes:
        out_change, in_change: relative L1 change of each operator's output / input against
            the previous step, float32 [videos, steps, branches, layers, op types] (NaN at
            step 0), numerators computed on the NMEs.
        out_abs, in_abs: mean |output| / |input| per element, same shape.
        meta: model hash, prompts, seeds, steps, guidance, shape, videos ((prompt, seed) each).
        sensitivity: per step, the final video's squared error per unit of the quality proxy
            when operators are reused at that step (:func:`step_sensitivity`), or None.
    """
    out_change: np.ndarray
    in_change: np.ndarray
    out_abs: np.ndarray
    in_abs: np.ndarray
    meta: dict
    sensitivity: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.out_change.shape[1])

    @property
    def num_layers(self) -> int:
        return int(self.out_change.shape[3])

    @property
    def model_ops(self) -> ModelOps:
        """The profiled model's operators: ``meta["arch"]`` and ``meta["ops"]`` (written for
        the architectures other than Latte), else Latte's of :attr:`num_layers`. Raises
        ScheduleError (a ValueError) for metadata that names no valid model."""
        if "ops" not in self.meta:
            return ModelOps.latte(self.num_layers)
        return ModelOps(str(self.meta.get("arch", "latte")),
                        tuple((int(layer), str(op)) for layer, op in self.meta["ops"]))

    def per_op(self, arr) -> np.ndarray:
        """``arr`` [..., layers, op types] (a name of :data:`ARRAYS` or an array of that
        layout) as [..., operators], the model's operators in forward order
        (:meth:`ModelOps.grid_index`; Latte's: the grid flattened as it is)."""
        a = getattr(self, arr) if isinstance(arr, str) else np.asarray(arr)
        flat = a.reshape(*a.shape[:-2], -1)
        idx = self.model_ops.grid_index()
        return flat if idx == tuple(range(flat.shape[-1])) else flat[..., list(idx)]

    def mean(self, name: str = "out_change") -> np.ndarray:
        """Mean over videos: [steps, branches, layers, op types] (step 0: NaN for changes)."""
        arr = getattr(self, name)
        with np.errstate(invalid="ignore"):
            return arr.mean(axis=0) if arr.shape[0] else arr[0]

    def check_for(self, model_id: str | None = None, num_steps: int | None = None,
                  num_layers: int | None = None, what: str = "profile") -> None:
        """Raise ValueError if this profile was made for another model / step / layer count."""
        if model_id is not None and self.meta.get("model_hash") != model_id:
            raise ValueError(f"{what}: made for model {self.meta.get('model_hash')!r}, "
                             f"expected the model in use ({model_id})")
        if num_steps is not None and self.num_steps != num_steps:
            raise ValueError(f"{what}: made for {self.num_steps} steps, expected {num_steps}")
        if num_layers is not None and self.num_layers != num_layers:
            raise ValueError(f"{what}: made for {self.num_layers} layers, expected {num_layers}")

    # ---- files
    def save(self, folder: str | Path) -> Path:
        """Write ``folder/profile.npz`` (arrays + metadata JSON) and ``folder/profile.json``,
        each whole or not at all (:func:`coda.paths.atomic_write`). Returns the .npz path;
        raises OSError naming the file that cannot be written."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "profile.npz"
        meta = dict(self.meta, version=PROFILE_VERSION)
        extra = {} if self.sensitivity is None else {"sensitivity": self.sensitivity}
        with atomic_write(path) as fh:
            np.savez_compressed(fh, **{k: getattr(self, k).astype(np.float32) for k in ARRAYS},
                                meta=np.array(json_text(meta)), **extra)
        write_file(folder / "profile.json", json_text(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path, flag: str = "--profile") -> "Profile":
        """Read a ``profile.npz``. Raises ValueError (naming ``flag`` and the file) if it is
        not one: unreadable, truncated or corrupt, arrays of the wrong shape, or values that
        are not finite (changes and magnitudes must be finite and >= 0, except the changes at
        step 0, which have no previous step; the step sensitivity finite and >= 0)."""
        path = Path(path)
        what = f"{flag} {path}"
        if path.is_dir():
            raise ValueError(f"{what}: is a folder, expected a profile.npz file")
        if not path.is_file():
            raise ValueError(f"{what}: no such file, expected a profile.npz written "
                             "by coda profile")
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
            if magic != b"PK\x03\x04":           # np.load would try a pickle or a .npy
                raise zipfile.BadZipFile("not a .npz (zip) archive" if magic else "empty file")
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: np.asarray(data[k], dtype=np.float32) for k in ARRAYS}
                meta = json.loads(str(data["meta"]))
                sens = (np.asarray(data["sensitivity"], dtype=np.float64)
                        if "sensitivity" in data.files else None)
        except (OSError, ValueError, KeyError, EOFError, TypeError, zipfile.BadZipFile,
                zlib.error) as exc:
            # a text file, a truncated or corrupt archive, a missing or malformed array
            raise ValueError(f"{what}: not a profile written by coda profile "
                             f"({type(exc).__name__}: {exc})") from None
        if not isinstance(meta, dict):
            raise ValueError(f"{what}: not a profile written by coda profile (its metadata "
                             f"is a {type(meta).__name__}, expected a JSON object)")
        shapes = {a.shape for a in arrays.values()}
        shape = arrays["out_change"].shape
        types = ARCH_OP_TYPES.get(meta.get("arch", "latte"))
        if types is None:
            raise ValueError(f"{what}: architecture {meta.get('arch')!r}, expected one of "
                             f"{sorted(ARCH_OP_TYPES)}")
        if len(shapes) != 1 or len(shape) != 5 or shape[2] != len(BRANCHES) or \
                shape[4] != len(types) or shape[1] < 1 or shape[0] < 1 or shape[3] < 1:
            raise ValueError(f"{what}: arrays of shape {sorted(shapes)}, expected one "
                             "shape [videos >= 1, steps >= 1, 2 branches, layers, "
                             f"{len(types)} op types]")
        probe = cls(**arrays, meta=meta)
        try:
            ops = probe.model_ops
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{what}: its operators (meta \"ops\") are not a model's: "
                             f"{exc}") from None
        if ops.num_layers != shape[3]:
            raise ValueError(f"{what}: operators of {ops.num_layers} layers, arrays of "
                             f"{shape[3]}; expected the same")
        for name, arr in arrays.items():
            first = 1 if name.endswith("_change") else 0      # changes: NaN at step 0
            checked = probe.per_op(arr[:, first:])            # the model's operators only
            bad = ~np.isfinite(checked) | (checked < 0)
            if bad.any():
                v, s, b, i = (int(i) for i in np.argwhere(bad)[0])
                layer, op = ops.ops[i]
                raise ValueError(
                    f"{what}: {int(bad.sum())} values of {name} are not finite and >= 0 (the "
                    f"first, {checked[v, s, b, i]}, at video {v}, step {s + first}, "
                    f"{BRANCHES[b]}, layer {layer}, {op}); expected a profile of "
                    "finite measurements")
        if sens is not None and sens.shape != (shape[1],):
            raise ValueError(f"{what}: sensitivity of shape {sens.shape}, expected "
                             f"({shape[1]},)")
        if sens is not None and not (np.all(np.isfinite(sens)) and np.all(sens >= 0)):
            bad = int((~(np.isfinite(sens) & (sens >= 0))).sum())
            raise ValueError(f"{what}: {bad} of its {sens.size} step-sensitivity values are "
                             "not finite and >= 0; expected a profile of finite measurements")
        return cls(**arrays, meta=meta, sensitivity=sens)


# ---------------------------------------------------------------- measuring
class ProfilingDriver(NMPDriver):
    """An :class:`NMPDriver` that measures, on the NMEs, how much an operator's output changed
    since the step before, right before its cache slot is overwritten.

    ``records`` collects ``(key, index, value, abs_mean)`` per output store, ``index`` = how
    many times the slot was written before in this generation (= the step when every step
    stores), ``value`` = ``Σ|new - old| / Σ|old|`` (NaN for the first write), ``abs_mean`` =
    mean |new|. Slots whose key ends with ``"in"`` (kept inputs) are only counted.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records: list[tuple] = []
        self._writes: dict = {}
        self._norms: dict = {}

    def store(self, key, tensor, group=None, x_of=None):
        if x_of is not None:        # a sum segment's slot of zeros: no operator's output
            return super().store(key, tensor, group, x_of)
        fresh = key not in self
        writes = 0 if fresh else self._writes.get(key, 0)
        is_input = isinstance(key, tuple) and key and key[-1] == "in"
        if not is_input:
            value = float("nan")
            if not fresh and self.load_shape(key) == tuple(tensor.shape):
                l1 = self.l1_to_slot(tensor, key)
                norm = self._norms[key]
                value = l1 / norm if norm > 0 else (0.0 if l1 == 0 else float("inf"))
            mag = float(tensor.float().abs().sum())
            self._norms[key] = mag
            self.records.append((key, writes, value, mag / max(1, tensor.numel())))
        self._writes[key] = writes + 1
        super().store(key, tensor, group)

    def load_shape(self, key) -> tuple:
        return self._slot(key).shape

    def free(self, key):
        self._writes.pop(key, None)
        self._norms.pop(key, None)
        super().free(key)


@dataclass(eq=False)
class ProfilePolicy(CachePolicy):
    """Compute every operator; store its output and keep its input every step; at every step
    after the first, measure the input's change against the previous step on the NMEs
    (:meth:`OpQuery.input_change`). ``monitors`` collects ``(step, branch, sample, layer, op,
    value)`` of the current generation."""
    name = "profile"
    monitors: list = field(default_factory=list)

    def reset(self) -> None:
        self.monitors = []

    def decide(self, q: OpQuery) -> Decision:
        if q.kept_step is not None:
            if q.kept_step != q.step - 1:
                raise RuntimeError(f"profile: input of {q.ref} kept at step {q.kept_step}, "
                                   f"expected {q.step - 1}")
            q.input_change()
        return Decision(False, store=True, keep_input=True, reason="profile")

    def observe(self, event) -> None:
        if event.kind == "monitor":
            self.monitors.append((event.step, event.branch, event.sample, event.layer,
                                  event.op, event.value))


class InputNormDriver(ProfilingDriver):
    """Also records the mean |input| of every kept input (host side)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.input_records: list[tuple] = []

    def store(self, key, tensor, group=None, x_of=None):
        if x_of is None and isinstance(key, tuple) and key and key[-1] == "in":
            writes = self._writes.get(key, 0) if key in self else 0
            self.input_records.append((key, writes,
                                       float(tensor.float().abs().sum()) / max(1, tensor.numel())))
        super().store(key, tensor, group, x_of)

class ProfileBuilder:
    """Collects the measurements of profiling generations into a :class:`Profile`.

    Args:
        ops: the profiled model's operators (:class:`coda.host.cache.schedule.ModelOps`).
        videos: videos of the profile (samples per CFG branch, summed over generations).
        num_steps: denoising steps of each generation.
    """

    def __init__(self, ops: ModelOps, videos: int, num_steps: int):
        self.ops, self.videos, self.num_steps = ops, int(videos), int(num_steps)
        shape = (self.videos, self.num_steps, len(BRANCHES), ops.num_layers, len(ops.op_types))
        self.arrays = {k: np.full(shape, np.nan, np.float32) for k in ARRAYS}
        self._b = {b: i for i, b in enumerate(BRANCHES)}
        self._o = {o: i for i, o in enumerate(ops.op_types)}

    def add(self, driver: "ProfilingDriver", policy: "ProfilePolicy", first_video: int = 0,
            tag: str | None = None) -> None:
        """One generation's measurements: ``driver``'s output records (an
        :class:`InputNormDriver`'s input magnitudes too) and ``policy``'s input changes, its
        sample i as video ``first_video + i``. ``tag``: only the slots of the engine hook
        with that tag (a driver shared by several hooks); None: every 5-part key. Raises
        IndexError for a step or video outside the builder's shape."""
        def index(key, step):
            _, branch, sample, layer, op = key[:5]
            return (first_video + sample, step, self._b[branch], layer, self._o[op])

        def ours(key):
            return len(key) >= 5 and (tag is None or key[0] == tag)

        for key, step, value, mag in driver.records:
            if len(key) != 5 or not ours(key):     # another stream (text tokens), another hook
                continue
            self.arrays["out_change"][index(key, step)] = value
            self.arrays["out_abs"][index(key, step)] = mag
        for key, step, mag in getattr(driver, "input_records", ()):
            if ours(key):
                self.arrays["in_abs"][index(key, step)] = mag
        for step, branch, sample, layer, op, value in policy.monitors:
            self.arrays["in_change"][(first_video + sample, step, self._b[branch], layer,
                                      self._o[op])] = value

    def build(self, meta: dict) -> Profile:
        """The :class:`Profile` of what was added, with ``meta`` plus the model's branches,
        op types and layers (and its operators, for an architecture other than Latte)."""
        ops = self.ops
        meta = dict(meta, branches=list(BRANCHES), op_types=list(ops.op_types),
                    layers=ops.num_layers)
        if ops != ModelOps.latte(ops.num_layers):     # Latte's files keep their format
            meta.update(arch=ops.arch, ops=[list(r) for r in ops.ops])
        return Profile(**{k: v.copy() for k, v in self.arrays.items()}, meta=meta)
