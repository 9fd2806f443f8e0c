"""The measured DRAM utilisation of segment programs and of the residual add / 4-stream
segment as data files (``host/system/segment_util.json``, ``nmp_efficiency.json``, issue 64
item 2): written by the command that measures them (``coda validate --measure-nmp``) with
their provenance and NME, read into the system model's tables."""

from __future__ import annotations

import json

import pytest

from coda.host.system import platforms, validate


def _entry(table="long", form="sum", dram="DDR5-4800", depth=256, util=None, date="d"):
    return {"table": table, "segment_output": form, "dram": dram, "lanes": 8, "depth": depth,
            "tokens": 256, "channels": 512, "ranks": 1, "words_per_stream": 16384,
            "nme": {"preset": "timing-closed", "mul_latency": 5, "add_latency": 7,
                    "operand_latency": 1},
            "utilisation": util or {"1": 0.5, "8": 0.75},
            "provenance": {"command": "c", "date": date, "machine": "m"}}


def test_the_tables_are_the_data_file_each_entry_with_its_provenance():
    entries = platforms.load_segment_util()
    assert entries and platforms.SEGMENT_UTIL_FILE.name == "segment_util.json"
    long_n = tile_n = 0
    for e in entries:
        key = (e["dram"], e["lanes"], e["depth"])
        util = {int(k): v for k, v in e["utilisation"].items()}
        if e["table"] == "long":
            long_n += 1
            assert platforms.SEGMENT_UTIL[e["segment_output"]][key] == util
        else:
            tile_n += 1
            assert platforms.SEGMENT_UTIL_TILE[e["segment_output"]][key] == \
                (e["words_per_stream"], util)
        assert set(e["provenance"]) == {"command", "date", "machine"}
        assert e["provenance"]["command"].startswith("coda validate --measure-nmp")
        assert set(e["nme"]) == {"preset", "mul_latency", "add_latency", "operand_latency"}
    assert long_n == sum(map(len, platforms.SEGMENT_UTIL.values()))
    assert tile_n == sum(map(len, platforms.SEGMENT_UTIL_TILE.values()))


def test_the_default_platforms_tables_were_measured_on_the_default_nme():
    """What coda sim and coda run model by default (DDR5-4800, 8 lanes, depths 64 and 256,
    both forms, both tables) was measured on the default NME, the timing-closed preset."""
    from coda.hw.dram.standards import DEFAULT_STANDARD
    from coda.hw.nme.isa import DEFAULT_PRESET, NME_PRESETS

    default = {"preset": DEFAULT_PRESET, **NME_PRESETS[DEFAULT_PRESET].units()}
    mine = [e for e in platforms.load_segment_util() if e["dram"] == DEFAULT_STANDARD]
    assert {(e["table"], e["segment_output"], e["depth"]) for e in mine} == {
        (t, f, d) for t in ("long", "tile") for f in ("sum", "residual") for d in (64, 256)}
    assert all(e["nme"] == default for e in mine)
    srcs = platforms.segment_util_sources(DEFAULT_STANDARD, 8, 64)
    assert len(srcs) == 4 and all(s["nme"] == default for s in srcs)


def test_save_merges_by_table_form_standard_lanes_and_depth(tmp_path):
    path = tmp_path / "u.json"
    platforms.save_segment_util([_entry(), _entry(form="residual")], path)
    platforms.save_segment_util([_entry(util={"1": 0.25}, date="new"),
                                 _entry(table="tile", depth=64)], path)
    got = platforms.load_segment_util(path)
    assert len(got) == 3
    first = next(e for e in got if (e["table"], e["segment_output"]) == ("long", "sum"))
    assert first["utilisation"] == {"1": 0.25} and first["provenance"]["date"] == "new"
    assert "coda validate --measure-nmp" in json.loads(path.read_text())["about"]
    bad = _entry(util={"1": 1.5})
    path.write_text(json.dumps({"entries": [bad]}))
    with pytest.raises(ValueError, match="utilisations in"):
        platforms.load_segment_util(path)


