"""DRAM device currents and per-command energy (DRAMPower's method) for the rank model.

A device power spec (:class:`DevicePower`, :func:`get_power`) holds the IDD (VDD rail) and IPP
(VPP rail) currents of one DRAM *device* (chip) as its data sheet tabulates them, with the rail
voltages. :func:`command_energy` turns them into the energy of one command of a whole rank (all
its ``rank_width / device_width`` devices, no ECC devices; its docstring has DRAMPower's
formulas), and :func:`dram_energy` prices counts of commands and background-state times.

No power-down (the controller never drops CKE; IDD2P/IDD3P unused) and no same-bank refresh
current (a REFsb has no energy here; the cosimulated controller refreshes all banks). The data
bus I/O (VDDQ, termination) is the channel's, counted by whoever models the channel
(:class:`coda.host.system.platforms.Energy` ``dram_io_pj_per_bit`` for the host link; an NME in
the buffer chip drives no DIMM channel).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from coda.hw.dram.standards import DRAMStandard, get_standard

__all__ = ["DevicePower", "CommandEnergy", "DEVICE_POWER", "get_power", "command_energy",
           "dram_energy", "ENERGY_PARTS"]

#: the energy split of :func:`dram_energy`, in order
ENERGY_PARTS = ("act_pre", "read", "write", "refresh", "background")


@dataclass(frozen=True)
class DevicePower:
    """Currents (mA) and rail voltages (V) of one DRAM device, as its data sheet gives them.

    Attributes:
        name: what the numbers describe (part, density, width, speed bin).
        vdd, vpp: core and word-line supply, V.
        idd0, ipp0: one-bank ACTIVATE-to-PRECHARGE loop (tRC apart), mA.
        idd2n, ipp2n: precharge standby (all banks closed), mA.
        idd3n, ipp3n: active standby (all banks open), mA.
        idd4r, ipp4r / idd4w, ipp4w: seamless read / write bursts, mA.
        idd5b, ipp5b: burst all-bank refresh (REF every tRFC), mA.
        idd2p, idd3p: precharge / active power-down, mA (kept for completeness; the modelled
            controller has no power-down).
        sources: field -> where the figure comes from.
    """
    name: str
    vdd: float
    vpp: float
    idd0: float
    idd2n: float
    idd3n: float
    idd4r: float
    idd4w: float
    idd5b: float
    ipp0: float
    ipp2n: float
    ipp3n: float
    ipp4r: float
    ipp4w: float
    ipp5b: float
    idd2p: float
    idd3p: float
    sources: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for f in fields(self):
            if f.name in ("name", "sources"):
                continue
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{self.name}: {f.name}={value!r}: expected a number >= 0")
        for rail, i0, i2n, i3n in (("IDD", self.idd0, self.idd2n, self.idd3n),
                                   ("IPP", self.ipp0, self.ipp2n, self.ipp3n)):
            if i3n < i2n:
                raise ValueError(f"{self.name}: {rail}3N={i3n} < {rail}2N={i2n}: active "
                                 f"standby expected >= precharge standby")


#: Micron 16Gb DDR5 SDRAM (MT60B2G8, x8, die revision A), DDR5-4800B column.
MT60B_16GB_X8_4800 = DevicePower(
    name="Micron MT60B2G8 16Gb x8 DDR5-4800B (die rev A)",
    vdd=1.1, vpp=1.8,
    idd0=103, idd2n=92, idd3n=142, idd4r=377, idd4w=349, idd5b=277,
    ipp0=8, ipp2n=6, ipp3n=7, ipp4r=9, ipp4w=36, ipp5b=28,
    idd2p=88, idd3p=140,
    sources={
        "vdd": "Micron DDR5 SDRAM core data sheet, p.1: VDD = VDDQ = 1.1 V (nom); JESD79-5",
        "vpp": "Micron DDR5 SDRAM core data sheet, p.1: VPP = 1.8 V (nom); JESD79-5",
        "idd": "Micron 16Gb DDR5 SDRAM addendum, die rev A (16gb_ddr5_sdram_diereva.pdf, "
               "Rev. D 02/2023), Table 6 'IDD, IPP and IDDQ Current Limits', x8, DDR5-4800: "
               "IDD0 103, IDD2N 92, IDD3N 142, IDD4R 377, IDD4W 349, IDD5B 277, IDD2P 88 mA "
               "(maxima, worst-case process, temperature, voltage); read from a third-party "
               "transcription (the PDF itself was not reachable); IDD2N, IDD3N, IDD5B, IDD2P, "
               "IDD3P 140 agree with gem5's DDR5 interface, which cites the same addendum",
        "ipp2n_ipp3n": "the same Table 6, x8, DDR5-4800: IPP2N 6, IPP3N 7 mA (same transcription)",
        "ipp0_ipp4_ipp5b": "secondary: the DDR5-4800 inputs of Micron's DDR5 power calculator "
                           "as copied in a public repository (Stardust-lf/ramulator2-latency-"
                           "supported, illustration_script/chip_pow_config.py): IPP0 8, "
                           "IPP4R 9, IPP4W 36, IPP5B 28 mA; its IDD0/2N/3N/5B/2P equal Table 6's "
                           "x8 column, its IDD4R/W (318/345) do not, so its IPP column is "
                           "possibly another width's (IPP is not width-dependent in DDR4 sheets)",
    })

#: device power specs by DRAM standard (:data:`coda.hw.dram.standards.STANDARDS` names)
DEVICE_POWER: dict[str, DevicePower] = {"DDR5-4800": MT60B_16GB_X8_4800}


def get_power(std: str | DRAMStandard) -> DevicePower:
    """The device power spec of standard ``std``.

    Raises:
        ValueError: a standard with no cited currents (lists the ones that have them).
    """
    name = get_standard(std).name
    spec = DEVICE_POWER.get(name)
    if spec is None:
        raise ValueError(f"no device currents for {name}: command-level DRAM energy needs a "
                         f"data sheet's IDD/IPP; expected one of {', '.join(DEVICE_POWER)}")
    return spec


@dataclass(frozen=True)
class CommandEnergy:
    """Energy of one command of a whole rank (pJ) and its background power (W).

    Attributes:
        act_pre_pj: one ACT with its PRE. read_pj, write_pj: one RD / WR burst.
        refresh_pj: one all-bank REF (beyond every bank's active standby over tRFC).
        precharged_w: background power of the rank with every bank closed (``I2N``).
        bank_open_w: what each open bank adds to it (``(I3N - I2N) / B``).
        devices: devices per rank (``rank_width / device_width``); banks: B.
    """
    act_pre_pj: float
    read_pj: float
    write_pj: float
    refresh_pj: float
    precharged_w: float
    bank_open_w: float
    devices: int
    banks: int


def command_energy(std: str | DRAMStandard, power: DevicePower | None = None) -> CommandEnergy:
    """Per-command energies and background powers of one rank of ``std``,
    from ``power`` (default :func:`get_power` of ``std``): each device's, times the devices
    of the rank. Currents in mA times V times ns give pJ.

    The method of DRAMPower (Chandrasekar et al., "Improved Power Modeling of DDR SDRAMs", DSD
    2011; Micron TN-41-01 "Calculating Memory System Power for DDR3", the IDD-difference
    formulas), per rail ``v`` in (VDD, VPP) with its currents ``I`` (IDD or IPP):

    ==================  ======================================================================
    ACT + PRE (a pair)  ``v * (I0 * tRC - (I1 * tRAS + I2N * (tRC - tRAS)))``: the IDD0 loop
                        (one bank ACT-PRE every tRC) less the standby it includes, one bank open
                        for tRAS (``I1``, below) and none for the rest of tRC
    RD burst            ``v * (I4R - I3N) * tBurst`` (tBurst = nBL tCK, the burst on the bus)
    WR burst            ``v * (I4W - I3N) * tBurst``
    REF (all banks)     ``v * (I5B - I3N) * tRFC``; every bank counts as open for the tRFC
                        (DRAMPower's convention), so a refresh costs ``I5B * tRFC`` in all
    background          bank-wise, as DRAMPower's DDR5 model (``Calculation_DDR5``: a per-bank
                        share ``(I3N - I2N) / B`` on top of the precharge standby ``I2N``, its
                        shared active part set to ``I2N``): ``v * (I2N + (I3N - I2N) * b / B)``
                        with ``b`` of the rank's ``B`` banks open; ``I1`` is that with ``b = 1``
    ==================  ======================================================================

    Why one bank and not IDD3N as the ACT term's baseline (TN-41-01's DDR3 form): IDD3N is
    measured with *all* banks open, IDD0's loop opens one; on the DDR5 part of :func:`get_power`
    the maxima give IDD0 = 103 mA < IDD3N = 142 mA, so
    ``I0 tRC - (I3N tRAS + I2N (tRC - tRAS))`` is negative.

    Raises:
        ValueError: no power spec for ``std``, or currents that make an energy negative.
    """
    std = get_standard(std)
    p = get_power(std) if power is None else power
    tck = std.tCK_ns
    t_rc, t_ras, t_burst, t_rfc = std.tRC * tck, std.tRAS * tck, std.nBL * tck, std.tRFC * tck
    n, b = std.rank_width // std.device_width, std.banks

    def both(fn):
        return n * (p.vdd * fn(p.idd0, p.idd2n, p.idd3n, p.idd4r, p.idd4w, p.idd5b)
                    + p.vpp * fn(p.ipp0, p.ipp2n, p.ipp3n, p.ipp4r, p.ipp4w, p.ipp5b))

    def act(i0, i2n, i3n, i4r, i4w, i5b):
        i1 = i2n + (i3n - i2n) / b          # one bank open
        return i0 * t_rc - (i1 * t_ras + i2n * (t_rc - t_ras))

    e = CommandEnergy(
        act_pre_pj=both(act),
        read_pj=both(lambda i0, i2n, i3n, i4r, i4w, i5b: (i4r - i3n) * t_burst),
        write_pj=both(lambda i0, i2n, i3n, i4r, i4w, i5b: (i4w - i3n) * t_burst),
        refresh_pj=both(lambda i0, i2n, i3n, i4r, i4w, i5b: (i5b - i3n) * t_rfc),
        precharged_w=n * (p.vdd * p.idd2n + p.vpp * p.ipp2n) * 1e-3,
        bank_open_w=n * (p.vdd * (p.idd3n - p.idd2n) + p.vpp * (p.ipp3n - p.ipp2n)) / b * 1e-3,
        devices=n, banks=b)
    for f in ("act_pre_pj", "read_pj", "write_pj", "refresh_pj"):
        if getattr(e, f) < 0:
            raise ValueError(f"{p.name} on {std.name}: {f} = {getattr(e, f):.4g} pJ < 0: "
                             f"the currents expected to rise above standby")
    return e


def dram_energy(std: str | DRAMStandard, *, acts: float, reads: float, writes: float,
                refreshes: float, rank_s: float, bank_open_s: float,
                power: DevicePower | None = None) -> dict:
    """Energy of ranks of ``std`` that issued ``acts`` ACT/PRE pairs, ``reads`` RD and
    ``writes`` WR bursts and ``refreshes`` all-bank REFs over ``rank_s`` rank-seconds, with
    ``bank_open_s`` bank-seconds of open banks (a REF's tRFC counts every bank of its rank as
    open). Counts and times are summed over the ranks; counts may be fractional, as a
    model's are.

    Returns:
        ``{"act_pre_j", "read_j", "write_j", "refresh_j", "background_j", "total_j"}`` (J) and
        the same in pJ (``..._pj``).
    Raises:
        ValueError: a negative count or time (naming it), ``bank_open_s`` beyond every bank
            open all the time, or no power spec for ``std``.
    """
    counts = {"acts": acts, "reads": reads, "writes": writes, "refreshes": refreshes,
              "rank_s": rank_s, "bank_open_s": bank_open_s}
    for k, v in counts.items():
        if v < 0:
            raise ValueError(f"{k}={v!r}: expected >= 0")
    e = command_energy(std, power)
    if bank_open_s > rank_s * e.banks * (1 + 1e-9):
        raise ValueError(f"bank_open_s={bank_open_s!r}: expected <= rank_s x {e.banks} banks "
                         f"= {rank_s * e.banks!r}")
    pj = {"act_pre": acts * e.act_pre_pj, "read": reads * e.read_pj,
          "write": writes * e.write_pj, "refresh": refreshes * e.refresh_pj,
          "background": (rank_s * e.precharged_w + bank_open_s * e.bank_open_w) * 1e12}
    pj["total"] = sum(pj.values())
    out = {f"{k}_pj": v for k, v in pj.items()}
    out.update({f"{k}_j": v * 1e-12 for k, v in pj.items()})
    return out
