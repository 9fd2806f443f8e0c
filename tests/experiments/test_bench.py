"""make bench's design-space sweep without measuring (the measurements themselves run in
`make bench`): the rows :func:`coda.experiments.design_space.dse_rows` makes of sweep records, their
knees, the tables and the plot of :mod:`coda.experiments.design_space_report` (checked cell by cell
and line by line against those rows), performance per area from synthesis reports
(:mod:`coda.experiments.synth_area`), the NME units (:mod:`coda.cosim.nme.units`) and the options
of ``coda bench`` (:mod:`coda.experiments.bench`)."""

import json
import math

import pytest

from coda.cli import main as coda_main
from coda.cosim.nme import units as nme_units
from coda.cosim.nmp import measure as nmp_measure
from coda.experiments import bench
from coda.experiments import design_space
from coda.experiments import design_space_report
from coda.experiments import synth_area
from coda.hw.dram.standards import get_standard
from coda.hw.nme.isa import MAX_ADD_LATENCY, MAX_MUL_LATENCY

DRAM = "DDR5-4800"
STREAM_BYTES = 4096


def _records():
    """Sweep records as the engine returns them (coda.sweep: params, figures, timing,
    status), with the figures :func:`design_space.dse_point` derives from a measurement (cycles of
    a program over ``elements`` per stream): here cycles from a simple bound (the slower of
    the NME port and the DRAM peak, plus a turnaround per stream block), so every point
    differs. One failed point, which the rows leave out."""
    std = get_standard(DRAM)
    peak = std.burst_bytes / std.nBL
    records = []
    for lanes in (1, 4, 16):
        for depth in (16, 256):
            figures = {}
            for prog, streams in nmp_measure.PROGRAM_STREAMS.items():
                elements = STREAM_BYTES // 2
                cycles = (max(math.ceil(streams * elements / lanes),
                              math.ceil(2 * streams * elements / peak))
                          + 40 * math.ceil(elements / (lanes * depth)))
                moved = 2 * streams * elements
                cpe = round(cycles / elements, 3)
                figures.update({f"{prog}.elements": elements, f"{prog}.cycles": cycles,
                                f"{prog}.cycles_per_element": cpe,
                                f"{prog}.elements_per_cycle": round(1 / cpe, 4),
                                f"{prog}.utilisation": round(moved / (cycles * peak), 4),
                                f"{prog}.gbps": round(moved / (cycles * std.tCK_ns), 2)})
            records.append({"params": {"lanes": lanes, "depth": depth, "fmt": "bf16",
                                       "dram": DRAM, "stream_bytes": STREAM_BYTES},
                            "status": "ok", "figures": figures,
                            "timing": {"build_seconds": 30.0 + lanes,
                                       "residual_add.sim_cycles_per_s": 1e5 * depth,
                                       "segment4.sim_cycles_per_s": 2e5 * depth}})
    records.append({"params": {"lanes": 32, "depth": 16, "fmt": "bf16", "dram": DRAM,
                               "stream_bytes": STREAM_BYTES},
                    "status": "failed", "figures": {}, "timing": None})
    return records


STDS = ("DDR5-4800", "DDR4-3200")
LANES = (1, 2, 4, 8, 16, 32)
#: clocks per standard (None: the same-domain NME, on the DRAM clock)
CLOCKS = {"DDR5-4800": (None, 100.0, 400.0, 1200.0), "DDR4-3200": (None, 100.0, 800.0)}
SAT = 0.88          # DRAM-bound utilisation of the synthetic rank
EFF = 0.9           # share of the NME port's word per cycle the synthetic NME uses


def _clock_util(std, lanes, mhz):
    """Utilisation of the synthetic rank: the NME port's demand (lanes x 2 B x f x EFF) over
    the rank's peak, capped at SAT; a deeper buffer gains nothing here (ties: depth 16)."""
    f = 1000.0 / std.tCK_ns if mhz is None else mhz
    return min(lanes * 2 * f * 1e-3 * EFF / std.peak_gbps, SAT)


def _clock_records():
    """Version-2 sweep records (with ``nme_mhz`` and ns) of a roofline rank: every (standard,
    clock, lanes, depth 16 / 256), the depth-256 point 2 % slower than the depth-16 one (so
    the best depth is 16), figures as :func:`design_space.dse_point` derives them."""
    recs = []
    for name in STDS:
        std = get_standard(name)
        for mhz in CLOCKS[name]:
            for lanes in LANES:
                for depth in (16, 256):
                    figures = {"nme_mhz_effective": mhz or 1000.0 / std.tCK_ns}
                    for prog, streams in nmp_measure.PROGRAM_STREAMS.items():
                        elements = STREAM_BYTES // 2
                        moved = 2 * streams * elements
                        u = _clock_util(std, lanes, mhz) * (0.98 if depth == 256 else 1.0)
                        dram_cycles = math.ceil(moved / (u * std.burst_bytes / std.nBL))
                        ns = dram_cycles * std.tCK_ns
                        cycles = math.ceil(ns * (mhz or 1000.0 / std.tCK_ns) / 1000.0)
                        figures.update({
                            f"{prog}.elements": elements, f"{prog}.cycles": cycles,
                            f"{prog}.dram_cycles": dram_cycles, f"{prog}.ns": ns,
                            f"{prog}.elements_per_ns": elements / ns,
                            f"{prog}.cycles_per_element": cycles / elements,
                            f"{prog}.elements_per_cycle": elements / cycles,
                            f"{prog}.utilisation": moved / (dram_cycles * std.burst_bytes
                                                            / std.nBL),
                            f"{prog}.gbps": moved / ns})
                    recs.append({"params": {"lanes": lanes, "depth": depth, "fmt": "bf16",
                                            "dram": name, "stream_bytes": STREAM_BYTES,
                                            "nme_mhz": mhz or 0.0},
                                 "status": "ok", "figures": figures,
                                 "timing": {"build_seconds": 1.0}})
    return recs


def test_dse_rows_are_the_records_figures():
    records = _records()
    rows = design_space.dse_rows(records)
    ok = [r for r in records if r["status"] == "ok"]
    assert len(rows) == len(ok) * len(nmp_measure.PROGRAM_STREAMS)
    for row in rows:
        rec, = [r for r in ok if (r["params"]["lanes"], r["params"]["depth"])
                == (row["lanes"], row["depth"])]
        prog = row["program"]
        for key in ("elements", "cycles", "cycles_per_element", "elements_per_cycle",
                    "utilisation", "gbps"):
            assert row[key] == rec["figures"][f"{prog}.{key}"], (prog, key)
        assert row["sim_cycles_per_s"] == rec["timing"][f"{prog}.sim_cycles_per_s"]
        assert row["build_seconds"] == rec["timing"]["build_seconds"]
        # a version-1 record (no nme_mhz, no ns): the NME on the DRAM clock, 1 cycle = 1 tCK
        std = get_standard(DRAM)
        assert row["dram"] == DRAM and row["nme_mhz"] is None
        assert row["dram_cycles"] == row["cycles"]
        assert row["ns"] == pytest.approx(row["cycles"] * std.tCK_ns, abs=0.05)
        assert row["elements_per_ns"] == pytest.approx(row["elements"] / row["ns"], rel=1e-4)


def test_sweep_table_cells_are_the_rows(capsys, monkeypatch):
    """One line per (standard, clock, lanes, depth) in order, each program's cells its row's
    elements per ns (3 decimals), utilisation (percent, 1 decimal) and GB/s (2 decimals); a
    program without a row shows '-'."""
    monkeypatch.setenv("COLUMNS", "240")        # rich: no wrapped cells
    rows = design_space.dse_rows(_records())
    missing = rows.pop()                         # the last point's segment4
    assert missing["program"] == "segment4"
    design_space_report.print_sweep(rows)
    out = capsys.readouterr().out
    assert "DIMM-NMP design space (per rank)" in out
    lines = [line.split("│")[1:-1] for line in out.splitlines() if line.count("│") == 11]
    table = [[cell.strip() for cell in cells] for cells in lines]
    by = {(r["lanes"], r["depth"], r["program"]): r for r in rows}
    points = sorted({(r["lanes"], r["depth"]) for r in rows} | {(missing["lanes"],
                                                                missing["depth"])})
    expected = []
    for lanes, depth in points:
        cells = [DRAM, "dram", str(lanes), str(depth)]
        for prog in ("residual_add", "segment4"):
            r = by.get((lanes, depth, prog))
            cells += (["-"] * 3 if r is None else
                      [f"{r['elements_per_ns']:.3f}", f"{100 * r['utilisation']:.1f} %",
                       f"{r['gbps']:.2f}"])
        expected.append(cells)
    assert table == expected
    assert table[-1][-3:] == ["-", "-", "-"]
    assert len({tuple(row[4:]) for row in table}) == len(table)   # the points all differ


