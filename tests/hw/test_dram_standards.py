"""DRAM standards and address mapping, no simulation: the presets' numbers and their
consistency, the controller's parameter checks, the burst address mapping (one rank and the
ranks of a channel), trace parsing and the seeded random read trace."""

import random

import pytest

from coda.cosim.dram import replay as dram_replay
from coda.hw.dram.mapping import map_burst_address
from coda.hw.dram.standards import STANDARDS, get_standard
from dram_cases import ALL


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


# ---- ranks of one channel: mapping and options ----------------------------------------
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


def test_ranks_options_are_checked():
    from coda.hw.dram.controller import check_controller
    with pytest.raises(ValueError, match=r"^ranks=3: expected 1, 2 or 4$"):
        check_controller("DDR4-3200", ranks=3)
    with pytest.raises(ValueError, match=r"ranks=2: refresh='same_bank' is one rank only"):
        check_controller("DDR5-4800", ranks=2, refresh="same_bank")
