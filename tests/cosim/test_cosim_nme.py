"""cocotb + Verilator cosimulation of the NME, and the ``rtl`` backend, vs the torch reference.

Builds each configuration once per session (and reuses it across sessions: build/cosim/<key>/),
runs the cocotb tests of tests/cocotb_nme.py in the simulator, and checks
:class:`coda.cosim.nme.rtl_backend.RTLBackend` against :class:`coda.host.nme.backend.TorchBackend`.

Configuration: 8 lanes, depth 16 (so small programs already span several blocks), a 4096-word
memory (whole-memory dumps stay cheap).
"""

from __future__ import annotations

import json
from pathlib import Path
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from coda.cosim.nme.build import build_sim, log_tail, nme_verilog_cached, run_cocotb
from coda.cosim.nme.build import failure_report, waves_requested
from coda.cosim.toolchain import build_dir
from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc, Status, UOp

BASE = NMEConfig(lanes=8, depth=16, mem_words=4096)
_BUILDS: dict = {}
#: pytest's assertion rewriting for every file of the testbench (cocotb_nme.py gathers the
#: tests of cocotb_nme_datapath.py and cocotb_nme_control.py; run_cocotb rewrites only the
#: module it loads)
REWRITE_ASSERTIONS = {"COCOTB_REWRITE_ASSERTION_FILES": "cocotb_nme*.py"}


def _build(cfg: NMEConfig, measure_toggles: bool = False, waves: bool = False):
    """The cosimulation of ``cfg``: the NME as ``coda verilog`` writes it, or with
    ``measure_toggles`` one whose lanes count FU operand toggles (``dbg_fu_toggles``, a
    simulation-only option of :class:`coda.hw.nme.top.NME`); ``waves``: its traced (FST) model."""
    key = (cfg, measure_toggles, waves)
    if key not in _BUILDS:
        _BUILDS[key] = build_sim(cfg, measure_toggles=measure_toggles, waves=waves)
    return _BUILDS[key]


def _run(cfg: NMEConfig, tag: str, testcase: str | None = None, scale: int = 1,
         measure_toggles: bool = False, coverage: Path | None = None) -> dict:
    # WAVES=1 / pytest --waves: the traced model, its FST under build/waves/<tag>/
    waves = build_dir("waves", tag) / "nme_tb_top.fst" if waves_requested() else None
    build = _build(cfg, measure_toggles, waves is not None)
    workdir = build_dir("cosim", "pytest", tag)
    report = workdir / "report.json"
    report.unlink(missing_ok=True)
    env = {"CODA_COSIM_CFG": json.dumps(asdict(cfg)), "CODA_COSIM_LANES": str(cfg.lanes),
           "CODA_COSIM_MEM_WORDS": str(cfg.mem_words), "CODA_COSIM_SCALE": str(scale),
           "CODA_COSIM_REPORT": str(report), **REWRITE_ASSERTIONS}
    if coverage is not None:          # functional coverage sampled and written there
        coverage.unlink(missing_ok=True)
        env["CODA_COVERAGE"] = str(coverage)
    tally = run_cocotb(build, "cocotb_nme", workdir, testcase=testcase, seed=1,
                       extra_env=env, timeout_s=1500, waves=waves)
    assert tally["tests"] > 0, f"no cocotb test ran:\n{log_tail(tally['log'])}"
    assert tally["failed"] == 0, failure_report(tally)   # names the FST file with WAVES=1
    tally["report"] = json.loads(report.read_text()) if report.exists() else {}
    return tally


def _cocotb_tests_defined() -> list[str]:
    """The names of the ``@cocotb.test`` functions of the NME's testbench (tests/cocotb_nme*.py:
    cocotb_nme.py, the module cocotb loads, gathers those of cocotb_nme_datapath.py and
    cocotb_nme_control.py), read from their source (they import only inside the simulator).
    One defined but not gathered does not run: the regression's outcomes then miss it."""
    import ast
    from pathlib import Path

    def is_cocotb_test(dec) -> bool:
        dec = dec.func if isinstance(dec, ast.Call) else dec
        return (isinstance(dec, ast.Attribute) and dec.attr == "test"
                and isinstance(dec.value, ast.Name) and dec.value.id == "cocotb")
    names = []
    for path in sorted(Path(__file__).resolve().parents[1].glob("cocotb_nme*.py")):
        tree = ast.parse(path.read_text())
        names += [f.name for f in tree.body
                  if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and any(is_cocotb_test(d) for d in f.decorator_list)]
    return names


