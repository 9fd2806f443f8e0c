"""The torch reference of every cache operator: the specification the NME must match bit for bit.

Every operator is evaluated in the tensors' own dtype (``torch.bfloat16`` or ``torch.float16``)
with torch eager's rounding after every single ``+ - *`` (one IEEE-754 round-to-nearest-even
per operation on CPU, docs/design.md); scalars are 0-d tensors of that dtype, never Python floats
(a Python float would promote the arithmetic to fp32 and round differently).

:data:`OPS` maps each name to an :class:`OpSpec` for the CLI and the driver (the table of
operators, inputs and results: :class:`OpSpec`); :data:`ENGINE_OPS` holds ``segment_int8``,
which only the driver compiles (for the cache engine's int8 entries). :func:`quant_int8` is
the host side of the compressed cache (not an NME operator). Bad inputs raise ``ValueError``
naming the operator, the argument, the shape or dtype seen and the one expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = [
    "MAX_SEGMENT_TERMS", "FLOAT_DTYPES", "OpSpec", "OPS", "get_op",
    "add", "sub", "mul", "scale", "gated_residual", "segment", "cfg_combine", "l1_distance",
    "dequant_int8", "quant_int8", "segment_int8", "INT8_QMAX", "ENGINE_OPS",
]

#: Most cached operators coalesced into one segment (the segment operator's K limit).
MAX_SEGMENT_TERMS = 8
#: dtypes a cache tensor may have
FLOAT_DTYPES = (torch.bfloat16, torch.float16)
#: largest |q| of an int8 cache entry (symmetric: -128 is never produced)
INT8_QMAX = 127


def _tensor(op: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: argument {name!r} is {type(t).__name__}, expected a torch.Tensor")
    return t


def _float(op: str, name: str, t, ndim: int) -> torch.Tensor:
    t = _tensor(op, name, t)
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: argument {name!r} has dtype {t.dtype}, "
                         f"expected torch.bfloat16 or torch.float16")
    if t.dim() != ndim:
        raise ValueError(f"{op}: argument {name!r} has shape {tuple(t.shape)}, "
                         f"expected {ndim} dimension(s)")
    return t


def _same_dtype(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.dtype != ref.dtype:
            raise ValueError(f"{op}: argument {name!r} has dtype {t.dtype}, expected "
                             f"{ref.dtype} (the dtype of {ref_name!r})")


def _shape(op: str, name: str, t: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: argument {name!r} has shape {tuple(t.shape)}, "
                         f"expected {what} = {tuple(expected)}")


def _pair(op: str, a, b) -> tuple[torch.Tensor, torch.Tensor]:
    a = _float(op, "a", a, 1)
    b = _float(op, "b", b, 1)
    _same_dtype(op, "a", a, b=b)
    _shape(op, "b", b, a.shape, "[N] like 'a'")
    return a, b


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b`` elementwise. a, b: [N] bf16/fp16 (same dtype). Returns [N] of that dtype."""
    a, b = _pair("add", a, b)
    return a + b


