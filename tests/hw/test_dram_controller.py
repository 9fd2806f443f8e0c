"""The Verilated DRAM controller and device (``coda dram replay``), command by command:
exact latencies of known cases, FR-FCFS and its bypass cap, the row policies, refresh
(same-bank, postponed to the JEDEC limit, in idle time), ranks sharing a channel, zero
violations of the independent checker under random and adversarial traces, and the checker
catching seeded violations.

The Verilated models are built once per standard (and controller options) and cached under
build/dram/."""

import random

import pytest

from coda.cosim.dram import check as dram_check

from coda.cosim.dram import replay as dram_replay
from coda.hw.dram.mapping import map_burst_address
from coda.hw.dram.standards import STANDARDS, get_standard
from dram_cases import ALL


# ---- exact numbers on known cases ------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_closed_bank_read_then_row_hit(name, tmp_path):
    s = STANDARDS[name]
    trace = tmp_path / "t.trace"
    trace.write_text("0x0 READ 0\n0x0 READ 400\n")
    cmds = tmp_path / "c.csv"
    res = dram_replay.replay(s, trace, commands=cmds)
    rows = (cmds.read_text().splitlines())
    assert rows[0] == "cycle,channel,rank,bankgroup,bank,command,row,column"
    # accepted at cycle 1, ACT at 2, RD tRCD later; the hit is accepted at 400, RD at 401
    assert rows[1:] == ["2,0,0,0,0,ACT,0,0", f"{2 + s.tRCD},0,0,0,0,RD,0,0",
                        "401,0,0,0,0,RD,0,0"]
    miss = 1 + s.tRCD + s.CL + s.nBL     # acceptance -> data: ACT slot + tRCD + CL + BL/2
    hit = 1 + s.CL + s.nBL
    assert res["requests"] == 2 and res["row_misses"] == 1 and res["row_hits"] == 1
    assert res["avg_read_latency_cycles"] == pytest.approx((miss + hit) / 2)


def _burst_at(s, bg, ba, row, burst):
    """The burst address that the controller maps to (bg, ba, row, column burst)."""
    gb, cb, bb = ((n - 1).bit_length() for n in (s.bank_groups, s.bursts_per_row,
                                                 s.banks_per_group))
    for field in range(s.banks_per_group):
        a = bg | burst << gb | field << (gb + cb) | row << (gb + cb + bb)
        if map_burst_address(s, a) == (bg, ba, row, burst * s.burst_length):
            return a
    raise AssertionError("unreachable")


@pytest.mark.parametrize("name", ["DDR4-3200", "DDR5-4800"])
def test_fr_fcfs_serves_a_row_hit_before_an_older_conflict(name, tmp_path):
    """FR-FCFS: reads A (row 0), B (row 1, same bank), C (row 0 again). In order this would
    be two conflicts; FR-FCFS serves C's hit right after A, then closes the row for B. The
    responses still come back in request order (counted by the player; data order is checked
    by the word-adapter tests)."""
    s = STANDARDS[name]
    bb = s.burst_bytes
    a, b, c = (_burst_at(s, 0, 0, r, k) * bb for r, k in ((0, 0), (1, 0), (0, 1)))
    cmds = tmp_path / "c.csv"
    res = dram_replay.run_requests(s, [(0, 0, a), (0, 0, b), (0, 0, c)], commands=cmds)
    log = [ln.split(",") for ln in cmds.read_text().splitlines()[1:]]
    seq = [(x[5], int(x[6]), int(x[7])) for x in log]     # a PRE logs the row its request needs
    assert seq == [("ACT", 0, 0), ("RD", 0, 0), ("RD", 0, s.burst_length), ("PRE", 1, 0),
                   ("ACT", 1, 0), ("RD", 1, 0)]
    t = [int(x[0]) for x in log]
    # every gap the standard's minimum: tRCD, tCCD_L (same bank), max(tRAS after the ACT,
    # tRTP after the last RD), tRP, tRCD
    assert t[2] - t[1] == s.tCCD_L and t[1] - t[0] == s.tRCD
    assert t[3] == max(t[0] + s.tRAS, t[2] + s.tRTP)
    assert (t[4] - t[3], t[5] - t[4]) == (s.tRP, s.tRCD)
    assert (res["row_hits"], res["row_misses"], res["row_conflicts"]) == (1, 1, 1)
    assert dram_check.check_file(s, cmds) == []


