"""DRAM timing model: presets, address mapping, Verilated replay, independent checker,
exact latencies of known cases, and the NME word adapter bit-exact through the device.

The Verilated models are built once per standard and cached under build/dram/."""

import json
import random
import re
from pathlib import Path

import pytest

from coda.cosim import dram_check, dram_replay
from coda.hw.dram.mapping import map_burst_address
from coda.hw.dram.standards import STANDARDS, get_standard

ALL = list(STANDARDS)


# ---- presets ---------------------------------------------------------------------------
def test_presets_peak_bandwidth_and_bursts():
    assert get_standard("DDR4-3200").peak_gbps == pytest.approx(25.6)
    assert get_standard("ddr5_4800").peak_gbps == pytest.approx(19.2)
    assert get_standard("LPDDR5-6400").peak_gbps == pytest.approx(12.8)
    assert [STANDARDS[n].burst_bytes for n in ALL] == [64, 64, 32]
    # DDR5-4800 refresh-limited ceiling ~92 % (1 - 295 ns / 3.9 us)
    assert get_standard("DDR5-4800").refresh_ceiling == pytest.approx(0.9244, abs=1e-3)


@pytest.mark.parametrize("name", ALL)
def test_presets_consistent(name):
    s = STANDARDS[name]
    assert s.tRC >= s.tRAS + s.tRP and s.tCCD_L >= s.tCCD_S >= s.nBL
    assert s.tRRD_L >= s.tRRD_S and s.tWTR_L >= s.tWTR_S and s.CL > s.CWL
    assert s.tRTW + s.CWL >= s.CL + s.nBL  # write data never starts before read data ends
    assert s.rank_bytes == s.rows * s.columns * s.banks * s.rank_width // 8


def test_unknown_standard_lists_valid_names():
    with pytest.raises(ValueError, match="DDR4-3200, DDR5-4800, LPDDR5-6400"):
        get_standard("DDR3-1600")


def test_act_bound_arithmetic():
    """One ACT per burst (every access a row miss): four ACTs per tFAW and tRRD_S apart."""
    d4, d5 = get_standard("DDR4-3200"), get_standard("DDR5-4800")
    assert d4.act_interval == d4.tFAW / 4 == 8.5           # 34 / 4 > tRRD_S = 4
    assert d4.act_bound_gbps == pytest.approx(64 / (8.5 * 0.625))   # 12.05 GB/s
    assert d5.act_interval == d5.tRRD_S == d5.tFAW / 4 == 8  # 32 / 4 = tRRD_S = nBL
    assert d5.act_bound_gbps == pytest.approx(d5.peak_gbps)  # = the data-bus peak


def test_controller_parameter_errors_name_the_value():
    from coda.hw.dram.controller import DRAMController
    with pytest.raises(ValueError, match=r"row policy 'lazy': expected one of open, closed, "
                                         r"timeout"):
        DRAMController("DDR4-3200", row_policy="lazy")
    with pytest.raises(ValueError, match=r"timeout=0: expected an int >= 1 cycle"):
        DRAMController("DDR4-3200", row_policy="timeout", row_timeout=0)
    with pytest.raises(ValueError, match=r"max_bypass=0: expected >= 1"):
        DRAMController("DDR4-3200", max_bypass=0)
    with pytest.raises(ValueError, match=r"policy_banks=0: expected an int >= 1"):
        DRAMController("DDR4-3200", row_policy="closed", policy_banks=0)


# ---- address mapping -------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_mapping_bijective_and_bank_group_interleaved(name):
    s = STANDARDS[name]
    rng = random.Random(1)
    addrs = rng.sample(range(1 << s.burst_addr_bits), 4000) + list(range(4096))
    mapped = {a: map_burst_address(s, a) for a in addrs}
    assert len(set(mapped.values())) == len(mapped)
    assert [map_burst_address(s, a)[0] for a in range(s.bank_groups)] == list(range(s.bank_groups))
    # STREAM arrays 2 MiB apart open rows in different banks
    n = (2 << 20) // s.burst_bytes
    banks = {map_burst_address(s, k * n)[1] for k in range(3)}
    assert len(banks) == 3
    with pytest.raises(ValueError, match="burst address"):
        map_burst_address(s, 1 << s.burst_addr_bits)


