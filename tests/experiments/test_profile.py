"""The profiler: relative L1 change of every operator's output and input between steps,
numerators on the NMEs (l1_distance against the previous step's tensor in rank memory)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from coda.cli import main
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.host.model.dit import DEFAULT_CONFIG, build_model
from coda.host.model.sample import cached_generate
from coda.host.cache.policies.base import CachePolicy, Decision
from coda.host.cache.profile import Profile, model_hash
from coda.lists import parse_int_list
from coda.experiments.profile import plot_heatmap, profile_model, stability_ranking, depth_table
from coda.host.cache.schedule import BRANCHES, OP_TYPES
from coda.hw.nme.isa import NMEConfig

TINY = dict(num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
            num_layers=2, sample_size=16, video_length=4, caption_channels=16)
STEPS = 4


def tiny_model(seed=1):
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    cfg["transformer"].update(TINY)
    cfg["data"].update(frames=4, size=16)
    return build_model(cfg, seed=seed).eval()


def factory(backend=None):
    from coda.host.cache.profile import InputNormDriver
    return lambda videos: InputNormDriver(backend or TorchBackend(),
                                           NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)


class _Recorder(NMPDriver):
    """Keeps a host copy of every tensor written (outputs and kept inputs)."""

    def __init__(self):
        super().__init__(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
        self.seen = {}

    def store(self, key, tensor, group=None, x_of=None):
        self.seen.setdefault(key, []).append(tensor.float().clone())
        super().store(key, tensor, group, x_of)


class _StoreAll(CachePolicy):
    def decide(self, q):
        return Decision(False, store=True, keep_input=True)


@pytest.fixture(scope="module")
def tiny_profile():
    model = tiny_model()
    return model, profile_model(model, [3, 7], [5], factory(), num_steps=STEPS,
                                guidance_scale=3.0)


def test_profile_equals_host_relative_l1_of_the_stored_tensors(tiny_profile):
    model, prof = tiny_profile
    rec = _Recorder()
    cached_generate(model, [3, 7], rec, _StoreAll(), num_steps=STEPS, guidance_scale=3.0,
                    seeds=[5, 5])
    assert prof.out_change.shape == (2, STEPS, 2, 2, len(OP_TYPES))
    assert np.isnan(prof.out_change[:, 0]).all() and np.isnan(prof.in_change[:, 0]).all()
    for key, tensors in rec.seen.items():
        _, branch, sample, layer, op = key[:5]
        what = "in_change" if key[-1] == "in" else "out_change"
        assert len(tensors) == STEPS
        for s in range(1, STEPS):
            prev, cur = tensors[s - 1].double(), tensors[s].double()
            expect = float((cur - prev).abs().sum() / prev.abs().sum())
            got = getattr(prof, what)[sample, s, BRANCHES.index(branch), layer, OP_TYPES.index(op)]
            assert got == pytest.approx(expect, rel=1e-4, abs=1e-7), (key, s)
    # one condition token: cross attention's output does not depend on its input
    assert np.all(prof.out_change[:, 1:, :, :, OP_TYPES.index("cross_attn")] == 0)
    assert np.all(prof.out_change[:, 1:, :, :, OP_TYPES.index("spatial_ffn")] > 0)


def test_profile_is_per_video_not_per_batch(tiny_profile):
    model, prof = tiny_profile
    alone = profile_model(model, [7], [5], factory(), num_steps=STEPS, guidance_scale=3.0)
    for name in ("out_change", "in_change", "out_abs", "in_abs"):
        np.testing.assert_array_equal(getattr(alone, name)[0], getattr(prof, name)[1])


def test_profile_on_the_rtl_backend_gives_the_same_numbers(tiny_profile):
    from coda.host.nme.backend import get_backend
    model, prof = tiny_profile
    backend = get_backend("rtl")
    try:
        rtl = profile_model(model, [3], [5], factory(backend), num_steps=3, guidance_scale=3.0)
    finally:
        backend.close()
    ref = profile_model(model, [3], [5], factory(), num_steps=3, guidance_scale=3.0)
    np.testing.assert_array_equal(rtl.out_change, ref.out_change)
    np.testing.assert_array_equal(rtl.in_change, ref.in_change)


def test_save_load_check_and_heatmap(tiny_profile, tmp_path):
    model, prof = tiny_profile
    prof.save(tmp_path)
    back = Profile.load(tmp_path / "profile.npz")
    np.testing.assert_array_equal(back.out_change, prof.out_change)
    assert back.meta["model_hash"] == model_hash(model) and back.meta["steps"] == STEPS
    assert json.loads((tmp_path / "profile.json").read_text())["prompts"] == [3, 7]
    back.check_for(model_hash(model), STEPS, 2)
    with pytest.raises(ValueError, match="made for model"):
        back.check_for(model_hash(tiny_model(seed=2)), STEPS, 2)
    with pytest.raises(ValueError, match=f"made for {STEPS} steps, expected 50"):
        back.check_for(model_hash(model), 50, 2)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a profile written by coda profile"):
        Profile.load(tmp_path / "bad.npz")
    plot_heatmap(back, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000
    ranking = stability_ranking(back)
    depth = depth_table(back)
    assert [r["layer"] for r in depth] == list(range(back.num_layers))
    for r in depth:
        for k, op in enumerate(back.model_ops.op_types):
            want = np.nanmean(back.out_change[:, 1:, :, r["layer"], k])   # equal counts per step
            assert r["out_change"][op] == pytest.approx(float(want), rel=1e-6)
    assert ranking[0]["op"] == "cross_attn"     # exactly constant here
    assert [r["out_change"] for r in ranking] == sorted(r["out_change"] for r in ranking)


def test_parse_int_list():
    assert parse_int_list("0-3,7", "--p", 0, 9) == [0, 1, 2, 3, 7]
    assert parse_int_list(" 4 , 1-2", "--p", 0, 9) == [4, 1, 2]
    for bad in ("", "a", "3-1", "10", "1,1", "1,,2", ",1", "1,", " , ", "0-3,2", "-1"):
        with pytest.raises(ValueError, match="--p"):
            parse_int_list(bad, "--p", 0, 9)
    with pytest.raises(ValueError, match="an empty item"):
        parse_int_list("1,,2", "--p", 0, 9)
    with pytest.raises(ValueError, match="2 given twice"):
        parse_int_list("0-3,2", "--p", 0, 9)


def test_parse_list_is_the_same_rule_for_names_and_numbers():
    from coda.lists import parse_list
    assert parse_list("uniform, coda", "--policy", choices=("uniform", "coda")) == \
        ["uniform", "coda"]
    assert parse_list("0.3,0.5", "--skip", float) == [0.3, 0.5]
    for text, message in (("uniform,,coda", "an empty item"), ("uniform,uniform", "given twice"),
                          ("", "empty"), ("fora", "'fora': unknown value")):
        with pytest.raises(ValueError, match=message):
            parse_list(text, "--policy", choices=("uniform", "coda"))
    for text, message in (("0.3,,0.5", "an empty item"), ("0.3,0.30", "0.3 given twice"),
                          ("x", "'x' is not a float")):
        with pytest.raises(ValueError, match=message):
            parse_list(text, "--skip", float)


def test_profile_load_refuses_truncated_text_and_non_finite_files(tiny_profile, tmp_path):
    _, prof = tiny_profile
    good = prof.save(tmp_path / "good")
    data = good.read_bytes()
    (tmp_path / "half.npz").write_bytes(data[:len(data) // 2])      # cut short
    (tmp_path / "text.npz").write_text("hello\n")
    (tmp_path / "empty.npz").write_bytes(b"")
    flipped = bytearray(data)
    flipped[len(data) // 3:len(data) // 3 + 64] = bytes(64)          # corrupt inside a member
    (tmp_path / "corrupt.npz").write_bytes(bytes(flipped))
    for name in ("half.npz", "text.npz", "empty.npz", "corrupt.npz"):
        with pytest.raises(ValueError, match=f"--profile {tmp_path / name}: not a profile "
                                             "written by coda profile"):
            Profile.load(tmp_path / name)
    bad = copy.deepcopy(prof)
    bad.out_abs[1, 0, 1, 0, 3] = np.nan            # magnitudes are finite at every step
    bad.save(tmp_path / "nan")
    with pytest.raises(ValueError, match=r"profile.npz: 1 values of out_abs are not finite and "
                                         r">= 0 \(the first, nan, at video 1, step 0, uncond, "
                                         r"layer 0, temporal_attn\)"):
        Profile.load(tmp_path / "nan" / "profile.npz")
    bad = copy.deepcopy(prof)
    bad.out_change[0, 2] = np.inf
    bad.save(tmp_path / "inf")
    with pytest.raises(ValueError, match="values of out_change are not finite"):
        Profile.load(tmp_path / "inf" / "profile.npz", flag="--x")
    bad = copy.deepcopy(prof)
    bad.sensitivity = np.full(STEPS, np.nan)
    bad.save(tmp_path / "sens")
    with pytest.raises(ValueError, match="4 of its 4 step-sensitivity values are not finite"):
        Profile.load(tmp_path / "sens" / "profile.npz")
    # NaN at step 0 of the changes is the format (no previous step)
    assert np.isnan(Profile.load(good).out_change[:, 0]).all()


def test_sensitivity_defaults_follow_the_run():
    from coda.experiments.profile import _sensitivity_plan
    assert _sensitivity_plan(None, None, 50, 20) == (10, 4)       # the shipped profile's
    assert _sensitivity_plan(None, None, 4, 1) == (2, 1)          # short run: 2-step blocks
    assert _sensitivity_plan(None, None, 3, 2) == (1, 2)
    assert _sensitivity_plan(0, None, 2, 1) == (0, 1)


def test_coda_profile_on_the_shipped_model(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["profile", "--prompts", "3", "--seeds", "9", "--steps", "3",
                 "--out", str(out)]) == 0
    prof = Profile.load(out / "profile.npz")
    assert prof.out_change.shape == (1, 3, 2, 4, 5) and (out / "heatmap.png").exists()
    printed = capsys.readouterr().out
    assert "most stable first" in printed
    # 3 steps: by default one 3-step block (a computed step, then a reuse), the one video
    assert "step sensitivity: 1 blocks x 1 videos" in printed
    assert prof.sensitivity is not None and np.all(np.isfinite(prof.sensitivity))


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "12"], "--prompts '12'"),
    (["--prompts", "1,,2"], "--prompts '1,,2': an empty item"),
    (["--seeds", "100,100"], "--seeds '100,100': 100 given twice"),
    (["--steps", "1"], "--steps 1: expected 2..1000"),
    (["--steps", "100000"], "--steps 100000: expected 2..1000"),
    (["--seeds", "x"], "--seeds 'x'"),
    (["--guidance", "nan"], "--guidance nan: expected a finite CFG scale >= 0"),
    (["--guidance", "inf"], "--guidance inf: expected a finite CFG scale >= 0"),
    (["--guidance", "-1"], "--guidance -1.0: expected a finite CFG scale >= 0"),
    (["--steps", "2", "--sensitivity-blocks", "5"],
     "--sensitivity-blocks 5: expected 0..1 with --steps 2 (each block needs 2 steps"),
    (["--steps", "4", "--sensitivity-blocks", "3"], "--sensitivity-blocks 3: expected 0..2"),
    (["--sensitivity-blocks", "-1"], "--sensitivity-blocks -1: expected 0..25"),
    (["--prompts", "1", "--sensitivity-videos", "100"],
     "--sensitivity-videos 100: expected 1..1, the videos profiled"),
    (["--prompts", "1-3", "--seeds", "5-6", "--sensitivity-videos", "7"],
     "--sensitivity-videos 7: expected 1..6"),
    (["--sensitivity-videos", "0"], "--sensitivity-videos 0: expected 1..10"),
    (["--sensitivity-blocks", "0", "--sensitivity-videos", "2"],
     "--sensitivity-videos 2: has no effect with --sensitivity-blocks 0"),
])
def test_coda_profile_refuses_bad_input(tmp_path, capsys, argv, message):
    out = tmp_path / "p"
    assert main(["profile", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err and not out.exists(), err
    assert err.count("\n") == 1


def test_step_sensitivity_is_measured_per_block_and_saved(tiny_profile, tmp_path):
    from coda.experiments.profile import step_sensitivity
    model, prof = tiny_profile
    plain = lambda n: NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
    sens = step_sensitivity(model, prof, plain, blocks=2, videos=1)
    assert sens.shape == (STEPS,) and np.all(sens > 0) and sens.mean() == pytest.approx(1.0)
    assert len(set(sens[:2])) == 1 and len(set(sens[2:])) == 1      # one value per block
    prof.sensitivity = sens
    prof.save(tmp_path)
    np.testing.assert_array_equal(Profile.load(tmp_path / "profile.npz").sensitivity, sens)
    prof.sensitivity = None
