"""coda.cosim.dram: the DRAM controller alone (``dram_top.sv``): trace replay, the JEDEC
checker, command-log energy."""
