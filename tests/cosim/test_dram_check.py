"""The independent JEDEC checker (:mod:`coda.cosim.dram.check`) shown to fire on every rule it
checks: for each rule a minimal hand-written command log whose last command comes one cycle
too early, and the same log with that command one cycle later (the gap respected) passing.

Every cycle is derived from the standard's own timing parameters
(:mod:`coda.hw.dram.standards`); nothing is pasted. A log breaks *exactly* its rule, except
where the standard itself makes two constraints coincide: then the other rule is expected too,
and the condition for it is written out from the parameters (e.g. DDR5's tFAW = 4 x tRRD_S, so
a fifth ACT one cycle inside tFAW is also one cycle inside tRRD_S). Those rules are then also
shown alone on a variant of the standard (:func:`dataclasses.replace`) in which they do not
coincide. Pure Python: no simulator.
"""

from dataclasses import replace

import pytest

from coda.cosim.dram import check as dram_check
from coda.hw.dram.standards import STANDARDS

ALL = list(STANDARDS)
T0 = 100          # first command of every log (an arbitrary cycle, no refresh owed yet)


def C(t, cmd, bg=0, ba=0, row=1, col=0, rank=0):
    """One command-log row as :func:`dram_check.check_commands` reads it (REFsb: the bank
    address ``ba`` only, refreshed in every bank group)."""
    bank = cmd not in ("PREA", "REF", "REFsb")
    return {"cycle": str(t), "channel": "0", "rank": str(rank),
            "bankgroup": str(bg) if bank else "",
            "bank": str(ba) if bank or cmd == "REFsb" else "",
            "command": cmd, "row": str(row) if bank else "", "column": str(col) if bank else ""}


def two_banks(s, t=T0):
    """ACT bank group 0 and bank group 1 (bank 0 each) ``tRRD_S`` apart; returns the rows and
    the first cycle at which both banks may take a column command (tRCD after the second)."""
    return [C(t, "ACT", 0), C(t + s.tRRD_S, "ACT", 1)], t + s.tRRD_S + s.tRCD


