"""The DIMM-NMP with the NMEs on their own clock (``nme_mhz``): AsyncFIFO crossings to the
DRAM controllers, two clocks in the cosimulation.

One system for the module: 1 DIMM x 2 ranks of DDR5-4800 (tCK 416.667 ps, 2400 MHz), NMEs of
8 lanes (16-byte words: at the DRAM clock an NME could take twice the subchannel's 8 bytes
per tCK, so a long stream is DRAM-bound there), depth 128, 32768 words per rank. The NME
frequency is a runtime plusarg, so one Verilator build (about 2 min the first time, cached
under build/cosim/nmp-<key>) serves every frequency; each frequency starts its own simulator.
Frequencies: 2400 (the DRAM clock, asynchronous crossing), 1200, 700 (a non-integer ratio,
2400/700 = 3.43), 400, 200 and 100 MHz.

Expectations are derived, not recorded: bits equal the torch reference (which the
same-domain DIMM-NMP also equals, tests/cosim/test_cosim_nmp.py); the elapsed time follows
``t(f) ~ max(N_ideal / f, t_dram)`` with ``N_ideal`` the NME's cycles on an ideal 1-cycle
memory (the cycle model) and ``t_dram`` the DRAM-bound time (the 2400 MHz run): it scales
with 1/f well below the knee (N_ideal / t_dram, about 0.9 GHz here since passes hand over at
their last word; 1.1 GHz before) and barely moves above it;
the bytes moved do not depend on f, so DRAM utilisation falls as 1 / t(f); every command
trace is JEDEC-clean.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coda.cosim.dram.check import check_file
from coda.cosim.nmp.backend import NMPRTLBackend
from coda.cosim.toolchain import build_dir
from coda.host.nme import ops as ref
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.hw.dram.standards import get_standard
from coda.hw.nme.isa import NMEConfig
from coda.hw.nmp import check_nme_mhz

CFG = NMEConfig(lanes=8, depth=128, mem_words=1 << 15)
STD = get_standard("DDR5-4800")
FREQS = (2400.0, 1200.0, 700.0, 400.0, 200.0, 100.0)
LOG_DIR = build_dir("cosim", "pytest", "nmp_clock")
ADD_N = 2 * 8 * 3000          # residual add: 3000 words per rank and stream
SEG_T, SEG_C, SEG_K = 400, 64, 4


def _bf16(rng, *shape):
    return torch.randn(*shape, generator=rng).to(torch.bfloat16)


def _bits(t):
    return t.view(torch.int16).numpy()


@pytest.fixture(scope="module")
def runs():
    """Per frequency: the residual add's and the 4-term segment's result bits, NME cycles,
    DRAM cycles, ns and bursts moved per rank; the command logs' paths."""
    torch.set_num_threads(1)
    for old in LOG_DIR.glob("*.csv*"):
        old.unlink()
    rng = torch.Generator().manual_seed(16)
    a, b = _bf16(rng, ADD_N), _bf16(rng, ADD_N)
    cs = [_bf16(rng, SEG_T, SEG_C) for _ in range(SEG_K)]
    gates = [_bf16(rng, SEG_C) for _ in range(SEG_K)]
    x = _bf16(rng, SEG_T, SEG_C)
    out = {"want_add": ref.add(a, b), "want_seg": ref.segment(x, torch.stack(gates),
                                                                torch.stack(cs)), "logs": []}
    # NME cycles on an ideal 1-cycle memory (the cycle model; the lockstep ranks' longest)
    ideal = NMPDriver(TorchBackend(), CFG, 1, 2)
    ideal.run_op("add", a=a, b=b)
    out["ideal"] = {"add": ideal.stats["nme_cycles"]}
    for k, c in enumerate(cs):
        ideal.store(("c", k), c)
    before = ideal.stats["nme_cycles"]
    ideal.segment(x, gates, [("c", k) for k in range(SEG_K)])
    out["ideal"]["seg"] = ideal.stats["nme_cycles"] - before
    for f in FREQS:
        log = LOG_DIR / f"cmds-{int(f)}.csv"
        res = {}
        with NMPRTLBackend(STD.name, 1, 2, nme_mhz=f, commands=log) as be:
            drv = NMPDriver(be, CFG, 1, 2)
            for k, c in enumerate(cs):
                drv.store(("c", k), c)
            for name, job in (("add", lambda: drv.run_op("add", a=a, b=b)),
                              ("seg", lambda: drv.segment(x, gates,
                                                          [("c", k) for k in range(SEG_K)]))):
                job()                          # images loaded; the timed run is the second
                before = be.last.stats
                y = job()
                last = be.last
                assert last.status == [0, 0] and not last.error
                res[name] = {"bits": _bits(y), "cycles": last.cycles,
                             "rank_cycles": last.rank_cycles, "dram_cycles": last.dram_cycles,
                             "ns": last.ns, "nme_mhz": last.nme_mhz,
                             "bursts": [a_["reads"] - b_["reads"] + a_["writes"] - b_["writes"]
                                        for a_, b_ in zip(last.stats, before)],
                             "util": last.dram_utilisation(before, STD)}
        out[f] = res
        out["logs"] += sorted(LOG_DIR.glob(f"cmds-{int(f)}.csv*"))
    return out


