"""torch.compile and the cache engine (coda.host.cache.engine), on the CPU.

The engine's hooks (the transformer's, each block's, ``enable_cache``'s) are wrapped in
``torch.compiler.disable``, as diffusers' own cache hooks: torch.compile never traces the
step's bookkeeping, decisions, monitors or segments (Python control flow and host syncs); a
compiled block's call graph-breaks into the engine, which replays the block's operators
through its submodules, and compiled submodules run compiled there.

The compiler here is ``aot_eager`` (dynamo and AOTAutograd trace the graphs, which then run
as the same eager aten ops, with no C++ build), so a compiled run gives
the uncompiled run's bits as well as its decisions, and the tests assert both. Inductor
fuses and reorders the arithmetic, which moves the last bits of the compiled operators'
outputs (and may so move a monitored decision at its threshold); not run here: its C++
builds are slow on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters

import coda
import coda.host
from coda.host.cache.arch import UnsupportedModelError, get_architecture
from coda.host.cache.device import DeviceCache
from coda.host.cache.engine import CodaCacheConfig, apply_coda_cache
from test_arch_adapters import ARCHS, build, generate, policy_for
from test_pipeline_api import run_wan
from tiny_pipelines import wan_pipe, wan_pipeline_class

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the folder of coda.host (engine, adapters, caches, drivers)
CODA_HOST = Path(coda.host.__file__).resolve().parent
#: the functions where a compiled frame may stop: the engine's, all disabled
ENGINE_ENTRIES = ("_BlockHook.new_forward", "CodaCacheHook.new_forward",
                  "_PipelineHook.new_forward")


class CountingBackend:
    """``aot_eager`` that counts the calls of the graphs it compiled and notes the source
    files of the operations it was given (``files``)."""

    def __init__(self):
        self.calls = 0
        self.files: set[str] = set()

    def __call__(self, gm, example_inputs):
        for node in gm.graph.nodes:
            for line in (node.meta.get("stack_trace") or "").splitlines():
                if line.strip().startswith('File "'):
                    self.files.add(str(Path(line.split('"')[1]).resolve()))
        compiled = lookup_backend("aot_eager")(gm, example_inputs)

        def run(*args):
            self.calls += 1
            return compiled(*args)
        return run


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch (no graphs, guards or counters of another)."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def wan_pipeline_cls():
    return wan_pipeline_class()


def _no_engine_code_in_graphs(backend: CountingBackend) -> None:
    """No operation of coda's own code (the engine, the adapters' replay, the caches) was
    traced into a graph."""
    ours = [f for f in backend.files if Path(f).is_relative_to(CODA_HOST)]
    assert not ours, ours


def _graph_breaks_only_at_the_engine() -> None:
    """Every graph break dynamo took is a call into one of the engine's disabled hooks: it
    traced none of the engine's code (no decision, monitor or host sync in a graph)."""
    breaks = list(counters["graph_break"])
    assert breaks, "a compiled frame reached the engine without a graph break"
    for reason in breaks:
        assert "torch.compiler.disable" in reason and any(e in reason for e in ENGINE_ENTRIES), \
            reason


def _compile(transformer, how: str, backend) -> None:
    """Compile a Wan transformer the ways users do."""
    if how == "repeated_blocks":       # diffusers' regional compilation (_repeated_blocks)
        transformer.compile_repeated_blocks(backend=backend, fullgraph=False)
    elif how == "torch.compile(block)":
        for i, block in enumerate(transformer.blocks):
            transformer.blocks[i] = torch.compile(block, backend=backend)
    else:                               # the whole transformer, in place
        transformer.compile(backend=backend)


