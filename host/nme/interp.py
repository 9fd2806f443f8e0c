"""A torch interpreter of NME programs: the functional golden model of the NME.

It runs a program on a memory image exactly as :mod:`coda.hw.nme.isa` specifies, vectorised
over words with torch (no Python per element or per word): :func:`run_program` and
:func:`run_words` (their docstrings: the semantics, block by block, that it implements).
Buffers have no initial value: :func:`coda.hw.nme.isa.validate` rejects (``BAD_OPERAND``) a
program that reads a buffer no earlier micro-op wrote, so a buffer comes into being at its
first write. Executing whole streams at once instead of block by block is only a speed-up,
used when it gives the same result; otherwise the interpreter walks the blocks.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from coda.hw.nme.isa import (NMEConfig, Op, Program, RSrc, Status, decode_header, decode_uop,
                             validate)
from coda.host.nme.bits import canonical_nan_bits, torch_dtype

#: ``observe(op, rsrc, p, q, r, res)`` of :func:`run_words` (see there)
Observer = Callable[..., None]

__all__ = ["InterpResult", "check_image", "run_program", "run_words", "CANONICAL_NAN_F32"]

#: fp32 canonical quiet NaN (bits 0x7FC00000) as a Python float: the l1 result of a NaN sum
CANONICAL_NAN_F32 = float(np.array(0x7FC00000, np.uint32).view(np.float32))


@dataclass
class InterpResult:
    """Outcome of one program.

    Attributes:
        mem: uint16 [mem_words, lanes], the memory image after the program.
        status: the NME status (:class:`coda.hw.nme.isa.Status`).
        l1: fp32 L1 sum as a Python float (0.0 if the program has no L1 micro-op or failed).
    """
    mem: np.ndarray
    status: Status
    l1: float


def check_image(cfg: NMEConfig, mem: np.ndarray) -> None:
    """Raise ValueError unless ``mem`` is a uint16 numpy array of shape (mem_words, lanes)."""
    if not isinstance(mem, np.ndarray) or mem.dtype != np.uint16:
        raise ValueError(f"memory image of type {type(mem).__name__} "
                         f"{getattr(mem, 'dtype', '')}: expected a numpy uint16 array")
    if mem.shape != (cfg.mem_words, cfg.lanes):
        raise ValueError(f"memory image of shape {mem.shape}: expected (mem_words, lanes) = "
                         f"{(cfg.mem_words, cfg.lanes)}")


def run_program(cfg: NMEConfig, program: Program, mem: np.ndarray, *,
                inplace: bool = False) -> InterpResult:
    """Run ``program`` on the memory image ``mem`` (uint16 [mem_words, lanes]).

    With ``inplace=False`` (default) ``mem`` is not modified and the result holds a copy
    (``mem`` itself when no micro-op stores, so nothing was written).
    Raises ValueError for a malformed image or fields that do not fit the encoding.

    Semantics:

    - the program is checked first with :func:`coda.hw.nme.isa.validate`; a bad program returns its
      error status and changes nothing;
    - the stream of ``W = ceil(n_elems / lanes)`` words is strip-mined into blocks of ``depth``
      words; in each block every micro-op is one pass, in program order; buffer word
      ``w mod depth`` holds word ``w``;
    - ``+ - *`` are single torch operations in the format (one IEEE round-to-nearest-even each,
      subnormals kept); a NaN produced by ADD/SUB/MUL/MAC is the NME's canonical quiet NaN
      (0x7FC0 bf16, 0x7E00 fp16); MOV copies bits unchanged;
    - the last word's tail lanes are masked: they store nothing and accumulate nothing;
    - L1: per-lane fp32 accumulators ``acc[lane] += |f32(P) - f32(R)|`` in the order the NME
      visits words (block by block, micro-op by micro-op, word by word), then summed in lane
      order 0..lanes-1 in fp32; a NaN sum is the canonical fp32 NaN (0x7FC00000).

    Buffers have no initial value: :func:`coda.hw.nme.isa.validate` rejects (``BAD_OPERAND``) a
    program that reads a buffer no earlier micro-op wrote, so no accepted program can see what
    a previous program left in the NME's buffers. The interpreter relies on that: a buffer comes
    into being at its first write.

    Executing whole streams at once instead of block by block is only a speed-up: it is used
    when it gives the same result (one block, or no store overlapping another stream at a
    different offset; every buffer read sees a write of the same block because validate
    guarantees an earlier write); otherwise the interpreter walks the blocks.
    """
    return run_words(cfg, program.words(), mem, inplace=inplace)


def run_words(cfg: NMEConfig, words: Sequence[int], mem: np.ndarray, *,
              inplace: bool = False, observe: Observer | None = None) -> InterpResult:
    """Run the raw 64-bit command words (header, then micro-ops) of one program.

    ``observe``, if given, is called once per micro-op pass (one block of words) with the
    micro-op's ``op`` and ``rsrc`` and its operands and result over the block's valid
    elements (masked tail lanes dropped), flat tensors of the format's dtype: ``p``, ``q``
    (None where the op does not read them), ``r``, and ``res`` (the rounded, canonical-NaN
    result; for L1 the fp32 absolute differences). Functional coverage samples it.

    Raises ValueError if ``len(words) - 1`` differs from the header's ``n_uops`` (the host
    framed the command stream wrongly) or the image is malformed.
    """
    check_image(cfg, mem)
    if not words:
        raise ValueError("empty command stream: expected a header word")
    n_uops, n_elems = decode_header(int(words[0]))
    uop_words = [int(w) for w in words[1:]]
    if len(uop_words) != n_uops:
        raise ValueError(f"header says n_uops={n_uops}, got {len(uop_words)} micro-op words")
    status = validate(n_uops, n_elems, uop_words, cfg)
    uops = [decode_uop(w) for w in uop_words] if status == Status.OK else []
    # a program that stores nothing (a rejected one, an L1 reduction) leaves memory as it
    # was: no copy (the profile's L1 monitors spent 40 % of their time copying rank images)
    out = mem if inplace or not any(u[2] for u in uops) else mem.copy()
    if status != Status.OK:
        return InterpResult(out, status, 0.0)
    l1 = _Machine(cfg, out, n_elems, observe).run(uops)
    return InterpResult(out, Status.OK, l1)


def _word_span(uop, n_words: int, lanes: int) -> tuple[int, int] | None:
    """Memory words [start, end) a micro-op touches (None if it touches none)."""
    _op, rsrc, store, _d, _p, _q, _r, addr, param = uop
    if store or rsrc == RSrc.MEM:
        return addr, addr + n_words
    if rsrc == RSrc.CHAN:
        return addr, addr + param
    if rsrc == RSrc.INT8:
        return addr, addr + -(-n_words // 2)
    if rsrc == RSrc.GROUP:
        return addr, addr + (1 if param == 0 else (n_words - 1) // (param * lanes) + 1)
    return None


def _whole_stream_ok(uops: list, n_words: int, cfg: NMEConfig) -> bool:
    """True if running each micro-op over the whole stream equals the blocked execution."""
    if n_words <= cfg.depth:
        return True
    spans = [(u, _word_span(u, n_words, cfg.lanes)) for u in uops]
    for s, s_span in spans:
        if not s[2]:
            continue
        for m, m_span in spans:
            if m is s or m_span is None:
                continue
            overlap = m_span[0] < s_span[1] and s_span[0] < m_span[1]
            aligned = (m[2] or m[1] == RSrc.MEM) and m_span[0] == s_span[0]
            if overlap and not aligned:
                return False
    return True


class _Machine:
    """State of one program's execution on a memory image (which it modifies in place)."""

    def __init__(self, cfg: NMEConfig, mem: np.ndarray, n_elems: int,
                 observe: Observer | None = None):
        if sys.byteorder != "little":
            raise RuntimeError("the interpreter's int8 view assumes a little-endian host")
        self.cfg = cfg
        self.lanes = cfg.lanes
        self.dtype = torch_dtype(cfg.fmt)
        self.mem = torch.from_numpy(mem.view(np.int16)).view(self.dtype)
        self.mem_i8 = torch.from_numpy(mem.view(np.int8)).reshape(-1)
        self.n_words = -(-n_elems // cfg.lanes)
        self.tail = n_elems - (self.n_words - 1) * cfg.lanes
        self.nan = torch.tensor(canonical_nan_bits(cfg.fmt), dtype=torch.int16).view(self.dtype)
        self.l1_parts: list[tuple[int, int, torch.Tensor]] = []  # (uop index, w0, [n, L])
        self.observe = observe

    def run(self, uops: list) -> float:
        whole = _whole_stream_ok(uops, self.n_words, self.cfg)
        step = self.n_words if whole else self.cfg.depth
        self.step = step
        bufs: dict[int, torch.Tensor] = {}  # a buffer exists from its first write on
        for w0 in range(0, self.n_words, step):
            w1 = min(w0 + step, self.n_words)
            for i, u in enumerate(uops):
                self._pass(i, u, w0, w1, bufs)
        return self._l1_sum()

    def _operand_r(self, u, w0: int, w1: int, bufs) -> torch.Tensor:
        _op, rsrc, _store, _d, _p, _q, r, addr, param = u
        n, lanes = w1 - w0, self.lanes
        if rsrc == RSrc.BUF:
            return bufs[r][:n]
        if rsrc == RSrc.MEM:
            return self.mem[addr + w0:addr + w1]
        w = torch.arange(w0, w1)
        if rsrc == RSrc.CHAN:
            return self.mem[addr + w % param]
        if rsrc == RSrc.GROUP:
            if param == 0:
                return self.mem[addr, 0].expand(n, lanes)
            e = w // param
            return self.mem[addr + e // lanes, e % lanes][:, None].expand(n, lanes)
        base = addr * 2 * lanes  # INT8: word w, lane j is byte addr*2L + w*L + j
        return self.mem_i8[base + w0 * lanes:base + w1 * lanes].reshape(n, lanes).to(self.dtype)

    def _canonical(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.isnan(x), self.nan, x)

    def _pass(self, i: int, u, w0: int, w1: int, bufs) -> None:
        op, _rsrc, store, d, p, q, _r, addr, _param = u
        n = w1 - w0
        rv = self._operand_r(u, w0, w1, bufs)
        if op == Op.L1:
            diff = torch.abs(bufs[p][:n].float() - rv.float())
            if w1 == self.n_words and self.tail < self.lanes:
                diff[-1, self.tail:] = 0.0  # masked lanes accumulate nothing
            self.l1_parts.append((i, w0, diff))
            if self.observe is not None:
                self._observe(op, _rsrc, w1, bufs[p][:n], None, rv, diff)
            return
        if op == Op.MOV:
            res = rv
        elif op == Op.ADD:
            res = self._canonical(bufs[p][:n] + rv)
        elif op == Op.SUB:
            res = self._canonical(bufs[p][:n] - rv)
        elif op == Op.MUL:
            res = self._canonical(bufs[p][:n] * rv)
        else:  # MAC: the product is rounded, then the sum
            res = self._canonical(bufs[p][:n] + bufs[q][:n] * rv)
        if self.observe is not None:
            self._observe(op, _rsrc, w1, None if op == Op.MOV else bufs[p][:n],
                          bufs[q][:n] if op == Op.MAC else None, rv, res)
        if store:
            self._store(addr, w0, w1, res)
        else:
            if d not in bufs:  # validate() rejected any read before this first write
                bufs[d] = torch.empty(self.step, self.lanes, dtype=self.dtype)
            bufs[d][:n] = res

    def _observe(self, op, rsrc, w1: int, p, q, r, res) -> None:
        """Hand one pass's operands and result over its valid elements to ``observe``."""
        cut = self.tail if w1 == self.n_words and self.tail < self.lanes else self.lanes

        def flat(t):
            if t is None:
                return None
            t = t.expand(res.shape) if t.shape != res.shape else t
            return torch.cat([t[:-1].reshape(-1), t[-1, :cut]]) if t.shape[0] else t.reshape(-1)
        self.observe(Op(op), RSrc(rsrc), flat(p), flat(q), flat(r), flat(res))

    def _store(self, addr: int, w0: int, w1: int, res: torch.Tensor) -> None:
        if w1 == self.n_words and self.tail < self.lanes:
            self.mem[addr + w0:addr + w1 - 1] = res[:-1]
            self.mem[addr + w1 - 1, :self.tail] = res[-1, :self.tail]
        else:
            self.mem[addr + w0:addr + w1] = res

    def _l1_sum(self) -> float:
        if not self.l1_parts:
            return 0.0
        stacked = torch.cat(self._l1_in_nme_order()).numpy()
        with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN sums are results
            acc = np.cumsum(stacked, axis=0, dtype=np.float32)[-1]
        total = np.float32(0.0)
        for lane_sum in acc:  # lane order 0..L-1
            with np.errstate(over="ignore", invalid="ignore"):
                total = np.float32(total + lane_sum)
        if np.isnan(total):
            return CANONICAL_NAN_F32  # the NME's FP32 adder emits the canonical quiet NaN
        return float(total)

    def _l1_in_nme_order(self) -> list[torch.Tensor]:
        """The |P-R| contributions in the NME's order: block, then micro-op, then word."""
        if len({i for i, _w0, _d in self.l1_parts}) == 1:
            return [diff for _i, _w0, diff in self.l1_parts]
        depth = self.cfg.depth
        pieces = []
        for i, w0, diff in self.l1_parts:  # a whole-stream part spans several blocks
            for s in range(0, diff.shape[0], depth):
                pieces.append(((w0 + s) // depth, i, diff[s:s + depth]))
        pieces.sort(key=lambda piece: piece[:2])
        return [diff for _b, _i, diff in pieces]
