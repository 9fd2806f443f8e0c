"""coda.hw.dram: the rank DRAM controller (controller) and its parts: address mapping,
request queue, FR-FCFS scheduler, row policy, refresh, bank state and JEDEC timestamps
(timing), and the JEDEC presets (standards)."""
