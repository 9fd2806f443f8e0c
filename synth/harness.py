"""The serial I/O harness that lets a design with hundreds of ports be placed on an ECP5.

The NME has hundreds of ports (``16 * lanes`` bits of memory data each way), more than any
ECP5 package has pins, so for place and route it is wrapped (:func:`io_wrapper`): every input
bit comes from a shift register fed by one pin, every output bit is captured in a
parallel-load shift register read out through one pin. All logic stays observable (nothing is
optimised away) and the timing paths are register to register.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Port", "top_ports", "io_wrapper", "WRAPPER_TOP"]

WRAPPER_TOP = "coda_synth_wrap"


@dataclass(frozen=True)
class Port:
    """One port of a Verilog module: ``direction`` is ``"input"`` or ``"output"``, width in bits."""
    name: str
    direction: str
    width: int


_PORT_RE = re.compile(r"^\s*(input|output|inout)\s+(?:wire\s+|reg\s+)?"
                      r"(?:\[(\d+):(\d+)\]\s*)?(\\\S+|[A-Za-z_][\w$]*)\s*[;,)]", re.M)


def top_ports(verilog: str, top: str) -> list[Port]:
    """Ports of module ``top`` in a Verilog text (the declaration style Amaranth/yosys emit:
    ``input [W-1:0] name;``).

    Raises ValueError if the module is absent, has no ports, or has an ``inout``.
    """
    match = re.search(rf"^module\s+\\?{re.escape(top)}\s*\(.*?^endmodule", verilog, re.M | re.S)
    if match is None:
        raise ValueError(f"module {top!r} not found in the Verilog source")
    ports = []
    for m in _PORT_RE.finditer(match.group(0)):
        direction, hi, lo, name = m.groups()
        if direction == "inout":
            raise ValueError(f"port {name!r} of {top!r} is inout: expected input/output only")
        width = abs(int(hi) - int(lo)) + 1 if hi is not None else 1
        ports.append(Port(name, direction, width))
    if not ports:
        raise ValueError(f"module {top!r} has no ports that could be parsed")
    return ports


def io_wrapper(top: str, ports: list[Port], clock: str = "clk") -> str:
    """Verilog of a serial I/O harness ``coda_synth_wrap`` around module ``top``.

    Pins: ``clk`` (drives ``top``'s clock port ``clock`` if it has one; a purely
    combinational ``top`` then sits between two register stages), ``sin`` (serial in),
    ``cap`` (capture outputs), ``sout`` (serial out). Every other input of ``top`` (reset
    included) is a bit of one input shift register; all outputs are loaded into one output
    shift register when ``cap`` is high and shifted out otherwise. Adds ``sum(input widths)``
    (clock excluded) plus ``sum(output widths)`` flip-flops, outside ``top``.

    Raises ValueError if ``top`` has no outputs.
    """
    inputs = [p for p in ports if p.direction == "input" and p.name != clock]
    outputs = [p for p in ports if p.direction == "output"]
    if not outputs:
        raise ValueError(f"module {top!r} has no outputs: nothing to observe")
    in_w = max(1, sum(p.width for p in inputs))
    out_w = sum(p.width for p in outputs)
    clocked = any(p.name == clock and p.direction == "input" for p in ports)
    conns, lo = [f"    .{clock}(clk)"] if clocked else [], 0
    for p in inputs:
        conns.append(f"    .{p.name}(in_sr[{lo + p.width - 1}:{lo}])")
        lo += p.width
    lo = 0
    for p in outputs:
        conns.append(f"    .{p.name}(core_out[{lo + p.width - 1}:{lo}])")
        lo += p.width
    shift_in = "{in_sr[%d:0], sin}" % (in_w - 2) if in_w > 1 else "sin"
    shift_out = "{out_sr[%d:0], 1'b0}" % (out_w - 2) if out_w > 1 else "1'b0"
    return "\n".join([
        f"module {WRAPPER_TOP}(input clk, input sin, input cap, output sout);",
        f"  reg [{in_w - 1}:0] in_sr = 0;",
        f"  reg [{out_w - 1}:0] out_sr = 0;",
        f"  wire [{out_w - 1}:0] core_out;",
        f"  always @(posedge clk) in_sr <= {shift_in};",
        f"  always @(posedge clk) out_sr <= cap ? core_out : {shift_out};",
        f"  assign sout = out_sr[{out_w - 1}];",
        f"  {top} core (",
        ",\n".join(conns),
        "  );",
        "endmodule",
        "",
    ])
