"""Command-level DRAM energy of a command log (the CSV :mod:`coda.cosim.dram.check` reads:
``coda dram replay --commands`` or the DIMM-NMP cosimulation's ``+dram_cmds``).

The log is walked once per rank (``channel``, ``rank``): every ACT (with the PRE that closes
its row), RD, WR and REF is counted, and over the rank's time from cycle 0 to the end of the
log the open banks are integrated (bank-cycles; a PREA closes every open bank; during a REF's
tRFC every bank counts as open), which prices the bank-wise background. A bank still open at
the end counts as an ACT whose PRE is still to come (the ACT-PRE pair is charged at the ACT). The energies are
:func:`coda.hw.dram.power.dram_energy`'s (the device's IDD/IPP currents, DRAMPower's
method); the log's rows are parsed and checked as :mod:`coda.cosim.dram.check` does.
"""

from __future__ import annotations

import csv
from pathlib import Path

from coda.cosim.dram.check import HEADER, _command
from coda.hw.dram.power import ENERGY_PARTS, dram_energy
from coda.hw.dram.standards import DRAMStandard, get_standard

__all__ = ["LogCounts", "count_commands", "energy_commands", "energy_files", "split_j"]


class LogCounts:
    """What one rank's log holds: ``acts``, ``reads``, ``writes``, ``refreshes``, the DRAM
    ``cycles`` accounted and ``bank_open_cycles`` (bank-cycles: the sum over cycles of the
    banks open, every bank during a REF's tRFC)."""

    def __init__(self, std: DRAMStandard):
        self.std = std
        self.acts = self.reads = self.writes = self.refreshes = 0
        self.bank_open_cycles = self.cycles = 0
        self._open: set = set()
        self._refresh_until = 0
        self.since = 0               # the cycle accounted up to

    def _advance(self, t: int) -> None:
        self.bank_open_cycles += len(self._open) * (t - self.since)
        self.since = t

    def command(self, t: int, cmd: str, bank) -> None:
        """Account the cycles up to ``t``, then command ``cmd`` on ``bank`` at ``t``."""
        self._advance(t)
        if cmd == "ACT":
            self.acts += 1
            self._open.add(bank)
        elif cmd == "PRE":
            self._open.discard(bank)
        elif cmd == "PREA":
            self._open.clear()
        elif cmd == "RD":
            self.reads += 1
        elif cmd == "WR":
            self.writes += 1
        elif cmd == "REF":
            self.refreshes += 1
            # every bank open for tRFC (the banks are closed: JEDEC requires it for a REF)
            self.bank_open_cycles += self.std.banks * self.std.tRFC
            self._refresh_until = t + self.std.tRFC
        else:   # REFsb: the device spec has no same-bank refresh current
            raise ValueError(f"cycle {t}: {cmd}: command-level energy has no same-bank refresh "
                             f"current (coda.hw.dram.power); expected ACT, PRE, PREA, RD, WR "
                             f"or REF")

    def finish(self, end: int) -> None:
        """Close the account at cycle ``end`` (>= the last command): a REF whose tRFC runs
        past ``end`` is counted up to ``end``."""
        self._advance(end)
        self.bank_open_cycles -= self.std.banks * max(0, self._refresh_until - end)
        self.cycles = end


def count_commands(std: DRAMStandard | str, rows, end_cycle: int | None = None
                   ) -> dict[tuple[int, int], LogCounts]:
    """Per rank ``(channel, rank)``: the counts of the log ``rows`` (dicts with the
    :data:`coda.cosim.dram.check.HEADER` keys, in log order per rank), the time split up to
    ``end_cycle`` (default: one past the log's last command, over all ranks: the devices of a
    cosimulation share one clock).

    Raises:
        ValueError: a malformed row (as :mod:`coda.cosim.dram.check`), a REFsb, a command
            before the previous one of its rank, or ``end_cycle`` before the last command.
    """
    std = get_standard(std)
    ranks: dict[tuple[int, int], LogCounts] = {}
    last = 0
    for n, row in enumerate(rows, 2):
        c = _command(std, n, row)
        r = ranks.setdefault(c.key, LogCounts(std))
        if c.t < r.since:
            raise ValueError(f"line {n}: cycle {c.t} before the rank's previous command at "
                             f"{r.since}: expected the log in cycle order")
        r.command(c.t, c.cmd, c.bank)
        last = max(last, c.t + 1)
    end = last if end_cycle is None else int(end_cycle)
    if end < last:
        raise ValueError(f"end_cycle={end_cycle}: before the log's last command at {last - 1}")
    for r in ranks.values():
        r.finish(end)
    return dict(ranks)


def energy_commands(std: DRAMStandard | str, rows, end_cycle: int | None = None) -> dict:
    """Energy of the command log ``rows`` (:func:`count_commands`), per rank and in total.

    Returns:
        ``{"standard", "method", "cycles", "ranks": {"c<ch>r<rank>": {counts, "rank_s",
        "bank_open_s", and dram_energy's "<part>_j" / "<part>_pj"}}, "total": {the same
        summed}, "split_j": {"act_pre", "read_write", "refresh", "background", "total"}}``.
    """
    std = get_standard(std)
    counts = count_commands(std, rows, end_cycle)
    tck_s = std.tCK_ns * 1e-9
    per_rank = {}
    for (ch, rk), c in sorted(counts.items()):
        rank_s, bank_open_s = c.cycles * tck_s, c.bank_open_cycles * tck_s
        per_rank[f"c{ch}r{rk}"] = {
            "acts": c.acts, "reads": c.reads, "writes": c.writes, "refreshes": c.refreshes,
            "cycles": c.cycles, "rank_s": rank_s, "bank_open_s": bank_open_s,
            **dram_energy(std, acts=c.acts, reads=c.reads, writes=c.writes,
                          refreshes=c.refreshes, rank_s=rank_s, bank_open_s=bank_open_s)}
    keys = ("acts", "reads", "writes", "refreshes", "rank_s", "bank_open_s") + tuple(
        f"{p}_{u}" for p in ENERGY_PARTS + ("total",) for u in ("j", "pj"))
    total = {k: sum(r[k] for r in per_rank.values()) for k in keys}
    return {"standard": std.name,
            "method": "per command and power state from the device's IDD/IPP currents "
                      "(DRAMPower's method, coda.hw.dram.power)",
            "cycles": max((c.cycles for c in counts.values()), default=0),
            "ranks": per_rank, "total": total, "split_j": split_j(total)}


def split_j(energy: dict) -> dict:
    """The report's split of a :func:`coda.hw.dram.power.dram_energy` result (J):
    activation/precharge, read + write, refresh, background, total."""
    return {"act_pre": energy["act_pre_j"], "read_write": energy["read_j"] + energy["write_j"],
            "refresh": energy["refresh_j"], "background": energy["background_j"],
            "total": energy["total_j"]}


def _rows(paths):
    for path in paths:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames != HEADER:
                raise ValueError(f"{path}: header {reader.fieldnames}: expected "
                                 f"{','.join(HEADER)}")
            yield from reader


def energy_files(std: DRAMStandard | str, paths, end_cycle: int | None = None) -> dict:
    """:func:`energy_commands` of command log files ``paths`` (one per rank, as the DIMM-NMP
    cosimulation writes them, or one for all). Raises ValueError on a wrong header, OSError
    for an unreadable file."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not paths:
        raise ValueError("no command log files: expected at least one")
    return energy_commands(std, _rows(paths), end_cycle)
