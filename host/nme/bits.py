"""Bit patterns of bf16 / fp16 tensors and their packing into NME memory words.

The NME memory model (see :mod:`coda.hw.nme.isa`): a word is ``lanes`` 16-bit elements, element
``j`` in bits ``[16j, 16j+16)``; an image is a numpy ``uint16`` array ``[words, lanes]``.
Packed int8 streams hold ``2 * lanes`` int8 values per word, int8 element ``k`` in bits
``[8k, 8k+8)`` (byte ``k`` of the word in little-endian order).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "FORMATS", "torch_dtype", "fmt_of", "to_bits", "from_bits", "canonical_nan_bits",
    "is_nan_bits", "same_bits", "words_for", "int8_words_for", "pack_words", "unpack_words",
    "pack_int8_words", "unpack_int8_words",
]

#: element format name -> torch dtype
FORMATS: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}

# Canonical quiet NaN of the NME's FP units: sign 0, exponent all ones, top mantissa bit 1
# (the FP-unit contract in the project brief).
_CANONICAL_NAN = {"bf16": 0x7FC0, "fp16": 0x7E00}
# (exponent mask, mantissa mask) of each format
_MASKS = {"bf16": (0x7F80, 0x007F), "fp16": (0x7C00, 0x03FF)}


def torch_dtype(fmt: str) -> torch.dtype:
    """torch dtype of an element format name. Raises ValueError on an unknown name."""
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"fmt={fmt!r}: expected one of {sorted(FORMATS)}") from None


def fmt_of(dtype: torch.dtype) -> str:
    """Format name of a torch dtype (bfloat16 -> 'bf16', float16 -> 'fp16'); ValueError else."""
    for name, dt in FORMATS.items():
        if dt == dtype:
            return name
    raise ValueError(f"dtype {dtype}: expected torch.bfloat16 or torch.float16")


def to_bits(t: torch.Tensor) -> np.ndarray:
    """uint16 bit patterns (same shape) of a bf16/fp16 tensor. Raises ValueError on another dtype."""
    fmt_of(t.dtype)
    return t.detach().contiguous().cpu().view(torch.int16).numpy().view(np.uint16)


def from_bits(bits: np.ndarray, fmt: str) -> torch.Tensor:
    """A bf16/fp16 tensor (same shape, own storage) from an array of 16-bit patterns.

    Raises ValueError unless ``bits`` is uint16 or int16.
    """
    bits = np.asarray(bits)
    if bits.dtype not in (np.uint16, np.int16):
        raise ValueError(f"bit patterns of dtype {bits.dtype}: expected uint16 (or int16)")
    raw = np.array(bits, order="C", copy=True).view(np.int16)  # keeps 0-d shapes
    return torch.from_numpy(raw).view(torch_dtype(fmt))


def canonical_nan_bits(fmt: str) -> int:
    """The 16-bit canonical quiet NaN the NME emits for ``fmt`` (0x7FC0 bf16, 0x7E00 fp16)."""
    torch_dtype(fmt)
    return _CANONICAL_NAN[fmt]


def is_nan_bits(bits: np.ndarray, fmt: str) -> np.ndarray:
    """Boolean mask of the NaN patterns (exponent all ones, mantissa non-zero) in ``bits``."""
    exp_mask, man_mask = _MASKS[fmt]
    b = np.asarray(bits).view(np.uint16)
    return ((b & exp_mask) == exp_mask) & ((b & man_mask) != 0)


def same_bits(x: np.ndarray, y: np.ndarray, fmt: str) -> bool:
    """True if two bit-pattern arrays are equal, NaNs compared by class (any NaN == any NaN).

    torch on CPU keeps x86 NaN payloads for fp16 while the NME emits a canonical NaN, so a
    NaN is only required to stay a NaN (docs/design.md, Toolchain facts).
    """
    x = np.asarray(x).view(np.uint16)
    y = np.asarray(y).view(np.uint16)
    if x.shape != y.shape:
        return False
    nx, ny = is_nan_bits(x, fmt), is_nan_bits(y, fmt)
    return bool(np.array_equal(nx, ny) and np.array_equal(x[~nx], y[~ny]))


def words_for(n_elems: int, lanes: int) -> int:
    """Words holding ``n_elems`` 16-bit elements: ``ceil(n_elems / lanes)``."""
    return -(-int(n_elems) // lanes)


def int8_words_for(n_elems: int, lanes: int) -> int:
    """Words holding ``n_elems`` packed int8 values: ``ceil(n_elems / (2 * lanes))``."""
    return -(-int(n_elems) // (2 * lanes))


def pack_words(bits: np.ndarray, lanes: int) -> np.ndarray:
    """Flatten 16-bit patterns row-major into words: uint16 ``[ceil(N/lanes), lanes]``, the
    tail of the last word zero."""
    flat = np.asarray(bits).view(np.uint16).reshape(-1)
    n_words = words_for(flat.size, lanes)
    out = np.zeros(n_words * lanes, np.uint16)
    out[:flat.size] = flat
    return out.reshape(n_words, lanes)


def unpack_words(words: np.ndarray, n_elems: int) -> np.ndarray:
    """The first ``n_elems`` 16-bit patterns (flat uint16) of a block of words."""
    return np.ascontiguousarray(words).reshape(-1)[:n_elems].copy()


def pack_int8_words(q: np.ndarray | torch.Tensor, lanes: int) -> np.ndarray:
    """Pack int8 values (flattened row-major) 2*lanes per word: uint16 ``[ceil(N/2L), lanes]``.

    Byte ``k`` of a word (little-endian) is int8 element ``k`` of that word (isa.py).
    """
    if isinstance(q, torch.Tensor):
        if q.dtype != torch.int8:
            raise ValueError(f"int8 stream of dtype {q.dtype}: expected torch.int8")
        q = q.detach().contiguous().cpu().numpy()
    q = np.asarray(q)
    if q.dtype != np.int8:
        raise ValueError(f"int8 stream of dtype {q.dtype}: expected int8")
    flat = q.reshape(-1)
    n_words = int8_words_for(flat.size, lanes)
    raw = np.zeros(n_words * 2 * lanes, np.int8)
    raw[:flat.size] = flat
    return raw.view("<u2").astype(np.uint16).reshape(n_words, lanes)


def unpack_int8_words(words: np.ndarray, n_elems: int) -> np.ndarray:
    """The first ``n_elems`` int8 values of a block of packed words (inverse of pack_int8_words)."""
    le = np.ascontiguousarray(words).astype("<u2").reshape(-1)
    return le.view(np.int8)[:n_elems].copy()