def test_sweep_plot_draws_the_rows(tmp_path, monkeypatch):
    """Per standard and program (columns) elements per ns (top) and DRAM utilisation in %
    (bottom) against lanes, one line per NME clock through the best depth's rows; the DRAM
    peak / (2 B x streams) of the standard as the ceiling."""
    import matplotlib.pyplot as plt
    from PIL import Image

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    rows = design_space.dse_rows(_clock_records())
    design_space_report.plot_sweep(rows, tmp_path / "dse.png")
    fig, = figures
    assert len(fig.axes) == 4 * len(STDS)
    for s, name in enumerate(sorted(STDS)):
        std = get_standard(name)
        for col, prog in enumerate(("residual_add", "segment4")):
            streams = nmp_measure.PROGRAM_STREAMS[prog]
            top, bottom = fig.axes[4 * s + col], fig.axes[4 * s + 2 + col]
            assert top.get_title() == f"{name} {prog}"
            for ax, value in ((top, lambda r: r["elements_per_ns"]),
                              (bottom, lambda r: 100 * r["utilisation"])):
                assert ax.get_xscale() == "log"
                lines = {line.get_label(): line for line in ax.get_lines()}
                for mhz in CLOCKS[name]:
                    # best depth by hand: the most elements per ns over the depths
                    pts = {}
                    for r in rows:
                        if (r["dram"], r["nme_mhz"], r["program"]) == (name, mhz, prog):
                            if (r["lanes"] not in pts
                                    or r["elements_per_ns"] > pts[r["lanes"]]["elements_per_ns"]):
                                pts[r["lanes"]] = r
                    line = lines.pop("same domain" if mhz is None else f"{mhz:g} MHz")
                    assert list(line.get_xdata()) == sorted(pts)
                    assert list(line.get_ydata()) == pytest.approx(
                        [value(pts[n]) for n in sorted(pts)], rel=1e-12)
                if ax is top:
                    ceiling = lines.pop(f"DRAM peak / ({streams} x 2 B)")
                    assert list(ceiling.get_ydata()) == [std.peak_gbps / (2 * streams)] * 2
                assert lines == {}          # nothing else drawn
    width, height = fig.get_size_inches() * 120
    with Image.open(tmp_path / "dse.png") as img:
        assert img.format == "PNG" and img.size == (round(width), round(height))


def test_rank_memory_holds_the_four_streams():
    for words in (1, 16383, 16384, 131072):
        mem = nmp_measure.mem_words(words)
        assert mem >= 4 * words + 1 and mem & (mem - 1) == 0 and mem >= 1024


def test_clock_rows_keep_standard_clock_and_figures():
    records = _clock_records()
    rows = design_space.dse_rows(records)
    assert len(rows) == len(records) * len(nmp_measure.PROGRAM_STREAMS)
    for row in rows:
        rec, = [r for r in records if r["params"]["dram"] == row["dram"]
                and (r["params"]["nme_mhz"] or None) == row["nme_mhz"]
                and (r["params"]["lanes"], r["params"]["depth"]) == (row["lanes"], row["depth"])]
        for key in design_space.ROW_KEYS:
            assert row[key] == rec["figures"][f"{row['program']}.{key}"], key
        assert row["nme_mhz_effective"] == rec["figures"]["nme_mhz_effective"]


def test_knee_per_clock_follows_the_roofline():
    """Expected knees from the synthetic rank's closed form, not from the rows: where the
    widest NME reaches SAT (lanes_max x f x 2 B x EFF >= SAT x peak) the knee is the fewest
    lanes with lanes x f >= tol x SAT x peak / (2 B x EFF), DRAM-bound; elsewhere every
    lanes count is NME-bound, the best is the widest and the knee is the fewest lanes >= tol x
    lanes_max (the widest, with powers of two), and ``lanes_to_saturate`` is
    ceil(tol x SAT x peak / (2 B x f x EFF))."""
    tol = 0.95
    ks = design_space.knees(design_space.dse_rows(_clock_records()), tol)
    assert len(ks) == sum(len(c) for c in CLOCKS.values()) * len(nmp_measure.PROGRAM_STREAMS)
    seen = set()
    for k in ks:
        std = get_standard(k["dram"])
        f = k["nme_mhz"] or 1000.0 / std.tCK_ns
        need = tol * SAT * std.peak_gbps / (2 * f * 1e-3 * EFF)     # lanes x f >= ...
        reach = max(LANES) * 2 * f * 1e-3 * EFF / std.peak_gbps >= SAT
        if reach:
            want = min(n for n in LANES if n >= need - 1e-9)
            assert k["saturated"] and k["lanes_to_saturate"] is None
            assert k["best_utilisation"] == pytest.approx(SAT, rel=1e-3)   # whole DRAM cycles
        else:
            want = max(LANES)
            assert not k["saturated"]
            assert k["lanes_to_saturate"] == math.ceil(need - 1e-9)
            assert k["best_utilisation"] == pytest.approx(
                _clock_util(std, max(LANES), k["nme_mhz"]), rel=1e-3)
        assert k["knee_lanes"] == want, k
        assert k["knee_depth"] == 16          # the faster depth of the records
        assert k["knee_utilisation"] == pytest.approx(_clock_util(std, want, k["nme_mhz"]),
                                                      rel=1e-3)
        assert k["rank_best"] == pytest.approx(SAT, rel=1e-3)
        assert k["tolerance"] == tol
        seen.add((k["dram"], k["nme_mhz"], k["program"]))
    assert seen == {(s, c, p) for s in STDS for c in CLOCKS[s] for p in nmp_measure.PROGRAM_STREAMS}
    # at 100 MHz nothing saturates either rank, at the DRAM clock both do
    assert {k["saturated"] for k in ks if k["nme_mhz"] == 100.0} == {False}
    assert {k["saturated"] for k in ks if k["nme_mhz"] is None} == {True}
    with pytest.raises(ValueError, match="tolerance"):
        design_space.knees([], 0)
    with pytest.raises(ValueError, match="tolerance"):
        design_space.knees([], 1.5)


def test_knee_tolerance_moves_the_knee():
    """A looser tolerance never gives more lanes; tolerance 1 gives the first lanes count at
    the best utilisation itself."""
    rows = design_space.dse_rows(_clock_records())
    strict = {(k["dram"], k["nme_mhz"], k["program"]): k["knee_lanes"]
              for k in design_space.knees(rows, 1.0)}
    loose = {(k["dram"], k["nme_mhz"], k["program"]): k["knee_lanes"]
             for k in design_space.knees(rows, 0.5)}
    assert all(loose[key] <= strict[key] for key in strict)
    assert any(loose[key] < strict[key] for key in strict)
    for k in design_space.knees(rows, 1.0):
        pts = [r for r in design_space.best_rows(rows) if (r["dram"], r["nme_mhz"], r["program"])
               == (k["dram"], k["nme_mhz"], k["program"])]
        top = max(r["utilisation"] for r in pts)
        assert k["knee_lanes"] == min(r["lanes"] for r in pts if r["utilisation"] == top)


def _write_report(root, target, lanes, fmt, res, units=None):
    d = root / "points" / f"{target}_l{lanes}_{fmt}{'_u' + units if units else ''}"
    d.mkdir(parents=True)
    cfg = {"lanes": lanes, "fmt": fmt}
    if units:
        cfg.update(zip(("mul_latency", "add_latency", "operand_latency"), map(int, units[:3])))
    (d / "report.json").write_text(json.dumps({"config": cfg, "target": target, target: res}))


