"""The DIMM-NMP job server, run by cocotb inside the simulator (``cosim/nmp/nmp_top.sv``).

It serves :class:`coda.cosim.nmp.session.NMPSession` requests: ``run`` (feed the command
words, run to the combined done and the drain of every rank's memory), by a handshake on the
top's ``tb_*`` job port; :func:`coda.cosim.nme.server.serve_requests` does the socket side. The
ranks' memories are files the host maps too (:mod:`coda.cosim.shared_mem`): the host writes
and reads them itself, nothing travels in the requests but the command count.
"""

from __future__ import annotations

import time

__all__ = ["OP_RUN"]   # and serve(), where cocotb is importable

#: the job-port operation of nmp_top.sv
OP_RUN = 3

try:
    import cocotb as _cocotb
except ImportError:  # the server runs only inside the simulator, which has cocotb
    _cocotb = None


async def _call(dut, op: int) -> None:
    seq = (int(dut.tb_ack.value) + 1) & 0xFFFF_FFFF
    dut.tb_op.value = op
    dut.tb_req.value = seq
    while int(dut.tb_ack.value) != seq:
        await dut.tb_ack.value_change


async def _handle(dut, req: dict) -> dict:
    from cocotb.utils import get_sim_time
    op = req.get("op")
    if op == "run":
        dut.tb_ncmd.value = int(req["ncmd"])
        dut.tb_max_cycles.value = int(req["max_cycles"])
        t0 = get_sim_time("ns")
        w0 = time.perf_counter()
        await _call(dut, OP_RUN)
        return {"ok": True, "cycles": int(dut.tb_cycles.value),
                "dram_cycles": int(dut.tb_dram_cycles.value),
                "sim_wall_s": time.perf_counter() - w0,
                "timeout": int(dut.tb_timeout.value), "error": int(dut.tb_error.value),
                "cmd_left": int(dut.tb_cmd_left.value), "sim_ns": get_sim_time("ns") - t0}
    raise ValueError(f"unknown request op {op!r}: expected run or quit")


if _cocotb is not None:
    @_cocotb.test()
    async def serve(dut):
        """Serve :class:`NMPRTLBackend` requests until ``quit`` or the connection closes."""
        # power-on reset of the top (4 cycles of each clock; a run also waits for the NME
        # clock's in the top): 8 DRAM clock cycles, as the 80 ns of the former 10 ns clock
        while int(dut.tb_clk_count.value) < 8:
            await dut.tb_clk_count.value_change
        from coda.cosim.nme.server import serve_requests
        await serve_requests(lambda req: _handle(dut, req), dut._log)
