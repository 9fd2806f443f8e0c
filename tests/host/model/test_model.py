"""Moving-digit data, the shipped Latte digit model, the frame classifier and CFG sampling."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.host.model import data
from coda.host.model.classifier import digit_classifier, frame_features, label_accuracy
from coda.host.model.dit import (CONFIG_FILE, DEFAULT_CONFIG, WEIGHTS_FILE, build_model,
                                 load_model, save_model)
from coda.host.model.sample import generate


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_config():
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    cfg["transformer"].update(num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
                              num_layers=1, sample_size=16, video_length=4, caption_channels=16)
    cfg["data"].update(frames=4, size=16)
    return cfg


# ---------------------------------------------------------------- data
def test_moving_digits_shape_range_and_determinism():
    v1, l1 = data.moving_digits(5, seed=3)
    v2, l2 = data.moving_digits(5, seed=3)
    assert v1.shape == (5, 1, 8, 32, 32) and v1.dtype == torch.float32 and l1.dtype == torch.int64
    assert torch.equal(v1, v2) and torch.equal(l1, l2)
    assert v1.min() == -1.0 and v1.max() <= 1.0 and v1.max() > 0.5
    assert not torch.equal(v1, data.moving_digits(5, seed=4)[0])


def test_moving_digits_move_and_stay_inside_the_frame():
    videos, _ = data.moving_digits(64, seed=0)
    ink = (videos[:, 0] + 1) / 2                                     # [B, F, H, W]
    mass = ink.sum(dim=(2, 3))
    # Every frame shows the whole digit (no clipping at the walls): same ink in all frames.
    assert torch.allclose(mass, mass[:, :1].expand_as(mass), rtol=1e-5)
    rows = (ink.sum(3) * torch.arange(32.0)).sum(2) / mass           # centre of mass, row
    cols = (ink.sum(2) * torch.arange(32.0)).sum(2) / mass
    step = torch.hypot(rows.diff(dim=1), cols.diff(dim=1))
    assert (step.amax(dim=1) > 0.5).all()                            # every digit moves
    assert step.max() <= data.SPEED_PX[1] * 2 ** 0.5 + 1.0           # at most speed (+ rounding)


def test_requested_labels_and_errors():
    videos, labels = data.moving_digits(3, seed=1, labels=torch.tensor([0, 5, 9]))
    assert labels.tolist() == [0, 5, 9]
    with pytest.raises(ValueError, match="labels"):
        data.moving_digits(2, seed=1, labels=torch.tensor([3, 10]))
    with pytest.raises(ValueError, match="split"):
        data.digit_images("validation")
    with pytest.raises(ValueError, match="size=8"):
        data.moving_digits(1, seed=0, size=8)


def test_heldout_split_is_disjoint_and_sized():
    train, _ = data.digit_images("train")
    test, _ = data.digit_images("test")
    assert len(train) + len(test) == 1797 and len(test) == round(0.2 * 1797)
    flat_train = {bytes(t.numpy().tobytes()) for t in train}
    overlap = sum(bytes(t.numpy().tobytes()) in flat_train for t in test)
    assert overlap <= 3  # sklearn's digits holds a few exact duplicate images, nothing more


# ---------------------------------------------------------------- classifier
def test_classifier_recognises_heldout_digits():
    clf = digit_classifier()
    assert clf.heldout_accuracy > 0.97
    videos, labels = data.moving_digits(20, seed=99, split="test")
    assert label_accuracy(videos, labels) > 0.9
    noise = torch.rand(4, 1, 8, 32, 32) * 2 - 1
    assert clf.predict_frames(noise).shape == (4, 8)
    with pytest.raises(ValueError, match="expected one per video"):
        label_accuracy(videos, labels[:3])


def test_frame_features_center_the_digit():
    videos, _ = data.moving_digits(2, seed=5)
    feats = frame_features(videos[:, 0].reshape(-1, 32, 32)).reshape(2, 8, -1)
    # The digit moved, but its centred window is the same image (up to edge rounding).
    assert np.abs(feats[:, 0] - feats[:, -1]).mean() < 0.05
    with pytest.raises(ValueError, match="expected"):
        frame_features(torch.zeros(3, 8, 8))


# ---------------------------------------------------------------- model and sampling
def test_save_and_load_roundtrip(tmp_path):
    model = build_model(tiny_config(), seed=2)
    save_model(model, tmp_path / "w.safetensors", tmp_path / "c.json")
    loaded, cfg = load_model(weights=tmp_path / "w.safetensors", config=tmp_path / "c.json")
    assert cfg == model.config
    x = torch.randn(2, 1, 4, 16, 16)
    with torch.no_grad():
        assert torch.equal(loaded(x, torch.tensor([5, 900]), torch.tensor([1, 10])),
                           model.eval()(x, torch.tensor([5, 900]), torch.tensor([1, 10])))
    with pytest.raises(FileNotFoundError, match="train"):
        load_model(weights=tmp_path / "missing.safetensors", config=tmp_path / "c.json")


def test_batched_and_separate_cfg_agree_and_are_deterministic():
    model = build_model(tiny_config(), seed=2).eval()
    a = generate(model, [1, 2], num_steps=4, seed=3)
    b = generate(model, [1, 2], num_steps=4, seed=3, cfg_mode="separate")
    assert a.shape == (2, 1, 4, 16, 16) and torch.equal(a, b)
    assert torch.equal(a[1:], generate(model, [2], num_steps=4, seeds=[4]))
    with pytest.raises(ValueError, match="cfg_mode"):
        generate(model, [1], num_steps=2, cfg_mode="fused")
    with pytest.raises(ValueError, match="frames=2"):
        generate(model, [1], num_steps=2, frames=2)
    with pytest.raises(ValueError, match="labels"):
        generate(model, [11], num_steps=2)
    with pytest.raises(ValueError, match="eta=1.5"):
        generate(model, [1], num_steps=2, eta=1.5)


def test_ancestral_step_noise_is_per_sample_and_eta_zero_is_plain_ddim():
    """eta = 1 draws each step's noise from the sample's own generator (after its initial
    noise), so a sample is the same alone or in a batch; eta = 0 is DDIM's deterministic
    update, which this test recomputes with diffusers' scheduler directly."""
    from coda.host.model.sample import DEFAULT_GUIDANCE, initial_noise, make_scheduler

    model = build_model(tiny_config(), seed=2).eval()
    both = generate(model, [1, 2], num_steps=3, seeds=[5, 9], eta=1.0)
    assert torch.equal(both[1:], generate(model, [2], num_steps=3, seeds=[9], eta=1.0))
    plain = generate(model, [1, 2], num_steps=3, seeds=[5, 9], eta=0.0)
    assert not torch.equal(both, plain)
    sched = make_scheduler(model.config)
    sched.set_timesteps(3)
    x = initial_noise([5, 9], 4, 16)
    labels, null = torch.tensor([1, 2]), torch.full((2,), data.NULL_LABEL)
    with torch.no_grad():
        for t in sched.timesteps:
            tt = torch.full((2,), int(t))
            uncond, cond = model(torch.cat([x, x]), torch.cat([tt, tt]),
                                 torch.cat([null, labels])).chunk(2)
            x = sched.step(uncond + DEFAULT_GUIDANCE * (cond - uncond), t, x, eta=0.0).prev_sample
    assert torch.equal(plain, x.clamp(-1, 1))