def test_perf_per_area_from_synth_reports(tmp_path):
    """Areas come from the synthesis sweep's report.json files of the format asked for;
    perf/area = elements/ns / (area / 1000); no area, no key; no reports, {}."""
    assert synth_area.synth_areas(tmp_path / "none") == {}
    _write_report(tmp_path, "generic", 4, "bf16", {"cells_total": 80_000})
    _write_report(tmp_path, "generic", 8, "bf16", {"cells_total": 160_000})
    _write_report(tmp_path, "ecp5", 8, "bf16", {"lut4": 20_000, "fmax_mhz": 64.3})
    _write_report(tmp_path, "generic", 8, "fp16", {"cells_total": 1})
    (tmp_path / "points" / "broken").mkdir()
    (tmp_path / "points" / "broken" / "report.json").write_text("{not json")
    areas = synth_area.synth_areas(tmp_path, "bf16")
    assert areas == {4: {"cells_total": 80_000},
                     8: {"cells_total": 160_000, "lut4": 20_000, "fmax_mhz": 64.3}}
    rows = [{"lanes": 2, "elements_per_ns": 1.0}, {"lanes": 4, "elements_per_ns": 2.0},
            {"lanes": 8, "elements_per_ns": 3.0}]
    out = synth_area.perf_per_area(rows, areas)
    assert "per_kcell" not in out[0] and "per_klut" not in out[0]
    assert out[1]["per_kcell"] == pytest.approx(2.0 / 80) and "per_klut" not in out[1]
    assert out[2]["per_kcell"] == pytest.approx(3.0 / 160)
    assert out[2]["per_klut"] == pytest.approx(3.0 / 20)
    assert rows[0] == {"lanes": 2, "elements_per_ns": 1.0}       # inputs untouched
    knee = synth_area.perf_per_area([{"knee_lanes": 8, "knee_elements_per_ns": 4.0}], areas)[0]
    assert knee["per_klut"] == pytest.approx(4.0 / 20)


def test_synth_areas_are_those_of_the_units_asked_for(tmp_path):
    """Reports of pipelined NMEs (their config's latencies) count only for those units; a
    report without latencies is the combinational 0,0,0; bad units are refused by name."""
    _write_report(tmp_path, "ecp5", 8, "bf16", {"lut4": 15_000, "fmax_mhz": 24.6})
    _write_report(tmp_path, "ecp5", 8, "bf16", {"lut4": 16_482, "fmax_mhz": 100.88}, "451")
    _write_report(tmp_path, "ecp5", 4, "bf16", {"lut4": 9_000, "fmax_mhz": 101.0}, "451")
    assert synth_area.synth_areas(tmp_path, "bf16") == {8: {"lut4": 15_000, "fmax_mhz": 24.6}}
    assert synth_area.synth_areas(tmp_path, "bf16", "4,5,1") == synth_area.synth_areas(
        tmp_path, "bf16", (4, 5, 1)) == {4: {"lut4": 9_000, "fmax_mhz": 101.0},
                                         8: {"lut4": 16_482, "fmax_mhz": 100.88}}
    assert synth_area.synth_areas(tmp_path, "bf16", "3,5,1") == {}
    # another placer seed of the same netlist: the best Fmax counts, whatever the order
    _write_report(tmp_path, "ecp5", 8, "bf16", {"lut4": 16_482, "fmax_mhz": 96.15}, "451_s3")
    _write_report(tmp_path, "ecp5", 4, "bf16", {"lut4": 9_000, "fmax_mhz": 103.0}, "451_s3")
    assert synth_area.synth_areas(tmp_path, "bf16", "4,5,1") == {
        4: {"lut4": 9_000, "fmax_mhz": 103.0}, 8: {"lut4": 16_482, "fmax_mhz": 100.88}}
    assert synth_area.config_units({"lanes": 8}) == "0,0,0"
    with pytest.raises(ValueError, match="units '9,5,1': expected M,A,O"):
        synth_area.synth_areas(tmp_path, "bf16", "9,5,1")


def test_knee_table_says_when_there_is_no_area(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "260")
    ks = design_space.knees(design_space.dse_rows(_clock_records()))
    design_space_report.print_knees(ks, {})
    out = capsys.readouterr().out
    assert "no synthesis results" in out and "make synth-sweep" in out
    lines = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()
             if line.count("│") == 13]
    assert len(lines) == len(ks)
    for cells, k in zip(lines, ks):
        assert cells[0] == k["dram"] and cells[2] == k["program"]
        assert cells[3] == str(k["knee_lanes"])
        assert cells[8] == ("yes" if k["saturated"] else "no")
        assert cells[10:] == ["-", "-"]
    design_space_report.print_knees(ks, {8: {"cells_total": 1000}})
    out = capsys.readouterr().out
    assert "no synthesis results" not in out


def test_parse_clocks_and_bad_sweep_input():
    assert design_space.parse_clocks("dram, 64,100.5,0") == [0.0, 64.0, 100.5, 0.0]
    for bad, msg in (("", "at least one"), ("fast", "expected MHz"), ("-5", "positive"),
                     ("nan", "positive"), ("inf", "positive")):
        with pytest.raises(ValueError, match=msg):
            design_space.parse_clocks(bad)
    with pytest.raises(ValueError, match="clocks is empty"):
        design_space.sweep(clocks=())
    with pytest.raises(ValueError, match="fastest standard"):
        design_space.sweep(lanes=(8,), clocks=(3000.0,), dram=("DDR4-3200",))


@pytest.mark.parametrize("argv, message", [
    (["--sweep-clocks", "fast"], "expected MHz"),
    (["--sweep-clocks", "3000"], "may not exceed"),
    (["--sweep-drams", ""], "at least one standard"),
    (["--sweep-drams", "DDR9"], "DDR9"),
    (["--knee-tolerance", "0"], "knee-tolerance"),
])
def test_bench_cli_refuses_bad_sweep_options(argv, message, capsys):
    assert coda_main(["bench", "--sweep-only"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err


def test_dse_point_refuses_a_bad_clock_before_any_build():
    base = {"lanes": 8, "depth": 256, "fmt": "bf16", "stream_bytes": 4096}
    with pytest.raises(ValueError, match="may not exceed the DDR4-3200"):
        design_space.dse_point({**base, "dram": "DDR4-3200", "nme_mhz": 2400.0})
    with pytest.raises(ValueError, match="positive"):
        design_space.dse_point({**base, "dram": "DDR5-4800", "nme_mhz": -1.0})


def test_report_only_reads_records_of_any_version(tmp_path, capsys, monkeypatch):
    """--sweep-report-only: the newest ok record per parameter set, whatever code version
    wrote it (a version-1 record without nme_mhz is the NME on the DRAM clock), filtered by
    the options; dse.json (version 2) and dse.png written, nothing measured."""
    recs = _clock_records()
    v1 = _records()[0]                                     # version 1: no nme_mhz
    v1["params"]["lanes"] = 64                             # a lanes count of its own
    lines = []
    for i, rec in enumerate([v1] + recs):
        lines.append({**rec, "kind": "bench", "key": f"k{i}"})
    newer = json.loads(json.dumps(lines[1]))               # same params, later in the file
    newer["key"] = "other-version"
    newer["figures"]["segment4.utilisation"] = 0.5
    stale = json.loads(json.dumps(lines[2]))
    stale["status"] = "failed"                            # failed: not a row
    stale["key"] = "failed-one"
    other = json.loads(json.dumps(lines[3]))
    other["params"]["stream_bytes"] = 1 << 20             # another size: filtered
    folder = tmp_path / "build" / "bench" / "dse"
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in lines + [newer, stale, other]))
    # records without units are the combinational NME's (the default NME's: none here)
    assert design_space.recorded_rows(folder, stream_bytes=STREAM_BYTES) == []
    rows = design_space.recorded_rows(folder, stream_bytes=STREAM_BYTES, units="0,0,0")
    assert len(rows) == (1 + len(recs)) * len(nmp_measure.PROGRAM_STREAMS)
    p = lines[1]["params"]
    seg, = [r for r in rows if (r["dram"], r["nme_mhz"], r["lanes"], r["depth"], r["program"])
            == (p["dram"], p["nme_mhz"] or None, p["lanes"], p["depth"], "segment4")]
    assert seg["utilisation"] == 0.5                      # the newer record
    assert {(r["lanes"], r["nme_mhz"]) for r in rows if r["lanes"] == 64} == {(64, None)}
    only = design_space.recorded_rows(folder, stream_bytes=STREAM_BYTES, drams=("DDR4-3200",),
                               clocks=(100.0,), lanes=(8,), units="0,0,0")
    assert {(r["dram"], r["nme_mhz"], r["lanes"]) for r in only} == {("DDR4-3200", 100.0, 8)}
    monkeypatch.chdir(tmp_path)
    assert coda_main(["bench", "--sweep-report-only", "--sweep-stream-bytes", str(STREAM_BYTES),
                      "--sweep-lanes", "1,2,4,8,16,32,64", "--sweep-depths", "16,256",
                      "--sweep-clocks", "dram,100,400,800,1200", "--sweep-units", "0,0,0"]) == 0
    dse = json.loads((tmp_path / "build" / "bench" / "dse.json").read_text())
    assert dse["version"] == design_space.DSE_VERSION and dse["areas"] == {}
    assert len(dse["rows"]) == len(rows)
    assert (tmp_path / "build" / "bench" / "dse.png").stat().st_size > 0
    assert not (folder / "points").exists()                # nothing measured
    assert coda_main(["bench", "--sweep-report-only", "--sweep-stream-bytes", "64"]) == 1
    assert "no sweep records" in capsys.readouterr().out


