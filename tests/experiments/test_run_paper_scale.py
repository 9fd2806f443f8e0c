"""``coda run``'s paper-scale figure (issue 60, item 5): the run's schedule transferred to the
paper-scale target of ``coda sim`` (Wan 2.1-14B, 720p x 4 s, the edge GPU preset, 4 DIMMs x
8 ranks), in report.json and the printed summary, equal to what ``coda sim`` computes for
the same schedule."""

from __future__ import annotations

import json

import pytest

from coda.cli import main


@pytest.fixture(scope="module")
def schedule_6(tmp_path_factory):
    """A 6-step schedule file of the shipped model, reused and computed operators mixed
    inside its steps (tests/mixed_schedule.py)."""
    from coda.host.cache.profile import model_hash
    from coda.host.cache.shipped import save_schedule
    from coda.host.model.dit import load_model
    from mixed_schedule import mixed_schedule

    model, _ = load_model()
    path = tmp_path_factory.mktemp("sched") / "s.json"
    save_schedule(path, mixed_schedule(6, len(model.transformer.transformer_blocks), 0.5),
                  {"model_hash": model_hash(model), "target_skip": 0.5})
    return path


def _sim_report(argv: list[str], out) -> dict:
    """What ``coda ARGV --out OUT`` writes to its report.json."""
    assert main([*argv, "--out", str(out)]) == 0
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("policy", ["coda", "uniform"])
def test_paper_scale_of_the_run_is_what_coda_sim_computes(policy, schedule_6, tmp_path,
                                                          capsys, monkeypatch):
    from coda.host.system.sim import PAPER_SCALE

    monkeypatch.setenv("COLUMNS", "1000")    # one summary row per line
    steps = 6
    run = ["run", "--backend", "torch", "--steps", str(steps), "--prompts", "3",
           "--threads", "1", "--out", str(tmp_path / "run")]
    if policy == "coda":
        run += ["--policy", "coda", "--schedule", str(schedule_6)]
        sched = ["--schedule", str(schedule_6)]
    else:
        run += ["--policy", "uniform", "--interval", "2", "--warmup", "2"]
        sched = ["--schedule", "uniform", "--interval", "2", "--warmup", "2"]
    assert main(run) == 0
    printed = capsys.readouterr().out
    paper = json.loads((tmp_path / "run" / "report.json").read_text())["paper_scale"]
    assert paper["available"] is True
    # the coda sim command line of the same schedule on the paper-scale target, by hand
    argv = ["sim", "--model", "wan2.1-14b", "--steps", str(steps), "--dimms", "4",
            "--ranks", "8", *sched[:2], "--cache", "reuse", "--cache-format", "bf16",
            *sched[2:]]
    assert PAPER_SCALE == {"model": "wan2.1-14b", "dimms": 4, "ranks": 8}
    assert sorted(paper["argv"]) == sorted(argv) and paper["argv"][0] == "sim"
    sim = _sim_report(argv, tmp_path / "sim")
    assert set(paper["systems"]) == set(sim["systems"]) == set("abcdefg")
    for letter, row in paper["systems"].items():
        assert row == {k: sim["systems"][letter][k] for k in row}, letter
        assert set(row) >= {"name", "fits"}
    assert (paper["model"]["name"], paper["model"]["width"], paper["model"]["height"]) == \
        ("wan2.1-14b", 1280, 720) == (sim["model"]["name"], sim["model"]["width"],
                                      sim["model"]["height"])
    assert paper["platform"] == sim["platform"] and paper["schedule"] == sim["schedule"]
    assert paper["platform"]["gpu"] == "rtx4090" and paper["platform"]["n_ranks"] == 32
    assert paper["schedule"]["transferred"] is (policy == "coda")
    # the summary: labelled, the paper-scale rows beside the shipped model's
    assert paper["label"] in printed and "coda " + " ".join(paper["argv"]) in printed
    for letter, row in paper["systems"].items():
        value = (f"{row['latency_s']:.4g} s, {row['speedup']:.3g}x" if row["fits"]
                 else "does not fit")
        line = next(ln for ln in printed.splitlines() if f"paper scale {letter}: " in ln)
        assert row["name"] in line and value in line


def test_a_policy_without_a_schedule_has_no_paper_scale_figure(tmp_path, capsys):
    """A calibrated dynamic policy has no static schedule to transfer: the report says so."""
    assert main(["run", "--backend", "torch", "--policy", "teacache", "--prompts", "3",
                 "--threads", "1", "--out", str(tmp_path)]) == 0
    paper = json.loads((tmp_path / "report.json").read_text())["paper_scale"]
    assert paper["available"] is False and "--policy teacache" in paper["reason"]
    assert "paper scale" in capsys.readouterr().out
