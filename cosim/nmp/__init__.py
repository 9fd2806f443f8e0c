"""coda.cosim.nmp: the whole DIMM-NMP, every rank's NME behind its DRAM timing (``nmp_top.sv``)."""
