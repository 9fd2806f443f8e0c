"""Schedule files (with their "coda", "forecast" and "dra" blocks) and GPU tables are
untrusted input: every file is read and checked by one layer (:mod:`coda.jsonin`: size,
strict UTF-8, nesting depth, JSON without repeated keys, a schema with types, ranges and
sizes) before any work, and refused with one ``ValueError`` naming the file, the field and
what was expected (``coda: error: ...``, exit 2). A hypothesis fuzz over the loaders: never
another exception, and never a file accepted but read as something else than it says."""

from __future__ import annotations

import copy
import json
import math
import signal
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coda.cli import main
from coda.experiments.dra_calibration import load_step_dra
from coda.experiments.forecast_calibration import load_forecast
from coda.host.cache.forecast import ForecastTable
from coda.host.cache.policies import UniformIntervalPolicy
from coda.host.cache.policies.dra import StepThresholds
from coda.host.cache.schedule import BRANCHES, OP_TYPES
from coda.host.cache.shipped import load_schedule, schedule_block
from coda.host.system.gputable import GpuTimes
from coda.jsonin import MAX_DEPTH

STEPS, LAYERS = 6, 4                     # the shipped model's layers; coda run --steps 6
#: computed at 0, 1, 3, 5; every operator reused at 2 and 4 in both branches
SCHED = UniformIntervalPolicy(default_interval=2, warmup=1).build(STEPS, LAYERS)
#: (step, op type) where the forecast extrapolates: a reuse after two computed outputs
FORECAST_POINTS = {(t, ref[1]) for b in BRANCHES for ref in SCHED.order()
                   for t in SCHED.computed_pairs(b, ref)}
#: where step DRA probes: the steps that reuse the first operator
PROBED = sorted({s for s in range(STEPS) for b in BRANCHES
                 if SCHED.order()[0] in SCHED.reused(s, b)})


def _file_data() -> dict:
    """A valid schedule file: the schedule, a "coda" block, a forecast table at every
    forecast point and DRA thresholds at every probed step."""
    data = json.loads(SCHED.to_json())
    data["coda"] = {"target_skip": 0.4, "method": "test"}
    data["forecast"] = ForecastTable(
        {t: {op: 0.25 for (s, op) in FORECAST_POINTS if s == t}
         for t in sorted({t for t, _ in FORECAST_POINTS})},
        STEPS, "m", SCHED.digest(), ((1, 100),)).to_dict()
    data["dra"] = StepThresholds({s: 0.01 * (s + 1) for s in PROBED}, STEPS, "m",
                                 SCHED.digest(), 0.9, 1.0, prompts=(1,), seeds=(100,),
                                 max_fallbacks=2).to_dict()
    return data


def _write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


@contextmanager
def _within(seconds: int):
    """Fail (TimeoutError) if the block runs longer than ``seconds``."""
    def stop(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------ schedule files
def test_the_valid_file_loads_as_written(tmp_path):
    # steps 2 and 4 follow two computed steps each (0, 1 and 1, 3): every type forecasts
    assert FORECAST_POINTS == {(t, op) for t in (2, 4) for op in OP_TYPES}
    assert PROBED == [2, 4]
    path = _write(tmp_path / "s.json", _file_data())
    assert load_schedule(path, num_steps=STEPS, num_layers=LAYERS) == SCHED
    sched, table = load_forecast(path, num_steps=STEPS)
    assert sched == SCHED and {(t, op) for t, row in table.alphas.items()
                               for op in row} == FORECAST_POINTS
    assert load_step_dra(path, num_steps=STEPS)[1].thresholds == {
        s: 0.01 * (s + 1) for s in PROBED}


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps({**_file_data(), "name": "caf\xe9"},
                                ensure_ascii=False).encode("latin-1"))
    with pytest.raises(ValueError, match=rf"--schedule {path}: not a UTF-8 text file "
                                         r"\(byte 0xe9 at offset \d+\)"):
        load_schedule(path)
    with pytest.raises(ValueError, match=f"{path}: not a UTF-8 text file"):
        schedule_block(path, "dra")


@pytest.mark.parametrize("block", [[1, 2], "made by hand", 7, None])
def test_a_coda_block_that_is_not_an_object_is_refused(tmp_path, block):
    path = _write(tmp_path / "s.json", {**_file_data(), "coda": block})
    with pytest.raises(ValueError, match=rf"--schedule {path}: coda: got .*; expected an "
                                         r"object"):
        load_schedule(path, model_id="0123456789abcdef")


