"""The persistent simulator: a cocotb test that serves jobs to :class:`RTLBackend` over TCP.

Started once per NME configuration by :mod:`coda.cosim.nme.rtl_backend`. It connects back to the
backend on ``127.0.0.1:$CODA_COSIM_PORT``, says hello with ``$CODA_COSIM_TOKEN`` and then serves
one JSON line per request, one JSON line per answer (:func:`serve`, which lists the requests;
the loop is :func:`serve_requests`). The memory is the file both map
(:mod:`coda.cosim.shared_mem`): the backend writes and reads the words itself, nothing travels
in the requests but the command words; between requests the simulator is blocked on the
socket (no simulated time passes), during a request it runs the program in HDL with no Python
per clock. Errors inside a request answer ``{"ok": false, "error": ...}`` and keep serving.
"""

from __future__ import annotations

import json
import os
import socket
import time

import cocotb
from cocotb.utils import get_sim_time

from coda.cosim.nme.tb import NMEHarness

__all__ = ["serve"]

#: seconds the server waits for the next request before giving up (backend gone silent)
IDLE_TIMEOUT_S = float(os.environ.get("CODA_COSIM_IDLE_S", "3600"))


def _connect() -> socket.socket:
    port = int(os.environ["CODA_COSIM_PORT"])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.settimeout(IDLE_TIMEOUT_S)
    return sock


async def _handle(h: NMEHarness, req: dict) -> dict:
    op = req.get("op")
    if op == "run":
        h.memory.configure(latency=int(req.get("latency", 1)),
                           req_stall=float(req.get("req_stall", 0.0)),
                           rsp_stall=float(req.get("rsp_stall", 0.0)),
                           seed=int(req.get("seed", 1)))
        words = [int(w, 16) for w in req["words"]]
        t0 = get_sim_time("ns")
        w0 = time.perf_counter()
        res = await h.driver.run(words, int(req.get("max_cycles", 50_000_000)))
        wall = time.perf_counter() - w0
        return {"ok": True, "status": int(res.status), "l1_bits": res.l1_bits,
                "cycles": res.cycles, "toggles": res.toggles, "ndirty": int(res.dirty_addrs.size),
                "timeout": res.timeout, "aborted": res.aborted, "faults": res.protocol_faults(),
                "nreads": res.nreads, "nwrites": res.nwrites,
                "sim_ns": get_sim_time("ns") - t0, "sim_wall_s": wall}
    if op == "reset":
        await h.driver.reset(int(req.get("cycles", 3)))
        return {"ok": True}
    raise ValueError(f"unknown request op {op!r}: expected run, reset or quit")


async def serve_requests(handle, log=None) -> None:
    """The job loop of a persistent simulator: connect to the backend (``CODA_COSIM_PORT``),
    say hello with ``CODA_COSIM_TOKEN``, then answer one JSON request per line with
    ``await handle(request)`` until ``{"op": "quit"}``, the connection closes, or no request
    comes for ``CODA_COSIM_IDLE_S`` seconds. A handler's ValueError / KeyError / RuntimeError /
    OSError becomes ``{"ok": false, "error": ...}`` and the loop goes on. Shared by the NME
    server below and the DIMM-NMP one (:mod:`coda.cosim.nmp.server`)."""
    sock = _connect()
    reader = sock.makefile("r", encoding="utf-8")
    writer = sock.makefile("w", encoding="utf-8")
    writer.write(json.dumps({"hello": os.environ.get("CODA_COSIM_TOKEN", "")}) + "\n")
    writer.flush()
    try:
        while True:
            try:
                line = reader.readline()
            except (TimeoutError, socket.timeout):
                if log is not None:
                    log.warning("no request for %.0f s: server stops", IDLE_TIMEOUT_S)
                return
            if not line:
                return
            req = json.loads(line)
            if req.get("op") == "quit":
                writer.write(json.dumps({"ok": True}) + "\n")
                writer.flush()
                return
            try:
                answer = await handle(req)
            except (ValueError, KeyError, RuntimeError, OSError) as exc:
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            writer.write(json.dumps(answer) + "\n")
            writer.flush()
    finally:
        for f in (reader, writer, sock):
            try:
                f.close()
            except OSError:
                pass


@cocotb.test()
async def serve(dut):
    """Serve backend requests until ``quit`` or the backend closes the connection.

    Requests (``op`` field):

    - ``run``: ``{"op": "run", "words": [hex, ...], "latency": c, "req_stall": p,
      "rsp_stall": p, "seed": s, "max_cycles": m}``: run the command words (header then micro-ops,
      hex strings) on the memory as it is, answer ``status``, ``l1_bits``, ``cycles``,
      ``toggles``, ``ndirty`` (the words written, listed in the memory file), ``timeout``,
      ``aborted``, ``faults``, ``nreads``, ``nwrites``, ``sim_ns`` and ``sim_wall_s`` (wall seconds
      of the run in the simulator, Python of the request excluded).
    - ``reset``: pulse the reset.
    - ``quit``: end the simulation.
    """
    h = NMEHarness(dut)
    await h.start()
    await serve_requests(lambda req: _handle(h, req), dut._log)