def test_ddim_step_keeps_x0_outside_the_pixel_range():
    """The sampler's DDIM step is the closed-form v-prediction update with x0 *not* clipped:
    x0 = sqrt(abar_t) x_t - sqrt(1 - abar_t) v, eps = sqrt(abar_t) v + sqrt(1 - abar_t) x_t,
    x_prev = sqrt(abar_prev) x0 + sqrt(1 - abar_prev) eps (Song et al., DDIM eq. 12, eta 0;
    Salimans & Ho 2022 for v). Clipping x0 to [-1, 1] left a speckle on every digit."""
    from coda.host.model.sample import make_scheduler

    sched = make_scheduler(tiny_config())
    sched.set_timesteps(10)
    t, t_prev = int(sched.timesteps[-3]), int(sched.timesteps[-2])
    abar, abar_prev = sched.alphas_cumprod[t].double(), sched.alphas_cumprod[t_prev].double()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 1, 4, 8, 8, generator=gen, dtype=torch.float64)
    v = 3.0 * torch.randn(2, 1, 4, 8, 8, generator=gen, dtype=torch.float64)
    x0 = abar.sqrt() * x - (1 - abar).sqrt() * v
    assert x0.abs().max() > 1.5                       # the case clipping would change
    eps = abar.sqrt() * v + (1 - abar).sqrt() * x
    expected = abar_prev.sqrt() * x0 + (1 - abar_prev).sqrt() * eps
    got = sched.step(v, t, x, eta=0.0).prev_sample
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)   # float32 alphas


@pytest.mark.skipif(not WEIGHTS_FILE.exists(), reason="weights not trained yet")
def test_shipped_weights_are_small_and_load():
    assert WEIGHTS_FILE.stat().st_size < 20 * 2 ** 20
    model, cfg = load_model()
    assert cfg["transformer"]["video_length"] >= 8 and cfg["transformer"]["sample_size"] >= 32
    assert CONFIG_FILE.exists() and not model.training