@pytest.mark.parametrize("where", ["coda", "forecast", "reuse"])
def test_deeply_nested_json_is_refused_before_parsing(tmp_path, where):
    depth = 100_000
    data = _file_data()
    data[where] = "DEEP"
    text = json.dumps(data).replace('"DEEP"', "[" * depth + "]" * depth)
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"--schedule {path}: nested deeper than "
                                         rf"{MAX_DEPTH} levels"):
        load_schedule(path)


def test_a_huge_step_count_is_refused_before_any_work(tmp_path):
    data = _file_data()
    data["num_steps"] = 10**9
    path = _write(tmp_path / "s.json", data)
    with _within(20), pytest.raises(ValueError, match=rf"--schedule {path}: num_steps: got "
                                                      r"1000000000; expected an integer "
                                                      r"1\.\.1000 "):
        load_schedule(path, num_steps=STEPS)


def test_a_repeated_step_and_branch_is_refused(tmp_path):
    """Two entries for (2, cond): before, the last one won (a schedule reusing 20 operators
    there ran reusing 1)."""
    data = _file_data()
    data["reuse"].append({"step": 2, "branch": "cond", "reuse": [[0, "cross_attn"]]})
    path = _write(tmp_path / "s.json", data)
    last = len(data["reuse"]) - 1
    with pytest.raises(ValueError, match=rf"--schedule {path}: reuse\[{last}\]: a second "
                                         r"entry for step 2, branch 'cond' \(the first: "
                                         r"reuse\[0\]\); expected one entry per step and "
                                         r"branch"):
        load_schedule(path)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["reuse"][1].__setitem__("step", 3.9), r"reuse\[1\]\.step: got 3\.9"),
    (lambda d: d["reuse"][1].__setitem__("step", 2.0), r"reuse\[1\]\.step: got 2\.0"),
    (lambda d: d["reuse"][0]["reuse"][0].__setitem__(0, 2.7),
     r"reuse\[0\]\.reuse\[0\]\[0\]: got 2\.7"),
    (lambda d: d.__setitem__("num_layers", True), r"num_layers: got true"),
    (lambda d: d.__setitem__("num_steps", 6.0), r"num_steps: got 6\.0"),
    (lambda d: d["dra"].__setitem__("max_fallbacks", 2.5), r"dra\.max_fallbacks: got 2\.5"),
    (lambda d: d["dra"].__setitem__("num_steps", True), r"dra\.num_steps: got true"),
    (lambda d: d["forecast"]["videos"][0].__setitem__(1, 100.5),
     r"forecast\.videos\[0\]\[1\]: got 100\.5"),
])
def test_a_float_or_boolean_where_an_integer_belongs_is_refused(tmp_path, edit, field):
    """Before, int() truncated them: 3.9 ran as step 3, true as 1 layer."""
    data = _file_data()
    edit(data)
    path = _write(tmp_path / "s.json", data)
    with pytest.raises(ValueError, match=rf"--schedule {path}: {field}; expected an integer"):
        load_schedule(path)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["reuse"][0].__setitem__("branch", "both"),
     r"reuse\[0\]\.branch: got \"both\"; expected one of \"cond\", \"uncond\""),
    (lambda d: d["reuse"][0].__setitem__("step", 6),
     r"reuse\[0\]\.step: got 6; expected a step 0\.\.5 \(num_steps 6\)"),
    (lambda d: d["reuse"][0]["reuse"][0].__setitem__(0, 4),
     r"reuse\[0\]\.reuse\[0\]\[0\]: got 4; expected an integer layer 0\.\.3 \(num_layers 4\)"),
    (lambda d: d["reuse"][0]["reuse"].append(d["reuse"][0]["reuse"][0]),
     r"reuse\[0\]\.reuse\[20\]: \[0, \"cross_attn\"\] again; expected each operator once"),
    (lambda d: d.__setitem__("forcast", {}), r"forcast: unknown field; expected one of"),
    (lambda d: d["forecast"]["alphas"].__setitem__("02", {"cross_attn": 0.5}),
     r"forecast\.alphas: key \"02\"; expected a step number"),
    (lambda d: d["forecast"]["alphas"]["2"].__setitem__("cross_attn", float("nan")),
     r"forecast\.alphas\.2\.cross_attn: got NaN; expected a number 0\.0\.\.1\.0"),
    (lambda d: d["dra"].__setitem__("margin", float("inf")),
     r"dra\.margin: got Infinity; expected a number > 0"),
    (lambda d: d["dra"].__setitem__("probe", "l2"),
     r"dra\.probe: got \"l2\"; expected one of \"l1\", \"accel\", \"output\""),
    (lambda d: d["dra"]["thresholds"].__setitem__("2", -1.0),
     r"dra\.thresholds\.2: got -1\.0; expected a number >= 0"),
])
def test_a_bad_field_is_refused_naming_it_and_what_was_expected(tmp_path, edit, message):
    data = _file_data()
    edit(data)
    path = _write(tmp_path / "s.json", data)
    with pytest.raises(ValueError, match=rf"--schedule {path}: {message}"):
        load_schedule(path)


