"""The profiler: relative L1 change of every operator's output and input between steps,
numerators on the NMEs (l1_distance against the previous step's tensor in rank memory)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from coda.cli import main
from coda.host.backend import TorchBackend
from coda.host.driver import NMPDriver
from coda.host.model.dit import DEFAULT_CONFIG, build_model
from coda.host.model.sample import cached_generate
from coda.host.policies.base import CachePolicy, Decision
from coda.host.profile import (Profile, ProfilingDriver, model_hash, parse_int_list,
                               plot_heatmap, profile_model, stability_ranking)
from coda.host.schedule import BRANCHES, OP_TYPES
from coda.hw.isa import NMEConfig

TINY = dict(num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
            num_layers=2, sample_size=16, video_length=4, caption_channels=16)
STEPS = 4


def tiny_model(seed=1):
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    cfg["transformer"].update(TINY)
    cfg["data"].update(frames=4, size=16)
    return build_model(cfg, seed=seed).eval()


def factory(backend=None):
    from coda.host.profile import _InputNormDriver
    return lambda videos: _InputNormDriver(backend or TorchBackend(),
                                           NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)


class _Recorder(NMPDriver):
    """Keeps a host copy of every tensor written (outputs and kept inputs)."""

    def __init__(self):
        super().__init__(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
        self.seen = {}

    def store(self, key, tensor):
        self.seen.setdefault(key, []).append(tensor.float().clone())
        super().store(key, tensor)


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
    from coda.host.backend import get_backend
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
    assert ranking[0]["op"] == "cross_attn"     # exactly constant here
    assert [r["out_change"] for r in ranking] == sorted(r["out_change"] for r in ranking)


def test_parse_int_list():
    assert parse_int_list("0-3,7", "--p", 0, 9) == [0, 1, 2, 3, 7]
    for bad in ("", "a", "3-1", "10", "1,1"):
        with pytest.raises(ValueError, match="--p"):
            parse_int_list(bad, "--p", 0, 9)


def test_coda_profile_on_the_shipped_model(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["profile", "--prompts", "3", "--seeds", "9", "--steps", "3",
                 "--out", str(out)]) == 0
    prof = Profile.load(out / "profile.npz")
    assert prof.out_change.shape == (1, 3, 2, 4, 5) and (out / "heatmap.png").exists()
    assert "most stable first" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "12"], "--prompts '12'"),
    (["--steps", "1"], "--steps 1: expected >= 2"),
    (["--seeds", "x"], "--seeds 'x'"),
])
def test_coda_profile_refuses_bad_input(tmp_path, capsys, argv, message):
    out = tmp_path / "p"
    assert main(["profile", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coda: error:") and message in err and not out.exists()


def test_step_sensitivity_is_measured_per_block_and_saved(tiny_profile, tmp_path):
    from coda.host.profile import step_sensitivity
    model, prof = tiny_profile
    plain = lambda n: NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 15), ranks=2)
    sens = step_sensitivity(model, prof, plain, blocks=2, videos=1)
    assert sens.shape == (STEPS,) and np.all(sens > 0) and sens.mean() == pytest.approx(1.0)
    assert len(set(sens[:2])) == 1 and len(set(sens[2:])) == 1      # one value per block
    prof.sensitivity = sens
    prof.save(tmp_path)
    np.testing.assert_array_equal(Profile.load(tmp_path / "profile.npz").sensitivity, sens)
    prof.sensitivity = None
