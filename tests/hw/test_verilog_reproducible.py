"""Generated hardware is byte-identical run to run: the Verilog of every ``coda verilog`` top,
with every option that adds a clock domain, is the same under different ``PYTHONHASHSEED``\\ s
(Amaranth would create undeclared domains, and order their clock ports, from a set of
hashed names), and the one converter of the hardware layer
(:func:`coda.hw.yosys.component_verilog`) declares every clock domain itself, in a fixed
order, and refuses a domain it was not told of."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from coda.hw.verilog import TOPS

#: hash seeds of the generating processes (1 and 4 ordered {sync, nme} differently)
SEEDS = (1, 4)
#: a small NME, so that each design converts in seconds
SMALL = ["--lanes", "1", "--depth", "16", "--nbuf", "2", "--imem-depth", "4",
         "--max-streams", "2", "--mem-words", "256"]
#: every top, plain and with each option that adds a clock domain: the NME's gated lane clock
#: (``--clock-gating on``, the dimm default) and the DIMM's NME clock (``--nme-mhz``)
CASES = {
    "nme": ["--top", "nme"],
    "nme_gated": ["--top", "nme", "--clock-gating", "on"],
    "dimm": ["--top", "dimm", "--ranks", "2"],
    "dimm_nme_clock": ["--top", "dimm", "--ranks", "2", "--nme-mhz", "200"],
    "dimm_nme_clock_ungated": ["--top", "dimm", "--ranks", "2", "--nme-mhz", "200",
                               "--clock-gating", "off"],
}

_GENERATE = """
import hashlib, json, os, sys
from coda.cli import main
out, cases, small = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
digests = {}
for name, argv in cases.items():
    path = os.path.join(out, name + ".v")
    assert main(["verilog", *argv, *small, "-o", path]) == 0
    with open(path, "rb") as f:
        digests[name] = hashlib.sha256(f.read()).hexdigest()
print(json.dumps(digests))
"""


def test_every_top_is_generated_under_several_hash_seeds():
    assert {argv[1] for argv in CASES.values()} == set(TOPS)


def test_verilog_is_the_same_under_every_hash_seed(tmp_path):
    procs = {}
    for seed in SEEDS:
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": str(seed), "OMP_NUM_THREADS": "1"}
        procs[seed] = (out, subprocess.Popen(
            [sys.executable, "-c", _GENERATE, str(out), json.dumps(CASES), json.dumps(SMALL)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    digests = {}
    for seed, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        digests[seed] = json.loads(stdout.strip().splitlines()[-1])
    first = SEEDS[0]
    for seed in SEEDS[1:]:
        for name in CASES:
            if digests[seed][name] != digests[first][name]:
                a = (tmp_path / f"seed{first}" / f"{name}.v").read_text().splitlines()
                b = (tmp_path / f"seed{seed}" / f"{name}.v").read_text().splitlines()
                line = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                pytest.fail(f"{name}: PYTHONHASHSEED={first} and ={seed} differ at line "
                            f"{line + 1}:\n{a[line][:300]}\n{b[line][:300]}")


def _two_domain_component():
    from amaranth import Module, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    class TwoClocks(wiring.Component):
        def __init__(self):
            super().__init__({"a": In(1), "y": Out(1), "z": Out(1)})

        def elaborate(self, platform):
            m = Module()
            m.d.sync += self.y.eq(self.a)
            m.d.other += self.z.eq(self.a)
            return m

    return TwoClocks()


def test_component_verilog_declares_the_domains_in_the_order_given():
    from coda.hw.yosys import component_verilog

    for order in (("sync", "other"), ("other", "sync")):
        text = component_verilog(_two_domain_component(), "two", domains=order)
        header = text[text.index("module two("):]
        header = header[:header.index(");")]
        clocks = {"sync": ["clk", "rst"], "other": ["other_clk", "other_rst"]}
        want = [p for d in order for p in clocks[d]]
        ports = [p.strip() for p in header[len("module two("):].split(",")]
        assert [p for p in ports if p in sum(clocks.values(), [])] == want


def test_component_verilog_refuses_a_domain_it_was_not_told_of():
    from coda.hw.yosys import component_verilog

    with pytest.raises(ValueError, match="'other'"):
        component_verilog(_two_domain_component(), "two", domains=("sync",))
