"""The cache engine on a device: where the DiT runs (:func:`resolve_device`) and a cache
whose slots live in that device's memory (:class:`DeviceCache`).

``DeviceCache`` is system b of the ablation (:mod:`coda.host.system.replay`: "cache in GPU
memory"): the practical cache for a user's GPU. It is a driver for the cache engine
(``CodaCacheConfig(driver=DeviceCache())``) with the interface the engine uses of
:class:`coda.host.nmp.driver.NMPDriver` (``store``, ``store_int8``, ``segment``, ``swap``,
``free``, ``__contains__``, ``l1_to_slot``, ``wait``, ``stats``, ``cfg.fmt``), but its
slots are torch tensors on the device the engine hands them from (the model's: a CUDA GPU,
or the host for ``"cpu"``) and its cache operators are the NME's torch reference
(:mod:`coda.host.nme.ops`: ``segment``, ``segment_int8``, ``l1_distance``,
``dequant_int8``) run there. Nothing of the cache crosses a link: its events say
``cache_memory="device"`` (:mod:`coda.host.cache.events`), its segments and monitors report
no link bytes, no NME programs and no cycles. Bits against the NMP driver: :class:`DeviceCache`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, NamedTuple

import torch

from coda.host.nme import ops as ref
from coda.host.nme.bits import torch_dtype
from coda.host.nmp.slots import check_cache_tensor, check_gate, check_qgroup, swap_slots

__all__ = ["DEVICES", "resolve_device", "DeviceCache", "DeviceCacheConfig"]

#: the device types the CLI's ``--device`` takes
DEVICES = ("cpu", "cuda")


def resolve_device(device, what: str = "device") -> torch.device:
    """The ``torch.device`` of ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a
    ``torch.device``), checked before any work.

    ``what`` names the argument in the message (``"--device"`` for the CLI).
    Raises ValueError: another device type (the message names the value and
    :data:`DEVICES`), ``cuda`` when ``torch.cuda.is_available()`` is False (no NVIDIA GPU or
    driver, or a CPU-only torch build), a CUDA index beyond the GPUs present.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{what} {device!r}: expected one of {', '.join(DEVICES)} "
                         "(or cuda:N)") from None
    if dev.type not in DEVICES:
        raise ValueError(f"{what} {device}: device type {dev.type!r}, expected one of "
                         f"{', '.join(DEVICES)}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{what} {device}: CUDA is not available (torch "
                             f"{torch.__version__}, built for CUDA {torch.version.cuda}: "
                             "torch.cuda.is_available() is False); expected cpu here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{what} {device}: no such GPU, expected an index below "
                             f"{torch.cuda.device_count()}")
    return dev


@dataclass(frozen=True)
class DeviceCacheConfig:
    """What the engine reads of a driver's configuration: ``fmt``, the cache's 16-bit
    element format (``"bf16"`` or ``"fp16"``). A device cache has no lanes: an int8 group G
    need only divide the hidden size."""
    fmt: str = "bf16"


class _Entry(NamedTuple):
    """One slot: ``value`` [T, C] in the cache format, or int8 q [T, C] with ``scale``
    [T, C/G] and ``group`` G."""
    value: torch.Tensor
    scale: torch.Tensor | None = None
    group: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.value, self.scale)
                   if t is not None)

    @property
    def layout(self) -> list:
        """Shapes and devices of its tensors and G: a slot of the same layout is overwritten
        in place."""
        return [None if t is None else (t.shape, t.device) for t in (self.value, self.scale)
                ] + [self.group]


