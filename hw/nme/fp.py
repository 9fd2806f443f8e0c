"""IEEE-754 floating-point units of the NME (Amaranth 0.5): combinational, or pipelined.

Units: :class:`FPAdd` (``a + b``, or ``a - b`` when ``sub`` is 1), :class:`FPMul` (``a * b``),
:class:`FPWiden` (exact conversion to a wider format, bf16/fp16 -> fp32) and :class:`Int8ToFP`
(exact conversion of a two's-complement int8). Every unit is parameterised by an
:class:`FPFormat` ``(exp_bits, man_bits)``, so one implementation serves bf16, fp16 and fp32.
Arithmetic follows IEEE-754 binary formats with round-to-nearest-even, subnormal inputs and
outputs kept (no flush-to-zero), signed zeros, infinities and NaN. A NaN result is always the
canonical quiet NaN (sign 0, exponent all ones, top mantissa bit 1, other bits 0); NaN is
compared by class. This equals torch eager on CPU bit for bit (docs/design.md, Toolchain facts).

:class:`FPAdd` and :class:`FPMul` take ``latency`` register stages, cut at fixed boundaries
(:data:`FPADD_CUTS`, :data:`FPMUL_CUTS`), so every latency computes the same function bit for
bit; docs/nme.md ("The floating-point units") has the datapath and the pipelining.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "FPFormat", "BF16", "FP16", "FP32", "fp_format",
    "FPAdd", "FPMul", "FPWiden", "Int8ToFP", "FPADD_CUTS", "FPMUL_CUTS",
    "FPADD_MAX_LATENCY", "FPMUL_MAX_LATENCY", "check_latency",
]


@dataclass(frozen=True)
class FPFormat:
    """An IEEE-754 style binary format.

    Attributes:
        name: short name (``"bf16"``, ``"fp16"``, ``"fp32"``).
        exp_bits: width of the biased exponent field, bits (>= 2).
        man_bits: width of the stored mantissa (fraction) field, bits (>= 1).
    """
    name: str
    exp_bits: int
    man_bits: int

    def __post_init__(self):
        if self.exp_bits < 2:
            raise ValueError(f"exp_bits={self.exp_bits}: expected >= 2")
        if self.man_bits < 1:
            raise ValueError(f"man_bits={self.man_bits}: expected >= 1")

    @property
    def width(self) -> int:
        """Total width in bits: sign + exponent + mantissa."""
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self) -> int:
        """Exponent bias, ``2**(exp_bits-1) - 1`` (IEEE-754 section 3.3)."""
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def exp_max(self) -> int:
        """The all-ones exponent field (infinity / NaN)."""
        return (1 << self.exp_bits) - 1

    @property
    def quiet_nan(self) -> int:
        """Bit pattern of the canonical quiet NaN emitted by the units."""
        return (self.exp_max << self.man_bits) | (1 << (self.man_bits - 1))

    @property
    def inf(self) -> int:
        """Bit pattern of +infinity (set bit ``width-1`` for -infinity)."""
        return self.exp_max << self.man_bits


BF16 = FPFormat("bf16", 8, 7)
FP16 = FPFormat("fp16", 5, 10)
FP32 = FPFormat("fp32", 8, 23)

_FORMATS = {f.name: f for f in (BF16, FP16, FP32)}


def fp_format(name: str) -> FPFormat:
    """The format called ``name`` (``"bf16"``, ``"fp16"`` or ``"fp32"``).

    Raises:
        ValueError: unknown name.
    """
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown FP format {name!r}: expected one of "
                         f"{sorted(_FORMATS)}") from None


def _check_format(fmt) -> FPFormat:
    if not isinstance(fmt, FPFormat):
        raise TypeError(f"fmt={fmt!r}: expected an FPFormat (e.g. BF16, FP16, FP32)")
    return fmt


# --------------------------------------------------------------------------------------
# Pipeline stages
# --------------------------------------------------------------------------------------

#: FPAdd's stage boundaries used by each latency (index = latency). Boundary 0: after the
#: unpacking, the magnitude compare and both exponent differences (before the swap); 1: after
#: the operand swap and the clamped alignment shift; 2: after the alignment shift; 3: after the
#: significand add; 4: after its leading-zero count, the normalisation shift amount and the
#: hidden bit; 5: after the normalisation shift (before rounding); 6: after rounding (the
#: packed magnitude, before the special cases). A standalone fp32 FPAdd
#: with registered ports on ECP5 (LFE5U-25F, nextpnr): 106 MHz at latency 4, 121 MHz at 5.
FPADD_CUTS = ((), (2,), (1, 4), (1, 2, 4), (1, 2, 3, 4), (1, 2, 3, 4, 5),
              (0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5, 6))
#: FPMul's stage boundaries used by each latency. Boundary 0: after unpacking (the
#: significands with their hidden bits, the exponent sum, the sign and class flags), so the
#: multiplier's inputs come straight from registers; 1: after the significand product;
#: 2: after its leading-zero count and the shift amount; 3: after the normalisation shift;
#: 4: after rounding (the packed magnitude, before the special cases).
FPMUL_CUTS = ((), (2,), (1, 2), (1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3, 4))
FPADD_MAX_LATENCY = len(FPADD_CUTS) - 1
FPMUL_MAX_LATENCY = len(FPMUL_CUTS) - 1


def check_latency(what: str, latency, max_latency: int) -> int:
    """``latency`` as an int in ``0..max_latency`` (register stages of a unit).

    Raises:
        ValueError: not an int, or out of range (the message names ``what`` and the value).
    """
    if isinstance(latency, bool) or not isinstance(latency, int) \
            or not 0 <= latency <= max_latency:
        raise ValueError(f"{what}={latency!r}: expected an int 0..{max_latency} "
                         f"(register stages)")
    return latency


class _Stages:
    """Registers the values crossing a stage boundary when the unit's latency uses it."""

    def __init__(self, m: Module, cuts: tuple, prefix: str):
        self.m, self.cuts, self.prefix = m, frozenset(cuts), prefix

    def __call__(self, boundary: int, **values):
        """The values after ``boundary``: the same ones, or registered copies (``sync``)."""
        if boundary not in self.cuts:
            return tuple(values.values())
        out = []
        for name, value in values.items():
            value = Value.cast(value)
            reg = Signal(value.shape(), name=f"{self.prefix}_s{boundary}_{name}")
            self.m.d.sync += reg.eq(value)
            out.append(reg)
        return tuple(out)

    def named(self, boundary: int, values: dict) -> dict:
        """The dict ``values`` (name -> value) after ``boundary``, as :meth:`__call__`."""
        return dict(zip(values, self(boundary, **values)))