def _case(name):
    """Each case maps a standard to (prefix rows, last command as a function of its cycle,
    the earliest legal cycle of that last command, {other rule: does it also fire})."""
    def build(s):
        if name == "tRCD RD":
            return [C(T0, "ACT")], lambda t: C(t, "RD"), T0 + s.tRCD, {}
        if name == "tRCD WR":
            return [C(T0, "ACT")], lambda t: C(t, "WR"), T0 + s.tRCD, {}
        if name == "tRAS PRE":
            return [C(T0, "ACT")], lambda t: C(t, "PRE"), T0 + s.tRAS, {}
        if name == "tRAS PREA":
            return [C(T0, "ACT")], lambda t: C(t, "PREA"), T0 + s.tRAS, {}
        if name == "tRTP":
            r = T0 + max(s.tRCD, s.tRAS)           # tRAS has passed at the RD
            return [C(T0, "ACT"), C(r, "RD")], lambda t: C(t, "PRE"), r + s.tRTP, {}
        if name in ("tWR PRE", "tWR PREA"):
            w = T0 + max(s.tRCD, s.tRAS)
            last = "PRE" if name == "tWR PRE" else "PREA"
            # tWR counts from the end of the write data: CWL + nBL + tWR after the WR
            return ([C(T0, "ACT"), C(w, "WR")], lambda t: C(t, last),
                    w + s.CWL + s.nBL + s.tWR, {})
        if name == "tRP ACT":
            p = T0 + max(s.tRAS, s.tRC - s.tRP + 1)  # so one cycle early is still past tRC
            return [C(T0, "ACT"), C(p, "PRE")], lambda t: C(t, "ACT", row=2), p + s.tRP, {}
        if name == "tRP REF":
            p = T0 + max(s.tRAS, s.tRC - s.tRP + 1)
            return [C(T0, "ACT"), C(p, "PRE")], lambda t: C(t, "REF"), p + s.tRP, {}
        if name in ("tRC ACT", "tRC REF"):
            p = T0 + s.tRAS
            last = (lambda t: C(t, "ACT", row=2)) if name == "tRC ACT" else (lambda t: C(t, "REF"))
            # with tRC = tRAS + tRP (every preset) one cycle inside tRC is inside tRP too
            return ([C(T0, "ACT"), C(p, "PRE")], last, T0 + s.tRC,
                    {"tRP": T0 + s.tRC - 1 - p < s.tRP})
        if name == "tRPab ACT":
            return [C(T0, "PREA")], lambda t: C(t, "ACT"), T0 + s.tRPab, {}
        if name == "tRPab REF":
            return [C(T0, "PREA")], lambda t: C(t, "REF"), T0 + s.tRPab, {}
        if name == "tRRD_S":
            return [C(T0, "ACT", 0)], lambda t: C(t, "ACT", 1), T0 + s.tRRD_S, {}
        if name == "tRRD_L":
            # LPDDR5: tRRD_L = tRRD_S
            return ([C(T0, "ACT", 0, 0)], lambda t: C(t, "ACT", 0, 1), T0 + s.tRRD_L,
                    {"tRRD_S": s.tRRD_L - 1 < s.tRRD_S})
        if name == "tFAW":
            # four ACTs tRRD_S apart to banks (bg k mod BG, ba k div BG), a fifth one tFAW after
            # the first to another bank of bank group 0
            bgs = s.bank_groups
            acts = [C(T0 + k * s.tRRD_S, "ACT", k % bgs, k // bgs) for k in range(4)]
            assert bgs >= 4, "four ACTs to four bank groups"
            fifth = 1                              # bank 1 of bank group 0: not yet opened
            last_bg0 = max(k for k in range(4) if k % bgs == 0) * s.tRRD_S
            return (acts, lambda t: C(t, "ACT", 0, fifth), T0 + s.tFAW,
                    {"tRRD_S": s.tFAW - 1 - 3 * s.tRRD_S < s.tRRD_S,       # DDR5, LPDDR5
                     "tRRD_L": s.tFAW - 1 - last_bg0 < s.tRRD_L})
        if name in ("tCCD_S RD", "tCCD_S WR"):
            cmd = name[-2:]
            pre, c = two_banks(s)
            # tCCD_S = nBL in every preset: one cycle early also overlaps the data bursts
            return (pre + [C(c, cmd, 0)], lambda t: C(t, cmd, 1), c + s.tCCD_S,
                    {"data bus": s.tCCD_S - 1 < s.nBL})
        if name == "tCCD_L":
            c = T0 + s.tRCD
            return ([C(T0, "ACT"), C(c, "RD")], lambda t: C(t, "RD", col=s.burst_length),
                    c + s.tCCD_L, {"tCCD_S": s.tCCD_L - 1 < s.tCCD_S,
                                   "data bus": s.tCCD_L - 1 < s.nBL})
        if name == "tCCD_L_WR":
            c = T0 + s.tRCD
            return ([C(T0, "ACT"), C(c, "WR")], lambda t: C(t, "WR", col=s.burst_length),
                    c + s.tCCD_L_WR, {"tCCD_S": s.tCCD_L_WR - 1 < s.tCCD_S,
                                      "data bus": s.tCCD_L_WR - 1 < s.nBL})
        if name == "tWTR_S":
            pre, c = two_banks(s)
            return (pre + [C(c, "WR", 0)], lambda t: C(t, "RD", 1),
                    c + s.CWL + s.nBL + s.tWTR_S, {})
        if name == "tWTR_L":
            c = T0 + s.tRCD
            return ([C(T0, "ACT"), C(c, "WR")], lambda t: C(t, "RD"),
                    c + s.CWL + s.nBL + s.tWTR_L, {"tWTR_S": s.tWTR_L < s.tWTR_S})
        if name == "tRTW":
            pre, c = two_banks(s)
            return (pre + [C(c, "RD", 0)], lambda t: C(t, "WR", 1), c + s.tRTW,
                    {"data bus": s.tRTW - 1 + s.CWL < s.CL + s.nBL})
        if name == "tRFC ACT":
            return [C(T0, "REF")], lambda t: C(t, "ACT"), T0 + s.tRFC, {}
        if name == "tRFC REF":
            return [C(T0, "REF")], lambda t: C(t, "REF"), T0 + s.tRFC, {}
        # same-bank refresh (REFsb of bank address 1, in every bank group; DDR5)
        last_bg = s.bank_groups - 1
        if name == "tRFCsb ACT":
            return [C(T0, "REFsb", ba=1)], lambda t: C(t, "ACT", last_bg, 1), T0 + s.tRFCsb, {}
        if name == "tRFCsb REFsb":
            return [C(T0, "REFsb", ba=1)], lambda t: C(t, "REFsb", ba=1), T0 + s.tRFCsb, {}
        if name == "tRFCsb REF":
            return [C(T0, "REFsb", ba=1)], lambda t: C(t, "REF"), T0 + s.tRFCsb, {}
        if name == "tRFCsb PREA":
            return [C(T0, "REFsb", ba=1)], lambda t: C(t, "PREA"), T0 + s.tRFCsb, {}
        if name == "tRC REFsb":
            p = T0 + s.tRAS
            return ([C(T0, "ACT", last_bg, 1), C(p, "PRE", last_bg, 1)],
                    lambda t: C(t, "REFsb", ba=1), T0 + s.tRC,
                    {"tRP": T0 + s.tRC - 1 - p < s.tRP})
        if name == "tRP REFsb":
            p = T0 + max(s.tRAS, s.tRC - s.tRP + 1)
            return ([C(T0, "ACT", last_bg, 1), C(p, "PRE", last_bg, 1)],
                    lambda t: C(t, "REFsb", ba=1), p + s.tRP, {})
        if name == "tRPab REFsb":
            return [C(T0, "PREA")], lambda t: C(t, "REFsb", ba=1), T0 + s.tRPab, {}
        if name == "tRFC REFsb":
            return [C(T0, "REF")], lambda t: C(t, "REFsb", ba=1), T0 + s.tRFC, {}
        raise AssertionError(name)
    return build


CASES = ["tRCD RD", "tRCD WR", "tRAS PRE", "tRAS PREA", "tRTP", "tWR PRE", "tWR PREA",
         "tRP ACT", "tRP REF", "tRC ACT", "tRC REF", "tRPab ACT", "tRPab REF", "tRRD_S",
         "tRRD_L", "tFAW", "tCCD_S RD", "tCCD_S WR", "tCCD_L", "tCCD_L_WR", "tWTR_S",
         "tWTR_L", "tRTW", "tRFC ACT", "tRFC REF"]


SB_CASES = ["tRFCsb ACT", "tRFCsb REFsb", "tRFCsb REF", "tRFCsb PREA", "tRC REFsb",
            "tRP REFsb", "tRPab REFsb", "tRFC REFsb"]
SB = [n for n, s in STANDARDS.items() if s.tRFCsb]     # standards with same-bank refresh


def _run(s, rows):
    return dram_check.check_commands(s, rows)


def _fires(s, case):
    prefix, last, earliest, extra = _case(case)(s)
    rule = case.split()[0]
    assert all(int(r["cycle"]) < earliest - 1 for r in prefix), "log not in cycle order"
    bad = _run(s, prefix + [last(earliest - 1)])
    good = _run(s, prefix + [last(earliest)])
    return rule, bad, good, {r for r, on in extra.items() if on}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ALL)
def test_checker_fires_one_cycle_early_and_passes_on_time(name, case):
    s = STANDARDS[name]
    rule, bad, good, also = _fires(s, case)
    assert good == [], "\n".join(map(str, good))
    assert {v.rule for v in bad} == {rule} | also, "\n".join(map(str, bad))
    # the violation is reported at the early command, with the gap and the need in cycles
    mine = [v for v in bad if v.rule == rule]
    prefix, _, earliest, _ = _case(case)(s)
    assert [v.cycle for v in mine] == [earliest - 1]
    assert mine[0].detail.endswith(f"needs {_need(s, rule)}")


@pytest.mark.parametrize("case", SB_CASES)
@pytest.mark.parametrize("name", SB)
def test_checker_same_bank_refresh_rules(name, case):
    test_checker_fires_one_cycle_early_and_passes_on_time(name, case)


@pytest.mark.parametrize("name", SB)
def test_checker_same_bank_refresh_state_and_rate(name):
    """REFsb needs its bank address closed in every bank group, not the other banks; four
    REFsb (one per bank address) count as one REF."""
    s = STANDARDS[name]
    last_bg = s.bank_groups - 1
    act = [C(T0, "ACT", last_bg, 1), C(T0 + s.tRRD_L, "ACT", last_bg, 2)]
    later = T0 + s.tRC
    bad = _run(s, act + [C(later, "REFsb", ba=1)])
    assert [v.rule for v in bad] == ["state"] and f"({last_bg}, 1)" in bad[0].detail
    # bank 1 closed, bank 2 of the same group still open: legal, and an ACT to another bank
    # address right after the REFsb too
    ok = act + [C(T0 + s.tRAS, "PRE", last_bg, 1), C(later + s.tRP, "REFsb", ba=1),
                C(later + s.tRP + 1, "ACT", 0, 3)]
    assert _run(s, ok) == []
    # refresh rate: a REFsb per tREFI / banks_per_group keeps up; a missing one, past the
    # slack, falls behind
    step = s.tREFI // s.banks_per_group
    n = (s.refresh_postpone + 3) * s.banks_per_group
    sbs = [C(k * step, "REFsb", ba=k % s.banks_per_group) for k in range(1, n)]
    assert _run(s, sbs) == []
    end = (s.refresh_postpone + 1) * s.tREFI          # one REF owed here with no refresh at all
    assert [v.rule for v in _run(s, sbs[:s.banks_per_group - 1] + [C(end + s.tREFI, "PREA")])]\
        == ["tREFI"]


@pytest.mark.parametrize("name", [n for n in ALL if not STANDARDS[n].tRFCsb])
def test_checker_refuses_refsb_where_the_standard_has_none(name):
    with pytest.raises(ValueError, match=f"REFsb: {name} has no same-bank refresh"):
        _run(STANDARDS[name], [C(T0, "REFsb", ba=1)])


def _need(s, rule):
    """The cycles a rule needs, from the standard (column-to-precharge and write-to-read
    rules count from the command: latency + burst + the JEDEC interval)."""
    return {"tWR": s.CWL + s.nBL + s.tWR, "tWTR_S": s.CWL + s.nBL + s.tWTR_S,
            "tWTR_L": s.CWL + s.nBL + s.tWTR_L}.get(rule, getattr(s, rule, None))


@pytest.mark.parametrize("name", ALL)
def test_coinciding_rules_fire_alone_on_a_variant_standard(name):
    """tRC, tFAW and the data bus coincide with other rules in the presets (tRC = tRAS + tRP;
    DDR5/LPDDR5 tFAW = 4 tRRD_S; tCCD_S = nBL and tRTW keeps bursts apart): on a standard
    stretched so they do not, each fires alone."""
    s = STANDARDS[name]
    # tRC longer than tRAS + tRP: an ACT after tRP but inside tRC
    v = replace(s, tRC=s.tRAS + s.tRP + 5)
    rule, bad, good, also = _fires(v, "tRC ACT")
    assert also == set() and {x.rule for x in bad} == {"tRC"} and good == []
    # tFAW longer than 4 x tRRD_S (+ tRRD_L room)
    v = replace(s, tFAW=max(4 * s.tRRD_S, 3 * s.tRRD_S + s.tRRD_L) + 3)
    rule, bad, good, also = _fires(v, "tFAW")
    assert also == set() and {x.rule for x in bad} == {"tFAW"} and good == []
    # a RD-to-WR turnaround too short for the bus: only the burst overlap catches the WR
    v = replace(s, tRTW=1)
    pre, c = two_banks(v)
    end_of_read = c + v.CL + v.nBL                 # the WR's data may start here
    bad = _run(v, pre + [C(c, "RD", 0), C(end_of_read - v.CWL - 1, "WR", 1)])
    good = _run(v, pre + [C(c, "RD", 0), C(end_of_read - v.CWL, "WR", 1)])
    assert [x.rule for x in bad] == ["data bus"] and good == []
    assert "overlaps RD" in bad[0].detail


@pytest.mark.parametrize("name", ALL)
def test_checker_state_rules(name):
    """Commands illegal in the bank's state, each next to its legal counterpart."""
    s = STANDARDS[name]
    act = [C(T0, "ACT", 0, 0, row=3)]
    col = T0 + max(s.tRCD, s.tRAS)
    closed_later = T0 + s.tRC
    cases = [  # (bad log, good log)
        (act + [C(closed_later, "ACT", 0, 0, row=4)],                       # ACT to an open bank
         act + [C(T0 + s.tRAS, "PRE", 0, 0), C(closed_later, "ACT", 0, 0, row=4)]),
        (act + [C(col, "RD", 0, 0, row=4)], act + [C(col, "RD", 0, 0, row=3)]),   # other row
        (act + [C(col, "WR", 0, 0, row=4)], act + [C(col, "WR", 0, 0, row=3)]),
        (act + [C(col, "RD", 1, 0, row=3)],                                 # a closed bank
         act + [C(T0 + s.tRRD_S, "ACT", 1, 0, row=3), C(col + s.tRRD_S, "RD", 1, 0, row=3)]),
        (act + [C(closed_later, "REF")],                                    # REF, a bank open
         act + [C(T0 + s.tRAS, "PREA"), C(closed_later + s.tRPab, "REF")]),
    ]
    for bad, good in cases:
        assert {v.rule for v in _run(s, bad)} == {"state"}, bad
        assert _run(s, good) == [], good


@pytest.mark.parametrize("name", ALL)
def test_checker_order_rule(name):
    s = STANDARDS[name]
    assert [v.rule for v in _run(s, [C(T0, "PREA"), C(T0, "PREA")])] == ["order"]
    assert _run(s, [C(T0, "PREA"), C(T0 + 1, "PREA")]) == []


@pytest.mark.parametrize("name", ALL)
def test_checker_refresh_rate(name):
    """``refresh_postpone`` REFs may be owed: by cycle t at least t // tREFI - postpone REFs
    must have issued, at every REF and at the end of the log."""
    s = STANDARDS[name]
    owed_at = (s.refresh_postpone + 1) * s.tREFI   # the first cycle at which 1 REF is owed
    # no REF at all: fine until owed_at - 1, a violation at the end of a log reaching owed_at
    assert _run(s, [C(owed_at - 1, "PREA")]) == []
    bad = _run(s, [C(owed_at, "PREA")])
    assert [(v.rule, v.command, v.cycle) for v in bad] == [("tREFI", "end", owed_at)]
    assert bad[0].detail == f"0 REF by cycle {owed_at}, at least 1 required"
    # at a REF: the REF itself comes too late (0 before it, 1 owed)
    assert [v.rule for v in _run(s, [C(owed_at, "REF")])] == ["tREFI"]
    assert _run(s, [C(owed_at - 1, "REF")]) == []
    # a REF every tREFI keeps up indefinitely; one missing one past the slack falls behind
    refs = [C(k * s.tREFI, "REF") for k in range(1, 2 * s.refresh_postpone + 4)]
    assert _run(s, refs) == []
    # three REFs, then the fourth at the last cycle the slack allows, or one cycle later
    late = (4 + s.refresh_postpone) * s.tREFI
    assert _run(s, refs[:3] + [C(late - 1, "REF")]) == []
    bad = _run(s, refs[:3] + [C(late, "REF")])
    assert [(v.rule, v.cycle) for v in bad] == [("tREFI", late)]
    assert bad[0].detail == f"3 REF by cycle {late}, at least 4 required"


def test_checker_keeps_ranks_apart():
    """Constraints are per rank: an ACT in rank 1 right after one in rank 0 is legal, the same
    in rank 0 is not (tRRD_S)."""
    s = STANDARDS["DDR4-3200"]
    assert _run(s, [C(T0, "ACT", 0), C(T0 + 1, "ACT", 1, rank=1)]) == []
    assert [v.rule for v in _run(s, [C(T0, "ACT", 0), C(T0 + 1, "ACT", 1)])] == ["tRRD_S"]


def test_every_checked_rule_has_a_seeded_case():
    """The rules of this file cover every rule name the checker can report (read from its
    source, so a new rule without a seeded test fails here)."""
    import inspect
    import re
    src = inspect.getsource(dram_check)
    reported = set(re.findall(r'"(t[A-Za-z_]+|state|order|data bus|command bus)"', src)) \
        - {"tREFI"}
    covered = {c.split()[0] for c in CASES + SB_CASES} | {"state", "order", "data bus",
                                                          "tRTRS", "command bus"}
    assert reported <= covered | {"tREFI"}, reported - covered


@pytest.mark.parametrize("name", ALL)
def test_checker_refresh_postponement_to_the_limit_then_one_too_many(name):
    """JEDEC postponement: REFs on time after intervals 1 and 2, then ``refresh_postpone``
    (P) intervals without one, caught up back to back (tRFC apart) and one REF per tREFI after
    that: legal. The same catch-up one interval later has postponed P + 1: the checker fires
    at its first REF, and only there (the catch-up brings the debt back within the limit)."""
    s = STANDARDS[name]
    P = s.refresh_postpone
    on_time = [C(k * s.tREFI, "REF") for k in (1, 2)]

    def log(start_interval):
        t0 = start_interval * s.tREFI + 10
        batch = [C(t0 + j * s.tRFC, "REF") for j in range(P)]
        after = [C(k * s.tREFI, "REF") for k in range(start_interval + 1, start_interval + 4)]
        return on_time + batch + after

    assert _run(s, log(2 + P)) == []                   # P owed at the batch: the limit
    bad = _run(s, log(3 + P))                          # P + 1 owed: one too many
    t = (3 + P) * s.tREFI + 10
    assert [(v.rule, v.command, v.cycle) for v in bad] == [("tREFI", "REF", t)]
    assert bad[0].detail == f"2 REF by cycle {t}, at least 3 required"
    # the log's end counts too: P + 1 intervals owed with no REF after them
    end = (3 + P) * s.tREFI
    assert _run(s, on_time + [C(end - 1, "PREA")]) == []
    assert [(v.rule, v.command) for v in _run(s, on_time + [C(end, "PREA")])] == \
        [("tREFI", "end")]


@pytest.mark.parametrize("name", ALL)
def test_checker_refresh_pull_in_limit(name):
    """At most ``refresh_postpone`` REFs may be pulled in: within the first tREFI interval its
    own REF and P more, back to back, are legal; one more fires (JESD79-4: 8 pulled in)."""
    s = STANDARDS[name]
    P = s.refresh_postpone
    refs = [C(T0 + j * s.tRFC, "REF") for j in range(P + 2)]
    assert (P + 2) * s.tRFC + T0 < s.tREFI             # all inside the first interval
    assert _run(s, refs[:-1]) == []
    bad = _run(s, refs)
    assert [(v.rule, v.cycle) for v in bad] == [("tREFI", T0 + (P + 1) * s.tRFC)]
    assert bad[0].detail == (f"{P + 1} REF before cycle {T0 + (P + 1) * s.tRFC}: one more "
                             f"pulls in more than {P} (at most {P + 1} by then)")


# ---- ranks of one channel: per-rank rules, the shared command and data bus ---------------
BUS_PAIRS = [("RD", "RD"), ("WR", "WR"), ("RD", "WR"), ("WR", "RD")]


def _rank_switch(s, first, second):
    """Bank 0 opened in rank 0 and in rank 1, ``first`` (a column command) in rank 0, then
    ``second`` in rank 1: (prefix rows, last command as a function of its cycle, its earliest
    legal cycle: its burst ``tRTRS`` after the end of the first's, DRAMsim3's ``*_to_*_o``)."""
    c = T0 + 1 + s.tRCD
    lat = {"RD": s.CL, "WR": s.CWL}
    earliest = c + lat[first] + s.nBL + s.tRTRS - lat[second]
    return ([C(T0, "ACT", rank=0), C(T0 + 1, "ACT", rank=1), C(c, first, rank=0)],
            lambda t: C(t, second, rank=1), earliest)


@pytest.mark.parametrize("pair", BUS_PAIRS)
@pytest.mark.parametrize("name", ALL)
def test_checker_rank_switch_fires_one_cycle_early(name, pair):
    """tRTRS between the bursts of two ranks on the shared data bus, for every pair of column
    commands; a pair whose rule cannot bind (its earliest cycle is not after the first
    command: DDR4 WR then RD of another rank, CWL + nBL + tRTRS <= CL) is checked to be legal
    right after the first command."""
    s = STANDARDS[name]
    prefix, last, earliest = _rank_switch(s, *pair)
    c = int(prefix[-1]["cycle"])
    if earliest - 1 <= c:
        assert pair == ("WR", "RD") and s.CWL + s.nBL + s.tRTRS <= s.CL
        assert _run(s, prefix + [last(c + 1)]) == []
        return
    bad = _run(s, prefix + [last(earliest - 1)])
    assert [(v.rule, v.cycle, v.rank) for v in bad] == [("tRTRS", earliest - 1, 1)]
    s0 = c + {"RD": s.CL, "WR": s.CWL}[pair[0]]
    assert bad[0].detail.endswith(f"{s.tRTRS - 1} cycles after rank 0's {pair[0]} at {c} "
                                  f"burst [{s0},{s0 + s.nBL}), needs {s.tRTRS}")
    assert _run(s, prefix + [last(earliest)]) == []
    # inside the other rank's burst: an overlap, reported as such
    inside = earliest - s.tRTRS - 1
    if inside > c:
        assert "data bus" in {v.rule for v in _run(s, prefix + [last(inside)])}


@pytest.mark.parametrize("name", ALL)
def test_checker_rank_rules_per_rank_and_one_command_bus(name):
    """tFAW, tRRD and tRFC are per rank: a fifth ACT inside tFAW, an ACT right after another
    and an ACT inside another rank's tRFC are legal in rank 1 and not in rank 0; the ranks
    share the command bus: two commands in one cycle fire "command bus"."""
    s = STANDARDS[name]
    bgs = s.bank_groups
    acts = [C(T0 + k * s.tRRD_S, "ACT", k % bgs, k // bgs) for k in range(4)]
    t5 = T0 + s.tFAW - 1
    assert t5 > T0 + 3 * s.tRRD_S
    assert _run(s, acts + [C(t5, "ACT", 0, 1, rank=1)]) == []
    assert "tFAW" in {v.rule for v in _run(s, acts + [C(t5, "ACT", 0, 1)])}
    ref = [C(T0, "REF", rank=0)]
    assert _run(s, ref + [C(T0 + 1, "ACT", rank=1)]) == []
    assert {v.rule for v in _run(s, ref + [C(T0 + 1, "ACT", rank=0)])} == {"tRFC"}
    bad = _run(s, [C(T0, "ACT", 0, 0, rank=0), C(T0, "ACT", 0, 0, rank=1)])
    assert [(v.rule, v.rank, v.cycle) for v in bad] == [("command bus", 1, T0)]