def test_measure_nmp_writes_what_it_measured_with_command_date_machine(tmp_path, monkeypatch):
    """coda validate --measure-nmp merges each measurement into the data file: the
    measurement's figures, the default NME, the command with its options, today's UTC date
    and the CPU."""
    import datetime

    seen = []

    def long(std, depth, segment_output):
        seen.append(("long", std, depth, segment_output))
        return {"dram": std, "lanes": 8, "depth": depth, "tokens": 256, "channels": 512,
                "segment_output": segment_output, "utilisation": {1: 0.5, 2: 0.625}}

    def tile(std, depth, segment_output):
        seen.append(("tile", std, depth, segment_output))
        return {"dram": std, "lanes": 8, "depth": depth, "tokens": 512, "channels": 96,
                "ranks": 2, "words_per_stream": 3072, "segment_output": segment_output,
                "utilisation": {1: 0.75}}

    monkeypatch.setattr(validate, "measure_segment_utilisation", long)
    monkeypatch.setattr(validate, "measure_tile_utilisation", tile)
    path = tmp_path / "u.json"
    validate._measure_nmp(tmp_path / "out", "residual", "long", ("DDR4-3200",), path)
    validate._measure_nmp(tmp_path / "out", "residual", "tile", ("DDR4-3200",), path)
    assert seen == [("long", "DDR4-3200", 256, "residual"), ("long", "DDR4-3200", 64, "residual"),
                    ("tile", "DDR4-3200", 64, "residual"), ("tile", "DDR4-3200", 256, "residual")]
    got = platforms.load_segment_util(path)
    assert [(e["table"], e["depth"]) for e in got] == [("long", 64), ("long", 256),
                                                        ("tile", 64), ("tile", 256)]
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    for e in got:
        assert e["nme"] == {"preset": "timing-closed", "mul_latency": 5, "add_latency": 7,
                            "operand_latency": 1}
        assert e["provenance"]["command"] == (f"coda validate --measure-nmp --measure "
                                              f"{e['table']} --segment-output residual "
                                              "--drams DDR4-3200")
        assert e["provenance"]["date"] <= today and e["provenance"]["machine"]
        assert e["words_per_stream"] == (16384 if e["table"] == "long" else 3072)
    assert got[0]["utilisation"] == {"1": 0.5, "2": 0.625}


def test_validate_refuses_an_unmeasured_dram_by_name():
    with pytest.raises(ValueError, match="--drams 'DDR5-9999'"):
        validate._drams("DDR5-9999")
    assert validate._drams("ddr5_4800,DDR4-3200") == ("DDR5-4800", "DDR4-3200")


def test_validate_main_starts_from_its_config(tmp_path, capsys):
    """``coda validate``'s main takes its ValidateConfig (the command line's, or one built in
    Python); a bad --drams is refused before any work or file, either way; its
    --segment-output choices are the NMP link's segment forms."""
    from coda.cli import main
    from coda.host.nmp.link import SEGMENT_OUTPUTS

    assert validate.CONFIG is validate.ValidateConfig
    assert validate.ValidateConfig().segment_output == "sum"
    assert validate._SEGMENT_OUTPUTS == SEGMENT_OUTPUTS
    out = tmp_path / "v"
    with pytest.raises(ValueError, match="--drams 'DDR5-9999'"):
        validate.main(validate.ValidateConfig(out=out, check_nmp=True, drams="DDR5-9999"))
    assert main(["validate", "--out", str(out), "--check-nmp", "--drams", "DDR5-9999"]) == 2
    assert "--drams 'DDR5-9999'" in capsys.readouterr().err
    assert not out.exists()


def _eff(dram="DDR5-4800", lanes=8, depth=256, add=0.5, seg=0.75, date="d"):
    return {"dram": dram, "lanes": lanes, "depth": depth, "stream_bytes": 262144,
            "nme": {"preset": "timing-closed", "mul_latency": 5, "add_latency": 7,
                    "operand_latency": 1},
            "utilisation": {"residual_add": add, "segment4": seg},
            "provenance": {"command": "c", "date": date, "machine": "m"}}


