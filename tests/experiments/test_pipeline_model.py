"""``--model FOLDER``: a user's diffusers pipeline through ``coda profile`` and ``coda
schedule search`` (coda.experiments.pipeline_model), on a tiny Wan pipeline saved with
``save_pretrained`` (no download).

The environment has no ``transformers``: the pipeline loads under a stand-in module
(tests/tiny_pipelines.py) and its ``encode_prompt`` is replaced by a deterministic stand-in
text encoder (each text its own seeded embeddings), so what the commands do with a real
encoder's output is what is tested.
"""

from __future__ import annotations

import json
import sys
import zlib

import pytest
import torch

from coda.cli import main as cli
from coda.experiments.pipeline_model import load_profiled_model, pipeline_loop
from coda.host.cache.profile import Profile, model_hash
from tiny_pipelines import WAN_TEXT, stand_in_transformers, wan_pipe, wan_pipeline_class

pytestmark = pytest.mark.usefixtures("one_torch_thread")
#: 5 frames of 128 x 128: latents [4, 2, 16, 16] (SSIM's 11 x 11 window fits)
SIZE = ["--frames", "5", "--height", "128", "--width", "128"]


def _encode(self, prompt, negative_prompt=None, do_classifier_free_guidance=True,
            num_videos_per_prompt=1, device=None, **_):
    """A stand-in text encoder: [1, 6, 16] embeddings seeded by the text (the negative one
    by its own text)."""
    def embed(text):
        g = torch.Generator().manual_seed(zlib.crc32(text.encode()))
        return torch.randn(1, 6, 16, generator=g)
    return embed(prompt), embed(negative_prompt or "")


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipe") / "tiny-wan"
    wan_pipe(wan_pipeline_class()).save_pretrained(folder)
    # a None component is not saved; a real folder names its tokenizer and text encoder
    index = json.loads((folder / "model_index.json").read_text())
    index.update(tokenizer=[None, None], text_encoder=[None, None])
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


@pytest.fixture
def importable(monkeypatch):
    """``diffusers.WanPipeline`` the real class (not diffusers' placeholder for a missing
    transformers), imported under the stand-in module, while the test runs."""
    import diffusers

    module = "diffusers.pipelines.wan.pipeline_wan"
    with stand_in_transformers(WAN_TEXT, ("WanLoraLoaderMixin",)):
        import importlib
        monkeypatch.setattr(diffusers, "WanPipeline",
                            importlib.import_module(module).WanPipeline)
        try:
            yield diffusers.WanPipeline
        finally:
            sys.modules.pop(module, None)


@pytest.fixture
def loadable(importable, monkeypatch):
    """:func:`importable`, with the stand-in text encoder."""
    monkeypatch.setattr(importable, "encode_prompt", _encode)