def test_a_repeated_key_is_refused(tmp_path):
    text = json.dumps(_file_data())
    path = tmp_path / "s.json"
    path.write_text(text.replace('"num_steps": 6', '"num_steps": 6, "num_steps": 5', 1))
    with pytest.raises(ValueError, match=rf"--schedule {path}: not JSON: the key "
                                         r"\"num_steps\" twice in one object"):
        load_schedule(path)


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    from coda.jsonin import MAX_BYTES

    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(ValueError, match=rf"--schedule {path}: larger than {MAX_BYTES} "
                                         r"bytes"):
        load_schedule(path)


# ------------------------------------------------------------------------ the blocks' meaning
@pytest.mark.parametrize("step, op, message", [
    (0, "cross_attn", "step 0 forecasts no 'cross_attn'"),        # a computed step
    (3, "spatial_attn", "step 3 forecasts no 'spatial_attn'"),    # computed too
    (2, "attn", "unknown operator type 'attn'; expected one of spatial_attn"),   # Wan's
])
def test_forecast_alphas_that_would_never_apply_are_refused(tmp_path, step, op, message):
    """Before, they were accepted, never applied, and counted in the report's alpha mean."""
    data = _file_data()
    data["forecast"]["alphas"].setdefault(str(step), {})[op] = 0.9
    path = _write(tmp_path / "s.json", data)
    assert load_schedule(path) == SCHED                 # the schedule itself is fine
    with pytest.raises(ValueError, match=rf"{path} forecast table: alphas\.{step}\.{op}: "
                                         rf"{message}"):
        load_forecast(path, num_steps=STEPS)


def test_dra_thresholds_at_a_step_that_is_never_probed_are_refused(tmp_path):
    data = _file_data()
    data["dra"]["thresholds"]["3"] = 0.5          # step 3 computes everything
    path = _write(tmp_path / "s.json", data)
    with pytest.raises(ValueError, match=rf"{path} DRA thresholds: thresholds\.3: step 3 "
                                         r"is never probed"):
        load_step_dra(path, num_steps=STEPS)


# ------------------------------------------------------------------------ the command line
def _one_line_error(capsys, start: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"coda: error: {start}"), err
    return err


