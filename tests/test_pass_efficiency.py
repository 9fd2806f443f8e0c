"""The pass-efficiency table of the cycle model (coda.host.pass_efficiency)."""

import json

import pytest

from coda.hw.isa import MAX_MUL_LATENCY, NMEConfig
from coda.host.pass_efficiency import efficiency, main


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
    assert main(["--tokens", "256", "--depths", "16,64", "--units", "0,0,0", "--json",
                 str(out)]) == 0
    assert "words/pass/cycle" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["units"], r["depth"]) for r in rows] == [("0,0,0", 16), ("0,0,0", 64)]
    assert main(["--units", "9,0,0"]) == 2
    err = capsys.readouterr().err
    assert "--units '9,0,0': expected M,A,O" in err
    assert f"mul_latency=9: expected an int 0..{MAX_MUL_LATENCY}" in err
    assert main(["--units", "a,b"]) == 2
    assert "--units 'a,b': expected M,A,O: three comma-separated ints" in capsys.readouterr().err
    assert main(["--channels", "12"]) == 2
    assert "CHAN needs C % lanes == 0" in capsys.readouterr().err


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match=r"op='fma': expected one of \['add', 'gated_residual'\]"):
        efficiency("fma", 8, 8, NMEConfig())