@pytest.mark.parametrize("cap", [1, 16])
def test_bypass_cap_bounds_how_often_the_oldest_is_overtaken(cap, tmp_path):
    """Reads A (row 0), B (row 1 of the same bank), C and D (row 0 again). With max_bypass=1
    only C may overtake B; then B's PRE goes before D (which needs row 0 reopened). With 16,
    both hits overtake B."""
    s = STANDARDS["DDR4-3200"]
    a, b, c, d = (_burst_at(s, 0, 0, r, k) * s.burst_bytes
                  for r, k in ((0, 0), (1, 0), (0, 1), (0, 2)))
    cmds = tmp_path / "c.csv"
    dram_replay.run_requests(s, [(0, 0, x) for x in (a, b, c, d)], commands=cmds,
                             controller={"max_bypass": cap})
    seq = [(x.split(",")[5], int(x.split(",")[6]), int(x.split(",")[7]))
           for x in cmds.read_text().splitlines()[1:]]
    bl = s.burst_length
    if cap == 1:
        assert seq == [("ACT", 0, 0), ("RD", 0, 0), ("RD", 0, bl), ("PRE", 1, 0), ("ACT", 1, 0),
                       ("RD", 1, 0), ("PRE", 0, 0), ("ACT", 0, 0), ("RD", 0, 2 * bl)]
    else:
        assert seq == [("ACT", 0, 0), ("RD", 0, 0), ("RD", 0, bl), ("RD", 0, 2 * bl),
                       ("PRE", 1, 0), ("ACT", 1, 0), ("RD", 1, 0)]
    assert dram_check.check_file(s, cmds) == []


@pytest.mark.parametrize("policy,delay", [("open", None), ("closed", 0), ("timeout", 200)])
def test_row_policy_closes_an_idle_row(policy, delay, tmp_path):
    """One read, then nothing: open page leaves the row open; closed page precharges it as
    soon as tRAS (from the ACT) and tRTP (from the RD) allow; timeout precharges it ``delay``
    cycles after the RD (the policy's timer starts the cycle after the RD)."""
    s = STANDARDS["DDR5-4800"]
    cmds = tmp_path / "c.csv"
    ctrl = {} if policy == "open" else {"row_policy": policy}
    if policy == "timeout":
        ctrl["row_timeout"] = delay
    dram_replay.run_requests(s, [(0, 0, 0), (3000, 0, 64 * s.bank_groups * 2)],
                             commands=cmds, controller=ctrl)
    log = [x.split(",") for x in cmds.read_text().splitlines()[1:]]
    kinds = [x[5] for x in log]
    t_act, t_rd = int(log[0][0]), int(log[1][0])
    assert kinds[:2] == ["ACT", "RD"]
    if policy == "open":
        assert "PRE" not in kinds      # the second read (same row, 2 columns on) still hits
        assert kinds == ["ACT", "RD", "RD"]
    else:
        t_pre = int(log[2][0])
        # closed: the second read misses (its row may be closed again before the run ends)
        assert kinds[:5] == ["ACT", "RD", "PRE", "ACT", "RD"] and set(kinds[5:]) <= {"PRE"}
        assert t_pre == max(t_act + s.tRAS, t_rd + s.tRTP, t_rd + 1 + delay)
    assert dram_check.check_file(s, cmds) == []


def test_same_bank_refresh_ddr5_no_violations(tmp_path):
    """DDR5 REFsb (refresh='same_bank'): the adversarial mix (conflicts, runs, idle time past
    two tREFI) with every bank address refreshed in turn, one REFsb per tREFI / 4, no REF."""
    s = get_standard("DDR5-4800")
    reqs = _adversarial(s, seed=9)
    cmds = tmp_path / "c.csv"
    res = dram_replay.run_requests(s, reqs, commands=cmds, controller={"refresh": "same_bank"})
    assert res["requests"] == len(reqs)
    log = [x.split(",") for x in cmds.read_text().splitlines()[1:]]
    sb = [(int(x[0]), int(x[4])) for x in log if x[5] == "REFsb"]
    assert not any(x[5] in ("REF", "PREA") for x in log)
    interval = s.tREFI // s.banks_per_group
    due = int(log[-1][0]) // interval              # REFsb fallen due by the last command
    assert due - 1 <= len(sb) <= due and res["refreshes"] == len(sb)
    assert [ba for _, ba in sb] == [k % s.banks_per_group for k in range(len(sb))]
    violations = dram_check.check_file(s, cmds)
    assert violations == [], "\n".join(map(str, violations[:20]))
    with pytest.raises(ValueError, match=r"DDR4-3200: refresh='same_bank': the standard has no "
                                         r"same-bank refresh"):
        dram_replay.run_requests("DDR4-3200", reqs[:2], controller={"refresh": "same_bank"})