class DeviceCache:
    """Cache slots in device memory and the cache operators as torch ops there (system b of
    the ablation): a driver for :class:`coda.host.cache.engine.CodaCacheConfig`.

    Bits: a segment is the reference's left-to-right fold ``((x + g0*c0) + g1*c1) + ...``, one
    rounding per product and per sum in the cache format, as the NMEs compute it, so on the CPU
    a generation gives the bits of the NMP driver on the torch backend (tests/host/cache/test_device.py)
    for every policy that has no monitor. The monitors' ``l1_to_slot`` sums in fp32 in torch's
    order, not the NMEs' per-lane order: equal to the NMP's within the reference's tolerance
    (:func:`coda.host.nme.ops.l1_distance`), so a threshold policy (DRA, TeaCache, FBCache) may
    decide differently on a value at its threshold. On a GPU the model's own kernels round
    differently from the CPU's (tested on the CPU only).

    Args:
        fmt: the cache's 16-bit format, ``"bf16"`` (default) or ``"fp16"``.
    Attributes:
        cfg: :class:`DeviceCacheConfig`. dtype: the format's torch dtype.
        cache_memory: ``"device"`` (the events' :data:`coda.host.cache.events.CACHE_MEMORIES`).
        stats: ``bytes_written`` (bytes stored into slots, device memory), ``bytes_read``
            (slot bytes read by segments and monitors), and ``programs``, ``nme_cycles``,
            ``cmd_bytes``: 0, no NME runs anything.
    Raises ValueError for an unknown ``fmt``.
    """
    cache_memory = "device"

    def __init__(self, fmt: str = "bf16"):
        self.dtype = torch_dtype(fmt)
        self.cfg = DeviceCacheConfig(fmt)
        self._slots: dict[Hashable, _Entry] = {}
        self.stats: dict = {}
        self.reset_stats()

    def reset_stats(self) -> None:
        """Zero the counters of :attr:`stats`."""
        self.stats = dict.fromkeys(("bytes_written", "bytes_read", "programs", "nme_cycles",
                                    "cmd_bytes"), 0)

    def reset(self) -> None:
        """Drop every slot (``stats`` are kept)."""
        self._slots.clear()

    def __contains__(self, key) -> bool:
        return key in self._slots

    def keys(self) -> list:
        """Keys of the slots, in insertion order."""
        return list(self._slots)

    def held_bytes(self) -> int:
        """Bytes the slots hold in device memory (q and scales for int8 entries)."""
        return sum(e.nbytes for e in self._slots.values())

    def wait(self) -> None:
        """Nothing to wait for: the operators run in the device's stream order."""

    def _slot(self, key) -> _Entry:
        try:
            return self._slots[key]
        except KeyError:
            raise KeyError(f"no cache slot {key!r} (slots: {len(self._slots)})") from None

    def _put(self, key, entry: _Entry) -> None:
        """Write ``entry`` at ``key``: into the slot's own storage when it has the same
        shapes, format and device (a copy kernel), else into new storage."""
        old = self._slots.get(key)
        if old is not None and old.layout == entry.layout:
            for mine, given in zip(old[:2], entry[:2]):
                if given is not None:
                    mine.copy_(given)
        else:
            self._slots[key] = _Entry(*(None if t is None else
                                        t.detach().clone(memory_format=torch.contiguous_format)
                                        for t in entry[:2]), entry.group)
        self.stats["bytes_written"] += entry.nbytes

    def store(self, key: Hashable, tensor: torch.Tensor, group: Hashable = None,
              x_of: Hashable = None) -> None:
        """Write (or overwrite) slot ``key`` with ``tensor`` [T, C] of the cache dtype, on the
        tensor's device. ``group`` and ``x_of`` are the NMP's placement hints (DRAM bank
        colours), accepted and unused. Raises ValueError for a bad tensor."""
        self._put(key, _Entry(check_cache_tensor(f"slot {key!r}", tensor, self.cfg.fmt)))

    def store_int8(self, key: Hashable, q: torch.Tensor, scale: torch.Tensor, qgroup: int,
                   group: Hashable = None) -> None:
        """Write slot ``key`` with an int8 entry: ``q`` int8 [T, C] and ``scale`` [T, C/G] of
        the cache dtype, G = ``qgroup`` channels per scale (as
        :func:`coda.host.nme.ops.quant_int8` makes them); segments dequantise them
        (:func:`coda.host.nme.ops.segment_int8`). Raises ValueError for bad tensors or a G
        that does not divide C."""
        if not isinstance(q, torch.Tensor) or q.dtype != torch.int8 or q.dim() != 2:
            raise ValueError(f"slot {key!r}: q is {getattr(q, 'dtype', type(q).__name__)} "
                             f"{list(getattr(q, 'shape', []))}, expected torch.int8 [T, C]")
        qgroup = check_qgroup(qgroup, q.shape[1], 1)
        scale = check_cache_tensor(f"slot {key!r} scale", scale, self.cfg.fmt)
        if tuple(scale.shape) != (q.shape[0], q.shape[1] // qgroup):
            raise ValueError(f"slot {key!r}: scale has shape {list(scale.shape)}, expected "
                             f"[T, C/G] = {[q.shape[0], q.shape[1] // qgroup]}")
        self._put(key, _Entry(q, scale, qgroup))

    def load(self, key: Hashable) -> torch.Tensor:
        """Slot ``key`` as [T, C] in the cache dtype on its device (a copy; an int8 entry
        dequantised, :func:`coda.host.nme.ops.dequant_int8`). Raises KeyError."""
        e = self._slot(key)
        if e.group is not None:
            return ref.dequant_int8(e.value, e.scale, e.group)
        return e.value.clone()

    def free(self, key: Hashable) -> None:
        """Release slot ``key``. Raises KeyError if there is none."""
        self._slot(key)
        del self._slots[key]

    def swap(self, a: Hashable, b: Hashable) -> None:
        """Exchange the slots of keys ``a`` and ``b`` (no data moves; a key without a slot
        takes the other's), as :meth:`coda.host.nmp.driver.NMPDriver.swap`. Raises KeyError
        if neither has a slot."""
        swap_slots(self._slots, a, b)

    def segment(self, x: torch.Tensor, gates: list[torch.Tensor], keys: list) -> torch.Tensor:
        """``((x + g0*c0) + g1*c1) + ...`` with c_k = slot ``keys[k]``, any K >= 1, by the
        reference (:func:`coda.host.nme.ops.segment`, or ``segment_int8`` on int8 entries:
        one term at a time, the same left-to-right rounding as one K-term program).

        Args:
            x: [T, C] in the cache dtype, on the slots' device.
            gates: K vectors [C] of the cache dtype, there too.
            keys: K slot keys of x's shape, all 16-bit or all int8 of one G.
        Returns:
            y [T, C] in the cache dtype on x's device.
        Raises:
            ValueError: bad shapes, dtypes, devices, K = 0, mixed formats; KeyError: an
            unknown slot.
        """
        x = check_cache_tensor("segment input x", x, self.cfg.fmt)
        if len(gates) != len(keys) or not keys:
            raise ValueError(f"segment: {len(gates)} gates for {len(keys)} cached slots, "
                             "expected one gate per slot and at least one")
        entries = [self._slot(k) for k in keys]
        if len({e.group for e in entries}) > 1:
            raise ValueError(f"segment: slots {keys!r} mix cache formats, expected one "
                             "format (and one G) per segment")
        for i, (key, g, e) in enumerate(zip(keys, gates, entries)):
            check_gate(i, g, x.shape[1], self.cfg.fmt)
            if tuple(e.value.shape) != tuple(x.shape):
                raise ValueError(f"segment: slot {key!r} has shape {list(e.value.shape)}, "
                                 f"expected {list(x.shape)} (the shape of x)")
            if e.value.device != x.device or g.device != x.device:
                raise ValueError(f"segment: slot {key!r} on {e.value.device} and its gate on "
                                 f"{g.device}, expected x's device {x.device}")
        y = x
        for g, e in zip(gates, entries):
            if e.group is None:
                y = ref.segment(y, g[None], e.value[None])
            else:
                y = ref.segment_int8(y, g[None], e.value[None], e.scale[None], e.group)
            self.stats["bytes_read"] += e.nbytes
        return y

    def l1_to_slot(self, x: torch.Tensor, key: Hashable) -> float:
        """``Σ|x - c|`` in fp32 (:func:`coda.host.nme.ops.l1_distance`), c = 16-bit slot
        ``key`` of x's shape, on x's device. Raises ValueError (bad x, another shape, an int8
        slot), KeyError."""
        x = check_cache_tensor("l1 input x", x, self.cfg.fmt)
        e = self._slot(key)
        if e.group is not None or tuple(e.value.shape) != tuple(x.shape):
            raise ValueError(f"l1_to_slot: slot {key!r} is {list(e.value.shape)} "
                             f"{'int8' if e.group else self.cfg.fmt}, expected a "
                             f"{self.cfg.fmt} slot of x's shape {list(x.shape)}")
        self.stats["bytes_read"] += e.nbytes
        return float(ref.l1_distance(x.reshape(-1), e.value.reshape(-1)))
