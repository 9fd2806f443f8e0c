"""coda.host.nmp: the DIMM-NMP driver (driver: cache slots tiled over ranks, lockstep
launches), how operands are tiled over the ranks (tiling), the asynchronous launches and
pending operators (launch), the bank-coloured allocator of rank memory (placement) and the host-link bytes
of its tensors and segments (link)."""
