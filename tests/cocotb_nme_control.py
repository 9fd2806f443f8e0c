"""cocotb tests of the NME's control (gathered by tests/cocotb_nme.py, run inside the
simulator): masked tails at every length around the lanes and block boundaries, bad commands
(each error status, nothing written), the rules of the program check at their edges, reset
in mid-program, the operand-isolation toggle count, and the simulation speed.
"""

from __future__ import annotations

import itertools

import cocotb
import numpy as np
from cocotb.triggers import Timer

from coda.cosim.nme.tb import CLOCK_NS
from coda.host.nme import bits as hb
from coda.hw.nme.isa import Op, RSrc, Status, UOp, encode_header, encode_uop, validate
from cocotb_nme_bench import (CFG, COV, Checker, L, cycle_limit, decode_n, finite_bits, nme_test,
                              place, prog_words, random_image, record, uop_case)


# ----------------------------------------------------------------------------- tails
@cocotb.test()
@nme_test
async def test_tails(dut):
    """Every length 1 .. 2*lanes+1 and around block boundaries: masked lanes stay untouched."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(505)
    lengths = list(range(1, 2 * L + 2))
    for blocks in (1, 2):
        edge = blocks * CFG.depth * L
        lengths += [edge - L - 1, edge - 1, edge, edge + 1, edge + L + 1]
    lengths = sorted({n for n in lengths if n >= 1})
    for n in lengths:
        op = (Op.MOV, Op.ADD, Op.MAC)[n % 3]
        await uop_case(ck, rng, op, RSrc.MEM, n, store_direct=False, finite=False)
    await uop_case(ck, rng, Op.L1, RSrc.MEM, 2 * L + 1, store_direct=False, finite=True)
    dut._log.info("tails: lengths %s, 0 mismatches", lengths)


# ----------------------------------------------------------------------------- bad commands
def bad_programs() -> list[tuple[str, list[int]]]:
    """(name, command words) of programs the NME must reject, one per error rule."""
    ok_uop = UOp(Op.MOV, RSrc.MEM, d=0, addr=0)
    st = UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=64)
    enc = encode_uop
    raw = lambda op=0, rsrc=0, store=0, d=0, p=0, q=0, r=0, addr=0, param=0: (  # noqa: E731
        op | rsrc << 4 | store << 7 | d << 8 | p << 12 | q << 16 | r << 20 | addr << 24
        | param << 48)
    nb = CFG.nbuf
    cases = [
        ("n_uops=0", [encode_header(0, 8)]),
        ("n_uops>imem_depth", [encode_header(CFG.imem_depth + 1, 8)]
         + [enc(ok_uop)] * (CFG.imem_depth + 1)),
        ("n_elems=0", [encode_header(2, 0), enc(ok_uop), enc(st)]),
        ("n_elems>max_elems", [encode_header(2, CFG.max_elems + 1), enc(ok_uop), enc(st)]),
        ("opcode 7", [encode_header(2, 8), enc(ok_uop), raw(op=7)]),
        ("opcode 15", [encode_header(1, 8), raw(op=15, rsrc=1)]),
        ("rsrc 5", [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=5, d=1, p=0)]),
        ("rsrc 7", [encode_header(1, 8), raw(op=0, rsrc=7)]),
        ("store with MEM", [encode_header(2, 8), enc(ok_uop), raw(op=0, rsrc=1, store=1)]),
        ("store with L1", [encode_header(2, 8), enc(ok_uop), raw(op=5, rsrc=0, store=1)]),
        ("CHAN param 0", [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=2, d=1)]),
        ("MEM past end", [encode_header(2, 8 * L), enc(ok_uop),
                          raw(op=0, rsrc=1, d=1, addr=CFG.mem_words - 7)]),
        ("store past end", [encode_header(2, 8 * L), enc(ok_uop),
                            raw(op=0, store=1, addr=CFG.mem_words - 1)]),
        ("CHAN past end", [encode_header(2, 8), enc(ok_uop),
                           raw(op=1, rsrc=2, d=1, addr=CFG.mem_words - 2, param=3)]),
        ("INT8 past end", [encode_header(2, 4 * L), enc(ok_uop),
                           raw(op=0, rsrc=4, d=1, addr=CFG.mem_words - 1)]),
        ("GROUP past end", [encode_header(2, 4 * L), enc(ok_uop),
                            raw(op=0, rsrc=3, d=1, addr=min(CFG.mem_words, (1 << 24) - 1),
                                param=1)]),
        ("addr 2**24-1", [encode_header(1, 8), raw(op=0, rsrc=1, addr=(1 << 24) - 1)]),
    ]
    if nb < 16:   # with 16 buffers no 4-bit index is out of range
        cases += [
            ("d>=nbuf", [encode_header(1, 8), raw(op=0, rsrc=1, d=nb)]),
            ("p>=nbuf", [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=1, d=0, p=nb)]),
            ("q>=nbuf (MAC)", [encode_header(2, 8), enc(ok_uop), raw(op=4, rsrc=1, q=nb)]),
            ("r>=nbuf (BUF)", [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=0, r=nb)]),
        ]
    if CFG.max_streams + 1 <= CFG.imem_depth:
        n = CFG.max_streams + 1
        cases.append(("too many streams", [encode_header(n, 8)] + [enc(ok_uop)] * n))
    cases.append(("read of an unwritten buffer",
                  [encode_header(2, 8), enc(ok_uop), raw(op=1, rsrc=1, d=1, p=1)]))
    # a bad operand after a bad opcode: the earlier rule in program order wins
    cases.append(("opcode then operand", [encode_header(2, 8), raw(op=9), raw(op=0, d=nb)]))
    return cases


@cocotb.test()
@nme_test
async def test_bad_commands(dut):
    """Each error status: the code isa.validate gives, memory untouched (full dump), nothing
    written, and the next good program runs correctly."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(606)
    seen = set()
    for name, words in bad_programs():
        mem = random_image(rng)
        await ck.h.memory.load(mem)
        ck.h.forget()
        res = await ck.h.driver.run(words, cycle_limit(words))
        n_uops, n_elems = words[0] & 0xFF, (words[0] >> 8) & 0xFFFF_FFFF
        if COV is not None:
            COV.program(n_elems, res.status, ck.h.memory.config)
        expected = validate(n_uops, n_elems, words[1:], CFG)
        assert expected != Status.OK, f"{name}: test bug, validate() accepts it"
        assert res.status == expected, f"{name}: status {res.status!r}, expected {expected!r}"
        assert res.dirty_addrs.size == 0 and res.nwrites == 0, f"{name}: memory written"
        assert not res.protocol_faults(), f"{name}: protocol faults {res.protocol_faults()}"
        after = await ck.h.memory.dump()
        assert np.array_equal(after, mem), f"{name}: memory changed"
        seen.add(expected)
        # the NME is ready for the next program, which must work
        await uop_case(ck, rng, Op.ADD, RSrc.MEM, 3 * L + 1, store_direct=False, finite=False)
    errors = {s for s in Status if s != Status.OK}
    assert seen == errors, f"error classes covered {sorted(seen)}, expected {sorted(errors)}"
    dut._log.info("bad commands: %d programs, classes %s", len(bad_programs()),
                  sorted(s.name for s in seen))


