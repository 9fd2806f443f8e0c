"""Energy per element of each cache operator on the NME — an ESTIMATE, not a measurement.

``coda energy`` (:func:`estimate`): each operator is compiled to its NME program
(:mod:`coda.host.nme.compiler`); :func:`program_events` counts the FP operations and buffer
accesses per output element, :func:`measure_activity` runs the RTL for its FU operand toggles
and DRAM requests, and :func:`energy_per_element` prices them with the per-event energies of
:class:`EnergyConstants` (Horowitz, ISSCC 2014, 45 nm; DRAM per command from the DDR5 device's
currents, :mod:`coda.hw.dram.power`). The method, including the toggle-activity scaling, is in
docs/synthesis.md ("Energy estimate").

Everything here is a first-order estimate at 45 nm; control logic, clocking and leakage are
not included. ``coda energy``'s :func:`main` takes its :class:`EnergyConfig` (``CONFIG``).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from coda.hw.dram.power import command_energy
from coda.hw.dram.standards import DEFAULT_STANDARD, get_standard
from coda.hw.nme.isa import NMEConfig, Op, Program, RSrc
from coda.jsonout import json_text
from coda.options import add_options, option
from coda.paths import check_output_path, write_file

__all__ = ["EnergyConstants", "HOROWITZ_45NM", "program_events", "Activity",
           "measure_activity", "energy_per_element", "estimate", "OPERATORS", "EnergyConfig",
           "CONFIG", "configure", "main"]

#: the cache operators of the report, in order (segment with K = 4 terms)
OPERATORS = ("add", "sub", "mul", "scale", "gated_residual", "segment", "cfg_combine",
             "l1_distance", "dequant_int8")


@dataclass(frozen=True)
class EnergyConstants:
    """Per-event energies in pJ, with their sources.

    ========================  =========  =====================================================
    event                     energy     source
    ========================  =========  =====================================================
    16-bit FP add             0.4 pJ     Horowitz, ISSCC 2014, 45 nm (fp16; used for bf16 too:
                                         its 8-bit significand is narrower, so an upper bound)
    16-bit FP mul             1.1 pJ     Horowitz 2014 (fp16; bf16 as above)
    fp32 add                  0.9 pJ     Horowitz 2014
    SRAM access               10 pJ per  Horowitz 2014, 8 KB SRAM, 64-bit access; scaled per
                              64 bits    bit (0.156 pJ/bit). The NME buffers are smaller
                                         (``depth * 16 * lanes`` bits), so this is an upper bound
    DRAM RD / WR burst,       per        :mod:`coda.hw.dram.power`: the device's IDD/IPP currents
    ACT/PRE pair              command    (Micron 16Gb DDR5 MT60B, DDR5-4800, data sheet Table 6),
                                         DRAMPower's method. The NME sits in the buffer chip: no
                                         off-DIMM I/O energy
    ========================  =========  =====================================================

    Attributes:
        add16_pj, mul16_pj, add32_pj: one FP operation.
        sram_pj_per_bit: buffer access energy per bit.
        dram: DRAM standard of the ranks (preset name): its rows set activations, its
            device currents the per-command energies (:mod:`coda.hw.dram.power`).
    """
    add16_pj: float = 0.4
    mul16_pj: float = 1.1
    add32_pj: float = 0.9
    sram_pj_per_bit: float = 10.0 / 64
    dram: str = DEFAULT_STANDARD


HOROWITZ_45NM = EnergyConstants()

# Nominal operand-register toggles of one FU operation on random data: half the operand bits
# that can change (add or mul: 16 per operation; L1: 16 for the widened 16-bit operands plus
# 15.5 for the 31-bit magnitude); see energy_per_element.
NOMINAL_TOGGLES = {"add16": 16.0, "mul16": 16.0, "l1": 31.5}


def program_events(program: Program, lanes: int) -> dict[str, float]:
    """FP operations and 16-bit buffer accesses per output element of ``program``.

    Every micro-op is one pass over every element of the stream, so counts per element are
    counts per micro-op (tail-masked lanes do nothing). FP operations per micro-op: ADD/SUB one
    add, MUL one mul, MAC one mul and one add (two roundings), L1 two fp32 adds
    (``f32(P) - f32(R)`` and the accumulate); MOV and the int8 -> float conversion of
    ``dequant_int8`` are not counted (no cited figure; the conversion is a priority encoder and a
    shifter, not an FU of the lane). Buffer (SRAM) accesses of 16 bits: a read of ``P``
    (ADD/SUB/MUL/MAC/L1), of ``Q`` (MAC), of ``R`` when it is a buffer (stores included), a write
    of ``d`` unless the micro-op stores or is L1.

    Returns:
        ``{"add16", "mul16", "add32", "l1_ops", "sram_reads", "sram_writes", "uops",
        "mem_uops"}`` (per element, except ``uops`` / ``mem_uops`` per program).
    """
    ev = dict.fromkeys(("add16", "mul16", "add32", "l1_ops", "sram_reads", "sram_writes"), 0.0)
    for u in program.uops:
        op = Op(u.op)
        if op in (Op.ADD, Op.SUB, Op.MAC):
            ev["add16"] += 1
        if op in (Op.MUL, Op.MAC):
            ev["mul16"] += 1
        if op == Op.L1:
            ev["add32"] += 2
            ev["l1_ops"] += 1
        ev["sram_reads"] += (op in (Op.ADD, Op.SUB, Op.MUL, Op.MAC, Op.L1)) + (op == Op.MAC) \
            + (RSrc(u.rsrc) == RSrc.BUF)
        ev["sram_writes"] += not (u.store or op == Op.L1)
    ev["uops"] = len(program.uops)
    ev["mem_uops"] = sum(u.touches_memory for u in program.uops)
    return ev


@dataclass
class Activity:
    """What the RTL did for one operator with operand isolation on or off.

    Attributes:
        op: operator. isolation: operand isolation of the NME. n_elems: output elements.
        toggles: FU operand-register bit toggles (``dbg_fu_toggles``) over the program.
        nreads, nwrites: memory word requests. cycles: NME clock cycles.
    """
    op: str
    isolation: bool
    n_elems: int
    toggles: int
    nreads: int
    nwrites: int
    cycles: int


def measure_activity(cfg: NMEConfig, ops=OPERATORS, *, tokens: int = 64, channels: int | None = None,
                     k: int = 4, seed: int = 0) -> list[Activity]:
    """Run every operator on the Verilated NME (:class:`coda.cosim.nme.rtl_backend.RTLBackend`'s
    simulator) with operand isolation on and off; seeded N(0, 1) operands.

    Args:
        cfg: the NME (its ``operand_isolation`` is overridden both ways).
        tokens, channels: operand shape T x C (C default ``8 * lanes``); segment has ``k`` terms.
    Returns:
        One :class:`Activity` per (isolation, op).
    Raises:
        CosimBuildError / CosimRunError from the simulator; ValueError from the compiler.
    """
    from coda.cosim.nme.rtl_backend import RTLBackend, program_cycle_limit
    from coda.synth.stimuli import op_case

    channels = 8 * cfg.lanes if channels is None else channels
    out = []
    for isolation in (True, False):
        icfg = dataclasses.replace(cfg, operand_isolation=isolation)
        backend = RTLBackend(measure_toggles=True, clock_gating=False)   # the synthesised, ungated NME
        try:
            session = backend.session(icfg)
            for i, op in enumerate(ops):
                case = op_case(op, icfg, tokens, channels, k=k, kind="activations", seed=seed + i)
                answer, _ = session.run(case.program.words(), case.mem, latency=1, req_stall=0.0,
                                        rsp_stall=0.0, seed=1,
                                        max_cycles=program_cycle_limit(icfg, case.program, 1, 0.0))
                if answer["status"] != 0:
                    raise RuntimeError(f"{op}: NME status {answer['status']}, expected OK")
                out.append(Activity(op, isolation, case.n_elems, int(answer["toggles"]),
                                    int(answer["nreads"]), int(answer["nwrites"]),
                                    int(answer["cycles"])))
        finally:
            backend.close()
    return out


def energy_per_element(program: Program, cfg: NMEConfig, activity: Activity | None = None,
                       constants: EnergyConstants = HOROWITZ_45NM) -> dict:
    """Energy estimate per output element (pJ) of one program.

    Without ``activity`` the FU energy is nominal (random data) and DRAM traffic is one word
    per memory micro-op per stream word (INT8 streams half a word); with it, FU energy is
    scaled by the measured toggles and DRAM traffic is the measured requests.

    DRAM traffic: the read and write requests (``16 * lanes`` bits each; without a measurement
    the program's stores are writes and its other memory streams reads), priced per command
    (:func:`coda.hw.dram.power.command_energy`: a RD or WR burst per ``burst_bytes``), plus row
    activations assuming streams run sequentially through rows (one ACT/PRE pair per row of the
    rank, :attr:`coda.hw.dram.standards.DRAMStandard` columns x rank width bits).

    Toggle activity: the Horowitz figures are per operation on typical (random) data, so the FU
    energy is scaled by the toggles measured in the RTL (``dbg_fu_toggles``: bit flips of the
    lane's FU operand registers, mul a/b, add a/b, L1 a/b/d). The energy per toggle is
    ``sum(E_op) / sum(nominal toggles)`` (:data:`NOMINAL_TOGGLES`) for the program's operation
    mix, and the FU energy is that times the measured toggles. With operand isolation off, idle
    units' register toggles are charged at the same per-toggle rate.

    Returns:
        ``{"fu_pj", "sram_pj", "dram_pj" (RD/WR bursts), "act_pj" (ACT/PRE pairs),
        "nme_pj" (fu + sram), "total_pj", "toggles_per_elem", "nominal_toggles_per_elem",
        "dram_bits_per_elem", "dram_write_bits_per_elem", "events": program_events(...)}``.
    """
    c = constants
    n = program.n_elems
    ev = program_events(program, cfg.lanes)
    fu_nominal = ev["add16"] * c.add16_pj + ev["mul16"] * c.mul16_pj + ev["add32"] * c.add32_pj
    nominal_toggles = (ev["add16"] * NOMINAL_TOGGLES["add16"]
                       + ev["mul16"] * NOMINAL_TOGGLES["mul16"]
                       + ev["l1_ops"] * NOMINAL_TOGGLES["l1"])
    if activity is None:
        toggles = nominal_toggles
        words, stored = _modelled_dram_words(program, cfg)
        dram_bits = words * 16 * cfg.lanes / n
        write_bits = stored * 16 * cfg.lanes / n
    else:
        toggles = activity.toggles / n
        dram_bits = (activity.nreads + activity.nwrites) * 16 * cfg.lanes / n
        write_bits = activity.nwrites * 16 * cfg.lanes / n
    fu = fu_nominal / nominal_toggles * toggles if nominal_toggles else 0.0
    sram = (ev["sram_reads"] + ev["sram_writes"]) * 16 * c.sram_pj_per_bit
    std = get_standard(c.dram)
    row_bits = std.columns * std.rank_width
    burst_bits = std.burst_bytes * 8
    per = command_energy(std)
    act = dram_bits / row_bits * per.act_pre_pj
    dram = ((dram_bits - write_bits) * per.read_pj + write_bits * per.write_pj) / burst_bits
    return {
        "fu_pj": fu, "fu_nominal_pj": fu_nominal, "sram_pj": sram, "dram_pj": dram,
        "act_pj": act, "nme_pj": fu + sram,
        "total_pj": fu + sram + dram + act, "toggles_per_elem": toggles,
        "nominal_toggles_per_elem": nominal_toggles, "dram_bits_per_elem": dram_bits,
        "dram_write_bits_per_elem": write_bits,
        "events": ev,
    }


def _modelled_dram_words(program: Program, cfg: NMEConfig) -> tuple[float, float]:
    """(words moved, of them stored) of ``program``: a word per stream word for a store or a
    MEM/CHAN/GROUP stream, one per two for an INT8 stream."""
    words = -(-program.n_elems // cfg.lanes)
    total = stored = 0.0
    for u in program.uops:
        if u.store or RSrc(u.rsrc) in (RSrc.MEM, RSrc.CHAN, RSrc.GROUP):
            total += words
            stored += words if u.store else 0
        elif RSrc(u.rsrc) == RSrc.INT8:
            total += -(-words // 2)
    return total, stored


def estimate(cfg: NMEConfig, *, measure: bool = True, tokens: int = 64,
             channels: int | None = None, seed: int = 0,
             constants: EnergyConstants = HOROWITZ_45NM) -> dict:
    """Energy per element of every operator of :data:`OPERATORS`.

    With ``measure`` the RTL is simulated (isolation on and off, :func:`measure_activity`);
    otherwise only the nominal estimate is given.

    Returns:
        ``{"cfg", "constants", "method", "shape", "ops": {op: {"nominal": {...},
        "isolation_on": {...}, "isolation_off": {...}, "cycles_per_elem": float}}}``.
    """
    from coda.synth.stimuli import op_case

    channels = 8 * cfg.lanes if channels is None else channels
    activities = {}
    if measure:
        for a in measure_activity(cfg, tokens=tokens, channels=channels, seed=seed):
            activities[(a.op, a.isolation)] = a
    result = {"cfg": dataclasses.asdict(cfg), "constants": dataclasses.asdict(constants),
              "method": "estimate: Horowitz ISSCC 2014 45 nm per-op energies scaled by RTL FU "
                        "toggle activity; SRAM per bit from the 8 KB figure; DRAM per command "
                        "(RD/WR burst, ACT/PRE) from the device's IDD/IPP currents "
                        "(coda.hw.dram.power, DRAMPower's method)",
              "shape": {"tokens": tokens, "channels": channels, "segment_k": 4}, "ops": {}}
    for i, op in enumerate(OPERATORS):
        case = op_case(op, cfg, tokens, channels, kind="activations", seed=seed + i)
        entry = {"nominal": energy_per_element(case.program, cfg, None, constants)}
        for isolation in (True, False):
            act = activities.get((op, isolation))
            if act is not None:
                key = "isolation_on" if isolation else "isolation_off"
                entry[key] = energy_per_element(case.program, cfg, act, constants)
                entry[f"cycles_per_elem_{key}"] = act.cycles / act.n_elems
        result["ops"][op] = entry
    return result


def print_table(result: dict) -> None:
    """Rich table of :func:`estimate`'s result (pJ per element)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="NME energy per element (ESTIMATE, pJ, 45 nm; method in "
                        "coda.synth.energy)")
    for col in ("op", "FP ops", "SRAM acc", "DRAM bits", "tog on", "tog off", "FU on",
                "FU off", "SRAM", "DRAM+act", "total on", "total off"):
        table.add_column(col, justify="right")
    for op, e in result["ops"].items():
        nom = e["nominal"]
        on, off = e.get("isolation_on", nom), e.get("isolation_off", nom)
        ev = nom["events"]
        table.add_row(op, f"{ev['add16'] + ev['mul16'] + ev['add32']:g}",
                      f"{ev['sram_reads'] + ev['sram_writes']:g}",
                      f"{on['dram_bits_per_elem']:.1f}", f"{on['toggles_per_elem']:.1f}",
                      f"{off['toggles_per_elem']:.1f}", f"{on['fu_pj']:.2f}",
                      f"{off['fu_pj']:.2f}", f"{on['sram_pj']:.2f}",
                      f"{on['dram_pj'] + on['act_pj']:.1f}", f"{on['total_pj']:.1f}",
                      f"{off['total_pj']:.1f}")
    Console(width=160).print(table)


@dataclass(frozen=True)
class EnergyConfig:
    """Every option of ``coda energy`` with its default (the one source of them). Checked
    when made, before any simulation: the NME's sizes (:meth:`nme`), ``--tokens`` >= 1;
    ValueError naming the bad value."""
    lanes: int = option(NMEConfig.lanes, "SIMD lanes", source="NMEConfig.lanes")
    fmt: str = option(NMEConfig.fmt, "element format", choices=("bf16", "fp16"),
                      source="NMEConfig.fmt")
    depth: int = option(NMEConfig.depth, "buffer depth", unit="words", source="NMEConfig.depth")
    tokens: int = option(64, "tokens of each operator's measured stream, >= 1")
    seed: int = option(0, "seed of the operands")
    no_measure: bool = option(False, "nominal estimate only (no RTL simulation)")
    out: Path = option(Path("build/synth/energy"), "report folder")

    def __post_init__(self):
        self.nme()
        if self.tokens < 1:
            raise ValueError(f"--tokens {self.tokens}: expected >= 1")

    def nme(self) -> NMEConfig:
        """The NME estimated: lanes, format, depth (ValueError from NMEConfig for a bad
        size)."""
        return NMEConfig(lanes=self.lanes, fmt=self.fmt, depth=self.depth)


#: the config of ``coda energy``: the CLI calls ``main(from_args(CONFIG, args))``
CONFIG = EnergyConfig


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``coda energy``: :class:`EnergyConfig`."""
    add_options(parser, EnergyConfig)


def main(cfg: EnergyConfig) -> int:
    """``coda energy`` of ``cfg`` (its :class:`EnergyConfig`): measure toggles on the RTL,
    write ``energy.json``. Bad options: ValueError before any simulation (when ``cfg`` was
    made, the output folder here; ``coda: error:``, exit 2)."""
    nme = cfg.nme()
    out = check_output_path(cfg.out, "--out", folder=True)
    t0 = time.perf_counter()
    result = estimate(nme, measure=not cfg.no_measure, tokens=cfg.tokens, seed=cfg.seed)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"energy_l{nme.lanes}_{nme.fmt}.json"
    write_file(path, json_text(result, indent=1) + "\n")
    print_table(result)
    print(f"report: {path} ({result['seconds']} s)")
    return 0
