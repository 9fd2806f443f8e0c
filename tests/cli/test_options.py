"""coda/options.py: one config dataclass per command is the one source of its options'
defaults; the command line built from it gives back exactly the dataclass's defaults."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coda.options import add_options, defaults, from_args, option
from coda.options import given as option_given

#: command -> (module, its config class, the required options with a value)
COMMANDS = {
    "run": ("coda.experiments.run", "RunConfig", []),
    "eval": ("coda.experiments.evaluate", "EvalConfig", ["--out", "o"]),
    "profile": ("coda.experiments.profile", "ProfileConfig", ["--out", "o"]),
    "schedule search": ("coda.experiments.search", "SearchConfig",
                        ["--profile", "p.npz", "--skip", "0.5", "--out", "s.json"]),
    "bench": ("coda.experiments.bench", "BenchConfig", []),
    "sim": ("coda.host.system.sim", "SimConfig", []),
    "serve": ("coda.host.system.serving", "ServeConfig", []),
    "validate": ("coda.host.system.validate", "ValidateConfig", []),
    "verilog": ("coda.hw.verilog", "VerilogConfig", ["-o", "nme.v"]),
    "nme run": ("coda.experiments.nme_run", "NMERunConfig", ["--op", "add"]),
    "pass-efficiency": ("coda.host.nme.pass_efficiency", "PassEfficiencyConfig", []),
    "dram replay": ("coda.cosim.dram.replay", "DRAMReplayConfig", ["--trace", "t.txt"]),
    "dram check": ("coda.cosim.dram.check", "DRAMCheckConfig",
                   ["--standard", "DDR4-3200", "a.csv", "b.csv"]),
    "synth": ("coda.synth.flow", "SynthConfig", ["--out", "o"]),
    "synth-sweep": ("coda.experiments.area_sweep", "AreaSweepConfig", []),
    "netlist check": ("coda.verify.netlist_sim", "NetlistCheckConfig", []),
    "energy": ("coda.synth.energy", "EnergyConfig", []),
    "mutation": ("coda.verify.mutation", "MutationConfig", []),
    "train": ("coda.host.model.train", "TrainConfig", []),
    "model eval": ("coda.host.model.evaluate", "ModelEvalConfig", []),
    "sweep": ("coda.cli.sweep", "SweepConfig", ["sim"]),
}
#: the commands that build an NME: each takes the NME's units (coda.hw.verilog.NMEUnitsConfig)
NME_COMMANDS = ("run", "eval", "profile", "verilog", "nme run", "synth")


@dataclass(frozen=True)
class _Example:
    out: str = option(None, "output folder", type=str, required=True)
    steps: int = option(50, "DDIM steps", unit="steps", source="the model's scheduler")
    mhz: float = option(None, "NME clock", type=float, unit="MHz", default_text="the DRAM clock")
    fmt: str = option("bf16", "format", choices=("bf16", "fp16"))
    quiet: bool = option(False, "no progress", group="output")


def _parser(cls) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    add_options(parser, cls)
    return parser


def test_every_command_starts_from_its_config():
    """coda.cli hands each command's main its CONFIG, parsed: every command has one, the
    class its options are built from."""
    from coda.cli import COMMANDS as CLI

    for _, module, _ in CLI:
        config = importlib.import_module(module).CONFIG
        assert dataclasses.is_dataclass(config) and defaults(config), module
    for command, (module, cls, _) in COMMANDS.items():
        mod = importlib.import_module(module)
        assert mod.CONFIG is getattr(mod, cls), command


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_commands_parser_gives_its_config_defaults(command):
    module, cls_name, required = COMMANDS[command]
    cls = getattr(importlib.import_module(module), cls_name)
    from coda.cli import _build_parser, _find_subparser  # the real `coda` parser
    parser = _build_parser()
    words = tuple(command.split())
    sub = _find_subparser(parser, words)
    importlib.import_module(module).configure(sub)
    args = parser.parse_args([*words, *required])
    got = from_args(cls, args)
    # the required options given, and the positional arguments (their values are in required)
    given_values = {a.dest: getattr(args, a.dest) for a in sub._actions
                    if (a.option_strings[0] in required if a.option_strings
                        else a.dest in defaults(cls))}
    given_values = {k: tuple(v) if isinstance(v, list) else v for k, v in given_values.items()}
    assert got == cls(**{**defaults(cls), **given_values})
    # every option of the config is on the command line, once
    dests = [a.dest for a in sub._actions]
    assert all(dests.count(name) == 1 for name in defaults(cls))


@pytest.mark.parametrize("command", NME_COMMANDS)
def test_each_nme_command_takes_the_nme_units(command):
    from coda.cli import _build_parser, _find_subparser
    from coda.hw.verilog import NMEUnitsConfig
    module, _, required = COMMANDS[command]
    parser = _build_parser()
    words = tuple(command.split())
    importlib.import_module(module).configure(_find_subparser(parser, words))
    args = parser.parse_args([*words, *required])
    assert from_args(NMEUnitsConfig, args) == NMEUnitsConfig()


def test_help_names_default_unit_and_source():
    text = _parser(_Example).format_help()
    assert "DDIM steps (default 50, in steps; the model's scheduler)" in " ".join(text.split())
    assert "NME clock (default the DRAM clock)" in " ".join(text.split())
    assert "output folder (required)" in text
    assert "output:" in text and "no progress (default off)" in " ".join(text.split())


def test_required_option_is_required(capsys):
    with pytest.raises(SystemExit):
        _parser(_Example).parse_args([])
    assert "the following arguments are required: --out" in capsys.readouterr().err


def test_bool_option_is_a_flag_and_choices_are_checked():
    args = _parser(_Example).parse_args(["--out", "x", "--quiet"])
    assert from_args(_Example, args) == _Example(out="x", quiet=True)
    with pytest.raises(argparse.ArgumentError, match="fp8"):
        _parser(_Example).parse_args(["--out", "x", "--fmt", "fp8"])


def test_the_config_remembers_which_options_the_command_line_gave():
    """A command's main starts from its config: given() answers for the config as for the
    namespace (an option typed at its default is given; one left out is not)."""
    args = _parser(_Example).parse_args(["--out", "x", "--steps", "50"])
    cfg = from_args(_Example, args)
    for name in ("out", "steps", "mhz", "fmt", "quiet"):
        assert option_given(cfg, name) == option_given(args, name) == (name in ("out", "steps"))
    # a config built otherwise: given means set to something else than the default
    assert option_given(_Example(out="y", steps=7), "steps", 50)
    assert not option_given(_Example(out="y"), "steps", 50)


@given(steps=st.integers(-10**6, 10**6), mhz=st.floats(allow_nan=False, allow_infinity=False))
def test_from_args_round_trips_parsed_values(steps, mhz):
    args = _parser(_Example).parse_args(["--out", "o", f"--steps={steps}", f"--mhz={mhz!r}"])
    cfg = from_args(_Example, args)
    assert (cfg.steps, cfg.mhz, cfg.out) == (steps, mhz, "o")
    assert from_args(_Example, args, steps=1).steps == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"default": None}, "None default"),
    ({"default": (), "action": "append"}, "empty tuple"),
    ({"default": [1, 2], "nargs": "+"}, "mutable"),
    ({"default": "a,b", "nargs": "+"}, "must be a tuple"),
    ({"default": 1, "action": "count"}, "expected None or 'append'"),
    ({"default": None, "type": str, "positional": True, "flag": "-x"}, "positional"),
    ({"default": [1, 2]}, "mutable"),
    ({"default": 3, "required": True}, "required option has no default"),
])
def test_bad_declarations_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        option(help="x", **kwargs)


def test_a_path_default_parses_to_a_path():
    @dataclass(frozen=True)
    class C:
        out: Path = option(Path("build/x.json"), "where")
    assert from_args(C, _parser(C).parse_args(["--out", "y.json"])).out == Path("y.json")
    assert dataclasses.fields(C)[0].default == Path("build/x.json")


@dataclass(frozen=True)
class _Lists:
    files: tuple = option(None, "input files", type=str, nargs="+", positional=True,
                          required=True)
    lanes: tuple = option((1, 2, 4), "lanes", nargs="+")
    param: tuple = option((), "NAME=V", type=str, action="append")
    output: str = option(None, "where", type=str, required=True, flag=("-o", "--output"))
    trace: str = option(None, "a trace", type=str, exclusive="source", required=True)
    reads: int = option(None, "random reads", type=int, exclusive="source", required=True,
                        unit="reads")


def test_positional_nargs_append_flags_and_exclusive_sets(capsys):
    parser = _parser(_Lists)
    args = parser.parse_args(["a", "b", "-o", "x", "--reads", "3"])
    assert args.lanes == [1, 2, 4] and args.param == []   # argparse's own list types
    assert from_args(_Lists, args) == _Lists(files=("a", "b"), output="x", reads=3)
    args = parser.parse_args(["a", "--output", "y", "--lanes", "8", "--param", "p=1",
                              "--param", "q=2", "--trace", "t"])
    assert from_args(_Lists, args) == _Lists(files=("a",), lanes=(8,), param=("p=1", "q=2"),
                                             output="y", trace="t")
    assert parser.parse_args(["a", "-o", "x", "--trace", "t"]).param == []   # not shared
    text = " ".join(parser.format_help().split())
    assert "lanes (default 1 2 4)" in text and "NAME=V (default none)" in text
    assert "a trace (required: one of --trace, --reads)" in text
    assert "random reads (required: one of --trace, --reads; in reads)" in text
    assert "input files" in text and "-o OUTPUT, --output OUTPUT" in text
    for argv, message in ((["-o", "x", "--trace", "t"], "required: files"),
                          (["a", "-o", "x"], "one of the arguments --trace --reads is required"),
                          (["a", "-o", "x", "--trace", "t", "--reads", "1"], "not allowed")):
        with pytest.raises((SystemExit, argparse.ArgumentError)) as caught:
            parser.parse_args(argv)
        assert message in (str(caught.value) + capsys.readouterr().err)