# --------------------------------------------------------------------------------------
# Shared datapath pieces (they add logic to the given Module)
# --------------------------------------------------------------------------------------

class _Unpacked:
    """Fields of one operand: sign, effective exponent, significand and class flags."""

    def __init__(self, m: Module, fmt: FPFormat, bits, name: str):
        M, E = fmt.man_bits, fmt.exp_bits
        man, exp = bits[:M], bits[M:M + E]
        self.sign = Signal(name=f"{name}_sign")
        # Subnormals share the exponent of the smallest normal (1); their hidden bit is 0.
        self.exp = Signal(E, name=f"{name}_exp")
        self.sig = Signal(M + 1, name=f"{name}_sig")
        self.is_inf = Signal(name=f"{name}_inf")
        self.is_nan = Signal(name=f"{name}_nan")
        self.is_zero = Signal(name=f"{name}_zero")
        hidden = exp != 0
        exp_ones = exp == fmt.exp_max
        m.d.comb += [
            self.sign.eq(bits[M + E]),
            self.exp.eq(Mux(hidden, exp, 1)),
            self.sig.eq(Cat(man, hidden)),
            self.is_inf.eq(exp_ones & (man == 0)),
            self.is_nan.eq(exp_ones & (man != 0)),
            self.is_zero.eq(~hidden & (man == 0)),
        ]