def _hostile_files(tmp_path) -> dict:
    """file name -> what its refusal says: not UTF-8, a "coda" block that is a list, nested
    deep, a step count that would take minutes to walk."""
    (tmp_path / "latin1.json").write_bytes(b'{"name": "caf\xe9"}')
    (tmp_path / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    _write(tmp_path / "coda_list.json", {**_file_data(), "coda": [1]})
    _write(tmp_path / "steps.json", {**_file_data(), "num_steps": 10**9})
    return {"latin1.json": "not a UTF-8 text file", "deep.json": "nested deeper than",
            "coda_list.json": "coda: got a list", "steps.json": "num_steps: got 1000000000"}


def test_coda_run_and_the_calibrations_refuse_hostile_schedule_files_in_one_line(
        tmp_path, capsys):
    for name, message in _hostile_files(tmp_path).items():
        path, out = tmp_path / name, tmp_path / "out"
        with _within(60):
            assert main(["run", "--prompts", "1", "--steps", "6", "--backend", "torch",
                         "--schedule", str(path), "--out", str(out)]) == 2
        assert message in _one_line_error(capsys, f"--schedule {path}: ")
        assert not out.exists()
        for command in ("forecast", "dra"):
            assert main(["schedule", command, "--schedule", str(path)]) == 2
            assert message in _one_line_error(capsys, f"--schedule {path}: ")


def test_coda_sim_refuses_hostile_schedule_and_table_files_in_one_line(tmp_path, capsys):
    for name, message in _hostile_files(tmp_path).items():
        path = tmp_path / name
        for flag in ("--schedule", "--gpu-table"):
            if name.startswith(("coda", "steps")) and flag == "--gpu-table":
                continue
            assert main(["sim", "--model", "latte-digits", "--steps", "4", flag, str(path),
                         "--out", str(tmp_path / "o")]) == 2
            assert message in _one_line_error(capsys, f"{flag} {path}: ")


# ------------------------------------------------------------------------ GPU tables
def _shape():
    ops = [SimpleNamespace(op=op) for _ in range(2) for op in ("attn", "cross_attn", "ffn")]
    return SimpleNamespace(name="wan2.1-1.3b", width=32, height=32, frames=5, hidden=1536,
                           video_tokens=8, ops=ops)


def _table(batches=(1,)) -> dict:
    """A table as coda calibrate writes it for two Wan blocks at 32x32, 5 frames (times
    made up, round)."""
    per = lambda s: {str(b): s * b for b in batches}     # noqa: E731
    return {
        "kind": "coda-gpu-table", "version": 1,
        "device": {"name": "test cpu", "type": "cpu", "torch": "2.13.0+cpu", "cuda": None,
                   "diffusers": "0.42.1"},
        "timer": "perf_counter", "date": "2026-01-01T00:00:00+00:00",
        "command": "coda calibrate --model wan2.1-1.3b", "statistic": "median",
        "warmup": 1, "repeat": 2, "seed": 0, "model": "wan2.1-1.3b",
        "cls": "WanTransformer3DModel", "dtype": "bf16", "height": 32, "width": 32,
        "frames": 5, "latent": [2, 4, 4], "video_tokens": 8, "text_tokens": 512,
        "hidden": 1536, "per": "block", "batches": list(batches),
        "ops": {"attn": per(1e-3), "cross_attn": per(2e-3), "ffn": per(3e-3)},
        "blocks": {"blocks": {"class": "WanTransformerBlock",
                              "ops": ["attn", "cross_attn", "ffn"],
                              "block_s": per(7e-3), "rest_s": per(1e-3)}},
        "other_s": per(2e-3),
        "cache_ops": {"tokens": 8, "channels": 1536, "dtype": "bfloat16",
                      "gated_residual_s": 1e-4, "segment_s": {"2": 2e-4, "4": 3e-4, "8": 4e-4},
                      "residual_add_s": 3e-5, "slot_copy_s": 7e-5},
        "copies": None, "host_cpu": "test cpu"}


def test_the_valid_table_loads(tmp_path):
    times = GpuTimes.load(_write(tmp_path / "t.json", _table((1, 2))))
    times.check_shape(_shape())
    assert times.op_s("ffn", 2) == 6e-3 and times.other_s(_shape(), 1) == 2e-3 + 2 * 1e-3


@pytest.mark.parametrize("edit, message", [
    # only batch 2: before, accepted and reported "measured" while every lookup of a
    # one-row call fell back to the roofline
    (lambda t: t.update(_table((2,))), r"batches: got a list \[2\]; expected \[1\] or \[1, 2\]"),
    (lambda t: t["ops"]["attn"].pop("1"),
     r"ops\.attn: batch sizes \[\]; expected one time per batch size of batches \[1\]"),
    (lambda t: t["other_s"].__setitem__("2", 1e-3),
     r"other_s: batch sizes \[1, 2\]; expected one time per batch size of batches \[1\]"),
    (lambda t: t.__setitem__("hidden", 1536.0), r"hidden: got 1536\.0; expected an integer"),
    (lambda t: t.__setitem__("copies", []), r"copies: got a list \[\]; expected null"),
    (lambda t: t["device"].__setitem__("name", 5), r"device\.name: got 5; expected a string"),
])
def test_a_table_that_says_something_else_than_it_measured_is_refused(tmp_path, edit,
                                                                     message):
    table = _table()
    edit(table)
    path = _write(tmp_path / "t.json", table)
    with pytest.raises(ValueError, match=rf"--gpu-table {path}: {message}"):
        GpuTimes.load(path)


def test_a_table_naming_an_operator_the_model_lacks_is_refused():
    """Before, a block listed under another operator added its rest to no call: a silently
    shorter forward."""
    table = _table()
    table["blocks"]["blocks"]["ops"][0] = "self_attn"
    with pytest.raises(ValueError, match=r"--gpu-table : blocks\.blocks\.ops\[0\]: operator "
                                         r"'self_attn'; expected one of wan2\.1-1\.3b's: attn, "
                                         r"cross_attn, ffn"):
        GpuTimes(table).check_shape(_shape())


def test_a_deep_or_non_utf8_table_is_refused(tmp_path):
    (tmp_path / "deep.json").write_text('{"kind": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ValueError, match=rf"--gpu-table {tmp_path / 'deep.json'}: nested "
                                         rf"deeper than {MAX_DEPTH} levels"):
        GpuTimes.load(tmp_path / "deep.json")


def test_the_report_says_measured_only_for_what_the_replay_took_from_the_table():
    """A table measured at another cached [T, C] than the simulated operators: every cache
    kernel of system b falls back to the roofline, so its timing is partly measured (the
    counts say how many of the replay's lookups each side served)."""
    from coda.host.system.sim import simulate

    table = _table()
    kw = dict(resolution="32x32", frames=5, steps=6, gpu="h200", interval=2, warmup=1,
              layers=2, shape_cache=None, record=False)
    full = simulate("wan2.1-1.3b", systems="a", gpu_table=GpuTimes(table), **kw)["report"]
    assert full["replay"]["gpu_timing"] == "measured"
    assert full["replay"]["gpu_lookups"]["roofline"] == 0
    table["cache_ops"]["tokens"] = 16
    part = simulate("wan2.1-1.3b", systems="b", gpu_table=GpuTimes(table), **kw)["report"]
    assert part["replay"]["gpu_timing"] == "partly measured"
    assert part["replay"]["gpu_lookups"]["measured"] > 0
    assert part["replay"]["gpu_lookups"]["roofline"] > 0


# ------------------------------------------------------------------------ the fuzz
_LEAF = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
         | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6))