# ----------------------------------------------------------------------------- NME units
PIPELINED = "3,5,1"          # a pipelined NME (5,7,1 places and routes on ECP5 at ~100 MHz)


def _with_units(records, units, scale=1.0):
    """``records`` with the sweep parameter ``units`` (None: left out, as in a record of a
    sweep before units were a parameter) and the utilisation and elements per ns scaled by
    ``scale`` (so the rows of different units differ)."""
    out = json.loads(json.dumps(records))
    for rec in out:
        if units is not None:
            rec["params"]["units"] = units
        for key in list(rec["figures"]):
            if key.endswith((".utilisation", ".elements_per_ns")):
                rec["figures"][key] *= scale
    return out


def test_parse_units_reads_three_ints_and_names_a_bad_value():
    assert nme_units.parse_units("3,5,1") == (3, 5, 1)
    assert nme_units.parse_units(" 0, 0 ,0") == (0, 0, 0)
    assert nme_units.units_label(None) == nme_units.units_label("") == "0,0,0" \
        == nme_units.COMBINATIONAL
    # a sweep measures the default NME unless told otherwise: NMEConfig's units, the
    # timing-closed preset's
    from coda.hw.nme.isa import DEFAULT_PRESET, NME_PRESETS, NMEConfig
    timing_closed = NME_PRESETS["timing-closed"]
    assert DEFAULT_PRESET == "timing-closed"
    assert design_space.SWEEP_UNITS == nme_units.DEFAULT_UNITS == nme_units.units_label(
        (timing_closed.mul_latency, timing_closed.add_latency, timing_closed.operand_latency))
    assert nme_units.parse_units(nme_units.DEFAULT_UNITS) == (
        NMEConfig.mul_latency, NMEConfig.add_latency, NMEConfig.operand_latency)
    assert nme_units.units_label((3, 5, 1)) == nme_units.units_label(" 3 ,5, 1") == PIPELINED
    assert nme_units.units_title(PIPELINED) == "NME units mul 3 / add 5 / operand 1"
    for bad, why in (("3,5", "2 given"), ("3,5,1,0", "4 given"), ("", "1 given"),
                     ("a,5,1", "invalid literal"), ("1.5,0,0", "invalid literal"),
                     (f"{MAX_MUL_LATENCY + 1},0,0", f"mul_latency={MAX_MUL_LATENCY + 1}"),
                     (f"0,{MAX_ADD_LATENCY + 1},0", f"add_latency={MAX_ADD_LATENCY + 1}"), ("0,0,2", "operand_latency=2"),
                     ("-1,0,0", "mul_latency=-1")):
        with pytest.raises(ValueError) as exc:
            nme_units.parse_units(bad, "--sweep-units")
        msg = str(exc.value)
        assert msg.startswith(f"--sweep-units {bad!r}: expected M,A,O"), msg
        assert why in msg and "\n" not in msg


