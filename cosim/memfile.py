"""Hex files between numpy memory images and the cosimulation top's ``$readmemh``/``$writememh``.

A memory image is a numpy ``uint16`` array of shape ``(mem_words, lanes)``: ``mem[w, j]`` is
element ``j`` of word ``w``, i.e. bits ``[16j, 16j+16)`` of the ``16*lanes``-bit word (see
:mod:`coda.hw.nme.isa`). In a hex file a word is written most significant digit first, so element
``lanes-1`` comes first. Sparse files put ``@addr`` (hex word address) before each word, which
``$readmemh`` understands and which the top's dirty-word dump writes.

No per-word Python loops: words are converted with numpy and ``bytes.hex``/``bytes.fromhex``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["check_image", "changed_words", "words_to_hex", "hex_to_words", "write_sparse",
           "read_sparse", "write_commands"]


def check_image(mem: np.ndarray, mem_words: int, lanes: int) -> np.ndarray:
    """Validate a memory image; returns it as a C-contiguous uint16 array.

    Raises:
        TypeError: ``mem`` is not a numpy array of dtype uint16.
        ValueError: its shape is not ``(mem_words, lanes)``.
    """
    if not isinstance(mem, np.ndarray) or mem.dtype != np.uint16:
        raise TypeError(f"memory image of type {type(mem).__name__} "
                        f"dtype {getattr(mem, 'dtype', None)}: expected numpy uint16")
    if mem.shape != (mem_words, lanes):
        raise ValueError(f"memory image shape {mem.shape}: expected ({mem_words}, {lanes}) "
                         "(mem_words, lanes)")
    return np.ascontiguousarray(mem)


def changed_words(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Addresses (int64, ascending) of the words in which images ``a`` and ``b`` (uint16
    ``[mem_words, lanes]``, the same shape) differ.

    One flat comparison of the images as 64-, 32- or 16-bit units (the widest that divides a
    word), then the units' word addresses: much faster than
    ``np.flatnonzero((a != b).any(axis=1))``, whose reduction over each word's elements is the
    slow part.
    Raises ValueError when the shapes differ.
    """
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"images of shapes {a.shape} and {b.shape}: expected the same "
                         f"(mem_words, lanes)")
    lanes = a.shape[1]
    per = 4 if lanes % 4 == 0 else 2 if lanes % 2 == 0 else 1
    unit = {4: np.uint64, 2: np.uint32, 1: np.uint16}[per]
    ua, ub = (np.ascontiguousarray(x).view(unit).reshape(-1) for x in (a, b))
    words = np.flatnonzero(ua != ub) // (lanes // per)
    if words.size > 1:     # ascending: a word's units are neighbours
        words = words[np.concatenate(([True], words[1:] != words[:-1]))]
    return words.astype(np.int64, copy=False)


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_HEX_VALUE = np.full(256, 255, dtype=np.uint8)      # ASCII -> digit value, 255: not hex
_HEX_VALUE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16)
_HEX_VALUE[np.frombuffer(b"ABCDEF", dtype=np.uint8)] = np.arange(10, 16)


def _word_digits(words: np.ndarray) -> np.ndarray:
    """ASCII hex digits uint8 ``[n, 4*lanes]`` of uint16 words ``[n, lanes]`` (element
    ``lanes-1`` first), from the words' big-endian bytes (faster than shifting each
    element)."""
    n, lanes = words.shape
    raw = np.ascontiguousarray(words[:, ::-1]).astype(">u2").view(np.uint8).reshape(n, 2 * lanes)
    nibbles = np.empty((n, 4 * lanes), dtype=np.uint8)
    nibbles[:, 0::2], nibbles[:, 1::2] = raw >> 4, raw & 0xF
    return _HEX_DIGITS[nibbles]


def _lines(*columns: np.ndarray) -> bytes:
    """The rows of uint8 ASCII ``columns`` (each ``[n, width]``) side by side, one line each."""
    n = columns[0].shape[0]
    return np.concatenate([*columns, np.full((n, 1), ord("\n"), np.uint8)], axis=1).tobytes()


def words_to_hex(words: np.ndarray) -> list[str]:
    """Hex strings (``4*lanes`` digits, element ``lanes-1`` first) of uint16 words
    ``[n, lanes]``."""
    return _lines(_word_digits(words)).decode("ascii").split("\n")[:-1] if len(words) else []