def test_same_bits_at_every_ratio(runs):
    """Residual add and 4-term segment: the reference's bits at 2400, 1200, 700 (ratio
    3.43), 400, 200 and 100 MHz."""
    for f in FREQS:
        assert np.array_equal(runs[f]["add"]["bits"], _bits(runs["want_add"])), f
        assert np.array_equal(runs[f]["seg"]["bits"], _bits(runs["want_seg"])), f


def test_clocks_and_time_are_consistent(runs):
    """``ns`` is the NME cycles times the NME period; the DRAM cycles of the same interval are
    ns / tCK (to the edge that each clock's count may gain or lose); ranks finish within a
    few NME cycles of each other (lockstep)."""
    for f in FREQS:
        for job in ("add", "seg"):
            r = runs[f][job]
            assert r["nme_mhz"] == f
            assert r["ns"] == pytest.approx(r["cycles"] * 1000.0 / f, rel=1e-12)
            assert abs(r["dram_cycles"] - r["ns"] / STD.tCK_ns) <= 2, (f, job, r)
            assert max(r["rank_cycles"]) <= r["cycles"]
            assert max(r["rank_cycles"]) - min(r["rank_cycles"]) < 16, (f, job)


def test_time_follows_the_roofline(runs):
    """t(f) ~ max(N_ideal / f, t_dram) for the residual add and the segment: NME-bound well
    below the knee (100 -> 200 MHz halves the time; up to 400 MHz the NME cycles stay within
    15 % of the ideal-memory count: a program's DRAM latency costs more NME cycles the faster
    the NME), DRAM-bound above it (1200 -> 2400 MHz gains < 20 %, where 1/f would
    halve the time; what remains is the crossing's latency and where the refreshes fall),
    every point within [1, 1.25] of the formula; the bursts moved are the same at every f
    (within 1 %), so the DRAM utilisation is inversely proportional to the time."""
    for job in ("add", "seg"):
        r = {f: runs[f][job] for f in FREQS}
        n_ideal = runs["ideal"][job]
        t_dram = r[2400.0]["ns"]
        assert r[100.0]["ns"] / r[200.0]["ns"] == pytest.approx(2.0, rel=0.05), job
        for f in (100.0, 200.0, 400.0):
            assert 1.0 < r[f]["cycles"] / n_ideal < 1.15, (job, f, r[f]["cycles"], n_ideal)
        assert 1000.0 * n_ideal / 1200.0 < t_dram, job       # 1200 MHz is above the knee
        assert r[1200.0]["ns"] / t_dram < 1.2, job
        for f in FREQS:
            predicted = max(1000.0 * n_ideal / f, t_dram)
            assert 1.0 <= r[f]["ns"] / predicted <= 1.25, (job, f, r[f]["ns"], predicted)
        moved = [sum(r[f]["bursts"]) for f in FREQS]
        assert max(moved) <= 1.01 * min(moved), (job, moved)
        for f in FREQS:
            for util, bursts in zip(r[f]["util"], r[f]["bursts"]):
                assert util == pytest.approx(bursts * STD.nBL / r[f]["dram_cycles"])
        # DRAM-bound, the stream keeps most of the DRAM busy; at 200 MHz the NMEs cannot
        assert min(r[2400.0]["util"]) > 0.7 and max(r[200.0]["util"]) < 0.2, job


def test_command_traces_obey_jedec(runs):
    """Every rank's DRAM command log at every frequency (the simulators have ended) is free
    of timing violations for the independent checker."""
    assert len(runs["logs"]) == 2 * len(FREQS)
    for path in runs["logs"]:
        text = path.read_text()
        assert ",RD," in text and ",WR," in text
        violations = check_file(STD.name, path)
        assert violations == [], (path, [str(v) for v in violations[:5]])


