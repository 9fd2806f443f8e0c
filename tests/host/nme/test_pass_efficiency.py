"""The pass-efficiency table of the cycle model (coda.host.nme.pass_efficiency)."""

import json
from dataclasses import replace

import pytest

from coda.cli import main as coda_main
from coda.hw.nme.isa import MAX_MUL_LATENCY, NMEConfig
from coda.host.nme.pass_efficiency import efficiency


def run(argv):
    """``coda pass-efficiency ARGV``, as a user runs it."""
    return coda_main(["pass-efficiency", *argv])


def test_efficiency_is_ideal_over_cycles_and_grows_with_depth():
    """ideal = micro-ops x words; cycles never below it; a deeper buffer (fewer pass
    hand-overs per word) and combinational units (a shorter drain) never lose."""
    rows = {}
    for units in ((0, 0, 0), (3, 5, 1)):
        for depth in (4, 16, 64, 256):
            cfg = NMEConfig(depth=depth, mul_latency=units[0], add_latency=units[1],
                            operand_latency=units[2])
            r = efficiency("gated_residual", 2048, 64, cfg)
            assert r["ideal"] == r["passes"] * r["words"] == 4 * (2048 * 64 // 8)
            assert r["cycles"] > r["ideal"] and r["ratio"] == round(r["ideal"] / r["cycles"], 4)
            rows[units, depth] = r["cycles"]
    for units in ((0, 0, 0), (3, 5, 1)):
        cycles = [rows[units, d] for d in (4, 16, 64, 256)]
        assert cycles == sorted(cycles, reverse=True)
    assert all(rows[(0, 0, 0), d] <= rows[(3, 5, 1), d] for d in (4, 16, 64, 256))


def test_cli_table_json_and_bad_options(tmp_path, capsys):
    out = tmp_path / "eff.json"
    assert run(["--tokens", "256", "--depths", "16,64", "--units", "0,0,0", "--json",
                str(out)]) == 0
    assert "words/pass/cycle" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["units"], r["trail"], r["depth"]) for r in rows] == [
        ("0,0,0", "off", 16), ("0,0,0", "off", 64), ("0,0,0", "on", 16), ("0,0,0", "on", 64)]
    assert run(["--tokens", "256", "--depths", "16", "--trail-stores", "on", "--json",
                str(out)]) == 0
    assert {r["trail"] for r in json.loads(out.read_text())["rows"]} == {"on"}
    assert run(["--op", "add", "--tokens", "64", "--depths", "16", "--units", "0,0,0"]) == 0
    assert "add [64, 64]" in capsys.readouterr().out
    assert run(["--units", "9,0,0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error: --units '9,0,0': expected M,A,O") and err.count("\n") == 1
    assert f"mul_latency=9: expected an int 0..{MAX_MUL_LATENCY}" in err
    assert run(["--units", "a,b"]) == 2
    assert "--units 'a,b': expected M,A,O: three comma-separated ints" in capsys.readouterr().err
    assert run(["--channels", "12"]) == 2
    assert "CHAN needs C % lanes == 0" in capsys.readouterr().err


def test_main_starts_from_its_config(tmp_path, capsys):
    """``main`` takes the command's config, built here directly as a library caller does;
    a bad value is refused when the config is made, with the CLI's message."""
    from coda.host.nme import pass_efficiency as pe

    assert pe.CONFIG is pe.PassEfficiencyConfig
    out = tmp_path / "eff.json"
    cfg = pe.PassEfficiencyConfig(tokens=256, depths="16", units=("0,0,0",), trail_stores="on",
                                  json=out)
    assert pe.main(cfg) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["units"], r["trail"], r["depth"]) for r in rows] == [("0,0,0", "on", 16)]
    assert rows[0]["cycles"] == efficiency("gated_residual", 256, 64, NMEConfig(
        depth=16, mul_latency=0, add_latency=0, operand_latency=0, trail_stores=True))["cycles"]
    with pytest.raises(ValueError, match=r"--depths '16,x': expected comma-separated ints"):
        pe.PassEfficiencyConfig(depths="16,x")
    with pytest.raises(ValueError, match=r"--units 'a,b': expected M,A,O"):
        pe.PassEfficiencyConfig(units=("a,b",))


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match=r"op='fma': expected one of \['add', 'gated_residual'\]"):
        efficiency("fma", 8, 8, NMEConfig())


@pytest.mark.parametrize("op", ["gated_residual", "add"])
@pytest.mark.parametrize("units", [(0, 0, 0), (3, 5, 1), (4, 5, 1)])
def test_long_streams_take_one_word_per_pass_per_cycle(op, units):
    """Once passes hand over (blocks longer than the pipeline to the result stage) and the
    stores trail the next block's reads (``trail_stores``), a longer stream costs exactly one
    cycle per word per pass more: doubling the tokens adds ``ideal`` cycles and nothing else,
    at every depth from 16 (1-cycle memory) and from 64 with a 20-cycle memory. Without
    trailing stores every block costs more (the store pass drains)."""
    for depth, latency in ((16, 1), (64, 1), (256, 1), (64, 20), (256, 20)):
        cfg = NMEConfig(depth=depth, mul_latency=units[0], add_latency=units[1],
                        operand_latency=units[2], trail_stores=True)
        short = efficiency(op, 1024, 64, cfg, latency)
        long = efficiency(op, 2048, 64, cfg, latency)
        assert long["cycles"] - short["cycles"] == long["ideal"] - short["ideal"], (depth,
                                                                                    latency)
        held = replace(cfg, trail_stores=False)
        assert (efficiency(op, 2048, 64, held, latency)["cycles"]
                - efficiency(op, 1024, 64, held, latency)["cycles"]
                > long["ideal"] - short["ideal"]), (depth, latency)
