"""A rank's memory image as the DRAM device of the DIMM-NMP cosimulation holds it.

An NME's image (uint16 ``[mem_words, lanes]``) is regrouped into DRAM bursts, and each burst
sits at the device index of its (bank group, bank, row, column) under the controller's address
mapping (:func:`coda.hw.dram.mapping.map_burst_address`) and the device's
``{row, bank, bankgroup, column burst}`` indexing (``cosim/dram/dram_top.sv``). The device reads
and writes the image where the host keeps it, a rank memory whose burst map
(:func:`burst_index_map`'s inverse) takes a device index to its burst
(:mod:`coda.cosim.shared_mem`).
"""

from __future__ import annotations

import functools

import numpy as np

from coda.hw.dram.mapping import map_burst_address
from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.hw.nme.isa import NMEConfig
from coda.hw.nmp import index_bits

__all__ = ["words_per_burst", "store_bits", "burst_index_map"]


def words_per_burst(cfg: NMEConfig, std: DRAMStandard) -> int:
    """NME words per burst of ``std``; ValueError when a word does not divide a burst."""
    wb = 2 * cfg.lanes
    if std.burst_bytes % wb:
        raise ValueError(f"lanes={cfg.lanes}: a {wb}-byte word must divide the "
                         f"{std.burst_bytes}-byte {std.name} burst")
    return std.burst_bytes // wb


def store_bits(cfg: NMEConfig, std: DRAMStandard | str) -> int:
    """Index bits of each rank's device store: enough bursts for ``cfg.mem_words`` words, and
    at least bank group + column burst + bank bits so that the device index of every burst the
    NME can reach is distinct."""
    std = get_standard(std)
    n_bursts = -(-cfg.mem_words // words_per_burst(cfg, std))
    floor = (index_bits(std.bank_groups) + index_bits(std.bursts_per_row)
             + index_bits(std.banks_per_group))
    return max(index_bits(n_bursts), floor)


@functools.lru_cache(maxsize=16)
def burst_index_map(cfg: NMEConfig, std_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(device index of burst ``b`` for every burst of the memory, int64 ``[n_bursts]``;
    burst of device index ``i`` or -1, int64 ``[2**store_bits]``), under the controller's
    address mapping and the device's ``{row, bank, bankgroup, column burst}`` indexing."""
    std = get_standard(std_name)
    n_bursts = -(-cfg.mem_words // words_per_burst(cfg, std))
    sb = store_bits(cfg, std)
    bgb, bab, cbb = (index_bits(std.bank_groups), index_bits(std.banks_per_group),
                     index_bits(std.bursts_per_row))
    idx = np.empty(n_bursts, np.int64)
    for b in range(n_bursts):
        bg, ba, row, col = map_burst_address(std, b)
        full = (((row << bab | ba) << bgb | bg) << cbb) | (col // std.burst_length)
        idx[b] = full & ((1 << sb) - 1)
    inv = np.full(1 << sb, -1, np.int64)
    inv[idx] = np.arange(n_bursts)
    if np.unique(idx).size != n_bursts:
        raise AssertionError(f"device index map of {std.name} is not one-to-one")
    return idx, inv
