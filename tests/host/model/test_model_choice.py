"""--model / --weights / --prompts / --prompt (coda.host.model.choice), the shipped models'
system-model presets, and what a run records of its policy's decisions (Schedule.from_events,
the FLOPs skipped)."""

import argparse
import copy

import pytest
import torch

from coda.host.model.choice import (ADHERENCE, ModelOptions, adherence, chosen_model,
                                    chosen_prompts,
                                    load_chosen, load_profiled, model_identity, model_meta)
from coda.host.model.prompts import DEMO_PROMPTS
from coda.options import add_options

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_options(parser, ModelOptions)
    return parser.parse_args(list(argv))


def tiny_text_config():
    from coda.host.model.dit import TEXT_CONFIG

    cfg = copy.deepcopy(TEXT_CONFIG)
    cfg["transformer"].update(num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
                              num_layers=2, caption_channels=16)
    cfg["text_encoder"].update(dim=16, layers=1, heads=2, pretrain_steps=3)
    return cfg        # the data's size (8 frames of 32 x 32): the classifier's


@pytest.fixture(scope="module")
def tiny_text_weights(tmp_path_factory):
    """A randomly initialised 2-layer text model saved as a weights file (+ its JSON)."""
    from coda.host.model.dit import build_model, save_model

    path = tmp_path_factory.mktemp("text") / "tiny_text.safetensors"
    save_model(build_model(tiny_text_config(), seed=0), path, path.with_suffix(".json"))
    return path


def test_prompts_are_indices_then_texts_in_canonical_form():
    assert chosen_prompts(parse()) == list(range(10))
    assert chosen_prompts(parse("--prompts", "3,1")) == [3, 1]
    # --prompt alone: only the texts; with --prompts: the indices first
    assert chosen_prompts(parse("--model", "text", "--prompt", "A  Seven moving up fast")) == \
        ["a seven moving up fast"]
    assert chosen_prompts(parse("--model", "text", "--prompts", "0",
                                "--prompt", "an eight", "--prompt", "a two and a one drifting apart")) \
        == [0, "an eight", "a two and a one drifting apart"]


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "a seven"], "--prompt 'a seven': prompt texts need --model text"),
    (["--model", "text", "--prompt", "a seven flying"], "unknown word(s) 'flying'"),
    (["--model", "text", "--prompt", "seven a"], "prompt 'seven a': expected 'a DIGIT moving"),
    (["--model", "text", "--prompt", ""], "--prompt '': the empty prompt is classifier-free"),
    (["--model", "text", "--prompts", "7", "--prompt", DEMO_PROMPTS[7].upper()],
     f"--prompt {DEMO_PROMPTS[7]!r}: asked for twice"),
    (["--model", "text", "--prompt", "a one", "--prompt", "a one"], "'a one': asked for twice"),
    (["--model", "text", "--prompts", "10"], "--prompts '10': 10 is out of range"),
])
def test_bad_prompts_are_refused_naming_them(argv, message):
    with pytest.raises(ValueError) as err:
        chosen_prompts(parse(*argv))
    assert message in str(err.value)


def test_a_model_that_is_not_shipped_is_refused_where_only_shipped_ones_serve():
    """--model takes a diffusers pipeline too (coda profile, schedule search:
    tests/experiments/test_pipeline_model.py); what needs a shipped model names the two and
    where a pipeline goes."""
    with pytest.raises(ValueError, match="--model wan: expected a shipped model "
                                         r"\(digits, text\); a diffusers pipeline is taken"):
        chosen_model(parse("--model", "wan"))
    with pytest.raises(ValueError, match="--model wan: expected a shipped model"):
        chosen_prompts(parse("--model", "wan", "--prompt", "a cat"))


def test_weights_of_the_other_kind_or_missing_are_refused(tiny_text_weights, tmp_path):
    from coda.host.model.dit import WEIGHTS_FILE, TextLatte

    assert isinstance(load_chosen(parse("--model", "text", "--weights", str(tiny_text_weights))),
                      TextLatte)
    with pytest.raises(ValueError, match="a text model, expected a digits model"):
        load_chosen(parse("--weights", str(tiny_text_weights)))
    with pytest.raises(ValueError, match="a digits model, expected a text model"):
        load_chosen(parse("--model", "text", "--weights", str(WEIGHTS_FILE)))
    with pytest.raises(FileNotFoundError, match="nothing.safetensors: missing"):
        load_chosen(parse("--model", "text", "--weights", str(tmp_path / "nothing.safetensors")))


