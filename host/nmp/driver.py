"""The NMP driver: cache slots in rank memories and cache operators run on the ranks' NMEs.

A system has ``dimms * ranks`` NMEs; rank ``i`` (``i = dimm * ranks + rank``) owns a memory
image of ``cfg.mem_words`` words. A tensor ``[T, C]`` is tiled over tokens across all ranks
(rank ``i`` holds rows ``i*T//n ..``: the first ``T % n`` ranks hold one row more, see
:func:`coda.host.nmp.tiling.tile_bounds`); flat ``[N]`` operands are tiled over elements the
same way; per-channel vectors (gates ``[C]``) and scalars are replicated to every rank. An
operator compiles to one program per rank (tiles may differ by one row), all run in lockstep
through ``backend.execute_many``, and the host gathers the tiles of the result.
:class:`NMPDriver` is the driver (its docstring: memory placement, devices and ``stats``);
a request that does not fit raises :class:`NMPCapacityError`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Hashable

import numpy as np
import torch

from coda.hw.nme.isa import NMEConfig, Program, Status
from coda.hw.nmp import check_shape
from coda.host.nme import compiler
from coda.host.nme import ops as ref
from coda.hw.nme.executor import Backend
from coda.host.nme.interp import CANONICAL_NAN_F32
from coda.host.nmp.launch import ChainedSegment, Launch, PendingOp, result_device
from coda.host.nmp.placement import (DEFAULT_STANDARD, SCRATCH_XOR, SLOT_COLOUR,
                                     BankColouredAllocator)
from coda.host.nmp.tiling import (PLACEMENT, REPLICATE, split_operand, tile, tile_bounds,
                                  tile_shapes)
from coda.host.nme.bits import (from_bits, pack_int8_words, pack_words, to_bits, torch_dtype,
                                unpack_words)
from coda.host.nmp.slots import (Slot, check_cache_tensor, check_gate, check_qgroup,
                                 int8_tile_words, load_int8, segment_format, swap_slots,
                                 term_operands)

__all__ = ["NMPDriver", "NMPCapacityError", "fit_mem_words"]


class NMPCapacityError(MemoryError):
    """A rank memory cannot hold a requested range (message: rank, bytes requested, free)."""


def fit_mem_words(backend: Backend, cfg: NMEConfig, op: str, shapes: dict[str, tuple],
                  group: int | None = None, dimms: int = 1, ranks: int = 1, dram=None,
                  min_words: int = 1 << 10, max_words: int = 1 << 24) -> int:
    """The smallest power of two of words per rank memory, from ``min_words`` to
    ``max_words``, in which an :class:`NMPDriver` of these arguments (``cfg.mem_words`` aside)
    places ``op`` on operands of ``shapes`` (full shapes, input name -> shape): sized by the
    driver's own placement (:meth:`NMPDriver.fits`), so a size it returns never fails for
    fragmentation. ``max_words`` if none fits (running then raises
    :class:`NMPCapacityError`). Raises ValueError as :meth:`NMPDriver.fits`."""
    words = 1 << max(0, int(min_words) - 1).bit_length()
    while words < max_words:
        if NMPDriver(backend, replace(cfg, mem_words=words), dimms, ranks, dram).fits(
                op, shapes, group):
            return words
        words *= 2
    return int(max_words)


class NMPDriver:
    """Cache slots and cache operators on ``dimms * ranks`` NMEs.

    Args:
        backend: executes programs (:class:`coda.host.nme.backend.TorchBackend`, ``RTLBackend``).
        cfg: the NME configuration of every rank (its ``fmt`` is the cache dtype).
        dimms, ranks: DIMMs, and ranks per DIMM (>= 1 each).
        dram: the DRAM standard whose address mapping colours the placement (None: the
            backend's ``std`` if it has one, e.g. ``NMPRTLBackend``, else DDR5-4800).
    Raises:
        ValueError: dimms or ranks < 1, or more than ``coda.hw.nmp.MAX_RANKS`` (256) ranks;
        an unknown DRAM standard.

    Memory: each rank has a bank-coloured allocator (:mod:`coda.host.nmp.placement`): every stream
    (a cache slot's tile, an operand, a result) is placed at a power-of-two-aligned base whose
    DRAM bank is chosen by its role, so the streams a program reads together never share a bank
    and equal segments cost equal cycles on a DRAM-timed rank. Cache slots stay until freed;
    operands and results of an operator live in scratch ranges freed when it returns. A request
    that does not fit raises :class:`NMPCapacityError` (a ``MemoryError``) naming the rank, the
    bytes requested and the bytes free.

    Devices: the driver and its backends are on the host. A tensor from another device (the
    xPU's, where the model runs) comes to the host where it would cross the link (stores, a
    segment's x and gates, ``l1_to_slot``, ``run_op``), and a tensor result returns to its
    inputs' device, as PCIe moves them (the same bytes counted).

    ``stats`` (cumulative, :meth:`NMPDriver.reset_stats` clears it):

    - ``programs``: lockstep program launches (one per operator call);
    - ``rank_programs``: programs summed over ranks;
    - ``nme_cycles``: per launch the slowest rank's cycles, summed (NME clock cycles);
    - ``bytes_written`` / ``bytes_read``: bytes moved between host and rank memories, whole
      words (``2 * lanes`` bytes each) as they cross the bus;
    - ``cmd_bytes``: bytes of command words sent (8 per header / micro-op word, per rank);
    - ``placement_misses``: streams placed without their bank colour or alignment (memory too
      full or too small for it; 0 in a sized run).
    """

    def __init__(self, backend: Backend, cfg: NMEConfig, dimms: int = 1, ranks: int = 1,
                 dram=None):
        check_shape(dimms, ranks)      # >= 1 each, at most hw.nmp.MAX_RANKS ranks in all
        self.backend = backend
        self.cfg = cfg
        self.dimms, self.ranks = int(dimms), int(ranks)
        self.n_ranks = self.dimms * self.ranks
        self.dtype = torch_dtype(cfg.fmt)
        self.word_bytes = 2 * cfg.lanes
        # the rank images: the backend's own memories where it offers them (the RTL's are
        # mapped by its simulators, so nothing is copied between jobs), else host arrays
        rank_image = getattr(backend, "rank_image", None)
        self.mems = [rank_image(cfg, r) if rank_image is not None
                     else np.zeros((cfg.mem_words, cfg.lanes), np.uint16)
                     for r in range(self.n_ranks)]
        self.dram = dram if dram is not None else getattr(backend, "std", DEFAULT_STANDARD)
        self._allocs = self._new_allocators()
        self._group_colours: dict = {}
        self._slots: dict[Hashable, Slot] = {}
        self._inflight: Launch | None = None
        self._open: dict[int, Callable[[], None]] = {}   # launched ops' unreleased scratch
        self.stats: dict = {}
        self.reset_stats()

    # ---------------------------------------------------------------- bookkeeping
    def reset_stats(self) -> None:
        """Zero the counters of :attr:`stats`."""
        self.stats = {"programs": 0, "rank_programs": 0, "nme_cycles": 0,
                      "bytes_written": 0, "bytes_read": 0, "cmd_bytes": 0,
                      "async_launches": 0, "overlap_s": 0.0, "wait_s": 0.0,
                      "placement_misses": 0}

    def _new_allocators(self) -> list[BankColouredAllocator]:
        return [BankColouredAllocator(self.cfg.mem_words, self.word_bytes, self.dram)
                for _ in range(self.n_ranks)]

    def reset(self) -> None:
        """Drop every cache slot and zero the rank memories (``stats`` are kept)."""
        self.wait()
        self._slots.clear()
        self._open.clear()
        self._allocs = self._new_allocators()
        self._group_colours = {}
        for mem in self.mems:
            mem.fill(0)

    def __contains__(self, key) -> bool:
        return key in self._slots

    def keys(self) -> list:
        """Keys of the cache slots, in insertion order."""
        return list(self._slots)

    def free_bytes(self) -> list[int]:
        """Free bytes of each rank memory."""
        return [a.free_words() * self.word_bytes for a in self._allocs]

    def _alloc(self, words_per_rank: list[int], what: str,
               colour: int | None = None) -> list[int | None]:
        """One range per rank (0 words: None) of bank colour ``colour``, all or nothing."""
        got: list[int | None] = []
        for rank, words in enumerate(words_per_rank):
            alloc = self._allocs[rank]
            misses = alloc.misses
            addr = alloc.alloc(words, colour) if words else None
            self.stats["placement_misses"] += alloc.misses - misses
            if words and addr is None:
                self._release(got, words_per_rank)
                raise NMPCapacityError(
                    f"rank {rank}: cannot allocate {words * self.word_bytes} bytes "
                    f"({words} words) for {what}; {alloc.free_words() * self.word_bytes} "
                    f"bytes free (largest free range {alloc.largest() * self.word_bytes} "
                    f"bytes) of {self.cfg.mem_words * self.word_bytes}")
            got.append(addr)
        return got

    def _release(self, addrs: list[int | None], words_per_rank: list[int]) -> None:
        for rank, addr in enumerate(addrs):
            if addr is not None:
                self._allocs[rank].release(addr, words_per_rank[rank])

    def _write(self, rank: int, addr: int, words: np.ndarray) -> None:
        self.mems[rank][addr:addr + words.shape[0]] = words
        self.stats["bytes_written"] += words.nbytes

    def _read(self, rank: int, addr: int, n_words: int) -> np.ndarray:
        self.stats["bytes_read"] += n_words * self.word_bytes
        return self.mems[rank][addr:addr + n_words]

    # ---------------------------------------------------------------- cache slots
    def store(self, key: Hashable, tensor: torch.Tensor, group: Hashable = None,
              x_of: Hashable = None) -> None:
        """Write (or overwrite) cache slot ``key`` with ``tensor`` [T, C] of the cache dtype,
        tiled over tokens across the ranks. ``group``: slots that segments read together
        (e.g. one branch of one sample) share a DRAM bank colour, groups take the colours in
        turn (:mod:`coda.host.nmp.placement`); a placement only, results do not depend on it.
        ``x_of`` (instead of ``group``): a slot that segments on group ``x_of``'s slots read
        as their x in place (:meth:`segment_submit` with a key), placed in the colour where
        such a segment's x would go when sent (the group's colour XOR ``SCRATCH_XOR[0]``), so
        that it meets the same banks.

        Raises ValueError for a bad tensor, :class:`NMPCapacityError` when a rank is full
        (an overwritten slot of another shape is then gone).
        """
        tensor = check_cache_tensor(f"slot {key!r}", tensor, self.cfg.fmt).cpu()   # down the link
        shape = tuple(tensor.shape)
        old = self._slots.get(key)
        if old is None or old.shape != shape:
            if old is not None:
                self.free(key)
            rows = tile_bounds(shape[0], self.n_ranks)
            words = [compiler.words_for((r1 - r0) * shape[1], self.cfg.lanes)
                     for r0, r1 in rows]
            colour = self._group_colours.setdefault(
                group if x_of is None else x_of, SLOT_COLOUR + len(self._group_colours))
            if x_of is not None:
                colour ^= SCRATCH_XOR[0]
            addrs = self._alloc(words, f"slot {key!r} {list(shape)}", colour)
            self._slots[key] = Slot(shape, tensor.dtype, rows, addrs, words)
        slot = self._slots[key]
        bits = to_bits(tensor)
        for rank, ((r0, r1), addr) in enumerate(zip(slot.rows, slot.addrs)):
            if addr is not None:
                self._write(rank, addr, pack_words(bits[r0:r1], self.cfg.lanes))

    def store_int8(self, key: Hashable, q: torch.Tensor, scale: torch.Tensor, qgroup: int,
                   group: Hashable = None) -> None:
        """Write (or overwrite) cache slot ``key`` with an int8 entry: ``q`` int8 [T, C] packed
        two per 16-bit element as the NME's INT8 stream reads it, then ``scale`` [T, C/G] of
        the cache dtype (one per ``qgroup`` = G channels), each rank's tile (rows of both)
        in one range; ``group`` as in :meth:`store`. Segments on such slots dequantise on the
        NMEs (:func:`coda.host.nme.ops.segment_int8`); :func:`coda.host.nme.ops.quant_int8`
        makes q and scale. Bytes written: about ``0.5 + 1/G`` of a 16-bit entry's.

        Raises ValueError for bad tensors or a G that does not divide C or is not a multiple
        of the lanes (the GROUP stream's rule); :class:`NMPCapacityError` as :meth:`store`.
        """
        if not isinstance(q, torch.Tensor) or q.dtype != torch.int8 or q.dim() != 2:
            raise ValueError(f"slot {key!r}: q is {getattr(q, 'dtype', type(q).__name__)} "
                             f"{list(getattr(q, 'shape', []))}, expected torch.int8 [T, C]")
        shape = tuple(q.shape)
        qgroup = check_qgroup(qgroup, shape[1], self.cfg.lanes)
        scale = check_cache_tensor(f"slot {key!r} scale", scale, self.cfg.fmt).cpu()
        q = q.cpu()                                                     # down the link
        if tuple(scale.shape) != (shape[0], shape[1] // qgroup):
            raise ValueError(f"slot {key!r}: scale has shape {list(scale.shape)}, expected "
                             f"[T, C/G] = {[shape[0], shape[1] // qgroup]}")
        lanes = self.cfg.lanes
        old = self._slots.get(key)
        if old is None or old.shape != shape or old.qgroup != qgroup:
            if old is not None:
                self.free(key)
            rows = tile_bounds(shape[0], self.n_ranks)
            qwords, words = zip(*(int8_tile_words(r1 - r0, shape[1], qgroup, lanes)
                                  for r0, r1 in rows))
            colour = self._group_colours.setdefault(group,
                                                    SLOT_COLOUR + len(self._group_colours))
            addrs = self._alloc(words, f"int8 slot {key!r} {list(shape)} G={qgroup}", colour)
            self._slots[key] = Slot(shape, self.dtype, rows, addrs, list(words), qgroup,
                                     [None if a is None else a + w
                                      for a, w in zip(addrs, qwords)])
        slot = self._slots[key]
        sbits = to_bits(scale)
        for rank, ((r0, r1), addr) in enumerate(zip(slot.rows, slot.addrs)):
            if addr is not None:
                self._write(rank, addr, pack_int8_words(q[r0:r1], lanes))
                self._write(rank, slot.scale_addrs[rank], pack_words(sbits[r0:r1], lanes))

    def load(self, key: Hashable) -> torch.Tensor:
        """Read cache slot ``key`` back: [T, C] in the cache dtype, bit-exact (an int8 entry
        dequantised on the host: :func:`coda.host.nme.ops.dequant_int8`, the NME's bits).
        Raises KeyError naming the key if there is no such slot."""
        self.wait()
        slot = self._slot(key)
        if slot.qgroup is not None:
            return self._load_int8(slot)
        tiles = [unpack_words(self._read(rank, addr, slot.words[rank]), (r1 - r0) * slot.shape[1])
                 for rank, ((r0, r1), addr) in enumerate(zip(slot.rows, slot.addrs))
                 if addr is not None]
        flat = np.concatenate(tiles) if tiles else np.zeros(0, np.uint16)
        return from_bits(flat.reshape(slot.shape), self.cfg.fmt)

    def _load_int8(self, slot: Slot) -> torch.Tensor:
        tiles = [(r1 - r0, self._read(rank, addr, slot.words[rank]))
                 for rank, ((r0, r1), addr) in enumerate(zip(slot.rows, slot.addrs))
                 if addr is not None]
        return load_int8(slot, tiles, self.cfg)

    def free(self, key: Hashable) -> None:
        """Release cache slot ``key`` (after the launch in flight, which may read it).
        Raises KeyError if there is no such slot."""
        self.wait()
        slot = self._slot(key)
        self._release(slot.addrs, slot.words)
        del self._slots[key]

    def swap(self, a: Hashable, b: Hashable) -> None:
        """Exchange the cache slots of keys ``a`` and ``b`` in the host's slot table (no data
        moves; a key without a slot takes the other's and leaves none behind): how the cache
        keeps an operator's previous output beside its newest (forecast mode). Raises
        KeyError if neither key has a slot."""
        swap_slots(self._slots, a, b)

    def _slot(self, key) -> Slot:
        try:
            return self._slots[key]
        except KeyError:
            raise KeyError(f"no cache slot {key!r} (slots: {len(self._slots)})") from None

    # ---------------------------------------------------------------- operators
    def segment_submit(self, x, gates: list[torch.Tensor], keys: list) -> PendingOp:
        """A coalesced segment on cached slots: ``((x + g0*c0) + g1*c1) + ...``, c_k = slot keys[k].

        Args:
            x: [T, C] segment input, cache dtype (written to the ranks, tiled like the slots),
                or the key of a slot that holds it (read in place: nothing crosses the host
                link; e.g. a slot of zeros, for a segment that returns ``Σ g_k ⊙ c_k`` alone
                and leaves the residual add to the xPU).
            gates: K >= 1 vectors [C] of the cache dtype (replicated).
            keys: K slot keys, each slot [T, C], all 16-bit entries (:meth:`store`) or all
                int8 entries of one G (:meth:`store_int8`: the NMEs dequantise them,
                :func:`coda.host.nme.ops.segment_int8`).
        Returns:
            a :class:`PendingOp` whose ``result()`` is y [T, C] in the cache dtype, bit-exact
            with :func:`coda.host.nme.ops.segment` (for K above the terms one program holds,
            :func:`coda.host.nme.compiler.segment_terms`: 8, 7 int8 terms at the defaults, with
            its left-to-right evaluation continued: the programs are chained in rank memory,
            each reading the previous one's output in place); on a backend with
            ``submit_many`` (the RTL NMEs) the segment runs while the host goes on.
        Raises:
            ValueError: bad shapes/dtypes or K; KeyError: unknown slot; NMPCapacityError.
        """
        device = result_device(x, gates)     # where y returns
        x_slot = None if isinstance(x, torch.Tensor) else self._slot(x)
        if x_slot is not None:     # the input in place: a tensor of its shape stands for it
            x = torch.empty(x_slot.shape, dtype=x_slot.dtype, device="meta")
        x = check_cache_tensor("segment input x", x, self.cfg.fmt)
        if x_slot is None:
            x = x.cpu()                   # down the link
        if len(gates) != len(keys):
            raise ValueError(f"segment: {len(gates)} gates for {len(keys)} cached slots, "
                             f"expected one gate per slot")
        if len(keys) < 1:
            raise ValueError("segment: K=0 terms, expected at least one cached slot")
        slots = [self._slot(k) for k in keys]
        for key, slot in zip(keys, slots):
            if slot.shape != tuple(x.shape):
                raise ValueError(f"segment: slot {key!r} has shape {list(slot.shape)}, "
                                 f"expected {list(x.shape)} (the shape of x)")
        g = torch.stack([check_gate(i, gk, x.shape[1], self.cfg.fmt)
                         for i, gk in enumerate(gates)]).cpu()
        op, qgroup = segment_format(keys, slots)
        m = compiler.segment_terms(self.cfg, op)
        parts = [self._start(op, {"x": x, "g": g[:m]}, qgroup, cached=term_operands(slots[:m]),
                             resident=None if x_slot is None else {"x": x_slot.addrs},
                             device=device)]
        shape_only = torch.empty(x.shape, dtype=x.dtype, device="meta")
        try:
            for i in range(m, len(keys), m):
                parts.append(self._start(op, {"x": shape_only, "g": g[i:i + m]}, qgroup,
                                         cached=term_operands(slots[i:i + m]),
                                         resident={"x": parts[-1].y_addrs}, device=device))
        except BaseException:
            for part in parts:       # nothing left in flight or allocated
                part.finish_in_place()
            raise
        return parts[0] if len(parts) == 1 else ChainedSegment(parts)

    def segment(self, x: torch.Tensor, gates: list[torch.Tensor], keys: list) -> torch.Tensor:
        """:meth:`segment_submit` and wait: y [T, C] in the cache dtype (same arguments and
        errors)."""
        return self.segment_submit(x, gates, keys).result()

    def l1_to_slot(self, x: torch.Tensor, key: Hashable) -> float:
        """``Σ|x - c|`` in fp32 on the NMEs, ``c`` = cache slot ``key`` (the ``l1_distance``
        operator with its second stream read in place: only x crosses the host link).

        Args:
            x: [T, C] in the cache dtype, the shape of the slot (tiled like it).
            key: a cache slot.
        Returns:
            float: the ranks' fp32 partial sums added in rank order in fp32 (as
            :meth:`run_op` does for ``l1_distance``).
        Raises:
            ValueError: bad x or a shape other than the slot's; KeyError: unknown slot;
            NMPCapacityError.
        """
        x = check_cache_tensor("l1 input x", x, self.cfg.fmt).cpu()     # down the link
        slot = self._slot(key)
        if slot.shape != tuple(x.shape):
            raise ValueError(f"l1_to_slot: slot {key!r} has shape {list(slot.shape)}, "
                             f"expected {list(x.shape)} (the shape of x)")
        scratch = [w if a is not None else 0 for w, a in zip(slot.words, slot.addrs)]
        first = next((r for r, a in enumerate(slot.addrs) if a is not None), None)
        colour = SCRATCH_XOR[0] ^ (0 if first is None else
                                   self._allocs[first].colour(slot.addrs[first]))
        addrs = self._alloc(scratch, "l1 input", colour)
        try:
            jobs = []
            bits = to_bits(x)
            for rank, ((r0, r1), addr) in enumerate(zip(slot.rows, slot.addrs)):
                if addr is None:
                    continue
                self._write(rank, addrs[rank], pack_words(bits[r0:r1], self.cfg.lanes))
                n = (r1 - r0) * x.shape[1]
                jobs.append((rank, compiler.compile_op("l1_distance", self.cfg,
                                                       {"a": (n,), "b": (n,)},
                                                       {"a": addrs[rank], "b": addr})))
            if not jobs:
                return 0.0
            ticket = self._submit(jobs, [{"a": addrs[r]} for r, _ in jobs])
            return self._gather(ref.get_op("l1_distance"), {}, None, None,
                                self._complete(ticket), jobs)
        finally:
            self._release(addrs, scratch)

    def run_op(self, op: str, **tensors) -> torch.Tensor | float:
        """Run any reference operator of :mod:`coda.host.nme.ops` on the NMP.

        Keyword arguments are the operator's inputs (and ``group`` for dequant_int8), as the
        reference takes them; float inputs must be in the cache dtype. Returns the result
        tensor (bit-exact with the reference) on the inputs' device, or for
        ``l1_distance`` a float: the ranks' fp32 partial sums added in rank order in fp32.
        Raises ValueError (bad op / inputs, as the reference does), NMPCapacityError.
        """
        spec = ref.get_op(op)
        params = {n: tensors.pop(n) for n in spec.params if n in tensors}
        meta = {n: torch.empty_like(t, device="meta") if isinstance(t, torch.Tensor) else t
                for n, t in tensors.items()}
        spec(**meta, **params)  # the reference's own shape / dtype checks
        for name, t in tensors.items():
            if t.dtype != torch.int8 and t.dtype != self.dtype:
                raise ValueError(f"{op}: argument {name!r} has dtype {t.dtype}, expected "
                                 f"{self.dtype} (the NME format {self.cfg.fmt!r})")
        device = result_device(*tensors.values())
        return self._run(op, {n: t.cpu() for n, t in tensors.items()}, params.get("group"),
                         device=device)

    # ---------------------------------------------------------------- execution
    def _run(self, op: str, tensors: dict, group: int | None,
             cached: dict[str, list[list[int | None]]] | None = None,
             device: torch.device | None = None):
        """Tile, place scratch streams, compile per rank, launch in lockstep, gather (a tensor
        result to ``device``)."""
        return self._start(op, tensors, group, cached, device=device).result()

    def _start(self, op: str, tensors: dict, group: int | None,
               cached: dict[str, list[list[int | None]]] | None = None,
               resident: dict[str, list[int | None]] | None = None,
               device: torch.device | None = None) -> PendingOp:
        """Tile, place scratch streams, compile per rank and launch in lockstep; the
        :class:`PendingOp` gathers the result (a tensor returns to ``device``). ``resident``:
        operands already in rank memory (tiled like x) at these per-rank word addresses; their
        tensors give only the shape (e.g. on the ``meta`` device) and are not written."""
        spec = ref.get_op(op)
        cached = cached or {}
        resident = resident or {}
        shapes = {n: tuple(t.shape) for n, t in tensors.items()}
        for name, slot_addrs in cached.items():  # cached operand: K slots tiled like x
            t, c = shapes["x"]
            shapes[name] = (len(slot_addrs), t, c // group if name == "scale" else c)
        bounds = tile_bounds(shapes[split_operand(op)][0], self.n_ranks)
        plans = []  # per rank: (tiles, tile shapes), or None for an empty tile
        for (r0, r1), tiled in zip(bounds, tile_shapes(op, shapes, self.n_ranks)):
            if tiled is None:
                plans.append(None)
                continue
            tiles = {n: tile(op, n, t, (r0, r1)) for n, t in tensors.items()}
            plans.append((tiles, tiled))
        if not any(plans):
            return PendingOp.done(self._empty_result(spec, tensors, group), device)
        scratch = [self._scratch_words(op, p, group, {**cached, **resident}) for p in plans]
        ranges = self._alloc_scratch(op, scratch, f"{op} operands and result", cached, resident)
        token = id(ranges)

        def release() -> None:   # once: by the op's result, or by release_open
            if self._open.pop(token, None) is not None:
                self._release_scratch(ranges)
        self._open[token] = release
        written = self.stats["bytes_written"]
        try:
            jobs, layouts = [], []
            for rank, plan in enumerate(plans):
                if plan is None:
                    layouts.append(None)
                    continue
                layout = self._place(op, rank, plan, self._scratch_addrs(ranges, scratch, rank),
                                     group, cached, resident)
                layouts.append(layout)
                jobs.append((rank, compiler.compile_op(op, self.cfg, plan[1], layout, group)))
            bytes_in = self.stats["bytes_written"] - written + sum(
                8 * (1 + len(p.uops)) for _, p in jobs)
            ticket = self._submit(jobs, [layouts[r] for r, _ in jobs])
        except BaseException:
            release()
            raise
        return PendingOp(self, lambda results: self._gather(spec, tensors, plans, layouts,
                                                            results, jobs),
                         ticket, release, bytes_to_nmp=bytes_in,
                         y_addrs=[lay.get("y") if lay else None for lay in layouts],
                         device=device)

    def _scratch_words(self, op: str, plan, group, cached) -> dict[str, int]:
        """Words of each stream of ``op`` the driver places (not cached, not resident) on one
        rank (a segment's K gates as one stream); {} for an empty tile."""
        if plan is None:
            return {}
        words = compiler.stream_words(op, self.cfg, plan[1], group)
        per_term = compiler.TERM_STREAMS.get(op, ())
        k = plan[1]["g"][0] if per_term else 1
        return {n: w * (k if n in per_term else 1)
                for n, w in words.items() if n not in cached}

    def fits(self, op: str, shapes: dict[str, tuple], group: int | None = None) -> bool:
        """Whether :meth:`run_op` of ``op`` on operands of these full ``shapes`` (input name
        -> shape, as :func:`~coda.host.nmp.tiling.tile_shapes` takes them) can place its operands and result in the
        rank memories as they are now: the very placement it makes (bank colours,
        power-of-two alignment, first-fit fallback), tried and released. Nothing is written.
        Raises ValueError as :func:`coda.host.nme.compiler.stream_words` (bad shapes)."""
        scratch = [self._scratch_words(op, None if t is None else (None, t), group, {})
                   for t in tile_shapes(op, shapes, self.n_ranks)]
        stats = dict(self.stats)
        misses = [a.misses for a in self._allocs]
        try:
            self._release_scratch(self._alloc_scratch(op, scratch, op, {}, {}))
            return True
        except NMPCapacityError:
            return False
        finally:    # a trial: no counter moves
            self.stats = stats
            for a, m in zip(self._allocs, misses):
                a.misses = m

    def _alloc_scratch(self, op: str, scratch: list[dict[str, int]], what: str, cached: dict,
                       resident: dict[str, list[int | None]]) -> list[tuple[list, list, list]]:
        """Place the scratch streams on every rank, all or nothing; returns the ranges as
        ``(names, per-rank base, per-rank words)``. Each tiled stream (inputs in order, then
        y) gets a range of its own, colours :data:`SCRATCH_XOR` in order XORed with the
        colour of the first cached operand, skipping the colours of resident operands (a
        chained segment's x); replicated operands (gates, scales: a few words re-read all
        along) follow the first of them in its range, in the same DRAM rows."""
        first = next((r for r, s in enumerate(scratch) if s), None)
        if first is None:
            return []
        alloc = self._allocs[first]
        slots = [a[first] for per_slot in cached.values() for a in per_slot
                 if a[first] is not None]
        base = alloc.colour(slots[0]) if slots else 0
        taken = {alloc.colour(addrs[first]) for addrs in resident.values()
                 if addrs[first] is not None}
        want = [(base ^ x) % alloc.colours for x in SCRATCH_XOR]
        free = iter([c for c in want if c not in taken] + sorted(taken))
        names = list(scratch[first])
        tiled = [n for n in names if PLACEMENT[op].get(n) != REPLICATE]
        groups = [[n] for n in tiled]
        groups[0] += [n for n in names if n not in tiled]
        ranges: list[tuple[list, list, list]] = []
        total = max(sum(s.values()) for s in scratch) * self.word_bytes
        try:
            for group in groups:
                words = [sum(s.get(n, 0) for n in group) for s in scratch]
                ranges.append((group, self._alloc(
                    words, f"{what} ({', '.join(group)}; {total} bytes in all on the rank)",
                    next(free, None)), words))
        except BaseException:
            self._release_scratch(ranges)
            raise
        return ranges

    @staticmethod
    def _scratch_addrs(ranges, scratch: list[dict[str, int]], rank: int) -> dict[str, int]:
        """Word address of each scratch stream on ``rank``."""
        out = {}
        for group, bases, _ in ranges:
            addr = bases[rank]
            for name in group:
                out[name] = addr
                addr = None if addr is None else addr + scratch[rank].get(name, 0)
        return out

    def _release_scratch(self, ranges) -> None:
        for _, bases, words in ranges:
            self._release(bases, words)

    def _place(self, op: str, rank: int, plan, addrs: dict[str, int], group, cached,
               resident=None) -> dict:
        """Write the rank's scratch operands at their word ``addrs``; return the program
        layout."""
        tiles, shapes = plan
        words = compiler.stream_words(op, self.cfg, shapes, group)
        layout: dict = {}
        for name in words:
            if resident and name in resident:
                layout[name] = resident[name][rank]
                continue
            if name in cached:
                layout[name] = [slot_addrs[rank] for slot_addrs in cached[name]]
                continue
            layout[name] = addr = addrs[name]
            if name in tiles:
                t = tiles[name]
                packed = self._pack_rows(op, name, t)
                self._write(rank, addr, packed)
        return layout

    def _pack_rows(self, op: str, name: str, t: torch.Tensor) -> np.ndarray:
        pack = (lambda v: pack_int8_words(v, self.cfg.lanes)) if t.dtype == torch.int8 else \
            (lambda v: pack_words(to_bits(v), self.cfg.lanes))
        if name in compiler.TERM_STREAMS.get(op, ()):  # K rows, each from a word boundary
            return np.concatenate([pack(row) for row in t])
        return pack(t)

    def _submit(self, jobs: list[tuple[int, Program]], layouts: list) -> Launch:
        """Launch one program per rank in lockstep without waiting (backends with
        ``submit_many``), after the launch still in flight, if any, has completed: the
        ranks' NMEs run one program at a time."""
        self.wait()
        images = [(p, self.mems[r]) for r, p in jobs]
        submit = getattr(self.backend, "submit_many", None)
        if submit is None:     # a synchronous backend: the results are there at once
            # the rank images are the driver's own: programs store only their y stream,
            # so they may write it in place (no copy of a whole image per program)
            handle, results = None, self.backend.execute_many(self.cfg, images, inplace=True)
        else:
            handle, results = submit(self.cfg, images), None
        ticket = Launch(jobs, layouts, handle, results, time.perf_counter())
        self._inflight = ticket if results is None else None
        if results is not None:
            self._complete(ticket)
        return ticket

    def release_open(self) -> None:
        """Complete the launch in flight and release the scratch of every operator launched
        and not taken (its :class:`PendingOp` abandoned, e.g. by a generation that ended in
        an exception); their results are lost, cache slots are kept."""
        try:
            self.wait()
        finally:
            for release in list(self._open.values()):
                release()

    def wait(self) -> None:
        """Wait for the launch in flight (if any) to complete."""
        if self._inflight is not None:
            self._complete(self._inflight)

    def _complete(self, ticket: Launch) -> list:
        """Collect a launch's results (once) and merge what the programs wrote into the rank
        images: only their output streams, so host writes made meanwhile (cache stores of the
        other CFG branch) are kept."""
        if ticket.results is None:
            t_collect = time.perf_counter()
            ticket.results = self.backend.collect(ticket.handle)
            done = time.perf_counter()
            self.stats["overlap_s"] += t_collect - ticket.t_submit
            self.stats["wait_s"] += done - t_collect
            self.stats["async_launches"] += 1
        if self._inflight is ticket:
            self._inflight = None
        if ticket.merged:
            return ticket.results
        for (rank, program), layout, res in zip(ticket.jobs, ticket.layouts,
                                                ticket.results):
            if res.status != Status.OK:
                raise RuntimeError(f"rank {rank}: NME rejected a compiled program with status "
                                   f"{Status(res.status).name} (a compiler or backend bug)")
            if "y" in layout:
                y0 = layout["y"]
                y1 = y0 + compiler.words_for(program.n_elems, self.cfg.lanes)
                if res.mem is not self.mems[rank]:    # not written in place
                    self.mems[rank][y0:y1] = res.mem[y0:y1]
            self.stats["cmd_bytes"] += 8 * (1 + len(program.uops))
        self.stats["programs"] += 1
        self.stats["rank_programs"] += len(ticket.jobs)
        self.stats["nme_cycles"] += max(res.cycles for res in ticket.results)
        ticket.merged = True
        return ticket.results

    def _gather(self, spec, tensors, plans, layouts, results, jobs):
        if spec.output == "l1":
            total = np.float32(0.0)
            with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN are results
                for res in results:  # rank order
                    total = np.float32(total + np.float32(res.l1))
            return CANONICAL_NAN_F32 if np.isnan(total) else float(total)
        parts = []
        for (rank, program), _res in zip(jobs, results):
            n = program.n_elems
            words = compiler.words_for(n, self.cfg.lanes)
            parts.append(unpack_words(self._read(rank, layouts[rank]["y"], words), n))
        first = tensors[spec.inputs[0]]
        out_shape = tuple(first.shape)
        return from_bits(np.concatenate(parts).reshape(out_shape), self.cfg.fmt)

    def _empty_result(self, spec, tensors, group):
        if spec.output == "l1":
            return 0.0
        return torch.empty(tuple(tensors[spec.inputs[0]].shape), dtype=self.dtype)
