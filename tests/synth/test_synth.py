"""Synthesis flow, energy estimate and sweep analysis (synth/).

The flow test synthesises one small NME (generic target, ~1 minute on a shared machine);
the netlist-equivalence test (yosys netlist vs RTL vs torch under Verilator) is ``slow``.
"""

from __future__ import annotations

import json

import pytest

from coda.hw.dram.power import command_energy
from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, UOp
from coda.synth import ecp5, energy, flow, harness
from coda.experiments import area_sweep as sweep

SMALL = NMEConfig(lanes=1, fmt="bf16", depth=16, mem_words=4096)

TOY = """
module toy(clk, rst, a, b, y, z);
  input clk;
  input rst;
  input [7:0] a;
  input [3:0] b;
  output [7:0] y;
  output z;
  reg [7:0] y;
  always @(posedge clk) y <= rst ? 8'd0 : a + b;
  assign z = ^a;
endmodule
"""


def test_top_ports_parses_declarations():
    ports = harness.top_ports(TOY, "toy")
    assert ports == [harness.Port("clk", "input", 1), harness.Port("rst", "input", 1),
                     harness.Port("a", "input", 8), harness.Port("b", "input", 4),
                     harness.Port("y", "output", 8), harness.Port("z", "output", 1)]


def test_top_ports_missing_module_names_it():
    with pytest.raises(ValueError, match="'nope'"):
        harness.top_ports(TOY, "nope")


def test_io_wrapper_shift_register_widths():
    text = harness.io_wrapper("toy", harness.top_ports(TOY, "toy"))
    # inputs without the clock: rst + a + b = 13 bits; outputs y + z = 9 bits
    assert "reg [12:0] in_sr" in text and "reg [8:0] out_sr" in text
    assert ".clk(clk)" in text and ".b(in_sr[12:9])" in text and ".z(core_out[8:8])" in text


def test_pick_device_smallest_that_fits():
    assert ecp5.pick_device(10_000, 8, 4).name == "LFE5U-25F"
    assert ecp5.pick_device(30_000, 8, 4).name == "LFE5U-45F"
    assert ecp5.pick_device(10_000, 100, 4).name == "LFE5U-85F"   # DSPs decide
    assert ecp5.pick_device(80_000, 8, 4) is None                  # 10 % margin over 84K


def test_synthesize_rejects_unknown_target(tmp_path):
    with pytest.raises(ValueError, match="target='asic'"):
        flow.synthesize(SMALL, "asic", tmp_path)


BAD_SYNTH_OPTIONS = [
    (["--freq", "nan"], "--freq nan: expected a finite target clock in MHz"),
    (["--freq", "inf"], "--freq inf: expected a finite target clock in MHz"),
    (["--freq", "0"], "--freq 0.0: expected a finite target clock in MHz, 0 < F <= "),
    (["--freq", "-5"], "--freq -5.0: expected a finite target clock"),
    (["--freq", "1e9"], "--freq 1000000000.0: expected a finite target clock"),
    (["--seed", "-1"], f"--seed -1: expected an integer 0..{2 ** 31 - 1}"),
    (["--seed", str(2 ** 31)], f"--seed {2 ** 31}: expected an integer 0..{2 ** 31 - 1}"),
]


@pytest.mark.parametrize("option, message", BAD_SYNTH_OPTIONS)
def test_synth_options_are_refused_before_any_work(option, message, tmp_path, capsys,
                                                   monkeypatch):
    """coda synth: one ``coda: error:`` line, exit 2, no tool run and no output folder."""
    from coda.cli import main

    def no_work(*args, **kwargs):
        raise AssertionError("synthesis started before its options were checked")

    for name in ("nme_source", "synth_ecp5", "synth_generic", "place_and_route"):
        monkeypatch.setattr(flow, name, no_work)
    out = tmp_path / "Y"
    code = main(["synth", "--target", "ecp5", "--no-pnr", "--out", str(out), *option])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("coda: error: ") and err.count("\n") == 1, err
    assert message in err and not out.exists(), err
    if option[0] == "--freq":
        assert f"0 < F <= {flow.MAX_FREQ_MHZ:g}" in err
    # the library entry point refuses the same values, before creating its folder
    freq = float(option[1]) if option[0] == "--freq" else 100.0
    seed = int(option[1]) if option[0] == "--seed" else 1
    with pytest.raises(ValueError, match="expected"):
        flow.synthesize(SMALL, "ecp5", out, freq_mhz=freq, seed=seed, pnr=False)
    assert not out.exists()