_JSON = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _paths(obj, prefix=()):
    yield prefix
    items = (obj.items() if isinstance(obj, dict)
             else enumerate(obj) if isinstance(obj, list) else ())
    for key, value in items:
        yield from _paths(value, prefix + (key,))


def _retyped(value):
    """Values that a loose reader would take for ``value``: as float, bool, text, huge."""
    if isinstance(value, bool):
        return [int(value), str(value).lower()]
    if isinstance(value, int):
        return [value + 0.5, float(value), value != 0, str(value), -value - 1, 10**9, 2**63]
    if isinstance(value, float):
        return [int(value), value * 1e300, -value, str(value), True]
    if isinstance(value, str):
        return [value + " ", value.upper(), "", "\ud800", 3]
    return [[], {}, None]


@st.composite
def _mutated(draw, data: dict) -> bytes:
    """``data`` with one to three edits (a value replaced, retyped, removed, repeated or a
    field added), then its text edited (cut short, a byte that is not UTF-8, nested deep, a
    NaN, a repeated key, a BOM, a number out of range) or not."""
    data = copy.deepcopy(data)
    for _ in range(draw(st.integers(1, 3))):
        groups: dict = {}               # a field's first two keys: the long lists count once
        for path in list(_paths(data))[1:]:
            groups.setdefault(path[:2], []).append(path)
        path = draw(st.sampled_from(groups[draw(st.sampled_from(sorted(groups, key=repr)))]))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        kind = draw(st.sampled_from(["replace", "retype", "retype", "delete", "repeat",
                                     "add"]))
        if kind == "replace":
            parent[key] = draw(_JSON)
        elif kind == "retype":
            parent[key] = draw(st.sampled_from(_retyped(parent[key])))
        elif kind == "delete":
            del parent[key]
        elif kind == "repeat" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(_JSON)
    text = json.dumps(data)
    edit = draw(st.sampled_from(["none"] * 6 + ["cut", "latin1", "deep", "nan", "dupkey",
                                                "bom", "exponent", "digits"]))
    if edit == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif edit == "latin1":
        return text.encode() + b"\xe9"
    elif edit == "deep":
        n = draw(st.integers(MAX_DEPTH - 2, 5000))
        text = text.replace("[", "[" * n + "[", 1).replace("]", "]" + "]" * n, 1)
    elif edit == "nan":
        text = text.replace("0.", "NaN, 0.", 1)
    elif edit == "dupkey":
        text = text.replace("{", '{"num_steps": 6, ', 1)
    elif edit == "bom":
        text = "\ufeff" + text
    elif edit == "exponent":
        text = text.replace("0.", "1e999, 0.", 1)
    elif edit == "digits":
        text = text.replace("6", "6" * 5000, 1)
    return text.encode("utf-8", "surrogatepass")