def test_profile_then_search_on_a_pipeline_folder(pipeline_folder, loadable, tmp_path):
    prof_dir, sched = tmp_path / "prof", tmp_path / "s.json"
    assert cli(["profile", "--model", str(pipeline_folder), "--prompt", "a red fox",
                "--prompt", "a boat at sea", *SIZE, "--steps", "8", "--seeds", "3,4",
                "--sensitivity-blocks", "0", "--out", str(prof_dir)]) == 0
    prof = Profile.load(prof_dir / "profile.npz")
    meta = prof.meta
    assert meta["model"] == str(pipeline_folder.resolve())
    assert meta["pipeline_prompts"] == ["a red fox", "a boat at sea"]
    assert meta["prompts"] == [0, 1]
    assert meta["videos"] == [[0, 3], [1, 3], [0, 4], [1, 4]]
    assert (meta["frames"], meta["height"], meta["width"]) == (5, 128, 128)
    assert meta["shape"]["arch"] == "wan" and meta["shape"]["layers"] == 2

    # the loop the profile describes is the one profiled: same weights, same embeddings,
    # the latent shape of the pipeline's prepare_latents (4 channels, (5-1)/4+1 frames, /8)
    loop = load_profiled_model(meta, "test")
    assert model_hash(loop) == meta["model_hash"]
    assert loop.latent_shape == (4, 2, 16, 16)
    want = _encode(None, "a boat at sea", "")
    assert torch.equal(loop.prompts[1][0]["encoder_hidden_states"], want[0])
    assert torch.equal(loop.prompts[1][1]["encoder_hidden_states"], want[1])

    assert cli(["schedule", "search", "--profile", str(prof_dir / "profile.npz"),
                "--skip", "0.3", "--workers", "0", "--out", str(sched)]) == 0
    saved = json.loads(sched.read_text())
    assert saved["coda"]["model_hash"] == meta["model_hash"]
    assert saved["num_steps"] == 8

    # coda eval on held-out seeds: uniform, TeaCache (calibrated on the profile) and CODA
    # (searched on it, as coda schedule search did) against full compute
    out = tmp_path / "eval"
    assert cli(["eval", "--model", str(pipeline_folder), "--prompt", "a red fox", "--prompt",
                "a boat at sea", *SIZE, "--profile", str(prof_dir / "profile.npz"),
                "--policy", "uniform,teacache,coda", "--skip", "0.3", "--steps", "8",
                "--seeds", "10,11", "--workers", "0", "--out", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads((out / "pareto.json").read_text())}
    assert set(rows) == {"uniform", "teacache", "coda"}
    from coda.host.cache.schedule import Schedule
    searched = Schedule.from_json(sched.read_text())
    assert rows["coda"]["params"] == {"name": searched.name,
                                      "ops_skipped_fraction": searched.ops_skipped_fraction()}
    for r in rows.values():
        assert r["videos"] == 4 and r["flops_skipped_fraction"] is None
        assert "label_accuracy" not in r and "digit_accuracy" not in r
        assert 0 < r["ops_skipped_fraction"] < 1 and r["psnr_db"] > 0
    videos = json.loads((out / "videos.json").read_text())
    assert [(v["prompt"], v["seed"]) for v in videos["videos"]] == \
        [(0, 10), (1, 10), (0, 11), (1, 11)]
    assert "motion_px" not in videos["videos"][0]
    # the uniform row is evaluate_policy's on the loop: the same PSNR from the library
    from coda.experiments.cfg_loop import generate_videos
    from coda.experiments.evaluate import evaluate_policy
    from coda.experiments.rollouts import torch_driver
    from coda.host.cache.policies import get_policy
    from coda.experiments.metrics import psnr_db
    full = generate_videos(loop, [0, 1, 0, 1], seeds=[10, 10, 11, 11], num_steps=8,
                           guidance_scale=meta["guidance_scale"])
    uniform = get_policy("uniform", skip=0.3, profile=prof, schedule=None, num_steps=8,
                         num_layers=2)      # as coda eval builds it
    res = evaluate_policy(loop, uniform, [0, 1], [10, 11], full, num_steps=8,
                          guidance_scale=meta["guidance_scale"],
                          driver_factory=lambda n, *a, **k: torch_driver(loop, n, inputs=True))
    assert psnr_db(res["videos"], full) == rows["uniform"]["psnr_db"]
    assert (out / "pareto.png").stat().st_size > 0


def test_pipeline_options_are_checked(pipeline_folder, loadable, tmp_path, capsys):
    def error(*argv):
        assert cli(["profile", *argv, "--out", str(tmp_path / "o")]) == 2
        return capsys.readouterr().err

    folder = str(pipeline_folder)
    assert "expected at least one --prompt" in error("--model", folder)
    assert "--prompts 1,2: prompt indices" in error("--model", folder, "--prompts", "1,2",
                                                    "--prompt", "x")
    assert "--prompt 'x': asked for twice" in error("--model", folder, "--prompt", "x",
                                                    "--prompt", "x")
    assert "--frames 0: expected >= 1" in error("--model", folder, "--prompt", "x",
                                                "--frames", "0")
    assert "--frames: an option of a diffusers pipeline" in error("--model", "digits",
                                                                  "--frames", "5")
    assert "without model_index.json" in error("--model", str(tmp_path), "--prompt", "x")
    assert "expected digits, text, a diffusers pipeline folder" in error(
        "--model", "no-such-model", "--prompt", "x")
    # a missing folder is named first, before the options a pipeline would need
    assert "--model /no/such/pipe: expected digits, text, a diffusers pipeline folder" in \
        error("--model", "/no/such/pipe")
    assert not (tmp_path / "o").exists()
    # coda eval compares a pipeline in reuse mode, 16-bit entries, on a profile of it
    for extra in ([], ["--profile", "p.npz", "--cache", "forecast"],
                  ["--profile", "p.npz", "--cache-format", "int8"]):
        assert cli(["eval", "--model", folder, "--prompt", "x", *extra, "--out",
                    str(tmp_path / "e")]) == 2
        assert "expected --cache reuse, --cache-format bf16 and --profile FILE" in \
            capsys.readouterr().err
    # coda run takes the shipped models only, and says where a pipeline goes
    assert cli(["run", "--model", folder, "--backend", "torch", "--out",
                str(tmp_path / "r")]) == 2
    assert "coda.enable_cache(pipe)" in capsys.readouterr().err


def test_a_pipeline_that_cannot_encode_is_named(pipeline_folder, importable):
    """Without a tokenizer and text encoder (and no stand-in), the prompt cannot be encoded:
    one line naming the pipeline and the prompt."""
    from coda.experiments.pipeline_model import load_pipeline

    pipe = load_pipeline(str(pipeline_folder))
    with pytest.raises(ValueError, match="WanPipeline could not encode --prompt 'x'"):
        pipeline_loop(pipe, ["x"], frames=5, height=16, width=16)
