"""make bench's sweep presentation (the measurements themselves run in `make bench`): the
table and the plot of the rows :func:`bench.dse_rows` makes of sweep records, checked cell by
cell and line by line against those rows."""

import math

import pytest

from coda.cosim import bench
from coda.hw.dram_standards import get_standard

DRAM = "DDR5-4800"
STREAM_BYTES = 4096


def _records():
    """Sweep records as the engine returns them (coda.sweep: params, figures, timing,
    status), with the figures :func:`bench.dse_point` derives from a measurement (cycles of
    a program over ``elements`` per stream): here cycles from a simple bound (the slower of
    the NME port and the DRAM peak, plus a turnaround per stream block), so every point
    differs. One failed point, which the rows leave out."""
    std = get_standard(DRAM)
    peak = std.burst_bytes / std.nBL
    records = []
    for lanes in (1, 4, 16):
        for depth in (16, 256):
            figures = {}
            for prog, streams in bench.PROGRAM_STREAMS.items():
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


def test_dse_rows_are_the_records_figures():
    records = _records()
    rows = bench.dse_rows(records)
    ok = [r for r in records if r["status"] == "ok"]
    assert len(rows) == len(ok) * len(bench.PROGRAM_STREAMS)
    for row in rows:
        rec, = [r for r in ok if (r["params"]["lanes"], r["params"]["depth"])
                == (row["lanes"], row["depth"])]
        prog = row["program"]
        for key in ("elements", "cycles", "cycles_per_element", "elements_per_cycle",
                    "utilisation", "gbps"):
            assert row[key] == rec["figures"][f"{prog}.{key}"], (prog, key)
        assert row["sim_cycles_per_s"] == rec["timing"][f"{prog}.sim_cycles_per_s"]
        assert row["build_seconds"] == rec["timing"]["build_seconds"]


def test_sweep_table_cells_are_the_rows(capsys, monkeypatch):
    """One line per (standard, clock, lanes, depth) in order, each program's cells its row's
    elements per ns (3 decimals), utilisation (percent, 1 decimal) and GB/s (2 decimals); a
    program without a row shows '-'."""
    monkeypatch.setenv("COLUMNS", "240")        # rich: no wrapped cells
    rows = bench.dse_rows(_records())
    missing = rows.pop()                         # the last point's segment4
    assert missing["program"] == "segment4"
    bench.print_sweep(rows)
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
    rows = bench.dse_rows(_clock_records())
    bench.plot_sweep(rows, tmp_path / "dse.png")
    fig, = figures
    assert len(fig.axes) == 4 * len(STDS)
    for s, name in enumerate(sorted(STDS)):
        std = get_standard(name)
        for col, prog in enumerate(("residual_add", "segment4")):
            streams = bench.PROGRAM_STREAMS[prog]
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
        mem = bench._mem_words(words)
        assert mem >= 4 * words + 1 and mem & (mem - 1) == 0 and mem >= 1024
