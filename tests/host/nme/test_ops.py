"""The torch reference of the cache operators (coda.host.nme.ops): exact known values, the order
of roundings, and the input checks."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from coda.host.nme import ops
from coda.host.nme.bits import from_bits, same_bits, to_bits

BF16, FP16 = torch.bfloat16, torch.float16


def t(values, dtype=BF16):
    return torch.tensor(values, dtype=dtype)


def test_elementwise_known_values():
    a, b = t([1.0, 2.5, -3.0]), t([0.5, 0.5, 2.0])
    assert ops.add(a, b).tolist() == [1.5, 3.0, -1.0]
    assert ops.sub(a, b).tolist() == [0.5, 2.0, -5.0]
    assert ops.mul(a, b).tolist() == [0.5, 1.25, -6.0]


def test_add_rounds_to_nearest_even_in_bf16():
    # 1 + 2^-8 is exactly half an ulp of bf16 at 1.0: ties to even -> 1.0;
    # 1 + 3*2^-8 is a tie between 1+2^-7 (odd mantissa) and 1+2^-6 (even) -> 1+2^-6.
    one = t([1.0, 1.0])
    assert ops.add(one, t([2.0 ** -8, 3 * 2.0 ** -8])).tolist() == [1.0, 1.0 + 2.0 ** -6]


def test_gated_residual_rounds_the_product_first():
    # fp16 (ulp 2^-10 at 1): g*c = 1 + 2^-9 + 2^-20 rounds to 1 + 2^-9; adding x = 2^-11 is
    # then an exact tie, broken to the even mantissa 1 + 2^-9. One fused rounding would see
    # the 2^-20 and round up to 1 + 2^-9 + 2^-10.
    x, g, c = t([[2.0 ** -11]], FP16), t([1 + 2.0 ** -10], FP16), t([[1 + 2.0 ** -10]], FP16)
    y = ops.gated_residual(x, g, c)
    assert y.item() == 1 + 2.0 ** -9
    fused = (x.double() + g.double() * c.double()).to(FP16)
    assert fused.item() != y.item()  # a single-rounding FMA would differ


def test_segment_is_left_to_right_chain_of_gated_residuals():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 8, generator=gen).to(BF16)
    g = torch.randn(3, 8, generator=gen).to(BF16)
    c = torch.randn(3, 5, 8, generator=gen).to(BF16)
    chain = x
    for k in range(3):
        chain = ops.gated_residual(chain, g[k], c[k])
    assert torch.equal(ops.segment(x, g, c).view(torch.int16), chain.view(torch.int16))


def test_cfg_combine_scalar_in_the_format():
    u, c = t([[1.0, 2.0]]), t([[3.0, 2.0]])
    assert ops.cfg_combine(u, c, t(7.5)).tolist() == [[16.0, 2.0]]
    with pytest.raises(ValueError, match=r"'s' is float, expected a torch.Tensor"):
        ops.cfg_combine(u, c, 7.5)
    with pytest.raises(ValueError, match=r"'s' has dtype torch.float32, expected torch.bfloat16"):
        ops.cfg_combine(u, c, torch.tensor(7.5))


def test_l1_distance_in_float32():
    a, b = t([1.0, -2.0, 0.5], FP16), t([0.0, 2.0, 0.75], FP16)
    y = ops.l1_distance(a, b)
    assert y.dtype == torch.float32 and y.shape == () and y.item() == 5.25


def test_dequant_int8_per_group():
    q = torch.tensor([[1, -2, 3, 127], [-128, 0, 5, 1]], dtype=torch.int8)
    scale = t([[0.5, 2.0], [1.0, -0.25]])
    y = ops.dequant_int8(q, scale, 2)
    assert y.dtype == BF16
    assert y.tolist() == [[0.5, -1.0, 6.0, 254.0], [-128.0, 0.0, -1.25, -0.25]]


def test_special_values_follow_ieee():
    inf, nan = float("inf"), float("nan")
    a, b = t([inf, inf, 0.0, -0.0, 1.0]), t([-inf, 1.0, -0.0, -0.0, nan])
    y = ops.add(a, b)
    bits = to_bits(y)
    assert np.isnan(y[0].item()) and y[1].item() == inf and np.isnan(y[4].item())
    assert bits[2] == 0x0000 and bits[3] == 0x8000  # x + (-x) = +0, (-0) + (-0) = -0
    assert np.isnan(ops.mul(t([0.0]), t([inf]))[0].item())


def test_subnormals_are_kept():
    tiny = from_bits(np.array([0x0001, 0x0001], np.uint16), "fp16")  # 2^-24
    assert to_bits(ops.add(tiny, tiny)).tolist() == [0x0002, 0x0002]


@pytest.mark.parametrize("call, message", [
    (lambda: ops.add(t([1.0, 2.0]), t([1.0])),
     r"add: argument 'b' has shape \(1,\), expected \[N\] like 'a' = \(2,\)"),
    (lambda: ops.add(t([1.0]), t([1.0], FP16)),
     r"add: argument 'b' has dtype torch.float16, expected torch.bfloat16"),
    (lambda: ops.scale(t([[1.0, 2.0]]), t([1.0])),
     r"scale: argument 's' has shape \(1,\), expected \[C\] = \(2,\)"),
    (lambda: ops.gated_residual(t([[1.0]]), t([1.0]), t([[1.0], [2.0]])),
     r"gated_residual: argument 'c' has shape \(2, 1\), expected \[T, C\] like 'x' = \(1, 1\)"),
    (lambda: ops.segment(t([[1.0]]), t([[1.0]] * 9), t([[[1.0]]] * 9)),
     r"segment: argument 'g' has K=9 rows, expected 1..8"),
    (lambda: ops.segment(t([[1.0]]), t([[1.0]]), t([[[1.0]], [[1.0]]])),
     r"segment: argument 'c' has shape \(2, 1, 1\), expected \[K, T, C\] = \(1, 1, 1\)"),
    (lambda: ops.mul(torch.tensor([1.0]), torch.tensor([1.0])),
     r"mul: argument 'a' has dtype torch.float32, expected torch.bfloat16 or torch.float16"),
    (lambda: ops.dequant_int8(torch.zeros(2, 4, dtype=torch.int8), t([[1.0]] * 2), 3),
     r"dequant_int8: group=3, expected a positive divisor of C=4"),
    (lambda: ops.dequant_int8(torch.zeros(2, 4, dtype=torch.int8), t([[1.0]] * 2), 2),
     r"dequant_int8: argument 'scale' has shape \(2, 1\), expected \[T, C/G\] = \(2, 2\)"),
    (lambda: ops.dequant_int8(torch.zeros(2, 4), t([[1.0]] * 2), 4),
     r"dequant_int8: argument 'q' has dtype torch.float32, expected torch.int8"),
    (lambda: ops.get_op("nope"), r"unknown op 'nope': expected one of"),
    (lambda: ops.OPS["add"](a=t([1.0])), r"add: got arguments \['a'\], expected \['a', 'b'\]"),
])
def test_bad_inputs_name_argument_and_expectation(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_registry_covers_every_operator():
    assert set(ops.OPS) == {"add", "sub", "mul", "scale", "gated_residual", "segment",
                            "cfg_combine", "l1_distance", "dequant_int8"}
    assert set(ops.ENGINE_OPS) == {"segment_int8"}
    assert ops.get_op("segment_int8").params == ("group",)
    assert ops.OPS["l1_distance"].output == "l1"
    assert ops.OPS["dequant_int8"].params == ("group",)
    x = t([[1.0, 2.0]])
    assert same_bits(to_bits(ops.OPS["scale"](a=x, s=t([2.0, 0.5]))),
                     to_bits(t([[2.0, 1.0]])), "bf16")


# ---------------------------------------------------------------- int8 cache entries
def test_quant_int8_known_values_and_a_zero_group():
    c = torch.tensor([[1.0, -2.0, 0.5, 0.25, 0.0, 0.0, -0.0, 0.0]])
    q, s = ops.quant_int8(c, 4, BF16)
    assert s.dtype == BF16 and s.tolist() == [[(torch.tensor(2.0) / 127).to(BF16).item(), 0.0]]
    s0 = s[0, 0].float()
    assert q.dtype == torch.int8
    assert q[0, :4].tolist() == [int(torch.round(v / s0)) for v in c[0, :4]]
    assert q[0, :4].tolist()[1] == -127 and q[0, 4:].tolist() == [0, 0, 0, 0]
    d = ops.dequant_int8(q, s, 4)
    assert d[0, 4:].view(torch.int16).tolist() == [0, 0, 0, 0]    # exact +0, no NaN


def test_quant_int8_rounds_half_to_even():
    # max 127 -> scale 1 exactly: c / scale are the values themselves
    c = torch.tensor([[127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, 126.5]])
    q, s = ops.quant_int8(c, 8, BF16)
    assert s.item() == 1.0
    assert q.tolist() == [[127, 2, 4, -2, 0, 0, 2, 126]]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([BF16, FP16]), st.integers(1, 4), st.sampled_from([1, 2, 8, 16]),
       st.integers(1, 3), st.floats(-6, 6), st.integers(0, 2 ** 31))
def test_quant_dequant_error_is_at_most_half_a_scale(dtype, t_, group, groups, log_mag, seed):
    """Per element, |q * scale - c| <= scale / 2 (exactly, in float64) for c in the cache
    format wherever the scale is a normal number of the format (a subnormal fp16 scale has
    fewer digits; one that underflows to 0 gives q = 0), and dequant_int8 gives that product rounded once to the format."""
    gen = torch.Generator().manual_seed(seed)
    c = (torch.randn(t_, group * groups, generator=gen) * 10.0 ** log_mag).to(dtype)
    assume(bool(torch.isfinite(c).all()))    # fp16 overflows beyond 65504
    if seed % 5 == 0:
        c[:, :group] = 0                     # a zero group
    q, s = ops.quant_int8(c, group, dtype)
    assert q.abs().max() <= 127
    scale = s.double().repeat_interleave(group, dim=1)
    err = (q.double() * scale - c.double()).abs()
    normal = scale >= torch.finfo(dtype).tiny
    assert torch.all((err <= scale / 2)[normal]), (err - scale / 2).max()
    assert torch.all(q[scale == 0] == 0)
    d = ops.dequant_int8(q, s, group)
    assert torch.all(d[c == 0] == 0)         # zero groups (and zeros) dequantise to 0
    assert torch.equal(d, (q.double() * scale).to(dtype))


def test_segment_on_int8_terms_dequantises_then_runs_the_usual_terms():
    gen = torch.Generator().manual_seed(4)
    x, g = torch.randn(3, 16, generator=gen).to(BF16), torch.randn(2, 16, generator=gen).to(BF16)
    entries = [ops.quant_int8(torch.randn(3, 16, generator=gen), 8, BF16) for _ in range(2)]
    q, s = torch.stack([e[0] for e in entries]), torch.stack([e[1] for e in entries])
    deq = torch.stack([ops.dequant_int8(a, b, 8) for a, b in entries])
    want = ops.segment(x, g, deq)
    assert torch.equal(ops.segment(x, g, q, s, 8), want)
    assert torch.equal(ops.segment_int8(x, g, q, s, 8), want)
    assert torch.equal(ops.get_op("segment_int8")(x=x, g=g, q=q, scale=s, group=8), want)
    with pytest.raises(ValueError, match="int8 terms 'c' need scale"):
        ops.segment(x, g, q)
    with pytest.raises(ValueError, match=r"segment_int8: group=5, expected a positive divisor of C=16"):
        ops.segment_int8(x, g, q, s, 5)
    with pytest.raises(ValueError, match=r"quant_int8: group G=5 does not divide C=16"):
        ops.quant_int8(x, 5, BF16)


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 4), groups=st.integers(1, 3), group=st.sampled_from([1, 2, 8]),
       dtype=st.sampled_from([BF16, FP16]), data=st.data())
def test_quant_int8_refuses_non_finite_values(tokens, groups, group, dtype, data):
    """An int8 group cannot hold inf or NaN (its scale max|c|/127 would not be finite and
    the whole group would dequantise to NaN): quant_int8 refuses them, counting them and
    naming the first, whatever the other values of c."""
    channels = groups * group
    finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)
    c = torch.tensor(data.draw(st.lists(finite, min_size=tokens * channels,
                                         max_size=tokens * channels)),
                     dtype=torch.float32).reshape(tokens, channels)
    spots = data.draw(st.sets(st.tuples(st.integers(0, tokens - 1),
                                        st.integers(0, channels - 1)), min_size=1, max_size=4))
    for spot in spots:
        c[spot] = data.draw(st.sampled_from([float("inf"), float("-inf"), float("nan")]))
    first = min(spots)
    with pytest.raises(ValueError) as exc:
        ops.quant_int8(c, group, dtype)
    message = str(exc.value)
    assert message.startswith(f"quant_int8: {len(spots)} non-finite value")
    assert f"the first at token {first[0]}, channel {first[1]}" in message
    assert "cache_format='bf16'" in message


def test_quant_int8_refuses_a_scale_beyond_the_format():
    """max|c| / 127 beyond the format's largest number (fp16's 65504) would be an infinite
    scale: refused, naming the group; bf16 holds it."""
    c = torch.ones(2, 16)
    c[1, 9] = 1e7
    with pytest.raises(ValueError, match=r"quant_int8: token 1, channels 8\.\.15: max\|c\| = "
                                         r"1e\+07 needs a scale beyond float16's largest "
                                         r"number \(65504\)"):
        ops.quant_int8(c, 8, FP16)
    q, scale = ops.quant_int8(c, 8, BF16)
    assert torch.isfinite(ops.dequant_int8(q, scale, 8).float()).all()
