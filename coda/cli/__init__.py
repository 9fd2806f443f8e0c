"""The ``coda`` console command.

Each sub-command lives in the module that owns it; that module provides
``configure(parser: argparse.ArgumentParser) -> None``, ``CONFIG`` (the config dataclass its
options are built from) and ``main(cfg: CONFIG) -> int``: the command line parsed into
``CONFIG`` (:func:`coda.options.from_args`) is what ``main`` starts from.
Modules are imported only when their command runs, so ``coda --help`` stays fast.

Exit status: 0 done; 2 bad input or an unusable path (one line ``coda: error: ...``); 1 a
tool the command runs failed (Verilator, a simulator: one line plus the end of its output);
130 interrupted (Ctrl-C: one line ``coda: interrupted``, no traceback; what a command had
finished writing stays, e.g. ``coda sweep``'s finished points).
Anything else is a bug of ours and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

# (command words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    # the main job and the cache schedule
    (("run",), "coda.experiments.run", "the main job: cached CFG denoising of the shipped video DiT"),
    (("profile",), "coda.experiments.profile", "profile how much each DiT operator changes between steps (L1 on the NME)"),
    (("schedule", "search"), "coda.experiments.search", "search a static cache schedule: whole steps judged by rollouts"),
    (("schedule", "forecast"), "coda.experiments.forecast_calibration", "calibrate the forecast mode's alphas for a schedule on the profile's videos (its \"forecast\" block)"),
    (("schedule", "dra"), "coda.experiments.dra_calibration", "choose step DRA's probe and thresholds for a schedule on the profile's videos (its \"dra\" block)"),
    (("eval",), "coda.experiments.evaluate", "compare cache policies: skipped operators vs quality (Pareto)"),
    # the shipped model
    (("train",), "coda.host.model.train", "train the shipped video DiT on moving digits (two stages)"),
    (("model", "eval"), "coda.host.model.evaluate", "label accuracy, identity and motion of the shipped video DiT's generations"),
    # the system model
    (("sim",), "coda.host.system.sim", "latency and energy of systems a..f (GPU, PCIe, DIMM-NMP) for a video DiT"),
    (("serve",), "coda.host.system.serving", "latency percentiles and throughput of a Poisson stream of generation requests on a GPU cluster, against arrival rate (SimPy)"),
    (("calibrate",), "coda.host.system.calibrate", "time a video DiT's operators, cache operators and host copies on a device (CUDA events) for coda sim --gpu-table"),
    (("validate",), "coda.host.system.validate", "check the system model against published latencies (and the DIMM-NMP cosimulation), time it"),
    # the hardware: RTL, cosimulation, DRAM
    (("verilog",), "coda.hw.verilog", "write synthesizable Verilog of the NME / DIMM-NMP"),
    (("nme", "run"), "coda.experiments.nme_run", "run tensors through one cache operator on a backend"),
    (("pass-efficiency",), "coda.host.nme.pass_efficiency", "NME cycles of a cache operator on a long stream against one word per pass per cycle"),
    (("dram", "replay"), "coda.cosim.dram.replay", "replay a memory trace on the DRAM timing model"),
    (("dram", "check"), "coda.cosim.dram.check", "check a DRAM command trace against the JEDEC timing rules (exit 1 on violations)"),
    (("bench",), "coda.experiments.bench", "DIMM-NMP design-space sweep, DRAM controller replays and cosimulation speed (build/bench/)"),
    # synthesis and verification of the NME
    (("synth",), "coda.synth.flow", "synthesise the NME with yosys / nextpnr and report area, Fmax"),
    (("synth-sweep",), "coda.experiments.area_sweep", "area / Fmax of the NME over lanes and formats, bandwidth bound and plot (build/synth/)"),
    (("netlist", "check"), "coda.verify.netlist_sim", "simulate the synthesised NME netlist against the RTL and torch (exit 1 on a mismatch)"),
    (("energy",), "coda.synth.energy", "estimate the energy per element of each cache operator on the NME (toggles on the RTL)"),
    (("mutation",), "coda.verify.mutation", "mutation testing of the NME RTL against the cocotb regression (long; resumable)"),
    # any of the above as a grid
    (("sweep",), "coda.cli.sweep", "run a sweep (bench, schedule, sim, serve): every point a Ray task"),
]


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error form: one line ``coda: error: ...`` and exit 2 (a
    bad option value, a missing or unknown option), pointing at the command's ``--help``."""

    def error(self, message: str):
        self.exit(2, f"coda: error: {message} (see '{self.prog} --help')\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="coda", description="CODA: near-memory cache offload for video diffusion transformers")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module, help_ in COMMANDS:
        holder = subs
        if len(words) == 2:
            if words[0] not in groups:
                grp = subs.add_parser(words[0], help=f"{words[0]} commands")
                groups[words[0]] = grp.add_subparsers(dest="subcommand", metavar="SUBCOMMAND",
                                                      required=True)
            holder = groups[words[0]]
        holder.add_parser(words[-1], help=help_, description=help_)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _build_parser()
    # The command words pick the module; the module then adds its own options.
    words = _command_words(argv)
    if words is None:
        parser.parse_args(argv)  # no complete command: argparse prints usage/help and exits
    module_name = next(mod for w, mod, _ in COMMANDS if w == words)
    module = importlib.import_module(module_name)
    parser = _build_parser()
    sub = _find_subparser(parser, words)
    module.configure(sub)
    args = parser.parse_args(argv)
    try:
        from coda.options import from_args
        # the command's main starts from its config object
        return int(module.main(from_args(module.CONFIG, args)) or 0)
    except (ValueError, KeyError, OSError, EOFError) as exc:
        # bad input or an unusable path (missing, a directory, read-only, empty file)
        print(f"coda: error: {_describe(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("coda: interrupted", file=sys.stderr)
        return 130
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        if not _is_tool_failure(exc):
            raise                    # a bug: keep the traceback
        print(f"coda: error: {_describe_tool_failure(exc)}", file=sys.stderr)
        return 1


def _describe(exc: BaseException) -> str:
    """One line for a user: ``PATH: reason`` for a file error, the message otherwise."""
    if isinstance(exc, FileExistsError) and os.path.isfile(exc.filename or ""):
        return f"{exc.filename}: is a file, expected a folder"   # a mkdir met a file on the path
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        return exc.args[0]      # str(KeyError) would quote the message
    return str(exc) or type(exc).__name__


def _is_tool_failure(exc: BaseException) -> bool:
    """A tool this command runs failed (Verilator, a simulator binary): a CalledProcessError
    or one of coda.cosim's errors (CosimBuildError, CosimRunError), not a bug of ours."""
    return (isinstance(exc, subprocess.CalledProcessError)
            or type(exc).__module__.startswith("coda.cosim"))


def _describe_tool_failure(exc: BaseException) -> str:
    """The failed tool and the end of its output (coda.cosim's errors carry their log tail)."""
    if not isinstance(exc, subprocess.CalledProcessError):
        return str(exc)
    tool = exc.cmd[0] if isinstance(exc.cmd, (list, tuple)) else str(exc.cmd).split()[0]
    tail = exc.stderr or exc.stdout or ""
    tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
    return (f"{Path(str(tool)).name} exited with status {exc.returncode}"
            + (f"; the end of its output:\n{tail.strip()[-2000:]}" if tail.strip() else ""))


def _command_words(argv: list[str]) -> tuple[str, ...] | None:
    """The command words at the start of ``argv`` (e.g. ("nme", "run")), or None."""
    for words, _, _ in COMMANDS:
        if tuple(argv[:len(words)]) == words:
            return words
    return None


def _find_subparser(parser: argparse.ArgumentParser, words: tuple[str, ...]):
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


if __name__ == "__main__":
    sys.exit(main())
