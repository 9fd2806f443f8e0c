"""`coda nme run`: example files, results equal to the reference, clear errors (exit 2)."""

import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from coda.cli import main as coda_main
from coda.host.nme import ops
from coda.host.nme.bits import from_bits, same_bits, to_bits
from coda.host.nme import compiler
from coda.experiments import nme_run
from coda.experiments.nme_run import make_example, read_inputs
from coda.hw.nme.isa import MAX_ADD_LATENCY, MAX_MUL_LATENCY


def run(argv):
    return coda_main(["nme", "run"] + [str(a) for a in argv])


@pytest.mark.parametrize("op", sorted(ops.OPS))
def test_example_runs_and_matches_reference(op, tmp_path, capsys):
    fmt = "fp16" if op in ("segment", "dequant_int8", "sub") else "bf16"
    inp, out = tmp_path / "in.npz", tmp_path / "out.npz"
    assert run(["--op", op, "--fmt", fmt, "--make-example", inp]) == 0
    assert run(["--op", op, "--fmt", fmt, "--inputs", inp, "--out", out,
                "--dimms", 2, "--ranks", 2]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"{op} {fmt} ") and "backend=torch" in line and "nme_cycles=" in line
    inputs = read_inputs(inp, op, fmt)
    want = ops.OPS[op](**inputs)
    with np.load(out) as got:
        if op == "l1_distance":
            assert got["l1"].dtype == np.float32
            assert float(got["l1"]) == pytest.approx(want.item(), rel=1e-5)
        else:
            assert got["y"].dtype == np.uint16
            assert same_bits(got["y"], to_bits(want), fmt)


def test_pipelined_units_same_bits_the_model_cycles(tmp_path, capsys):
    """``--mul-latency/--add-latency/--operand-latency`` reach the NME: the same output bits,
    and the cycles the cycle model gives that configuration (fewer than the default NME's,
    the timing-closed preset with more register stages)."""
    from coda.hw.nme.isa import NMEConfig, Status
    from coda.hw.nme.cycles import model_cycles
    inp = make_example(tmp_path / "in.npz", "gated_residual", "bf16", lanes=8, seed=3)
    units = {"mul_latency": 3, "add_latency": 5, "operand_latency": 1}
    outs, cycles = [], []
    for extra in ([], ["--mul-latency", "3", "--add-latency", "5", "--operand-latency", "1"]):
        out = tmp_path / f"out{len(outs)}.npz"
        assert run(["--op", "gated_residual", "--inputs", inp, "--out", out, *extra]) == 0
        line = capsys.readouterr().out
        cycles.append(int(re.search(r"nme_cycles=(\d+)", line).group(1)))
        with np.load(out) as f:
            outs.append(f["y"])
    assert np.array_equal(outs[0], outs[1])
    with np.load(inp) as f:
        t, c = f["x"].shape
    shapes = {"x": (t, c), "g": (c,), "c": (t, c)}
    prog = compiler.compile_op("gated_residual", NMEConfig(), shapes,
                               compiler.plan_layout("gated_residual", NMEConfig(), shapes)[0])
    assert sum(units.values()) < sum(getattr(NMEConfig, k) for k in units)
    assert cycles[1] < cycles[0]
    assert cycles[1] - cycles[0] == (model_cycles(NMEConfig(**units), prog, Status.OK)
                                     - model_cycles(NMEConfig(), prog, Status.OK))


def test_example_is_deterministic(tmp_path):
    a = make_example(tmp_path / "a.npz", "gated_residual", "bf16", lanes=8, seed=5)
    b = make_example(tmp_path / "b.npz", "gated_residual", "bf16", lanes=8, seed=5)
    with np.load(a) as fa, np.load(b) as fb:
        assert all(np.array_equal(fa[k], fb[k]) for k in ("x", "g", "c"))
        assert fa["x"].shape == (37, 32) and fa["g"].shape == (32,)


def _write(path, **arrays):
    np.savez(path, **arrays)
    return path