def _leading_zeros(m: Module, value, name: str) -> Signal:
    """Leading-zero count of ``value`` by a log-depth tree (count = len(value) if zero).

    Returns an unsigned Signal wide enough for ``len(value)``.
    """
    width = len(value)
    n = 2
    while n < width:
        n *= 2
    # Pad below with ones so a zero input counts exactly ``width`` leading zeros.
    padded = Cat(Const((1 << (n - width)) - 1, n - width), value) if n > width else value

    def tree(v):
        if len(v) == 2:
            return v.any(), ~v[1]
        half = len(v) // 2
        lo_any, lo_cnt = tree(v[:half])
        hi_any, hi_cnt = tree(v[half:])
        # Counts of both halves have the same width; the top bit says "high half empty".
        return hi_any | lo_any, Cat(Mux(hi_any, hi_cnt, lo_cnt), ~hi_any)

    nonzero, count = tree(padded)
    lz = Signal(range(width + 1), name=name)
    # An all-zero power-of-two-wide input leaves the tree at width-1: fix it up.
    m.d.comb += lz.eq(Mux(nonzero, count, width))
    return lz


def _round_pack(m: Module, fmt: FPFormat, norm, e_field, overflow, name: str):
    """Round-to-nearest-even of a normalised significand and pack ``{exp, mantissa}``.

    Args:
        norm: significand whose top bit is the hidden bit (1 for a normal result, 0 for a
            subnormal one); below it ``man_bits`` mantissa bits, then the round bit, then
            sticky bits (at least one).
        e_field: biased exponent field of the result before rounding (0 for subnormal).
        overflow: 1 when the exponent is already beyond the largest finite one.
    Returns:
        Signal of ``width - 1`` bits: the magnitude bits (exponent and mantissa) of the
        result; infinity on overflow or when rounding carries past the largest finite.
    """
    M, E = fmt.man_bits, fmt.exp_bits
    w = len(norm)
    mant = norm[w - 1 - M:w - 1]
    round_bit = norm[w - 2 - M]
    sticky = norm[:w - 2 - M].any()
    lsb = norm[w - 1 - M]
    round_up = round_bit & (sticky | lsb)
    mag = Signal(E + M, name=name)
    # The increment carries mantissa overflow into the exponent; all-ones exponent with
    # zero mantissa is exactly infinity, so rounding past max finite needs no extra case.
    m.d.comb += mag.eq(Mux(overflow, fmt.inf, Cat(mant, e_field[:E]) + round_up))
    return mag


def _specials(fmt: FPFormat, sign, mag, nan, inf, inf_sign):
    """Final result word: NaN beats infinity beats the computed ``{sign, mag}``."""
    return Mux(nan, fmt.quiet_nan,
               Mux(inf, Cat(Const(fmt.inf, fmt.width - 1), inf_sign), Cat(mag, sign)))


# --------------------------------------------------------------------------------------
# FPAdd
# --------------------------------------------------------------------------------------