def _cocotb_outcomes(results) -> dict[str, str]:
    """Test name -> "passed" / "failed" / "skipped" from a cocotb results XML; a name
    reported twice is an error."""
    import xml.etree.ElementTree as ET

    outcomes: dict[str, str] = {}
    for case in ET.parse(results).getroot().iter("testcase"):
        name = case.get("name")
        assert name not in outcomes, f"{name} reported twice in {results}"
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[name] = ("failed" if failed else
                          "skipped" if case.find("skipped") is not None else "passed")
    return outcomes


FORMATS = ("bf16", "fp16")
_REGRESSIONS: dict = {}


def _regression(fmt: str) -> dict:
    """The cocotb regression of ``fmt`` (run once per session), sampling functional coverage
    into build/coverage/fast/<fmt>.json."""
    if fmt not in _REGRESSIONS:
        _REGRESSIONS[fmt] = _run(replace(BASE, fmt=fmt), f"regression-{fmt}",
                                 coverage=build_dir("coverage", "fast") / f"{fmt}.json")
    return _REGRESSIONS[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
def test_cocotb_regression(fmt):
    """Every cocotb test of tests/cocotb_nme.py (micro-ops, operators, FP edge cases, random
    bits with stalls, L1 corner sums, tails, bad commands, reset mid-program, toggles,
    speed) ran on the RTL of this format and passed, by name, per cocotb's results XML."""
    tally = _regression(fmt)
    print(f"\n{fmt}: {tally['tests']} cocotb tests, {tally['failed']} failed, "
          f"{tally['seconds']:.1f} s; report {tally['report']}")
    defined = _cocotb_tests_defined()
    assert defined and len(defined) == len(set(defined))
    assert _cocotb_outcomes(tally["results"]) == {name: "passed" for name in defined}
    assert tally["tests"] == len(defined) and tally["failed"] == 0


#: the ECP5 configuration (issue 16): pipelined FP units (register stages inside FPMul /
#: every FPAdd, the deepest cuts) and the block-RAM outputs registered: the same bits, more
#: cycles
PIPELINED = dict(mul_latency=5, add_latency=7, operand_latency=1)


@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.slow) if f != "bf16" else f
                                 for f in FORMATS])
def test_cocotb_regression_pipelined(fmt):
    """The whole cocotb regression (every test of tests/cocotb_nme.py, the same expected bits
    from the interpreter) also passes on an NME with pipelined units (bf16 in ``make test``;
    the other formats, whose units share the same stage cuts, in ``make verify-long``)."""
    cfg = replace(BASE, fmt=fmt, **PIPELINED)
    # BASE's latencies are the default preset's, the pipelined ones: then this is the NME of
    # test_cocotb_regression[fmt], whose run (same build, same tests and bits) it shares
    tally = (_regression(fmt) if cfg == replace(BASE, fmt=fmt)
             else _run(cfg, f"regression-pipelined-{fmt}"))
    print(f"\n{fmt} pipelined {PIPELINED}: {tally['tests']} cocotb tests, "
          f"{tally['failed']} failed, {tally['seconds']:.1f} s")
    defined = _cocotb_tests_defined()
    assert _cocotb_outcomes(tally["results"]) == {name: "passed" for name in defined}
    assert tally["tests"] == len(defined) and tally["failed"] == 0


#: the fraction of the coverage model's bins the fast regression hits (recorded: all of them;
#: a change that leaves a bin unexercised fails here, naming it)
COVERAGE_FLOOR = 1.0


def _defined_bins(cfg: NMEConfig) -> int:
    """Bins of the coverage model of ``cfg``, counted from its definition (coda.cosim.nme.coverage)."""
    from coda.cosim.nme import coverage as cv

    arith = len(cv.ARITH)
    return (6 + 6 * 5                                              # op, op x R source
            + arith * len(cv.FLOAT_CLASSES) ** 2                   # operands cross
            + len(cv.FLOAT_CLASSES)                                # mac_q
            + arith * (len(cv.FLOAT_CLASSES) - 1)                  # result classes (no sNaN)
            + sum(len(v) for v in cv.EVENTS_OF.values())           # result events
            + 4 + cfg.lanes + len(cv.OPERATORS) + 8 + 4 + 8        # l1, tail, operator, K,
            + len(Status) + 4                                      # dequant, stalls, status, reset
            + 4 * cfg.nbuf)                                        # buffer x role (P, Q, R, D)


