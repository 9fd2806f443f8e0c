"""coda sweep: grids, bad input refused before any task, a 4-point sweep on a local Ray with a
failing point, the same figures as the sequential loop, resuming, and no Ray process left."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from coda.cli import main
from coda.sweep import (MAX_POINTS, Param, SweepKind, grid_points, load_grid, parse_param,
                        point_key, read_results, run_sweep)


def _kind(run=lambda p, w: {"y": p["x"] * 2}) -> SweepKind:
    return SweepKind("toy", run, (Param("x", int, 1), Param("f", float, 0.5),
                                  Param("s", str, "a"), Param("b", bool, False)))


# ----------------------------------------------------------------------------- grids
def test_param_types_and_errors():
    k = _kind()
    assert parse_param(k, "x=1,2, 3") == ("x", [1, 2, 3])
    assert parse_param(k, "f=1,2.5") == ("f", [1.0, 2.5])
    assert parse_param(k, "b=true,0") == ("b", [True, False])
    for bad, what in [("x=1.5", "x='1.5': expected int"), ("y=1", "parameter 'y'"),
                      ("x", "expected NAME=V1"), ("x=", "no empty item"), ("x=1,,2", "no empty"),
                      ("b=yes", "expected bool")]:
        with pytest.raises(ValueError, match=what.replace("(", r"\(")):
            parse_param(k, bad)
    with pytest.raises(ValueError, match="expected int"):
        Param("x", int).convert(True)          # a TOML bool is not an int


def test_grid_product_defaults_and_dedupe(tmp_path):
    k = _kind()
    pts = grid_points(k, {"x": [1, 2], "s": ["a", "b"]})
    assert pts == [{"x": x, "f": 0.5, "s": s, "b": False} for x in (1, 2) for s in ("a", "b")]
    assert grid_points(k, {"x": [1, 1]}) == [{"x": 1, "f": 0.5, "s": "a", "b": False}]
    # a point named with its defaults is the same point (same key)
    assert point_key(k, {"x": 1}) == point_key(k, {"x": 1, "f": 0.5, "s": "a", "b": False})
    # another version of the sources the figures depend on is another point (measured again)
    assert point_key(replace(k, version="changed"), {"x": 1}) != point_key(k, {"x": 1})
    with pytest.raises(ValueError, match="empty grid"):
        grid_points(k, {})
    with pytest.raises(ValueError, match=f"at most {MAX_POINTS}"):
        grid_points(k, {"x": list(range(200)), "f": [float(i) for i in range(100)]})
    toml = tmp_path / "g.toml"
    toml.write_text('x = [3, 4]\ns = "c"\n')
    assert load_grid(k, toml) == {"x": [3, 4], "s": ["c"]}
    toml.write_text("x = []\n")
    with pytest.raises(ValueError, match="x is an empty list"):
        load_grid(k, toml)
    toml.write_text("[x]\na = 1\n")
    with pytest.raises(ValueError, match="x is a table"):
        load_grid(k, toml)
    toml.write_text("x = = 1\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_grid(k, toml)
    toml.write_text("x = [3, 4, 3]\n")      # a value twice: refused, not dropped
    with pytest.raises(ValueError, match=r"x = \[3, 4, 3\]: 3 given twice"):
        load_grid(k, toml)
    with pytest.raises(ValueError, match="'x=2,2': 2 given twice"):
        parse_param(k, "x=2,2")


def _failing(p, w):
    if p["x"] == 3:
        raise RuntimeError("point 3 broke")
    (w / "out.txt").write_text(str(p["x"]))
    return {"y": p["x"] * 2, "timing": {"t": 0.1}}


def test_sequential_records_failures_and_resumes(tmp_path):
    k = _kind(_failing)
    pts = grid_points(k, {"x": [1, 2, 3, 4]})
    recs = run_sweep(k, pts, tmp_path, sequential=True, progress=False, log=lambda m: None)
    assert [r["status"] for r in recs] == ["ok", "ok", "failed", "ok"]
    assert [r["figures"].get("y") for r in recs] == [2, 4, None, 8]
    assert recs[2]["error"] == "RuntimeError: point 3 broke"
    assert recs[0]["timing"] == {"t": 0.1} and "timing" not in recs[0]["figures"]
    assert (tmp_path / "points" / f"toy-{point_key(k, pts[0])}" / "out.txt").read_text() == "1"
    assert "point 3 broke" in (tmp_path / "points" / f"toy-{point_key(k, pts[2])}"
                               / "error.txt").read_text()
    # resuming runs only the failed point again
    run_sweep(k, pts, tmp_path, sequential=True, progress=False, log=lambda m: None)
    assert len(read_results(tmp_path)) == 5
    (tmp_path / "results.jsonl").open("a").write('{"torn')     # a killed run's last line
    assert len(read_results(tmp_path)) == 5


# ----------------------------------------------------------------------------- the command
@pytest.mark.parametrize("argv, message", [
    (["sweep", "nosuch", "--param", "x=1"], "sweep kind 'nosuch': expected one of bench, schedule"),
    (["sweep", "list"], "serve (a kind's parameters: coda sweep KIND --list)"),
    (["sweep", "sim", "--param", "nosuch=1"], "parameter 'nosuch' of sweep kind 'sim'"),
    (["sweep", "sim"], "empty grid"),
    (["sweep", "sim", "--param", "dimms=two"], "dimms='two': expected int"),
    (["sweep", "sim", "--param", "dimms=1", "--param", "dimms=2"], "dimms is given twice"),
    # a value twice in one list is refused, as every list option refuses it
    (["sweep", "schedule", "--param", "finalists=1,1"], "--param 'finalists=1,1': 1 given twice"),
    (["sweep", "sim", "--param", "dimms=1, 01"], "--param 'dimms=1, 01': 1 given twice"),
    (["sweep", "sim", "--param", "dimms=1", "--workers", "0"], "--workers 0: expected >= 1"),
    (["sweep", "sim", "--param", "dimms=1", "--address", "127.0.0.1:1"],
     "--address 127.0.0.1:1: no Ray cluster answers there"),
    (["sweep", "sim", "--param", "dimms=1", "--address", "nonsense"], "expected HOST:PORT"),
    (["sweep", "sim", "--param", "dimms=1", "--address", "127.0.0.1:1", "--sequential"],
     "give one of them"),
    (["sweep", "sim", "--grid", "/nonexistent/g.toml"], "/nonexistent/g.toml: No such file"),
    (["sweep", "sim", "--grid", ""], "--grid '': expected a TOML file path"),
    (["sweep", "sim", "--param", "intervals=cross_attn=6,temporal_attn=4"],
     "give such values in a --grid TOML file"),
    (["sweep", "sim", "--param", "seconds=nan"], "seconds='nan': expected a finite number"),
    (["sweep", "sim", "--param", "dimms=1", "--workers", "100000"], "expected 1..1024"),
    (["sweep", "sim", "--param", "dimms=1", "--workers", "2", "--sequential"],
     "--workers and --sequential: give one of them"),
    (["sweep", "sim", "--param", "dimms=1", "--address", "ray://127.0.0.1:10001"],
     "expected HOST:PORT"),
    (["sweep", "sim", "--param", "dimms=1", "--address", "http://127.0.0.1:8265"],
     "expected HOST:PORT"),
])
def test_bad_input_refused_before_any_task(tmp_path, capsys, argv, message):
    out = tmp_path / "sw"
    assert main([*argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("coda: error:") and message in err and "\n" not in err
    assert not (out / "results.jsonl").exists()


def test_list_names_every_kind(capsys):
    for kind in ("bench", "schedule", "sim", "serve"):
        assert main(["sweep", kind, "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("stream_bytes", "finalists", "dimms", "per_request"):
        assert name in out


def _ray_processes() -> set[str]:
    """Ray's processes running now (pid and command line); other Rays of this machine (a
    `make mutation` say) are told apart by comparing before and after."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return {line.strip() for line in ps.splitlines()
            if "raylet" in line or "gcs_server" in line or "ray::" in line}


