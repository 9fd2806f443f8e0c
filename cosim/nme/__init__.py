"""coda.cosim.nme: the NME alone, Verilated on an ideal memory (``nme_top.sv``)."""