def test_device_by_name():
    assert ecp5.device_by_name("LFE5U-45F").flag == "--45k"
    with pytest.raises(ValueError, match="device='LFE5U-12F': expected one of LFE5U-25F"):
        ecp5.device_by_name("LFE5U-12F")
    with pytest.raises(ValueError, match="device='XC7'"):     # before any tool runs
        flow.synthesize(SMALL, "ecp5", "/nonexistent/x", device="XC7")


def test_generic_synthesis_of_small_nme(tmp_path):
    report = flow.synthesize(SMALL, "generic", tmp_path)
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk == report
    res = report["generic"]
    assert res["cells_total"] == sum(res["cells"].values())
    # memory_map turns the instruction memory and the buffers into flip-flops
    storage_bits = SMALL.imem_depth * 64 + SMALL.nbuf * SMALL.depth * 16 * SMALL.lanes
    assert res["ff"] >= storage_bits
    assert res["logic_depth"] > 20                   # at least an FP add deep
    netlist = (tmp_path / "netlist.v").read_text()
    # the toggle counter is a simulation option, not part of the synthesised NME
    assert "module nme(" in netlist and "dbg_fu_toggles" not in netlist
    assert report["tools"]["yosys"].startswith("Yosys 0.70")
    assert report["config"]["lanes"] == 1 and report["config"]["depth"] == 16


def test_sweep_points_of_pipelined_units(tmp_path, capsys):
    """The synthesis sweep's units and seeds: a folder of their own (the combinational NME
    at seed 1 keeps the old name), rows of those units only with the best seed's Fmax, bad
    units refused before any tool runs."""
    from coda.cosim.nme.units import DEFAULT_UNITS

    kind = sweep.sweep_kind()
    base = {"target": "ecp5", "lanes": 8, "fmt": "bf16"}
    assert kind.folder(kind.full({**base, "units": "0,0,0"})) == "ecp5_l8_bf16"
    # default: the default NME's units (the timing-closed preset), a folder of their own
    assert kind.param("units").default == DEFAULT_UNITS
    assert kind.folder(kind.full(base)) == "ecp5_l8_bf16_u" + DEFAULT_UNITS.replace(",", "")
    assert kind.folder(kind.full({**base, "units": "4, 5,1"})) == "ecp5_l8_bf16_u451"
    assert kind.folder(kind.full({**base, "units": "4,5,1", "seed": 2})) == \
        "ecp5_l8_bf16_u451_s2"
    for units, lut4, fmax in ((None, 15_000, 24.6), ("451_s2", 16_482, 100.88),
                              ("451_s3", 16_482, 96.15)):
        d = tmp_path / "points" / f"ecp5_l8_bf16{'_u' + units if units else ''}"
        d.mkdir(parents=True)
        cfg = {"lanes": 8, "fmt": "bf16"}
        if units:
            cfg.update(mul_latency=4, add_latency=5, operand_latency=1)
        res = {"lut4": lut4, "ff": 1, "mult18": 8, "bram": 20, "lutram": 1,
               "device": "LFE5U-45F", "fmax_mhz": fmax}
        (d / "report.json").write_text(json.dumps({"config": cfg, "target": "ecp5",
                                                   "ecp5": res, "runtime_s": {"total": 1}}))
    assert [r["lut4"] for r in sweep.collect(tmp_path, "0,0,0")] == [15_000]
    assert sweep.collect(tmp_path) == []       # no point of the default units here
    # two seeds of the 4,5,1 netlist: the best Fmax is the row's, whatever the folder order
    assert [(r["lut4"], r["fmax_mhz"]) for r in sweep.collect(tmp_path, "4,5,1")] == \
        [(16_482, 100.88)]
    from coda.cli import main
    assert main(["synth-sweep", "--units", "4,5", "--root", str(tmp_path), "--report-only"]) == 2
    assert capsys.readouterr().err.startswith("coda: error: --units '4,5': expected M,A,O")
    with pytest.raises(ValueError, match="units '9,0,0'"):
        sweep.synth_point({**base, "units": "9,0,0"}, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_program_events_gated_residual():
    program = Program(16, (UOp(Op.MOV, RSrc.MEM, addr=0),
                           UOp(Op.MOV, RSrc.CHAN, d=1, addr=8, param=2),
                           UOp(Op.MAC, RSrc.MEM, p=0, q=1, addr=10),
                           UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=30)))
    ev = energy.program_events(program, lanes=8)
    assert (ev["add16"], ev["mul16"], ev["add32"]) == (1, 1, 0)
    assert ev["sram_reads"] == 3        # MAC reads P and Q, the store reads R
    assert ev["sram_writes"] == 3       # two loads and the MAC write a buffer
    assert (ev["uops"], ev["mem_uops"]) == (4, 4)


