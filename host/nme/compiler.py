"""The NME compiler: every cache operator of :mod:`coda.host.nme.ops` as one NME :class:`Program`.

A program is a fixed list of micro-ops; the NME runs each one as a pass over a block of words
(:mod:`coda.hw.nme.isa`), so the cost of an operator is its number of micro-ops (passes) and of
memory micro-ops (streams). Each operator uses the fewest of both that keep the reference's
order of rounded operations: every ``+ - *`` is one rounded IEEE operation in the reference's
order. :func:`compile_op` compiles one operator (its table of micro-ops per operator, the
constraints it checks and the stream layout it takes are in its docstring);
:func:`plan_layout` places the streams back to back.
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

import torch

from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, UOp, ADDR_BITS, PARAM_BITS
from coda.host.nme import ops as ref
from coda.host.nme.bits import int8_words_for, torch_dtype, words_for

__all__ = ["op_dims", "stream_words", "plan_layout", "compile_op", "program_streams",
           "TERM_STREAMS", "segment_terms"]

Layout = Mapping[str, "int | Sequence[int]"]

#: the segment operators' per-term streams: K of each, one per term
TERM_STREAMS = {"segment": ("g", "c"), "segment_int8": ("g", "q", "scale")}
#: micro-ops and memory streams of a segment program: fixed (x, store y) + per term
_SEGMENT_COST = {"segment": (2, 2), "segment_int8": (4, 3)}


def segment_terms(cfg: NMEConfig, op: str = "segment") -> int:
    """The most terms one program of ``op`` (``"segment"`` or ``"segment_int8"``) holds on
    an NME of ``cfg``: at most :data:`coda.host.nme.ops.MAX_SEGMENT_TERMS`, and within
    ``cfg.imem_depth`` micro-ops and ``cfg.max_streams`` streams. Raises ValueError if not
    even one term fits."""
    uops, streams = _SEGMENT_COST[op]
    k = min(ref.MAX_SEGMENT_TERMS, (cfg.imem_depth - 2) // uops, (cfg.max_streams - 2) // streams)
    if k < 1:
        raise ValueError(f"{op}: imem_depth={cfg.imem_depth}, max_streams={cfg.max_streams} "
                         f"hold no term (one needs {2 + uops} micro-ops, {2 + streams} streams)")
    return k


def op_dims(op: str, cfg: NMEConfig, shapes: Mapping[str, Sequence[int]],
            group: int | None = None) -> dict[str, int]:
    """Check the input shapes of ``op`` (exactly as the reference does) and return its sizes.

    Args:
        op: operator name (see :data:`coda.host.nme.ops.OPS`).
        cfg: the NME configuration (its ``fmt`` is the dtype of the float inputs).
        shapes: input name -> shape.
        group: G, for ``dequant_int8`` only.
    Returns:
        ``{"n": elements of the output stream, "t": tokens, "c": channels, "k": segment terms}``
        (``t``, ``c``, ``k`` where they exist).
    Raises:
        ValueError: unknown op, missing/extra shapes, or shapes the reference rejects.
    """
    key = tuple(sorted((name, tuple(int(d) for d in shape)) for name, shape in shapes.items()))
    return dict(_op_dims(op, cfg.fmt, key, None if group is None else int(group)))


# The reference's checks run on the meta device, which costs about a millisecond per call:
# the driver compiles the same few shapes over and over, so their answers are kept.
@functools.lru_cache(maxsize=4096)
def _op_dims(op: str, fmt: str, shapes: tuple, group: int | None) -> dict[str, int]:
    shapes = dict(shapes)
    spec = ref.get_op(op)
    if set(shapes) != set(spec.inputs):
        raise ValueError(f"{op}: got shapes for {sorted(shapes)}, expected {list(spec.inputs)}")
    dtype = torch_dtype(fmt)
    meta = {name: torch.empty(shapes[name], device="meta",
                              dtype=torch.int8 if name == "q" else dtype)
            for name in spec.inputs}
    if spec.params:
        if group is None:
            raise ValueError(f"{op}: needs group=G (the channels per scale)")
        meta["group"] = int(group)
    out = spec(**meta)
    dims = {"n": out.numel() if spec.output == "y" else meta["a"].numel()}
    first = meta[spec.inputs[0]]
    if first.dim() == 2:
        dims["t"], dims["c"] = first.shape
    if op in TERM_STREAMS:
        dims["k"] = meta["g"].shape[0]
    return dims


def stream_words(op: str, cfg: NMEConfig, shapes: Mapping[str, Sequence[int]],
                 group: int | None = None) -> dict[str, int]:
    """Words each stream of ``op`` occupies in memory (for the segments: per term, the streams
    of :data:`TERM_STREAMS`).

    Returns a dict input name / ``"y"`` -> words (``"y"`` absent for l1_distance).
    Raises ValueError as :func:`op_dims`.
    """
    dims = op_dims(op, cfg, shapes, group)
    n, lanes = dims["n"], cfg.lanes
    sizes = {}
    for name in ref.get_op(op).inputs:
        numel = 1
        for d in shapes[name]:
            numel *= int(d)
        if name in TERM_STREAMS.get(op, ()):
            numel //= dims["k"]
        sizes[name] = int8_words_for(numel, lanes) if name == "q" else words_for(numel, lanes)
    if ref.get_op(op).output == "y":
        sizes["y"] = words_for(n, lanes)
    return sizes


def plan_layout(op: str, cfg: NMEConfig, shapes: Mapping[str, Sequence[int]],
                group: int | None = None, base: int = 0) -> tuple[dict, int]:
    """Place the streams of ``op`` back to back from word ``base`` (inputs, then ``y``).

    Returns ``(layout, end)``: the layout (segment's ``g``/``c`` as lists of K addresses) and
    the first free word after it. Raises ValueError if it does not fit ``cfg.mem_words``.
    """
    sizes = stream_words(op, cfg, shapes, group)
    k = op_dims(op, cfg, shapes, group).get("k", 1)
    layout: dict = {}
    addr = int(base)
    for name, words in sizes.items():
        if name in TERM_STREAMS.get(op, ()):
            layout[name] = [addr + i * words for i in range(k)]
            addr += k * words
        else:
            layout[name] = addr
            addr += words
    if addr > cfg.mem_words:
        raise ValueError(f"{op}: layout needs {addr} words from word {base}, "
                         f"expected at most mem_words={cfg.mem_words}")
    return layout, addr


def program_streams(program: Program) -> int:
    """Memory micro-ops (streams) of a program."""
    return sum(u.touches_memory for u in program.uops)


def _param(what: str, value: int) -> int:
    if not 1 <= value < (1 << PARAM_BITS):
        raise ValueError(f"{what}={value}: expected 1..{(1 << PARAM_BITS) - 1} "
                         f"(the {PARAM_BITS}-bit param field)")
    return value


def _chan_param(cfg: NMEConfig, c: int) -> int:
    if c % cfg.lanes:
        raise ValueError(f"per-channel vector of C={c} channels: CHAN needs C % lanes == 0 "
                         f"(lanes={cfg.lanes})")
    return _param("C/lanes", c // cfg.lanes)


def _group_param(cfg: NMEConfig, group: int) -> int:
    if group % cfg.lanes:
        raise ValueError(f"group={group}: GROUP needs G % lanes == 0 (lanes={cfg.lanes})")
    return _param("G/lanes", group // cfg.lanes)


def _addr(layout: Layout, name: str, k: int | None = None, words: int | None = None) -> int:
    if name not in layout:
        raise ValueError(f"layout has no address for stream {name!r} (has {sorted(layout)})")
    value = layout[name]
    if k is not None:
        value = value[k] if isinstance(value, (list, tuple)) else int(value) + k * words
    elif isinstance(value, (list, tuple)):
        raise ValueError(f"layout[{name!r}] = {value!r}: expected one word address")
    value = int(value)
    if not 0 <= value < (1 << ADDR_BITS):
        raise ValueError(f"layout[{name!r}] = {value}: expected a word address 0..2**{ADDR_BITS}-1")
    return value


def _mem(op: Op, rsrc: RSrc, addr: int, d: int = 0, p: int = 0, q: int = 0,
         param: int = 0) -> UOp:
    return UOp(op, rsrc, False, d=d, p=p, q=q, addr=addr, param=param)


def _store(buf: int, addr: int) -> UOp:
    return UOp(Op.MOV, RSrc.BUF, True, r=buf, addr=addr)


def _uops(op: str, cfg: NMEConfig, dims: dict, layout: Layout, group: int | None,
          words: dict) -> list[UOp]:
    a = lambda name: _addr(layout, name)  # noqa: E731
    if op in ("add", "sub", "mul"):
        alu = {"add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL}[op]
        return [_mem(Op.MOV, RSrc.MEM, a("a")), _mem(alu, RSrc.MEM, a("b")), _store(0, a("y"))]
    if op == "scale":
        return [_mem(Op.MOV, RSrc.MEM, a("a")),
                _mem(Op.MUL, RSrc.CHAN, a("s"), param=_chan_param(cfg, dims["c"])),
                _store(0, a("y"))]
    if op == "gated_residual":
        return [_mem(Op.MOV, RSrc.MEM, a("x")),
                _mem(Op.MOV, RSrc.CHAN, a("g"), d=1, param=_chan_param(cfg, dims["c"])),
                _mem(Op.MAC, RSrc.MEM, a("c"), p=0, q=1),
                _store(0, a("y"))]
    if op == "segment":
        chan = _chan_param(cfg, dims["c"])
        uops = [_mem(Op.MOV, RSrc.MEM, a("x"))]
        for k in range(dims["k"]):
            uops += [_mem(Op.MOV, RSrc.CHAN, _addr(layout, "g", k, words["g"]), d=1, param=chan),
                     _mem(Op.MAC, RSrc.MEM, _addr(layout, "c", k, words["c"]), p=0, q=1)]
        return uops + [_store(0, a("y"))]
    if op == "segment_int8":
        chan, grp = _chan_param(cfg, dims["c"]), _group_param(cfg, group)
        uops = [_mem(Op.MOV, RSrc.MEM, a("x"))]
        for k in range(dims["k"]):
            uops += [_mem(Op.MOV, RSrc.INT8, _addr(layout, "q", k, words["q"]), d=1),
                     _mem(Op.MUL, RSrc.GROUP, _addr(layout, "scale", k, words["scale"]),
                          d=1, p=1, param=grp),
                     _mem(Op.MUL, RSrc.CHAN, _addr(layout, "g", k, words["g"]), d=1, p=1,
                          param=chan),
                     UOp(Op.ADD, RSrc.BUF, d=0, p=0, r=1)]
        return uops + [_store(0, a("y"))]
    if op == "cfg_combine":
        return [_mem(Op.MOV, RSrc.MEM, a("u"), d=1),
                _mem(Op.MOV, RSrc.MEM, a("c"), d=0),
                UOp(Op.SUB, RSrc.BUF, d=0, p=0, r=1),
                _mem(Op.MAC, RSrc.GROUP, a("s"), d=0, p=1, q=0, param=0),
                _store(0, a("y"))]
    if op == "l1_distance":
        return [_mem(Op.MOV, RSrc.MEM, a("a")), _mem(Op.L1, RSrc.MEM, a("b"), p=0)]
    if op == "dequant_int8":
        return [_mem(Op.MOV, RSrc.INT8, a("q")),
                _mem(Op.MUL, RSrc.GROUP, a("scale"), param=_group_param(cfg, group)),
                _store(0, a("y"))]
    raise ValueError(f"unknown op {op!r}: expected one of {sorted(ref.OPS)}")


def _check_fits(op: str, cfg: NMEConfig, uops: list[UOp], layout: Layout, words: dict,
                dims: dict) -> None:
    if len(uops) > cfg.imem_depth:
        raise ValueError(f"{op}: {len(uops)} micro-ops, expected at most "
                         f"imem_depth={cfg.imem_depth}")
    streams = sum(u.touches_memory for u in uops)
    if streams > cfg.max_streams:
        raise ValueError(f"{op}: {streams} memory streams, expected at most "
                         f"max_streams={cfg.max_streams}")
    for name, size in words.items():
        per_term = name in TERM_STREAMS.get(op, ())
        for k in range(dims.get("k", 1) if per_term else 1):
            start = _addr(layout, name, k, size) if per_term else _addr(layout, name)
            # a scalar GROUP operand reads one word; every other stream its full size
            extent = 1 if (op == "cfg_combine" and name == "s") else size
            if start + extent > cfg.mem_words:
                raise ValueError(f"{op}: stream {name!r} at words {start}..{start + extent - 1} "
                                 f"exceeds mem_words={cfg.mem_words}")


def compile_op(op: str, cfg: NMEConfig, shapes: Mapping[str, Sequence[int]], layout: Layout,
               group: int | None = None) -> Program:
    """Compile one cache operator into an NME program.

    Micro-ops per operator:

    | op             | micro-ops (``b0``, ``b1`` on-chip buffers)                                  | uops | streams |
    |----------------|-----------------------------------------------------------------------------|------|---------|
    | add/sub/mul    | b0=a(MEM); b0=b0 op b(MEM); store b0                                         | 3 | 3 |
    | scale          | b0=a(MEM); b0=b0*s(CHAN); store b0                                           | 3 | 3 |
    | gated_residual | b0=x(MEM); b1=g(CHAN); b0=b0+b1*c(MAC, MEM); store b0                        | 4 | 4 |
    | segment        | b0=x(MEM); per k: b1=g_k(CHAN), b0=b0+b1*c_k(MAC, MEM); store b0             | 2K+2 | 2K+2 |
    | segment_int8   | b0=x(MEM); per k: b1=q_k(INT8), b1=b1*scale_k(GROUP), b1=b1*g_k(CHAN),       | 4K+2 | 3K+2 |
    |                | b0=b0+b1; store b0                                                           |      |      |
    | cfg_combine    | b1=u(MEM); b0=c(MEM); b0=b0-b1; b0=b1+b0*s(MAC, GROUP scalar); store b0      | 5 | 4 |
    | l1_distance    | b0=a(MEM); L1 b0, b(MEM)                                                     | 2 | 2 |
    | dequant_int8   | b0=q(INT8); b0=b0*scale(GROUP, G/lanes words per scale); store b0            | 3 | 3 |

    The operand swaps
    are segment_int8's gate product (``g*d`` computed ``d*g``, d the dequantised term) and
    cfg_combine's product, computed ``(c-u)*s`` instead of ``s*(c-u)``: IEEE
    multiplication is commutative bit for bit, except the payload of a NaN, which the NME makes
    canonical anyway (NaNs are compared by class).

    Constraints (``ValueError`` naming the value and what was expected): a per-channel vector
    (CHAN) needs ``C % lanes == 0`` (a word then never straddles two tokens); a per-group scale
    (GROUP) needs ``G % lanes == 0``; ``C/lanes`` and ``G/lanes`` must fit the 16-bit ``param``
    field; the element count must be ``1 .. cfg.max_elems``; the program must fit
    ``cfg.imem_depth`` micro-ops and ``cfg.max_streams`` streams; every stream must lie inside
    ``cfg.mem_words``.

    A *layout* maps each stream name (the op's input names, ``"y"`` for the output) to the word
    address where it starts. For ``segment``, ``"g"`` and ``"c"`` may be a single base address
    (the K rows stored back to back, as :func:`plan_layout` does) or a list of K addresses (e.g.
    cache slots anywhere in memory).

    Args:
        op: operator name (see the table above).
        cfg: the NME configuration (lanes, fmt, limits).
        shapes: input name -> shape, as the reference :mod:`coda.host.nme.ops` takes them.
        layout: stream name -> word address (above); ``"y"`` for the output.
        group: G for ``dequant_int8`` and ``segment_int8``.
    Returns:
        The :class:`Program` (``n_elems`` = elements of the output; of ``a`` for l1_distance).
    Raises:
        ValueError: bad shapes, a constraint above, or a bad layout.
    """
    dims = op_dims(op, cfg, shapes, group)
    n = dims["n"]
    if not 1 <= n <= cfg.max_elems:
        raise ValueError(f"{op}: {n} elements, expected 1..max_elems={cfg.max_elems}")
    words = stream_words(op, cfg, shapes, group)
    uops = _uops(op, cfg, dims, layout, group, words)
    _check_fits(op, cfg, uops, layout, words, dims)
    return Program(n_elems=n, uops=tuple(uops))
