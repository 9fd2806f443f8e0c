"""coda.host.nme: the NME's software stack. The torch reference of every cache operator (ops,
the spec), the compiler from operator to NME program, the program interpreter (interp), bit
packing (bits), the backends (backend: torch, rtl, nmp) and the cycle model's pass
efficiency (pass_efficiency)."""