def test_a_profile_names_its_model_and_the_commands_after_it_load_that_one(tiny_text_weights):
    from coda.host.cache.profile import model_hash

    args = parse("--model", "text", "--weights", str(tiny_text_weights))
    meta = {**model_meta(args), "model_hash": model_hash(load_chosen(args)), "steps": 3}
    assert meta["model"] == "text" and meta["weights"] == str(tiny_text_weights)
    assert model_identity(meta) == {k: meta[k] for k in ("model", "weights", "model_hash")}
    assert model_hash(load_profiled(meta, "--profile p")) == meta["model_hash"]
    with pytest.raises(ValueError, match="--profile p: made for model 'feed'"):
        load_profiled({**meta, "model_hash": "feed"}, "--profile p")


def test_adherence_is_each_models_own_figures(tiny_text_weights):
    """The digits model: the classifier's label accuracy; the text model: prompt_figures'
    four fractions (ADHERENCE lists both, the headline first)."""
    from coda.host.model.classifier import label_accuracy
    from coda.host.model.dit import DEFAULT_CONFIG, build_model
    from coda.host.model.evaluate import prompt_figures
    from coda.host.model.prompts import demo_prompt, parse_prompt

    g = torch.Generator().manual_seed(1)
    videos = torch.rand(3, 1, 8, 32, 32, generator=g) * 2 - 1
    digits = build_model(DEFAULT_CONFIG)
    got = adherence(digits, videos, [4, 1, 7])
    assert got == {"label_accuracy": label_accuracy(videos, torch.tensor([4, 1, 7]))}
    text = load_chosen(parse("--model", "text", "--weights", str(tiny_text_weights)))
    prompts = [2, "a three and a seven drifting apart", "a one moving left slow"]
    got = adherence(text, videos, prompts)
    want = prompt_figures(videos, [demo_prompt(2), *map(parse_prompt, prompts[1:])])
    assert list(got) == list(ADHERENCE["text"]) and all(
        got[k] == want[k] or (got[k] != got[k] and want[k] != want[k]) for k in got)


def test_a_static_policys_recorded_schedule_is_the_one_it_builds(tiny_text_weights):
    """Schedule.from_events of each video of a uniform-policy generation is the policy's own
    schedule (so a dynamic policy's recording is costed as what it did); events of two videos
    at once are refused."""
    from coda.experiments.rollouts import torch_driver
    from coda.host.cache.events import EventLog
    from coda.host.cache.policies import get_policy
    from coda.host.cache.schedule import Schedule
    from coda.host.model.sample import cached_generate

    model = load_chosen(parse("--model", "text", "--weights", str(tiny_text_weights)))
    policy = get_policy("uniform", interval=2, warmup=1)
    log = EventLog()
    cached_generate(model, [0, "a five"], torch_driver(model, 2), policy, events=log,
                    num_steps=5, seeds=[3, 4])
    ops = log.of("op")
    for sample in (0, 1):
        got = Schedule.from_events([e for e in ops if e.sample == sample], 2)
        assert got.reuse == policy.build(5, 2).reuse and got.ops_skipped_fraction() > 0
    with pytest.raises(ValueError, match="expected the events of one video"):
        Schedule.from_events(ops, 2)


