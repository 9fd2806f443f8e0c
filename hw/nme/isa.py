"""The NME instruction set: programs of elementwise micro-ops over streams.

This module is the contract between the hardware (:mod:`coda.hw.nme.top`), the host compiler
(:mod:`coda.host.nme.compiler`) and the torch interpreter of programs (:mod:`coda.host.nme.interp`).
It is plain Python (no torch, no Amaranth) so every side can import it.

A :class:`Program` is a header (``n_elems``) plus micro-ops (:class:`UOp`: an :class:`Op` over
buffers and an operand ``R`` from an :class:`RSrc`), sent as 64-bit command words
(:func:`encode_header`, :func:`encode_uop`) and checked by :func:`validate` before it touches
memory; a bad one gets a :class:`Status` error. :class:`NMEConfig` holds an NME's elaboration
parameters, :data:`NME_PRESETS` the named register-stage settings. The memory model and the host
interface are in docs/nme.md ("Memory and the host interface"); each class and function below
documents its own part of the semantics.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "Op", "RSrc", "Status", "UOp", "Program", "NMEConfig",
    "encode_header", "decode_header", "encode_uop", "decode_uop",
    "ADDR_BITS", "PARAM_BITS", "MAX_MUL_LATENCY", "MAX_ADD_LATENCY", "MAX_OPERAND_LATENCY",
    "NMEPreset", "NME_PRESETS", "DEFAULT_PRESET", "PRESET_FIELDS", "validate",
]

ADDR_BITS = 24
PARAM_BITS = 16
N_ELEMS_BITS = 32
N_UOPS_BITS = 8
REG_BITS = 4


class Op(enum.IntEnum):
    """ALU operation of a micro-op.

    For each valid lane of each word ``w`` of the block (:class:`Program`)::

        MOV : d = R
        ADD : d = P + R
        SUB : d = P - R
        MUL : d = P * R
        MAC : d = P + (Q * R)          two IEEE roundings (the product is rounded first)
        L1  : acc[lane] += |f32(P) - f32(R)|   in fp32 (no d is written)

    with every ``+ - *`` one IEEE-754 operation of the format, round-to-nearest-even, subnormals
    kept — exactly torch eager on CPU for bf16/fp16 tensors. ``P`` and ``Q`` are buffers
    (:class:`UOp` ``p``, ``q`` fields); ``R`` comes from the micro-op's :class:`RSrc`.

    The ``L1`` accumulators are per lane, cleared at program start; at the end the NME sums the
    lanes in order 0..lanes-1 in fp32 into the 32-bit result register ``l1``.
    """
    MOV = 0
    ADD = 1
    SUB = 2
    MUL = 3
    MAC = 4
    L1 = 5


class RSrc(enum.IntEnum):
    """Where operand R comes from (:class:`UOp` ``rsrc``), for word ``w`` of the stream::

        BUF   : buffer ``r``, word ``w``
        MEM   : memory word ``addr + w``                                   (a plain stream)
        CHAN  : memory word ``addr + (w mod param)``       per-channel vector, param = C / lanes
        GROUP : element ``w // param`` of the vector at ``addr``, broadcast to all lanes
                (a per-group scale with group size G = param * lanes elements);
                param = 0 means a scalar: element 0 broadcast everywhere
        INT8  : packed int8 stream at ``addr``: word ``addr + w // 2``, half ``w mod 2``
                (lanes ``0..lanes-1`` of output word w take int8 elements
                ``(w mod 2)*lanes + j``), converted exactly to the format
    """
    BUF = 0
    MEM = 1
    CHAN = 2
    GROUP = 3
    INT8 = 4


class Status(enum.IntEnum):
    """NME status register after a program (0 = OK; :func:`validate` lists which error a bad
    program gets)."""
    OK = 0
    BAD_OPCODE = 1
    BAD_ADDR = 2
    BAD_LENGTH = 3
    TOO_MANY_STREAMS = 4
    BAD_OPERAND = 5


#: Largest ``NMEConfig.mul_latency`` / ``add_latency``: the register stages the pipelined
#: units offer (``coda.hw.nme.fp.FPMUL_MAX_LATENCY`` / ``FPADD_MAX_LATENCY``; a test checks
#: they agree, this module stays free of amaranth).
MAX_MUL_LATENCY = 5
MAX_ADD_LATENCY = 7
#: Largest ``NMEConfig.operand_latency``: one register stage straight after the block RAMs.
MAX_OPERAND_LATENCY = 1


@dataclass(frozen=True)
class NMEPreset:
    """A named NME configuration (``--preset``): the register stages of its FP units and
    operand path (:class:`NMEConfig` ``mul_latency``, ``add_latency``, ``operand_latency``),
    the nextpnr placer ``seed`` its Fmax was measured at, and that Fmax class (text, MHz on
    ECP5)."""
    name: str
    mul_latency: int
    add_latency: int
    operand_latency: int
    seed: int
    fmax: str

    def units(self) -> dict[str, int]:
        """The NMEConfig fields of the preset: ``{mul_latency, add_latency, operand_latency}``."""
        return {k: getattr(self, k) for k in PRESET_FIELDS}

    def describe(self) -> str:
        """One line for the top of a command's output: name, latencies, Fmax class."""
        return (f"NME preset {self.name}: mul {self.mul_latency} / add {self.add_latency} / "
                f"operand {self.operand_latency} register stages, Fmax {self.fmax}")


