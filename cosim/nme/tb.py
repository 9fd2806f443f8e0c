"""cocotb models of the NME's surroundings in ``nme_top.sv`` (used inside the simulator).

Like cocotbext-axi, models live apart from tests: :class:`MemoryModel` (bulk load / dump of the
rank-local memory, latency and random stalls), :class:`CommandDriver` (program words in, status /
L1 / cycles / written words out) and :class:`NMEHarness` (both, plus ``execute`` of one program
on a memory image). Every method costs a handful of Python awaits per *job*, none per clock: the
top's job port runs file loads, the command stream, the program and the dumps in HDL.

Files: the top's memory is the file of its plusarg ``+MEM_SHM``
(:class:`coda.cosim.shared_mem.SharedMemory`, created by whoever started the simulator), which
:class:`MemoryModel` maps too: loads and dumps are numpy copies, and a program's written
words come from the file's list of them; command words go through ``+CMD_IN``. The memory
geometry comes from the environment (``CODA_COSIM_LANES``, ``CODA_COSIM_MEM_WORDS``), set by
whoever started the simulator (:mod:`coda.cosim.nme.build`), and must match the file's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import Timer

from coda.cosim import memfile
from coda.cosim.shared_mem import SharedMemory
from coda.hw.nme.isa import Status

__all__ = ["RunResult", "JobPort", "MemoryModel", "CommandDriver", "NMEHarness",
           "OP_LOAD", "OP_CLEAR", "OP_RUN", "OP_DUMP", "CLOCK_NS"]

OP_LOAD, OP_CLEAR, OP_RUN, OP_DUMP = 1, 2, 3, 4
CLOCK_NS = 10           # period of the top's HDL clock (nme_top.sv: #5 per half period)
DEFAULT_MAX_CYCLES = 50_000_000


@dataclass
class RunResult:
    """What one program did, as the top observed it.

    Attributes:
        status: the NME's status after ``done``.
        l1_bits: the NME's ``l1`` output (fp32 bit pattern).
        cycles: clock cycles from the header being presented to ``done`` (inclusive).
        toggles: change of ``dbg_fu_toggles`` over the program (0 if the NME has none).
        dirty_addrs / dirty_words: words written during the program (int64 ``[n]``,
            uint16 ``[n, lanes]``), final contents.
        timeout, aborted: the watchdog fired / a reset ended the program.
        cmd_left: command words the NME had not taken when ``done`` pulsed.
        rsp_left: read responses still owed to the NME at ``done``.
        oob, overflow, stray_done: protocol faults (requests past the memory, reads beyond the
            memory model's response queue, ``done`` pulses outside a program).
        nreads, nwrites: memory requests of the program.
    """
    status: Status
    l1_bits: int
    cycles: int
    toggles: int
    dirty_addrs: np.ndarray
    dirty_words: np.ndarray
    timeout: bool
    aborted: bool
    cmd_left: int
    rsp_left: int
    oob: int
    overflow: int
    stray_done: int
    nreads: int
    nwrites: int

    def protocol_faults(self) -> list[str]:
        """Names and counts of protocol faults (empty when the program ran cleanly)."""
        faults = [f"{name}={getattr(self, name)}"
                  for name in ("cmd_left", "rsp_left", "oob", "overflow", "stray_done")
                  if getattr(self, name)]
        if self.timeout:
            faults.append("timeout")
        return faults


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"environment variable {name} not set: start the simulator through "
                           "coda.cosim.nme.build (it describes the memory geometry)")
    return int(value)


class JobPort:
    """The top's request/acknowledge port: one job at a time, no Python per clock."""

    def __init__(self, dut):
        self.dut = dut
        self.seq = int(dut.tb_ack.value)

    def post(self, op: int) -> int:
        """Start job ``op`` (takes effect at the next clock edge); returns its sequence number."""
        self.seq = (self.seq + 1) & 0xFFFF_FFFF
        self.dut.tb_op.value = op
        self.dut.tb_req.value = self.seq
        return self.seq

    async def wait(self, seq: int) -> None:
        """Wait until job ``seq`` is acknowledged (the top's watchdog bounds a RUN)."""
        while int(self.dut.tb_ack.value) != seq:
            await self.dut.tb_ack.value_change

    async def call(self, op: int) -> None:
        await self.wait(self.post(op))


class MemoryModel:
    """The rank-local memory of the top: bulk load / dump, latency and stalls.

    Args:
        dut: the ``nme_tb_top`` handle.
        port: the shared :class:`JobPort`.
    """

    def __init__(self, dut, port: JobPort):
        self.dut = dut
        self.port = port
        self.lanes = _env_int("CODA_COSIM_LANES")
        self.mem_words = _env_int("CODA_COSIM_MEM_WORDS")
        self.shared = SharedMemory.attach(str(cocotb.plusargs.get("MEM_SHM", "mem.shm")))
        if (self.shared.words, self.shared.lanes) != (self.mem_words, self.lanes):
            raise RuntimeError(f"{self.shared.path}: {self.shared.words} words of "
                               f"{self.shared.lanes} lanes, the environment says "
                               f"{self.mem_words} of {self.lanes}")
        self.config = (1, 0.0, 0.0)   # (latency, req_stall, rsp_stall) set by configure()

    def configure(self, *, latency: int = 1, req_stall: float = 0.0, rsp_stall: float = 0.0,
                  seed: int = 1) -> None:
        """Set the read latency (cycles, 1..255), the probabilities (0..1) that a cycle refuses
        a request / withholds a due response, and the stall generator's seed (used from the
        next program on).

        Raises ValueError on a value out of range.
        """
        if not 1 <= latency <= 255:
            raise ValueError(f"latency={latency}: expected 1..255 cycles")
        for name, p in (("req_stall", req_stall), ("rsp_stall", rsp_stall)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name}={p}: expected a probability in [0, 1)")
        if not 0 <= seed < (1 << 32):
            raise ValueError(f"seed={seed}: expected 0..2**32-1")
        self.config = (latency, req_stall, rsp_stall)   # what functional coverage samples
        self.dut.tb_latency.value = latency
        self.dut.tb_req_stall.value = min(int(round(req_stall * 65536)), 65535)
        self.dut.tb_rsp_stall.value = min(int(round(rsp_stall * 65536)), 65535)
        self.dut.tb_seed.value = seed

    async def load(self, mem: np.ndarray) -> None:
        """Replace the whole memory with ``mem`` (uint16 ``[mem_words, lanes]``)."""
        mem = memfile.check_image(mem, self.mem_words, self.lanes)
        self.shared.mem[:] = mem
        await self.port.call(OP_LOAD)

    async def load_words(self, mem: np.ndarray, addrs: np.ndarray) -> None:
        """Write only the words ``mem[addrs]`` (sparse load); nothing happens for no addresses."""
        addrs = np.asarray(addrs, dtype=np.int64)
        if addrs.size == 0:
            return
        self.shared.mem[addrs] = mem[addrs]
        await self.port.call(OP_LOAD)

    async def clear(self) -> None:
        """Zero the whole memory."""
        await self.port.call(OP_CLEAR)

    async def dump(self) -> np.ndarray:
        """The whole memory: uint16 ``[mem_words, lanes]``."""
        await self.port.call(OP_DUMP)
        return self.shared.mem.copy()


class CommandDriver:
    """Feeds programs to the NME through the top's command buffer and collects the results."""

    def __init__(self, dut, port: JobPort, memory: MemoryModel):
        self.dut = dut
        self.port = port
        self.memory = memory
        self.cmd_in = Path(str(cocotb.plusargs.get("CMD_IN", "cmd_in.hex")))
        self._pending: int | None = None

    def start(self, words: list[int], max_cycles: int = DEFAULT_MAX_CYCLES) -> None:
        """Begin streaming command ``words`` (header then micro-ops); returns at once.

        Raises ValueError for an empty or oversize word list or a bad cycle limit.
        """
        from coda.cosim.nme.build import CMD_DEPTH
        if not 1 <= len(words) <= CMD_DEPTH:
            raise ValueError(f"{len(words)} command words: expected 1..{CMD_DEPTH}")
        if not 1 <= max_cycles < (1 << 32):
            raise ValueError(f"max_cycles={max_cycles}: expected 1..2**32-1")
        memfile.write_commands(self.cmd_in, words)
        self.dut.tb_ncmd.value = len(words)
        self.dut.tb_max_cycles.value = max_cycles
        self._pending = self.port.post(OP_RUN)

    async def wait(self) -> RunResult:
        """Wait for the program started by :meth:`start` to end; its :class:`RunResult`."""
        if self._pending is None:
            raise RuntimeError("no program started: call start() first")
        seq, self._pending = self._pending, None
        await self.port.wait(seq)
        return self._collect()

    async def run(self, words: list[int], max_cycles: int = DEFAULT_MAX_CYCLES) -> RunResult:
        """Run one program to ``done`` (or watchdog / reset) and return its :class:`RunResult`."""
        self.start(words, max_cycles)
        return await self.wait()

    async def reset(self, cycles: int = 3) -> None:
        """Hold the NME (and the memory pipeline) in reset for ``cycles`` clock cycles."""
        self.dut.tb_rst.value = 1
        await Timer(cycles * CLOCK_NS, unit="ns")
        self.dut.tb_rst.value = 0
        await Timer(CLOCK_NS, unit="ns")

    def _collect(self) -> RunResult:
        d = self.dut
        ndirty = int(d.tb_ndirty.value)
        aborted = bool(int(d.tb_aborted.value))
        if ndirty and not aborted:
            addrs = self.memory.shared.dirty_addrs()
            words = self.memory.shared.mem[addrs]
            if len(addrs) != ndirty:
                raise RuntimeError(f"{len(addrs)} words listed as written, the top counted "
                                   f"{ndirty}")
        else:
            addrs = np.zeros(0, dtype=np.int64)
            words = np.zeros((0, self.memory.lanes), dtype=np.uint16)
        raw_status = int(d.tb_status.value)
        return RunResult(
            status=Status(raw_status) if raw_status in Status._value2member_map_ else raw_status,
            l1_bits=int(d.tb_l1.value), cycles=int(d.tb_cycles.value),
            toggles=int(d.tb_toggles.value), dirty_addrs=addrs, dirty_words=words,
            timeout=bool(int(d.tb_timeout.value)), aborted=aborted,
            cmd_left=int(d.tb_cmd_left.value), rsp_left=int(d.tb_rsp_left.value),
            oob=int(d.tb_oob.value), overflow=int(d.tb_overflow.value),
            stray_done=int(d.tb_stray_done.value), nreads=int(d.tb_nreads.value),
            nwrites=int(d.tb_nwrites.value))


@dataclass
class _Shadow:
    """What the harness knows the simulator's memory holds (to load only changed words)."""
    image: np.ndarray | None = None
    valid: bool = field(default=False)


class NMEHarness:
    """Memory model + command driver of one ``nme_tb_top``, and ``execute`` of a program.

    ``execute`` loads only the words that differ from what the simulator already holds (the
    previous result), runs the program and applies the words the NME wrote, so a long stream of
    programs on one big memory costs little file traffic.
    """

    def __init__(self, dut):
        self.dut = dut
        self.port = JobPort(dut)
        self.memory = MemoryModel(dut, self.port)
        self.driver = CommandDriver(dut, self.port, self.memory)
        self.lanes = self.memory.lanes
        self.mem_words = self.memory.mem_words
        self._shadow = _Shadow()

    async def start(self) -> None:
        """Wait out the top's power-on reset."""
        await Timer(8 * CLOCK_NS, unit="ns")

    def forget(self) -> None:
        """Drop the shadow image (after anything that changed the memory behind its back)."""
        self._shadow = _Shadow()

    async def sync_memory(self, mem: np.ndarray) -> None:
        """Make the simulator's memory equal ``mem`` with as little file traffic as possible."""
        mem = memfile.check_image(mem, self.mem_words, self.lanes)
        if not self._shadow.valid:
            await self.memory.load(mem)
        else:
            changed = memfile.changed_words(mem, self._shadow.image)
            if changed.size > self.mem_words // 2:
                await self.memory.load(mem)
            else:
                await self.memory.load_words(mem, changed)
        self._shadow = _Shadow(mem.copy(), True)

    async def execute(self, words: list[int], mem: np.ndarray,
                      max_cycles: int = DEFAULT_MAX_CYCLES) -> tuple[RunResult, np.ndarray]:
        """Run command ``words`` on memory image ``mem``.

        Returns:
            (the :class:`RunResult`, the memory image after the program, uint16
            ``[mem_words, lanes]``).
        """
        await self.sync_memory(mem)
        result = await self.driver.run(words, max_cycles)
        out = self._shadow.image
        if result.aborted or result.timeout:
            self.forget()
            return result, out.copy()
        if result.dirty_addrs.size:
            out[result.dirty_addrs] = result.dirty_words
        return result, out.copy()