def test_nominal_energy_of_add_is_exact():
    program = Program(64, (UOp(Op.MOV, RSrc.MEM, addr=0), UOp(Op.ADD, RSrc.MEM, addr=8),
                           UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=16)))
    e = energy.energy_per_element(program, NMEConfig(lanes=8), None)
    assert e["fu_pj"] == pytest.approx(0.4)                    # one fp16 add (Horowitz)
    assert e["sram_pj"] == pytest.approx(4 * 16 * 10 / 64)     # 4 accesses of 16 bits
    assert e["dram_bits_per_elem"] == pytest.approx(48)        # 2 reads + 1 write of 16 bits
    assert e["dram_write_bits_per_elem"] == pytest.approx(16)
    # per command on DDR5-4800 (coda.hw.dram.power): a RD / WR burst per 64-byte burst, an
    # ACT/PRE pair per 4 KiB row (1024 columns x 32 bits) of the 4 x8 devices
    per = command_energy("DDR5-4800")
    assert e["dram_pj"] == pytest.approx((32 * per.read_pj + 16 * per.write_pj) / (64 * 8))
    assert e["act_pj"] == pytest.approx(48 / (1024 * 32) * per.act_pre_pj)


def test_measured_toggles_scale_fu_energy():
    program = Program(64, (UOp(Op.MOV, RSrc.MEM, addr=0), UOp(Op.MUL, RSrc.MEM, addr=8),
                           UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=16)))
    act = energy.Activity("mul", True, 64, toggles=64 * 8, nreads=16, nwrites=8, cycles=100)
    e = energy.energy_per_element(program, NMEConfig(lanes=8), act)
    assert e["fu_pj"] == pytest.approx(1.1 * 8 / 16)           # half the nominal toggles
    assert e["dram_bits_per_elem"] == pytest.approx(24 * 128 / 64)


def test_rank_peak_and_knee():
    assert sweep.rank_peak_bytes_per_s("DDR4-3200") == pytest.approx(25.6e9)
    rows = [{"lanes": n, "fmt": "bf16", "lut4": 1000 * n, "fmax_mhz": 100.0} for n in (32, 64, 128, 256)]
    table = sweep.bandwidth_table(rows, "DDR4-3200")
    # demand = lanes * 2 B * 100 MHz: 6.4, 12.8, 25.6, 51.2 GB/s
    assert [r["bound"] for r in table] == ["compute", "compute", "DRAM", "DRAM"]
    assert [r["knee"] for r in table] == [False, False, True, False]
    assert table[3]["gelem_s"] == pytest.approx(12.8)