class FPAdd(wiring.Component):
    """IEEE-754 adder/subtractor, round-to-nearest-even; combinational or pipelined.

    Parameters:
        fmt: the format (:class:`FPFormat`).
        latency: register stages inside the unit, 0..:data:`FPADD_MAX_LATENCY` (default 0:
            combinational). ``y`` is the result of the ``a``, ``b``, ``sub`` presented
            ``latency`` clock cycles (domain ``sync``) earlier; one operation per cycle.

    Ports:
        a, b: In(fmt.width), operand bit patterns.
        sub: In(1), 1 computes ``a - b`` (the sign of ``b`` is flipped, NaN stays NaN).
        y: Out(fmt.width), result bit pattern.

    Special cases: NaN operand -> canonical qNaN; inf - inf -> qNaN; inf +- finite -> inf;
    an exact zero sum of operands of opposite signs is +0, ``(-0) + (-0) = -0``;
    overflow rounds to infinity. Subnormal inputs and results are kept.

    Datapath: swap so ``|x| >= |y|``; shift ``y`` right by the exponent difference keeping
    a guard, a round and a sticky bit (enough for correct RNE, since a subtraction with
    exponent difference >= 2 needs at most one bit of left normalisation); add or
    subtract; one leading-zero count; one left shift, limited so the exponent never goes
    below that of the smallest normal (giving subnormals); round and pack. The stage
    boundaries of each latency are :data:`FPADD_CUTS`.

    Raises:
        TypeError: ``fmt`` is not an :class:`FPFormat`.
        ValueError: ``latency`` is not an int in 0..FPADD_MAX_LATENCY.
    """

    def __init__(self, fmt: FPFormat, latency: int = 0):
        self.fmt = _check_format(fmt)
        self.latency = check_latency("latency", latency, FPADD_MAX_LATENCY)
        super().__init__({"a": In(fmt.width), "b": In(fmt.width), "sub": In(1),
                          "y": Out(fmt.width)})

    def elaborate(self, platform):
        m = Module()
        cut = _Stages(m, FPADD_CUTS[self.latency], "add")
        v = cut.named(0, self._classify(m))
        v = cut.named(1, self._order(m, **v))
        v = cut.named(2, self._align(m, **v))
        v = cut.named(3, self._add(m, **v))
        v = cut.named(4, self._normalise_shift(m, **v))
        v = cut.named(5, self._normalise(m, **v))
        v = cut.named(6, self._round(m, **v))
        m.d.comb += self.y.eq(_specials(self.fmt, **v))
        return m

    def _classify(self, m):
        """The operands unpacked, their special cases, magnitude order, exponent differences."""
        fmt = self.fmt
        M, E = fmt.man_bits, fmt.exp_bits
        a = _Unpacked(m, fmt, self.a, "a")
        b = _Unpacked(m, fmt, self.b, "b")
        b_sign = Signal()
        m.d.comb += b_sign.eq(b.sign ^ self.sub)

        # Magnitude order of IEEE patterns equals integer order of {exp, mantissa}.
        swap = Signal()
        m.d.comb += swap.eq(self.a[:E + M] < self.b[:E + M])

        # The special cases depend on the operands only; they travel beside the datapath.
        nan = Signal()
        m.d.comb += nan.eq(a.is_nan | b.is_nan | (a.is_inf & b.is_inf & (a.sign ^ b_sign)))
        inf = Signal()
        m.d.comb += inf.eq(a.is_inf | b.is_inf)
        inf_sign = Signal()
        m.d.comb += inf_sign.eq(Mux(a.is_inf, a.sign, b_sign))

        # Both exponent differences are formed beside the magnitude compare (not after the
        # swap); the swap picks the non-negative one.
        d_ab, d_ba = Signal(E + 1), Signal(E + 1)
        m.d.comb += [d_ab.eq(a.exp - b.exp), d_ba.eq(b.exp - a.exp)]
        return dict(a_sign=a.sign, b_sign=b_sign, a_exp=a.exp, b_exp=b.exp, a_sig=a.sig,
                    b_sig=b.sig, swap=swap, d_ab=d_ab, d_ba=d_ba, nan=nan, inf=inf,
                    inf_sign=inf_sign)

    def _order(self, m, a_sign, b_sign, a_exp, b_exp, a_sig, b_sig, swap, d_ab, d_ba,
               **special):
        """The swap to ``|x| >= |y|``, the effective operation and the alignment shift."""
        M, E = self.fmt.man_bits, self.fmt.exp_bits
        x_sign, y_sign = Signal(), Signal()
        x_exp = Signal(E)
        x_sig, y_sig = Signal(M + 1), Signal(M + 1)
        m.d.comb += [
            x_sign.eq(Mux(swap, b_sign, a_sign)), y_sign.eq(Mux(swap, a_sign, b_sign)),
            x_exp.eq(Mux(swap, b_exp, a_exp)),
            x_sig.eq(Mux(swap, b_sig, a_sig)), y_sig.eq(Mux(swap, a_sig, b_sig)),
        ]
        eff_sub = Signal()
        m.d.comb += eff_sub.eq(a_sign ^ b_sign)

        # Alignment: significands carry 3 extra low bits (guard, round, sticky); a
        # difference beyond them shifts everything into the sticky bit.
        ext = M + 4
        s_ab, s_ba = Signal(range(ext + 1)), Signal(range(ext + 1))
        m.d.comb += [s_ab.eq(Mux(d_ab[E] | (d_ab[:E] > ext), Mux(d_ab[E], 0, ext), d_ab)),
                     s_ba.eq(Mux(d_ba[E] | (d_ba[:E] > ext), Mux(d_ba[E], 0, ext), d_ba))]
        shift = Signal(range(ext + 1))
        m.d.comb += shift.eq(Mux(swap, s_ba, s_ab))
        return dict(x_sign=x_sign, x_exp=x_exp, x_sig=x_sig, y_sig=y_sig, shift=shift,
                    eff_sub=eff_sub, **special)

    def _align(self, m, x_sign, x_exp, x_sig, y_sig, shift, eff_sub, **special):
        """The alignment: ``y`` shifted right, with a guard, a round and a sticky bit."""
        ext = self.fmt.man_bits + 4
        y_wide = Signal(2 * ext)
        m.d.comb += y_wide.eq(Cat(Const(0, ext), y_sig.shift_left(3)) >> shift)
        y_al = Signal(ext)
        m.d.comb += y_al.eq(Cat(y_wide[:ext + 1].any(), y_wide[ext + 1:]))
        return dict(x_sign=x_sign, x_exp=x_exp, x_sig=x_sig, y_al=y_al, eff_sub=eff_sub,
                    **special)

    def _add(self, m, x_sign, x_exp, x_sig, y_al, eff_sub, **special):
        """The significand adder/subtractor, with one carry bit on top."""
        ext = self.fmt.man_bits + 4
        # Sum with one carry bit on top: bit M+4 carry, bit M+3 units of x.
        total = Signal(ext + 1)
        x_al = Cat(Const(0, 3), x_sig)
        m.d.comb += total.eq(Mux(eff_sub, x_al - y_al, x_al + y_al))
        return dict(x_sign=x_sign, x_exp=x_exp, total=total, eff_sub=eff_sub, **special)

    def _normalise_shift(self, m, x_sign, x_exp, total, eff_sub, **special):
        """The leading-zero count, the result's sign and the normalisation shift."""
        ext = self.fmt.man_bits + 4
        lz = _leading_zeros(m, total, "add_lz")
        nonzero = Signal()
        m.d.comb += nonzero.eq(total.any())
        # Exact zero of a true subtraction is +0 in RNE; otherwise the sign of |x|.
        sign = Signal()
        m.d.comb += sign.eq(Mux(eff_sub & ~nonzero, 0, x_sign))
        # Normalise: the shift is capped by x_exp so the exponent stays >= 1; a result
        # still without hidden bit is then subnormal (exponent field 0). The hidden bit
        # after the shift is known before it: set iff the shift is the full lz (lz <= x_exp)
        # of a nonzero sum.
        norm_shift = Signal(range(ext + 2))
        capped = Signal()
        m.d.comb += [capped.eq(x_exp < lz), norm_shift.eq(Mux(capped, x_exp, lz))]
        hidden = Signal()
        m.d.comb += hidden.eq(nonzero & ~capped)
        return dict(sign=sign, x_exp=x_exp, total=total, norm_shift=norm_shift, hidden=hidden,
                    **special)

    def _normalise(self, m, sign, x_exp, total, norm_shift, hidden, **special):
        """The normalising left shift, the result's exponent field and overflow."""
        fmt = self.fmt
        E, ext = fmt.exp_bits, fmt.man_bits + 4
        norm = Signal(ext + 1)
        m.d.comb += norm.eq(total << norm_shift)
        e_res = Signal(E + 1)
        m.d.comb += e_res.eq(x_exp + 1 - norm_shift)
        e_field = Signal(E + 1)
        m.d.comb += e_field.eq(Mux(hidden, e_res, 0))
        overflow = Signal()
        m.d.comb += overflow.eq(hidden & (e_res >= fmt.exp_max))
        return dict(sign=sign, norm=norm, e_field=e_field, overflow=overflow, **special)

    def _round(self, m, sign, norm, e_field, overflow, **special):
        """Round to nearest even and pack the magnitude."""
        mag = _round_pack(m, self.fmt, norm, e_field, overflow, "add_mag")
        return dict(sign=sign, mag=mag, **special)