@pytest.mark.parametrize("how, policy, kw", [
    ("repeated_blocks", "uniform", {"skip": 0.5}),
    ("repeated_blocks", "fbcache", {"threshold": 0.5}),
    ("torch.compile(block)", "uniform", {"skip": 0.5}),
    ("whole_model", "uniform", {"skip": 0.5}),
])
def test_a_compiled_wan_pipeline_makes_the_uncompiled_decisions_and_bits(wan_pipeline_cls, how,
                                                                         policy, kw):
    """enable_cache on a tiny Wan pipeline whose transformer is compiled: every event
    (decision, segment, monitor value) and the latents' bits are the uncompiled run's.
    FBCache decides on a monitored L1 change: its host sync runs in the engine, outside
    any graph. After disable_cache the compiled blocks run compiled, with the bits of a
    pipeline that was never hooked nor compiled."""
    plain = wan_pipe(wan_pipeline_cls)
    never = run_wan(plain)
    handle = coda.enable_cache(plain, policy, **kw)
    want = run_wan(plain)
    want_events = handle.hooks["transformer"].events.events

    pipe = wan_pipe(wan_pipeline_cls)
    backend = CountingBackend()
    _compile(pipe.transformer, how, backend)
    handle = coda.enable_cache(pipe, policy, **kw)
    got = run_wan(pipe)
    assert handle.summary()["ops_reused"] > 0
    assert handle.hooks["transformer"].events.events == want_events
    assert torch.equal(got, want)
    _graph_breaks_only_at_the_engine()
    _no_engine_code_in_graphs(backend)
    assert backend.calls == 0     # the engine replays the blocks; nothing else was compiled

    coda.disable_cache(pipe)
    assert torch.equal(run_wan(pipe), never)
    assert backend.calls > 0


@pytest.mark.parametrize("name", list(ARCHS))
def test_compiled_operator_modules_run_compiled_under_the_engine(name):
    """The blocks' attention and FFN modules compiled (what the engine calls to compute an
    operator): each computed operator runs its compiled module(s), a reused one none, and
    the events and bits are the uncompiled run's, on all four architectures."""
    arch = ARCHS[name]
    model = build(arch)
    hook = apply_coda_cache(model, CodaCacheConfig(DeviceCache(), policy_for(arch)))
    want = generate(model, arch)
    want_events = hook.events.events

    model = build(arch)
    backend = CountingBackend()
    modules_per_op = {}
    for ref in get_architecture(model).blocks(model):
        for op, attrs in ref.spec.op_modules.items():
            modules_per_op[op] = len(attrs)
            for attr in attrs:
                getattr(ref.module, attr).compile(backend=backend)
    hook = apply_coda_cache(model, CodaCacheConfig(DeviceCache(), policy_for(arch)))
    got = generate(model, arch)
    assert hook.events.events == want_events
    assert torch.equal(got, want)
    computed = [e for e in hook.events.of("op") if not e.reused]
    assert any(e.reused for e in hook.events.of("op"))
    assert backend.calls == sum(modules_per_op[e.op] for e in computed) > 0
    _no_engine_code_in_graphs(backend)


@pytest.mark.parametrize("name, attr", [("cogvideox", "norm_final"), ("latte", "norm_out"),
                                        ("hunyuan_video", "norm_out")])
def test_a_compiled_module_given_a_deferred_block_output_leaves_the_engine_untraced(name, attr):
    """The model's own module after the blocks, compiled, receives the last block's deferred
    output: the engine's program runs when that output is needed, outside any graph (its
    dispatch and materialisation are disabled), with the uncompiled run's events and bits."""
    arch = ARCHS[name]
    model = build(arch)
    hook = apply_coda_cache(model, CodaCacheConfig(DeviceCache(), policy_for(arch)))
    want = generate(model, arch)
    want_events = hook.events.events

    model = build(arch)
    backend = CountingBackend()
    getattr(model, attr).compile(backend=backend)
    hook = apply_coda_cache(model, CodaCacheConfig(DeviceCache(), policy_for(arch)))
    got = generate(model, arch)
    assert hook.events.events == want_events
    assert torch.equal(got, want)
    _no_engine_code_in_graphs(backend)


def test_a_torch_compile_wrapper_of_the_transformer_is_refused_naming_what_to_do():
    model = torch.compile(build(ARCHS["wan"]), backend="aot_eager")
    with pytest.raises(UnsupportedModelError,
                       match=r"OptimizedModule: .*compile the transformer in place instead"):
        coda.enable_cache(model, "uniform")