def sub(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a - b`` elementwise. a, b: [N] bf16/fp16 (same dtype). Returns [N] of that dtype."""
    a, b = _pair("sub", a, b)
    return a - b


def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a * b`` elementwise. a, b: [N] bf16/fp16 (same dtype). Returns [N] of that dtype."""
    a, b = _pair("mul", a, b)
    return a * b


def scale(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Per-channel scaling ``a * s``. a: [T, C], s: [C], bf16/fp16 (same dtype). Returns [T, C]."""
    a = _float("scale", "a", a, 2)
    s = _float("scale", "s", s, 1)
    _same_dtype("scale", "a", a, s=s)
    _shape("scale", "s", s, a.shape[1:], "[C]")
    return a * s


def gated_residual(x: torch.Tensor, g: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """adaLN gated residual ``x + g*c`` (product rounded, then the sum).

    x, c: [T, C]; g: [C] (a gate broadcast over tokens); all bf16/fp16 of one dtype.
    Returns [T, C].
    """
    x = _float("gated_residual", "x", x, 2)
    g = _float("gated_residual", "g", g, 1)
    c = _float("gated_residual", "c", c, 2)
    _same_dtype("gated_residual", "x", x, g=g, c=c)
    _shape("gated_residual", "g", g, x.shape[1:], "[C]")
    _shape("gated_residual", "c", c, x.shape, "[T, C] like 'x'")
    return x + g * c


def segment(x: torch.Tensor, g: torch.Tensor, c: torch.Tensor, scale: torch.Tensor | None = None,
            group: int | None = None) -> torch.Tensor:
    """A coalesced segment of K cached gated residuals, ``((x + g0*c0) + g1*c1) + ...``.

    Evaluated left to right, every product and every sum rounded to the dtype.
    x: [T, C]; g: [K, C]; c: [K, T, C]; 1 <= K <= 8 (:data:`MAX_SEGMENT_TERMS`); one dtype.
    Compressed terms: c int8 [K, T, C] with ``scale`` [K, T, C/G] of x's dtype and
    ``group`` = G: each ``c_k`` is first ``dequant_int8(c_k, scale_k, G)`` (one rounded
    product per element), then the same arithmetic.
    Returns [T, C].
    """
    x = _float("segment", "x", x, 2)
    g = _float("segment", "g", g, 2)
    if isinstance(c, torch.Tensor) and c.dtype == torch.int8:
        if scale is None or group is None:
            raise ValueError("segment: int8 terms 'c' need scale=[K, T, C/G] and group=G")
        return segment_int8(x, g, c, scale, group)
    c = _float("segment", "c", c, 3)
    _same_dtype("segment", "x", x, g=g, c=c)
    k = _segment_k("segment", x, g)
    _shape("segment", "c", c, (k,) + tuple(x.shape), "[K, T, C]")
    y = x
    for gk, ck in zip(g, c):
        y = y + gk * ck
    return y


def _segment_k(op: str, x: torch.Tensor, g: torch.Tensor) -> int:
    k = g.shape[0]
    if not 1 <= k <= MAX_SEGMENT_TERMS:
        raise ValueError(f"{op}: argument 'g' has K={k} rows, expected 1..{MAX_SEGMENT_TERMS}")
    _shape(op, "g", g, (k,) + tuple(x.shape[1:]), "[K, C]")
    return k


def segment_int8(x: torch.Tensor, g: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                 group: int) -> torch.Tensor:
    """A segment on int8 cache entries: ``((x + g0*d0) + g1*d1) + ...`` with
    ``d_k = dequant_int8(q_k, scale_k, group)`` in the format.

    x: [T, C]; g: [K, C]; scale: [K, T, C/G]; all of one float dtype; q: int8 [K, T, C];
    group: G, a divisor of C; 1 <= K <= 8. Returns [T, C].
    """
    x = _float("segment_int8", "x", x, 2)
    g = _float("segment_int8", "g", g, 2)
    scale = _float("segment_int8", "scale", scale, 3)
    _same_dtype("segment_int8", "x", x, g=g, scale=scale)
    q = _tensor("segment_int8", "q", q)
    if q.dtype != torch.int8:
        raise ValueError(f"segment_int8: argument 'q' has dtype {q.dtype}, expected torch.int8")
    k = _segment_k("segment_int8", x, g)
    _shape("segment_int8", "q", q, (k,) + tuple(x.shape), "[K, T, C]")
    group = int(group)
    t, c = x.shape
    if group < 1 or c % group:
        raise ValueError(f"segment_int8: group={group}, expected a positive divisor of C={c}")
    _shape("segment_int8", "scale", scale, (k, t, c // group), "[K, T, C/G]")
    y = x
    for gk, qk, sk in zip(g, q, scale):
        y = y + gk * dequant_int8(qk, sk, group)
    return y


def cfg_combine(u: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Classifier-free guidance ``u + s*(c - u)``: three rounded operations in that order.

    u, c: [T, C] (unconditional, conditional branch); s: [] guidance scale as a 0-d tensor
    of the same dtype (not a Python float). Returns [T, C].
    """
    u = _float("cfg_combine", "u", u, 2)
    c = _float("cfg_combine", "c", c, 2)
    s = _float("cfg_combine", "s", s, 0)
    _same_dtype("cfg_combine", "u", u, c=c, s=s)
    _shape("cfg_combine", "c", c, u.shape, "[T, C] like 'u'")
    return u + s * (c - u)


def l1_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """L1 distance ``sum |a - b|`` in float32 (the DRA change monitor).

    a, b: [N] bf16/fp16 (same dtype), widened exactly to float32. Returns a 0-d float32
    tensor. The NME sums in a different order (per-lane accumulators, isa.py), so equality
    with this reference is to a relative tolerance of 1e-5.
    """
    a, b = _pair("l1_distance", a, b)
    return torch.sum(torch.abs(a.float() - b.float()), dtype=torch.float32)


def dequant_int8(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """Per-group dequantisation of a compressed cache tensor, ``q * scale``.

    q: int8 [T, C]; scale: bf16/fp16 [T, C/G], one scale per group of ``group`` = G
    consecutive channels of a token (G must divide C). q converts exactly to the scale's
    dtype, then one rounded product. Returns [T, C] in the scale's dtype.
    """
    q = _tensor("dequant_int8", "q", q)
    if q.dtype != torch.int8:
        raise ValueError(f"dequant_int8: argument 'q' has dtype {q.dtype}, expected torch.int8")
    if q.dim() != 2:
        raise ValueError(f"dequant_int8: argument 'q' has shape {tuple(q.shape)}, "
                         f"expected 2 dimension(s) [T, C]")
    scale = _float("dequant_int8", "scale", scale, 2)
    group = int(group)
    t, c = q.shape
    if group < 1 or c % group:
        raise ValueError(f"dequant_int8: group={group}, expected a positive divisor of C={c}")
    _shape("dequant_int8", "scale", scale, (t, c // group), "[T, C/G]")
    return q.to(scale.dtype) * scale.repeat_interleave(group, dim=1)


def quant_int8(c: torch.Tensor, group: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group int8 quantisation of a cache tensor (the host side of an int8 cache entry;
    :func:`dequant_int8` is its inverse on the NME).

    For each token and each group of ``group`` = G consecutive channels, in fp32: ``scale =
    max|c| / 127`` rounded once to ``dtype`` (the NME format), then ``q = round-half-to-even(
    c / scale)`` with the rounded scale, clamped to [-127, 127]. A group whose scale is 0
    (all zeros, or too small for the format) gets q = 0, so it dequantises to exact zeros.
    Then ``|q * scale - c| <= scale / 2`` per element of a finite c whose scale is a normal
    number of the format (:func:`dequant_int8` adds the rounding of that product).

    A group holds finite values only: one inf or NaN would make its scale non-finite and
    every element of the group dequantise to NaN (``0 * inf``), so such a c is refused, as is
    a group whose max|c| / 127 overflows ``dtype`` (beyond fp16's largest number, 65504; no
    fp32 value overflows bf16). A cache that may meet them keeps its entries in the 16-bit
    format (``cache_format="bf16"``), which holds each value as it is. The check reads one
    flag back from c's device (a wait for it on an accelerator; none on the meta device,
    whose tensors hold no values).

    Args:
        c: [T, C] float tensor (any float dtype; e.g. the model's fp32 output).
        group: G >= 1, a divisor of C.
        dtype: torch.bfloat16 or torch.float16, the scale's format.
    Returns:
        (q int8 [T, C], scale [T, C/G] of ``dtype``).
    Raises:
        ValueError: c not a 2-d float tensor, a G that does not divide C, another dtype; c
            holding inf or NaN (their count and the first one's token and channel named), or
            a group whose scale overflows ``dtype`` (its token and channels named).
    """
    c = _tensor("quant_int8", "c", c)
    if not c.is_floating_point() or c.dim() != 2:
        raise ValueError(f"quant_int8: argument 'c' is {c.dtype} {tuple(c.shape)}, expected "
                         "a float tensor [T, C]")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"quant_int8: dtype {dtype}, expected torch.bfloat16 or torch.float16")
    group = int(group)
    t, ch = c.shape
    if group < 1 or ch % group:
        raise ValueError(f"quant_int8: group G={group} does not divide C={ch} channels, "
                         f"expected a positive divisor of C={ch}")
    c32 = c.float().reshape(t, ch // group, group)
    amax = c32.abs().amax(dim=2, keepdim=True)
    scale = (amax / INT8_QMAX).to(dtype)
    # amax is NaN where a group holds a NaN; a meta tensor has no values to check
    if c.device.type != "meta" and not bool(torch.isfinite(scale).all()):
        _refuse_non_finite(c32.reshape(t, ch), amax.reshape(t, -1), group, dtype)
    s32 = scale.float()
    safe = torch.where(s32 > 0, s32, torch.ones_like(s32))
    q = torch.round(c32 / safe)                  # torch.round: half to even
    q = torch.where(s32 > 0, torch.nan_to_num(q, nan=0.0), torch.zeros_like(q))
    q = q.clamp(-INT8_QMAX, INT8_QMAX).to(torch.int8)
    return q.reshape(t, ch), scale.reshape(t, ch // group)


def _refuse_non_finite(c: torch.Tensor, amax: torch.Tensor, group: int,
                       dtype: torch.dtype) -> None:
    """The ValueError of :func:`quant_int8` for a c ([T, C], fp32) with a non-finite group
    scale: inf / NaN in c (counted, the first named), else a max|c| (``amax`` [T, C/G]) that
    overflows ``dtype``."""
    bad = ~torch.isfinite(c)
    if bool(bad.any()):
        token, channel = (int(i) for i in bad.nonzero()[0])
        n = int(bad.sum())
        raise ValueError(f"quant_int8: {n} non-finite value{'s' if n > 1 else ''} (inf or NaN) "
                         f"in c, the first at token {token}, channel {channel}: an int8 group "
                         "cannot hold them (its scale max|c|/127 would not be finite and the "
                         "whole group would dequantise to NaN); keep such entries in the "
                         "16-bit format (cache_format='bf16')")
    over = (~torch.isfinite((amax / INT8_QMAX).to(dtype))).nonzero()[0]
    token, g = int(over[0]), int(over[1])
    raise ValueError(f"quant_int8: token {token}, channels {g * group}..{(g + 1) * group - 1}: "
                     f"max|c| = {float(amax[token, g]):.4g} needs a scale beyond "
                     f"{str(dtype).removeprefix('torch.')}'s largest number "
                     f"({torch.finfo(dtype).max:.6g}); keep such entries in the 16-bit format "
                     "(cache_format='bf16')")


@dataclass(frozen=True)
class OpSpec:
    """One reference operator.

    Attributes:
        name: operator name.
        fn: the reference function.
        inputs: names of its tensor arguments, in call order.
        params: names of its integer arguments (after the tensors).
        output: ``"y"`` (a tensor in the inputs' format) or ``"l1"`` (a float32 scalar).

    The operators (:data:`OPS`, :data:`ENGINE_OPS`):

    | op             | inputs (shapes)                         | result                                   |
    |----------------|-----------------------------------------|------------------------------------------|
    | add, sub, mul  | a, b [N]                                | a+b, a-b, a*b                            |
    | scale          | a [T,C], s [C]                          | a*s                                      |
    | gated_residual | x [T,C], g [C], c [T,C]                 | x + g*c                                  |
    | segment        | x [T,C], g [K,C], c [K,T,C], 1<=K<=8    | ((x + g0*c0) + g1*c1) + ... left to right |
    | segment_int8   | x, g as segment; q int8 [K,T,C],        | segment with c_k = dequant_int8(q_k,      |
    |                | scale [K,T,C/G], group=G                | scale_k, G) (each rounded to the format)  |
    | cfg_combine    | u, c [T,C], s []                        | u + s*(c-u)                              |
    | l1_distance    | a, b [N]                                | sum |a-b| in float32 (0-d float32 tensor) |
    | dequant_int8   | q int8 [T,C], scale [T,C/G], group=G    | q * scale, one scale per G channels      |
    """
    name: str
    fn: Callable
    inputs: tuple[str, ...]
    params: tuple[str, ...] = ()
    output: str = "y"

    def __call__(self, **kw):
        missing = [n for n in self.inputs + self.params if n not in kw]
        extra = [n for n in kw if n not in self.inputs + self.params]
        if missing or extra:
            raise ValueError(f"{self.name}: got arguments {sorted(kw)}, expected "
                             f"{list(self.inputs + self.params)}")
        return self.fn(*(kw[n] for n in self.inputs + self.params))


OPS: dict[str, OpSpec] = {s.name: s for s in (
    OpSpec("add", add, ("a", "b")),
    OpSpec("sub", sub, ("a", "b")),
    OpSpec("mul", mul, ("a", "b")),
    OpSpec("scale", scale, ("a", "s")),
    OpSpec("gated_residual", gated_residual, ("x", "g", "c")),
    OpSpec("segment", segment, ("x", "g", "c")),
    OpSpec("cfg_combine", cfg_combine, ("u", "c", "s")),
    OpSpec("l1_distance", l1_distance, ("a", "b"), output="l1"),
    OpSpec("dequant_int8", dequant_int8, ("q", "scale"), ("group",)),
)}
#: operators the NMP driver compiles for the cache engine beside :data:`OPS` (not offered by
#: ``coda nme run``): the segment on int8 cache entries
ENGINE_OPS: dict[str, OpSpec] = {s.name: s for s in (
    OpSpec("segment_int8", segment_int8, ("x", "g", "q", "scale"), ("group",)),
)}


def get_op(name: str) -> OpSpec:
    """The :class:`OpSpec` of an operator name (:data:`OPS` or :data:`ENGINE_OPS`). Raises
    ValueError listing the known names."""
    spec = OPS.get(name) or ENGINE_OPS.get(name)
    if spec is None:
        raise ValueError(f"unknown op {name!r}: expected one of {sorted(OPS)}")
    return spec
