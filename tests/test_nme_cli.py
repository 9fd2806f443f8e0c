"""`coda nme run`: example files, results equal to the reference, clear errors (exit 2)."""

import re

import numpy as np
import pytest
import torch

from coda.cli import main as coda_main
from coda.host import ops
from coda.host.bits import from_bits, same_bits, to_bits
from coda.host.nme_cli import _standalone, make_example, read_inputs


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


def test_example_is_deterministic(tmp_path):
    a = make_example(tmp_path / "a.npz", "gated_residual", "bf16", lanes=8, seed=5)
    b = make_example(tmp_path / "b.npz", "gated_residual", "bf16", lanes=8, seed=5)
    with np.load(a) as fa, np.load(b) as fb:
        assert all(np.array_equal(fa[k], fb[k]) for k in ("x", "g", "c"))
        assert fa["x"].shape == (37, 32) and fa["g"].shape == (32,)


def test_standalone_entry_point(tmp_path, capsys):
    inp, out = tmp_path / "in.npz", tmp_path / "out.npz"
    assert _standalone(["--op", "scale", "--make-example", str(inp)]) == 0
    assert _standalone(["--op", "scale", "--inputs", str(inp), "--out", str(out)]) == 0
    assert out.exists()


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


def test_capacity_error_is_clear(tmp_path, capsys):
    inp = _write(tmp_path / "in.npz", a=_bits((4096,)), b=_bits((4096,)))
    code = run(["--op", "add", "--inputs", inp, "--out", tmp_path / "o.npz", "--mem-words", 64])
    assert code == 2
    assert "rank 0: cannot allocate 24576 bytes" in capsys.readouterr().err


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