#: the NMEConfig fields a preset sets
PRESET_FIELDS = ("mul_latency", "add_latency", "operand_latency")
#: The NME configurations every command that builds an NME takes by name (``--preset``,
#: :func:`coda.hw.verilog.resolve_preset`): the units that place and route at 100 MHz
#: (docs/results.md, "ECP5 Fmax of the 8-lane NME": LFE5U-45F, 8 lanes bf16, nextpnr seed 2;
#: docs/synthesis.md, "Reaching 100 MHz on ECP5") and
#: the combinational units (fewest cycles per pass, about a quarter of that clock).
NME_PRESETS: dict[str, NMEPreset] = {p.name: p for p in (
    NMEPreset("timing-closed", 5, 7, 1, 2, "about 100 MHz on ECP5 (LFE5U-45F, 8 lanes bf16, "
                                           "nextpnr seed 2)"),
    NMEPreset("combinational", 0, 0, 0, 1, "about 25 MHz on ECP5 (8 lanes bf16)"),
)}
#: The one default NME: the preset of a command given neither ``--preset`` nor latency
#: flags, and the register stages of :class:`NMEConfig` (so of every NME built without
#: them: cosimulation builds, the cycle model, the system model's segment times). The
#: timing-closed units, the NME one would build (issue 60, item 2).
DEFAULT_PRESET = "timing-closed"