def hex_to_words(tokens: list[str], lanes: int) -> np.ndarray:
    """Inverse of :func:`words_to_hex`: uint16 array ``[len(tokens), lanes]``.

    Tokens shorter than ``4*lanes`` digits are zero-extended (``$writememh`` pads, but be lenient).
    Raises ValueError on a token longer than a word or not hexadecimal.
    """
    width = 4 * lanes
    if tokens and set(map(len, tokens)) == {width}:    # the usual case: every word in full
        raw = np.frombuffer(bytes.fromhex("".join(tokens)), dtype=">u2").astype(np.uint16)
        return raw.reshape(len(tokens), lanes)[:, ::-1].copy()
    if any(len(t) > width for t in tokens):
        bad = next(t for t in tokens if len(t) > width)
        raise ValueError(f"hex word {bad[:40]!r}... has {len(bad)} digits: expected <= {width}")
    joined = "".join(t.rjust(width, "0") for t in tokens)
    raw = np.frombuffer(bytes.fromhex(joined), dtype=">u2").astype(np.uint16)
    return raw.reshape(len(tokens), lanes)[:, ::-1].copy()


def write_sparse(path: Path, mem: np.ndarray, addrs: np.ndarray) -> None:
    """Write the words ``mem[addrs]`` as ``@addr word`` lines (addresses in hex, zero-padded
    to the widest: ``$readmemh`` reads either)."""
    addrs = np.asarray(addrs, dtype=np.int64)
    if addrs.size == 0:
        Path(path).write_bytes(b"\n")
        return
    width = max(1, (int(addrs.max()).bit_length() + 3) // 4)
    shifts = 4 * np.arange(width - 1, -1, -1, dtype=np.int64)
    n = addrs.size
    Path(path).write_bytes(_lines(np.full((n, 1), ord("@"), np.uint8),
                                  _HEX_DIGITS[(addrs[:, None] >> shifts) & 0xF],
                                  np.full((n, 1), ord(" "), np.uint8), _word_digits(mem[addrs])))


def _hex_column(tokens: list[str], prefix: str = "") -> np.ndarray | None:
    """Values (int64) of equal-length hex tokens after ``prefix``; None if their lengths
    differ, one lacks the prefix or is not hex (the caller then takes the general path, which
    names the bad token)."""
    if not tokens or len(set(map(len, tokens))) != 1 or len(tokens[0]) - len(prefix) > 15:
        return None
    raw = np.frombuffer("".join(tokens).encode("ascii", "replace"),
                        dtype=np.uint8).reshape(len(tokens), -1)
    if prefix and (raw[:, :len(prefix)] != np.frombuffer(prefix.encode(), np.uint8)).any():
        return None
    digits = _HEX_VALUE[raw[:, len(prefix):]]
    if digits.shape[1] == 0 or (digits == 255).any():
        return None
    shifts = 4 * np.arange(digits.shape[1] - 1, -1, -1, dtype=np.int64)
    return (digits.astype(np.int64) << shifts).sum(axis=1)


def read_sparse(path: Path, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """Read ``@addr word`` lines: (addresses int64 ``[n]``, words uint16 ``[n, lanes]``).
    Raises ValueError for anything else (an odd token count, an address without ``@``, a
    token that is not hex or longer than a word)."""
    text = Path(path).read_text().split()
    if len(text) % 2:
        raise ValueError(f"{path}: odd number of tokens in a sparse '@addr word' file")
    addr_tokens, word_tokens = text[0::2], text[1::2]
    addrs = _hex_column(addr_tokens, "@")
    if addrs is None:     # unequal widths or a bad token: one by one
        if any(not a.startswith("@") for a in addr_tokens):
            raise ValueError(f"{path}: expected '@addr word' pairs")
        addrs = np.array([int(a[1:], 16) for a in addr_tokens], dtype=np.int64)
    return addrs, hex_to_words(word_tokens, lanes)


def write_commands(path: Path, words: list[int]) -> None:
    """Write 64-bit command words (header then micro-ops), one per line."""
    for w in words:
        if not 0 <= int(w) < (1 << 64):
            raise ValueError(f"command word {w}: expected 0..2**64-1")
    Path(path).write_text("".join(f"{int(w):016x}\n" for w in words))