def _bits(shape, value=1.0):
    return to_bits(torch.full(shape, value, dtype=torch.bfloat16))


@pytest.mark.parametrize("op, arrays, message", [
    ("gated_residual", {"x": _bits((4, 8)), "c": _bits((4, 8))},
     r"has no array 'g': op gated_residual needs \['x', 'g', 'c'\], the file has \['c', 'x'\]"),
    ("add", {"a": np.ones(8, np.float32), "b": _bits((8,))},
     r"array 'a' has dtype float32, expected uint16 \(raw bf16 bit patterns\)"),
    ("scale", {"a": _bits((4, 8)), "s": _bits((5,))},
     r"scale: argument 's' has shape \(5,\), expected \[C\] = \(8,\)"),
    ("dequant_int8", {"q": np.zeros((2, 8), np.int16), "scale": _bits((2, 1)),
                      "group": np.int64(8)}, r"array 'q' has dtype int16, expected int8"),
    ("dequant_int8", {"q": np.zeros((2, 8), np.int8), "scale": _bits((2, 1)),
                      "group": np.float32(8)},
     r"array 'group' is float32 of shape \(\), expected an integer scalar"),
    ("fma", {"a": _bits((8,))}, r"unknown op 'fma': expected one of \["),
    ("scale", {"a": _bits((4, 12)), "s": _bits((12,))},
     r"C=12 channels: CHAN needs C % lanes == 0 \(lanes=8\)"),
])
def test_bad_inputs_exit_2_with_clear_message(op, arrays, message, tmp_path, capsys):
    inp = _write(tmp_path / "in.npz", **arrays)
    code = run(["--op", op, "--inputs", inp, "--out", tmp_path / "out.npz"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert not (tmp_path / "out.npz").exists()


def test_missing_or_broken_files(tmp_path, capsys):
    assert run(["--op", "add", "--inputs", tmp_path / "none.npz", "--out", tmp_path / "o"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert run(["--op", "add", "--inputs", tmp_path / "bad.npz", "--out", tmp_path / "o"]) == 2
    assert "is not a readable .npz file" in capsys.readouterr().err
    assert run(["--op", "add", "--inputs", tmp_path / "bad.npz"]) == 2
    assert "--inputs IN.npz and --out OUT.npz are required" in capsys.readouterr().err
    assert run(["--op", "add", "--fmt", "fp8", "--make-example", tmp_path / "x.npz"]) == 2
    assert "fmt='fp8': expected one of" in capsys.readouterr().err
    # not zip archives: np.load would return an array or try pickle / raise EOFError
    np.save(tmp_path / "x.npy", np.arange(3, dtype=np.uint16))
    (tmp_path / "rand.npz").write_bytes(bytes(range(256)))
    (tmp_path / "text.npz").write_text("a = 1\n")
    (tmp_path / "zero.npz").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("a", "not a .npy member")
    np.savez(tmp_path / "empty.npz")
    (tmp_path / "folder.npz").mkdir()
    for name, message in [("x.npy", "is not a readable .npz file (not a zip archive)"),
                          ("rand.npz", "is not a readable .npz file (not a zip archive)"),
                          ("text.npz", "is not a readable .npz file (not a zip archive)"),
                          ("zero.npz", "is not a readable .npz file (not a zip archive)"),
                          ("other.zip", "is not a readable .npz file (member 'a' is not a "
                                        ".npy array)"),
                          ("empty.npz", "has no array 'a': op add needs ['a', 'b'], the file "
                                        "has []"),
                          ("folder.npz", "is a folder, expected an .npz file")]:
        inp = tmp_path / name
        assert run(["--op", "add", "--inputs", inp, "--out", tmp_path / "o"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("coda: error: ") and len(err.strip().splitlines()) == 1, err
        assert f"{str(inp)!r} " in err and message in err, err
        assert "pickle" not in err
    assert not (tmp_path / "o").exists()


def _refused(argv, message, capsys):
    code = run(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("coda: error: ") and len(err.strip().splitlines()) == 1, err
    assert message in err, err


@pytest.mark.parametrize("option, message", [
    (["--lanes", 0], "--lanes 0: expected 1..64"),
    (["--lanes", -1], "--lanes -1: expected 1..64"),
    (["--lanes", 1000], "--lanes 1000: expected 1..64"),
    (["--depth", 0], "--depth 0: expected >= 1 word"),
    (["--mem-words", 0], "--mem-words 0: expected 1..2**24"),
    (["--dimms", 0], "--dimms 0 --ranks 1: expected >= 1 each"),
    (["--mul-latency", MAX_MUL_LATENCY + 1],
     f"--mul-latency {MAX_MUL_LATENCY + 1}: expected an int 0..{MAX_MUL_LATENCY}"),
    (["--add-latency", -1], f"--add-latency -1: expected an int 0..{MAX_ADD_LATENCY}"),
    (["--operand-latency", 2], "--operand-latency 2: expected an int 0..1"),
    (["--seed", -1], f"--seed -1: expected an integer 0..{2 ** 31 - 1}"),
    (["--seed", 2 ** 31], f"--seed {2 ** 31}: expected an integer 0..{2 ** 31 - 1}"),
])
def test_geometry_options_checked_for_runs_and_examples(option, message, tmp_path, capsys):
    inp = tmp_path / "in.npz"
    assert run(["--op", "dequant_int8", "--make-example", inp]) == 0
    _refused(["--op", "dequant_int8", "--make-example", tmp_path / "e.npz", *option],
             message, capsys)
    _refused(["--op", "dequant_int8", "--inputs", inp, "--out", tmp_path / "o.npz", *option],
             message, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz"]


def test_output_paths_checked_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inp = tmp_path / "in.npz"
    assert run(["--op", "add", "--make-example", inp]) == 0
    (tmp_path / "d").mkdir()
    (tmp_path / "f.txt").write_text("a file")

    def no_work(*args, **kwargs):
        raise AssertionError("the run started before the output path was checked")

    monkeypatch.setattr(nme_run, "get_backend", no_work)
    for flag, path, message in [
            ("--make-example", "d", "--make-example d: is a folder, expected a file path"),
            ("--make-example", "e", "--make-example e: expected a file name ending in .npz"),
            ("--make-example", "-", "--make-example -: an .npz file cannot go to stdout"),
            ("--make-example", "f.txt/e.npz", "f.txt is a file, expected a folder"),
            ("--out", "-", "--out -: an .npz file cannot go to stdout"),
            ("--out", "d", "--out d: is a folder, expected a file path"),
            ("--out", "f.txt/sub/o.npz", "--out f.txt/sub/o.npz: f.txt is a file, expected a "
                                         "folder")]:
        argv = ["--op", "add", flag, path] + (["--inputs", inp] if flag == "--out" else [])
        _refused(argv, message, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f.txt", "in.npz"]
    assert not any((tmp_path / "d").iterdir())
    # a run that fails creates no output folder either
    monkeypatch.undo()
    _refused(["--op", "scale", "--inputs", inp, "--out", tmp_path / "new" / "sub" / "o.npz"],
             "has no array 's'", capsys)
    assert not (tmp_path / "new").exists()


def test_module_entry_point_reports_errors_like_coda(tmp_path, capsys):
    long_name = tmp_path / ("x" * 300 + ".npz")
    assert run(["--op", "add", "--make-example", str(long_name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error: ") and err.strip().endswith("File name too long"), err
    proc = subprocess.run([sys.executable, "-m", "coda", "nme", "run", "--op", "add",
                           "--make-example", str(long_name)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("coda: error: ") and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.strip().endswith("File name too long")


def test_capacity_error_is_clear(tmp_path, capsys):
    inp = _write(tmp_path / "in.npz", a=_bits((4096,)), b=_bits((4096,)))
    code = run(["--op", "add", "--inputs", inp, "--out", tmp_path / "o.npz", "--mem-words", 64])
    assert code == 2
    err = capsys.readouterr().err    # a, b and y: 512 words of 16 bytes each
    assert "rank 0: cannot allocate 8192 bytes (512 words) for add operands and result (a; " \
        "24576 bytes in all on the rank); 1024 bytes free" in err


def test_values_survive_the_round_trip(tmp_path):
    a = from_bits(np.array([0x7F80, 0x0001, 0x8000, 0x3F80], np.uint16), "bf16")
    inp = _write(tmp_path / "in.npz", a=to_bits(a), b=to_bits(a))
    assert run(["--op", "add", "--inputs", inp, "--out", tmp_path / "o.npz"]) == 0
    with np.load(tmp_path / "o.npz") as f:
        assert f["y"].tolist() == [0x7F80, 0x0002, 0x8000, 0x4000]


def test_out_is_written_under_the_given_name(tmp_path, capsys):
    inp = tmp_path / "in.npz"
    assert run(["--op", "add", "--make-example", inp]) == 0
    assert run(["--op", "add", "--inputs", inp, "--out", tmp_path / "y.txt"]) == 0
    assert (tmp_path / "y.txt").exists() and not (tmp_path / "y.txt.npz").exists()
    with np.load(tmp_path / "y.txt") as got:
        assert same_bits(got["y"], to_bits(ops.OPS["add"](**read_inputs(inp, "add", "bf16"))), "bf16")


@pytest.mark.parametrize("n", [40_000, 40_920, 60_000, 81_840])
def test_default_memory_holds_every_operand_size(n, tmp_path, capsys):
    """Without --mem-words the rank memory is sized from the placement the driver makes
    (aligned, bank-coloured streams), so no operand size fails for the fragmentation that
    placement leaves: a sweep of sizes runs at every point, bit-exact to the reference."""
    gen = torch.Generator().manual_seed(n)
    a, b = (torch.randn(n, generator=gen).to(torch.bfloat16) for _ in range(2))
    inp = _write(tmp_path / "in.npz", a=to_bits(a), b=to_bits(b))
    code = run(["--op", "add", "--inputs", inp, "--out", tmp_path / "o.npz"])
    assert code == 0, capsys.readouterr().err
    with np.load(tmp_path / "o.npz") as got:
        assert same_bits(got["y"], to_bits(ops.OPS["add"](a=a, b=b)), "bf16")


@pytest.mark.parametrize("option", [["--backend", "rtl"], ["--backend", "torch"],
                                    ["--dram", "DDR5-4800"], ["--nme-mhz", "100.0"],
                                    ["--inputs", "i.npz"], ["--out", "o.npz"]],
                         ids=lambda o: " ".join(o))
def test_an_option_of_a_run_is_refused_with_make_example(option, tmp_path, capsys):
    """--make-example writes inputs and runs nothing: an option of a run (its files, where
    it runs) is refused, not ignored, also one given at its default value; the NME's
    geometry and units are checked as for a run and serve both commands."""
    _refused(["--op", "add", "--make-example", tmp_path / "e.npz", *option],
             f"{option[0]} {option[1]}: --make-example writes example inputs and runs "
             f"nothing, expected no {option[0]} with --make-example", capsys)
    assert list(tmp_path.iterdir()) == []
    assert run(["--op", "add", "--make-example", tmp_path / "e.npz", "--fmt", "fp16",
                "--lanes", "4", "--seed", "3", "--depth", "16", "--dimms", "2",
                "--preset", "timing-closed", "--trail-stores", "on"]) == 0


def test_seed_without_make_example_is_refused(tmp_path, capsys):
    inp = tmp_path / "in.npz"
    assert run(["--op", "add", "--make-example", inp]) == 0
    _refused(["--op", "add", "--inputs", inp, "--out", tmp_path / "o.npz", "--seed", "0"],
             "--seed 0: the seed of --make-example's inputs, expected no --seed without "
             "--make-example", capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz"]
