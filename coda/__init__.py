"""CODA: near-memory cache offload for video diffusion transformers.

Sub-packages (each maps onto a top-level folder of the repository):

- :mod:`coda.hw`    (``hw/``)    Amaranth RTL: FP units, NME, DIMM-NMP, Verilog generation.
- :mod:`coda.cosim` (``cosim/``) cocotb testbenches and the Verilator cosimulation harness.
- :mod:`coda.host`  (``host/``)  torch reference, NME compiler, driver + backends, DiT, scheduler.
- :mod:`coda.synth` (``synth/``) yosys / nextpnr flows.
"""

__version__ = "0.1.0"
