"""coda.cosim: the cocotb/Verilator cosimulation, by what it simulates.

- :mod:`coda.cosim.nme`: the NME alone on an ideal memory (its build, the ``rtl`` backend, the
  job server and cocotb models, functional coverage, speed, the units ``"M,A,O"``).
- :mod:`coda.cosim.nmp`: the whole DIMM-NMP, every rank's NME behind its DRAM timing (build,
  memory image, session, server, backend, measurements); it reuses the NME's session transport.
- :mod:`coda.cosim.dram`: the DRAM controller alone (trace replay, the JEDEC checker, command-log
  energy, the standard traces' bench).

Shared by them here: :mod:`~coda.cosim.toolchain` (Verilator and ccache),
:mod:`~coda.cosim.shared_mem` (rank memories the host maps too, and their DPI-C side
``shared_mem.cpp``), :mod:`~coda.cosim.memfile` (hex memory files) and :mod:`~coda.cosim.fst`
(FST waveforms).
"""
