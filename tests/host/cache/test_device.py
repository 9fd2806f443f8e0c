"""The cache engine on a device (coda.host.cache.device): the ``device`` argument of the
generation functions and of ``coda run/eval/profile --device``, and the cache in device
memory (DeviceCache, system b) against the NMP driver.

There is no GPU here: a device other than the CPU only changes where tensors live, so the
numbers are checked on the CPU (an explicit ``device=torch.device("cpu")`` gives the default
run's bits; the device cache gives the NMP driver's bits), and where each tensor lands is
checked on torch's ``meta`` device (shapes, no numbers): a tensor the engine made on the host
would meet the model's meta tensors and raise.
"""

from __future__ import annotations

import pytest
import torch

from coda.cli import main
from coda.experiments.forecast_calibration import load_forecast
from coda.host.cache.profile import model_hash
from coda.host.cache.device import DeviceCache, resolve_device
from coda.host.cache.engine import CodaCacheConfig, apply_coda_cache, remove_coda_cache
from coda.host.cache.events import EventLog
from coda.host.cache.policies import UniformIntervalPolicy, get_policy
from coda.host.cache.shipped import SHIPPED_SCHEDULE, load_schedule
from coda.host.model.dit import load_model
from coda.host.model.sample import cache_mem_words, cached_generate, generate
from coda.host.nme import ops
from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.hw.nme.isa import NMEConfig
from test_arch_adapters import ARCHS, build, policy_for
from test_arch_adapters import generate as arch_generate
from test_arch_adapters import nmp_driver as arch_nmp_driver
from test_cache_engine import POLICY, STEPS, tiny_model
from test_cache_modes import _forecast_table

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
COUNTS = ("ops_computed", "ops_reused", "segments", "segment_ops", "stores", "calls")


@pytest.fixture(scope="module")
def shipped():
    return load_model()[0]


_FULL: dict = {}


def _full(model, steps: int) -> torch.Tensor:
    """The full-compute video of digit 3, seed 11 (once per step count)."""
    if steps not in _FULL:
        _FULL[steps] = generate(model, [3], num_steps=steps, seeds=[11])
    return _FULL[steps]


def _nmp(model, history=1, cache_format="bf16", group=None):
    words = cache_mem_words(model, 1, 2, 8, history=history, cache_format=cache_format,
                            cache_group=group)
    return NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=words), ranks=2)


def _policy(name: str, model):
    """(policy, steps, forecast table): the shipped CODA schedule (50 steps, its own
    "forecast" block) or a 12-step uniform policy (a made-up alpha table, not a fit)."""
    if name == "coda":
        sched = load_schedule(SHIPPED_SCHEDULE, model_id=model_hash(model), num_steps=50)
        return get_policy("coda", schedule=sched), 50, load_forecast(
            SHIPPED_SCHEDULE, model_id=model_hash(model), num_steps=50)[1]
    policy = UniformIntervalPolicy(default_interval=2, warmup=2)
    return policy, 12, _forecast_table(policy.build(12, 4))


# ---------------------------------------------------------------- the device cache's bits
@pytest.mark.parametrize("name, cache, fmt", [
    *[("uniform", c, f) for c in ("reuse", "forecast") for f in ("bf16", "int8")],
    # the 50-step schedule: its modes in two runs (forecast composes with int8)
    ("coda", "reuse", "bf16"), ("coda", "forecast", "int8")])