def test_flops_skipped_weighs_each_reused_operator_by_its_flops():
    """Reusing whole steps skips that fraction of the FLOPs; reusing only cross attention
    skips its share, derived from the shipped shape's kernels."""
    from coda.experiments.evaluate import flops_skipped
    from coda.host.cache.schedule import Schedule, operator_order
    from coda.host.model.dit import DEFAULT_CONFIG, TEXT_CONFIG
    from coda.host.system.presets import shipped_shape

    for config in (DEFAULT_CONFIG, TEXT_CONFIG):
        layers = config["transformer"]["num_layers"]
        every = frozenset(operator_order(layers))
        whole = Schedule(4, layers, {(2, b): every for b in ("cond", "uncond")})
        assert flops_skipped([whole], config) == pytest.approx(whole.ops_skipped_fraction())
        cross = frozenset(r for r in every if r[1] == "cross_attn")
        only = Schedule(4, layers, {(s, b): cross for s in (1, 2, 3) for b in ("cond", "uncond")})
        shape = shipped_shape(config)
        share = sum(o.kernels.total_flops() for o in shape.ops if o.op == "cross_attn") / \
            sum(o.kernels.total_flops() for o in shape.ops)
        assert flops_skipped([only, whole], config) == pytest.approx(
            (3 * share + 1) / 8)


def test_the_shipped_models_have_system_presets():
    from coda.host.model.prompts import MAX_TOKENS
    from coda.host.system.cost import parse_target
    from coda.host.system.presets import get_spec, model_names, shipped_presets

    assert shipped_presets() == ("latte-digits", "latte-text")
    assert set(shipped_presets()) <= set(model_names())
    text, digits = get_spec("latte-text"), get_spec("latte-digits")
    assert (text.text_tokens, digits.text_tokens) == (MAX_TOKENS, 1)
    assert text.config["num_layers"] == 2 * digits.config["num_layers"] == 8
    assert parse_target("latte-text@32x32") == ("latte-text", None)
    with pytest.raises(ValueError, match="latte-text runs at its preset's resolution only"):
        parse_target("latte-text@64x64")


def test_profile_search_run_and_eval_on_the_text_model(tiny_text_weights, tmp_path):
    """The chain a user runs on the text model: coda profile --model text (its metadata
    names the model; cross attention over several text tokens changes from step to step),
    coda schedule search on that profile (the rollouts load the profiled model), coda run
    with the searched schedule, coda eval with a dynamic policy timed from its events."""
    import json

    from coda.cli import main

    model = ["--model", "text", "--weights", str(tiny_text_weights)]
    prompts = ["--prompts", "3", "--prompt", "a one moving up fast"]
    assert main(["profile", *model, *prompts, "--seeds", "77", "--steps", "6",
                 "--sensitivity-blocks", "0", "--out", str(tmp_path / "p")]) == 0
    meta = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert (meta["model"], meta["weights"]) == ("text", str(tiny_text_weights))
    assert meta["prompts"] == [3, "a one moving up fast"] and meta["shape"]["cond_tokens"] == 8
    change = {r["op"]: r["out_change"] for r in meta["stability_ranking"]}
    assert change["cross_attn"] > 0
    sched = tmp_path / "s.json"
    assert main(["schedule", "search", "--profile", str(tmp_path / "p" / "profile.npz"),
                 "--skip", "0.3", "--workers", "0", "--prune-videos", "1", "--finalists", "1",
                 "--refine", "0", "--target", "latte-text", "--out", str(sched)]) == 0
    assert main(["run", *model, *prompts, "--steps", "6", "--schedule", str(sched),
                 "--backend", "torch", "--threads", "1", "--out", str(tmp_path / "r")]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["model"] == "text" and report["prompts"] == [3, "a one moving up fast"]
    assert {f"{k}_{w}" for k in ADHERENCE["text"] for w in ("full", "cached")} <= set(report)
    assert sorted(p.name for p in (tmp_path / "r").glob("*.gif")) == [
        "a-one-moving-up-fast_1.gif", "a-three-and-a-seven-drifting-apart_0.gif", "grid.gif"]
    assert main(["eval", *model, "--prompts", "3", "--seeds", "5", "--steps", "6",
                 "--policy", "uniform,teacache", "--skip", "0.3",
                 "--profile", str(tmp_path / "p" / "profile.npz"),
                 "--out", str(tmp_path / "e")]) == 0
    rows = json.loads((tmp_path / "e" / "pareto.json").read_text())
    assert [r["modelled"]["from"] for r in rows] == ["schedule", "events"]
    assert all("digit_accuracy" in r for r in rows)
