"""JEDEC DRAM presets for the rank-local DRAM timing model (:mod:`coda.hw.dram.controller`).

Every timing is an integer number of DRAM command-clock cycles (tCK). Each number carries
its source: the JEDEC standard (JESD79-4 DDR4, JESD79-5 DDR5, JESD209-5 LPDDR5), or the
Ramulator 2 preset tables (``src/dram/impl/DDR4.cpp``, ``DDR5.cpp``, ``LPDDR5.cpp``) that
encode those standards. Nanosecond values are converted with ``ceil(t_ns / tCK_ns)`` except
tREFI, a *maximum* average interval, which is rounded down.

One "rank" here is what one memory controller drives on its own data bus: a DDR4 rank on a
64-bit channel (8 x8 devices), one 32-bit DDR5 subchannel (4 x8 devices), one 16-bit LPDDR5
channel (one x16 device). A *burst* is one column command's data: ``rank_width * BL`` bits.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DRAMStandard", "STANDARDS", "DEFAULT_STANDARD", "get_standard", "channel_banks", "DDR4_3200", "DDR5_4800", "LPDDR5_6400"]


@dataclass(frozen=True)
class DRAMStandard:
    """Organisation and timings of one DRAM rank.

    Attributes (organisation):
        name: preset name, e.g. ``"DDR4-3200"``.
        bank_groups, banks_per_group: bank structure (powers of two).
        rows: rows per bank; columns: columns per row (device columns, one per beat).
        device_width: DQ bits of one device; rank_width: data-bus bits of the rank.
        burst_length: beats per column command (BL).
        tCK_ns: command-clock period in ns.
        refresh_postpone: how many REF commands JEDEC lets a controller postpone (the
            checker's slack for the refresh rate).
    Attributes (timings, all in tCK):
        nBL: cycles one burst occupies the data bus; CL, CWL: read / write latency;
        tRCD, tRP (PRE to ACT, same bank), tRPab (PREA to ACT/REF), tRAS, tRC,
        tCCD_S / tCCD_L (column to column, other / same bank group),
        tCCD_L_WR (write to write, same bank group: DDR5 has a longer one),
        tRRD_S / tRRD_L (ACT to ACT), tFAW (four-ACT window), tWR (end of write data to PRE),
        tWTR_S / tWTR_L (end of write data to RD), tRTP (RD to PRE),
        tRFC (REF to ACT/REF), tREFI (average REF interval),
        tRTW (RD to WR command turnaround on the shared data bus),
        tRFCsb (same-bank refresh REFsb to ACT/REFsb of the refreshed banks; 0: the standard
        has no REFsb),
        tRTRS (rank-to-rank switching: idle cycles the shared data bus needs between the bursts
        of two ranks of one channel; not a JEDEC parameter but the controller's, as in
        DRAMsim3's ``tRTRS``; only ``coda dram replay --ranks`` > 1 uses it).
    """

    name: str
    bank_groups: int
    banks_per_group: int
    rows: int
    columns: int
    device_width: int
    rank_width: int
    burst_length: int
    tCK_ns: float
    refresh_postpone: int
    nBL: int
    CL: int
    CWL: int
    tRCD: int
    tRP: int
    tRPab: int
    tRAS: int
    tRC: int
    tCCD_S: int
    tCCD_L: int
    tCCD_L_WR: int
    tRRD_S: int
    tRRD_L: int
    tFAW: int
    tWR: int
    tWTR_S: int
    tWTR_L: int
    tRTP: int
    tRFC: int
    tREFI: int
    tRTW: int
    tRFCsb: int = 0
    tRTRS: int = 1

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "tCK_ns"):
                continue
            if not isinstance(value, int) or value < (0 if f.name in ("refresh_postpone",
                                                                       "tRFCsb", "tRTRS") else 1):
                raise ValueError(f"{self.name}: {f.name}={value!r}: expected a positive int")
        for f in ("bank_groups", "banks_per_group", "rows", "columns", "burst_length"):
            value = getattr(self, f)
            if value & (value - 1):
                raise ValueError(f"{self.name}: {f}={value}: expected a power of two")
        if self.tCK_ns <= 0:
            raise ValueError(f"{self.name}: tCK_ns={self.tCK_ns}: expected > 0")
        if self.tCCD_S < self.nBL:
            raise ValueError(f"{self.name}: tCCD_S={self.tCCD_S} < nBL={self.nBL}: bursts would overlap")
        if self.tRC < self.tRAS + self.tRP:
            raise ValueError(f"{self.name}: tRC={self.tRC} < tRAS+tRP={self.tRAS + self.tRP}")

    # -- derived quantities -------------------------------------------------------------
    @property
    def banks(self) -> int:
        """Banks per rank (bank groups x banks per group)."""
        return self.bank_groups * self.banks_per_group

    @property
    def burst_bytes(self) -> int:
        """Bytes moved by one RD/WR command: rank_width * BL / 8."""
        return self.rank_width * self.burst_length // 8

    @property
    def bursts_per_row(self) -> int:
        """Column commands that fit in one row (columns / BL)."""
        return self.columns // self.burst_length

    @property
    def burst_addr_bits(self) -> int:
        """Bits of a burst address covering the whole rank."""
        return (self.banks * self.rows * self.bursts_per_row - 1).bit_length()

    @property
    def rank_bytes(self) -> int:
        """Capacity of the rank in bytes."""
        return self.banks * self.rows * self.bursts_per_row * self.burst_bytes

    @property
    def peak_gbps(self) -> float:
        """Peak data-bus bandwidth in GB/s (1e9 bytes/s): one burst every nBL cycles."""
        return self.burst_bytes / (self.nBL * self.tCK_ns)

    @property
    def read_latency(self) -> int:
        """RD command to the end of its data burst, in tCK (CL + nBL)."""
        return self.CL + self.nBL

    @property
    def write_to_read_s(self) -> int:
        """WR to RD, other bank group: CWL + nBL + tWTR_S."""
        return self.CWL + self.nBL + self.tWTR_S

    @property
    def write_to_read_l(self) -> int:
        """WR to RD, same bank group: CWL + nBL + tWTR_L."""
        return self.CWL + self.nBL + self.tWTR_L

    @property
    def write_to_pre(self) -> int:
        """WR to PRE of the same bank: CWL + nBL + tWR."""
        return self.CWL + self.nBL + self.tWR

    @property
    def act_interval(self) -> float:
        """Fewest cycles per ACT sustained by one rank: ``max(tFAW / 4, tRRD_S)`` (tCK).

        Four ACTs per tFAW window and tRRD_S between any two (other bank groups)."""
        return max(self.tFAW / 4, self.tRRD_S)

    @property
    def act_bound_gbps(self) -> float:
        """Bandwidth bound of one rank when every access is a row miss (one ACT per burst):
        ``min(burst_bytes / (act_interval * tCK_ns), peak_gbps)`` in GB/s. DDR4-3200 x8:
        64 B / (34 / 4 x 0.625 ns) = 12.05 GB/s; DDR5-4800 x8: tFAW = 4 x tRRD_S = 32, one ACT
        per 8 cycles = one burst per nBL: the data-bus peak, 19.2 GB/s."""
        return min(self.burst_bytes / (self.act_interval * self.tCK_ns), self.peak_gbps)

    @property
    def refresh_ceiling(self) -> float:
        """Fraction of time not blocked by refresh, 1 - tRFC / tREFI."""
        return 1.0 - self.tRFC / self.tREFI


# DDR4-3200AA (22-22-22), 8Gb x8 devices, x64 rank.
DDR4_3200 = DRAMStandard(
    name="DDR4-3200",
    bank_groups=4, banks_per_group=4,      # JESD79-4 8Gb x8: 4 BG x 4 banks (Ramulator DDR4_8Gb_x8)
    rows=1 << 16, columns=1 << 10,         # 64K rows, 1K columns (Ramulator DDR4_8Gb_x8)
    device_width=8, rank_width=64,         # x8 devices, 64-bit DIMM data bus
    burst_length=8,                        # BL8 (JESD79-4)
    tCK_ns=0.625,                          # 3200 MT/s -> 1600 MHz
    refresh_postpone=8,                    # JESD79-4 4.9: up to 8 REF may be postponed
    nBL=4,                                 # BL8 on a DDR bus = 4 tCK (Ramulator nBL)
    CL=22, CWL=16,                         # Ramulator DDR4_3200AA nCL, nCWL (JESD79-4 CL22, CWL16)
    tRCD=22, tRP=22, tRPab=22,             # Ramulator DDR4_3200AA nRCD, nRP (13.75 ns)
    tRAS=52, tRC=74,                       # Ramulator DDR4_3200AA nRAS (32 ns), nRC
    tCCD_S=4, tCCD_L=8, tCCD_L_WR=8,       # Ramulator nCCDS, nCCDL (JESD79-4: 4 / max(5nCK,5ns))
    tRRD_S=4, tRRD_L=8,                    # Ramulator nRRDS/nRRDL table, x8 @3200 (JESD79-4 Tab.169)
    tFAW=34,                               # Ramulator nFAW table, x8 @3200 (21 ns)
    tWR=24, tRTP=12,                       # Ramulator nWR (15 ns), nRTP (7.5 ns)
    tWTR_S=4, tWTR_L=12,                   # Ramulator nWTRS (2.5 ns), nWTRL (7.5 ns)
    tRFC=560,                              # JESD79-4 tRFC1 8Gb = 350 ns (Ramulator's table uses 360)
    tREFI=12480,                           # JESD79-4 tREFI = 7.8 us (0-85 C)
    tRTW=12,                               # CL + nBL + 2 - CWL (Ramulator DDR4 RD->WR, tWPRE = 1)
    tRTRS=1,                               # DRAMsim3 configs/DDR4_8Gb_x8_3200.ini tRTRS = 1
)

# DDR5-4800AN (34-34-34), 16Gb x8 devices, one 32-bit subchannel.
DDR5_4800 = DRAMStandard(
    name="DDR5-4800",
    bank_groups=8, banks_per_group=4,      # JESD79-5 16Gb x8: 8 BG x 4 banks (Ramulator DDR5_16Gb_x8)
    rows=1 << 16, columns=1 << 10,         # 64K rows, 1K columns (Ramulator DDR5_16Gb_x8)
    device_width=8, rank_width=32,         # x8 devices on a 32-bit subchannel
    burst_length=16,                       # BL16 (JESD79-5)
    tCK_ns=1 / 2.4,                        # 4800 MT/s -> 2400 MHz (0.4167 ns)
    refresh_postpone=4,                    # JESD79-5: up to 4 REFab may be postponed (1x mode)
    nBL=8,                                 # BL16 = 8 tCK (Ramulator nBL)
    CL=34, CWL=32,                         # Ramulator 2.1 DDR5_4800AN nCL, nCWL (CWL = CL - 2)
    tRCD=34, tRP=34, tRPab=34,             # Ramulator 2.1 DDR5_4800AN nRCD, nRP (14.17 ns)
    tRAS=77, tRC=111,                      # Ramulator 2.1 DDR5_4800AN nRAS (32 ns), nRC
    tCCD_S=8, tCCD_L=12, tCCD_L_WR=48,     # Ramulator 2.1 nCCDS, nCCDL (5 ns), nCCDL_WR (20 ns)
    tRRD_S=8, tRRD_L=12,                   # JESD79-5: tRRD_S 8 nCK, tRRD_L max(8nCK, 5 ns)
    tFAW=32,                               # JESD79-5 x8 (1 KB page): 32 nCK (Ramulator x8 table)
    tWR=72, tRTP=18,                       # Ramulator 2.1 nWR (30 ns), nRTP (7.5 ns)
    tWTR_S=6, tWTR_L=24,                   # Ramulator 2.1 nWTRS (2.5 ns), nWTRL (10 ns)
    tRFC=708,                              # JESD79-5 tRFC1 16Gb = 295 ns (Ramulator tRFC table)
    tREFI=9360,                            # JESD79-5 tREFI = 3.9 us
    tRTW=14,                               # CL + nBL + 2 - CWL + 2 (Ramulator DDR5 nCCDS_RTW)
    tRFCsb=312,                            # JESD79-5 tRFCsb 16Gb = 130 ns (Ramulator tRFCsb table)
    tRTRS=2,                               # assumed: DRAMsim3 has no DDR5 preset; its DDR4 1 tCK
                                           # + 1 for DDR5's 2-tCK read preamble (not JEDEC)
)

# LPDDR5-6400, 16Gb x16 device in bank-group mode, one 16-bit channel.
LPDDR5_6400 = DRAMStandard(
    name="LPDDR5-6400",
    bank_groups=4, banks_per_group=4,      # JESD209-5 BG mode (> 3200 Mbps): 4 BG x 4 banks
    rows=1 << 16, columns=1 << 10,         # Ramulator LPDDR5_16Gb_x16: 64K rows, 1K columns
    device_width=16, rank_width=16,        # one x16 channel
    burst_length=16,                       # BL16 (JESD209-5)
    tCK_ns=1.25,                           # CK = 800 MHz, WCK:CK = 4:1 -> 6400 MT/s
    refresh_postpone=8,                    # JESD209-5: up to 8 REFab may be postponed
    nBL=2,                                 # 16 beats at 8 beats per CK (JESD209-5 BL/n = 2)
    CL=20, CWL=11,                         # Ramulator LPDDR5_6400 nCL (RL), nCWL (WL)
    tRCD=15,                               # Ramulator nRCD (18 ns)
    tRP=15, tRPab=17,                      # Ramulator nRPpb (18 ns), nRPab (21 ns)
    tRAS=34,                               # Ramulator nRAS (42 ns)
    tRC=49,                                # JESD209-5 tRC = tRAS + tRPpb (Ramulator's nRC=30 < tRAS)
    tCCD_S=2, tCCD_L=4, tCCD_L_WR=4,       # JESD209-5 BG mode BL16: other BG BL/n=2, same BG 4 nCK
    tRRD_S=4, tRRD_L=4,                    # Ramulator nRRD (5 ns)
    tFAW=16,                               # Ramulator nFAW (20 ns)
    tWR=28, tRTP=4,                        # Ramulator nWR (34 ns), nRTP
    tWTR_S=5, tWTR_L=10,                   # Ramulator nWTRS (6.25 ns), nWTRL (12 ns)
    tRFC=224,                              # Ramulator tRFCab table, 16Gb = 280 ns
    tREFI=3124,                            # JESD209-5 tREFI = 3.906 us (Ramulator tREFI_BASE)
    tRTW=13,                               # CL + nBL + 2 - CWL (Ramulator LPDDR5 RD->WR)
    tRTRS=1,                               # assumed as DDR4's (DRAMsim3); LPDDR5 replay is 1 rank
)

STANDARDS: dict[str, DRAMStandard] = {s.name: s for s in (DDR4_3200, DDR5_4800, LPDDR5_6400)}

#: the standard of the DIMMs in CODA's design (DDR5-4800 RDIMMs, JESD79-5): the default of every
#: command and function that takes a DRAM standard
DEFAULT_STANDARD = DDR5_4800.name


def get_standard(name: str | DRAMStandard) -> DRAMStandard:
    """The preset called ``name`` (case-insensitive, ``_`` or ``-``), or ``name`` itself.

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if isinstance(name, DRAMStandard):
        return name
    key = str(name).upper().replace("_", "-")
    for std in STANDARDS.values():
        if std.name.upper() == key:
            return std
    raise ValueError(f"unknown DRAM standard {name!r}: expected one of {', '.join(STANDARDS)}")


def channel_banks(std: DRAMStandard, ranks: int) -> DRAMStandard:
    """``std`` as the request queue, scheduler and row policy of a channel of ``ranks`` ranks
    see it: one rank of ``ranks`` times the banks per group, so a bank index of the channel
    is ``Cat(bg, ba, rank)`` (:mod:`coda.hw.dram.mapping`). For widths only: every timing is
    per rank (:class:`coda.hw.dram.timing.TimingTable`). ``std`` itself for one rank."""
    if ranks == 1:
        return std
    from dataclasses import replace
    return replace(std, banks_per_group=std.banks_per_group * ranks)