@dataclass(frozen=True)
class NMEConfig:
    """Elaboration parameters of one NME.

    Attributes:
        lanes: SIMD width, elements per word (1..64).
        fmt: element format, ``"bf16"`` or ``"fp16"``.
        depth: buffer depth in words (words per block), >= 1.
        nbuf: number of on-chip buffers (2..16).
        imem_depth: most micro-ops in one program (1..255).
        max_streams: most memory micro-ops in one program.
        mem_words: size of the rank-local memory in words (<= 2**24).
        max_elems: largest ``n_elems`` accepted (<= 2**32 - 1).
        operand_isolation: hold FU operand registers still on masked lanes / idle units.
        mul_latency: register stages inside each lane's FPMul, 0..:data:`MAX_MUL_LATENCY`
            (0: combinational). Each stage adds one cycle to every pass. The three latencies
            default to :data:`DEFAULT_PRESET`'s (the timing-closed units, 5 / 7 / 1).
        add_latency: register stages inside every FPAdd (the lanes' add, the L1 path's fp32
            subtract and accumulate, the lane sum), 0..:data:`MAX_ADD_LATENCY`. Each stage
            adds one cycle to every pass (two to an L1 pass that the fp32 path makes the
            longer); the per-lane L1 accumulate is a recurrence, so an L1 pass takes one
            word every ``add_latency + 1`` cycles and the lane sum ``add_latency + 1``
            cycles per lane. Results are the same bits for every latency.
        operand_latency: register stages between the buffers' block-RAM read ports (and
            the read-response FIFO) and the lanes' operand registers, 0..
            :data:`MAX_OPERAND_LATENCY`. 0: the buffer word goes through the P/Q/R
            selection into the operand registers in the cycle after its read; 1: every
            block-RAM output goes straight into a register and the selection happens one
            cycle later, so a block RAM's clock-to-output time (about 5.6 ns on an ECP5
            DP16KD without its output register, nextpnr's timing) is not in front of the
            selection. Adds one cycle to every pass; same bits.
        trail_stores: let a program's stores trail the next blocks' reads where no such
            read can meet them (:func:`coda.hw.nme.check.stores_may_trail`): store passes
            hand over like other passes and the issue side walks only the reading
            micro-ops, so a long stream takes one word per pass per cycle at any depth
            longer than the pipeline. Same bits. Off by default: behind a DRAM controller
            the interleaved requests cost row hits where the DRAM is the bottleneck
            (docs/nme.md, "Passes overlap", has the measurements).
    """
    lanes: int = 8
    fmt: str = "bf16"
    depth: int = 64
    nbuf: int = 4
    imem_depth: int = 32
    max_streams: int = 24
    mem_words: int = 1 << 16
    max_elems: int = (1 << 24) - 1
    operand_isolation: bool = True
    mul_latency: int = NME_PRESETS[DEFAULT_PRESET].mul_latency
    add_latency: int = NME_PRESETS[DEFAULT_PRESET].add_latency
    operand_latency: int = NME_PRESETS[DEFAULT_PRESET].operand_latency
    trail_stores: bool = False

    def __post_init__(self):
        if not 1 <= self.lanes <= 64:
            raise ValueError(f"lanes={self.lanes}: expected 1..64")
        if self.fmt not in ("bf16", "fp16"):
            raise ValueError(f"fmt={self.fmt!r}: expected 'bf16' or 'fp16'")
        if self.depth < 1:
            raise ValueError(f"depth={self.depth}: expected >= 1 word")
        if not 2 <= self.nbuf <= 16:
            raise ValueError(f"nbuf={self.nbuf}: expected 2..16")
        if not 1 <= self.imem_depth <= 255:
            raise ValueError(f"imem_depth={self.imem_depth}: expected 1..255")
        if not 1 <= self.max_streams:
            raise ValueError(f"max_streams={self.max_streams}: expected >= 1")
        if not 1 <= self.mem_words <= (1 << ADDR_BITS):
            raise ValueError(f"mem_words={self.mem_words}: expected 1..2**{ADDR_BITS}")
        if not 1 <= self.max_elems < (1 << N_ELEMS_BITS):
            raise ValueError(f"max_elems={self.max_elems}: expected 1..2**32-1")
        for name, top in (("mul_latency", MAX_MUL_LATENCY), ("add_latency", MAX_ADD_LATENCY),
                          ("operand_latency", MAX_OPERAND_LATENCY)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise ValueError(f"{name}={value!r}: expected an int 0..{top}")
        if not isinstance(self.trail_stores, bool):
            raise ValueError(f"trail_stores={self.trail_stores!r}: expected True or False")

    @property
    def word_bits(self) -> int:
        return 16 * self.lanes


@dataclass(frozen=True)
class UOp:
    """One micro-op: ``op`` (:class:`Op`) over buffers ``d``, ``p``, ``q`` and the operand ``R``
    from ``rsrc`` (:class:`RSrc`, with ``r``, ``addr``, ``param``).

    The destination is buffer ``d`` unless ``store`` is set: then the result goes to memory word
    ``addr + w`` with the tail lanes masked. At most one memory operand per micro-op: ``store``
    requires ``rsrc == BUF``. :func:`encode_uop` gives the bit layout.
    """
    op: Op
    rsrc: RSrc = RSrc.BUF
    store: bool = False
    d: int = 0
    p: int = 0
    q: int = 0
    r: int = 0
    addr: int = 0
    param: int = 0

    @property
    def touches_memory(self) -> bool:
        return self.store or self.rsrc != RSrc.BUF


@dataclass(frozen=True)
class Program:
    """A header (``n_elems``) and its micro-ops.

    A program has 1 ≤ ``len(uops)`` ≤ ``imem_depth`` micro-ops; ``n_elems`` = N is the number of
    elements of the output stream (1 ≤ N ≤ ``max_elems``). The NME walks the stream in *words*
    ``w = 0 .. W-1`` with ``W = ceil(N / lanes)``; the last word has ``N - (W-1)*lanes`` valid
    lanes (the masked tail), the other lanes are masked: they store nothing, accumulate nothing,
    and (with operand isolation) do not toggle.

    The stream is strip-mined into *blocks* of ``depth`` words. For each block, all micro-ops run
    in program order, each one a *pass* over the block's words ``w``. Buffers
    ``b0 .. b{nbuf-1}`` are on-chip, ``depth`` words each; a pass reads/writes buffer word
    ``w mod depth``.
    """
    n_elems: int
    uops: tuple[UOp, ...]

    def words(self) -> list[int]:
        """The 64-bit command words: header then micro-ops."""
        return [encode_header(len(self.uops), self.n_elems)] + [encode_uop(u) for u in self.uops]


def _check_field(name: str, value: int, bits: int) -> int:
    value = int(value)
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{name}={value}: expected 0..{(1 << bits) - 1} ({bits} bits)")
    return value


def encode_header(n_uops: int, n_elems: int) -> int:
    """Header word: ``[7:0] n_uops`` ``[39:8] n_elems`` ``[63:40]`` zero.

    Raises ValueError if a field does not fit its bits.
    """
    return (_check_field("n_uops", n_uops, N_UOPS_BITS)
            | _check_field("n_elems", n_elems, N_ELEMS_BITS) << 8)


def decode_header(word: int) -> tuple[int, int]:
    """(n_uops, n_elems) of a header word."""
    return word & 0xFF, (word >> 8) & 0xFFFF_FFFF


def encode_uop(u: UOp) -> int:
    """64-bit word of a micro-op::

        [3:0]   op      (Op)
        [6:4]   rsrc    (RSrc)
        [7]     store
        [11:8]  d
        [15:12] p
        [19:16] q
        [23:20] r
        [47:24] addr    (word address, 24 bits)
        [63:48] param   (16 bits)

    Raises ValueError if a field does not fit its bits.
    """
    return (_check_field("op", int(u.op), 4)
            | _check_field("rsrc", int(u.rsrc), 3) << 4
            | int(bool(u.store)) << 7
            | _check_field("d", u.d, REG_BITS) << 8
            | _check_field("p", u.p, REG_BITS) << 12
            | _check_field("q", u.q, REG_BITS) << 16
            | _check_field("r", u.r, REG_BITS) << 20
            | _check_field("addr", u.addr, ADDR_BITS) << 24
            | _check_field("param", u.param, PARAM_BITS) << 48)


def decode_uop(word: int) -> tuple[int, int, bool, int, int, int, int, int, int]:
    """Raw fields ``(op, rsrc, store, d, p, q, r, addr, param)`` of a micro-op word.

    Returns integers (not enums) so undefined codes can be seen and rejected.
    """
    return (word & 0xF, (word >> 4) & 0x7, bool((word >> 7) & 1),
            (word >> 8) & 0xF, (word >> 12) & 0xF, (word >> 16) & 0xF, (word >> 20) & 0xF,
            (word >> 24) & 0xFF_FFFF, (word >> 48) & 0xFFFF)


def validate(n_uops: int, n_elems: int, uop_words: list[int], cfg: NMEConfig) -> Status:
    """Golden model of the NME's program check, done before the first memory access.

    The rules::

        n_uops 0 or > imem_depth                   -> BAD_LENGTH
        n_elems 0 or > max_elems                   -> BAD_LENGTH
        opcode or rsrc code not defined            -> BAD_OPCODE
        a buffer index >= nbuf used by the op      -> BAD_OPERAND
          (d is used unless store or L1; p by ADD/SUB/MUL/MAC/L1; q by MAC; r when rsrc == BUF)
        store with rsrc != BUF, store with L1, CHAN with param 0 -> BAD_OPERAND
        a buffer the op reads (p by ADD/SUB/MUL/MAC/L1, q by MAC, r when rsrc == BUF)
          that no *earlier* micro-op of the program wrote (d of a micro-op that is
          neither a store nor L1)                  -> BAD_OPERAND
        memory micro-ops (rsrc != BUF, or store) > max_streams -> TOO_MANY_STREAMS
        any word the op would touch >= mem_words   -> BAD_ADDR
          (extent in words: MEM/store W; CHAN param; INT8 ceil(W/2);
           GROUP (W-1) // (param*lanes) + 1, scalar 1)

    The buffer rule means no program can observe what a previous program left in the buffers
    (the NME keeps them, a fresh model would start from zeros; the op's own ``d`` does not
    count). Precedence: lengths, then per micro-op in program order opcode, operand (buffer
    index range, store/CHAN rules, reads of buffers not written earlier), address; the stream
    count is checked after all micro-ops.

    Args:
        n_uops, n_elems: header fields.
        uop_words: the raw 64-bit micro-op words (len == n_uops).
        cfg: the NME's elaboration parameters.
    Returns:
        The :class:`Status` the NME must report (``OK`` if the program may run).
    """
    if not 1 <= n_uops <= cfg.imem_depth or not 1 <= n_elems <= cfg.max_elems:
        return Status.BAD_LENGTH
    n_words = -(-n_elems // cfg.lanes)
    streams = 0
    written: set[int] = set()    # buffers some earlier micro-op wrote (the NME's nbuf-bit mask)
    for word in uop_words:
        op, rsrc, store, d, p, q, r, addr, param = decode_uop(word)
        if op not in Op._value2member_map_ or rsrc not in RSrc._value2member_map_:
            return Status.BAD_OPCODE
        writes = not store and op != Op.L1
        reads = []
        if op in (Op.ADD, Op.SUB, Op.MUL, Op.MAC, Op.L1):
            reads.append(p)
        if op == Op.MAC:
            reads.append(q)
        if rsrc == RSrc.BUF:
            reads.append(r)
        if any(b >= cfg.nbuf for b in reads + ([d] if writes else [])):
            return Status.BAD_OPERAND
        if store and (rsrc != RSrc.BUF or op == Op.L1):
            return Status.BAD_OPERAND
        if rsrc == RSrc.CHAN and param == 0:
            return Status.BAD_OPERAND
        if any(b not in written for b in reads):
            return Status.BAD_OPERAND
        if store or rsrc == RSrc.MEM:
            extent = n_words
        elif rsrc == RSrc.CHAN:
            extent = param
        elif rsrc == RSrc.INT8:
            extent = -(-n_words // 2)
        elif rsrc == RSrc.GROUP:
            extent = 1 if param == 0 else (n_words - 1) // (param * cfg.lanes) + 1
        else:
            extent = 0
        if extent and addr + extent > cfg.mem_words:
            return Status.BAD_ADDR
        streams += bool(extent)
        if writes:
            written.add(d)
    if streams > cfg.max_streams:
        return Status.TOO_MANY_STREAMS
    return Status.OK