def _same(got, want) -> bool:
    """Equal as JSON values, an integer only equal to an integer (a bool only to a bool)."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, dict):
        return (isinstance(got, dict) and set(got) == set(want)
                and all(_same(got[k], want[k]) for k in want))
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(_same(g, w) for g, w in zip(got, want)))
    if isinstance(want, int) and isinstance(got, float):
        return False
    return got == want


def _loads(path, loader):
    """``loader(path)``, or None when it refuses with a ValueError (anything else fails)."""
    try:
        return loader(path)
    except ValueError as exc:
        message = str(exc)
        assert "\n" not in message and str(path) in message, message
        return None


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_mutated(_file_data()))
def test_fuzz_schedule_files_are_refused_or_read_as_written(fuzz_dir, raw):
    path = fuzz_dir / "s.json"
    path.write_bytes(raw)
    sched = _loads(path, load_schedule)
    found = _loads(path, load_forecast)
    dra = _loads(path, load_step_dra)
    if sched is None:
        assert found is None and dra is None
        return
    data = json.loads(raw)                     # accepted: plain JSON, read as it says
    assert _same(sched.num_steps, data["num_steps"])
    assert _same(sched.num_layers, data["num_layers"])
    assert sched.name == data.get("name", "custom")
    entries = {}
    for entry in data["reuse"]:
        key = (entry["step"], entry["branch"])
        assert type(key[0]) is int and key not in entries
        refs = [tuple(ref) for ref in entry["reuse"]]
        assert all(type(layer) is int for layer, _ in refs) and len(set(refs)) == len(refs)
        entries[key] = frozenset(refs)
    assert sched.reuse == {k: v for k, v in entries.items() if v}
    if found is not None:
        _, table = found
        block = data["forecast"]
        assert all(_same(table.to_dict()[k], block[k]) for k in block if k != "fit")
        points = {(t, ref[1]) for b in BRANCHES for ref in sched.order()
                  for t in sched.computed_pairs(b, ref)}
        assert {(t, op) for t, row in table.alphas.items() for op in row} <= points
    if dra is not None:
        _, thresholds = dra
        block = data["dra"]
        assert all(_same(thresholds.to_dict()[k], block[k]) for k in block)
        first = sched.order()[0]
        assert all(any(first in sched.reused(s, b) for b in BRANCHES)
                   for s in thresholds.thresholds)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_mutated(_table((1, 2))))
def test_fuzz_gpu_tables_are_refused_or_give_a_measured_time_for_every_lookup(fuzz_dir, raw):
    path = fuzz_dir / "t.json"
    path.write_bytes(raw)
    times = _loads(path, GpuTimes.load)
    if times is None:
        return
    t = times.table
    assert t["batches"] in ([1], [1, 2])
    rows = [str(b) for b in t["batches"]]

    def measured(s, zero_ok=False):
        return (isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s)
                and (s > 0 or (zero_ok and s == 0)))
    for op, per in t["ops"].items():
        assert sorted(per) == rows and all(measured(times.op_s(op, int(b))) for b in rows)
    for blk in t["blocks"].values():
        assert sorted(blk["block_s"]) == rows == sorted(blk["rest_s"])
        assert all(measured(blk["rest_s"][b], True) for b in rows)
    assert sorted(t["other_s"]) == rows
    c = t["cache_ops"]
    if c is not None:
        assert measured(times.cache_s("cache_op", c["tokens"], c["channels"]))
        assert all(measured(s) for s in c["segment_s"].values())
    for value in times.link().values():
        assert measured(value, True)
    assert times.describe()["device"] == t["device"]["name"] and times.source()