def test_functional_coverage():
    """The fast regression (both formats) hits at least COVERAGE_FLOOR of the coverage
    model's bins, every defined bin reported (none dropped); writes build/coverage/
    coverage.json and summary.txt (``make coverage``)."""
    from coda.cosim.nme.coverage import merge, summary

    files = []
    for fmt in FORMATS:
        _regression(fmt)
        files.append(build_dir("coverage", "fast") / f"{fmt}.json")
    merged = merge(files)
    out = build_dir("coverage")
    (out / "coverage.json").write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    text = summary(merged)
    (out / "summary.txt").write_text(text + "\n")
    print("\n" + text)
    assert sorted(merged["configs"]) == [f"{f}_l{BASE.lanes}" for f in FORMATS]
    for key, data in merged["configs"].items():
        assert data["total"] == _defined_bins(BASE), key
    assert merged["total"] == len(FORMATS) * _defined_bins(BASE)
    assert merged["covered_fraction"] >= COVERAGE_FLOOR, text


@pytest.mark.slow
def test_functional_coverage_long():
    """``make verify-long``: the regression at 4x its samples, both formats, hits every bin
    of the coverage model (build/coverage/long/)."""
    from coda.cosim.nme.coverage import merge, summary

    files = []
    for fmt in FORMATS:
        path = build_dir("coverage", "long") / f"{fmt}.json"
        _run(replace(BASE, fmt=fmt), f"regression-long-{fmt}", scale=4, coverage=path)
        files.append(path)
    merged = merge(files)
    (build_dir("coverage", "long") / "coverage.json").write_text(
        json.dumps(merged, indent=1, sort_keys=True) + "\n")
    assert merged["total"] == len(FORMATS) * _defined_bins(BASE)
    assert merged["covered"] == merged["total"], summary(merged)


def test_run_cocotb_with_a_relative_workdir(tmp_path, monkeypatch):
    """A relative workdir means the caller's folder, not one nested in the simulator's."""
    monkeypatch.chdir(tmp_path)
    env = {"CODA_COSIM_CFG": json.dumps(asdict(BASE)), "CODA_COSIM_LANES": str(BASE.lanes),
           "CODA_COSIM_MEM_WORDS": str(BASE.mem_words)}
    tally = run_cocotb(_build(BASE), "cocotb_nme", Path("rel/run"), testcase="test_tails$",
                       seed=1, extra_env=env, timeout_s=600)
    assert tally["tests"] == 1 and tally["failed"] == 0
    assert tally["results"] == tmp_path / "rel" / "run" / "results.xml"
    assert tally["results"].is_file() and not (tmp_path / "rel" / "run" / "rel").exists()


@pytest.mark.slow   # two extra Verilator builds (with toggle counters): make verify-long
def test_operand_isolation_reduces_toggles():
    """The representative program toggles the FU operand registers less with operand
    isolation than without (same results: the cocotb test checks bits), measured on NMEs
    built with their toggle counter; the NME of ``coda verilog`` has none."""
    on = _run(BASE, "isolation-on", testcase="test_operand_isolation_toggles",
              measure_toggles=True)
    off = _run(replace(BASE, operand_isolation=False), "isolation-off",
               testcase="test_operand_isolation_toggles", measure_toggles=True)
    for tally in (on, off):     # the one test asked for, and it passed
        assert _cocotb_outcomes(tally["results"]) == {"test_operand_isolation_toggles": "passed"}
    t_on = on["report"]["toggles_isolation_on"]
    t_off = off["report"]["toggles_isolation_off"]
    print(f"\noperand-isolation toggles: on {t_on}, off {t_off} "
          f"({100 * (1 - t_on / t_off):.1f}% fewer)")
    assert _build(BASE, measure_toggles=True).has_toggles, "no dbg_fu_toggles in the build"
    assert "dbg_fu_toggles" not in nme_verilog_cached(BASE), "measurement logic in the NME"
    assert 0 < t_on < t_off
    assert on["report"]["cycles_isolation_program"] == off["report"]["cycles_isolation_program"]