def test_sim_sweep_on_local_ray_equals_sequential_loop(tmp_path):
    """4 points of the system model on a local 2-worker Ray through the console entry
    (``python -m coda sweep``), one of them failing (0 DIMMs): exit 1, recorded per point, the
    same figures as the sequential loop, no Ray process left."""
    before = _ray_processes()
    grid = tmp_path / "grid.toml"
    grid.write_text('model = "latte-digits"\ndimms = [1, 2, 4, 0]\nsystem = "a,c,f"\n')
    args = ["sweep", "sim", "--grid", str(grid), "--no-progress"]
    p = subprocess.run([sys.executable, "-m", "coda", *args, "--workers", "2",
                        "--out", str(tmp_path / "ray")], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 1, p.stderr[-2000:]                                    # 1 failed
    assert "3 points ok, 1 failed" in p.stdout
    ray_recs = read_results(tmp_path / "ray")
    assert [r["params"]["dimms"] for r in ray_recs if r["status"] == "ok"] and \
        sorted(r["params"]["dimms"] for r in ray_recs) == [0, 1, 2, 4]
    failed = [r for r in ray_recs if r["status"] != "ok"]
    assert [r["params"]["dimms"] for r in failed] == [0]
    assert failed[0]["error"] == "ValueError: --dimms 0: expected >= 1"
    assert all(r["mode"] == "ray" and r["node_id"] and r["host"] for r in ray_recs)
    assert not _ray_processes() - before

    assert main([*args, "--sequential", "--out", str(tmp_path / "seq")]) == 1
    seq = {r["key"]: r for r in read_results(tmp_path / "seq")}
    for r in ray_recs:
        assert r["figures"] == seq[r["key"]]["figures"]
        assert r["status"] == seq[r["key"]]["status"]
    ok = [r for r in ray_recs if r["status"] == "ok"]
    # the figures are coda sim's: the report each point wrote, and more DIMMs never slower
    for r in ok:
        folder = tmp_path / "ray" / "points" / f"sim-{r['key']}"
        report = json.loads((folder / "report.json").read_text())
        assert r["figures"]["f.latency_s"] == report["systems"]["f"]["latency_s"]
        assert r["figures"]["cache_bytes"] == report["cache_bytes"]
    by_dimms = {r["params"]["dimms"]: r["figures"] for r in ok}
    assert by_dimms[4]["f.latency_s"] <= by_dimms[1]["f.latency_s"]

    # resuming: only the failed point runs again (sequentially here, to spare a Ray start)
    assert main([*args, "--sequential", "--out", str(tmp_path / "ray")]) == 1
    assert len(read_results(tmp_path / "ray")) == 5


def test_serve_sweep_points_are_coda_serve_runs(tmp_path):
    """Serving over rates x policies x cluster sizes: each point's figures are the run of
    ``coda serve`` with that one rate and policy; a comma list in a point is refused."""
    from coda.cli.sweep import kinds
    from coda.host.system.serving import SWEEP_FIGURES, ServeConfig, serve_curve

    kind = kinds()["serve"]
    common = {"model": ["latte-digits"], "mix": ["64x64:20:1"], "requests": [60]}
    pts = grid_points(kind, {**common, "rates": ["5000", "20000"], "policy": ["fcfs", "sjf"],
                             "gpus": [1, 2]})
    recs = run_sweep(kind, pts, tmp_path / "sw", sequential=True, progress=False)
    assert len(recs) == 8 and all(r["status"] == "ok" for r in recs), recs
    for r in recs:
        params = {k: v for k, v in r["params"].items()}
        want = serve_curve(ServeConfig(**params))["runs"][0]
        assert {k: r["figures"][k] for k in SWEEP_FIGURES} == {k: want[k] for k in SWEEP_FIGURES}
        saved = json.loads((tmp_path / "sw" / "points" / f"serve-{r['key']}"
                            / "serving.json").read_text())
        assert saved["runs"][0]["p99_s"] == r["figures"]["p99_s"]
    # more GPUs never wait longer at the same arrivals (one 0.16 s class: load 0.2 and 0.9
    # on one GPU)
    fig = {(r["params"]["rates"], r["params"]["policy"], r["params"]["gpus"]): r["figures"]
           for r in recs}
    for rate in ("5000", "20000"):
        for pol in ("fcfs", "sjf"):
            assert fig[(rate, pol, 2)]["p99_s"] <= fig[(rate, pol, 1)]["p99_s"]
        assert fig[("20000", pol, 2)]["p99_s"] < fig[("20000", pol, 1)]["p99_s"]
    bad = grid_points(kind, {**common, "rates": ["10,20"]})
    rec = run_sweep(kind, bad, tmp_path / "bad", sequential=True, progress=False)[0]
    assert rec["status"] != "ok" and "rates='10,20': one value per sweep point" in rec["error"]


def test_schedule_sweep_points_are_coda_schedule_search(tmp_path):
    """Two whole-step searches on a 6-step profile of the shipped model: each point's schedule
    and figures are those of ``coda schedule search`` with the same settings."""
    from coda.cli.sweep import kinds

    assert main(["profile", "--prompts", "3", "--seeds", "77", "--steps", "6",
                 "--out", str(tmp_path / "p")]) == 0
    profile = str(tmp_path / "p" / "profile.npz")
    kind = kinds()["schedule"]
    pts = grid_points(kind, {"profile": [profile], "skip": [0.3, 0.5], "prune_videos": [1],
                             "finalists": [2], "refine": [0]})
    recs = run_sweep(kind, pts, tmp_path / "sw", sequential=True, progress=False)
    assert len(recs) == 2
    for r in recs:
        assert r["status"] == "ok", r["error"]
        out = tmp_path / f"s{r['params']['skip']}.json"
        assert main(["schedule", "search", "--profile", profile, "--skip",
                     str(r["params"]["skip"]), "--workers", "0", "--prune-videos", "1",
                     "--finalists", "2", "--refine", "0", "--out", str(out)]) == 0
        want = json.loads(out.read_text())
        saved = json.loads((tmp_path / "sw" / "points" / f"schedule-{r['key']}"
                            / "schedule.json").read_text())
        assert {k: v for k, v in saved.items() if k != "coda"} == \
            {k: v for k, v in want.items() if k != "coda"}
        chosen = next(c for c in want["coda"]["candidates"]
                      if c["plan"] == want["coda"]["plan"] and "round2" in c)
        f = r["figures"]
        assert f["psnr_db"] == chosen["round2"]["psnr_db"] and f["skip"] == chosen["skip"]
        assert f["latency_s"] == chosen["modelled"]["latency_s"]
        assert f["skip"] >= r["params"]["skip"]
        assert f["rollouts"] == want["coda"]["rollouts"]
    # the points share the full-compute videos of the calibration videos
    assert len(list((tmp_path / "sw" / "refs").glob("full-*.pt"))) == 1


def test_a_point_whose_figures_json_cannot_hold_fails_alone(tmp_path):
    k = _kind(lambda p, w: {"y": object()} if p["x"] == 2 else ["not", "a", "dict"]
              if p["x"] == 3 else {"y": p["x"]})
    recs = run_sweep(k, grid_points(k, {"x": [1, 2, 3]}), tmp_path, sequential=True,
                     progress=False, log=lambda m: None)
    assert [r["status"] for r in recs] == ["ok", "failed", "failed"]
    assert recs[1]["error"].startswith("TypeError: Object of type object is not JSON")
    assert recs[2]["error"] == "TypeError: toy returned list, expected a dict"


def test_out_empty_string_is_refused(capsys):
    assert main(["sweep", "sim", "--param", "dimms=1", "--out", "", "--no-progress"]) == 2
    assert "--out '': expected a folder path" in capsys.readouterr().err


def test_toml_strings_are_not_numbers(tmp_path):
    k = _kind()
    toml = tmp_path / "g.toml"
    toml.write_text('x = [2, "4"]\n')
    with pytest.raises(ValueError, match="x='4': expected int"):
        load_grid(k, toml)
    toml.write_bytes(b"x = 1\n\xff\n")
    with pytest.raises(ValueError, match="not a UTF-8 text file"):
        load_grid(k, toml)


#: a hang guard of the address-check tests, far beyond the timeouts they give
HANG_S = 120


def _one_connection_server(answer):
    """A local TCP server for one connection: reads the client's first bytes, then sends
    ``answer`` and closes, or (None) stays silent until the client closes, or closes itself
    after HANG_S seconds (a hang guard: a client without a timeout then reads the close, and
    is refused for that, not for a timeout). Returns the socket and its port."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.recv(100)
            if answer is not None:
                conn.sendall(answer)
                return
            conn.settimeout(HANG_S)
            try:
                while conn.recv(100):
                    pass
            except OSError:
                pass
    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_an_address_that_is_not_a_ray_gcs_is_refused_by_its_answer():
    """A TCP server that answers like HTTP/1 is not a Ray cluster: refused for its answer
    (read and judged, not waited out to the timeout), before Ray starts (ray.init would retry
    for minutes). How long it takes is measured by coda bench (checks.sweep_address_check)."""
    from coda.sweep import check_address

    srv, port = _one_connection_server(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with srv, pytest.raises(ValueError, match="something answers there, but not a Ray "
                                              "cluster's GCS"):
        check_address(f"127.0.0.1:{port}", timeout_s=5)


def test_an_address_where_nothing_answers_is_refused_at_the_timeout():
    """A server that accepts and says nothing: the check's own timeout ends the wait, and the
    refusal says so."""
    from coda.sweep import check_address

    srv, port = _one_connection_server(None)
    with srv, pytest.raises(ValueError, match=r"no Ray cluster answers there \(timed out\)"):
        check_address(f"127.0.0.1:{port}", timeout_s=0.2)


def test_results_file_contents_are_checked(tmp_path):
    k = _kind()
    pts = grid_points(k, {"x": [1]})
    path = tmp_path / "results.jsonl"
    for bad, what in [("[1, 2]\n{}\n", "line 1: not a coda sweep record"),
                      ('{"a": 1}\n', "line 1: not a coda sweep record"),
                      ("garbage\n{}\n", "line 1: not JSON"),
                      ('{"kind": "sim", "key": "k", "status": "ok", "params": {}}\n',
                       "records of sweep kind 'sim'")]:
        path.write_text(bad)
        with pytest.raises(ValueError, match=what):
            run_sweep(k, pts, tmp_path, sequential=True, progress=False, log=lambda m: None)
    path.write_bytes(b"\xff\xfe\n")
    with pytest.raises(ValueError, match="not a UTF-8 text file"):
        read_results(tmp_path)
    # a torn last line (a killed writer's) is dropped before the next record is appended
    good = '{"kind": "toy", "key": "k0", "status": "failed", "params": {}}\n'
    path.write_text(good + '{"kind": "toy", "key": "abc", "status": "ok", "fig')
    recs = run_sweep(k, pts, tmp_path, sequential=True, progress=False, log=lambda m: None)
    assert [r["figures"] for r in recs] == [{"y": 2}]
    assert len(read_results(tmp_path)) == 2
    assert path.read_text().startswith(good) and len(path.read_text().splitlines()) == 2


def test_a_second_sweep_on_the_same_folder_is_refused(tmp_path):
    import fcntl

    k = _kind()
    with open(tmp_path / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="another sweep is writing there"):
            run_sweep(k, grid_points(k, {"x": [1]}), tmp_path, sequential=True,
                      progress=False, log=lambda m: None)
    assert not (tmp_path / "results.jsonl").exists()


def test_schedule_search_rollouts_on_ray_give_the_bits_of_the_loop():
    """coda schedule search's rollouts (coda.experiments.search.judge) as Ray tasks score as
    in this process (Ray tests live in this file: one xdist worker runs them in turn)."""
    import torch

    from coda.host.model.dit import load_model
    from coda.experiments.search import StepPlan, full_videos, judge
    model, _ = load_model()
    full = full_videos(model, [3], [77], num_steps=6, guidance_scale=5.0)
    scheds = [StepPlan(6, 4, {2, 3}).schedule(), StepPlan(6, 4, {3}, ("cross_attn",)).schedule()]
    here = judge(scheds, [3], [77], full, num_steps=6, guidance_scale=5.0, workers=0)
    on_ray = judge(scheds, [3], [77], full, num_steps=6, guidance_scale=5.0, workers=1)
    assert [r["psnr_db"] for r in here] == [r["psnr_db"] for r in on_ray]
    assert torch.isfinite(torch.tensor([r["psnr_db"] for r in here])).all()