def test_measured_knee_and_perf_per_area(tmp_path):
    rows = [{"lanes": n, "fmt": "bf16", "cells_total": 1000 * n} for n in (1, 2, 4)]
    dse = {"rows": [
        {"lanes": 1, "depth": 16, "program": "segment4", "elements_per_cycle": 0.9, "utilisation": 0.9},
        {"lanes": 2, "depth": 16, "program": "segment4", "elements_per_cycle": 1.0, "utilisation": 0.6},
        {"lanes": 2, "depth": 64, "program": "segment4", "elements_per_cycle": 1.2, "utilisation": 0.8},
        {"lanes": 4, "depth": 64, "program": "segment4", "elements_per_cycle": 1.25, "utilisation": 0.85}]}
    table = sweep.measured_table(rows, dse)
    # best depth per lanes; knee = first lanes >= 95 % of the best (1.25): lanes 2 (1.2)
    assert [r["segment4_elem_per_cycle"] for r in table] == [0.9, 1.2, 1.25]
    assert [r["segment4_depth"] for r in table] == [16, 64, 64]
    assert [r["segment4_knee"] for r in table] == [False, True, False]
    assert table[2]["segment4_per_kcell"] == pytest.approx(1.25 / 4)
    assert "residual_add_elem_per_cycle" not in table[0]
    sweep.plot(table, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_measured_table_and_clock_table_of_a_version2_dse(capsys):
    """A version-2 dse.json (standard and NME clock per row): the lanes table uses the
    same-domain rows of dse["dram"] only; clock_table gives perf/area at every clock, the
    knee of coda.experiments.design_space.knees, and whether the ECP5 Fmax reaches the clock."""
    rows = [{"lanes": n, "fmt": "bf16", "cells_total": 1000 * n, "lut4": 500 * n,
             "fmax_mhz": 64.0 if n == 8 else None} for n in (4, 8)]

    def row(dram, mhz, lanes, depth, e_ns, util, epc):
        return {"dram": dram, "nme_mhz": mhz, "nme_mhz_effective": mhz or 2400.0,
                "lanes": lanes, "depth": depth, "program": "segment4", "elements_per_ns": e_ns,
                "utilisation": util, "elements_per_cycle": epc}
    dse = {"version": 2, "dram": "DDR5-4800", "rows": [
        row("DDR5-4800", None, 4, 256, 1.2, 0.6, 0.5), row("DDR5-4800", None, 8, 256, 2.0, 0.88, 0.83),
        row("DDR5-4800", 100.0, 4, 256, 0.08, 0.04, 0.8), row("DDR5-4800", 100.0, 8, 256, 0.16, 0.08, 1.6),
        row("DDR5-4800", 100.0, 8, 64, 0.15, 0.075, 1.5),
        row("DDR4-3200", None, 8, 256, 9.9, 0.9, 9.9)]}
    table = sweep.measured_table(rows, dse)
    # same-domain DDR5-4800 rows only (not the 100 MHz 1.6 elements/cycle, not DDR4)
    assert [r["segment4_elem_per_cycle"] for r in table] == [0.5, 0.83]
    assert [r["segment4_knee"] for r in table] == [False, True]
    crow = sweep.clock_table(rows, dse)
    by = {(r["dram"], r["nme_mhz"], r["lanes"]): r for r in crow}
    assert set(by) == {("DDR5-4800", None, 4), ("DDR5-4800", None, 8), ("DDR5-4800", 100.0, 4),
                       ("DDR5-4800", 100.0, 8), ("DDR4-3200", None, 8)}
    r = by[("DDR5-4800", 100.0, 8)]
    assert r["depth"] == 256 and r["elements_per_ns"] == 0.16            # the best depth
    assert r["per_kcell"] == pytest.approx(0.16 / 8) and r["per_klut"] == pytest.approx(0.16 / 4)
    assert r["ecp5_fmax_mhz"] == 64.0 and r["fmax_ok"] is False          # 64 MHz < 100 MHz
    assert r["knee"] and not r["saturated"]     # NME-bound: 8 % against 88 % on the DRAM clock
    assert by[("DDR5-4800", None, 8)]["knee"] and by[("DDR5-4800", None, 8)]["saturated"]
    assert not by[("DDR5-4800", None, 4)]["knee"]
    assert by[("DDR5-4800", None, 4)]["fmax_ok"] is None                # no Fmax at 4 lanes
    assert sweep.clock_table(rows, {"rows": dse["rows"]}) == []         # version 1: none
    sweep.print_clock_table(crow)
    assert "(< clock)" in capsys.readouterr().out


@pytest.mark.slow
def test_netlist_equivalent_to_rtl_and_torch():
    from coda.verify.netlist_sim import check_equivalence

    report = check_equivalence(NMEConfig(lanes=2, fmt="bf16", depth=16, mem_words=4096))
    assert report.jobs >= 20
    assert report.mismatches == []