# --------------------------------------------------------------------------------------
# FPMul
# --------------------------------------------------------------------------------------

class FPMul(wiring.Component):
    """IEEE-754 multiplier, round-to-nearest-even; combinational or pipelined.

    Parameters:
        fmt: the format (:class:`FPFormat`).
        latency: register stages inside the unit, 0..:data:`FPMUL_MAX_LATENCY` (default 0:
            combinational). ``y`` is the product of the ``a``, ``b`` presented ``latency``
            clock cycles (domain ``sync``) earlier; one operation per cycle.

    Ports:
        a, b: In(fmt.width), operand bit patterns.
        y: Out(fmt.width), result bit pattern.

    Special cases: NaN operand or ``0 * inf`` -> canonical qNaN; inf * nonzero -> inf;
    the sign is always ``sign(a) ^ sign(b)`` (also for zeros); overflow rounds to
    infinity; underflow rounds to a subnormal or zero with correct sticky.

    Datapath: one ``(man_bits+1)``-bit square multiplier; one leading-zero count of the
    product; one left shift by ``min(lz, ea + eb - bias)`` applied to the product
    extended by ``man_bits + 2`` zero bits below, so a negative amount (underflow) is a
    right shift that keeps every bit for the sticky; amounts below ``-(man_bits+2)`` are
    clamped, which leaves the whole product under the round bit (result rounds to zero).
    The stage boundaries of each latency are :data:`FPMUL_CUTS`.

    Raises:
        TypeError: ``fmt`` is not an :class:`FPFormat`.
        ValueError: ``latency`` is not an int in 0..FPMUL_MAX_LATENCY.
    """

    def __init__(self, fmt: FPFormat, latency: int = 0):
        self.fmt = _check_format(fmt)
        self.latency = check_latency("latency", latency, FPMUL_MAX_LATENCY)
        super().__init__({"a": In(fmt.width), "b": In(fmt.width), "y": Out(fmt.width)})

    def elaborate(self, platform):
        fmt = self.fmt
        M, E = fmt.man_bits, fmt.exp_bits
        m = Module()
        cut = _Stages(m, FPMUL_CUTS[self.latency], "mul")
        a = _Unpacked(m, fmt, self.a, "a")
        b = _Unpacked(m, fmt, self.b, "b")

        n = 2 * M + 2                       # product width; bit 2M is the units bit
        low = M + 2                         # zero extension below for underflow shifts

        # e_sum = ea + eb - bias: biased exponent of the product if it has its top bit
        # at position 2M+1 minus one; the normalised exponent is e_sum + 1 - lz.
        ew = E + 3
        ea, eb, e_sum = Signal(signed(ew)), Signal(signed(ew)), Signal(signed(ew))
        # Signed operands first: unsigned a.exp + b.exp - bias would wrap, not go negative.
        m.d.comb += [ea.eq(a.exp), eb.eq(b.exp), e_sum.eq(ea + eb - fmt.bias)]

        sign = Signal()
        m.d.comb += sign.eq(a.sign ^ b.sign)
        nan = Signal()
        m.d.comb += nan.eq(a.is_nan | b.is_nan | (a.is_inf & b.is_zero)
                           | (a.is_zero & b.is_inf))
        inf = Signal()
        m.d.comb += inf.eq(a.is_inf | b.is_inf)

        # ---- boundary 0
        sig_a, sig_b, e_sum, sign, nan, inf = cut(0, sig_a=a.sig, sig_b=b.sig, e_sum=e_sum,
                                                  sign=sign, nan=nan, inf=inf)

        prod = Signal(n)
        m.d.comb += prod.eq(sig_a * sig_b)

        # ---- boundary 1
        prod, e_sum, sign, nan, inf = cut(1, prod=prod, e_sum=e_sum, sign=sign, nan=nan,
                                          inf=inf)

        lz = _leading_zeros(m, prod, "mul_lz")
        # amount = clamp(min(e_sum, lz), -low) + low; lz >= 0 > -low, so only an e_sum
        # below lz can be clamped (that compare and e_sum + low do not wait for lz)
        short = Signal()
        m.d.comb += short.eq(e_sum < lz)
        amount = Signal(range(n + low + 1))
        m.d.comb += amount.eq(Mux(short, Mux(e_sum < -low, 0, e_sum + low), lz + low))
        e_res = Signal(signed(ew))
        m.d.comb += e_res.eq(e_sum + 1 - lz)
        # Hidden bit after the shift <=> the shift is the full lz of a nonzero product.
        hidden = Signal()
        m.d.comb += hidden.eq(prod.any() & ~short)

        # ---- boundary 2
        prod, amount, e_res, hidden, sign, nan, inf = cut(
            2, prod=prod, amount=amount, e_res=e_res, hidden=hidden, sign=sign, nan=nan,
            inf=inf)

        norm = Signal(n + low)
        m.d.comb += norm.eq(prod << amount)
        # Hidden bit set <=> e_res >= 1 (normal result).
        e_field = Signal(E + 1)
        m.d.comb += e_field.eq(Mux(hidden, e_res, 0))
        overflow = Signal()
        m.d.comb += overflow.eq(hidden & (e_res >= fmt.exp_max))

        # ---- boundary 3
        norm, e_field, overflow, sign, nan, inf = cut(
            3, norm=norm, e_field=e_field, overflow=overflow, sign=sign, nan=nan, inf=inf)

        mag = _round_pack(m, fmt, norm, e_field, overflow, "mul_mag")

        # ---- boundary 4
        mag, sign, nan, inf = cut(4, mag=mag, sign=sign, nan=nan, inf=inf)

        m.d.comb += self.y.eq(_specials(fmt, sign, mag, nan, inf, sign))
        return m


