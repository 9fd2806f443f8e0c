"""The DRAM controller alone on standard traces, every command trace checked.

:func:`bench_dram` (``coda bench``, unless ``--skip-dram``): ``coda dram replay`` of
sequential 64 B reads (16 MiB), STREAM-add (2 MiB arrays) and 65,536 random 64 B reads over
1 GiB (seed 0) on DDR4-3200 and DDR5-4800 (DDR5 also with same-bank refresh), every command
trace checked by :mod:`coda.cosim.dram.check`; written to ``build/bench/dram.json``.
"""

from __future__ import annotations

from pathlib import Path

from coda.jsonout import json_text
from coda.paths import write_file

__all__ = ["RANDOM_CONTROLLER", "DRAM_BENCH_STANDARDS", "bench_dram"]

#: controller of the random-read row of :func:`bench_dram`: a 64-entry read queue, FR-FCFS over
#: all of it with up to 16 overtakes of the oldest, closed rows tracked for 16 banks (every
#: access a miss: the next ACT need not wait for a PRE); the smallest of the controllers tried
#: that comes near the ACT bound on both standards (docs/results.md, DRAM controller alone).
RANDOM_CONTROLLER = {"read_queue": 64, "lookahead": 64, "row_policy": "closed", "max_bypass": 16,
                     "policy_banks": 16}
DRAM_BENCH_STANDARDS = ("DDR4-3200", "DDR5-4800")


def bench_dram(standards=DRAM_BENCH_STANDARDS, out: Path | None = None) -> list[dict]:
    """The DRAM rows of ``make bench`` (module docstring): one dict per (standard, trace) with
    the replay's results, ``violations`` (checker), and for the random reads ``act_bound_gbps``
    and ``of_act_bound`` (:attr:`coda.hw.dram.standards.DRAMStandard.act_bound_gbps`).

    Raises AssertionError if a command trace breaks a JEDEC rule."""
    from coda.hw.dram.standards import get_standard

    rows = []
    for name in standards:
        std = get_standard(name)
        for label, reqs, ctrl in _traces(std):
            row, violations = _replay(name, std, label, reqs, ctrl)
            rows.append(row)
            assert not violations, "\n".join(map(str, violations[:20]))
            print(f"{name:10s} {label:28s} {row['gbps']:6.2f} GB/s "
                  f"({100 * row['utilisation']:.1f} %)"
                  + (f", {100 * row['of_act_bound']:.1f} % of the ACT bound "
                     f"{std.act_bound_gbps:.2f} GB/s" if "of_act_bound" in row else "")
                  + f", {len(violations)} violations", flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_file(out, json_text(rows, indent=1) + "\n")
    return rows


def _traces(std) -> list[tuple[str, list, dict | None]]:
    """The (label, requests, controller or None for the default) of :func:`bench_dram` on
    ``std``."""
    from coda.cosim.dram import replay as dram_replay

    traces = [("sequential 16 MiB", [(0, 0, a) for a in range(0, 16 << 20, 64)], None),
              ("STREAM-add 2 MiB", dram_replay.stream_add_trace(std, 2 << 20), None),
              ("random 65536 x 64 B / 1 GiB",
               dram_replay.random_read_trace(std, 65536, 1 << 30, seed=0),
               RANDOM_CONTROLLER)]
    if std.tRFCsb:      # DDR5: the same with same-bank refresh (REFsb)
        traces.append(("random, same-bank refresh", traces[-1][1],
                       {**RANDOM_CONTROLLER, "refresh": "same_bank"}))
    return traces


def _replay(name: str, std, label: str, reqs: list, ctrl: dict | None) -> tuple[dict, list]:
    """Replay ``reqs`` on ``std`` (asked for as ``name``) with controller ``ctrl`` and check
    its command trace: the row of :func:`bench_dram` and the checker's violations."""
    import tempfile

    from coda.cosim.dram import check as dram_check

    from coda.cosim.dram import replay as dram_replay

    with tempfile.TemporaryDirectory() as tmp:
        cmds = Path(tmp) / "cmds.csv"
        res = dram_replay.run_requests(std, reqs, commands=cmds, controller=ctrl)
        violations = dram_check.check_file(std, cmds)
    row = {"standard": name, "trace": label, "controller": ctrl or {},
           "violations": len(violations),
           **{k: res[k] for k in ("gbps", "utilisation", "peak_gbps", "dram_cycles",
                                  "row_hits", "row_misses", "row_conflicts",
                                  "refreshes", "sim_cycles_per_s")}}
    if label.startswith("random"):
        row["act_bound_gbps"] = std.act_bound_gbps
        row["of_act_bound"] = res["gbps"] / std.act_bound_gbps
    return row, violations