@pytest.mark.parametrize("model, stage", [("digits", 1), ("digits", 2), ("text", 1)])
def test_shipped_training_logs_are_the_recipe(model, stage):
    """The shipped weights' training logs were written by the recipe's defaults: the header's
    steps and batches are the defaults of that model and stage, and every logged learning
    rate is the peak times the warm-up + cosine factor of that step (``_lr_factor``), to the
    log's digits."""
    import re

    from coda.host.model import train as recipe
    from coda.host.model.dit import MODELS

    chosen = MODELS[model]
    steps, batch, images, peak = ((chosen.stage1_steps, recipe.BATCH, recipe.IMAGE_BATCH, recipe.LR)
                                  if stage == 1 else
                                  (recipe.VIDEO_STEPS, recipe.VIDEO_BATCH, 0, recipe.VIDEO_LR))
    name = f"train_stage{stage}.log" if model == "digits" else f"train_{model}_stage{stage}.log"
    lines = (WEIGHTS_FILE.parent / name).read_text().splitlines()
    params = sum(p.numel() for p in build_model(chosen.config).parameters())
    assert lines[0] == (f"training {params} parameters for {steps} steps, batch {batch} videos "
                        f"+ {images} images")
    logged = [re.match(r"step\s+(\d+)\s+loss \S+\s+lr (\S+)", line) for line in lines[1:-1]]
    assert all(logged) and int(logged[-1][1]) == steps
    for m in logged:
        step = int(m[1])
        assert float(m[2]) == pytest.approx(peak * recipe._lr_factor(step - 1, steps), rel=5e-3)
    assert lines[-1].startswith(f"done: {steps} steps ")


def test_quality_metrics_known_values():
    from coda.host.model.sample import video_psnr, video_ssim

    ref = torch.rand(2, 1, 3, 16, 16) * 1.6 - 0.8
    assert video_psnr(ref, ref) == float("inf") and video_ssim(ref, ref) == pytest.approx(1.0)
    assert video_psnr(ref + 0.2, ref) == pytest.approx(20.0, abs=1e-9)  # 10 log10(2^2 / 0.04)
    noise = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0))
    s_small, s_big = video_ssim(ref + 0.05 * noise, ref), video_ssim(ref + 0.5 * noise, ref)
    assert 0 < s_big < s_small < 1
    with pytest.raises(ValueError, match="expected equal"):
        video_psnr(ref, ref[:1])


def test_single_images_skip_the_temporal_blocks_as_in_training(monkeypatch):
    """generate(frames=1) runs the model as its single frames were trained (Latte's
    image-video joint training: no temporal blocks); videos run them."""
    model = build_model(tiny_config(), seed=2).eval()
    seen = []
    real = type(model).forward

    def spy(self, sample, timestep, labels, temporal=True):
        seen.append((sample.shape[2], temporal))
        return real(self, sample, timestep, labels, temporal=temporal)

    monkeypatch.setattr(type(model), "forward", spy)
    generate(model, [4], num_steps=2, frames=1)
    generate(model, [4], num_steps=2)
    frames = model.config["data"]["frames"]
    assert seen == [(1, False)] * 2 + [(frames, True)] * 2


def test_cached_generate_reports_and_detaches():
    from coda.host.nme.backend import TorchBackend
    from coda.host.cache.engine import get_coda_cache_hook
    from coda.host.nmp.driver import NMPDriver
    from coda.host.model.sample import cached_generate
    from coda.host.cache.policies import UniformIntervalPolicy
    from coda.hw.nme.isa import NMEConfig

    model = build_model(tiny_config(), seed=2).eval()
    driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 14))
    policy = UniformIntervalPolicy(default_interval=2, warmup=2)
    videos, stats = cached_generate(model, [4], driver, policy, num_steps=6, seed=1)
    assert videos.shape == (1, 1, 4, 16, 16)
    assert stats["ops_skipped_fraction"] == policy.build(6, 1).ops_skipped_fraction() == 2 / 6
    assert stats["segments"] == 2 * 2 * 2 and driver.stats["programs"] == stats["programs"]
    assert get_coda_cache_hook(model.transformer) is None and driver.keys() == []