def checker_programs() -> list[tuple[str, list[int]]]:
    """(name, words) of programs at the edges of every rule of the program check: addresses
    one word inside and outside the memory for each R source and the store (short and long
    programs, GROUP scale shapes whose extent needs the checker's multiplier, and scaled
    GROUPs whose last scale is exactly the last word of memory or one past it), every address
    bit alone, reads of each unwritten buffer from each operand slot, every out-of-range
    buffer index, out-of-range indices in the fields a micro-op does not use (which it must
    ignore), every opcode x R-source code, and the length limits. Their statuses come
    from isa.validate (the golden model), not from this list."""
    enc = encode_uop
    raw = lambda op=0, rsrc=0, store=0, d=0, p=0, q=0, r=0, addr=0, param=0: (  # noqa: E731
        op | rsrc << 4 | store << 7 | d << 8 | p << 12 | q << 16 | r << 20 | addr << 24
        | param << 48)
    mw, nb = CFG.mem_words, CFG.nbuf
    first = enc(UOp(Op.MOV, RSrc.MEM, d=0, addr=0))
    out = []
    for n in (3 * L + 1, 40 * L, CFG.max_elems):
        w = -(-n // L)
        ext = {"MEM": w, "INT8": -(-w // 2), "CHAN": 3, "GROUP": 1}
        for g in (1, 3, 1 << 10, (1 << 16) - 1):
            ext[f"GROUP/{g}"] = (w - 1) // (g * L) + 1
        for name, e in ext.items():
            rsrc = RSrc[name.split("/")[0]]
            param = 3 if name == "CHAN" else int(name.split("/")[1]) if "/" in name else 0
            for addr in sorted({mw - e, mw - e + 1, *(1 << k for k in range(8, 24)),
                                *((1 << k) - 1 for k in range(8, 25))}):
                if 0 <= addr < 1 << 24:
                    out.append((f"{name} n={n} addr={addr}",
                                [encode_header(2, n), first,
                                 raw(op=0, rsrc=rsrc, d=1, addr=addr, param=param)]))
        for addr in (mw - w, mw - w + 1, *(1 << k for k in range(12, 24))):
            if 0 <= addr < 1 << 24:
                out.append((f"store n={n} addr={addr}",
                            [encode_header(2, n), first, raw(op=0, store=1, r=0, addr=addr)]))
    for b in range(16):      # reads of unwritten / out-of-range buffers from every slot
        out.append((f"p={b}", [encode_header(2, 8), first, raw(op=1, rsrc=1, d=0, p=b)]))
        out.append((f"q={b}", [encode_header(2, 8), first, raw(op=4, rsrc=1, d=0, q=b)]))
        out.append((f"r={b}", [encode_header(2, 8), first, raw(op=0, rsrc=0, d=1, r=b)]))
        out.append((f"d={b}", [encode_header(2, 8), first, raw(op=0, rsrc=1, d=b)]))
        out.append((f"L1 p={b}", [encode_header(2, 8), first, raw(op=5, rsrc=1, p=b)]))
    for g, s in itertools.product((1, 3), (4, 8, 12, 13)):   # a scaled GROUP needing
        w = s * g * L + 1    # s + 1 scales (W - 1 = s g L): s + 1 or s left in memory
        for addr in (mw - s - 1, mw - s):
            out.append((f"GROUP/{g} W={w} addr={addr}", [encode_header(2, w * L), first, raw(
                op=0, rsrc=RSrc.GROUP, d=1, addr=addr, param=g)]))
    hdr = encode_header(2, 8)
    for b in (nb, 15):       # fields a micro-op does not use may hold anything
        for rsrc in (RSrc.MEM, RSrc.CHAN, RSrc.GROUP, RSrc.INT8):
            out.append((f"ADD {rsrc.name} r={b}", [hdr, first, raw(
                op=1, rsrc=rsrc, d=1, p=0, r=b, addr=64, param=1)]))
        out.append((f"MOV p={b} q={b}", [hdr, first, raw(op=0, rsrc=0, d=1, p=b, q=b)]))
        out.append((f"ADD q={b}", [hdr, first, raw(op=1, rsrc=0, d=1, p=0, q=b)]))
        out.append((f"store d={b} p={b}", [hdr, first, raw(op=0, store=1, d=b, p=b, addr=64)]))
        out.append((f"L1 d={b} q={b}", [hdr, first, raw(op=5, rsrc=0, d=b, q=b)]))
    for op in range(16):
        for rsrc in range(8):
            out.append((f"op={op} rsrc={rsrc}",
                        [encode_header(2, 8), first, raw(op=op, rsrc=rsrc, d=1, p=0, q=0, r=0,
                                                         addr=64, param=1)]))
    for n in (0, 1, CFG.max_elems, CFG.max_elems + 1, (1 << 32) - 1):
        out.append((f"n_elems={n}", [encode_header(1, n), first]))
    return out


@cocotb.test()
@nme_test
async def test_checker_rules(dut):
    """Every program of checker_programs ends with the status isa.validate gives; rejected
    ones write nothing and are rejected within a few cycles; the accepted short ones and the
    scaled-GROUP extent boundaries run and match the interpreter."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(909)
    mem = random_image(rng)
    await ck.h.memory.load(mem)
    ck.h.forget()
    counts: dict[str, int] = {}
    for name, words in checker_programs():
        n_uops, n_elems = words[0] & 0xFF, decode_n(words[0])
        expected = validate(n_uops, n_elems, words[1:], CFG)
        counts[expected.name] = counts.get(expected.name, 0) + 1
        if expected == Status.OK:
            # the short accepted ones run (the long ones are the other tests'), and the
            # GROUP extent boundaries (a multiplier that is wrong rejects them)
            if n_elems <= 4 * L or " W=" in name:
                await ck.run(words, random_image(rng), f"checker {name}")
            continue
        res = await ck.h.driver.run(words, 2_000)
        if COV is not None:
            COV.program(n_elems, res.status, ck.h.memory.config)
        assert res.status == expected, f"checker {name}: status {res.status!r}, expected " \
            f"{expected!r}"
        assert not res.timeout and res.nwrites == 0 and res.dirty_addrs.size == 0, \
            f"checker {name}: ran or wrote"
    dut._log.info("checker rules: %s", counts)


# ----------------------------------------------------------------------------- reset
@cocotb.test()
@nme_test
async def test_reset_mid_program(dut):
    """A reset in the middle of a long program: the NME goes idle at once, accepts the next
    program and computes it correctly (also with stalls and reads in flight)."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(707)
    n = (CFG.mem_words // 5) * L - 3
    for delay in (6, 17, 150, 1500):
        ck.h.memory.configure(latency=5, req_stall=0.3, rsp_stall=0.3, seed=delay)
        mem = random_image(rng)
        await ck.h.sync_memory(mem)
        words = prog_words(n, [UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                               UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=n // L + 1),
                               UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=3 * (n // L + 1))])
        ck.h.driver.start(words)
        await Timer(delay * CLOCK_NS, unit="ns")
        assert int(dut.tb_nme_busy.value) == 1, f"delay {delay}: NME not busy mid-program"
        await ck.h.driver.reset(3)
        if COV is not None:
            COV.reset(delay)
        res = await ck.h.driver.wait()
        assert res.aborted, "reset did not abort the job"
        assert not res.timeout
        assert int(dut.tb_nme_busy.value) == 0, "NME busy after reset"
        ck.h.forget()
        ck.h.memory.configure()
        await uop_case(ck, rng, Op.MAC, RSrc.MEM, 5 * L + 3, store_direct=False, finite=False)
        await uop_case(ck, rng, Op.L1, RSrc.MEM, 5 * L + 3, store_direct=False, finite=True)
    dut._log.info("reset mid-program: 3 resets, programs after each correct")


# ----------------------------------------------------------------------------- toggles
def isolation_program(rng) -> tuple[list[int], np.ndarray]:
    """Gated residual with a masked tail followed by a MOV/ADD mix (the representative
    program of the operand-isolation measurement)."""
    t, c = 5, 3 * L
    n = t * c - (L // 2 + 1)                  # masked tail
    wn = hb.words_for(n, L)
    mem = random_image(rng)
    X, G, C, Y, Z = 0, wn, wn + 3, 2 * wn + 3, 3 * wn + 3
    for addr, bits in ((X, finite_bits(rng, n)), (G, finite_bits(rng, c)),
                       (C, finite_bits(rng, n))):
        place(mem, addr, bits)
    uops = [UOp(Op.MOV, RSrc.MEM, d=0, addr=X), UOp(Op.MOV, RSrc.CHAN, d=1, addr=G, param=3),
            UOp(Op.MAC, RSrc.MEM, d=0, p=0, q=1, addr=C),
            UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=Y),
            UOp(Op.MOV, RSrc.MEM, d=2, addr=C), UOp(Op.ADD, RSrc.BUF, d=3, p=2, r=0),
            UOp(Op.MOV, RSrc.BUF, d=2, r=3), UOp(Op.ADD, RSrc.BUF, store=True, p=2, r=3, addr=Z)]
    return prog_words(n, uops), mem


@cocotb.test()
@nme_test
async def test_operand_isolation_toggles(dut):
    """Toggle count of the FU operand registers (dbg_fu_toggles) over the representative
    program (0 on an NME built without its simulation-only toggle counter, the default);
    the pytest side compares isolation-on and -off builds made with the counter."""
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(808)
    words, mem = isolation_program(rng)
    res, _ = await ck.run(words, mem, "isolation program")
    key = f"toggles_isolation_{'on' if CFG.operand_isolation else 'off'}"
    record(key, res.toggles)
    record("cycles_isolation_program", res.cycles)
    dut._log.info("%s = %d over %d cycles", key, res.toggles, res.cycles)


# ----------------------------------------------------------------------------- speed
@cocotb.test()
@nme_test
async def test_speed(dut):
    """Big MOV/ADD program: simulated NME cycles per second of wall time (recorded)."""
    import time as _time
    ck = Checker(dut)
    await ck.start()
    rng = np.random.default_rng(909)
    wn = CFG.mem_words // 3 - 1
    n = wn * L
    mem = random_image(rng)
    words = prog_words(n, [UOp(Op.MOV, RSrc.MEM, d=0, addr=0),
                           UOp(Op.ADD, RSrc.MEM, d=0, p=0, addr=wn),
                           UOp(Op.MOV, RSrc.BUF, store=True, r=0, addr=2 * wn)])
    await ck.h.sync_memory(mem)
    t0 = _time.perf_counter()
    res = await ck.h.driver.run(words, cycle_limit(words))
    dt = _time.perf_counter() - t0
    assert res.status == Status.OK and not res.protocol_faults()
    record("speed_cycles", res.cycles)
    record("speed_cycles_per_s", res.cycles / dt)
    dut._log.info("speed: %d cycles in %.3f s = %.0f cycles/s (%d elements)", res.cycles, dt,
                  res.cycles / dt, n)
