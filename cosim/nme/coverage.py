"""Functional coverage of the NME, with cocotb-coverage: what the cocotb regression has exercised.

:class:`NMECoverage` is the coverage model of one NME build (format ``fmt``, ``lanes``):
coverpoints over micro-ops, R sources, the float classes of operands (:data:`FLOAT_CLASSES`)
and results, buffer roles, tails, operators, memory stalls, statuses and resets (its docstring
lists every coverpoint and its bins). The cocotb tests sample it (tests/cocotb_nme.py: its
checker samples every program it runs, through the interpreter's ``observe`` hook,
:func:`coda.host.nme.interp.run_words`).

:func:`export` writes ``{"config", "bins": {coverpoint: {bin: hits}}, "covered",
"total", "covered_fraction"}``; :func:`merge` joins the files of several runs (hits summed,
the defined bins of each configuration kept, none dropped) and :func:`summary` lists the
uncovered bins.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from coda.hw.nme.isa import NMEConfig, Op, RSrc, Status
from coda.jsonout import json_text
from coda.paths import write_file

__all__ = ["FLOAT_CLASSES", "RESULT_EVENTS", "float_class", "result_events", "NMECoverage",
           "merge", "summary", "OPERATORS"]

FLOAT_CLASSES = ("+0", "-0", "subnormal", "min_normal", "normal", "max_finite", "+inf",
                 "-inf", "qnan", "snan")
RESULT_EVENTS = ("overflow", "underflow_subnormal", "underflow_zero", "tie")
ARITH = (Op.ADD, Op.SUB, Op.MUL, Op.MAC)
#: events each arithmetic op can show (ADD / SUB of two values of a format are exact when the
#: result is subnormal, so they never round a nonzero result to zero)
EVENTS_OF = {Op.ADD: ("overflow", "underflow_subnormal", "tie"),
             Op.SUB: ("overflow", "underflow_subnormal", "tie"),
             Op.MUL: RESULT_EVENTS, Op.MAC: RESULT_EVENTS}
OPERATORS = ("add", "sub", "mul", "scale", "gated_residual", "cfg_combine", "l1_distance",
             "segment", "dequant_int8")
_FIELDS = {"bf16": (8, 7), "fp16": (5, 10)}


def float_class(bits: np.ndarray, fmt: str) -> np.ndarray:
    """Index into FLOAT_CLASSES of each 16-bit pattern (uint16 array) of ``fmt``."""
    e_bits, m_bits = _FIELDS[fmt]
    b = np.asarray(bits).view(np.uint16).astype(np.int64)
    sign = b >> 15
    exp = (b >> m_bits) & ((1 << e_bits) - 1)
    man = b & ((1 << m_bits) - 1)
    exp_max = (1 << e_bits) - 1
    cls = np.full(b.shape, FLOAT_CLASSES.index("normal"), dtype=np.int64)
    cls[(exp == 1) & (man == 0)] = FLOAT_CLASSES.index("min_normal")
    cls[(exp == exp_max - 1) & (man == (1 << m_bits) - 1)] = FLOAT_CLASSES.index("max_finite")
    cls[(exp == 0) & (man != 0)] = FLOAT_CLASSES.index("subnormal")
    cls[(exp == 0) & (man == 0)] = np.where(sign[(exp == 0) & (man == 0)] == 0, 0, 1)
    inf = (exp == exp_max) & (man == 0)
    cls[inf] = np.where(sign[inf] == 0, FLOAT_CLASSES.index("+inf"), FLOAT_CLASSES.index("-inf"))
    nan = (exp == exp_max) & (man != 0)
    quiet = (man >> (m_bits - 1)) & 1
    cls[nan] = np.where(quiet[nan] == 1, FLOAT_CLASSES.index("qnan"),
                        FLOAT_CLASSES.index("snan"))
    return cls


def _value(bits: np.ndarray, fmt: str) -> np.ndarray:
    """float64 values of 16-bit patterns (exact)."""
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if fmt == "bf16" else np.float16
    return np.asarray(bits).view(np.uint16).view(dt).astype(np.float64)


def _round(x: np.ndarray, fmt: str) -> np.ndarray:
    """float64 -> nearest value of ``fmt`` (ties to even), as float64."""
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if fmt == "bf16" else np.float16
    return x.astype(dt).astype(np.float64)


def _neighbour(res_bits: np.ndarray, exact: np.ndarray, fmt: str) -> np.ndarray:
    """float64 value of the representable neighbour of each result on the exact value's
    side (results finite)."""
    mag = res_bits.astype(np.int64) & 0x7FFF
    r = _value(res_bits, fmt)
    away = np.abs(exact) > np.abs(r)
    nb_mag = np.where(away, mag + 1, np.maximum(mag - 1, 0))
    sign = np.where(exact < 0, 0x8000, 0)
    return _value((nb_mag | sign).astype(np.uint16), fmt)


def result_events(op: Op, p: np.ndarray | None, q: np.ndarray | None, r: np.ndarray,
                  res: np.ndarray, fmt: str) -> dict[str, np.ndarray]:
    """Per element, whether each of RESULT_EVENTS happened (bool arrays), from the operand
    and result bit patterns (uint16) of an arithmetic micro-op."""
    pv, rv = _value(p, fmt), _value(r, fmt)
    operands = [p, r] + ([q] if q is not None else [])
    finite_in = np.all([np.isfinite(_value(x, fmt)) for x in operands], axis=0)
    normal_in = np.any([float_class(x, fmt) >= FLOAT_CLASSES.index("min_normal")
                        for x in operands], axis=0) & finite_in
    zero_exact = np.zeros(res.shape, bool)
    with np.errstate(all="ignore"):
        if op == Op.ADD:
            exact = pv + rv
        elif op == Op.SUB:
            exact = pv - rv
        elif op == Op.MUL:
            exact = pv * rv
            zero_exact = exact != 0
        else:   # MAC: the product is rounded, then the sum
            prod = _value(q, fmt) * rv
            zero_exact = (prod != 0) & (_round(prod, fmt) == 0)
            exact = pv + _round(prod, fmt)
    rcls = float_class(res, fmt)
    resv = _value(res, fmt)
    finite_out = np.isfinite(resv)
    ok = finite_in & finite_out & np.isfinite(exact)
    with np.errstate(all="ignore"):
        nb = _neighbour(res, np.where(ok, exact, 0.0), fmt)
        tie = ok & (exact != resv) & (exact == (resv + nb) / 2)
    if op == Op.MAC:
        underflow_zero = finite_in & zero_exact
    else:
        underflow_zero = finite_in & zero_exact & (resv == 0)
    return {"overflow": finite_in & np.isinf(resv),
            "underflow_subnormal": normal_in & (rcls == FLOAT_CLASSES.index("subnormal")),
            "underflow_zero": underflow_zero,
            "tie": tie}


def _depth_bin(cycles: int) -> str:
    return "<8" if cycles < 8 else "8..63" if cycles < 64 else "64..511" if cycles < 512 \
        else ">=512"


class NMECoverage:
    """The coverage model of one NME configuration (cocotb-coverage coverpoints in
    ``coverage_db`` under ``nme.<fmt>_l<lanes>.``) and its samplers.

    Its coverpoints and their bins:

    =================  ============================================================================
    coverpoint         bins
    =================  ============================================================================
    ``op``             micro-op MOV, ADD, SUB, MUL, MAC, L1
    ``op_rsrc``        micro-op x R source (BUF, MEM, CHAN, GROUP, INT8): 30
    ``operands``       ADD/SUB/MUL/MAC x float class of P x float class of R: 400 (the cross)
    ``mac_q``          float class of MAC's Q operand: 10
    ``buffer_role``    each buffer (0..nbuf-1) as P, Q (MAC), R (R source BUF) and destination
                       (not stored): 4 x nbuf
    ``result``         ADD/SUB/MUL/MAC x result class (no sNaN: the NME emits a canonical quiet
                       NaN) and events: ``overflow`` (finite operands, infinite result),
                       ``underflow_subnormal`` (a normal operand, a subnormal result),
                       ``underflow_zero`` (a nonzero exact result rounded to zero: MUL, MAC's
                       product), ``tie`` (the exact result halfway between two neighbours)
    ``l1_result``      L1's fp32 sum: zero, normal, inf, nan
    ``tail``           elements modulo lanes, 0 (full last word) .. lanes-1 (masked tail)
    ``operator``       the operators of coda.host.nme.ops run compiled
    ``segment_k``      segment terms K = 1..8
    ``dequant_group``  dequant_int8 scale shape: group = lanes or wider x one or several groups
                       per row
    ``stalls``         memory latency 1 or more x request stalls x response stalls
    ``status``         every status a program ends with (OK and each error class)
    ``reset_depth``    cycles into a program when a reset hits: <8, 8..63, 64..511, >=512
    =================  ============================================================================

    Float classes (:data:`FLOAT_CLASSES`): ``+0, -0, subnormal, min_normal`` (the smallest normal
    magnitude), ``normal, max_finite`` (the largest finite magnitude), ``+inf, -inf, qnan,
    snan``.
    """

    def __init__(self, cfg: NMEConfig):
        from cocotb_coverage.coverage import CoverCross, CoverPoint

        self.cfg = cfg
        self.prefix = f"nme.{cfg.fmt}_l{cfg.lanes}"
        pre = self.prefix
        ops = [o.name for o in Op if o in (Op.MOV, *ARITH, Op.L1)]
        rsrcs = [s.name for s in RSrc]
        arith = [o.name for o in ARITH]
        self.names = []

        def cp(name, bins, **kw):
            self.names.append(f"{pre}.{name}")
            return CoverPoint(f"{pre}.{name}", bins=list(bins), **kw)

        @cp("op", ops, xf=lambda op, rsrc: op)
        @cp("op_rsrc", [(o, s) for o in ops for s in rsrcs], xf=lambda op, rsrc: (op, rsrc))
        def _uop(op, rsrc):
            pass

        # the cross's axes (not reported on their own: the cross holds them)
        @CoverPoint(f"{pre}.axis_op", bins=arith, xf=lambda op, pc, rc: op)
        @CoverPoint(f"{pre}.axis_p", bins=list(FLOAT_CLASSES), xf=lambda op, pc, rc: pc)
        @CoverPoint(f"{pre}.axis_r", bins=list(FLOAT_CLASSES), xf=lambda op, pc, rc: rc)
        @CoverCross(f"{pre}.operands", items=[f"{pre}.axis_op", f"{pre}.axis_p",
                                              f"{pre}.axis_r"])
        def _operands(op, pc, rc):
            pass
        self.names.append(f"{pre}.operands")

        @cp("mac_q", FLOAT_CLASSES, xf=lambda qc: qc)
        def _mac_q(qc):
            pass

        result_bins = [(o.name, c) for o in ARITH for c in FLOAT_CLASSES if c != "snan"] + \
            [(o.name, e) for o in ARITH for e in EVENTS_OF[o]]

        @cp("result", result_bins, xf=lambda op, what: (op, what))
        def _result(op, what):
            pass

        @cp("buffer_role", [(role, i) for role in "PQRD" for i in range(cfg.nbuf)],
            xf=lambda role, i: (role, i))
        def _buffer(role, i):
            pass

        @cp("l1_result", ("zero", "normal", "inf", "nan"), xf=lambda what: what)
        def _l1(what):
            pass

        @cp("tail", range(cfg.lanes), xf=lambda n: n % cfg.lanes)
        def _tail(n):
            pass

        @cp("operator", OPERATORS, xf=lambda name: name)
        def _operator(name):
            pass

        @cp("segment_k", range(1, 9), xf=lambda k: k)
        def _segment(k):
            pass

        @cp("dequant_group", [(g, r) for g in ("group=lanes", "group>lanes")
                              for r in ("one group per row", "groups per row > 1")],
            xf=lambda g, r: (g, r))
        def _dequant(g, r):
            pass

        @cp("stalls", [(lat, rq, rs) for lat in ("latency 1", "latency > 1")
                       for rq in ("no request stalls", "request stalls")
                       for rs in ("no response stalls", "response stalls")],
            xf=lambda lat, rq, rs: (lat, rq, rs))
        def _stalls(lat, rq, rs):
            pass

        @cp("status", [s.name for s in Status], xf=lambda s: s)
        def _status(s):
            pass

        @cp("reset_depth", ("<8", "8..63", "64..511", ">=512"), xf=lambda d: d)
        def _reset(d):
            pass

        self._uop, self._operands, self._mac_q, self._result = _uop, _operands, _mac_q, _result
        self._buffer = _buffer
        self._l1, self._tail, self._operator, self._segment = _l1, _tail, _operator, _segment
        self._dequant, self._stalls, self._status, self._reset = _dequant, _stalls, _status, \
            _reset

    # ------------------------------------------------------------------ samplers
    def program(self, n_elems: int, status: Status, memory_config: tuple) -> None:
        """One program run: its length, the status it ended with, and the memory's
        (latency, request stall probability, response stall probability)."""
        self._status(Status(status).name)
        if Status(status) == Status.OK:
            self._tail(n_elems)
            lat, rq, rs = memory_config
            self._stalls("latency 1" if lat <= 1 else "latency > 1",
                         "request stalls" if rq > 0 else "no request stalls",
                         "response stalls" if rs > 0 else "no response stalls")

    def uop(self, op: Op, rsrc: RSrc, p, q, r, res) -> None:
        """One micro-op pass: operands / result as flat tensors (the interpreter's
        ``observe``); float classes and events sampled once per distinct combination."""
        import torch

        self._uop(op.name, rsrc.name)
        fmt = self.cfg.fmt

        def bits(t):
            return None if t is None else t.contiguous().view(torch.int16).numpy().view(np.uint16)
        if op not in ARITH:
            return
        pb, qb, rb, resb = bits(p), bits(q), bits(r), bits(res)
        pc, rc = float_class(pb, fmt), float_class(rb, fmt)
        for a, b in np.unique(np.stack([pc, rc], axis=1), axis=0):
            self._operands(op.name, FLOAT_CLASSES[a], FLOAT_CLASSES[b])
        if qb is not None:
            for c in np.unique(float_class(qb, fmt)):
                self._mac_q(FLOAT_CLASSES[c])
        for c in np.unique(float_class(resb, fmt)):
            self._result(op.name, FLOAT_CLASSES[c])
        for name, hit in result_events(op, pb, qb, rb, resb, fmt).items():
            if name in EVENTS_OF[op] and hit.any():
                self._result(op.name, name)

    def buffers(self, uops) -> None:
        """The buffers a program that ran (status OK) used, by role: ``uops`` are
        :func:`coda.hw.nme.isa.decode_uop` tuples (op, rsrc, store, d, p, q, r, addr, param)."""
        for op, rsrc, store, d, p, q, r, _addr, _param in uops:
            if op in (*ARITH, Op.L1):
                self._buffer("P", p)
            if op == Op.MAC:
                self._buffer("Q", q)
            if rsrc == RSrc.BUF:
                self._buffer("R", r)
            if not store and op != Op.L1:
                self._buffer("D", d)

    def l1(self, value: float) -> None:
        """The fp32 sum an L1 program returned."""
        self._l1(("zero", "normal", "inf", "nan")[_l1_kind(float(value))])

    def operator(self, name: str, *, k: int | None = None, group: int | None = None,
                 channels: int | None = None) -> None:
        """One compiled operator run (``segment``: its K; ``dequant_int8``: group and
        channels)."""
        self._operator(name)
        if name == "segment":
            self._segment(int(k))
        if name == "dequant_int8":
            self._dequant("group=lanes" if group == self.cfg.lanes else "group>lanes",
                          "one group per row" if group == channels else "groups per row > 1")

    def reset(self, cycles_into_program: int) -> None:
        self._reset(_depth_bin(int(cycles_into_program)))

    # ------------------------------------------------------------------ export
    def export(self, path: str | Path) -> dict:
        """Write this configuration's bins and hits as JSON: ``{"config", "bins": {coverpoint:
        {bin: hits}}, "covered", "total", "covered_fraction"}``."""
        from cocotb_coverage.coverage import coverage_db

        bins = {}
        for name in self.names:
            item = coverage_db[name]
            bins[name[len(self.prefix) + 1:]] = {_label(b): int(h) for b, h in
                                                 item.detailed_coverage.items()}
        data = _totals({"config": {"fmt": self.cfg.fmt, "lanes": self.cfg.lanes},
                        "bins": bins})
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_file(Path(path), json_text(data, indent=1, sort_keys=True) + "\n")
        return data


def _l1_kind(total: float) -> int:
    return 3 if np.isnan(total) else 2 if np.isinf(total) else 0 if total == 0 else 1


def _label(b) -> str:
    return " / ".join(map(str, b)) if isinstance(b, tuple) else str(b)


def _totals(data: dict) -> dict:
    covered = sum(h > 0 for cp in data["bins"].values() for h in cp.values())
    total = sum(len(cp) for cp in data["bins"].values())
    return {**data, "covered": covered, "total": total,
            "covered_fraction": round(covered / total, 6) if total else 0.0}


def merge(paths: list[str | Path]) -> dict:
    """Join coverage files of several runs: per configuration ``fmt_l<lanes>``, hits summed
    bin by bin (every defined bin kept, hit or not). Returns ``{"configs": {cfg: data},
    "covered", "total", "covered_fraction"}``. Raises ValueError if no file is given."""
    if not paths:
        raise ValueError("no coverage files to merge")
    configs: dict[str, dict] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        key = f"{data['config']['fmt']}_l{data['config']['lanes']}"
        into = configs.setdefault(key, {"config": data["config"], "bins": {}})
        for cp, bins in data["bins"].items():
            dst = into["bins"].setdefault(cp, {})
            for b, h in bins.items():
                dst[b] = dst.get(b, 0) + h
    configs = {k: _totals(v) for k, v in sorted(configs.items())}
    covered = sum(c["covered"] for c in configs.values())
    total = sum(c["total"] for c in configs.values())
    return {"configs": configs, "covered": covered, "total": total,
            "covered_fraction": round(covered / total, 6) if total else 0.0}


def summary(merged: dict) -> str:
    """A readable summary: covered fraction per configuration and coverpoint, and every
    uncovered bin by name."""
    lines = [f"functional coverage: {merged['covered']} of {merged['total']} bins "
             f"({100 * merged['covered_fraction']:.2f} %)"]
    for key, c in merged["configs"].items():
        lines.append(f"{key}: {c['covered']} / {c['total']}")
        for cp, bins in c["bins"].items():
            miss = [b for b, h in bins.items() if h == 0]
            lines.append(f"  {cp:14s} {len(bins) - len(miss):4d} / {len(bins):4d}"
                         + (f"  uncovered: {', '.join(miss)}" if miss else ""))
    return "\n".join(lines)