# ---- trace parsing ---------------------------------------------------------------------
def test_parse_both_formats(tmp_path):
    p = tmp_path / "t.trace"
    p.write_text("# comment\n0x40 READ 3\n128 WRITE 9\nLD 0x80\nST 64\n")
    assert dram_replay.parse_trace(p) == [(3, 0, 0x40), (9, 1, 128), (0, 0, 0x80), (0, 1, 64)]
    p.write_text("0x40 FETCH 3\n")
    with pytest.raises(ValueError, match="t.trace:1"):
        dram_replay.parse_trace(p)
    assert dram_replay.parse_size("2MiB") == 2 << 20
    with pytest.raises(ValueError, match="size"):
        dram_replay.parse_size("2 parsecs")


def test_random_read_trace_is_seeded_and_checked():
    s = get_standard("DDR4-3200")
    a = dram_replay.random_read_trace(s, 1000, 1 << 30, seed=3)
    assert a == dram_replay.random_read_trace(s, 1000, 1 << 30, seed=3)
    assert a != dram_replay.random_read_trace(s, 1000, 1 << 30, seed=4)
    assert all(c == 0 and w == 0 and x % 64 == 0 and 0 <= x < 1 << 30 for c, w, x in a)
    with pytest.raises(ValueError, match=r"n=0: expected >= 1 reads"):
        dram_replay.random_read_trace(s, 0, 1 << 30)
    with pytest.raises(ValueError, match=r"span_bytes=100: expected a positive multiple of 64"):
        dram_replay.random_read_trace(s, 10, 100)


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


