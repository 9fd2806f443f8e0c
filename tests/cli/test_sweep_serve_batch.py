"""coda sweep serve takes the batch policy and its --max-batch as grid parameters: each point
is the coda serve run with that policy and batch size, its cost per video included."""

from __future__ import annotations

from coda.sweep import grid_points, run_sweep


def test_serve_sweep_takes_the_batch_policy(tmp_path):
    from coda.cli.sweep import kinds
    from coda.host.system.serving import SWEEP_FIGURES, ServeConfig, serve_curve

    kind = kinds()["serve"]
    assert {"max_batch", "price_gpu", "lifetime_years"} <= {p.name for p in kind.params}
    pts = grid_points(kind, {"model": ["latte-digits"], "mix": ["64x64:20:1"],
                             "requests": [60], "rates": ["50000"], "gpus": [1],
                             "policy": ["fcfs", "batch"], "max_batch": [1, 3]})
    recs = run_sweep(kind, pts, tmp_path / "sw", sequential=True, progress=False)
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs), recs
    fig = {}
    for r in recs:
        want = serve_curve(ServeConfig(**r["params"]))["runs"][0]
        assert {k: r["figures"][k] for k in SWEEP_FIGURES} == {k: want[k] for k in SWEEP_FIGURES}
        fig[(r["params"]["policy"], r["params"]["max_batch"])] = r["figures"]
    # a batch of one is FCFS; the batch size only matters to the batch policy
    for k in SWEEP_FIGURES:
        assert fig[("batch", 1)][k] == fig[("fcfs", 1)][k] == fig[("fcfs", 3)][k], k
    assert fig[("batch", 3)]["mean_batch"] > 1
    assert fig[("batch", 3)]["throughput_per_h"] > fig[("fcfs", 1)]["throughput_per_h"]
