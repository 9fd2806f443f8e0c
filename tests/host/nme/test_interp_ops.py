"""The NME compiler + torch interpreter against the reference operators
(:mod:`coda.host.nme.ops`), bit for bit, on random shapes, layouts and special values
(hypothesis); the compiler's minimal programs and its errors.

The interpreter against a word-by-word model of the ISA: tests/host/nme/test_interp_isa.py; the
cycle model against the RTL: tests/hw/test_nme_cycles.py."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coda.hw.nme.isa import NMEConfig, Status
from coda.host.nme import compiler
from coda.host.nme import interp
from coda.host.nme import ops
from coda.host.nme.bits import (canonical_nan_bits, from_bits, is_nan_bits, pack_int8_words,
                            pack_words, same_bits, to_bits, unpack_words, words_for)
from nme_images import random_bits


SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def random_inputs(op, fmt, rng, t, c, n, k, group):
    f = lambda *shape: from_bits(random_bits(rng, shape, fmt), fmt)  # noqa: E731
    if op in ("add", "sub", "mul", "l1_distance"):
        return {"a": f(n), "b": f(n)}
    if op == "scale":
        return {"a": f(t, c), "s": f(c)}
    if op == "gated_residual":
        return {"x": f(t, c), "g": f(c), "c": f(t, c)}
    if op == "segment":
        return {"x": f(t, c), "g": f(k, c), "c": f(k, t, c)}
    if op == "cfg_combine":
        return {"u": f(t, c), "c": f(t, c), "s": f()}
    q = torch.from_numpy(rng.integers(-128, 128, size=(t, c), dtype=np.int8))
    return {"q": q, "scale": f(t, c // group)}


def write_stream(mem, lanes, addr, name, tensor, op, k=None):
    if name == "q":
        words = pack_int8_words(tensor, lanes)
    else:
        words = pack_words(to_bits(tensor), lanes)
    mem[addr:addr + words.shape[0]] = words


def run_compiled(op, cfg, inputs, group, base, rng):
    """Compile op at word ``base`` of a memory full of garbage, run the interpreter.
    Returns (result, layout, image before)."""
    shapes = {name: tuple(v.shape) for name, v in inputs.items()}
    layout, _end = compiler.plan_layout(op, cfg, shapes, group, base=base)
    mem = rng.integers(0, 1 << 16, size=(cfg.mem_words, cfg.lanes), dtype=np.uint16)
    for name, value in inputs.items():
        if op == "segment" and name in ("g", "c"):
            for k in range(value.shape[0]):
                write_stream(mem, cfg.lanes, layout[name][k], name, value[k], op)
        else:
            write_stream(mem, cfg.lanes, layout[name], name, value, op)
    program = compiler.compile_op(op, cfg, shapes, layout, group)
    before = mem.copy()
    res = interp.run_program(cfg, program, mem)
    assert np.array_equal(mem, before), "run_program must not modify its input image"
    return res, layout, before, program


@st.composite
def cases(draw, op):
    fmt = draw(st.sampled_from(["bf16", "fp16"]))
    lanes = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    depth = draw(st.sampled_from([1, 2, 3, 8, 64]))
    group = lanes * draw(st.integers(1, 2))
    c = group * draw(st.integers(1, 2)) if op == "dequant_int8" else lanes * draw(st.integers(1, 3))
    t = draw(st.integers(1, 9))
    n = draw(st.integers(1, 70))
    k = draw(st.integers(1, 8))
    base = draw(st.integers(0, 5))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return fmt, lanes, depth, t, c, n, k, group, base, seed


def check_op(op, case):
    fmt, lanes, depth, t, c, n, k, group, base, seed = case
    rng = np.random.default_rng(seed)
    inputs = random_inputs(op, fmt, rng, t, c, n, k, group)
    params = {"group": group} if op == "dequant_int8" else {}
    shapes = {name: tuple(v.shape) for name, v in inputs.items()}
    _layout, end = compiler.plan_layout(op, NMEConfig(lanes=lanes, fmt=fmt), shapes,
                                        group if params else None, base=base)
    cfg = NMEConfig(lanes=lanes, fmt=fmt, depth=depth, mem_words=end + 3)
    res, layout, before, prog = run_compiled(op, cfg, inputs, group if params else None,
                                             base, rng)
    assert res.status == Status.OK
    # in place (as the driver runs its own rank images): the same image, written into
    image = before.copy()
    in_place = interp.run_program(cfg, prog, image, inplace=True)
    assert in_place.mem is image and np.array_equal(image, res.mem)
    assert np.float32(in_place.l1).view(np.uint32) == np.float32(res.l1).view(np.uint32)
    want = ops.OPS[op](**inputs, **params)
    if op == "l1_distance":
        want = want.item()
        if np.isnan(want) or np.isinf(want):
            assert res.l1 == want or (np.isnan(want) and np.isnan(res.l1))
        else:
            assert res.l1 == pytest.approx(want, rel=1e-5, abs=0.0)
        assert np.array_equal(res.mem, before)
        return
    n_out = want.numel()
    y_words = words_for(n_out, lanes)
    y = unpack_words(res.mem[layout["y"]:layout["y"] + y_words], n_out)
    assert same_bits(y, to_bits(want).reshape(-1), fmt)
    assert np.all(y[is_nan_bits(y, fmt)] == canonical_nan_bits(fmt))
    # nothing outside the output elements changed (masked tail lanes included)
    after = res.mem.copy().reshape(-1)
    start = layout["y"] * lanes
    after[start:start + n_out] = before.reshape(-1)[start:start + n_out]
    assert np.array_equal(after, before.reshape(-1))


@pytest.mark.parametrize("op", sorted(ops.OPS))
def test_compiled_op_matches_reference_bit_for_bit(op):
    @SETTINGS
    @given(cases(op))
    def prop(case):
        check_op(op, case)
    prop()


def test_program_shapes_are_minimal():
    cfg = NMEConfig(lanes=8)
    expected = {"add": (3, 3), "scale": (3, 3), "gated_residual": (4, 4), "cfg_combine": (5, 4),
                "l1_distance": (2, 2), "dequant_int8": (3, 3)}
    shapes = {"add": {"a": (64,), "b": (64,)}, "scale": {"a": (4, 16), "s": (16,)},
              "gated_residual": {"x": (4, 16), "g": (16,), "c": (4, 16)},
              "cfg_combine": {"u": (4, 16), "c": (4, 16), "s": ()},
              "l1_distance": {"a": (64,), "b": (64,)},
              "dequant_int8": {"q": (4, 16), "scale": (4, 2)}}
    for op, (n_uops, n_streams) in expected.items():
        group = 8 if op == "dequant_int8" else None
        layout, _ = compiler.plan_layout(op, cfg, shapes[op], group)
        prog = compiler.compile_op(op, cfg, shapes[op], layout, group)
        assert (len(prog.uops), compiler.program_streams(prog)) == (n_uops, n_streams), op
    for k in (1, 8):
        sh = {"x": (4, 16), "g": (k, 16), "c": (k, 4, 16)}
        prog = compiler.compile_op("segment", cfg, sh, compiler.plan_layout("segment", cfg, sh)[0])
        assert len(prog.uops) == compiler.program_streams(prog) == 2 * k + 2


@pytest.mark.parametrize("op, shapes, group, cfg, message", [
    ("scale", {"a": (2, 12), "s": (12,)}, None, NMEConfig(lanes=8),
     r"C=12 channels: CHAN needs C % lanes == 0 \(lanes=8\)"),
    ("dequant_int8", {"q": (2, 16), "scale": (2, 4)}, 4, NMEConfig(lanes=8),
     r"group=4: GROUP needs G % lanes == 0 \(lanes=8\)"),
    ("segment", {"x": (2, 8), "g": (8, 8), "c": (8, 2, 8)}, None,
     NMEConfig(lanes=8, max_streams=12), r"segment: 18 memory streams, expected at most "
                                         r"max_streams=12"),
    ("segment", {"x": (2, 8), "g": (8, 8), "c": (8, 2, 8)}, None,
     NMEConfig(lanes=8, imem_depth=10), r"segment: 18 micro-ops, expected at most imem_depth=10"),
    ("add", {"a": (100,), "b": (100,)}, None, NMEConfig(lanes=8, max_elems=64),
     r"add: 100 elements, expected 1..max_elems=64"),
    ("add", {"a": (100,), "b": (50,)}, None, NMEConfig(lanes=8),
     r"add: argument 'b' has shape \(50,\)"),
    ("add", {"a": (100,)}, None, NMEConfig(lanes=8),
     r"add: got shapes for \['a'\], expected \['a', 'b'\]"),
])
def test_compiler_constraints_are_clear_errors(op, shapes, group, cfg, message):
    with pytest.raises(ValueError, match=message):
        layout = {name: 0 for name in list(shapes) + ["y"]}
        compiler.compile_op(op, cfg, shapes, layout, group)


def test_layout_outside_memory_is_an_error():
    cfg = NMEConfig(lanes=8, mem_words=16)
    with pytest.raises(ValueError, match=r"stream 'y' at words 10..17 exceeds mem_words=16"):
        compiler.compile_op("add", cfg, {"a": (64,), "b": (64,)}, {"a": 0, "b": 0, "y": 10})
    with pytest.raises(ValueError, match=r"layout has no address for stream 'y'"):
        compiler.compile_op("add", cfg, {"a": (64,), "b": (64,)}, {"a": 0, "b": 0})
