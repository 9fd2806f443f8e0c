"""Energy of a replayed generation, J, from its busy times, bytes and DRAM command counts.

:func:`energy` gives the joules by component (GPU, PCIe, host DRAM, NMEs, DIMM background;
its docstring has how each is computed); DRAM energy is per command from the DDR5 device's
IDD/IPP currents (:mod:`coda.hw.dram.power`, DRAMPower's method), from the model's counts
since the replay has no command log. Host CPU and the VAE are the same in every system and not counted. Every constant is in
:class:`coda.host.system.platforms.Energy` / ``GPU`` or the device spec with its source.
How close the counts come to a command log's energy: :func:`dimm_dram_energy`.
"""

from __future__ import annotations

from coda.hw.dram.power import dram_energy
from coda.hw.dram.standards import DRAMStandard, get_standard

from .platforms import Platform
from .replay import SystemResult

__all__ = ["energy", "dimm_dram_energy"]


def dimm_dram_energy(std: str | DRAMStandard, *, read_bytes: float, write_bytes: float,
                     ranks: int, seconds: float, busy_s: float) -> dict:
    """DRAM energy of ``ranks`` ranks of ``std`` over ``seconds`` that read ``read_bytes`` and
    wrote ``write_bytes`` (all ranks together) with no command log (:func:`energy`): one
    ACT/PRE per row of bytes, bursts of ``burst_bytes``, ``seconds / tREFI`` REFs per rank,
    every bank open for ``busy_s`` of each rank's time (the NMEs streaming) and closed for the
    rest. Against a command log of the same work (:func:`coda.cosim.dram.energy.
    energy_commands`) it differs by what these two counts leave out: the ACTs beyond one
    per row (streams interleaved over banks reopen rows) and the banks a log shows closed
    while busy (tests/hw/test_dram_energy.py bounds the difference by exactly those).

    Returns:
        :func:`coda.hw.dram.power.dram_energy`'s dict (J and pJ per part).
    Raises:
        ValueError: negative bytes or times, ``busy_s > seconds``, ``ranks < 1``.
    """
    std = get_standard(std)
    if ranks < 1:
        raise ValueError(f"ranks={ranks!r}: expected >= 1")
    if not 0 <= busy_s <= seconds * (1 + 1e-12):
        raise ValueError(f"busy_s={busy_s!r}: expected 0 <= busy_s <= seconds={seconds!r}")
    row_bytes = std.columns * std.rank_width // 8
    return dram_energy(std, acts=(read_bytes + write_bytes) / row_bytes,
                       reads=read_bytes / std.burst_bytes, writes=write_bytes / std.burst_bytes,
                       refreshes=ranks * seconds / (std.tREFI * std.tCK_ns * 1e-9),
                       rank_s=ranks * seconds, bank_open_s=ranks * min(busy_s, seconds) * std.banks)


def energy(res: SystemResult, plat: Platform) -> dict:
    """Joules by component for one system's replay.

    - GPU: ``power_busy_w x GPU busy time + power_stall_w x (latency - busy)`` (board power:
      GPU memory traffic included);
    - PCIe: bytes x 8 x ``pcie.pj_per_bit``;
    - DRAM, per command from the DDR5 device's IDD/IPP currents (:mod:`coda.hw.dram.power`,
      DRAMPower's method; the replay has no command log, so it uses the model's counts):
      bursts = bytes / burst bytes (reads and writes apart: a copy to the host link reads the
      rank, a copy from it writes; an NME reads its streams and writes its stores), one
      ACT/PRE pair per row's worth of bytes (streams run through whole rows), a REF per tREFI
      and rank over the generation, and background power with every bank of the platform's
      ranks open while their NMEs run (the controller keeps rows open: ``open`` row policy) and
      every bank closed otherwise;
    - host DRAM serving the copies: its DRAM commands plus the DIMM channel's I/O per bit
      (``energy.dram_io_pj_per_bit``);
    - NMEs: the DRAM commands of the bytes they move in their ranks (no channel I/O: the NME
      sits in the buffer chip), their 16-bit adds and multiplies and buffer accesses (two
      16-bit reads and a write per multiply-add);
    - DIMM background: refresh and background power of the platform's ranks over the whole
      generation (every system has the DIMMs; a longer generation pays more).

    Returns ``{"gpu_j", "pcie_j", "host_dram_j", "nme_j", "dimm_background_j", "total_j",
    "dram": {"act_pre", "read_write", "refresh", "background", "total"}}`` (``dram``: the
    DIMMs' DRAM energy of the generation split by kind, J: host copies', NMEs' and the
    background together).
    """
    e, g, std = plat.energy, plat.gpu, plat.dram
    pj = 1e-12
    gpu_j = g.power_busy_w * res.gpu_busy_s + g.power_stall_w * max(0.0, res.latency_s
                                                                    - res.gpu_busy_s)
    pcie_j = (res.h2d_bytes + res.d2h_bytes) * 8 * plat.pcie.pj_per_bit * pj
    none = dict(ranks=plat.n_ranks, seconds=0.0, busy_s=0.0)
    # copies to the host link read the DIMMs (H2D), copies from it write them (D2H)
    host = dimm_dram_energy(std, read_bytes=res.host_dram_bytes - res.d2h_bytes,
                            write_bytes=res.d2h_bytes, **none)
    nme = dimm_dram_energy(std, read_bytes=res.nme_rank_bytes - res.nme_write_bytes,
                           write_bytes=res.nme_write_bytes, **none)
    dimm = dimm_dram_energy(std, read_bytes=0, write_bytes=0, ranks=plat.n_ranks,
                            seconds=res.latency_s, busy_s=min(res.nme_busy_s, res.latency_s))
    host_j = host["total_j"] + res.host_dram_bytes * 8 * e.dram_io_pj_per_bit * pj
    nme_j = nme["total_j"] + (res.nme_adds * e.add16_pj + res.nme_muls * e.mul16_pj
                              + res.nme_muls * 3 * 16 * e.sram_pj_per_bit) * pj
    dimm_j = dimm["total_j"]
    dram = {"act_pre": host["act_pre_j"] + nme["act_pre_j"],
            "read_write": sum(x[k] for x in (host, nme) for k in ("read_j", "write_j")),
            "refresh": dimm["refresh_j"], "background": dimm["background_j"]}
    dram["total"] = sum(dram.values())
    return {"gpu_j": gpu_j, "pcie_j": pcie_j, "host_dram_j": host_j, "nme_j": nme_j,
            "dimm_background_j": dimm_j,
            "total_j": gpu_j + pcie_j + host_j + nme_j + dimm_j, "dram": dram}