@pytest.fixture(scope="module")
def tiny_cache_slot():
    """(model, bytes one video caches): read off a cached generation's operator events, one
    [T, C] slot of 16-bit elements per CFG branch x layer x operator type the engine meets
    (the schedule's real operator types, not a count written here)."""
    from coda.host.nme.backend import TorchBackend
    from coda.host.nmp.driver import NMPDriver
    from coda.host.cache.events import EventLog
    from coda.host.model.sample import cached_generate
    from coda.host.cache.policies import UniformIntervalPolicy
    from coda.host.cache.schedule import OP_TYPES, operator_order
    from coda.hw.nme.isa import NMEConfig

    model = build_model(tiny_config(), seed=2).eval()
    log = EventLog()
    driver = NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 14))
    cached_generate(model, [4], driver, UniformIntervalPolicy(default_interval=2, warmup=1),
                    events=log, num_steps=3, seed=1)
    ops = log.of("op")
    slots = {(e.branch, e.layer, e.op) for e in ops}
    # every (layer, op) of the schedule's forward order, in both branches: 2 x 1 x 5
    assert {(layer, op) for _, layer, op in slots} == set(operator_order(1))
    assert len({op for _, _, op in slots}) == len(OP_TYPES) == 5
    (tokens, channels), = {(e.tokens, e.channels) for e in ops}
    assert {e.stored_bytes for e in ops} <= {0, tokens * channels * 2}
    branches = {b for b, _, _ in slots}
    return model, (len(slots) // len(branches), len(branches), tokens, channels)


def _needed_words(slot, videos: int, ranks: int, lanes: int) -> float:
    """Words per rank for the slots of ``videos`` videos as cache_mem_words documents: each
    rank's tile (the largest, of ceil(T / ranks) tokens) in a power-of-two region, one bank
    colour of 4 per slot group (branch of a video) with one more slot per group for the sum
    segments' zeros, the fullest colour holding ceil(groups / 4) groups, 1.5x headroom."""
    per_group, branches, tokens, channels = slot
    per_group += 1
    tile = math.ceil(math.ceil(tokens / ranks) * channels / lanes)
    region = 2 ** math.ceil(math.log2(tile))
    return 1.5 * 4 * math.ceil(videos * branches / 4) * per_group * region


@settings(max_examples=100, deadline=None)
@given(videos=st.integers(1, 2000), ranks=st.integers(1, 16),
       lanes=st.sampled_from([1, 2, 4, 8, 16, 32]), inputs=st.booleans())
def test_cache_mem_words_is_the_smallest_power_of_two_holding_the_slots(
        tiny_cache_slot, videos, ranks, lanes, inputs):
    """With ``inputs`` (monitor references) every slot group holds twice the slots."""
    from coda.host.model.sample import cache_mem_words

    model, slot = tiny_cache_slot
    if inputs:
        slot = (2 * slot[0],) + slot[1:]
    needed = _needed_words(slot, videos, ranks, lanes)
    words = cache_mem_words(model, videos, ranks=ranks, lanes=lanes, inputs=inputs)
    assert words & (words - 1) == 0 and words >= 1 << 18 and words >= needed
    assert words == 1 << 18 or words // 2 < needed     # no power of two smaller would do


def test_cache_mem_words_counts_all_five_operator_types(tiny_cache_slot):
    """120 videos over 2 ranks of 8 lanes: the 5 operator types of a slot group and its slot
    of zeros need 276,480 words, 4 types would need 230,400 <= 2**18, so the power-of-two
    round-up no longer hides a wrong count."""
    from coda.host.model.sample import cache_mem_words

    model, slot = tiny_cache_slot
    assert slot[0] == 5
    needed = _needed_words(slot, 120, 2, 8)
    assert _needed_words((4,) + slot[1:], 120, 2, 8) <= 1 << 18 < needed
    words = cache_mem_words(model, 120, ranks=2, lanes=8)
    assert words >= needed and words // 2 < needed
    assert cache_mem_words(model, 120, ranks=4, lanes=8) == 1 << 18   # half the words each
    with pytest.raises(ValueError, match="videos=0"):
        cache_mem_words(model, 0, ranks=2, lanes=8)


def test_side_by_side_gif(tmp_path):
    from PIL import Image

    from coda.host.model.sample import side_by_side_gif

    a, _ = data.moving_digits(2, seed=0)
    side_by_side_gif(tmp_path / "v.gif", a, -a, scale=2, gap=2)
    with Image.open(tmp_path / "v.gif") as img:
        assert img.n_frames == 8 and img.size == (2 * (32 + 2) * 2, 2 * (32 + 2) * 2)
    with pytest.raises(ValueError, match="one shape"):
        side_by_side_gif(tmp_path / "w.gif", a, a[:1])
    # a grid: 3 samples in 2 columns -> 2 rows, the missing cell black
    b, _ = data.moving_digits(3, seed=1)
    side_by_side_gif(tmp_path / "g.gif", b, -b, scale=1, gap=2, columns=2)
    with Image.open(tmp_path / "g.gif") as img:
        assert img.size == (2 * 2 * (32 + 2), 2 * (32 + 2))
        px = np.array(img.convert("L"))
    cell = lambda r, c: px[r * 34:r * 34 + 32, c * 68:c * 68 + 32]  # noqa: E731  full panels
    first = ((b[:, 0, 0] + 1) * 127.5).round().numpy()
    assert np.array_equal(cell(0, 1), first[1]) and np.array_equal(cell(1, 0), first[2])
    assert (cell(1, 1) == 0).all()
    with pytest.raises(ValueError, match="columns=0"):
        side_by_side_gif(tmp_path / "x.gif", a, columns=0)


# ---------------------------------------------------------------- training and evaluation
def test_min_snr_weights_follow_the_formula():
    from diffusers import DDPMScheduler

    from coda.host.model.train import min_snr_weights

    sched = DDPMScheduler(**DEFAULT_CONFIG["scheduler"])
    t = torch.tensor([0, 100, 500, 900, 999])
    abar = sched.alphas_cumprod[t].double()
    snr = abar / (1 - abar)
    want = torch.minimum(snr, torch.tensor(5.0, dtype=torch.float64)) / (snr + 1)
    assert torch.allclose(min_snr_weights(sched, t).double(), want, rtol=1e-6)
    assert min_snr_weights(sched, t)[0] == pytest.approx(5 / (float(snr[0]) + 1), rel=1e-5)
    assert torch.equal(min_snr_weights(sched, t, gamma=0), torch.ones(5))
    eps = DDPMScheduler(**{**DEFAULT_CONFIG["scheduler"], "prediction_type": "epsilon"})
    assert torch.allclose(min_snr_weights(eps, t).double(),
                          torch.minimum(snr, torch.tensor(5.0, dtype=torch.float64)) / snr,
                          rtol=1e-6)


def test_two_stage_recipe_starts_stage_2_from_stage_1(tmp_path, capsys):
    """``coda train`` writes stage 1 beside the weights and stage 2 starts from it: with a
    zero stage-2 learning rate the optimiser moves nothing, so the final EMA weights equal
    stage 1's (up to the EMA's float rounding), and both differ from a fresh model. Bad
    options: one ``coda: error:`` line naming the value, exit 2, nothing trained."""
    from safetensors.torch import load_file

    from coda.cli import main
    from coda.host.model.train import stage1_path

    out = tmp_path / "w.safetensors"
    args = ["train", "--steps", "2", "--batch-size", "1", "--image-batch-size", "2",
            "--video-steps", "1", "--video-batch-size", "1", "--video-lr", "0", "--threads", "1",
            "--weights", str(out), "--config", str(tmp_path / "w.json"),
            "--state-dir", str(tmp_path / "state")]
    assert main(args) == 0
    first, final = load_file(str(stage1_path(out))), load_file(str(out))
    assert stage1_path(out).name == "w_stage1.safetensors"
    assert stage1_path(out).with_suffix(".json").exists() and (tmp_path / "w.json").exists()
    fresh = build_model().state_dict()
    assert any(not torch.equal(first[k], fresh[k]) for k in fresh)
    assert all(torch.allclose(first[k], final[k], rtol=1e-6, atol=1e-7) for k in first)
    capsys.readouterr()
    before = out.stat().st_mtime_ns
    assert main(["train", "--stage", "2", "--init", str(tmp_path / "none.safetensors"),
                 "--weights", str(out)]) == 2
    assert capsys.readouterr().err == (f"coda: error: --init {tmp_path / 'none.safetensors'}: "
                                       "no such weights file (run stage 1 first)\n")
    assert main(["train", "--video-steps", "-1"]) == 2
    assert capsys.readouterr().err == "coda: error: --video-steps -1: expected >= 0\n"
    assert out.stat().st_mtime_ns == before


def test_video_figures_on_training_data():
    """The data itself: the classifier's per-frame hits, identity counted by hand, and the
    motion range built from the same reference videos holds >= 95 % of them."""
    from coda.host.model.evaluate import (MOTION_REFERENCE_SEED, MOTION_REFERENCE_VIDEOS,
                                          centroid_steps, motion_range, video_figures)

    videos, labels = data.moving_digits(30, seed=123, split="test")
    fig = video_figures(videos, labels)
    pred = digit_classifier().predict_frames(videos)
    assert fig["label_accuracy"] == float((pred == labels.numpy()[:, None]).mean())
    assert fig["identity_kept"] == float(np.mean([len(set(row)) == 1 for row in pred.tolist()]))
    assert fig["predicted"] == pred.tolist()
    low, high = motion_range()
    assert 0 < low < high <= data.SPEED_PX[1] * 2 ** 0.5 + 1
    ref, ref_labels = data.moving_digits(MOTION_REFERENCE_VIDEOS, MOTION_REFERENCE_SEED)
    assert video_figures(ref, ref_labels, (low, high))["motion_in_range"] >= 0.95
    # a digit that stands still, and an empty video, do not move like the data
    still = videos[:, :, :1].expand_as(videos)
    assert video_figures(still, labels, (low, high))["motion_in_range"] == 0.0
    assert centroid_steps(torch.full((1, 1, 8, 32, 32), -1.0)).abs().max() == 0
    with pytest.raises(ValueError, match="expected"):
        video_figures(videos, labels[:3])
    with pytest.raises(ValueError, match="F>=2"):
        centroid_steps(videos[:, :, :1])


def test_evaluate_reports_every_digit():
    from coda.host.model.evaluate import evaluate

    model = build_model(tiny_config(), seed=2).eval()
    with pytest.raises(ValueError, match="per_digit=0"):
        evaluate(model, per_digit=0)
    report = evaluate(model, per_digit=1, num_steps=2, seed_base=7)
    assert report["videos"] == 10 and len(report["per_digit_accuracy"]) == 10
    assert report["min_digit_accuracy"] == min(report["per_digit_accuracy"])
    assert 0 <= report["identity_correct"] <= report["identity_kept"] <= 1


# ---------------------------------------------------------------- text-conditioned model

def tiny_text_config():
    from coda.host.model.dit import TEXT_CONFIG

    cfg = copy.deepcopy(TEXT_CONFIG)
    cfg["transformer"].update(num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
                              num_layers=2, sample_size=16, video_length=4, caption_channels=16)
    cfg["text_encoder"].update(dim=16, layers=1, heads=2, pretrain_steps=3)
    cfg["data"].update(frames=4, size=16, digit_size=8)
    return cfg


def test_prompt_texts_parse_back_to_their_specs():
    """Every prompt form round-trips through its canonical text; 'a'/'an' and case are
    normalised; words outside the vocabulary and sentences outside the forms are refused."""
    from coda.host.model.prompts import (DEMO_PROMPTS, DIRECTIONS, SPEEDS, PromptSpec,
                                         parse_prompt)

    specs = [PromptSpec(()), *(PromptSpec((d,)) for d in range(10)),
             *(PromptSpec((d,), r, v) for d in range(10) for r in DIRECTIONS for v in SPEEDS),
             *(PromptSpec((a, b), "apart") for a in range(10) for b in range(10))]
    for spec in specs:
        assert parse_prompt(spec.text) == spec
    assert parse_prompt("A  Eight moving UP fast") == PromptSpec((8,), "up", "fast")
    assert parse_prompt("a eight") == PromptSpec((8,)) and PromptSpec((8,)).text == "an eight"
    assert [parse_prompt(p).text for p in DEMO_PROMPTS] == list(DEMO_PROMPTS)
    for bad, word in (("a seven moving sideways fast", "'sideways'"), ("a cat", "'cat'"),
                      ("a seven <eos>", "'<eos>'")):
        with pytest.raises(ValueError, match=f"unknown word\\(s\\) {word}"):
            parse_prompt(bad)
    for bad in ("seven", "a seven moving up", "a seven and a two moving apart", "moving a up fast"):
        with pytest.raises(ValueError, match="expected 'a DIGIT moving DIRECTION SPEED'"):
            parse_prompt(bad)
    with pytest.raises(ValueError, match="expected no digit"):
        PromptSpec((1, 2), "up", "fast")


def test_tokens_are_words_eos_and_padding():
    from coda.host.model.prompts import (EOS, MAX_TOKENS, PAD, VOCABULARY, PromptSpec,
                                         parse_prompt, tokenize)

    specs = [parse_prompt("a three and a seven drifting apart"), PromptSpec(())]
    tokens = tokenize(specs)
    assert tokens.shape == (2, MAX_TOKENS) and tokens.dtype == torch.long
    words = [[VOCABULARY[i] for i in row] for row in tokens.tolist()]
    assert words[0] == ["a", "three", "and", "a", "seven", "drifting", "apart", EOS]
    assert words[1] == [EOS] + [PAD] * (MAX_TOKENS - 1)


@pytest.mark.parametrize("prompt", ["a seven moving up-left fast", "a two moving down slow",
                                    "a three and a seven drifting apart", "a four"])
def test_prompted_videos_show_the_prompt(prompt):
    """The rendered trajectory is what the prompt says: the ink's centroid moves by the
    direction times the speed each frame (up to the integer-pixel rounding of the corners),
    two digits drifting apart end on opposite halves, and the digits are the prompt's."""
    from coda.host.model.prompts import DIRECTIONS, SPEEDS, parse_prompt

    spec = parse_prompt(prompt)
    videos = data.prompted_videos([spec] * 4, seed=3)
    assert videos.shape == (4, 1, 8, 32, 32) and videos.min() >= -1 and videos.max() <= 1
    assert torch.equal(videos, data.prompted_videos([spec] * 4, seed=3))
    gen = torch.Generator().manual_seed(0)
    corners = data.spec_corners(spec, 8, 16, gen).float()
    assert corners.min() >= 0 and corners.max() <= 16
    steps = corners[:, 1:] - corners[:, :-1]
    if spec.direction in DIRECTIONS:
        want = torch.tensor(DIRECTIONS[spec.direction]) * SPEEDS[spec.speed]
        assert torch.allclose(steps.mean(dim=(0, 1)), want, atol=1 / 7 + 1e-6)
    elif spec.direction == "apart":
        assert torch.equal(steps[0], torch.tensor([[0.0, -1.0]] * 7))
        assert torch.equal(steps[1], torch.tensor([[0.0, 1.0]] * 7))
        clf = digit_classifier()
        last = videos[:, 0, -1]
        assert clf.svc.predict(frame_features(last[..., :16])).tolist().count(3) >= 3
        assert clf.svc.predict(frame_features(last[..., 16:])).tolist().count(7) >= 3
    else:
        assert torch.equal(steps, torch.zeros_like(steps))
    with pytest.raises(ValueError, match="the null prompt has no video"):
        data.prompted_videos([data_null_spec()], seed=0)


def data_null_spec():
    from coda.host.model.prompts import PromptSpec

    return PromptSpec(())


def test_text_model_cross_attention_depends_on_the_query_and_batch_is_invariant():
    """The text model's cross attention is not constant (several tokens, different weights
    per query), and a sample's prediction does not depend on its batch."""
    from coda.host.model.dit import latte_init
    from coda.host.model.prompts import parse_prompt, tokenize

    torch.manual_seed(0)
    model = build_model(tiny_text_config(), seed=1)
    latte_init(model)
    for p in model.parameters():   # break adaLN-Zero's identity start
        p.data.add_(0.05 * torch.randn_like(p))
    model.eval()
    tokens = tokenize([parse_prompt("a three and a seven drifting apart"),
                       parse_prompt("a one moving up fast"), parse_prompt("")])
    x = torch.randn(3, 1, 4, 16, 16)
    t = torch.tensor([900, 500, 10])
    seen = {}
    attn = model.transformer.transformer_blocks[0].attn2

    def keep_first(module, args, out):
        seen.setdefault("out", out.detach())

    handle = attn.register_forward_hook(keep_first)
    with torch.no_grad():
        full = model(x, t, tokens)
        single = torch.cat([model(x[i:i + 1], t[i:i + 1], tokens[i:i + 1]) for i in range(3)])
    handle.remove()
    assert torch.equal(full, single)
    out = seen["out"]                 # [B*F, query tokens, hidden]; one key would give equal rows
    assert not torch.equal(out[0], out[0, :1].expand_as(out[0]))


def test_pretrained_text_encoder_keeps_every_word_and_reads_the_grammar():
    """After pretraining, the tied head reads every word of held-out prompts back from the
    encoder's output, a masked word is inferred from its context where the grammar fixes it,
    and the ten digit words come out distinct."""
    from coda.host.model.prompts import (MASK, VOCABULARY, PromptSpec, parse_prompt, random_specs,
                                         tokenize)
    from coda.host.model.text_encoder import TextEncoder, pretrain, reconstruct

    torch.manual_seed(0)
    enc = TextEncoder()
    tokens = tokenize(random_specs(200, torch.Generator().manual_seed(12345)))
    out = pretrain(enc, 300, batch=128, lr=3e-3, seed=1)
    assert out["steps"] == 300
    enc.eval()
    assert torch.equal(reconstruct(enc, tokens), tokens)
    masked = tokenize([parse_prompt("a seven moving up fast")])
    masked[0, 2] = VOCABULARY.index(MASK)                       # "moving" masked
    assert VOCABULARY[int(reconstruct(enc, masked)[0, 2])] == "moving"
    with torch.no_grad():
        seq, _ = enc(tokenize([PromptSpec((d,)) for d in range(10)]))
    digit = torch.nn.functional.normalize(seq[:, 1], dim=1)
    cos = digit @ digit.T
    assert cos[~torch.eye(10, dtype=torch.bool)].max() < 0.9
    with pytest.raises(ValueError, match="expected >= 0, >= 1 and in \\[0, 1\\)"):
        pretrain(enc, 1, mask_fraction=1.0)


def test_text_diagnostics_see_merged_digit_words():
    """The digit-word cosine is the largest over pairs of digit words: an encoder whose ten
    digit embeddings are made one reads 1; the single-frame accuracy is over 10 x per_digit
    frames."""
    from coda.host.model.evaluate import text_diagnostics
    from coda.host.model.prompts import DIGIT_WORDS, VOCABULARY

    model = build_model(tiny_text_config(), seed=3).eval()
    out = text_diagnostics(model, per_digit=1, guidance_scale=2.0, num_steps=2, seed_base=5,
                           eta=0.0)
    assert out["digit_word_cosine_max"] < 1 - 1e-3
    assert out["still_digit_accuracy"] in {k / 10 for k in range(11)}
    rows = [VOCABULARY.index(w) for w in DIGIT_WORDS]
    with torch.no_grad():
        emb = model.text_encoder.token_embedding.weight
        emb[rows] = emb[rows[0]].clone()
    merged = text_diagnostics(model, per_digit=1, guidance_scale=2.0, num_steps=2, seed_base=5,
                              eta=0.0)
    assert merged["digit_word_cosine_max"] == pytest.approx(1.0, abs=1e-6)


def test_training_keeps_the_pretrained_text_encoder_frozen(tmp_path):
    """coda train pretrains the text encoder, then trains everything else: the written
    weights hold the encoder of a plain pretraining run, bit for bit, and the DiT moved."""
    from safetensors.torch import load_file

    from coda.host.model import train as train_mod
    from coda.host.model.dit import latte_init
    from coda.host.model.text_encoder import pretrain

    cfg = tiny_text_config()
    train_mod.train(steps=3, batch_size=2, image_batch_size=2, lr=1e-3, seed=4, log_every=1,
                    config=cfg, weights=tmp_path / "w.safetensors", config_path=tmp_path / "w.json")
    got = load_file(str(tmp_path / "w.safetensors"))
    ref = build_model(copy.deepcopy(cfg), seed=4)
    latte_init(ref)
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    pretrain(ref.text_encoder, cfg["text_encoder"]["pretrain_steps"], seed=4)
    for k, v in ref.state_dict().items():
        if k.startswith("text_encoder."):
            assert torch.equal(got[k], v), k
    assert any(not torch.equal(got[k], start[k]) for k in start
               if k.startswith("text_encoder.")), "pretraining changed nothing"
    assert not torch.equal(got["pooled_projection.weight"], start["pooled_projection.weight"])


def test_train_takes_stage_1_length_from_the_models_recipe(tmp_path, monkeypatch):
    """coda train's stage 1 runs the chosen model's recipe length unless --steps says
    otherwise."""
    from coda.host.model import train as train_mod
    from coda.host.model.dit import MODELS

    got = []
    monkeypatch.setattr(train_mod, "train", lambda steps, *a, **k: got.append(steps))
    for model in MODELS:
        train_mod.main(train_mod.TrainConfig(model=model, video_steps=0,
                                             weights=tmp_path / f"{model}.safetensors"))
    train_mod.main(train_mod.TrainConfig(model="text", video_steps=0, steps=3,
                                         weights=tmp_path / "t.safetensors"))
    assert got == [m.stage1_steps for m in MODELS.values()] + [3]
    assert MODELS["digits"].stage1_steps == 7000 and MODELS["text"].stage1_steps == 5000


def test_training_resumes_to_the_same_bits(tmp_path, monkeypatch):
    """A training run stopped after its state was kept and resumed ends with the same EMA
    weights, losses and state as an uninterrupted run; a state of other arguments is refused."""
    from safetensors.torch import load_file

    from coda.host.model import train as train_mod

    cfg = tiny_text_config()
    kw = dict(steps=4, batch_size=2, image_batch_size=2, lr=1e-3, seed=5, log_every=1,
              config=cfg, state_every=2)
    whole = train_mod.train(weights=tmp_path / "a.safetensors", config_path=tmp_path / "a.json",
                            state_path=tmp_path / "a.pt", **kw)
    real_update, calls = train_mod._ema_update, []

    def stop_at_third(ema, model, step):
        calls.append(step)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_update(ema, model, step)

    monkeypatch.setattr(train_mod, "_ema_update", stop_at_third)
    with pytest.raises(KeyboardInterrupt):
        train_mod.train(weights=tmp_path / "b.safetensors", config_path=tmp_path / "b.json",
                        state_path=tmp_path / "b.pt", **kw)
    monkeypatch.setattr(train_mod, "_ema_update", real_update)
    assert torch.load(tmp_path / "b.pt", weights_only=False)["step"] == 2
    again = train_mod.train(weights=tmp_path / "b.safetensors", config_path=tmp_path / "b.json",
                            state_path=tmp_path / "b.pt", resume=True, **kw)
    assert again["resumed_from"] == 2 and again["final_loss"] == whole["final_loss"]
    a, b = load_file(str(tmp_path / "a.safetensors")), load_file(str(tmp_path / "b.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa = torch.load(tmp_path / "a.pt", weights_only=False)
    sb = torch.load(tmp_path / "b.pt", weights_only=False)
    assert sa["losses"] == sb["losses"] and sa["step"] == sb["step"] == 4
    with pytest.raises(ValueError, match="a training state of other arguments"):
        train_mod.train(weights=tmp_path / "c.safetensors", config_path=tmp_path / "c.json",
                        state_path=tmp_path / "b.pt", resume=True, **{**kw, "lr": 2e-3})


def test_prompt_figures_on_data_and_on_reversed_data():
    """On held-out data videos every direction and speed reads as prompted and the digits
    are recognised; played backwards every direction is wrong (a single digit's velocity
    flips; two digits converge) while speeds and digits stay right."""
    from coda.host.model.evaluate import prompt_figures
    from coda.host.model.prompts import random_specs

    specs = random_specs(60, torch.Generator().manual_seed(7))
    videos = data.prompted_videos(specs, 7, split="test")
    fig = prompt_figures(videos, specs)
    assert fig["direction_accuracy"] == 1.0 and fig["speed_accuracy"] == 1.0
    assert fig["identity_kept"] == 1.0 and fig["digit_accuracy"] >= 0.98
    assert fig["pairs"] == sum(len(s.digits) == 2 for s in specs) > 0
    assert fig["moving_single"] == len(specs) - fig["pairs"]
    assert fig["digits_named"] == 8 * fig["moving_single"] + 2 * fig["pairs"]
    back = prompt_figures(videos.flip(2), specs)
    assert back["direction_accuracy"] == 0.0 and back["speed_accuracy"] == 1.0
    with pytest.raises(ValueError, match="expected \\[B, 1, F>=2, H, W\\] and B specs"):
        prompt_figures(videos[:2], specs)


def test_text_model_conditions_from_indices_texts_and_specs():
    """Prompt indices select the demo prompts (what --prompts 0-9 gives), texts and specs
    give the same tokens; the empty prompt, an index out of range and a text outside the
    grammar are refused."""
    from coda.host.model.prompts import DEMO_PROMPTS, parse_prompt, tokenize

    model = build_model(tiny_text_config())
    want = tokenize([parse_prompt(p) for p in DEMO_PROMPTS])
    assert torch.equal(model.conditions(list(range(10))), want)
    assert torch.equal(model.conditions(torch.arange(10)), want)
    assert torch.equal(model.conditions(list(DEMO_PROMPTS)), want)
    assert torch.equal(model.conditions([parse_prompt(p) for p in DEMO_PROMPTS]), want)
    assert torch.equal(model.null_conditions(2), tokenize([parse_prompt("")] * 2))
    for bad, msg in (([10], "prompt index 10: expected 0..9"), ([""], "each naming a digit"),
                     (["a cat"], "unknown word"), ([], "at least one prompt")):
        with pytest.raises(ValueError, match=msg):
            model.conditions(bad)
