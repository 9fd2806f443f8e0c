"""The DRAM standards the tests of tests/hw/test_dram_standards.py and test_dram_controller.py
run over: every preset of :data:`coda.hw.dram.standards.STANDARDS`."""

from coda.hw.dram.standards import STANDARDS


ALL = list(STANDARDS)
