"""Stimuli shared by the netlist simulation and the energy measurement: every cache operator
of :mod:`coda.host.nme.ops` as an NME program on a memory image, with seeded random operands.

Operand data (``kind``):

``"activations"``
    N(0, 1) values rounded to the format: what DiT activations, gates and cached outputs
    look like after normalisation (used for toggle activity, i.e. energy).
``"mixed"``
    70 % N(0, 1) values and 30 % uniformly random 16-bit patterns, which hit every class:
    ±0, subnormals, huge exponents, ±inf, NaN (used for bit-exact equivalence checks).

int8 streams (``dequant_int8``'s ``q``) are uniform over -128..127 in both kinds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from coda.hw.nme.isa import NMEConfig, Program
from coda.host.nme import ops as ref
from coda.host.nme.bits import pack_int8_words, pack_words, torch_dtype
from coda.host.nme.compiler import compile_op, plan_layout

__all__ = ["OpCase", "op_shapes", "op_inputs", "op_case", "KINDS"]

KINDS = ("activations", "mixed")


@dataclass
class OpCase:
    """One cache operator compiled for one NME, with its memory image.

    Attributes:
        op: operator name; shapes: input name -> shape; group: G for dequant_int8.
        program: the compiled :class:`Program`; mem: uint16 ``[cfg.mem_words, cfg.lanes]``.
        inputs: the torch tensors placed in memory (name -> tensor).
        n_elems: elements of the program's stream (output elements; of ``a`` for l1).
    """
    op: str
    shapes: dict
    group: int | None
    program: Program
    mem: np.ndarray
    inputs: dict
    n_elems: int


def op_shapes(op: str, tokens: int, channels: int, k: int = 4) -> dict[str, tuple]:
    """Input shapes of ``op`` for ``tokens`` x ``channels`` tensors (1-D ops get T*C
    elements; segment has ``k`` terms). Raises ValueError for an unknown op."""
    t, c, n = tokens, channels, tokens * channels
    table = {
        "add": {"a": (n,), "b": (n,)}, "sub": {"a": (n,), "b": (n,)}, "mul": {"a": (n,), "b": (n,)},
        "scale": {"a": (t, c), "s": (c,)},
        "gated_residual": {"x": (t, c), "g": (c,), "c": (t, c)},
        "segment": {"x": (t, c), "g": (k, c), "c": (k, t, c)},
        "cfg_combine": {"u": (t, c), "c": (t, c), "s": ()},
        "l1_distance": {"a": (n,), "b": (n,)},
        "dequant_int8": {"q": (t, c), "scale": (t, c)},   # scale's C replaced by C/G below
    }
    if op not in table:
        raise ValueError(f"unknown op {op!r}: expected one of {sorted(ref.OPS)}")
    return table[op]


def _float_tensor(shape, fmt: str, kind: str, gen: np.random.Generator) -> torch.Tensor:
    dtype = torch_dtype(fmt)
    normal = torch.from_numpy(np.asarray(gen.standard_normal(shape), np.float32)).to(dtype)
    if kind == "activations":
        return normal
    if kind != "mixed":
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    raw = torch.from_numpy(np.asarray(gen.integers(0, 1 << 16, size=shape, dtype=np.int32))
                           .astype(np.uint16).view(np.int16)).view(dtype)
    pick = torch.from_numpy(np.asarray(gen.random(shape) < 0.3))
    return torch.where(pick, raw, normal)


def op_inputs(op: str, cfg: NMEConfig, tokens: int, channels: int, *, k: int = 4,
              group: int | None = None, kind: str = "activations",
              seed: int = 0) -> tuple[dict, dict, int | None]:
    """Seeded random inputs of ``op``: (tensors by name, shapes by name, group).

    ``group`` defaults to ``cfg.lanes`` for dequant_int8 (G must be a multiple of lanes).
    Raises ValueError for an unknown op or kind.
    """
    shapes = dict(op_shapes(op, tokens, channels, k))
    if op == "dequant_int8":
        group = cfg.lanes if group is None else group
        shapes["scale"] = (tokens, channels // group)
    gen = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes.items():
        if op == "dequant_int8" and name == "q":
            tensors[name] = torch.from_numpy(gen.integers(-128, 128, size=shape, dtype=np.int8))
        else:
            tensors[name] = _float_tensor(shape, cfg.fmt, kind, gen)
    return tensors, shapes, group


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def op_case(op: str, cfg: NMEConfig, tokens: int, channels: int, *, k: int = 4,
            group: int | None = None, kind: str = "activations", seed: int = 0,
            base: int = 0) -> OpCase:
    """Compile ``op`` for ``cfg`` and lay its seeded random inputs out in a fresh image.

    Streams go back to back from word ``base`` (:func:`coda.host.nme.compiler.plan_layout`); the
    rest of the image, the output stream included, is filled with a seeded pattern so a
    missing or misplaced write shows.

    Raises:
        ValueError: unknown op/kind, shapes the compiler rejects, or a layout past mem_words.
    """
    tensors, shapes, group = op_inputs(op, cfg, tokens, channels, k=k, group=group,
                                       kind=kind, seed=seed)
    layout, _ = plan_layout(op, cfg, shapes, group, base=base)
    program = compile_op(op, cfg, shapes, layout, group)
    gen = np.random.default_rng(seed + 1)
    mem = gen.integers(0, 1 << 16, size=(cfg.mem_words, cfg.lanes), dtype=np.int32).astype(np.uint16)
    for name, tensor in tensors.items():
        if op == "segment" and name in ("g", "c"):
            for addr, row in zip(layout[name], tensor):
                words = pack_words(_bits(row), cfg.lanes)
                mem[addr:addr + len(words)] = words
            continue
        if tensor.dtype == torch.int8:
            words = pack_int8_words(tensor, cfg.lanes)
        else:
            words = pack_words(_bits(tensor.reshape(-1)), cfg.lanes)
        mem[layout[name]:layout[name] + len(words)] = words
    return OpCase(op, shapes, group, program, mem, tensors, program.n_elems)