def test_nmp_efficiency_is_its_data_file_each_entry_with_its_provenance():
    entries = platforms.load_nmp_efficiency()
    assert entries and platforms.NMP_EFFICIENCY_FILE.name == "nmp_efficiency.json"
    for e in entries:
        u = e["utilisation"]
        assert platforms.NMP_EFFICIENCY[e["dram"]].util[(e["lanes"], e["depth"])] == \
            (u["residual_add"], u["segment4"])
        assert platforms.nmp_efficiency(e["dram"], e["lanes"], e["depth"], 4) == u["segment4"]
        assert platforms.nmp_efficiency(e["dram"], e["lanes"], e["depth"], 3) == \
            (u["segment4"] if u["residual_add"] is None else u["residual_add"])
        assert set(e["provenance"]) == {"command", "date", "machine"}
        assert set(e["nme"]) == {"preset", "mul_latency", "add_latency", "operand_latency"}
        assert e["provenance"]["date"] in platforms.NMP_EFFICIENCY[e["dram"]].source
    assert len(entries) == sum(len(v.util) for v in platforms.NMP_EFFICIENCY.values())
    with pytest.raises(ValueError, match="no DIMM-NMP measurement for DDR5-4800 with 3 lanes"):
        platforms.nmp_efficiency("DDR5-4800", 3, 256, 4)


def test_save_nmp_efficiency_merges_by_standard_lanes_and_depth(tmp_path):
    path = tmp_path / "e.json"
    platforms.save_nmp_efficiency([_eff(), _eff(depth=64)], path)
    platforms.save_nmp_efficiency([_eff(add=None, seg=0.25, date="new"), _eff(lanes=4)], path)
    got = platforms.load_nmp_efficiency(path)
    assert [(e["lanes"], e["depth"]) for e in got] == [(4, 256), (8, 64), (8, 256)]
    assert got[2]["utilisation"] == {"residual_add": None, "segment4": 0.25}
    assert got[2]["provenance"]["date"] == "new"
    assert "--measure streams" in json.loads(path.read_text())["about"]
    for bad in (_eff(seg=1.5), _eff(add=0.0), _eff(seg=None)):
        path.write_text(json.dumps({"entries": [bad]}))
        with pytest.raises(ValueError, match="utilisation.segment4 in \\(0, 1\\]"):
            platforms.load_nmp_efficiency(path)


def test_measure_streams_writes_what_it_measured_with_command_date_machine(tmp_path, monkeypatch):
    """--measure streams measures each configuration of MEASURE_STREAMS of the chosen
    presets and merges it into the efficiency file with the default NME and its provenance
    (a command without the segment form, which the streams do not depend on)."""
    seen, real = [], validate.measure_stream_utilisation

    def streams(std, lanes, depth):
        seen.append((std, lanes, depth))
        return {"dram": std, "lanes": lanes, "depth": depth, "stream_bytes": 262144,
                "utilisation": {"residual_add": 0.5, "segment4": 0.625}}

    monkeypatch.setattr(validate, "measure_stream_utilisation", streams)
    path = tmp_path / "e.json"
    validate._measure_nmp(tmp_path / "out", "sum", "streams", ("DDR4-3200",), eff_file=path)
    assert seen == [c for c in validate.MEASURE_STREAMS if c[0] == "DDR4-3200"] and seen
    got = platforms.load_nmp_efficiency(path)
    assert [(e["dram"], e["lanes"], e["depth"]) for e in got] == sorted(seen)
    from coda.hw.nme.isa import DEFAULT_PRESET, NME_PRESETS

    for e in got:
        assert e["nme"] == {"preset": DEFAULT_PRESET, **NME_PRESETS[DEFAULT_PRESET].units()}
        assert e["provenance"]["command"] == ("coda validate --measure-nmp --measure streams "
                                              "--drams DDR4-3200")
        assert e["utilisation"] == {"residual_add": 0.5, "segment4": 0.625}
    assert json.loads((tmp_path / "out" / "stream_util.json").read_text())[0]["lanes"] == 8
    with pytest.raises(ValueError, match="lanes=0"):
        real("DDR5-4800", 0, 256)