def test_units_reach_the_rows_and_knees_old_records_are_combinational():
    """Every row carries its record's units ("M,A,O"); a record without units (a sweep before
    units were a parameter) is 0,0,0. Rows of two units at the same (standard, clock, lanes,
    depth) stay apart in best_rows and knees: each units set has its own knees, rank best
    and figures."""
    old = _with_units(_clock_records(), None)
    piped = _with_units(_clock_records(), " 3, 5,1", scale=0.5)   # canonicalised
    rows = design_space.dse_rows(old + piped)
    assert len(rows) == 2 * len(old) * len(nmp_measure.PROGRAM_STREAMS)
    assert {r["units"] for r in rows[:len(rows) // 2]} == {"0,0,0"}
    assert {r["units"] for r in rows[len(rows) // 2:]} == {PIPELINED}
    for r0, r1 in zip(rows[:len(rows) // 2], rows[len(rows) // 2:]):
        assert (r0["dram"], r0["nme_mhz"], r0["lanes"], r0["depth"], r0["program"]) == \
            (r1["dram"], r1["nme_mhz"], r1["lanes"], r1["depth"], r1["program"])
        assert r1["utilisation"] == pytest.approx(0.5 * r0["utilisation"], rel=1e-12)
    best = design_space.best_rows(rows)
    assert len(best) == 2 * len(design_space.best_rows(rows[:len(rows) // 2]))
    ks = design_space.knees(rows)
    alone = {u: design_space.knees([r for r in rows if r["units"] == u])
             for u in ("0,0,0", PIPELINED)}
    assert len(ks) == sum(len(k) for k in alone.values())
    for k in ks:
        same, = [a for a in alone[k["units"]]
                 if (a["dram"], a["nme_mhz"], a["program"]) == (k["dram"], k["nme_mhz"],
                                                               k["program"])]
        assert k == same
    # half the utilisation everywhere: the same knees, half the rank best
    for a, b in zip(alone["0,0,0"], alone[PIPELINED]):
        assert a["knee_lanes"] == b["knee_lanes"] and a["saturated"] == b["saturated"]
        assert b["rank_best"] == pytest.approx(0.5 * a["rank_best"], rel=1e-12)
    # a dse.json row without units (version 2) counts as 0,0,0
    v2 = [{k: v for k, v in r.items() if k != "units"} for r in rows[:len(rows) // 2]]
    assert [k["units"] for k in design_space.knees(v2)] == ["0,0,0"] * len(alone["0,0,0"])


def test_tables_are_titled_with_the_units(capsys, monkeypatch):
    """One table per units set, titled with them, each holding that set's rows only."""
    monkeypatch.setenv("COLUMNS", "260")
    rows = design_space.dse_rows(_with_units(_records(), None)
                          + _with_units(_records(), PIPELINED, scale=0.5))
    design_space_report.print_sweep(rows)
    out = capsys.readouterr().out
    first, second = (out.index("NME units mul 0 / add 0 / operand 0"),
                     out.index("NME units mul 3 / add 5 / operand 1"))
    assert first < second
    lines = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()
             if line.count("│") == 11]
    n = len({(r["lanes"], r["depth"]) for r in rows})
    assert len(lines) == 2 * n
    by = {(r["units"], r["lanes"], r["depth"], r["program"]): r for r in rows}
    for i, cells in enumerate(lines):
        units = "0,0,0" if i < n else PIPELINED
        r = by[(units, int(cells[2]), int(cells[3]), "residual_add")]
        assert cells[4:6] == [f"{r['elements_per_ns']:.3f}", f"{100 * r['utilisation']:.1f} %"]
    design_space_report.print_knees(design_space.knees(rows), {})
    out = capsys.readouterr().out
    assert out.count("knee per clock") == 2
    assert out.index("mul 0 / add 0 / operand 0") < out.index("mul 3 / add 5 / operand 1")
    design_space_report.print_sweep([r for r in rows if r["units"] == PIPELINED])
    out = capsys.readouterr().out
    assert "mul 3 / add 5 / operand 1" in out and "mul 0 / add 0" not in out


def _results_file(tmp_path, groups):
    """``build/bench/dse/results.jsonl`` under ``tmp_path`` holding the records of
    ``groups`` ([(units or None, records)]) as the engine writes them."""
    folder = tmp_path / "build" / "bench" / "dse"
    folder.mkdir(parents=True)
    lines = [{**rec, "kind": "bench", "key": f"k{g}-{i}"}
             for g, (units, recs) in enumerate(groups)
             for i, rec in enumerate(_with_units(recs, units, scale=1.0 - 0.25 * g))]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


def test_report_only_filters_by_units(tmp_path, capsys, monkeypatch):
    """recorded_rows keeps the records of the units asked for (0,0,0 is what old records
    without units are; default the default NME's units, of which this file has none; None:
    every units); --sweep-report-only --sweep-units writes dse.json with those units and
    titles the tables with them."""
    recs = _clock_records()
    folder = _results_file(tmp_path, [(None, recs), (PIPELINED, recs), ("0,0,0", recs[:4])])
    n = len(recs) * len(nmp_measure.PROGRAM_STREAMS)
    assert design_space.recorded_rows(folder, stream_bytes=STREAM_BYTES) == []
    default = design_space.recorded_rows(folder, stream_bytes=STREAM_BYTES, units="0,0,0")
    assert len(default) == n and {r["units"] for r in default} == {"0,0,0"}
    # the 0,0,0 records (later in the file, at half the utilisation) replace the old ones
    # of the same parameters
    plain = {(r["dram"], r["nme_mhz"], r["lanes"], r["depth"], r["program"]): r["utilisation"]
             for r in design_space.dse_rows(recs)}
    replaced = {(r["dram"], r["nme_mhz"], r["lanes"], r["depth"]) for r in default
                if r["utilisation"] == pytest.approx(0.5 * plain[(r["dram"], r["nme_mhz"],
                                                                  r["lanes"], r["depth"],
                                                                  r["program"])])}
    assert replaced == {(p["dram"], p["nme_mhz"] or None, p["lanes"], p["depth"])
                        for p in (rec["params"] for rec in recs[:4])}
    piped = design_space.recorded_rows(folder, stream_bytes=STREAM_BYTES, units=" 3,5, 1")
    assert len(piped) == n and {r["units"] for r in piped} == {PIPELINED}
    assert len(design_space.recorded_rows(folder, stream_bytes=STREAM_BYTES, units=None)) == 2 * n
    assert design_space.recorded_rows(folder, stream_bytes=STREAM_BYTES, units="1,0,0") == []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "260")
    assert coda_main(["bench", "--sweep-report-only", "--sweep-stream-bytes", str(STREAM_BYTES),
                      "--sweep-lanes", "1,2,4,8,16,32", "--sweep-depths", "16,256",
                      "--sweep-clocks", "dram,100,400,800,1200",
                      "--sweep-units", PIPELINED]) == 0
    out = capsys.readouterr().out
    assert out.count("NME units mul 3 / add 5 / operand 1") == 2       # both tables
    assert "operand 0" not in out
    dse = json.loads((tmp_path / "build" / "bench" / "dse.json").read_text())
    assert dse["version"] == design_space.DSE_VERSION == 3 and dse["units"] == PIPELINED
    assert len(dse["rows"]) == n and {r["units"] for r in dse["rows"]} == {PIPELINED}
    assert {k["units"] for k in dse["knees"]} == {PIPELINED}
    assert coda_main(["bench", "--sweep-report-only", "--sweep-stream-bytes", str(STREAM_BYTES),
                      "--sweep-units", "1,0,0"]) == 1
    assert "no sweep records matching the options (units 1,0,0)" in capsys.readouterr().out


@pytest.mark.parametrize("value, why", [
    ("3,5", "2 given"), (f"3,{MAX_ADD_LATENCY + 1},1", f"add_latency={MAX_ADD_LATENCY + 1}"), ("x,5,1", "invalid literal"),
    ("3,5,1,0", "4 given"), ("=-1,0,0", "mul_latency=-1"), ("3;5;1", "1 given"),
])
def test_bench_cli_refuses_bad_sweep_units_before_any_build(value, why, capsys, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("measured despite bad --sweep-units")
    monkeypatch.setattr(bench, "sweep", no_build)
    monkeypatch.setattr(bench, "measure_nmp", no_build)
    monkeypatch.setattr(design_space, "measure_nmp", no_build)
    argv = (["--sweep-units" + value] if value.startswith("=") else ["--sweep-units", value])
    assert coda_main(["bench", "--sweep-only", "--sequential"] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--sweep-units {value.lstrip('=')!r}: expected M,A,O" in err and why in err


def _fake_measure(calls):
    """A stand-in for measure_nmp: records the NMEConfig and returns a result of the shape
    program_figures reads (cycles from the latencies, so the figures depend on them)."""
    def measure_nmp(cfg, dram, dimms, ranks, stream_words=None, nme_mhz=None):
        calls.append({"cfg": cfg, "dram": dram, "shape": (dimms, ranks),
                      "stream_words": stream_words, "nme_mhz": nme_mhz})
        cycles = stream_words + cfg.mul_latency + cfg.add_latency + cfg.operand_latency
        prog = {"elements_per_rank": stream_words * cfg.lanes, "cycles": cycles,
                "dram_cycles": 2 * cycles, "ns": 10.0 * cycles,
                "cycles_per_element": cycles / (stream_words * cfg.lanes),
                "ranks": [{"utilisation": 0.5, "gbps": 1.0}], "sim_cycles_per_s": 1000}
        return {"build_seconds_recorded": 1.0, "residual_add": prog, "segment4": prog}
    return measure_nmp


def test_dse_point_builds_the_nme_with_the_units(monkeypatch):
    calls = []
    monkeypatch.setattr(design_space, "measure_nmp", _fake_measure(calls))
    base = {"lanes": 8, "depth": 256, "fmt": "bf16", "stream_bytes": 4096,
            "dram": "DDR5-4800", "nme_mhz": 100.0}
    piped = design_space.dse_point({**base, "units": PIPELINED})
    plain = design_space.dse_point(base)                                  # no units: 0,0,0
    zero = design_space.dse_point({**base, "units": "0,0,0"})
    cfgs = [c["cfg"] for c in calls]
    assert [(c.mul_latency, c.add_latency, c.operand_latency) for c in cfgs] == \
        [(3, 5, 1), (0, 0, 0), (0, 0, 0)]
    for c in cfgs:
        assert (c.lanes, c.depth, c.fmt) == (8, 256, "bf16")
        assert c.mem_words >= 4 * (4096 // 16) + 1
    assert {c["nme_mhz"] for c in calls} == {100.0} and {c["shape"] for c in calls} == {(1, 1)}
    assert piped["residual_add.cycles"] == plain["residual_add.cycles"] + 9
    assert plain == zero
    # bad units: refused before measure_nmp, with where a comma-holding value goes
    for bad in ("3", "3,5,9"):
        with pytest.raises(ValueError, match=r"units .*expected M,A,O.*--grid TOML"):
            design_space.dse_point({**base, "units": bad})
    assert len(calls) == 3


def test_sweep_gives_every_point_the_units(tmp_path, monkeypatch):
    """sweep(units=...) puts the canonical units in every point (so they are points of
    their own in the records), its rows carry them and dse.json records them; bad units
    are refused before any point runs."""
    import coda.sweep

    calls = []
    monkeypatch.setattr(design_space, "measure_nmp", _fake_measure(calls))
    seen = []

    def run_sweep(kind, points, folder, **kw):
        seen.extend(points)
        return [{"params": p, "status": "ok", "figures": design_space.dse_point(p), "timing": {}}
                for p in points]
    monkeypatch.setattr(coda.sweep, "run_sweep", run_sweep)
    out = tmp_path / "dse.json"
    rows = design_space.sweep(lanes=(2, 4), clocks=(100.0,), dram="DDR5-4800", stream_bytes=4096,
                       out=out, units=(3, 5, 1), synth_root=tmp_path / "none")
    assert [p["units"] for p in seen] == [PIPELINED] * 2
    kind = design_space.sweep_kind()
    assert kind.param("units").default == nme_units.DEFAULT_UNITS
    keys = {coda.sweep.point_key(kind, p) for p in seen}
    assert not keys & {coda.sweep.point_key(kind, {**p, "units": "0,0,0"}) for p in seen}
    assert [(c["cfg"].lanes, c["cfg"].mul_latency, c["cfg"].add_latency,
             c["cfg"].operand_latency) for c in calls] == [(2, 3, 5, 1), (4, 3, 5, 1)]
    assert {r["units"] for r in rows} == {PIPELINED}
    dse = json.loads(out.read_text())
    assert dse["units"] == PIPELINED and {r["units"] for r in dse["rows"]} == {PIPELINED}
    with pytest.raises(ValueError, match="units '3,5': expected M,A,O"):
        design_space.sweep(lanes=(2,), clocks=(100.0,), dram="DDR5-4800", units="3,5")
    assert len(calls) == 2


# ---------------------------------------------------------------------------------------
# the speed of checks whose tests assert behaviour only (tests/cli/test_no_timed_asserts.py)
# ---------------------------------------------------------------------------------------
def test_bench_times_the_sweep_address_check():
    """How long coda sweep's address check takes to refuse an address where something answers
    but not a Ray GCS, and one where nothing answers (its timeout); the errors are the
    check's own."""
    fig = bench.address_check_timing(timeout_s=0.2)
    assert fig["timeout_s"] == 0.2
    assert "not a Ray cluster's GCS" in fig["not_a_gcs"]["error"]
    assert "no Ray cluster answers there (timed out)" in fig["silent"]["error"]
    assert fig["not_a_gcs"]["seconds"] > 0 and fig["silent"]["seconds"] > 0


def _fake_gpu_check(calls, returncode=0):
    import subprocess
    from pathlib import Path

    def run(argv, **kw):
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.json").write_text(json.dumps({"full": {"seconds": 1.5},
                                                        "cached": {"seconds": 1.25}}))
        return subprocess.CompletedProcess(argv, returncode, "", "" if returncode == 0 else
                                           "Traceback ...\nRuntimeError: boom\n")
    return run


def test_bench_times_the_gpu_check_on_a_cpu(tmp_path, monkeypatch):
    """scripts/gpu_check.py at the size its test runs (CPU_CHECK): the wall time against its
    target and the check's own timed figures; a failed check stops the bench with its
    stderr."""
    from coda.experiments.gpu_check import CPU_CHECK

    calls = []
    monkeypatch.setattr(bench.subprocess, "run", _fake_gpu_check(calls))
    clock = iter([100.0, 100.0 + bench.GPU_CHECK_CPU_TARGET_S + 1])   # a known, slow wall
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    fig = bench.gpu_check_timing(tmp_path / "g")
    monkeypatch.undo()
    (argv,) = calls
    assert argv[1].endswith("scripts/gpu_check.py")
    assert argv[2:] == [*CPU_CHECK, "--out", str(tmp_path / "g")]
    assert fig["target_s"] == bench.GPU_CHECK_CPU_TARGET_S
    assert fig["wall_s"] == bench.GPU_CHECK_CPU_TARGET_S + 1 and fig["within_target"] is False
    assert fig["full_s"] == 1.5 and fig["cached_s"] == 1.25
    assert fig["command"].startswith("scripts/gpu_check.py --device cpu")
    monkeypatch.setattr(bench.subprocess, "run", _fake_gpu_check(calls, returncode=1))
    with pytest.raises(RuntimeError, match="(?s)exit 1.*boom"):
        bench.gpu_check_timing(tmp_path / "g")


@pytest.mark.parametrize("skip", [False, True])
def test_bench_writes_the_check_timings_unless_skipped(tmp_path, monkeypatch, skip):
    monkeypatch.setattr(bench, "_cosim_speed", lambda args: {"ceiling": {}})
    monkeypatch.setattr(bench, "gpu_check_timing", lambda out: {"wall_s": 1.0, "out": str(out)})
    monkeypatch.setattr(bench, "address_check_timing", lambda: {"timeout_s": 5.0})
    monkeypatch.setattr(bench, "serving_timing", lambda: {"wall_s": 2.0})
    out = tmp_path / "cosim.json"
    argv = ["bench", "--sweep-lanes", "", "--skip-dram", "--out", str(out)]
    assert coda_main(argv + (["--skip-checks"] if skip else [])) == 0
    result = json.loads(out.read_text())
    assert result["ceiling"] == {}
    if skip:
        assert "checks" not in result
    else:
        assert result["checks"] == {"gpu_check_cpu": {"wall_s": 1.0,
                                                      "out": str(tmp_path / "gpu_check")},
                                    "sweep_address_check": {"timeout_s": 5.0},
                                    "serving_1000": {"wall_s": 2.0}}


def test_bench_times_a_1000_request_serving_simulation(monkeypatch):
    """coda serve's default run at one rate and policy with 1,000 requests: the wall time
    (a known, slow fake clock) against its target, and the run's own split and figures."""
    from coda.host.system import serving

    seen = []

    def fake_curve(cfg):
        seen.append(cfg)
        return {"wall_s": {"service_s": 3.0, "serving_s": 0.5},
                "runs": [{"p50_s": 10.0, "p99_s": 20.0}]}

    monkeypatch.setattr(serving, "serve_curve", fake_curve)
    clock = iter([5.0, 5.0 + bench.SERVING_TARGET_S + 1])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    fig = bench.serving_timing()
    monkeypatch.undo()
    (cfg,) = seen
    assert (cfg.requests, cfg.rates, cfg.policy) == (1000, "20", "fcfs")
    assert fig["wall_s"] == bench.SERVING_TARGET_S + 1 and fig["within_target"] is False
    assert (fig["service_s"], fig["serving_s"]) == (3.0, 0.5)
    assert (fig["p50_s"], fig["p99_s"]) == (10.0, 20.0)


def test_rtl_generations_measure_both_memories_on_the_same_prompts(tmp_path, monkeypatch):
    """Step 4 of coda bench: coda run of the same --run-prompts once per memory (--memory
    ideal, then --memory dram on --nmp-dram), each run's report figures taken as they are,
    and ideal_over_dram = the ideal run's cycles/s over the DRAM-timed run's against the
    1.5x target. A memory that is not one is refused before any run, naming it."""
    from pathlib import Path

    from coda.experiments import run as coda_run

    speed = {"ideal": 1_200_000, "dram": 900_000}
    seen = []

    def fake_main(args):     # what coda run writes, here without running it
        seen.append(args)
        mem = args.memory
        report = {"dram": "DDR5-4800" if mem == "dram" else None,
                  "nme_mhz": 1000.0 if mem == "dram" else None,
                  "rtl": {"prompts": [0, 1], "nme_programs": 10, "cached_generation_s": 3.0},
                  "bit_exact_rtl_vs_torch": True, "sim_cycles_per_s": speed[mem]}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "report.json").write_text(json.dumps(report))
        return 0

    monkeypatch.setattr(coda_run, "main", fake_main)
    cfg = bench.BenchConfig(out=tmp_path / "cosim.json")     # what main starts from
    out = bench._rtl_generations(cfg, {"cycles_per_s": 1_500_000})
    assert all(isinstance(a, coda_run.RunConfig) for a in seen)
    assert [(a.memory, a.prompts, a.dram) for a in seen] == [("ideal", "0,1", None),
                                                              ("dram", "0,1", "DDR5-4800")]
    assert out["ideal"]["command"].endswith("--prompts 0,1 --memory ideal")
    assert out["dram"]["command"].endswith("--prompts 0,1 --memory dram --dram DDR5-4800")
    assert out["dram"]["nme_mhz"] == 1000.0 and out["dram"]["sim_cycles_per_s"] == 900_000
    assert out["ideal"]["ceiling_ratio"] == round(1_500_000 / 1_200_000, 3)
    assert bench.DRAM_SPEED_TARGET == 1.5
    assert out["ideal_over_dram"] == {"ratio": round(1_200_000 / 900_000, 3), "target": 1.5,
                                      "within_target": True}
    with pytest.raises(ValueError, match=r"--run-memories 'ideal,hbm': 'hbm' is not a memory"):
        bench._run_memories("ideal,hbm")


# ---------------------------------------------------------------------------------------
# the bench result record (coda.results): the figures of the JSON the run wrote, dse.png
# ---------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _no_records(monkeypatch):
    """No test of this file writes a result record unless it sets CODA_RECORD_DIR itself."""
    from coda.results import RECORD_ENV

    monkeypatch.delenv(RECORD_ENV, raising=False)


def _roofline_nmp(calls):
    """A stand-in for measure_nmp of the shape the sweep (dse_point) and the DIMM-NMP step
    read: utilisation of the synthetic roofline rank (:func:`_clock_util`), cycles from the
    stream length, every rank alike, no violations."""
    def measure_nmp(cfg, dram="DDR5-4800", dimms=2, ranks=2, flags=None, stream_words=None,
                    nme_mhz=None):
        calls.append((cfg.lanes, dram, dimms, ranks, nme_mhz))
        std = get_standard(dram)
        util = round(_clock_util(std, cfg.lanes, nme_mhz), 4)
        mhz = nme_mhz or 1000.0 / std.tCK_ns
        out = {"system": f"{dimms}x{ranks} {std.name}", "flags": flags or "default",
               "cfg": {"lanes": cfg.lanes, "depth": cfg.depth, "mem_words": cfg.mem_words},
               "build_seconds_recorded": 1.0, "refresh_ceiling": round(std.refresh_ceiling, 4),
               "violations": 0}
        for prog, streams in nmp_measure.PROGRAM_STREAMS.items():
            cycles = streams * stream_words + 7 * cfg.lanes
            out[prog] = {"elements_per_rank": stream_words * cfg.lanes, "cycles": cycles,
                         "dram_cycles": 2 * cycles, "ns": round(1000.0 * cycles / mhz, 1),
                         "cycles_per_element": round(cycles / (stream_words * cfg.lanes), 3),
                         "ranks": [{"utilisation": util, "gbps": round(util * std.peak_gbps, 2)}]
                         * (dimms * ranks), "min_utilisation": util,
                         "sim_cycles_per_s": 1000 * cycles + streams}
        return out
    return measure_nmp


def _fake_bench(monkeypatch, calls):
    """Every measurement of coda bench replaced by a quick stand-in of the shape its step
    reads (the sweep's and the DIMM-NMP's measure_nmp, the NME alone, coda run, the DRAM
    replays writing dram.json, the GPU check's subprocess, the serving check); the address
    check is the real one with a short timeout. The sweep engine, knees, dse.json, dse.png,
    the ratio of the generations and cosim.json are the bench's own."""
    from pathlib import Path

    from coda.experiments import run as coda_run
    from coda.jsonout import json_text

    monkeypatch.setattr(design_space, "measure_nmp", _roofline_nmp(calls))
    monkeypatch.setattr(bench, "measure_nmp", _roofline_nmp(calls))

    def measure(cfg):
        one = {"launches": 1, "cycles": 9 * cfg.mem_words, "cycles_per_s": 1234567,
               "sim_cycles_per_s": 2345678}
        return {"cfg": {"lanes": cfg.lanes, "mem_words": cfg.mem_words},
                "simulator_start_seconds": 0.42, "one_rank": one,
                "tiny_job": {"cycles": 3, "ms_per_job": 0.71},
                "own_image": {**one, "cycles_per_s": 1111111},
                "ceiling": {**one, "launches": 3, "cycles_per_s": 1567890, "ranks": 2}}
    monkeypatch.setattr(bench, "measure", measure)

    def run_main(args):
        dram = args.memory == "dram"
        report = {"dram": "DDR5-4800" if dram else None, "nme_mhz": 1000.0 if dram else None,
                  "rtl": {"prompts": [0, 1], "nme_programs": 16, "cached_generation_s": 3.21},
                  "bit_exact_rtl_vs_torch": True,
                  "sim_cycles_per_s": 987654.3 if dram else 1203456.7}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "report.json").write_text(json.dumps(report))
        return 0
    monkeypatch.setattr(coda_run, "main", run_main)

    def bench_dram(out):
        rows = [{"standard": "DDR5-4800", "trace": "STREAM-add 2 MiB", "violations": 0,
                 "gbps": 15.59, "utilisation": 0.812},
                {"standard": "DDR4-3200", "trace": "random 65536 x 64 B / 1 GiB",
                 "violations": 0, "gbps": 11.13, "utilisation": 0.435, "act_bound_gbps": 12.05,
                 "of_act_bound": 11.13 / 12.05}]
        out.write_text(json_text(rows, indent=1) + "\n")
        return rows
    monkeypatch.setattr(bench, "bench_dram", bench_dram)
    monkeypatch.setattr(bench.subprocess, "run", _fake_gpu_check([]))
    real_address_check = bench.address_check_timing
    monkeypatch.setattr(bench, "address_check_timing",
                        lambda: real_address_check(timeout_s=0.05))
    monkeypatch.setattr(bench, "serving_timing", lambda: {
        "command": "coda serve --requests 1000 --rates 20 --policy fcfs", "wall_s": 4.56,
        "service_s": 3.0, "serving_s": 1.5, "target_s": bench.SERVING_TARGET_S,
        "within_target": True, "p50_s": 10.0, "p99_s": 20.0})


#: the smallest design-space sweep: two lanes counts, one depth, one standard, one NME clock
#: beside the same-domain NME (the NME port limits the first, so it has lanes to saturate)
TINY_SWEEP = ["--sweep-lanes", "1,2", "--sweep-depths", "16", "--sweep-clocks", "100,dram",
              "--sweep-drams", "DDR5-4800", "--sweep-stream-bytes", "4096", "--sequential"]
PROGRAMS = {"residual_add": "residual add", "segment4": "4-stream segment"}


def _leaves(obj):
    """Every number, string and bool in a JSON value."""
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in _leaves(x)]
    if isinstance(obj, list):
        return [v for x in obj for v in _leaves(x)]
    return [obj]


def _knee_at(k):
    clock = "on the DRAM clock" if not k["nme_mhz"] else f"{k['nme_mhz']:g} MHz"
    return f"knee, {k['dram']} {clock}, {PROGRAMS[k['program']]}"


def test_bench_ends_with_a_record_of_its_json_and_plot(tmp_path, monkeypatch):
    """coda bench on a tiny sweep, every part run (measurements replaced by stand-ins):
    the record ``bench`` in CODA_RECORD_DIR holds the knees of dse.json, the DRAM rows of
    dram.json and the headline figures of cosim.json, each equal to the JSON's value, says
    that no part was left out, and carries dse.png; nothing else is a figure."""
    from coda.results import RECORD_ENV, load_record, render

    calls = []
    _fake_bench(monkeypatch, calls)
    monkeypatch.chdir(tmp_path)                          # synthesis areas: none here
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "records"))
    out = tmp_path / "bench" / "cosim.json"
    assert coda_main(["bench", *TINY_SWEEP, "--out", str(out)]) == 0
    cosim = json.loads(out.read_text())
    dram = json.loads(out.with_name("dram.json").read_text())
    dse = json.loads(out.with_name("dse.json").read_text())
    assert len(dse["rows"]) == 2 * 2 * len(PROGRAMS)    # lanes x clocks x programs
    rec = load_record(tmp_path / "records", "bench")
    fig = dict(rec["figures"])
    assert len(fig) == len(rec["figures"])               # no label twice
    assert fig.pop("parts not run") == "none"

    expected = {"design-space sweep: NME units (mul, add, operand stages)": dse["units"],
                "design-space sweep: knee = fewest lanes within this share of the best "
                "utilisation": dse["knees"][0]["tolerance"]}
    assert {k["saturated"] for k in dse["knees"]} == {True, False}
    for k in dse["knees"]:
        at = _knee_at(k)
        expected.update({f"{at}: lanes": k["knee_lanes"],
                         f"{at}: DRAM utilisation": k["knee_utilisation"],
                         f"{at}: DRAM-bound": k["saturated"]})
        if not k["saturated"]:
            expected[f"{at}: lanes to saturate (extrapolated)"] = k["lanes_to_saturate"]
    for r in dram:
        at = f"DRAM controller, {r['standard']}, {r['trace']}"
        expected.update({f"{at}: GB/s": r["gbps"], f"{at}: utilisation": r["utilisation"]})
        if "of_act_bound" in r:
            expected[f"{at}: share of the ACT bound"] = r["of_act_bound"]
    expected["DRAM controller: JEDEC violations, every trace"] = sum(r["violations"]
                                                                      for r in dram)
    gen, checks = cosim["rtl_generation"], cosim["checks"]
    expected.update({
        "NME alone, one rank: NME cycles/s": cosim["one_rank"]["cycles_per_s"],
        "NME alone, one rank: NME cycles/s of the simulator's own run":
            cosim["one_rank"]["sim_cycles_per_s"],
        "NME alone, own image: NME cycles/s": cosim["own_image"]["cycles_per_s"],
        "NME alone, tiny job: ms per job": cosim["tiny_job"]["ms_per_job"],
        "NME alone, simulator start (s)": cosim["simulator_start_seconds"],
        f"NME alone, ceiling ({cosim['ceiling']['ranks']} ranks in lockstep): NME cycles/s":
            cosim["ceiling"]["cycles_per_s"],
        "ideal-memory / DRAM-timed NME cycles/s: ratio": gen["ideal_over_dram"]["ratio"],
        "ideal-memory / DRAM-timed NME cycles/s: target": gen["ideal_over_dram"]["target"],
        "ideal-memory / DRAM-timed NME cycles/s: within target":
            gen["ideal_over_dram"]["within_target"],
        "coda run --memory ideal: ceiling / its NME cycles/s": gen["ideal"]["ceiling_ratio"]})
    for mem in ("ideal", "dram"):
        for label, key in (("NME cycles/s", "sim_cycles_per_s"),
                           ("bit-exact RTL vs torch", "bit_exact_rtl_vs_torch"),
                           ("NME programs", "nme_programs"),
                           ("cached generation (s)", "cached_generation_s"),
                           ("wall (s)", "wall_s")):
            expected[f"coda run --memory {mem}: {label}"] = gen[mem][key]
    (nmp,) = cosim["dimm_nmp"]
    at = f"DIMM-NMP {nmp['system']}, {nmp['cfg']['lanes']} lanes, depth {nmp['cfg']['depth']}"
    for prog, name in PROGRAMS.items():
        expected.update({
            f"{at}, {name}: DRAM utilisation per rank (lowest)": nmp[prog]["min_utilisation"],
            f"{at}, {name}: NME cycles": nmp[prog]["cycles"],
            f"{at}, {name}: NME cycles/s of the simulator's own run":
                nmp[prog]["sim_cycles_per_s"]})
    expected.update({f"{at}: refresh ceiling": nmp["refresh_ceiling"],
                     f"{at}: JEDEC violations": nmp["violations"]})
    gpu, serve, address = (checks["gpu_check_cpu"], checks["serving_1000"],
                           checks["sweep_address_check"])
    for label, key in (("wall (s)", "wall_s"), ("target (s)", "target_s"),
                       ("within target", "within_target")):
        expected[f"GPU check on the CPU: {label}"] = gpu[key]
        expected[f"serving check, 1,000 requests: {label}"] = serve[key]
    expected.update({
        "GPU check on the CPU: full-compute generation (s)": gpu["full_s"],
        "GPU check on the CPU: cached generation (s)": gpu["cached_s"],
        "serving check, 1,000 requests: service times (s)": serve["service_s"],
        "serving check, 1,000 requests: serving simulation (s)": serve["serving_s"],
        "serving check, 1,000 requests: p50 latency (s)": serve["p50_s"],
        "serving check, 1,000 requests: p99 latency (s)": serve["p99_s"],
        "coda sweep's address check, an address that is not a Ray GCS: refused in (s)":
            address["not_a_gcs"]["seconds"],
        "coda sweep's address check, a silent address: refused in (s)":
            address["silent"]["seconds"],
        "coda sweep's address check: timeout (s)": address["timeout_s"]})
    assert fig == expected
    # every figure is a value the run wrote (the violations' sum aside: 0, as each row's)
    written = _leaves([cosim, dram, dse["knees"], dse["units"]])
    assert all(any(v == w and type(v) is type(w) for w in written) for v in fig.values())

    dse_png = out.with_name("dse.png")
    ((caption, path),) = rec["pictures"]
    assert path == "img/bench-0.png"
    assert (tmp_path / "records" / path).read_bytes() == dse_png.read_bytes()
    assert dse_png.stat().st_size > 0
    page = render("<!-- record: bench -->\n", tmp_path / "records", prefix="records/")
    assert f"![{caption}](records/img/bench-0.png)" in page
    assert f"| NME alone, tiny job: ms per job | {cosim['tiny_job']['ms_per_job']:,.4g} |" in page


def test_bench_record_of_a_sweep_only_run_says_what_did_not_run(tmp_path, monkeypatch):
    """--sweep-only: the record holds the knees and dse.png and names the parts left out;
    --sweep-report-only measures nothing and writes no record; without CODA_RECORD_DIR the
    same run writes none."""
    from coda.results import RECORD_ENV, load_record

    calls = []
    _fake_bench(monkeypatch, calls)
    monkeypatch.chdir(tmp_path)
    records = tmp_path / "records"
    monkeypatch.setenv(RECORD_ENV, str(records))
    out = tmp_path / "bench" / "cosim.json"
    assert coda_main(["bench", *TINY_SWEEP, "--sweep-only", "--out", str(out)]) == 0
    assert not out.exists() and not out.with_name("dram.json").exists()
    assert {c[2:4] for c in calls} == {(1, 1)}             # sweep points only
    dse = json.loads(out.with_name("dse.json").read_text())
    fig = dict(load_record(records, "bench")["figures"])
    assert "--sweep-only" in fig.pop("parts not run")
    assert {label for label in fig if label.startswith("knee, ")} == {
        f"{_knee_at(k)}: {what}" for k in dse["knees"]
        for what in ("lanes", "DRAM utilisation", "DRAM-bound")
        + (() if k["saturated"] else ("lanes to saturate (extrapolated)",))}
    assert not [label for label in fig if label.startswith(("DRAM controller", "NME alone",
                                                            "coda run", "DIMM-NMP"))]
    assert [p for _, p in load_record(records, "bench")["pictures"]] == ["img/bench-0.png"]

    (records / "bench.json").unlink()
    n = len(calls)
    assert coda_main(["bench", *TINY_SWEEP, "--sweep-report-only", "--out", str(out)]) == 0
    assert len(calls) == n and not (records / "bench.json").exists()
    monkeypatch.delenv(RECORD_ENV)
    assert coda_main(["bench", *TINY_SWEEP, "--sweep-only", "--out", str(out)]) == 0
    assert not (records / "bench.json").exists()


def test_bench_names_the_parts_its_options_leave_out():
    """parts_not_run: each skipped part with the option that skipped it."""
    assert bench.parts_not_run(bench.BenchConfig()) == []
    assert bench.parts_not_run(bench.BenchConfig(sweep_lanes="", skip_dram=True,
                                                 skip_nme=True, skip_checks=True)) == [
        "design-space sweep (--sweep-lanes '')", "DRAM controller replays (--skip-dram)",
        "NME cosimulation speed and coda run generations (--skip-nme)",
        "GPU check, address check and serving timings (--skip-checks)"]
    assert bench.parts_not_run(bench.BenchConfig(run_memories="ideal")) == [
        "coda run --memory dram (--run-memories ideal)"]
    assert bench.parts_not_run(bench.BenchConfig(run_prompts="")) == [
        "coda run generations (--run-prompts '' or --run-memories '')"]
