"""Named NME configurations (``--preset``): one table (coda.hw.nme.isa.NME_PRESETS) taken by
every command that builds an NME, stated at the top of its output; one default (the
timing-closed preset, NMEConfig's units); latency flags that clash with a preset are refused
before any work."""

from __future__ import annotations

import re

import numpy as np
import pytest

from coda.cli import COMMANDS, _build_parser, _find_subparser, main
from coda.hw.verilog import DEFAULT_PRESET, NME_PRESETS

#: the commands that build an NME
NME_COMMANDS = [("verilog",), ("synth",), ("nme", "run"), ("run",), ("profile",), ("eval",)]
#: the preset that is not the default (the combinational one): taken by name
OTHER = next(p for p in NME_PRESETS.values()
                 if p.units() != NME_PRESETS[DEFAULT_PRESET].units())


def test_the_one_default_nme_is_the_timing_closed_preset():
    """The default NME is the timing-closed preset everywhere: the table's default, the
    units of NMEConfig (so of every NME built without latencies), the CLI's default, and
    the verilog module re-exports the one table; the combinational preset stays by name."""
    import argparse

    import coda.hw.nme.isa as isa
    import coda.hw.verilog as verilog
    from coda.hw.nme.isa import NMEConfig

    assert DEFAULT_PRESET == "timing-closed" and isa.DEFAULT_PRESET is verilog.DEFAULT_PRESET
    assert isa.NME_PRESETS is verilog.NME_PRESETS
    default = NME_PRESETS[DEFAULT_PRESET]
    assert (default.mul_latency, default.add_latency, default.operand_latency) == (5, 7, 1)
    assert {k: getattr(NMEConfig(), k) for k in default.units()} == default.units()
    args = argparse.Namespace(preset=None, mul_latency=None, add_latency=None,
                              operand_latency=None)
    assert verilog.resolve_preset(args) is default
    # the options are read, not changed: a frozen config serves as well as a namespace
    assert (args.mul_latency, args.add_latency, args.operand_latency) == (None, None, None)
    comb = verilog.resolve_preset(argparse.Namespace(preset="combinational"))
    assert comb.units() == {"mul_latency": 0, "add_latency": 0, "operand_latency": 0}
    assert OTHER is comb


def _flags(preset):
    return ["--mul-latency", str(preset.mul_latency), "--add-latency", str(preset.add_latency),
            "--operand-latency", str(preset.operand_latency)]


@pytest.mark.parametrize("words", NME_COMMANDS, ids=" ".join)
def test_every_nme_command_takes_the_one_preset_table(words):
    import importlib
    parser = _build_parser()
    sub = _find_subparser(parser, words)
    module = importlib.import_module(next(m for w, m, _ in COMMANDS if w == words))
    module.configure(sub)
    action = next(a for a in sub._actions if "--preset" in a.option_strings)
    assert sorted(action.choices) == sorted(NME_PRESETS) and action.default is None


@pytest.mark.parametrize("words, extra", [
    (("verilog",), ["-o", "v.v"]), (("synth",), ["--out", "s"]),
    (("nme", "run"), ["--op", "add", "--make-example", "e.npz"]),
    (("run",), ["--out", "r", "--backend", "torch"]), (("profile",), ["--out", "p"]),
    (("eval",), ["--out", "e"])], ids=lambda v: " ".join(v) if
    isinstance(v, tuple) else "")
def test_a_latency_flag_that_clashes_with_the_preset_is_refused(words, extra, tmp_path,
                                                                 capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flag = "--add-latency"
    clash = str(OTHER.add_latency + 1)
    code = main([*words, "--preset", OTHER.name, flag, clash, *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("coda: error: ") and err.count("\n") == 1, err
    assert f"{flag} {clash} with --preset {OTHER.name} (mul {OTHER.mul_latency} / " \
           f"add {OTHER.add_latency} / operand {OTHER.operand_latency})" in err
    assert list(tmp_path.iterdir()) == []


def test_nme_run_states_its_nme_and_the_preset_equals_its_flags(tmp_path, capsys):
    inp = tmp_path / "in.npz"
    assert main(["nme", "run", "--op", "gated_residual", "--make-example", str(inp)]) == 0
    capsys.readouterr()
    lines, ys = {}, {}
    for name, argv in [("default", []), ("preset", ["--preset", OTHER.name]),
                       ("flags", _flags(OTHER)),
                       ("both", ["--preset", OTHER.name, *_flags(OTHER)])]:
        out = tmp_path / f"{name}.npz"
        assert main(["nme", "run", "--op", "gated_residual", "--inputs", str(inp),
                     "--out", str(out), *argv]) == 0
        lines[name] = capsys.readouterr().out.splitlines()
        with np.load(out) as f:
            ys[name] = f["y"]
    assert lines["default"][0] == NME_PRESETS[DEFAULT_PRESET].describe()
    for name in ("preset", "flags", "both"):
        assert lines[name][0] == OTHER.describe()
        assert np.array_equal(ys[name], ys["default"])
    cycles = {n: int(re.search(r"nme_cycles=(\d+)", ls[-1]).group(1)) for n, ls in lines.items()}
    assert cycles["preset"] == cycles["flags"] == cycles["both"] != cycles["default"]
    # each register stage adds cycles to every pass: the NME with fewer stages is faster
    fewer = sum(OTHER.units().values()) < sum(NME_PRESETS[DEFAULT_PRESET].units().values())
    assert (cycles["preset"] < cycles["default"]) is fewer


def test_verilog_of_the_preset_is_that_of_its_flags(tmp_path, capsys):
    texts = {}
    for name, argv in [("preset", ["--preset", OTHER.name]), ("flags", _flags(OTHER))]:
        out = tmp_path / f"{name}.v"
        assert main(["verilog", "--lanes", "1", "--depth", "4", *argv, "-o", str(out)]) == 0
        assert capsys.readouterr().err.splitlines()[0] == OTHER.describe()
        texts[name] = out.read_text()
    assert texts["preset"] == texts["flags"]


def test_synth_builds_the_preset_at_its_seed_and_says_so(tmp_path, capsys, monkeypatch):
    from coda.synth import flow
    seen = {}

    def fake_synthesize(cfg, target, out, **kw):
        seen.update(cfg=cfg, **kw)
        return {}

    monkeypatch.setattr(flow, "synthesize", fake_synthesize)
    monkeypatch.setattr(flow, "print_report", lambda report: None)
    for argv, seed in [([], OTHER.seed), (["--seed", "7"], 7)]:
        assert main(["synth", "--target", "ecp5", "--preset", OTHER.name, "--out",
                     str(tmp_path / "s"), *argv]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith(OTHER.describe()) and f"placer seed {seed}" in first
        assert {k: getattr(seen["cfg"], k) for k in OTHER.units()} == OTHER.units()
        assert seen["seed"] == seed
