"""cocotb tests of the NME RTL against the torch reference (run inside the simulator).

Started by ``tests/cosim/test_cosim_nme.py`` (or :func:`coda.cosim.nme.build.run_cocotb`) with:

- ``CODA_COSIM_CFG``: the :class:`~coda.hw.nme.isa.NMEConfig` of the build, as JSON;
- ``CODA_COSIM_LANES`` / ``CODA_COSIM_MEM_WORDS``: memory geometry (for the models);
- ``CODA_COSIM_SCALE``: sample-size multiplier (default 1: a few minutes for all tests);
- ``CODA_COSIM_REPORT``: optional JSON file where tests record numbers (cycles, toggles);
- ``CODA_COVERAGE``: optional JSON file: functional coverage (:mod:`coda.cosim.nme.coverage`) is
  sampled on every program and written there at the end of each test;
- ``CODA_MUTANT``: on the mutant netlist of :mod:`coda.verify.mutation`, the mutant to run.

Every check compares the whole memory image (so masked tail lanes and bytes outside the output
must be untouched) and the L1 bits, NaNs by class (the NME emits a canonical NaN, torch keeps
x86 payloads for fp16). References: :mod:`coda.host.nme.interp` (the program interpreter) and, for
micro-ops and operators, torch computed directly here or through :mod:`coda.host.nme.ops`.

This is the module cocotb loads (``COCOTB_TEST_MODULES=cocotb_nme``, as
tests/cosim/test_cosim_nme.py, coda.verify.mutation and coda.verify.netlist_sim name it): it gathers the tests, in the order
they run, from tests/cocotb_nme_datapath.py (micro-ops, buffer roles, operators, FP edge
cases, normalisation paths, solver vectors, random bits with stalls, L1 corner sums) and
tests/cocotb_nme_control.py (tails, bad commands, the program check's rules, reset in
mid-program, operand-isolation toggles, speed). Their shared parts (the configuration, the
checker, stimulus) are in tests/cocotb_nme_bench.py.
"""

from cocotb_nme_datapath import (test_uop_matrix, test_buffer_roles, test_long_periods,
                                 test_read_after_store, test_operators, test_fp_edge_cases,
                                 test_normalisation_paths, test_solver_vectors,
                                 test_random_bits_with_stalls, test_l1_corner_sums)
from cocotb_nme_control import (test_tails, test_bad_commands, test_checker_rules,
                                test_reset_mid_program, test_operand_isolation_toggles,
                                test_speed)

__all__ = ["test_uop_matrix", "test_buffer_roles", "test_long_periods", "test_read_after_store",
           "test_operators", "test_fp_edge_cases", "test_normalisation_paths",
           "test_solver_vectors", "test_random_bits_with_stalls", "test_l1_corner_sums",
           "test_tails", "test_bad_commands", "test_checker_rules", "test_reset_mid_program",
           "test_operand_isolation_toggles", "test_speed"]