@pytest.mark.parametrize("name,refresh", [("DDR4-3200", "all"), ("DDR5-4800", "all"),
                                          ("DDR5-4800", "same_bank")])
def test_refresh_postponed_to_the_jedec_limit_then_caught_up(name, refresh, tmp_path):
    """refresh_postpone = the standard's JEDEC limit P (DDR4 8, DDR5 4) on STREAM-add, which
    keeps the queues busy: no refresh until P are owed (P * banks_per_group REFsb), then all
    owed ones back to back (all-bank: one PREA, REFs exactly tRFC apart), the same again P
    intervals later; the checker (which allows P owed) finds nothing."""
    s = STANDARDS[name]
    P = s.refresh_postpone
    k = 1 if refresh == "all" else s.banks_per_group
    interval, limit = s.tREFI // k, P * k
    cmds = tmp_path / "c.csv"
    ctrl = {"refresh_postpone": P} | ({} if refresh == "all" else {"refresh": refresh})
    res = dram_replay.run_requests(s, dram_replay.stream_add_trace(s, 1 << 20), commands=cmds,
                                   controller=ctrl)
    log = [x.split(",") for x in cmds.read_text().splitlines()[1:]]
    kind = "REF" if refresh == "all" else "REFsb"
    refs = [int(x[0]) for x in log if x[5] == kind]
    end = int(log[-1][0])
    batches = end // interval // limit
    assert batches >= 2 and len(refs) == batches * limit == res["refreshes"]
    for b in range(batches):
        batch = refs[b * limit:(b + 1) * limit]
        due = (b + 1) * limit * interval          # the cycle the limit-th REF is owed
        # the first waits only for the PREA (or PREs) to close the banks
        assert due <= batch[0] < due + max(s.tRAS, s.write_to_pre) + s.tRPab + 2
        if refresh == "all":
            assert [y - x for x, y in zip(batch, batch[1:])] == [s.tRFC] * (limit - 1)
            i = next(i for i, x in enumerate(log) if int(x[0]) == batch[0])
            assert log[i - 1][5] == "PREA" and all(x[5] == "REF" for x in log[i:i + limit])
    if refresh != "all":
        sb = [int(x[4]) for x in log if x[5] == "REFsb"]
        assert sb == [j % s.banks_per_group for j in range(len(sb))]
    assert not any(x[5] in ("REF", "REFsb") and x[5] != kind for x in log)
    violations = dram_check.check_file(s, cmds)
    assert violations == [], "\n".join(map(str, violations[:20]))


def test_refresh_postponement_refreshes_in_idle_time(tmp_path):
    """With postponement, a REF that falls due while no request is queued issues at once (as
    without postponement): one request every 5000 cycles leaves the queues empty at every
    interval end, so every REF comes within a PREA's time of its tREFI boundary."""
    s = STANDARDS["DDR4-3200"]
    reqs = [(5000 * j + 7, 0, 64 * j) for j in range(40)]
    cmds = tmp_path / "c.csv"
    dram_replay.run_requests(s, reqs, commands=cmds, controller={"refresh_postpone": 8})
    log = [x.split(",") for x in cmds.read_text().splitlines()[1:]]
    refs = [int(x[0]) for x in log if x[5] == "REF"]
    assert len(refs) == int(log[-1][0]) // s.tREFI
    assert all(0 <= t - (j + 1) * s.tREFI < s.tRAS + s.tRPab + 2 for j, t in enumerate(refs))
    assert dram_check.check_file(s, cmds) == []


# ---- ranks of one channel (replay --ranks) -------------------------------------------
def _rank_burst_at(s, ranks, rank, bg, ba, row, burst):
    """The byte address that the channel mapping of ``ranks`` ranks maps to (rank, bg, ba,
    row, column burst)."""
    from coda.hw.dram.mapping import AddressMapping
    mp = AddressMapping(s, ranks)
    gb, cb, bb = mp.bg_bits, mp.col_bits, mp.ba_bits
    for field in range(s.banks_per_group):
        a = (bg | burst << gb | field << (gb + cb) | rank << (gb + cb + bb)
             | row << (gb + cb + bb + mp.rank_bits))
        if mp.map_rank(a) == (rank, bg, ba, row, burst * s.burst_length):
            return a * s.burst_bytes
    raise AssertionError("unreachable")


