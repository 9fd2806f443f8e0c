"""The NME's Verilog (``coda verilog``): its ports at every lane count and format, no
measurement logic in it, and the CLI's options (pipelined units, operand isolation, clock
gating) and refusals."""

import pytest

from coda.hw.nme.isa import MAX_ADD_LATENCY, MAX_MUL_LATENCY, MAX_OPERAND_LATENCY, NMEConfig
from coda.hw.verilog import nme_verilog


# ---------------------------------------------------------------------------------------
# Verilog
# ---------------------------------------------------------------------------------------
PORTS = ["clk", "rst", "cmd_valid", "cmd_ready", "cmd_data", "mem_req_valid", "mem_req_ready",
         "mem_req_we", "mem_req_addr", "mem_req_wdata", "mem_req_wmask", "mem_rsp_valid",
         "mem_rsp_data", "busy", "done", "status", "l1"]


@pytest.mark.parametrize("lanes,fmt", [
    (1, "bf16"), (1, "fp16"), (3, "bf16"), (3, "fp16"),
    pytest.param(8, "bf16", marks=pytest.mark.slow), pytest.param(8, "fp16", marks=pytest.mark.slow),
    pytest.param(64, "bf16", marks=pytest.mark.slow), pytest.param(64, "fp16", marks=pytest.mark.slow),
])
def test_verilog_converts(lanes, fmt):
    text = nme_verilog(NMEConfig(lanes=lanes, fmt=fmt), name="nme_t")
    assert "module nme_t(" in text
    header = text[text.index("module nme_t("):text.index(");")]
    for port in PORTS:
        assert f" {port}" in header or f"({port}" in header, port
    assert f"[{16 * lanes - 1}:0] mem_req_wdata" in text
    # the toggle counter is measurement logic: not in the generated (synthesised) NME
    assert "dbg_fu_toggles" not in text and "_prev" not in text


def test_verilog_cli(tmp_path):
    from coda.cli import main
    out = tmp_path / "nme.v"
    assert main(["verilog", "--lanes", "2", "--fmt", "fp16", "--depth", "8",
                 "--operand-isolation", "off", "-o", str(out)]) == 0
    assert "module nme(" in out.read_text()
    assert main(["verilog", "--lanes", "65", "-o", str(out)]) == 2    # ValueError -> 2


def test_verilog_cli_pipelined_units(tmp_path, capsys):
    """``--mul-latency`` / ``--add-latency`` reach the units (their stage registers are in
    the Verilog); out-of-range values are refused naming the value, nothing written."""
    from coda.cli import main
    out = tmp_path / "nme.v"
    assert main(["verilog", "--lanes", "2", "--depth", "8", "--mul-latency", "2",
                 "--add-latency", "3", "--operand-latency", "0", "-o", str(out)]) == 0
    text = out.read_text()
    assert "mul_s1_prod" in text and "mul_s3_norm" not in text     # FPMUL_CUTS[2] = (1, 2)
    assert "add_s1_shift" in text and "add_s4_norm_shift" in text  # FPADD_CUTS[3] = (1, 2, 4)
    assert "add_s3_" not in text and "add_s5_" not in text
    assert "buf0_q" not in text
    assert main(["verilog", "--lanes", "2", "--depth", "8", "--operand-latency", "1",
                 "-o", str(out)]) == 0
    assert "buf0_q" in out.read_text() and "int8_lz_r" in out.read_text()
    out.unlink()
    for flag, bad in (("--mul-latency", str(MAX_MUL_LATENCY + 1)), ("--add-latency", "-1"),
                      ("--add-latency", str(MAX_ADD_LATENCY + 1)),
                      ("--operand-latency", str(MAX_OPERAND_LATENCY + 1))):
        assert main(["verilog", "--lanes", "2", flag, bad, "-o", str(out)]) == 2
        assert f"{flag} {bad}: expected an int 0.." in capsys.readouterr().err
    assert not out.exists()


def test_verilog_cli_refuses_options_of_another_top(tmp_path, capsys):
    """``--dimms/--ranks/--dram`` describe the DIMM-NMP; with ``--top nme`` they are refused
    by name (they used to be ignored silently), and nothing is written."""
    from coda.cli import main
    out = tmp_path / "nme.v"
    assert main(["verilog", "--top", "nme", "--dimms", "3", "--dram", "DDR4-3200",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--dimms, --dram given with --top nme" in err and "--top dimm takes" in err
    assert not out.exists()
    # unusable output paths and oversized systems fail before any elaboration
    (tmp_path / "afile").write_text("")
    for bad, message in ((["-o", str(tmp_path)], "is a folder, expected a file path"),
                         (["-o", ""], "-o '': expected a file path"),
                         (["-o", str(tmp_path / "afile" / "x.v")], "afile is a file"),
                         (["--top", "dimm", "--dimms", "1000", "--ranks", "1000", "-o", str(out)],
                          "= 1000000 ranks: expected at most 256"),
                         (["--name", "", "-o", str(out)], "name='': expected a Verilog identifier")):
        assert main(["verilog", "--lanes", "1", "--depth", "8", *bad]) == 2, bad
        assert message in capsys.readouterr().err, bad
    assert not out.exists()


def test_clock_gating_cli(tmp_path):
    """``--clock-gating`` adds one falling-edge gate flip-flop and one gated clock per lane
    register group (:data:`GATED_DOMAINS`); off, the design has the one clock; asked for
    without operand isolation (whose registers load every cycle) it is refused."""
    import re

    from coda.cli import main
    from coda.hw.nme.lane import GATED_DOMAINS
    assert main(["verilog", "--lanes", "2", "--clock-gating", "on", "--operand-isolation",
                 "off", "-o", str(tmp_path / "bad.v")]) == 2
    for flag, isolation, gated in (("on", "on", True), ("off", "on", False),
                                   ("off", "off", False)):
        out = tmp_path / f"nme_{flag}_{isolation}.v"
        assert main(["verilog", "--lanes", "2", "--depth", "8", "--clock-gating", flag,
                     "--operand-isolation", isolation, "-o", str(out)]) == 0
        text = out.read_text()
        clocks = set(re.findall(r"always @\((?:pos|neg)edge (\w+)\)", text))
        assert clocks == ({"clk"} | {f"{d}_clk" for d in GATED_DOMAINS} if gated else {"clk"})
        assert ("always @(negedge clk)" in text) == gated


def test_main_starts_from_its_config(tmp_path, capsys):
    """``coda verilog``'s main takes its config (``CONFIG``, the NME's units inherited from
    NMEUnitsConfig), built here directly as a library caller does; the refusals of the
    command line come when the config is made, with the same messages."""
    import dataclasses

    from coda.hw import verilog

    assert verilog.CONFIG is verilog.VerilogConfig
    assert issubclass(verilog.VerilogConfig, verilog.NMEUnitsConfig)
    out = tmp_path / "nme.v"
    cfg = verilog.VerilogConfig(lanes=2, depth=8, preset="combinational", output=str(out))
    assert verilog.main(cfg) == 0
    assert out.read_text() == nme_verilog(NMEConfig(lanes=2, depth=8, mul_latency=0,
                                                    add_latency=0, operand_latency=0))
    assert "combinational" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--dimms given with --top nme"):
        verilog.VerilogConfig(dimms=2, output=str(out))
    with pytest.raises(ValueError, match="--clock-gating on needs --operand-isolation on"):
        dataclasses.replace(cfg, clock_gating="on", operand_isolation="off")
    with pytest.raises(ValueError, match=r"--mul-latency \d+ with --preset combinational"):
        dataclasses.replace(cfg, mul_latency=MAX_MUL_LATENCY)