# ----------------------------------------------------------------------------- RTL backend
def _operator_jobs(cfg: NMEConfig, rng: np.random.Generator):
    """(name, program, image) of a few compiled operators on random images."""
    from coda.host.nme import bits as hb
    from coda.host.nme.compiler import compile_op, plan_layout

    dtype = hb.torch_dtype(cfg.fmt)
    jobs = []
    t, c = 7, 2 * cfg.lanes
    cases = {"gated_residual": {"x": (t, c), "g": (c,), "c": (t, c)},
             "segment": {"x": (t, c), "g": (3, c), "c": (3, t, c)},
             "l1_distance": {"a": (t * c + 5,), "b": (t * c + 5,)},
             "cfg_combine": {"u": (t, c), "c": (t, c), "s": ()}}
    for name, shapes in cases.items():
        layout, _ = plan_layout(name, cfg, shapes, base=int(rng.integers(0, 100)))
        program = compile_op(name, cfg, shapes, layout)
        mem = rng.integers(0, 1 << 16, size=(cfg.mem_words, cfg.lanes), dtype=np.uint16)
        # finite inputs where the operator reads, so the L1 sum is a real number
        for stream, shape in shapes.items():
            addrs = layout[stream] if isinstance(layout[stream], list) else [layout[stream]]
            per = int(np.prod(shape[1:])) if isinstance(layout[stream], list) else \
                int(np.prod(shape))
            for a in addrs:
                vals = torch.from_numpy(rng.standard_normal(per).astype(np.float32)).to(dtype)
                words = hb.pack_words(hb.to_bits(vals), cfg.lanes)
                mem[a:a + words.shape[0]] = words
        jobs.append((name, program, mem))
    bad = Program(8, (UOp(Op.ADD, RSrc.MEM, d=9, addr=0),))
    jobs.append(("bad operand", bad, jobs[0][2]))
    return jobs


def _same(res_a, res_b, fmt: str) -> bool:
    from coda.host.nme import bits as hb
    l1a = np.float32(res_a.l1).view(np.uint32)
    l1b = np.float32(res_b.l1).view(np.uint32)
    l1_ok = l1a == l1b or (np.isnan(res_a.l1) and np.isnan(res_b.l1))
    return hb.same_bits(res_a.mem, res_b.mem, fmt) and res_a.status == res_b.status and l1_ok


def test_rtl_backend_matches_torch_backend():
    """RTLBackend gives TorchBackend's bits (mem, status, l1) for compiled operators and a bad
    program, one persistent simulator serving all jobs; execute_many too, spread over
    ``max_sims`` parallel simulators; close stops them all."""
    from coda.cosim.nme.rtl_backend import RTLBackend
    from coda.host.nme.backend import TorchBackend

    cfg = BASE
    _build(cfg)
    rng = np.random.default_rng(11)
    jobs = _operator_jobs(cfg, rng)
    torch_be = TorchBackend()
    with RTLBackend(latency=3, req_stall=0.2, rsp_stall=0.2, seed=5, max_sims=2) as rtl:
        for name, program, mem in jobs:
            before = mem.copy()
            got = rtl.execute(cfg, program, mem)
            exp = torch_be.execute(cfg, program, mem)
            assert np.array_equal(mem, before), f"{name}: execute modified its input image"
            assert _same(got, exp, cfg.fmt), (f"{name}: rtl status {got.status!r} l1 {got.l1} "
                                              f"vs torch {exp.status!r} l1 {exp.l1}")
            assert got.cycles > 0
        assert jobs[-1][0] == "bad operand" and got.status == Status.BAD_OPERAND
        many = rtl.execute_many(cfg, [(p, m) for _, p, m in jobs])
        for (name, program, mem), res in zip(jobs, many):
            assert _same(res, torch_be.execute(cfg, program, mem), cfg.fmt), name
        assert sorted(rtl.sessions) == [(cfg, 0), (cfg, 1)]
        assert rtl.stats["starts"] == 2 and rtl.stats["programs"] == 2 * len(jobs)
        procs = [s.proc for s in rtl.sessions.values()]
        # per-job overhead: a tiny program repeated
        tiny = Program(cfg.lanes, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                                   UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=100)))
        import time
        mem = jobs[0][2]
        t0 = time.perf_counter()
        n = 20
        for _ in range(n):
            mem = rtl.execute(cfg, tiny, mem).mem
        per_job = (time.perf_counter() - t0) / n
        print(f"\nRTLBackend: simulator start {rtl.stats['start_seconds']:.2f} s, "
              f"{per_job * 1e3:.1f} ms per tiny job (mem {cfg.mem_words} words)")
    assert all(p.poll() is not None for p in procs), "simulator still running after close()"