@pytest.mark.parametrize("name", [pytest.param("DDR4-3200", marks=pytest.mark.slow), "DDR5-4800"])
def test_ranks_share_the_bus_with_a_rank_switch_and_keep_their_own_tfaw(name, tmp_path):
    """Two ranks: a read of bank 0 in each: the ACTs one cycle apart (tRRD is per rank), the
    second RD nBL + tRTRS after the first (its burst tRTRS after the first's end). Five reads
    to five banks of rank 0, then five of rank 1: rank 0's fifth ACT waits for its tFAW
    while rank 1's ACTs fill the gaps: more than four ACTs in a tFAW window of the channel,
    at most four per rank."""
    s = STANDARDS[name]
    cmds = tmp_path / "c.csv"
    reqs = [(0, 0, _rank_burst_at(s, 2, r, 0, 0, 0, 0)) for r in (0, 1)]
    dram_replay.run_requests(s, reqs, commands=cmds, controller={"ranks": 2})
    t_rd = 2 + s.tRCD
    assert cmds.read_text().splitlines()[1:] == [
        "2,0,0,0,0,ACT,0,0", "3,0,1,0,0,ACT,0,0", f"{t_rd},0,0,0,0,RD,0,0",
        f"{t_rd + s.nBL + s.tRTRS},0,1,0,0,RD,0,0"]
    assert dram_check.check_file(s, cmds) == []
    bgs = s.bank_groups
    reqs = [(0, 0, _rank_burst_at(s, 2, r, k % bgs, k // bgs, 0, 0)) for r in (0, 1)
            for k in range(5)]
    res = dram_replay.run_requests(s, reqs, commands=cmds, controller={"ranks": 2})
    assert res["reads"] == 10
    log = [x.split(",") for x in cmds.read_text().splitlines()[1:]]
    acts = {r: [int(x[0]) for x in log if x[5] == "ACT" and x[2] == str(r)] for r in (0, 1)}
    assert len(acts[0]) == len(acts[1]) == 5
    assert acts[0][4] >= acts[0][0] + s.tFAW and acts[1][4] >= acts[1][0] + s.tFAW
    assert acts[1][0] < acts[0][3]                     # rank 1 does not wait for rank 0
    both = sorted(acts[0] + acts[1])
    assert max(sum(t <= u < t + s.tFAW for u in both) for t in both) > 4
    assert dram_check.check_file(s, cmds) == []


# each controller variant is a Verilator build of its own: `make test` runs one of each rank
# feature (two ranks, refresh postponed per rank), `make verify-long` every standard and 4 ranks
@pytest.mark.parametrize("name,ranks,postpone", [
    pytest.param("DDR4-3200", 2, 0, marks=pytest.mark.slow), ("DDR5-4800", 2, 0),
    pytest.param("DDR4-3200", 4, 0, marks=pytest.mark.slow),
    pytest.param("DDR5-4800", 4, 0, marks=pytest.mark.slow), ("DDR4-3200", 2, 8)])
def test_ranks_random_and_adversarial_no_violations(name, ranks, postpone, tmp_path):
    """The adversarial mix (conflicts, runs, reads and writes, idle time past two tREFI) over
    the channel's ranks: every rank used and refreshed (staggered), 0 violations of the
    per-rank and shared-bus rules (also with refresh postponed to the limit, per rank)."""
    s = STANDARDS[name]
    reqs = _adversarial(s, seed=5)        # its sequential and random parts reach every rank
    cmds = tmp_path / "c.csv"
    ctrl = {"ranks": ranks} | ({"refresh_postpone": postpone} if postpone else {})
    res = dram_replay.run_requests(s, reqs, commands=cmds, controller=ctrl)
    assert res["requests"] == len(reqs)
    log = [x.split(",") for x in cmds.read_text().splitlines()[1:]]
    assert {x[2] for x in log if x[5] == "RD"} == {str(r) for r in range(ranks)}
    refs = {r: [int(x[0]) for x in log if x[5] == "REF" and x[2] == str(r)]
            for r in range(ranks)}
    assert all(len(v) >= 2 for v in refs.values())
    # rank r's first REF falls due r * tREFI / ranks before rank 0's
    assert all(refs[r][0] < refs[r - 1][0] for r in range(1, ranks))
    violations = dram_check.check_file(s, cmds)
    assert violations == [], "\n".join(map(str, violations[:20]))


# ---- random and adversarial traces: zero violations ------------------------------------
def _adversarial(s, seed, n=1500):
    rng = random.Random(seed)
    bb = s.burst_bytes
    stride = bb * s.bank_groups * s.bursts_per_row * s.banks_per_group  # same bank, next row
    out, cycle = [], 0
    for i in range(n):
        mode = rng.random()
        if mode < 0.3:       # bank conflicts: same bank group/bank, other rows
            addr = rng.randrange(64) * stride * s.banks_per_group
        elif mode < 0.6:     # a sequential burst run
            addr = (i * bb) % (1 << 20)
        else:                # anywhere in the rank
            addr = rng.randrange(s.rank_bytes // bb) * bb
        cycle += rng.choice((0, 0, 0, 1, 5, 40))
        out.append((cycle, int(rng.random() < 0.4), addr))
    # read-after-write and write-after-read to the same burst
    out += [(cycle + 1, 1, 0), (cycle + 1, 0, 0), (cycle + 1, 1, 0), (cycle + 1, 0, 0)]
    # idle time past two tREFI so refresh happens with and without traffic
    out.append((cycle + 2 * s.tREFI + 10, 0, 4 * bb))
    return out


@pytest.mark.parametrize("name", ALL)
def test_replay_random_and_adversarial_no_violations(name, tmp_path):
    s = STANDARDS[name]
    reqs = _adversarial(s, seed=7)
    cmds = tmp_path / "c.csv"
    res = dram_replay.run_requests(s, reqs, commands=cmds)
    assert res["requests"] == len(reqs)
    assert res["reads"] == sum(1 for r in reqs if not r[1])
    assert res["row_conflicts"] > 50 and res["refreshes"] >= 2
    assert res["row_hits"] + res["row_misses"] + res["row_conflicts"] == len(reqs)
    violations = dram_check.check_file(s, cmds)
    assert violations == [], "\n".join(map(str, violations[:20]))


@pytest.mark.parametrize("name", ["DDR4-3200", "DDR5-4800"])
def test_stream_add_small_ldst(name, tmp_path):
    s = STANDARDS[name]
    trace = tmp_path / "stream.trace"
    trace.write_text("".join(f"{'ST' if w else 'LD'} {a:#x}\n"
                             for _, w, a in dram_replay.stream_add_trace(s, 64 << 10)))
    cmds = tmp_path / "c.csv"
    res = dram_replay.replay(s, trace, commands=cmds)
    assert res["requests"] == 3 * (64 << 10) // s.burst_bytes
    assert res["row_hit_rate"] > 0.9 and 0.4 < res["utilisation"] < s.refresh_ceiling
    assert dram_check.check_file(s, cmds) == []


# ---- the checker catches seeded violations ---------------------------------------------
def test_checker_catches_seeded_violations(tmp_path):
    s = get_standard("DDR4-3200")
    bad = tmp_path / "bad.csv"
    lines = ["cycle,channel,rank,bankgroup,bank,command,row,column",
             "10,0,0,0,0,ACT,5,0",
             "12,0,0,0,1,ACT,7,0",                         # tRRD_L (same bank group)
             "14,0,0,1,0,ACT,1,0",                         # tRRD_S
             f"{10 + s.tRCD - 1},0,0,0,0,RD,5,0",          # tRCD - 1
             "40,0,0,1,0,PRE,0,0",                         # tRAS
             "50,0,0,1,0,ACT,1,0",                         # tRP, tRC
             "60,0,0,0,0,RD,9,8",                          # wrong row
             "61,0,0,2,0,RD,0,0",                          # closed bank
             "62,0,0,1,0,RD,1,0",                          # tCCD_S, data bus overlap
             "300,0,0,,,REF,,",                            # REF with banks open
             f"{300 + s.tRFC - 5},0,0,3,3,ACT,0,0",        # tRFC
             f"{40 * s.tREFI},0,0,3,2,ACT,0,0"]            # refresh fell behind
    bad.write_text("\n".join(lines) + "\n")
    rules = {v.rule for v in dram_check.check_file(s, bad)}
    assert {"tRCD", "tRRD_L", "tRRD_S", "state", "tCCD_S", "data bus", "tRAS", "tRP", "tRC",
            "tRFC", "tREFI"} <= rules
    good = tmp_path / "good.csv"
    good.write_text("\n".join(lines[:2] + [f"{10 + s.tRCD},0,0,0,0,RD,5,0"]) + "\n")
    assert dram_check.check_file(s, good) == []
    with pytest.raises(ValueError, match="NOP"):
        dram_check.check_commands(s, [{"cycle": "1", "channel": "0", "rank": "0",
                                       "bankgroup": "", "bank": "", "command": "NOP",
                                       "row": "", "column": ""}])