def test_the_device_cache_gives_the_nmp_drivers_bits_on_the_shipped_model(shipped, name,
                                                                          cache, fmt):
    """DeviceCache (slots as tensors, segments by coda.host.nme.ops) against the NMPDriver on
    the torch NME backend: the same videos bit for bit, the same decisions and segments;
    nothing of the device cache crosses the host link, the NMP's stores and segments do."""
    policy, steps, table = _policy(name, shipped)
    kw = dict(num_steps=steps, seeds=[11], cache=cache, cache_format=fmt,
              forecast=table if cache == "forecast" else None)
    history = 2 if cache == "forecast" else 1
    runs = {}
    for where, driver in (("nmp", _nmp(shipped, history, fmt)), ("device", DeviceCache())):
        log = EventLog()
        videos, stats = cached_generate(shipped, [3], driver, policy, events=log, **kw)
        runs[where] = (videos, stats, log, driver)
    (v_nmp, s_nmp, log_nmp, _), (v_dev, s_dev, log_dev, cache_dev) = runs.values()
    assert torch.equal(v_nmp, v_dev)
    assert not torch.equal(v_dev, _full(shipped, steps))     # the cache changed the video
    assert {k: s_nmp[k] for k in COUNTS} == {k: s_dev[k] for k in COUNTS}
    assert s_dev["segments"] > 0 and s_nmp["pcie_bytes"] > 0
    assert s_dev["pcie_bytes"] == s_dev["programs"] == s_dev["nme_cycles"] == 0
    assert all(e.cache_memory == "device" for e in log_dev) and all(
        e.cache_memory == "nmp" for e in log_nmp)
    assert all(s.bytes_to_nmp == s.bytes_from_nmp == s.programs == 0
               for s in log_dev.of("segment"))
    # a stored entry's bytes in device memory: [T, C] bf16, or int8 q and one bf16 scale per G
    t, c = 8 * (32 // 4) ** 2, 96
    entry = 2 * t * c if fmt == "bf16" else t * c + 2 * t * c // 48
    assert {e.stored_bytes for e in log_dev.of("op") if e.stored_bytes} == {entry}
    if cache == "forecast":
        assert any(s.terms > len(s.ops) for s in log_dev.of("segment"))
    assert cache_dev.stats["bytes_written"] == sum(e.stored_bytes for e in log_dev.of("op"))


@pytest.mark.parametrize("name", list(ARCHS))
def test_the_device_cache_gives_the_nmp_drivers_bits_on_every_architecture(name):
    arch = ARCHS[name]
    model = build(arch)
    out, stats = {}, {}
    for where, driver in (("nmp", arch_nmp_driver()), ("device", DeviceCache())):
        remove_coda_cache(model)
        hook = apply_coda_cache(model, CodaCacheConfig(driver, policy_for(arch)))
        out[where], stats[where] = arch_generate(model, arch, (0, 1)), dict(hook.stats)
    assert torch.equal(out["nmp"], out["device"])
    assert {k: stats["nmp"][k] for k in COUNTS} == {k: stats["device"][k] for k in COUNTS}
    assert stats["device"]["segments"] > 0 and stats["device"]["pcie_bytes"] == 0


def test_device_cache_segments_are_the_reference_and_the_nmp_drivers_for_any_k():
    """11 terms (more than one NME program holds): the reference's left-to-right fold, the
    NMP driver's chained programs, bf16 and int8 entries."""
    g = torch.Generator().manual_seed(5)
    t, c, k = 12, 16, 11
    x = torch.randn(t, c, generator=g).bfloat16()
    cs = [torch.randn(t, c, generator=g).bfloat16() for _ in range(k)]
    gates = [torch.randn(c, generator=g).bfloat16() for _ in range(k)]
    dev, nmp = DeviceCache(), NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=1 << 14),
                                        ranks=2)
    for i, ci in enumerate(cs):
        dev.store(("c", i), ci)
        nmp.store(("c", i), ci)
        q, s = ops.quant_int8(ci.float(), 8, torch.bfloat16)
        dev.store_int8(("q", i), q, s, 8)
        nmp.store_int8(("q", i), q, s, 8)
    want = x
    for gk, ck in zip(gates, cs):
        want = want + gk * ck
    got = dev.segment(x, gates, [("c", i) for i in range(k)])
    assert torch.equal(got, want)
    assert torch.equal(got, nmp.segment(x, gates, [("c", i) for i in range(k)]))
    keys8 = [("q", i) for i in range(k)]
    assert torch.equal(dev.segment(x, gates, keys8), nmp.segment(x, gates, keys8))
    assert torch.equal(dev.load(("q", 3)), nmp.load(("q", 3)))
    l1 = dev.l1_to_slot(x, ("c", 0))
    assert l1 == float(ops.l1_distance(x.reshape(-1), cs[0].reshape(-1)))
    assert l1 == pytest.approx(nmp.l1_to_slot(x, ("c", 0)), rel=1e-5)
    assert dev.held_bytes() == k * (2 * t * c) + k * (t * c + 2 * t * c // 8)
    assert dev.stats["programs"] == dev.stats["nme_cycles"] == 0


def test_the_device_cache_refuses_what_it_cannot_do():
    dev = DeviceCache()
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    dev.store("a", x)
    with pytest.raises(ValueError, match="has dtype torch.float32, expected torch.bfloat16"):
        dev.store("b", x.float())
    with pytest.raises(ValueError, match=r"gate 0 is torch.bfloat16 \[4\], expected"):
        dev.segment(x, [x[0, :4]], ["a"])
    dev.store("m", torch.zeros(4, 8, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(ValueError, match="slot 'm' on meta and its gate on cpu, expected x's"):
        dev.segment(x, [x[0]], ["m"])
    dev.store_int8("q", torch.zeros(4, 8, dtype=torch.int8), x[:, :2], 4)
    with pytest.raises(ValueError, match="mix cache formats"):
        dev.segment(x, [x[0], x[0]], ["a", "q"])
    with pytest.raises(ValueError, match="cache_group G=3 for C=8"):
        dev.store_int8("r", torch.zeros(4, 8, dtype=torch.int8), x[:, :2], 3)
    with pytest.raises(KeyError, match="no cache slot 'z'"):
        dev.free("z")
    with pytest.raises(ValueError, match="fmt='fp8'"):
        DeviceCache("fp8")


# ---------------------------------------------------------------- where tensors live
def test_an_explicit_cpu_device_gives_the_default_bits(shipped):
    full = generate(shipped, [2, 5], num_steps=6, seeds=[1, 2])
    for device in (torch.device("cpu"), "cpu"):
        assert torch.equal(generate(shipped, [2, 5], num_steps=6, seeds=[1, 2],
                                    device=device), full)
    policy = UniformIntervalPolicy(default_interval=2, warmup=2)
    ref = cached_generate(shipped, [2], _nmp(shipped), policy, num_steps=6, seeds=[1])[0]
    got = cached_generate(shipped, [2], _nmp(shipped), policy, num_steps=6, seeds=[1],
                          device=torch.device("cpu"))[0]
    assert torch.equal(got, ref) and got.device.type == "cpu"
    assert {p.device.type for p in shipped.parameters()} == {"cpu"}


def _meta_steps(model, run, steps=STEPS):
    """``run(i)``: one batched-CFG call of step i on the meta device, under cache_context."""
    for i in range(steps):
        with model.cache_context("uncond|cond", step_index=i, num_inference_steps=steps):
            out = run(i)
    return out


@pytest.mark.parametrize("name", ["digits"] + list(ARCHS))
@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_the_engine_makes_its_tensors_on_the_models_device(name, fmt):
    """The model on torch's meta device (shapes, no numbers) with the device cache: every
    index, gate and slot the engine and the cache make lands there (one made on the host
    would meet a meta tensor and raise), and the calls reuse what the policy says."""
    if name == "digits":
        model = tiny_model().to("meta").transformer
        hook = apply_coda_cache(model, CodaCacheConfig(DeviceCache(), POLICY, cache_format=fmt))
        x, ehs = (torch.empty(s, device="meta") for s in ((4, 1, 4, 16, 16), (4, 1, 16)))
        out = _meta_steps(model, lambda i: model(
            x, timestep=torch.full((4,), 999 - 100 * i, device="meta"), encoder_hidden_states=ehs,
            return_dict=False)[0])
        want = POLICY.build(STEPS, 2)
    else:
        arch = ARCHS[name]
        model, policy = build(arch).to("meta"), policy_for(arch)
        hook = apply_coda_cache(model, CodaCacheConfig(DeviceCache(), policy, cache_format=fmt,
                                                       cache_group=16 if fmt == "int8" else None))
        cond, uncond = arch.sample(torch.Generator().manual_seed(1), arch.frames[0], arch.size[0])
        x = cond.pop("hidden_states").to("meta")
        kw = {k: torch.cat([uncond[k], cond[k]]).to("meta") for k in cond}
        out = _meta_steps(model, lambda i: model(
            hidden_states=torch.cat([x, x]), timestep=torch.full((2,), 900 - 170 * i,
                                                                 device="meta"),
            **kw, return_dict=False)[0])
        want = policy.build_for(STEPS, hook.model_ops)
    assert out.device.type == "meta"
    rows = out.shape[0] // 2
    assert hook.stats["ops_reused"] == rows * sum(len(want.reused(s, b)) for s in range(STEPS)
                                                  for b in ("cond", "uncond")) > 0


# ---------------------------------------------------------------- refusals
@NO_CUDA
def test_cuda_without_cuda_is_refused_before_any_work(shipped, tmp_path, capsys):
    with pytest.raises(ValueError, match="device cuda: CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        generate(shipped, [3], num_steps=2, device="cuda")
    assert {p.device.type for p in shipped.parameters()} == {"cpu"}
    for argv in (["run", "--backend", "device"], ["run", "--backend", "torch"], ["eval"],
                 ["profile"]):
        out = tmp_path / argv[0]
        assert main([*argv, "--out", str(out), "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("coda: error: --device cuda: CUDA is not available"), err
        assert err.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize("device, message", [
    ("meta", "device meta: device type 'meta', expected one of cpu, cuda"),
    ("tpu", "device 'tpu': expected one of cpu, cuda (or cuda:N)"),
])
def test_other_devices_are_refused(device, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_device(device)


# ---------------------------------------------------------------- coda run, system b
def test_coda_run_with_the_device_cache(tmp_path):
    """``coda run --backend device``: the torch backend's videos and counters, no link bytes
    or NME work, and the run's events replayed as systems a..c; system b's replay of them is
    that of the NMP run's events (b keeps its cache on the GPU either way)."""
    import json

    argv = ["--steps", "6", "--interval", "2", "--prompts", "3", "--threads", "1"]
    reports = {}
    for backend in ("torch", "device"):
        assert main(["run", "--out", str(tmp_path / backend), "--backend", backend, *argv]) == 0
        reports[backend] = json.loads((tmp_path / backend / "report.json").read_text())
    torch_run, dev = reports["torch"], reports["device"]
    for key in ("psnr_db", "ssim", "ops_skipped_fraction", "segments"):
        assert dev[key] == torch_run[key], key
    assert torch_run["pcie_bytes"] > 0 and torch_run["nme_cycles"] > 0
    assert dev["pcie_bytes"] == dev["nme_cycles"] == dev["nme_programs"] == 0
    assert dev["device"] == "cpu" and dev["backend"] == "device"
    assert set(dev["modelled"]["systems"]) == {"a", "b", "c"}
    assert set(torch_run["modelled"]["systems"]) == set("abcdef")
    for system in ("a", "b"):
        assert dev["modelled"]["systems"][system]["latency_s"] == \
            torch_run["modelled"]["systems"][system]["latency_s"]
