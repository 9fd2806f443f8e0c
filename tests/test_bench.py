"""make bench's sweep presentation (the measurements themselves run in `make bench`)."""

from coda.cosim import bench


def _rows():
    rows = []
    for lanes in (1, 8):
        for depth in (16, 256):
            for prog in ("residual_add", "segment4"):
                cpe = 3.0 / lanes + 16 / depth
                rows.append({"lanes": lanes, "depth": depth, "program": prog, "cycles_per_element": cpe,
                             "elements_per_cycle": 1 / cpe, "utilisation": 0.5, "gbps": 9.6})
    return rows


def test_sweep_table_and_plot(tmp_path, capsys):
    bench.print_sweep(_rows())
    out = capsys.readouterr().out
    assert "DIMM-NMP design space" in out and "3.062" in out and "50.0 %" in out
    bench.plot_sweep(_rows(), tmp_path / "dse.png")
    assert (tmp_path / "dse.png").stat().st_size > 10_000


def test_rank_memory_holds_the_four_streams():
    for words in (1, 16383, 16384, 131072):
        mem = bench._mem_words(words)
        assert mem >= 4 * words + 1 and mem & (mem - 1) == 0 and mem >= 1024
