"""Independent JEDEC timing checker of a DRAM command trace (CSV from ``coda dram replay
--commands`` or the cosimulation's ``+dram_cmds``).

Written from the standard's timing table (:class:`coda.hw.dram.standards.DRAMStandard`), not
from the controller: :func:`check_commands` (:func:`check_file` for a CSV file) replays the
log, keeps per-bank / per-bank-group / per-rank command history and reports every
:class:`Violation`: commands closer than the standard allows or illegal in the bank's state,
overlapping data bursts, the command and data bus shared by a channel's ranks, and the refresh
rate with postponement (JESD79-4, JESD79-5). :func:`check_commands` lists every rule and its
source.

Usage: ``coda dram check --standard DDR4-3200 CMDS.csv`` (exit 1 on violations); its
:func:`main` takes the command's :class:`DRAMCheckConfig` (``CONFIG``).
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.options import add_options, option

__all__ = ["Violation", "check_commands", "check_file", "DRAMCheckConfig", "CONFIG", "configure",
           "main"]

NEVER = -(1 << 62)
HEADER = ["cycle", "channel", "rank", "bankgroup", "bank", "command", "row", "column"]


@dataclass(frozen=True)
class Violation:
    """One broken rule: at ``cycle`` the ``command`` broke ``rule`` (e.g. ``"tRCD"``)."""
    cycle: int
    channel: int
    rank: int
    command: str
    rule: str
    detail: str

    def __str__(self):
        return f"cycle {self.cycle} ch{self.channel} r{self.rank} {self.command}: {self.rule}: {self.detail}"


class _Rank:
    """Command history of one rank."""

    def __init__(self):
        self.open_row: dict[tuple[int, int], int] = {}
        self.act = defaultdict(lambda: NEVER)    # per bank
        self.pre = defaultdict(lambda: NEVER)    # per bank (PRE only)
        self.rd = defaultdict(lambda: NEVER)     # per bank
        self.wr = defaultdict(lambda: NEVER)     # per bank
        self.bg_rd = defaultdict(lambda: NEVER)
        self.bg_wr = defaultdict(lambda: NEVER)
        self.bg_act = defaultdict(lambda: NEVER)
        self.acts: list[int] = []                # all ACT cycles, for tRRD_S and tFAW
        self.last_rd = self.last_wr = self.last_prea = self.last_ref = NEVER
        self.last_pre_any = NEVER
        self.refs = 0
        self.sb_refs = 0                          # REFsb commands
        self.sb_ref = defaultdict(lambda: NEVER)  # per bank address BA: last REFsb
        self.last_sb = NEVER
        self.last_cycle = NEVER
        self.bursts: list[tuple[int, int, str, int]] = []  # (start, end, kind, cmd cycle)


def _need(out, r, t, cmd, rule, since, gap, what):
    if t - since < gap:
        out.append(Violation(t, r[0], r[1], cmd, rule,
                             f"{t - since} cycles after {what} at {since}, needs {gap}"))


def check_commands(std: DRAMStandard | str, rows) -> list[Violation]:
    """Check an iterable of CSV rows (dicts with the :data:`HEADER` keys).

    Written from the standard's timing table (:class:`coda.hw.dram.standards.DRAMStandard`), not
    from the controller: it replays the log, keeps per-bank / per-bank-group / per-rank command
    history and reports every pair of commands closer than the standard allows, every command
    illegal in the bank's state (ACT to an open bank, RD/WR to a closed bank or another row,
    REF with a bank open, REFsb with its bank open in some bank group), every overlap of data
    bursts on the shared data bus, and the refresh rate (``tREFI``): refresh falling behind (fewer
    REFs by cycle t than ``t // tREFI - refresh_postpone``) or running ahead (more than
    ``refresh_postpone`` REFs pulled in: more than ``t // tREFI + 1 + refresh_postpone`` by cycle
    t); a same-bank refresh REFsb counts as ``1 / banks_per_group`` of a REF.

    The refresh rate with postponement (JESD79-4's "Refresh Command": at no point in time more
    than 8 REF postponed, a maximum interval of 9 x tREFI between the surrounding REFs; at most 8
    pulled in; JESD79-5: 4; the preset's ``refresh_postpone``): the REF of the k-th tREFI interval
    is owed from its end, cycle ``k * tREFI``; at most ``refresh_postpone`` may be owed at once.
    The debt only grows at interval ends and only shrinks at a REF, so checking it just before
    every REF (and at the end of the log) checks it at every cycle; keeping it bounded keeps the
    average rate one REF per tREFI (and bounds the gap between REFs).

    Ranks of one channel (the log's ``rank`` column; ``coda dram replay --ranks``): every rule above
    is per rank (bank state, tRRD/tFAW, refresh, tCCD/tWTR/tRTW); the ranks of a channel share
    its command bus (one command per cycle: ``command bus``) and its data bus: no two bursts may
    overlap (``data bus``), and bursts of two different ranks need ``tRTRS`` idle cycles between
    them (``tRTRS``; DRAMsim3's rank-switch rule: RD to RD / WR to WR of another rank nBL +
    tRTRS, RD to WR CL + nBL + tRTRS - CWL, WR to RD CWL + nBL + tRTRS - CL, each the burst gap).

    Same-bank refresh (DDR5 REFsb; the log's ``bank`` column is the bank address BA, refreshed in
    every bank group, ``bankgroup`` is empty): only for a standard with ``tRFCsb`` (JESD79-5), with
    the rules of Ramulator 2's DDR5 model: tRC after an ACT and tRP after a PRE of a refreshed bank,
    tRPab after a PREA, tRFC after a REF; tRFCsb before the next ACT or REFsb of the same BA and
    before a REF or PREA.

    Returns all violations, in log order. Raises ValueError on an unknown command or a
    malformed row (naming it).
    """
    std = get_standard(std)
    ranks: dict[tuple[int, int], _Rank] = defaultdict(_Rank)
    channel_cmd: dict[int, tuple[int, int]] = {}    # channel: (cycle, rank) of its last command
    out: list[Violation] = []
    for n, row in enumerate(rows, 2):
        c = _command(std, n, row)
        s = ranks[c.key]
        _order(out, s, channel_cmd, c)
        if c.t - s.last_ref < std.tRFC:
            _need(out, c.key, c.t, c.cmd, "tRFC", s.last_ref, std.tRFC, "REF")
        check = _CHECKS.get(c.cmd)
        if check is None:
            raise ValueError(f"line {n}: command {c.cmd!r}: expected ACT, PRE, PREA, RD, WR, "
                             f"REF or REFsb")
        check(out, std, s, c)
    channels = defaultdict(list)
    for key, s in ranks.items():
        _refresh_rate(out, key, std, s.last_cycle, s.refs, "end", s.sb_refs)
        channels[key[0]] += [(b0, b1, k, c, key[1]) for b0, b1, k, c in s.bursts]
    for ch, bursts in channels.items():
        _bus(out, ch, bursts, std.tRTRS)
    return out


@dataclass(frozen=True)
class _Command:
    """One row of the log, read: cycle ``t`` of channel ``ch``, rank ``rk``; ``bg``, ``ba``,
    ``row`` None where the row leaves them empty."""
    t: int
    ch: int
    rk: int
    cmd: str
    bg: int | None
    ba: int | None
    row: int | None

    @property
    def key(self) -> tuple[int, int]:
        return self.ch, self.rk

    @property
    def bank(self) -> tuple[int, int]:
        return self.bg, self.ba


def _command(std: DRAMStandard, n: int, row: dict) -> _Command:
    """Line ``n`` of the log read, its bank address checked against ``std`` for the commands
    that take one. Raises ValueError naming the line for a missing or malformed column, a
    REFsb on a standard without same-bank refresh, or a bank out of range."""
    try:
        c = _Command(int(row["cycle"]), int(row["channel"]), int(row["rank"]),
                     row["command"].strip(),
                     int(row["bankgroup"]) if row["bankgroup"] not in ("", None) else None,
                     int(row["bank"]) if row["bank"] not in ("", None) else None,
                     int(row["row"]) if row["row"] not in ("", None) else None)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"line {n}: {row!r}: expected columns {','.join(HEADER)} ({exc})")
    if c.cmd == "REFsb":
        if not std.tRFCsb:
            raise ValueError(f"line {n}: REFsb: {std.name} has no same-bank refresh "
                             f"(tRFCsb = 0); expected ACT, PRE, PREA, RD, WR or REF")
        if c.ba is None or not 0 <= c.ba < std.banks_per_group:
            raise ValueError(f"line {n}: REFsb needs a bank in 0..{std.banks_per_group - 1}, "
                             f"got {c.ba}")
    if c.cmd in ("ACT", "PRE", "RD", "WR"):
        if (c.bg is None or c.ba is None or not 0 <= c.bg < std.bank_groups
                or not 0 <= c.ba < std.banks_per_group):
            raise ValueError(f"line {n}: {c.cmd} needs bankgroup/bank in range, got "
                             f"{c.bg},{c.ba}")
    return c


def _order(out, s: _Rank, channel_cmd: dict, c: _Command) -> None:
    """Command order: each rank's commands in increasing cycles; one command per cycle on a
    channel's command bus (shared by its ranks)."""
    if c.t <= s.last_cycle:
        out.append(Violation(c.t, c.ch, c.rk, c.cmd, "order",
                             f"not after the previous command at {s.last_cycle}"))
    s.last_cycle = c.t
    last = channel_cmd.get(c.ch)
    if last is not None and last[0] == c.t and last[1] != c.rk:
        out.append(Violation(c.t, c.ch, c.rk, c.cmd, "command bus",
                             f"rank {last[1]} has a command in the same cycle"))
    channel_cmd[c.ch] = (c.t, c.rk)


def _activate(out, std: DRAMStandard, s: _Rank, c: _Command) -> None:
    """ACT: a closed bank; tRC / tRP / tRPab / tRFCsb after what last used or refreshed the
    bank, tRRD_L / tRRD_S / tFAW after earlier ACTs."""
    key, t, cmd, bg, ba, b = c.key, c.t, c.cmd, c.bg, c.ba, c.bank
    if b in s.open_row:
        out.append(Violation(t, c.ch, c.rk, cmd, "state", f"bank {b} already open"))
    _need(out, key, t, cmd, "tRC", s.act[b], std.tRC, "ACT same bank")
    _need(out, key, t, cmd, "tRP", s.pre[b], std.tRP, "PRE same bank")
    _need(out, key, t, cmd, "tRPab", s.last_prea, std.tRPab, "PREA")
    _need(out, key, t, cmd, "tRRD_L", s.bg_act[bg], std.tRRD_L, "ACT same bank group")
    if s.acts:
        _need(out, key, t, cmd, "tRRD_S", s.acts[-1], std.tRRD_S, "ACT")
    if len(s.acts) >= 4:
        _need(out, key, t, cmd, "tFAW", s.acts[-4], std.tFAW, "4th previous ACT")
    _need(out, key, t, cmd, "tRFCsb", s.sb_ref[ba], std.tRFCsb, f"REFsb bank {ba}")
    s.open_row[b] = c.row
    s.act[b] = s.bg_act[bg] = t
    s.acts.append(t)


def _precharge(out, std: DRAMStandard, s: _Rank, c: _Command) -> None:
    """PRE (one bank) and PREA (every open bank): tRAS after the bank's ACT, tRTP after its
    RD, CWL + nBL + tWR after its WR; PREA also tRFCsb after a REFsb."""
    key, t, cmd = c.key, c.t, c.cmd
    if cmd == "PREA":
        _need(out, key, t, cmd, "tRFCsb", s.last_sb, std.tRFCsb, "REFsb")
    banks = [c.bank] if cmd == "PRE" else list(s.open_row)
    for pb in banks:
        _need(out, key, t, cmd, "tRAS", s.act[pb], std.tRAS, f"ACT bank {pb}")
        _need(out, key, t, cmd, "tRTP", s.rd[pb], std.tRTP, f"RD bank {pb}")
        _need(out, key, t, cmd, "tWR", s.wr[pb], std.CWL + std.nBL + std.tWR,
              f"WR bank {pb} (CWL+nBL+tWR)")
        s.open_row.pop(pb, None)
        s.pre[pb] = t
    if cmd == "PREA":
        s.last_prea = t
    else:
        s.last_pre_any = t


def _read_write(out, std: DRAMStandard, s: _Rank, c: _Command) -> None:
    """RD / WR: the row open in the bank, tRCD after its ACT; RD: tCCD_L / tCCD_S after RDs,
    the write-to-read turnaround (CWL + nBL + tWTR_L / tWTR_S); WR: tCCD_L_WR / tCCD_S after
    WRs, tRTW after a RD. Records the data burst for the channel's data bus."""
    key, t, cmd, bg, b, rw = c.key, c.t, c.cmd, c.bg, c.bank, c.row
    if s.open_row.get(b, None) != rw or b not in s.open_row:
        out.append(Violation(t, c.ch, c.rk, cmd, "state",
                             f"bank {b} has row {s.open_row.get(b)} open, not {rw}"))
    _need(out, key, t, cmd, "tRCD", s.act[b], std.tRCD, "ACT same bank")
    if cmd == "RD":
        _need(out, key, t, cmd, "tCCD_L", s.bg_rd[bg], std.tCCD_L, "RD same bank group")
        _need(out, key, t, cmd, "tCCD_S", s.last_rd, std.tCCD_S, "RD")
        _need(out, key, t, cmd, "tWTR_L", s.bg_wr[bg], std.CWL + std.nBL + std.tWTR_L,
              "WR same bank group (CWL+nBL+tWTR_L)")
        _need(out, key, t, cmd, "tWTR_S", s.last_wr, std.CWL + std.nBL + std.tWTR_S,
              "WR (CWL+nBL+tWTR_S)")
        s.rd[b] = s.bg_rd[bg] = s.last_rd = t
        start = t + std.CL
    else:
        _need(out, key, t, cmd, "tCCD_L_WR", s.bg_wr[bg], std.tCCD_L_WR, "WR same bank group")
        _need(out, key, t, cmd, "tCCD_S", s.last_wr, std.tCCD_S, "WR")
        _need(out, key, t, cmd, "tRTW", s.last_rd, std.tRTW, "RD")
        s.wr[b] = s.bg_wr[bg] = s.last_wr = t
        start = t + std.CWL
    s.bursts.append((start, start + std.nBL, cmd, t))


def _refresh(out, std: DRAMStandard, s: _Rank, c: _Command) -> None:
    """REF (all banks): every bank closed, tRC / tRPab / tRP / tRFCsb after the last ACT,
    PREA, PRE, REFsb; the refresh rate (:func:`_refresh_rate`)."""
    key, t, cmd = c.key, c.t, c.cmd
    if s.open_row:
        out.append(Violation(t, c.ch, c.rk, cmd, "state", f"banks {sorted(s.open_row)} open"))
    if s.acts:
        _need(out, key, t, cmd, "tRC", s.acts[-1], std.tRC, "ACT")
    _need(out, key, t, cmd, "tRPab", s.last_prea, std.tRPab, "PREA")
    _need(out, key, t, cmd, "tRP", s.last_pre_any, std.tRP, "PRE")
    _need(out, key, t, cmd, "tRFCsb", s.last_sb, std.tRFCsb, "REFsb")
    _refresh_rate(out, key, std, t, s.refs, cmd, s.sb_refs)
    s.refs += 1
    s.last_ref = t


def _refresh_same_bank(out, std: DRAMStandard, s: _Rank, c: _Command) -> None:
    """REFsb (bank address BA in every bank group): those banks closed, tRC / tRP after their
    ACT / PRE, tRPab after a PREA, tRFCsb after the last REFsb of BA; the refresh rate."""
    key, t, cmd, ba = c.key, c.t, c.cmd, c.ba
    sbanks = [(g, ba) for g in range(std.bank_groups)]
    still = sorted(sb for sb in sbanks if sb in s.open_row)
    if still:
        out.append(Violation(t, c.ch, c.rk, cmd, "state", f"banks {still} open"))
    for sb in sbanks:
        _need(out, key, t, cmd, "tRC", s.act[sb], std.tRC, f"ACT bank {sb}")
        _need(out, key, t, cmd, "tRP", s.pre[sb], std.tRP, f"PRE bank {sb}")
    _need(out, key, t, cmd, "tRPab", s.last_prea, std.tRPab, "PREA")
    _need(out, key, t, cmd, "tRFCsb", s.sb_ref[ba], std.tRFCsb, f"REFsb bank {ba}")
    _refresh_rate(out, key, std, t, s.refs, cmd, s.sb_refs)
    s.sb_refs += 1
    s.sb_ref[ba] = s.last_sb = t


#: the rule family that checks each command
_CHECKS = {"ACT": _activate, "PRE": _precharge, "PREA": _precharge, "RD": _read_write,
           "WR": _read_write, "REF": _refresh, "REFsb": _refresh_same_bank}


def _refresh_rate(out, key, std, t, refs_before, cmd, sb_before=0):
    """REFs owed by cycle ``t`` (before the command at ``t``), and, for a refresh command,
    pulled in (with it); ``banks_per_group`` REFsb count as one REF."""
    owed = t // std.tREFI - std.refresh_postpone
    k = std.banks_per_group
    done = f"{refs_before} REF" + (f" + {sb_before} REFsb" if sb_before else "")
    if refs_before * k + sb_before < owed * k:
        out.append(Violation(t, key[0], key[1], cmd, "tREFI",
                             f"{done} by cycle {t}, at least {owed} required"))
    ahead = t // std.tREFI + 1 + std.refresh_postpone      # at most this many with it
    with_it = refs_before * k + sb_before + (k if cmd == "REF" else 1 if cmd == "REFsb" else 0)
    if cmd in ("REF", "REFsb") and with_it > ahead * k:
        out.append(Violation(t, key[0], key[1], cmd, "tREFI",
                             f"{done} before cycle {t}: one more pulls in more than "
                             f"{std.refresh_postpone} (at most {ahead} by then)"))


def _bus(out, ch, bursts, rtrs):
    """The data bus of channel ``ch``: ``bursts`` of all its ranks, (start, end, kind, command
    cycle, rank) each: no overlap; ``rtrs`` idle cycles between bursts of different ranks."""
    bursts = sorted(bursts)
    for (s0, e0, k0, c0, r0), (s1, e1, k1, c1, r1) in zip(bursts, bursts[1:]):
        if s1 < e0:
            out.append(Violation(c1, ch, r1, k1, "data bus",
                                 f"burst [{s1},{e1}) overlaps {k0} at {c0} burst [{s0},{e0})"
                                 + (f" of rank {r0}" if r0 != r1 else "")))
        elif r0 != r1 and s1 - e0 < rtrs:
            out.append(Violation(c1, ch, r1, k1, "tRTRS",
                                 f"burst [{s1},{e1}) {s1 - e0} cycles after rank {r0}'s {k0} "
                                 f"at {c0} burst [{s0},{e0}), needs {rtrs}"))


def check_file(std: DRAMStandard | str, path: str | Path) -> list[Violation]:
    """Check a command CSV file. Raises ValueError on a wrong header."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames != HEADER:
            raise ValueError(f"{path}: header {reader.fieldnames}: expected {','.join(HEADER)}")
        return check_commands(std, reader)


@dataclass(frozen=True)
class DRAMCheckConfig:
    """Every option of ``coda dram check`` (the one source of them; none has a default).
    Checked when made: the standard (ValueError naming it and the known ones)."""
    standard: str = option(None, "the DRAM preset the trace was made for, e.g. DDR4-3200",
                           type=str, required=True)
    csv: tuple[str, ...] = option(None, "command trace(s): CSV with the header "
                                  + ",".join(HEADER), type=str, nargs="+", positional=True,
                                  required=True)

    def __post_init__(self):
        get_standard(self.standard)


#: the config of ``coda dram check``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = DRAMCheckConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda dram check``: :class:`DRAMCheckConfig`."""
    add_options(parser, DRAMCheckConfig)


def main(cfg: DRAMCheckConfig) -> int:
    """Run ``coda dram check`` of ``cfg`` (its :class:`DRAMCheckConfig`): prints the first 50
    violations of each file and their count; returns 0 when there are none, 1 otherwise
    (ValueError for an unknown standard or a wrong header, OSError for an unreadable file:
    ``coda: error:``, exit 2)."""
    std = get_standard(cfg.standard)
    bad = 0
    for path in cfg.csv:
        found = check_file(std, path)
        bad += len(found)
        for v in found[:50]:
            print(f"{path}: {v}")
        print(f"{path}: {len(found)} violations")
    return 1 if bad else 0
