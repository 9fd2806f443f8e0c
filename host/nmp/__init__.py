"""coda.host.nmp: the DIMM-NMP driver (driver: cache slots tiled over ranks, lockstep
launches), the bank-coloured allocator of rank memory (placement) and the host-link bytes
of its tensors and segments (link)."""
