"""The cache's forecast mode: alpha's closed form, the table's checks and file block, and the
calibration on a small random Latte (coda.host.cache.forecast,
coda.experiments.forecast_calibration)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.experiments.forecast_calibration import (calibrate_forecast,
                                                   load_forecast, record_outputs,
                                                   save_forecast)
from coda.host.cache.forecast import ALPHA_RANGE, ForecastTable, fit_alpha, forecast_gates
from coda.host.cache.policies import UniformIntervalPolicy
from coda.host.cache.schedule import OP_TYPES
from coda.host.cache.shipped import save_schedule
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.hw.nme.isa import NMEConfig
from test_cache_engine import STEPS, tiny_model

SCHED = UniformIntervalPolicy(default_interval=2, warmup=1).build(STEPS, 2)


@given(st.lists(st.floats(-4, 4, allow_nan=False), min_size=4, max_size=4),
       st.lists(st.floats(-4, 4, allow_nan=False), min_size=4, max_size=4))
@settings(max_examples=60, deadline=None)
def test_fit_alpha_is_the_clipped_least_squares_minimiser(e, d):
    """fit_alpha(<e, d>, |d|^2) minimises |e - a d|^2 over ALPHA_RANGE (checked against a
    dense grid of candidates); 0 when d is 0."""
    e, d = np.array(e), np.array(d)
    a = fit_alpha(float(e @ d), float(d @ d))
    assert ALPHA_RANGE[0] <= a <= ALPHA_RANGE[1]
    if d @ d == 0:
        assert a == 0.0
        return
    grid = np.linspace(*ALPHA_RANGE, 2001)
    best = min(float(((e - g * d) ** 2).sum()) for g in grid)
    assert float(((e - a * d) ** 2).sum()) <= best + 1e-9


def test_fit_alpha_and_table_refuse_bad_values():
    with pytest.raises(ValueError, match="num=nan, den=1.0"):
        fit_alpha(float("nan"), 1.0)
    with pytest.raises(ValueError, match="alpha 1.5 at step 2, 'cross_attn': expected 0.0..1.0"):
        ForecastTable({2: {"cross_attn": 1.5}}, STEPS, "m", SCHED.digest())
    with pytest.raises(ValueError, match="step 9: expected 0..5"):
        ForecastTable({9: {"cross_attn": 0.5}}, STEPS, "m", SCHED.digest())
    with pytest.raises(ValueError, match="forecast table: num_steps: missing; expected an "
                                         "integer"):
        ForecastTable.from_dict({"alphas": {}})


def test_forecast_gates_are_rounded_once_from_fp32():
    g = torch.tensor([0.3, -1.7, 2.0 ** -20], dtype=torch.bfloat16)
    now, prev = forecast_gates(g, 0.37, torch.bfloat16)
    assert torch.equal(now, (g.float() * 1.37).to(torch.bfloat16))
    assert torch.equal(prev, (g.float() * -0.37).to(torch.bfloat16))


def _factory(model):
    from coda.host.model.sample import cache_mem_words
    return lambda n: NMPDriver(TorchBackend(), NMEConfig(
        lanes=8, mem_words=cache_mem_words(model, n, 2, 8)), ranks=2)


def test_calibration_fits_each_step_and_type_on_the_recorded_outputs(tmp_path):
    """The table's alpha at (t, type) is the clipped least squares over every branch, sample
    and layer of the full-compute outputs at t against the extrapolation of the schedule's
    last two computed steps (computed here again in float64 from the recording); the table
    goes into the schedule file and comes back, refused for another model or step count."""
    from coda.host.cache.profile import model_hash

    torch.set_num_threads(1)
    model = tiny_model()
    rec = record_outputs(model, [3, 7], 5, num_steps=STEPS, guidance_scale=4.0,
                         driver_factory=_factory(model))
    assert len(rec) == 2 * 2 * 2 * len(OP_TYPES)       # branches x samples x layers x types
    table = calibrate_forecast(model, {"u": SCHED}, [3, 7], [5], num_steps=STEPS,
                               guidance_scale=4.0, driver_factory=_factory(model))["u"]
    sums = {}
    for (branch, _, layer, op, _), seq in rec.items():
        for t, (k, k2) in SCHED.computed_pairs(branch, (layer, op)).items():
            c = [seq[i].double().numpy().ravel() for i in (t, k, k2)]
            s = sums.setdefault((t, op), [0.0, 0.0])
            s[0] += float((c[0] - c[1]) @ (c[1] - c[2]))
            s[1] += float((c[1] - c[2]) @ (c[1] - c[2]))
    assert sums and set(sums) == {(t, op) for t, row in table.alphas.items() for op in row}
    for (t, op), (num, den) in sums.items():
        assert table.alpha(t, op) == pytest.approx(min(1.0, max(0.0, num / den)) if den else 0.0,
                                                 abs=1e-6)
    assert 0 < table.describe()["alpha_mean"] <= 1
    assert table.videos == ((3, 5), (7, 5)) and table.model_hash == model_hash(model)

    path = tmp_path / "s.json"
    save_schedule(path, SCHED, {"model_hash": model_hash(model)})
    assert load_forecast(path) is None
    save_forecast(path, SCHED, table)
    assert "coda" in json.loads(path.read_text())          # the other blocks are kept
    sched, back = load_forecast(path, model_id=model_hash(model), num_steps=STEPS)
    assert sched == SCHED and back == table
    other = UniformIntervalPolicy(default_interval=3, warmup=1).build(STEPS, 2)
    with pytest.raises(ValueError, match="calibrated for schedule"):
        save_forecast(path, other, table)
    with pytest.raises(ValueError, match="made for model"):
        load_forecast(path, model_id="0" * 16)
    with pytest.raises(ValueError, match=f"made for {STEPS} steps, expected 8"):
        load_forecast(path, num_steps=8)
