"""Command-level DRAM energy (coda.hw.dram.power, coda.cosim.dram.energy, the system model's
coda.host.system.energy.dimm_dram_energy).

The hand computation below is written out from the data sheet's numbers (Micron 16Gb DDR5
MT60B2G8, x8, DDR5-4800, Table 6; VDD 1.1 V, VPP 1.8 V) and JESD79-5's DDR5-4800 timings in
tCK (tRC 111, tRAS 77, nBL 8, tRFC 708, tREFI 9360; tCK = 1/2.4 ns), not from the code's
tables: mA x V x ns = pJ; a rank is 4 x8 devices of 32 banks.
"""

from __future__ import annotations

import pytest

from coda.cosim.dram.check import HEADER
from coda.cosim.dram.energy import count_commands, energy_commands
from coda.hw.dram.power import command_energy, dram_energy, get_power

TCK = 1 / 2.4        # ns
DEV, BANKS = 4, 32   # x8 devices of a 32-bit subchannel; 8 bank groups x 4 banks
VDD, VPP = 1.1, 1.8
IDD0, IDD2N, IDD3N, IDD4R, IDD4W, IDD5B = 103, 92, 142, 377, 349, 277
IPP0, IPP2N, IPP3N, IPP4R, IPP4W, IPP5B = 8, 6, 7, 9, 36, 28
TRC, TRAS, NBL, TRFC = 111, 77, 8, 708


def _row(cycle, command, bg="", ba="", row="", column=""):
    return dict(zip(HEADER, map(str, (cycle, 0, 0, bg, ba, command, row, column))))


def _hand():
    """Per-command energies (pJ) and background powers (mW per bank-open / whole rank)."""
    def i1(i2n, i3n):                   # one bank of 32 open
        return i2n + (i3n - i2n) / BANKS
    act = DEV * TCK * (VDD * (IDD0 * TRC - (i1(IDD2N, IDD3N) * TRAS + IDD2N * (TRC - TRAS)))
                       + VPP * (IPP0 * TRC - (i1(IPP2N, IPP3N) * TRAS + IPP2N * (TRC - TRAS))))
    rd = DEV * TCK * NBL * (VDD * (IDD4R - IDD3N) + VPP * (IPP4R - IPP3N))
    wr = DEV * TCK * NBL * (VDD * (IDD4W - IDD3N) + VPP * (IPP4W - IPP3N))
    ref = DEV * TCK * TRFC * (VDD * (IDD5B - IDD3N) + VPP * (IPP5B - IPP3N))
    pre_mw = DEV * (VDD * IDD2N + VPP * IPP2N)
    bank_mw = DEV * (VDD * (IDD3N - IDD2N) + VPP * (IPP3N - IPP2N)) / BANKS
    return act, rd, wr, ref, pre_mw, bank_mw


def test_command_energies_from_the_datasheet():
    act, rd, wr, ref, pre_mw, bank_mw = _hand()
    e = command_energy("DDR5-4800")
    assert (e.devices, e.banks) == (DEV, BANKS)
    assert e.act_pre_pj == pytest.approx(act, rel=1e-12)
    assert e.read_pj == pytest.approx(rd, rel=1e-12)
    assert e.write_pj == pytest.approx(wr, rel=1e-12)
    assert e.refresh_pj == pytest.approx(ref, rel=1e-12)
    assert e.precharged_w == pytest.approx(pre_mw * 1e-3, rel=1e-12)
    assert e.bank_open_w == pytest.approx(bank_mw * 1e-3, rel=1e-12)
    # a 64-byte RD burst: a few pJ per bit, as DRAM core energy is (not a pasted figure: the
    # order of magnitude the flat constant this replaces claimed)
    assert 2 < e.read_pj / 512 < 12


def test_small_trace_against_hand_computation():
    """One rank: ACT, RD, WR, PRE of one bank, two banks open a while, a REF, to cycle 3000."""
    rows = [_row(0, "ACT", 0, 0, 5), _row(34, "RD", 0, 0, 5, 0), _row(60, "WR", 0, 0, 5, 16),
            _row(70, "ACT", 1, 2, 9), _row(111, "PRE", 0, 0), _row(200, "PREA"),
            _row(300, "REF"), _row(1500, "ACT", 3, 1, 7), _row(1600, "RD", 3, 1, 7, 0)]
    act, rd, wr, ref, pre_mw, bank_mw = _hand()
    end = 3000
    # bank-cycles: bank (0,0) 0..111, bank (1,2) 70..200, every bank for tRFC after the REF,
    # bank (3,1) 1500..end (still open: its ACT charged, its PRE to come)
    bank_cycles = 111 + (200 - 70) + BANKS * TRFC + (end - 1500)
    want = {"act_pre": 3 * act, "read": 2 * rd, "write": wr, "refresh": ref,
            "background": (pre_mw * end + bank_mw * bank_cycles) * TCK}
    got = energy_commands("DDR5-4800", rows, end_cycle=end)
    rank = got["ranks"]["c0r0"]
    assert (rank["acts"], rank["reads"], rank["writes"], rank["refreshes"]) == (3, 2, 1, 1)
    for part, pj in want.items():
        assert rank[f"{part}_pj"] == pytest.approx(pj, rel=1e-12), part
        assert rank[f"{part}_j"] == pytest.approx(pj * 1e-12, rel=1e-12), part
    assert rank["total_pj"] == pytest.approx(sum(want.values()), rel=1e-12)
    split = got["split_j"]
    assert split["read_write"] == pytest.approx((2 * rd + wr) * 1e-12, rel=1e-12)
    assert got["total"]["total_j"] == pytest.approx(rank["total_j"], rel=1e-12)


def test_ranks_are_apart_and_refresh_is_clipped_at_the_end():
    rows = [_row(0, "ACT", 0, 0, 1), dict(_row(0, "ACT", 0, 0, 1), rank="1"),
            _row(100, "PRE", 0, 0), _row(500, "REF")]
    counts = count_commands("DDR5-4800", rows, end_cycle=600)
    assert counts[(0, 0)].bank_open_cycles == 100 + BANKS * 100      # tRFC cut at 600
    assert counts[(0, 1)].bank_open_cycles == 600                    # open to the end
    assert counts[(0, 1)].acts == 1 and counts[(0, 1)].cycles == 600


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same-bank refresh"):
        energy_commands("DDR5-4800", [_row(10, "REFsb", ba=1)])
    with pytest.raises(ValueError, match="end_cycle=5"):
        energy_commands("DDR5-4800", [_row(10, "ACT", 0, 0, 1)], end_cycle=5)
    with pytest.raises(ValueError, match="cycle order"):
        energy_commands("DDR5-4800", [_row(10, "ACT", 0, 0, 1), _row(5, "PRE", 0, 0)])
    with pytest.raises(ValueError, match="no device currents for DDR4-3200"):
        get_power("DDR4-3200")
    with pytest.raises(ValueError, match="acts=-1"):
        dram_energy("DDR5-4800", acts=-1, reads=0, writes=0, refreshes=0, rank_s=1,
                    bank_open_s=0)
    with pytest.raises(ValueError, match="bank_open_s"):
        dram_energy("DDR5-4800", acts=0, reads=0, writes=0, refreshes=0, rank_s=1,
                    bank_open_s=33)