def test_refresh_postpone_out_of_range_is_refused(capsys):
    from coda.cli import main
    from coda.hw.dram.controller import check_controller
    with pytest.raises(ValueError, match=r"^refresh_postpone=5: expected 0\.\.4 \(DDR5-4800: "
                                         r"JEDEC lets at most 4 REF be postponed\)$"):
        check_controller("DDR5-4800", refresh_postpone=5)
    assert main(["dram", "replay", "--standard", "DDR4-3200", "--stream-add", "64KiB",
                 "--refresh-postpone", "9"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "coda: error: refresh_postpone=9: expected 0..8 (DDR4-3200: "
                              "JEDEC lets at most 8 REF be postponed)\n")


@pytest.mark.parametrize("name,policy,refresh", [("DDR4-3200", "open", "all"),
                                                 ("DDR5-4800", "closed", "same_bank")])
def test_word_adapter_bit_exact_out_of_order(name, policy, refresh, tmp_path):
    """Random reads and writes over two rows of every bank (4096 bursts: the device model's
    store holds them without aliasing): row conflicts make the scheduler serve reads out of
    order; every response word must still be the model's, in request order."""
    s = STANDARDS[name]
    lanes = 8
    words = 4096 * s.burst_bytes // (2 * lanes)
    rng = random.Random(11)
    model = [0] * words
    ops, expect = [], []
    for w in rng.sample(range(words), 600):     # initialise the words later read
        d = rng.getrandbits(16 * lanes)
        ops.append((1, w, d, (1 << lanes) - 1))
        model[w] = d
    touched = [op[1] for op in ops]
    for _ in range(2500):
        w = rng.choice(touched)
        if rng.random() < 0.3:
            d, k = rng.getrandbits(16 * lanes), rng.getrandbits(lanes)
            ops.append((1, w, d, k))
            model[w] = sum(((d if k >> j & 1 else model[w]) >> 16 * j & 0xFFFF) << 16 * j
                           for j in range(lanes))
        else:
            ops.append((0, w, 0, 0))
            expect.append(model[w])
    cmds = tmp_path / "c.csv"
    got = dram_replay.run_words(name, lanes, ops, commands=cmds,
                                controller={"row_policy": policy, "refresh": refresh})
    assert len(got) == len(expect)
    bad = [i for i, (g, e) in enumerate(zip(got, expect)) if g != e]
    assert not bad, f"{len(bad)} wrong words, first at response {bad[0]}"
    assert dram_check.check_file(name, cmds) == []
    # row conflicts happened (PREs), so there were older conflicting reads to overtake
    log = [ln.split(",") for ln in cmds.read_text().splitlines()[1:]]
    assert sum(x[5] == "PRE" for x in log) > 100


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


def test_rank_mapping_between_bank_and_row():
    """[bank group | column burst | bank | rank | row]: a row-stripe of every bank per rank,
    then the next rank; the one-rank mapping is the R = 1 case."""
    from coda.hw.dram.mapping import AddressMapping
    s = STANDARDS["DDR4-3200"]
    stripe = s.bank_groups * s.bursts_per_row * s.banks_per_group     # 2,048 bursts
    m1, m2, m4 = (AddressMapping(s, r) for r in (1, 2, 4))
    assert (m2.addr_bits, m4.addr_bits) == (s.burst_addr_bits + 1, s.burst_addr_bits + 2)
    assert [m2.map_rank(k * stripe)[0] for k in range(4)] == [0, 1, 0, 1]
    assert [m4.map_rank(k * stripe)[0] for k in range(5)] == [0, 1, 2, 3, 0]
    for a in (0, 1, 77, stripe - 1, 5 * stripe + 3, 12345678):
        assert m1.map_rank(a) == (0, *m1.map(a))
        # rank r's addresses are the one-rank mapping's with the rank bits taken out
        lo, rest = a % stripe, a // stripe
        assert m2.map_rank(a) == (rest % 2, *m1.map(lo + rest // 2 * stripe))
    with pytest.raises(ValueError, match=r"ranks=3: expected 1, 2 or 4"):
        AddressMapping(s, 3)
    with pytest.raises(ValueError, match=r"with ranks=2 use map_rank"):
        m2.map(0)


@pytest.mark.parametrize("name", ["DDR4-3200", "DDR5-4800"])
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


@pytest.mark.parametrize("name,ranks,postpone", [("DDR4-3200", 2, 0), ("DDR5-4800", 2, 0),
                                                 ("DDR4-3200", 4, 0), ("DDR5-4800", 4, 0),
                                                 ("DDR4-3200", 2, 8)])
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


def test_ranks_options_are_checked():
    from coda.hw.dram.controller import check_controller
    with pytest.raises(ValueError, match=r"^ranks=3: expected 1, 2 or 4$"):
        check_controller("DDR4-3200", ranks=3)
    with pytest.raises(ValueError, match=r"ranks=2: refresh='same_bank' is one rank only"):
        check_controller("DDR5-4800", ranks=2, refresh="same_bank")


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


# ---- word adapter: write then read back through the device, bit-exact ------------------
@pytest.mark.parametrize("name,lanes", [("DDR4-3200", 8), ("LPDDR5-6400", 64)])
def test_word_adapter_bit_exact(name, lanes, tmp_path):
    rng = random.Random(3)
    words = 512
    model = [0] * words
    ops = []
    for w in range(words):                   # full writes, sequential (write combining)
        d = rng.getrandbits(16 * lanes)
        ops.append((1, w, d, (1 << lanes) - 1))
        model[w] = d
    expect = []
    for _ in range(1500):                    # random mix: masked writes, reads, runs
        w = rng.randrange(words)
        if rng.random() < 0.4:
            d, k = rng.getrandbits(16 * lanes), rng.getrandbits(lanes)
            ops.append((1, w, d, k))
            model[w] = sum(((d if k >> j & 1 else model[w]) >> 16 * j & 0xFFFF) << 16 * j
                           for j in range(lanes))
        else:
            for x in range(w, min(words, w + rng.choice((1, 1, 4, 9)))):
                ops.append((0, x, 0, 0))
                expect.append(model[x])
    cmds = tmp_path / "c.csv"
    got = dram_replay.run_words(name, lanes, ops, commands=cmds)
    assert len(got) == len(expect)
    bad = [i for i, (g, e) in enumerate(zip(got, expect)) if g != e]
    assert not bad, f"{len(bad)} wrong words, first at response {bad[0]}"
    assert dram_check.check_file(name, cmds) == []


def test_options_equal_to_the_defaults_share_one_build():
    """The build key holds every controller option with its default filled in: options given
    at their default values name the same model (test_word_adapter_bit_exact's DDR4-3200
    word model, cached)."""
    default = dram_replay.build_model("DDR4-3200", top="word")
    explicit = dram_replay.build_model("DDR4-3200", top="word", controller={
        "row_policy": "open", "refresh": "all", "max_bypass": 1, "write_high": 24})
    assert explicit == default
    assert dram_replay.build_model("DDR4-3200", controller={"max_bypass": 1}) == \
        dram_replay.build_model("DDR4-3200")


def test_replay_input_errors_are_clear(tmp_path):
    p = tmp_path / "bin.trace"
    p.write_bytes(b"0x40 READ 3\n\xff\xfe\x00\n")
    with pytest.raises(ValueError, match=r"bin.trace:2: not a text trace"):
        dram_replay.parse_trace(p)
    # a far-future request would tick for hours: refused before building or running
    with pytest.raises(ValueError, match=r"cycle 10000000000000.*--max-cycles"):
        dram_replay.run_requests("DDR4-3200", [(0, 0, 0), (10**13, 0, 64)])
    # a bound below one cycle would run unbounded (0) or wrap around (negative)
    for bad in (0, -5):
        with pytest.raises(ValueError, match=f"max_cycles={bad}: expected >= 1"):
            dram_replay.run_requests("DDR4-3200", [(0, 0, 0)], max_cycles=bad)
    # an unwritable command trace fails up front, naming the path
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="file"):
        dram_replay.run_requests("DDR4-3200", [(0, 0, 0)], commands=blocker / "cmds.csv")
    # a long bad line is quoted only in part: the error stays one short line
    p.write_text("0x40 READ 3\n" + "x" * 1000 + "\n")
    with pytest.raises(ValueError) as err:
        dram_replay.parse_trace(p)
    assert str(err.value) == f"{p}:2: '{'x' * 60}...': expected {dram_replay._FORMATS}"
    # an empty or comments-only trace names its path
    for text in ("", "# nothing here\n\n"):
        p.write_text(text)
        with pytest.raises(ValueError, match=f"^{re.escape(str(p))}: empty trace: expected "
                                             f"at least one request$"):
            dram_replay.parse_trace(p)
    # reading is line-bounded: a huge line is refused at its number, not read into memory
    p.write_text("0x40 READ 3\n" + "0" * (dram_replay.MAX_LINE + 1))
    with pytest.raises(ValueError, match=r"bin.trace:2: line longer than 4096 characters"):
        dram_replay.parse_trace(p)
    p.write_text("0x40 READ 3\n" + "LD " + "0" * (dram_replay.MAX_LINE - 3) + "\r\n")
    assert dram_replay.parse_trace(p) == [(3, 0, 0x40), (0, 0, 0)]   # 4096 characters: fine
    if Path("/dev/zero").exists():
        with pytest.raises(ValueError, match=r"/dev/zero:1: line longer than 4096"):
            dram_replay.parse_trace("/dev/zero")
    # the request count alone can make a run too long: each burst takes nBL cycles of the
    # data bus, so 30 requests need >= 120 DDR4 cycles (refused before building or running)
    with pytest.raises(ValueError, match=r"30 requests need at least 120 DRAM cycles "
                                         r"\(4 per burst\), more than max_cycles=100"):
        dram_replay.run_requests("DDR4-3200", [(0, 0, 64 * k) for k in range(30)],
                                 max_cycles=100)
    # the model's command-log writes fail silently: a log shorter than its statistics imply
    # (header + RD/WR/REF + an ACT per miss) is refused and not copied to the destination
    short, dest = tmp_path / "model.csv", tmp_path / "cmds.csv"
    short.write_text("cycle,channel,rank,bankgroup,bank,command,row,column\n2,0,0,0,0,ACT,0,0\n")
    raw = {"reads": 2, "writes": 0, "refreshes": 0, "row_misses": 1, "row_conflicts": 0}
    with pytest.raises(ValueError, match=r"cmds.csv: the model wrote 2 command lines, expected "
                                         r"at least 4"):
        dram_replay._copy_command_trace(short, dest, raw)
    assert not dest.exists()


def test_replay_cli_names_a_missing_trace(tmp_path, capsys):
    """The CLI's one-line error for a missing file is ``PATH: reason`` (no exception name)."""
    from coda.cli import main
    missing = tmp_path / "none.trace"
    assert main(["dram", "replay", "--standard", "DDR4-3200", "--trace", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"coda: error: {missing}: No such file or directory"


def _replay_cli(*args):
    from coda.cli import main
    return main(["dram", "replay", "--standard", "DDR4-3200", *map(str, args)])


def test_replay_cli_refuses_bad_paths_and_sizes_up_front(tmp_path, capsys):
    """Empty paths, a directory for --json, a full device and a huge STREAM size: exit 2 with
    one line, before any simulation (nothing printed on stdout, nothing left behind)."""
    trace = tmp_path / "t.trace"
    trace.write_text("0x0 READ 0\n")
    cases = [(["--trace", ""], "trace path '': expected a file name"),
             (["--trace", trace, "--json", ""], "json path '': expected a file name"),
             (["--trace", trace, "--commands", ""], "commands path '': expected a file name"),
             (["--trace", trace, "--json", tmp_path, "--commands", tmp_path / "c.csv"],
              f"{tmp_path}: Is a directory")]
    for args, msg in cases:
        assert _replay_cli(*args) == 2
        out, err = capsys.readouterr()
        assert (out, err.strip()) == ("", f"coda: error: {msg}")
    # 100 GiB arrays: 5 G requests; refused from the size, no request list is built
    assert _replay_cli("--stream-add", "100GiB") == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert re.search(r"5033164800 requests need at least 20132659200 DRAM cycles \(4 per burst\)"
                     r", more than the default bound 200000000: at least 1.4 h of simulation.*"
                     r"pass --max-cycles above 20132659200", err)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["t.trace"]
    # the model's command trace goes to a full device: an error, and the device stays
    if Path("/dev/full").exists():
        assert _replay_cli("--trace", trace, "--commands", "/dev/full") == 2
        assert capsys.readouterr().err.strip() == \
            "coda: error: /dev/full: No space left on device"
        assert Path("/dev/full").exists()


def test_replay_cli_failed_run_leaves_no_partial_output(tmp_path, capsys):
    """A run stopped by --max-cycles removes the command trace and JSON it created and leaves
    files that were there before as they were; a short run's time is printed in ns."""
    trace = tmp_path / "t.trace"
    trace.write_text("0x0 READ 0\n")
    cmds, res = tmp_path / "out" / "c.csv", tmp_path / "out" / "r.json"
    assert _replay_cli("--trace", trace, "--max-cycles", 10, "--commands", cmds,
                       "--json", res) == 2
    assert capsys.readouterr().err.strip() == \
        "coda: error: replay stopped at max_cycles=10 before the trace finished"
    assert not cmds.exists() and not res.exists()
    cmds.write_text("old\n")
    res.write_text("{}\n")
    assert _replay_cli("--trace", trace, "--max-cycles", 10, "--commands", cmds,
                       "--json", res) == 2
    assert cmds.read_text() == "old\n" and res.read_text() == "{}\n"
    capsys.readouterr()
    # the same trace run to the end: complete outputs, and "DRAM cycles N (T ns)"
    assert _replay_cli("--trace", trace, "--commands", cmds, "--json", res) == 0
    out = capsys.readouterr().out
    got = json.loads(res.read_text())
    cycles = got["dram_cycles"]
    assert f"  DRAM cycles        {cycles} ({cycles * 0.625:.1f} ns)\n" in out
    assert cmds.read_text().splitlines()[1:] == ["2,0,0,0,0,ACT,0,0",
                                                 f"{2 + get_standard('DDR4-3200').tRCD},0,0,0,0,"
                                                 f"RD,0,0"]


def test_cli_reports_a_failed_tool_in_one_message(tmp_path, capsys, monkeypatch):
    """A tool that fails under a command (here the replay model) gives exit 1 and its name,
    status and output tail, no traceback; an error of ours (a plain RuntimeError) still
    raises with its traceback."""
    import subprocess

    from coda.cli import main

    def crash(*a, **k):
        raise subprocess.CalledProcessError(134, ["/b/dram/Vreplay", "+trace=t.hex"],
                                            stderr="%Error: replay.sv:12: assertion failed\n")

    monkeypatch.setattr(dram_replay, "run_requests", crash)
    assert main(["dram", "replay", "--standard", "DDR4-3200", "--stream-add", "64KiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("coda: error: Vreplay exited with status 134; the end of its output:")
    assert "assertion failed" in err and "Traceback" not in err

    def bug(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(dram_replay, "run_requests", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["dram", "replay", "--standard", "DDR4-3200", "--stream-add", "64KiB"])


def test_replay_cli_ranks_choices(capsys):
    with pytest.raises(SystemExit) as exc:          # argparse's own exit, status 2
        _replay_cli("--stream-add", "64KiB", "--ranks", "3")
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("coda: error: argument --ranks: invalid choice: 3 (choose from 1, 2, 4)")
    assert _replay_cli("--stream-add", "64KiB", "--ranks", "2", "--standard", "DDR5-4800",
                       "--refresh", "same_bank") == 2
    assert capsys.readouterr().err == ("coda: error: ranks=2: refresh='same_bank' is one rank "
                                       "only; expected refresh='all' with more ranks\n")
