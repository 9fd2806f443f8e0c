"""CODA: near-memory cache offload for video diffusion transformers.

Sub-packages (each maps onto a top-level folder of the repository):

- :mod:`coda.hw`    (``hw/``)    Amaranth RTL: FP units, NME, DIMM-NMP, Verilog generation.
- :mod:`coda.cosim` (``cosim/``) cocotb testbenches and the Verilator cosimulation harness.
- :mod:`coda.host`  (``host/``)  torch reference, NME compiler, driver + backends, DiT, scheduler.
- :mod:`coda.synth` (``synth/``) yosys / nextpnr flows.

The cache on a diffusers pipeline in one call: ``coda.enable_cache(pipe, ...)`` and
``coda.disable_cache(pipe)`` (:mod:`coda.host.cache.pipeline`, imported on first use, so
``import coda`` stays cheap).
"""

__version__ = "0.1.0"

#: names re-exported lazily from coda.host.cache.pipeline (PEP 562)
_PIPELINE_API = ("enable_cache", "disable_cache", "CacheHandle")


def __getattr__(name: str):
    if name in _PIPELINE_API:
        from coda.host.cache import pipeline     # on first use: torch and diffusers load here
        return getattr(pipeline, name)
    raise AttributeError(f"module 'coda' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_PIPELINE_API])