@pytest.mark.parametrize("value, message", [
    (0, "nme_mhz=0: expected a positive NME clock in MHz"),
    (-200, "nme_mhz=-200: expected a positive NME clock in MHz"),
    (float("nan"), "expected a positive NME clock in MHz"),
    (float("inf"), "expected a positive NME clock in MHz"),
    ("fast", "nme_mhz='fast': expected a number of MHz"),
    (0.5, "nme_mhz=0.5: expected at least 1 MHz"),
    (2400.5, "nme_mhz=2400.5: the NME clock may not exceed the DDR5-4800 command clock "
             "(2400 MHz)"),
])
def test_bad_nme_clock_is_refused_before_any_build(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_nme_mhz(value, STD)
    with pytest.raises(ValueError, match="nme_mhz="):
        NMPRTLBackend(STD.name, 1, 2, nme_mhz=value)
    assert check_nme_mhz(None, STD) is None and check_nme_mhz("800", STD) == 800.0
    assert check_nme_mhz(2400, STD) == 2400.0


def test_cli_nme_mhz(tmp_path, capsys, runs):
    """``coda nme run --dram --nme-mhz`` runs on the clocked DIMM-NMP (the module's build)
    and reports both clocks; ``--nme-mhz`` without ``--dram`` or out of range is refused
    naming it (by ``coda run --memory ideal`` too, before its model loads); ``coda verilog
    --top dimm --nme-mhz`` writes the two-clock design (ports
    nme_clk / nme_rst, a header naming both clocks), ``--top nme --nme-mhz`` is refused."""
    from coda.cli import main
    inp, out = tmp_path / "in.npz", tmp_path / "out.npz"
    assert main(["nme", "run", "--op", "add", "--make-example", str(inp)]) == 0
    common = ["nme", "run", "--op", "add", "--inputs", str(inp), "--out", str(out),
              "--backend", "rtl", "--lanes", "8", "--depth", "128", "--mem-words", "32768",
              "--dimms", "1", "--ranks", "2"]
    capsys.readouterr()
    assert main(common + ["--dram", "DDR5-4800", "--nme-mhz", "700"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "nme_mhz=700 ns=" in line and "dram_cycles=" in line, line
    assert main(common + ["--nme-mhz", "700"]) == 2
    assert "--nme-mhz 700: only with --dram" in capsys.readouterr().err
    assert main(common + ["--dram", "DDR5-4800", "--nme-mhz", "5000"]) == 2
    assert "may not exceed the DDR5-4800 command clock" in capsys.readouterr().err
    # coda run's default memory is the DRAM-timed DIMM-NMP: the clock is refused on the
    # ideal one
    for argv, message in ((["--memory", "ideal", "--nme-mhz", "800"],
                           "--nme-mhz 800: only with --dram"),
                          (["--dram", "DDR5-4800", "--nme-mhz", "-1"],
                           "expected a positive NME clock in MHz")):
        assert main(["run", "--out", str(tmp_path / "run"), *argv]) == 2   # before the model
        assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    v = tmp_path / "dimm.v"
    assert main(["verilog", "--top", "nme", "--nme-mhz", "500", "-o", str(v)]) == 2
    assert "--nme-mhz given with --top nme" in capsys.readouterr().err
    assert main(["verilog", "--top", "dimm", "--nme-mhz", "0", "-o", str(v)]) == 2
    assert "expected a positive NME clock" in capsys.readouterr().err and not v.exists()
    assert main(["verilog", "--top", "dimm", "--lanes", "4", "--depth", "8", "--nme-mhz",
                 "700", "-o", str(v)]) == 0
    text = v.read_text()
    assert text.startswith("// clocks: clk = DDR5-4800 command clock, 2400 MHz")
    assert "nme_clk = NME clock, 700 MHz" in text.splitlines()[0]
    assert "input nme_clk;" in text and "input nme_rst;" in text


def test_dse_figures_of_a_real_run_at_two_clocks():
    """``make bench``'s design-space figures (:func:`coda.experiments.design_space.program_figures`)
    of a real run of this module's build (1 x 2 ranks, 8 lanes, depth 128) at 200 and 400 MHz,
    1024 words per stream: ns = NME cycles x the NME period (measure_nmp rounds to 0.1 ns),
    DRAM cycles = ns / tCK to an edge, elements/ns = elements / ns; both clocks are below the
    knee (8 lanes x 2 B x 400 MHz = 6.4 GB/s, a third of the rank's peak), so elements/ns
    doubles from 200 to 400 MHz but for the fixed latency of a program (within 12 %); the
    bytes moved do not depend on the clock, so utilisation and GB/s grow by the same factor."""
    from coda.cosim.nmp import measure as nmp_measure
    from coda.experiments import design_space

    words = 1024
    figs = {}
    for f in (200.0, 400.0):
        m = nmp_measure.measure_nmp(CFG, STD.name, 1, 2, stream_words=words, nme_mhz=f)
        assert m["violations"] == 0
        figs[f] = {p: design_space.program_figures(m[p], STD) for p in nmp_measure.PROGRAM_STREAMS}
    for f, per in figs.items():
        for prog, g in per.items():
            assert g["elements"] == words * CFG.lanes
            assert g["ns"] == pytest.approx(g["cycles"] * 1000.0 / f, abs=0.05)
            assert abs(g["dram_cycles"] - g["ns"] / STD.tCK_ns) <= 2, (f, prog, g)
            assert g["elements_per_ns"] == pytest.approx(g["elements"] / g["ns"], rel=1e-4)
            assert g["elements_per_cycle"] == pytest.approx(g["elements"] / g["cycles"],
                                                            abs=1e-4)
            # the program's streams cross the DRAM bus, to a burst or two (the adapter's
            # read-line reuse and write merging) and the rounding of utilisation (4 decimals)
            streams = nmp_measure.PROGRAM_STREAMS[prog]
            per_cycle = STD.burst_bytes / STD.nBL
            moved = g["utilisation"] * g["dram_cycles"] * per_cycle
            assert abs(moved - 2 * streams * g["elements"]) <= (
                2 * STD.burst_bytes + 5e-5 * g["dram_cycles"] * per_cycle), (f, prog, moved)
    for prog in nmp_measure.PROGRAM_STREAMS:
        lo, hi = figs[200.0][prog], figs[400.0][prog]
        speedup = hi["elements_per_ns"] / lo["elements_per_ns"]
        assert 1.76 <= speedup <= 2.0 + 1e-3, (prog, speedup)
        # the same bytes: the ratios agree to the rounding of utilisation (4 decimals) and
        # GB/s (2 decimals) in measure_nmp
        for key, half_ulp in (("utilisation", 5e-5), ("gbps", 5e-3)):
            rel = half_ulp / hi[key] + half_ulp / lo[key] + 1e-4
            assert hi[key] / lo[key] == pytest.approx(speedup, rel=rel), (prog, key)


def test_command_log_energy_agrees_with_the_system_model(runs):
    """The 2400 MHz run's command logs priced per command (coda.cosim.dram.energy) against
    the system model's counts of the same jobs (two residual adds, two 4-term segments per
    rank; coda.host.system.energy.dimm_dram_energy): the bursts are the same, and the totals
    differ by no more than what the model's two simplifications leave out: the ACTs beyond
    one per row (at most the log's whole ACT energy), the banks the log shows closed while
    the model holds all open (their bank-open power over the closed bank-time), and one REF
    per rank of rounding (the model's refreshes are time / tREFI)."""
    from coda.cosim.dram.energy import energy_files
    from coda.host.system.energy import dimm_dram_energy
    from coda.host.system.nme import segment_timing
    from coda.hw.dram.power import command_energy

    logs = [p for p in runs["logs"] if p.name.split(".csv")[0] == "cmds-2400"]
    got = energy_files(STD, logs)["total"]
    seg = segment_timing(SEG_T, SEG_C, SEG_K, n_ranks=2, lanes=CFG.lanes, depth=CFG.depth)
    word = 2 * CFG.lanes
    add_words = ADD_N // 2 // CFG.lanes            # per rank and stream
    reads = 2 * 2 * (2 * add_words * word + seg.rank_dram_bytes - seg.rank_write_bytes)
    writes = 2 * 2 * (add_words * word + seg.rank_write_bytes)
    assert (got["reads"], got["writes"]) == (reads // STD.burst_bytes, writes // STD.burst_bytes)
    seconds = got["rank_s"] / 2
    model = dimm_dram_energy(STD, read_bytes=reads, write_bytes=writes, ranks=2,
                             seconds=seconds, busy_s=seconds)
    e = command_energy(STD)
    bound = (got["act_pre_j"] + (STD.banks * got["rank_s"] - got["bank_open_s"])
             * e.bank_open_w + 2 * e.refresh_pj * 1e-12)
    assert abs(model["total_j"] - got["total_j"]) <= bound
    assert model["read_j"] + model["write_j"] == pytest.approx(got["read_j"] + got["write_j"])