# --------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------

class FPWiden(wiring.Component):
    """Combinational exact conversion of ``src`` to a wider format ``dst``.

    Used for bf16 -> fp32 and fp16 -> fp32 (the fp32 L1 accumulation).

    Ports:
        a: In(src.width), source bit pattern.
        y: Out(dst.width), the same value in ``dst``.

    Every finite value is exact; a source subnormal becomes a ``dst`` normal when ``dst``
    has a wider exponent range (fp16 -> fp32), or stays subnormal when the ranges are the
    same (bf16 -> fp32). Zeros and infinities keep their sign; a NaN keeps its sign and
    payload (left-aligned) and is made quiet (top mantissa bit set), as IEEE-754
    conversions do.

    Raises:
        TypeError: ``src`` or ``dst`` is not an :class:`FPFormat`.
        ValueError: ``dst`` cannot hold every ``src`` value exactly (fewer mantissa or
            exponent bits, or a range that does not reach the smallest ``src`` subnormal).
    """

    def __init__(self, src: FPFormat, dst: FPFormat):
        self.src, self.dst = _check_format(src), _check_format(dst)
        if dst.man_bits < src.man_bits or dst.exp_bits < src.exp_bits:
            raise ValueError(f"FPWiden({src.name} -> {dst.name}): expected dst to have at "
                             f"least the exponent and mantissa bits of src")
        # Smallest src subnormal is 2**(1 - bias - man_bits); it must be a dst normal
        # unless both formats share the exponent field (then it maps to a dst subnormal).
        if (dst.exp_bits > src.exp_bits
                and 1 - src.bias - src.man_bits < 1 - dst.bias):
            raise ValueError(f"FPWiden({src.name} -> {dst.name}): src subnormals fall "
                             f"below the normal range of dst")
        super().__init__({"a": In(src.width), "y": Out(dst.width)})

    def elaborate(self, platform):
        src, dst = self.src, self.dst
        Ms, Es, Md = src.man_bits, src.exp_bits, dst.man_bits
        pad = Md - Ms
        m = Module()
        man, exp, sign = self.a[:Ms], self.a[Ms:Ms + Es], self.a[Ms + Es]
        man_d = Signal(Md)
        m.d.comb += man_d.eq(man.shift_left(pad))

        if dst.exp_bits == src.exp_bits:
            # Same exponent range: exact by appending zero mantissa bits (subnormal,
            # inf and zero included); only NaNs are quieted.
            is_nan = Signal()
            m.d.comb += is_nan.eq((exp == src.exp_max) & (man != 0))
            m.d.comb += self.y.eq(Cat(man_d | is_nan.shift_left(Md - 1), exp, sign))
            return m

        # Wider exponent: rebias normals; normalise subnormals with one lz count + shift.
        lz = _leading_zeros(m, man, "widen_lz")
        sub_man = Signal(Ms)
        m.d.comb += sub_man.eq(man << (lz + 1))     # drops the leading one
        exp_d = Signal(dst.exp_bits)
        man_out = Signal(Md)
        with m.If(exp == src.exp_max):
            m.d.comb += [exp_d.eq(dst.exp_max),
                         man_out.eq(man_d | (man != 0).shift_left(Md - 1))]
        with m.Elif(exp != 0):
            m.d.comb += [exp_d.eq(exp + (dst.bias - src.bias)), man_out.eq(man_d)]
        with m.Elif(man != 0):
            # Leading one of man at bit Ms-1-lz: value 2**(-lz - src.bias) * 1.f
            m.d.comb += [exp_d.eq(dst.bias - src.bias - lz), man_out.eq(sub_man.shift_left(pad))]
        m.d.comb += self.y.eq(Cat(man_out, exp_d, sign))
        return m


