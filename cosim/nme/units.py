"""NME units ``"M,A,O"``: the register stages of an NME's FP units, as one text value.

``M`` stages in each FPMul, ``A`` in each FPAdd and ``O`` operand stages between the buffers
and the operand registers (:class:`~coda.hw.nme.isa.NMEConfig` ``mul_latency``, ``add_latency``,
``operand_latency``). :data:`DEFAULT_UNITS` are the default NME's
(:data:`coda.hw.nme.isa.DEFAULT_PRESET`, the timing-closed ``5,7,1``), what a sweep measures
unless told otherwise. ``0,0,0`` (:data:`COMBINATIONAL`) is the NME of combinational units,
also the units of any record, row or report that names none (from before the units were a
parameter). ``coda bench --sweep-units``, ``coda synth-sweep --units`` and
``coda pass-efficiency --units`` read them with :func:`parse_units`.
"""

from __future__ import annotations

from coda.hw.nme.isa import PRESET_FIELDS, NMEConfig

__all__ = ["COMBINATIONAL", "DEFAULT_UNITS", "parse_units", "units_label", "units_title"]

#: the combinational FP units: no register stage in FPMul, FPAdd or the operand path; also
#: the units of a record that names none
COMBINATIONAL = "0,0,0"
#: the default NME's units (NMEConfig's defaults: the timing-closed preset)
DEFAULT_UNITS = ",".join(str(getattr(NMEConfig, k)) for k in PRESET_FIELDS)


def parse_units(text: str, flag: str = "units") -> tuple[int, int, int]:
    """NME units ``"M,A,O"`` as ``(mul_latency, add_latency, operand_latency)``: register
    stages (NME cycles) in each FPMul, in each FPAdd, and between the buffers and the
    operand registers, each in the range :class:`~coda.hw.nme.isa.NMEConfig` accepts.
    ``flag`` names the value's source in the error (``--sweep-units``, ``units``).
    Raises ValueError naming ``flag`` and the value for anything but three comma-separated
    ints in range."""
    from coda.hw.nme.isa import MAX_ADD_LATENCY, MAX_MUL_LATENCY, MAX_OPERAND_LATENCY

    want = (f"expected M,A,O: three comma-separated ints, mul 0..{MAX_MUL_LATENCY}, "
            f"add 0..{MAX_ADD_LATENCY}, operand 0..{MAX_OPERAND_LATENCY}")
    toks = [t.strip() for t in str(text).split(",")]
    try:
        if len(toks) != 3:
            raise ValueError(f"{len(toks)} given")
        mul, add, opnd = (int(t) for t in toks)
        # NMEConfig's own range check of the three latencies
        NMEConfig(mul_latency=mul, add_latency=add, operand_latency=opnd)
    except ValueError as exc:
        raise ValueError(f"{flag} {text!r}: {want} ({exc})") from None
    return mul, add, opnd


def units_label(units: str | tuple | None) -> str:
    """The canonical ``"M,A,O"`` of NME units (a string as :func:`parse_units` reads it, or a
    ``(mul, add, operand)`` tuple); None or ``""``: :data:`COMBINATIONAL` (a record of a sweep
    before units were a parameter). Raises ValueError like :func:`parse_units`."""
    if units is None or units == "":
        units = COMBINATIONAL
    if not isinstance(units, str):
        units = ",".join(str(v) for v in units)
    return ",".join(map(str, parse_units(units)))


def units_title(units: str | tuple | None) -> str:
    """``"NME units mul M / add A / operand O"`` (register stages) for table titles."""
    mul, add, opnd = parse_units(units_label(units))
    return f"NME units mul {mul} / add {add} / operand {opnd}"
