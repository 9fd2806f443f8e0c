"""Energy of a replayed generation, J, from its busy times and bytes.

- GPU: ``power_busy_w x GPU busy time + power_stall_w x (latency - busy)`` (board power:
  GPU memory traffic included);
- PCIe: bytes x 8 x ``pcie.pj_per_bit``;
- host DRAM serving the copies: bytes x 8 x (core + channel I/O pJ/bit) plus one row
  activation per row's worth of bytes;
- NMEs: the DRAM bytes they move in their ranks x 8 x core pJ/bit (no channel I/O: the NME
  sits in the buffer chip) plus activations, their 16-bit adds and multiplies and buffer
  accesses (two 16-bit reads and a write per multiply-add).

Host CPU, DIMM background power and the VAE are the same in every system and not counted.
Every constant is in :class:`coda.host.system.platforms.Energy` / ``GPU`` with its source.
"""

from __future__ import annotations

from .platforms import Platform
from .replay import SystemResult

__all__ = ["energy"]


def energy(res: SystemResult, plat: Platform) -> dict:
    """Joules by component for one system's replay.

    Returns ``{"gpu_j", "pcie_j", "host_dram_j", "nme_j", "total_j"}``.
    """
    e, g = plat.energy, plat.gpu
    pj = 1e-12
    row_bytes = plat.dram.columns * plat.dram.rank_width // 8
    gpu_j = g.power_busy_w * res.gpu_busy_s + g.power_stall_w * max(0.0, res.latency_s
                                                                    - res.gpu_busy_s)
    pcie_j = (res.h2d_bytes + res.d2h_bytes) * 8 * plat.pcie.pj_per_bit * pj
    host_j = (res.host_dram_bytes * 8 * (e.dram_pj_per_bit + e.dram_io_pj_per_bit)
              + res.host_dram_bytes / row_bytes * e.act_pj) * pj
    nme_j = (res.nme_rank_bytes * 8 * e.dram_pj_per_bit + res.nme_rank_bytes / row_bytes
             * e.act_pj + res.nme_adds * e.add16_pj + res.nme_muls * e.mul16_pj
             + res.nme_muls * 3 * 16 * e.sram_pj_per_bit) * pj
    return {"gpu_j": gpu_j, "pcie_j": pcie_j, "host_dram_j": host_j, "nme_j": nme_j,
            "total_j": gpu_j + pcie_j + host_j + nme_j}
