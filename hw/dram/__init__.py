"""coda.hw.dram: the rank DRAM controller (controller) and its parts: address mapping,
request queue, FR-FCFS scheduler, row policy, refresh, bank state and JEDEC timestamps
(timing), the JEDEC presets (standards), and the NME's word port on a rank: word adapter
and rank memory (word_memory)."""