def test_rtl_backend_rank_images_are_the_simulators_memories():
    """A rank image (RTLBackend.rank_image) is the memory its simulator maps: a job on it
    returns that very array with the NME's stores in it and TorchBackend's bits, words the host
    writes between jobs reach the next program without a load, an image of the caller's own
    gives the same bits from a copy, and two jobs of one launch on one rank image are refused.
    The memory files are deleted by close."""
    from coda.cosim.nme.rtl_backend import RTLBackend
    from coda.host.nme.backend import TorchBackend

    cfg = BASE
    rng = np.random.default_rng(12)
    jobs = _operator_jobs(cfg, rng)
    torch_be = TorchBackend()
    with RTLBackend(max_sims=2) as rtl:
        images = [rtl.rank_image(cfg, r) for r in range(2)]
        assert rtl.rank_image(cfg, 1) is images[1] and not images[0].any()
        paths = [m.path for m in rtl._rank_memories.values()]
        for name, program, mem in jobs[:4]:
            images[0][:] = mem           # the host writes its rank memory in place
            images[1][:] = mem[::-1]
            exp = [torch_be.execute(cfg, program, m.copy()) for m in images]
            own = rtl.execute(cfg, program, images[1].copy())
            got = rtl.execute_many(cfg, [(program, m) for m in images])
            for r in range(2):
                assert got[r].mem is images[r], f"{name}: rank {r} result is not its image"
                assert _same(got[r], exp[r], cfg.fmt), f"{name}: rank {r}"
            assert own.mem is not images[1] and _same(own, exp[1], cfg.fmt), name
        assert {k[1:] for k in rtl.sessions if len(k) == 3} == {("rank", 0), ("rank", 1)}
        with pytest.raises(ValueError, match="same rank image"):
            rtl.execute_many(cfg, [(jobs[0][1], images[0]), (jobs[0][1], images[0])])
        with pytest.raises(ValueError, match="rank=-1"):
            rtl.rank_image(cfg, -1)
    assert not any(p.exists() for p in paths), "rank memory files left after close()"


def test_cosim_speed_measure_counts_the_models_cycles():
    """coda bench's speed figures (nme_speed.measure) run the programs they say: the big
    program's RTL cycles are the cycle model's, the ceiling counts every rank of every launch,
    and every rate is positive."""
    from coda.cosim.nme.speed import big_program, measure
    from coda.hw.nme.cycles import model_cycles

    out = measure(BASE, tiny_jobs=3, launches=2, ranks=2)
    big = model_cycles(BASE, big_program(BASE), Status.OK, mem_latency=1)
    assert out["one_rank"]["cycles"] == out["own_image"]["cycles"] == big
    assert out["ceiling"]["cycles"] == 2 * 2 * big and out["ceiling"]["ranks"] == 2
    for key in ("one_rank", "own_image", "ceiling"):
        assert out[key]["cycles_per_s"] > 0 and out[key]["sim_cycles_per_s"] > 0
    assert out["tiny_job"]["ms_per_job"] > 0


def test_rtl_backend_rejects_bad_image():
    from coda.cosim.nme.rtl_backend import RTLBackend

    with RTLBackend() as rtl:
        program = Program(8, (UOp(Op.MOV, RSrc.MEM, d=0, addr=0),))
        with pytest.raises(ValueError, match="expected"):
            rtl.execute(BASE, program, np.zeros((10, BASE.lanes), np.uint16))
        with pytest.raises(TypeError, match="uint16"):
            rtl.execute(BASE, program, np.zeros((BASE.mem_words, BASE.lanes), np.float32))
    with pytest.raises(ValueError, match="latency"):
        RTLBackend(latency=0)


@pytest.mark.slow   # the same two toggle-counting builds as the test above: make verify-long
def test_energy_estimate_measures_toggles_on_nmes_that_count_them():
    """synth.energy charges FU energy by measured toggles: its simulators must be built with
    the (simulation-only) counter, and isolation must cut the count (the builds of the test
    above are reused)."""
    from coda.synth.energy import measure_activity

    acts = {a.isolation: a for a in measure_activity(BASE, ("gated_residual",), tokens=16)}
    assert acts[True].toggles > 0 and acts[False].toggles > acts[True].toggles
