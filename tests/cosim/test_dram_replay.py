"""The NME word adapter through the DRAM model: words written and read back bit for bit, in
order and served out of order by FR-FCFS; one build for options given at their defaults; and
``coda dram replay``'s input checks and one-line CLI errors.

The Verilated models are built once per standard and cached under build/dram/."""

import json
import random
import re
from pathlib import Path

import pytest

from coda.cosim.dram import check as dram_check

from coda.cosim.dram import replay as dram_replay
from coda.hw.dram.standards import STANDARDS, get_standard


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
