"""How the NMP driver tiles an operator's operands over the ranks: by tokens (rows of a
``[T, C]`` tensor, elements of a flat ``[N]`` one; the first ``T % n`` ranks hold one row
more), by the segment's cached slots' tokens (``c`` ``[K, T, C]`` along dim 1; an int8
segment's ``q`` and ``scale`` the same), or replicated
to every rank (per-channel gates ``[C]``, scalars). :data:`PLACEMENT` says which, per operator
and input; :func:`tile_bounds` and :func:`tile_shapes` give each rank's rows and shapes,
:func:`split_operand` the input whose rows set the tiling, :func:`tile` one rank's tile.
"""

from __future__ import annotations

import math

import torch

from coda.host.nme import ops as ref

__all__ = ["PLACEMENT", "SPLIT0", "SPLIT1", "REPLICATE", "tile_bounds", "tile_shapes",
           "split_operand", "tile"]

#: how an operand is placed on the ranks: split along dim 0 (rows, or elements of a flat
#: vector), split along dim 1 (the segment's c [K, T, C]), or replicated
SPLIT0, SPLIT1, REPLICATE = "split0", "split1", "replicate"
#: op -> input name -> placement on the ranks
PLACEMENT = {
    "add": {"a": SPLIT0, "b": SPLIT0},
    "sub": {"a": SPLIT0, "b": SPLIT0},
    "mul": {"a": SPLIT0, "b": SPLIT0},
    "l1_distance": {"a": SPLIT0, "b": SPLIT0},
    "scale": {"a": SPLIT0, "s": REPLICATE},
    "gated_residual": {"x": SPLIT0, "g": REPLICATE, "c": SPLIT0},
    "segment": {"x": SPLIT0, "g": REPLICATE, "c": SPLIT1},
    "segment_int8": {"x": SPLIT0, "g": REPLICATE, "q": SPLIT1, "scale": SPLIT1},
    "cfg_combine": {"u": SPLIT0, "c": SPLIT0, "s": REPLICATE},
    "dequant_int8": {"q": SPLIT0, "scale": SPLIT0},
}


def tile_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into ``parts`` contiguous [start, end) ranges whose sizes differ by
    at most one, the larger ones first (like ``torch.tensor_split``)."""
    base, extra = divmod(int(n), int(parts))
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (i < extra)
        bounds.append((start, end))
        start = end
    return bounds


def tile_shapes(op: str, shapes: dict[str, tuple], n_ranks: int) -> list[dict | None]:
    """Per rank, the shapes of ``op``'s operand tiles (None for a rank with an empty tile:
    no rows, or rows of zero elements such as ``[T, 0]``).

    ``shapes`` maps the op's input names to full shapes; the split operands are cut with
    :func:`tile_bounds` along their token (or element) axis, the others replicated.
    """
    split_name = split_operand(op)
    out: list[dict | None] = []
    for r0, r1 in tile_bounds(shapes[split_name][0], n_ranks):
        if r1 == r0:
            out.append(None)
            continue
        tiled = {}
        for name, shape in shapes.items():
            shape = list(shape)
            axis = {SPLIT0: 0, SPLIT1: 1}.get(PLACEMENT[op][name])
            if axis is not None:
                shape[axis] = r1 - r0
            tiled[name] = tuple(shape)
        out.append(tiled if math.prod(tiled[split_name]) else None)
    return out


def split_operand(op: str) -> str:
    """The input of ``op`` split along dim 0 whose rows set every rank's tile (the first
    such in the reference's input order). Raises ValueError for an unknown op."""
    spec = ref.get_op(op)
    return next(n for n in spec.inputs if PLACEMENT[op][n] == SPLIT0)


def tile(op: str, name: str, t: torch.Tensor, bounds: tuple[int, int]) -> torch.Tensor:
    """One rank's tile of ``op``'s input ``name``: rows ``bounds`` = [r0, r1) of dim 0 or
    dim 1 as :data:`PLACEMENT` says, or the whole tensor if it is replicated (a view)."""
    mode = PLACEMENT[op][name]
    r0, r1 = bounds
    if mode == SPLIT0:
        return t[r0:r1]
    if mode == SPLIT1:
        return t[:, r0:r1]
    return t