class Int8ToFP(wiring.Component):
    """Exact conversion of a two's-complement int8 to ``fmt``: combinational, or with one
    register stage (``latency`` 1) after the magnitude and its leading-zero count, before
    the normalising shift (``sync`` domain; one conversion per cycle, ``y`` the value of
    the ``a`` of the previous cycle).

    Ports:
        a: In(8), int8 bit pattern (two's complement, -128..127).
        y: Out(fmt.width), the same value in ``fmt`` (0 -> +0), ``latency`` cycles later.

    Raises:
        TypeError: ``fmt`` is not an :class:`FPFormat`.
        ValueError: ``fmt`` cannot hold every int8 exactly (needs man_bits >= 6 for the
            7 significant bits of 127, and a largest finite exponent >= 7 for -128); a
            ``latency`` other than 0 or 1.
    """

    def __init__(self, fmt: FPFormat, latency: int = 0):
        self.fmt = _check_format(fmt)
        if fmt.man_bits < 6 or fmt.exp_max - 1 - fmt.bias < 7:
            raise ValueError(f"Int8ToFP({fmt.name}): expected man_bits >= 6 and a max "
                             f"exponent >= 7 to hold int8 exactly")
        if latency not in (0, 1) or isinstance(latency, bool):
            raise ValueError(f"Int8ToFP latency={latency!r}: expected 0 or 1")
        self.latency = latency
        super().__init__({"a": In(8), "y": Out(fmt.width)})

    def elaborate(self, platform):
        fmt = self.fmt
        M = fmt.man_bits
        m = Module()
        sign = Signal()                      # a < 0 (and so nonzero)
        mag = Signal(8)                      # |a| in 0..128; -(-128) wraps to 128 exactly
        m.d.comb += [sign.eq(self.a[7]), mag.eq(Mux(self.a[7], -self.a, self.a))]
        lz = _leading_zeros(m, mag, "int8_lz")
        if self.latency:
            sign_r, mag_r, lz_r = Signal(), Signal(8), Signal.like(lz, name="int8_lz_r")
            m.d.sync += [sign_r.eq(sign), mag_r.eq(mag), lz_r.eq(lz)]
            sign, mag, lz = sign_r, mag_r, lz_r
        normed = Signal(8)                   # the leading one on top
        m.d.comb += normed.eq(mag << lz)
        frac = Signal(8)
        m.d.comb += frac.eq(normed << 1)      # drops the leading one, fraction left-aligned
        # At most 6 fraction bits are nonzero (127 = 1.111111b * 2**6), so narrowing
        # the 8-bit fraction to man_bits >= 6 loses only zeros.
        man = frac.shift_left(M - 8) if M >= 8 else frac[8 - M:]
        # the exponent looked up from lz (a function of its 4 bits: LUTs, not a subtractor's
        # carry chain behind the leading-zero tree); lz = 8 is a = 0, exponent 0 (as are the
        # values lz never takes, 9..15: every case covered)
        exp = Signal(fmt.exp_bits)
        m.d.comb += exp.eq(Array([Const(fmt.bias + 7 - k if k < 8 else 0, fmt.exp_bits)
                                  for k in range(1 << len(lz))])[lz])
        m.d.comb += self.y.eq(Cat(man, exp, sign))
        return m
