"""coda.hw.nme: the Near-Memory Engine. Its ISA and configuration (isa), the backend contract
(executor), the IEEE-754 units (fp), one SIMD lane (lane), the units of the NME (intake,
check, issue, execute; shared interfaces in iface), the top that wires them (top), and the
exact cycle model beside the RTL it models (cycles)."""
