"""Platform presets: GPU, PCIe link, host DIMMs with their NMEs, and energy per event.

Every number carries its source in the ``sources`` mapping of its preset, tagged:

- ``spec``: a vendor datasheet / JEDEC figure;
- ``measured``: a public measurement (quoted) or this project's own (command given);
- ``literature``: a published figure (paper cited);
- ``assumed``: no source was found; the assumption is stated (few, and said so in reports).

Units: FLOP/s, bytes/s, bytes, seconds, watts, picojoules (pJ).

Conventions shared with the rest of the project:

- a *rank* is what :mod:`coda.hw.dram.standards` calls one: what one controller drives on
  its own data bus (DDR4: a 64-bit rank; DDR5: one 32-bit subchannel; LPDDR5: one x16
  channel). Each rank has one NME (docs/design.md), so ``--dimms D --ranks R`` gives ``D·R``
  NMEs, as in the driver and the DIMM-NMP cosimulation;
- the NME runs at the DRAM command clock (1 / tCK) unless ``nme_mhz`` gives it its own
  clock, as the DIMM-NMP cosimulation does (``coda nme run --dram ... --nme-mhz F``,
  :mod:`coda.hw.nmp`): a segment then takes ``max(ideal NME cycles / f_NME, DRAM-bound
  time)``, the roofline the two-clock cosimulation follows (tests/test_nmp_clock.py); near
  the knee (16 bytes per NME cycle at 8 lanes against a rank's measured bandwidth) the
  crossing's latency costs a few per cent more than the model says (measured: docs/results.md,
  NME clock against one DDR5-4800 rank).
"""

from __future__ import annotations

from coda.hw.dram.standards import DEFAULT_STANDARD
from coda.hw.nmp import NMP_DEPTH

from dataclasses import dataclass, field, replace

from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.hw.nmp import MAX_RANKS, check_nme_mhz

__all__ = ["GPU", "GPUS", "PCIeLink", "PCIE4_X16", "PCIE5_X16", "PCIE_LINKS", "NMPEfficiency", "NMP_EFFICIENCY",
           "SEGMENT_UTIL", "SEGMENT_UTIL_TILE", "SUM_MEASURED", "segment_utilisation",
           "Energy", "ENERGY", "Platform", "platform", "PLATFORM_NAMES", "DEFAULT_PLATFORM",
           "nmp_efficiency"]


@dataclass(frozen=True)
class GPU:
    """One GPU.

    Attributes:
        name: preset name. peak_flops: dense bf16/fp16 tensor-core FLOP/s with fp32
            accumulate. mem_bw: memory bandwidth, bytes/s. mem_bytes: memory, bytes.
        power_busy_w: board power while kernels run (the board power limit), W.
        power_stall_w: board power while no kernel runs (waiting on a copy or the NMEs), W.
        eff_gemm, eff_attention, eff_memory: achieved fraction of peak FLOP/s (GEMM,
            fused attention) and of memory bandwidth (elementwise kernels).
        launch_s: CPU time to issue one kernel or copy in eager PyTorch, s (bounds an
            operator's time from below when its kernels are tiny).
        sources: field -> source.
    """
    name: str
    peak_flops: float
    mem_bw: float
    mem_bytes: int
    power_busy_w: float
    power_stall_w: float
    eff_gemm: float
    eff_attention: float
    eff_memory: float
    launch_s: float
    sources: dict = field(default_factory=dict, compare=False)


# Efficiency factors shared by every GPU preset (the same kernels run on each).
_EFF = dict(
    eff_gemm=0.69, eff_attention=0.615, eff_memory=0.91, launch_s=20e-6)
_EFF_SOURCES = {
    "eff_gemm": "measured: 215 of 312 TFLOPS for an 8192^3 fp16 torch matmul on an A800 80GB "
                "PCIe (github.com/mli/transformers-benchmarks issue #4): 0.69; used for every "
                "GPU without its own measurement",
    "eff_attention": "literature: FlashAttention-2 forward reaches 50-73 % of A100 peak "
                     "(Dao, arXiv 2307.08691); the midpoint 61.5 %",
    "eff_memory": "measured: clpeak global memory bandwidth float16 921 GB/s of 1008 GB/s on an "
                  "RTX 4090 (github.com/krrishnarraj/clpeak issue #106): 91 %",
    "launch_s": "measured: ~20 us host-to-device round trip of a PyTorch elementwise kernel "
                "(NVIDIA Nsight Systems guide, V100); an upper bound on newer CPUs",
}
# Stalled power: nvidia-smi of RTX 4090s with a model loaded and 0 % utilisation read 57 W
# (P0) and 70 W (P2) in public logs; the 4090's 60 W is 13.3 % of its board power and the
# other GPUs are given the same fraction (assumed: no per-GPU figure was found).
_STALL_FRACTION = 60.0 / 450.0

GPUS: dict[str, GPU] = {
    "rtx4090": GPU(
        "rtx4090", peak_flops=165.2e12, mem_bw=1008e9, mem_bytes=24 * 2**30,
        power_busy_w=450.0, power_stall_w=60.0, **{**_EFF, "eff_gemm": 0.96},
        sources={"peak_flops": "spec: NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 "
                               "peak BF16 tensor TFLOPS with FP32 accumulate 165.2 (330.4 sparse)",
                 "mem_bw": "spec: 384-bit GDDR6X at 21 Gbps = 1008 GB/s (Ada whitepaper)",
                 "mem_bytes": "spec: 24 GB GDDR6X",
                 "power_busy_w": "spec: total graphics power 450 W (NVIDIA); FurMark measured "
                                 "448 W on the Founders Edition (sportskeeda review)",
                 "power_stall_w": "measured: nvidia-smi, RTX 4090 with a model loaded at 0 % "
                                  "utilisation: 57 W (P0), 70 W (P2) (public logs); 60 W",
                 **_EFF_SOURCES,
                 "eff_gemm": "measured: 158.6 TFLOPS for an 8192^3 fp16 torch matmul on an RTX "
                             "4090 (github.com/mli/transformers-benchmarks issue #4; fp32 "
                             "accumulate, boost clock above spec): 0.96 of 165.2"}),
    "l4": GPU(
        "l4", peak_flops=121e12, mem_bw=300e9, mem_bytes=24 * 2**30,
        power_busy_w=72.0, power_stall_w=72.0 * _STALL_FRACTION, **_EFF,
        sources={"peak_flops": "spec: NVIDIA L4 datasheet, FP16/BF16 tensor 242 TFLOPS with "
                               "sparsity = 121 dense",
                 "mem_bw": "spec: NVIDIA L4 datasheet, 300 GB/s GDDR6",
                 "mem_bytes": "spec: 24 GB", "power_busy_w": "spec: 72 W max power",
                 "power_stall_w": "assumed: the RTX 4090's stalled fraction (13.3 %)",
                 **_EFF_SOURCES}),
    "a10": GPU(
        "a10", peak_flops=125e12, mem_bw=600e9, mem_bytes=24 * 2**30,
        power_busy_w=150.0, power_stall_w=150.0 * _STALL_FRACTION, **_EFF,
        sources={"peak_flops": "spec: NVIDIA A10 datasheet, BF16 tensor 125 TFLOPS dense "
                               "(250 sparse)",
                 "mem_bw": "spec: NVIDIA A10 datasheet, 600 GB/s GDDR6",
                 "mem_bytes": "spec: 24 GB", "power_busy_w": "spec: 150 W max power",
                 "power_stall_w": "assumed: the RTX 4090's stalled fraction (13.3 %)",
                 **_EFF_SOURCES}),
    # Datacenter GPUs, only to check the GPU model against published generation times.
    "a100": GPU(
        "a100", peak_flops=312e12, mem_bw=2039e9, mem_bytes=80 * 2**30,
        power_busy_w=400.0, power_stall_w=400.0 * _STALL_FRACTION, **_EFF,
        sources={"peak_flops": "spec: NVIDIA A100 datasheet, BF16 tensor 312 TFLOPS dense",
                 "mem_bw": "spec: A100 80GB SXM 2,039 GB/s HBM2e",
                 "mem_bytes": "spec: 80 GB", "power_busy_w": "spec: 400 W (SXM)",
                 "power_stall_w": "assumed: the RTX 4090's stalled fraction (13.3 %)",
                 **_EFF_SOURCES}),
    "a800": GPU(
        "a800", peak_flops=312e12, mem_bw=2039e9, mem_bytes=80 * 2**30,
        power_busy_w=400.0, power_stall_w=400.0 * _STALL_FRACTION, **_EFF,
        sources={"peak_flops": "spec: A800 80GB SXM = A100 80GB SXM compute (312 TFLOPS BF16 "
                               "dense); only NVLink differs",
                 "mem_bw": "spec: 2,039 GB/s HBM2e", "mem_bytes": "spec: 80 GB",
                 "power_busy_w": "spec: 400 W (SXM)",
                 "power_stall_w": "assumed: the RTX 4090's stalled fraction (13.3 %)",
                 **_EFF_SOURCES}),
    # The GPU of the project's GPU check (scripts/gpu_check.py); its link is PCIe 5.0 x16
    # (PCIE_LINKS). A calibrated table (coda calibrate) replaces the roofline's times.
    "h200": GPU(
        "h200", peak_flops=989e12, mem_bw=4.8e12, mem_bytes=141 * 2**30,
        power_busy_w=700.0, power_stall_w=700.0 * _STALL_FRACTION, **_EFF,
        sources={"peak_flops": "spec: H200 SXM FP16/BF16 tensor 989 TFLOPS dense (1,979 with "
                               "2:4 sparsity; itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-"
                               "cores.html, 'values per GPU, SXM variant, in dense mode')",
                 "mem_bw": "spec: H200 SXM 4.8 TB/s HBM3e (same page; "
                           "www.aiminingco.com/gpu/h200/specs)",
                 "mem_bytes": "spec: 141 GB HBM3e (MLCommons inference v4.1 system "
                              "H200-SXM-141GBx8_TRT_MaxQ.json: accelerator_memory_capacity "
                              "'141 GB'; read as GiB as the other presets' GB)",
                 "power_busy_w": "spec: 700 W (MLCommons H200-SXM-141GBx8 hw_notes 'H200 TGP "
                                 "700W'; itkb.uw.cz: TDP 700 W)",
                 "pcie": "spec: PCIe Gen5 x16 (MLCommons: github.com/mlcommons/inference_"
                         "results_v4.1, closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json)",
                 "power_stall_w": "assumed: the RTX 4090's stalled fraction (13.3 %)",
                 **_EFF_SOURCES}),
}


@dataclass(frozen=True)
class PCIeLink:
    """The GPU's host link, each direction its own copy engine.

    Attributes:
        theoretical_bw: bytes/s per direction. h2d_bw, d2h_bw: measured effective bytes/s
        (pinned memory, copy engines). latency_s: fixed cost per copy command, s.
        pj_per_bit: link energy per bit moved. sources: field -> source.
    """
    name: str
    theoretical_bw: float
    h2d_bw: float
    d2h_bw: float
    latency_s: float
    pj_per_bit: float
    sources: dict = field(default_factory=dict, compare=False)


PCIE4_X16 = PCIeLink(
    "PCIe 4.0 x16", theoretical_bw=16e9 * 16 * 128 / 130 / 8, h2d_bw=26.09e9, d2h_bw=26.83e9,
    latency_s=20e-6, pj_per_bit=1.9,
    sources={"theoretical_bw": "spec: PCIe 4.0 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s per "
                               "direction",
             "h2d_bw": "measured: nvbandwidth host_to_device_memcpy_ce on 8 RTX 4090s, "
                       "23.90-26.38 GB/s, median 26.09 (github.com/NVIDIA/nvbandwidth issue #15)",
             "d2h_bw": "measured: same, device_to_host_memcpy_ce 26.25-27.11 GB/s, median 26.83",
             "latency_s": "assumed: one driver command, the kernel launch figure (20 us)",
             "pj_per_bit": "literature: 1.4-1.9 pJ/b for a 16 x 12 Gb/s I/O over 0.75-20 inch "
                           "PCB (IBM, 32 nm SOI); a lower bound for a PCIe 4.0 SerDes"})


PCIE5_X16 = PCIeLink(
    "PCIe 5.0 x16", theoretical_bw=32e9 * 16 * 128 / 130 / 8,
    h2d_bw=32e9 * 16 * 128 / 130 / 8 * (PCIE4_X16.h2d_bw / PCIE4_X16.theoretical_bw),
    d2h_bw=32e9 * 16 * 128 / 130 / 8 * (PCIE4_X16.d2h_bw / PCIE4_X16.theoretical_bw),
    latency_s=20e-6, pj_per_bit=1.9,
    sources={"theoretical_bw": "spec: PCIe 5.0 32 GT/s x 16 lanes, 128b/130b = 63.0 GB/s per "
                               "direction (MLCommons H200-SXM-141GBx8 accelerator_host_"
                               "interconnect 'PCIe Gen5 x16')",
             "h2d_bw": "assumed: the PCIe 4.0 measurement's fraction of its theoretical "
                       "bandwidth (26.09 / 31.5) at Gen5's 63.0 GB/s = 52.2 GB/s (no copy-"
                       "engine measurement of a Gen5 GPU was found; nvbandwidth issue #24 "
                       "reports SM copies on H100s of 35.2 GB/s H2D, 52.8 GB/s D2H); a "
                       "calibrated table (coda calibrate) replaces it with the measured one",
             "d2h_bw": "assumed: as h2d_bw, 26.83 / 31.5 of 63.0 GB/s = 53.7 GB/s",
             "latency_s": "assumed: one driver command, the kernel launch figure (20 us)",
             "pj_per_bit": "literature: as PCIe 4.0 (1.4-1.9 pJ/b board-level I/O, IBM 32 nm "
                           "SOI); a lower bound for a PCIe 5.0 SerDes"})

#: the host link of a GPU preset that is not PCIe 4.0 x16 (:func:`platform`'s default link)
PCIE_LINKS: dict[str, PCIeLink] = {"h200": PCIE5_X16}


@dataclass(frozen=True)
class NMPEfficiency:
    """Measured DRAM utilisation of one DIMM-NMP rank running long NME programs.

    ``util[(lanes, depth)] = (residual_add, segment4)``: bytes moved / peak bytes of the
    cycles, from ``coda.experiments.design_space.sweep`` / ``coda.cosim.nmp_measure.measure_nmp``
    on the DRAM-timed DIMM-NMP.
    """
    standard: str
    util: dict
    source: str


_SWEEP_CMD = ("coda.experiments.design_space.sweep(lanes=(8,), depths=(64,) or (256,), dram=STD) on a "
              "1 x 1 DIMM-NMP, 256 KiB streams (measured here for the system model, on the FR-FCFS "
              "controller with the default bypass cap of 1; build/system/nmp_*.json)")
NMP_EFFICIENCY: dict[str, NMPEfficiency] = {
    "DDR5-4800": NMPEfficiency(
        "DDR5-4800",
        # segment4 utilisation = its elements/cycle (4 streams x 2 B = the 8 B/cycle peak)
        {(8, 256): (0.8815, 0.8842), (8, 64): (0.8133, 0.8244),
         (1, 256): (None, 0.149), (2, 256): (None, 0.311), (4, 256): (None, 0.617),
         (16, 256): (None, 0.888), (32, 256): (None, 0.899)},
        "measured here: make bench (docs/results.md: 2 x 2 DDR5-4800 DIMM-NMP, 8 lanes, depth "
        "256, 256 KiB streams: 88.2 % / 88.4 % per rank; lanes sweep 0.149-0.899 "
        "elements/cycle of the 4-stream segment, re-measured on the FR-FCFS controller: "
        "coda.experiments.design_space.sweep(lanes=(n,), depths=(256,)), build/system/nmp_lanes*.json) "
        "and " + _SWEEP_CMD),
    "DDR4-3200": NMPEfficiency(
        "DDR4-3200", {(8, 256): (0.8643, 0.8686), (8, 64): (0.688, 0.7139)},
        "measured here: " + _SWEEP_CMD),
    "LPDDR5-6400": NMPEfficiency(
        "LPDDR5-6400", {(8, 256): (0.5919, 0.5818), (8, 64): (0.5393, 0.5415)},
        "measured here: " + _SWEEP_CMD),
}


#: DRAM utilisation of the compiled K-term segment programs themselves (x, K per-channel gate
#: vectors re-read per token, K cached tensors, y) on one DIMM-NMP rank, 8 lanes, 256 tokens x
#: 512 channels (256 KiB per stream), per segment form (:data:`coda.host.nmp.link.SEGMENT_OUTPUTS`)
#: and (standard, lanes, depth): {K: utilisation}. Measured here: ``coda validate
#: --measure-nmp`` -> :func:`coda.host.system.validate.measure_segment_utilisation`
#: (DRAM-timed 1 x 1 DIMM-NMP; ``build/system/segment_util-FORM.json``, the residual form's
#: written as ``segment_util.json`` before the forms), on the FR-FCFS controller with the
#: default bypass cap of 1 (hw/dram/scheduler.py).
#: ``"residual"``: x written by the host right before each program. ``"sum"``: x a resident
#: slot of zeros stored once before the draws
#: (``store(..., x_of=group)``, as the cache engine places it), never rewritten; the driver
#: then places the gate vectors otherwise (:func:`segment_utilisation`); SUM_MEASURED says
#: how.
SEGMENT_UTIL: dict[str, dict[tuple[str, int, int], dict[int, float]]] = {
    "residual": {
        ("DDR5-4800", 8, 256): {1: 0.862, 2: 0.8573, 3: 0.8568, 4: 0.8572, 6: 0.8608,
                                8: 0.8615},
        ("DDR5-4800", 8, 64): {1: 0.7462, 2: 0.715, 3: 0.7216, 4: 0.7225, 6: 0.7272,
                               8: 0.7285},
        ("DDR4-3200", 8, 256): {1: 0.8436, 2: 0.8177, 3: 0.801, 4: 0.8122, 6: 0.8096,
                                8: 0.8184},
        ("DDR4-3200", 8, 64): {1: 0.635, 2: 0.5942, 3: 0.581, 4: 0.5997, 6: 0.6002,
                               8: 0.6014},
        ("LPDDR5-6400", 8, 256): {1: 0.5707, 2: 0.5498, 3: 0.5414, 4: 0.528, 6: 0.5188,
                                  8: 0.5154},
        ("LPDDR5-6400", 8, 64): {1: 0.497, 2: 0.4696, 3: 0.4655, 4: 0.4627, 6: 0.4613,
                                 8: 0.4609},
    },
    "sum": {
        ("DDR5-4800", 8, 64): {1: 0.7462, 2: 0.7149, 3: 0.7227, 4: 0.7232, 6: 0.7275,
                               8: 0.7282},
        ("DDR5-4800", 8, 256): {1: 0.8624, 2: 0.8568, 3: 0.8576, 4: 0.8586, 6: 0.8603,
                                8: 0.8608},
        ("DDR4-3200", 8, 256): {1: 0.8545, 2: 0.8462, 3: 0.8502, 4: 0.8506, 6: 0.8558,
                                8: 0.857},
        ("DDR4-3200", 8, 64): {1: 0.664, 2: 0.6312, 3: 0.6443, 4: 0.6498, 6: 0.6577,
                               8: 0.6619},
        ("LPDDR5-6400", 8, 256): {1: 0.5689, 2: 0.5496, 3: 0.5407, 4: 0.5301, 6: 0.5196,
                                  8: 0.5131},
        ("LPDDR5-6400", 8, 64): {1: 0.5028, 2: 0.476, 3: 0.4708, 4: 0.4668, 6: 0.4626,
                                 8: 0.4637},
    },
}


#: words per stream and rank of the SEGMENT_UTIL measurements (256 tokens x 512 channels, 8 lanes)
SEGMENT_UTIL_WORDS = 256 * 512 // 8

#: The same for the shipped model's short tiles, as a generation places them: K-term segments
#: of [512, 96] on a 1 x 2 DIMM-NMP (256 rows x 96 channels = 3,072 words per stream and
#: rank), K random slots of a group of 32 (one bank colour, as the driver places one branch
#: of a video), 16 draws per K, refresh phase and open rows carried over from job to job;
#: utilisation of the centre (min + max) / 2 of the draws' cycles. Per segment form and
#: (standard, lanes, depth): (words per stream, {K: utilisation}); the forms' x as in
#: :data:`SEGMENT_UTIL`. Measured here: ``coda validate --measure-nmp``
#: -> :func:`coda.host.system.validate.measure_tile_utilisation`
#: (``build/system/tile_util-FORM.json``, residual: ``tile_util.json``, which also hold each
#: K's min/max cycles over the draws),
#: on the FR-FCFS controller with the default bypass cap of 1. Both forms: docs/results.md,
#: DRAM utilisation of segment programs; ``"sum"``: see also SUM_MEASURED.
SEGMENT_UTIL_TILE: dict[str, dict[tuple[str, int, int], tuple[int, dict[int, float]]]] = {
    "residual": {
        ("DDR5-4800", 8, 64): (3072, {
            1: 0.8204, 2: 0.7639, 3: 0.7702, 4: 0.7669, 6: 0.7654, 8: 0.766}),
        ("DDR5-4800", 8, 256): (3072, {
            1: 0.8877, 2: 0.8739, 3: 0.8664, 4: 0.8733, 6: 0.8721, 8: 0.8725}),
        ("DDR4-3200", 8, 64): (3072, {
            1: 0.7169, 2: 0.6604, 3: 0.6672, 4: 0.6726, 6: 0.6734, 8: 0.6768}),
        ("DDR4-3200", 8, 256): (3072, {
            1: 0.8628, 2: 0.8605, 3: 0.855, 4: 0.8597, 6: 0.862, 8: 0.8551}),
    },
    "sum": {
        ("DDR5-4800", 8, 64): (3072, {
            1: 0.7364, 2: 0.7073, 3: 0.6915, 4: 0.6883, 6: 0.6812, 8: 0.6796}),
        ("DDR5-4800", 8, 256): (3072, {
            1: 0.8528, 2: 0.8548, 3: 0.8447, 4: 0.8479, 6: 0.8453, 8: 0.8426}),
        ("DDR4-3200", 8, 64): (3072, {
            1: 0.6436, 2: 0.611, 3: 0.6053, 4: 0.6021, 6: 0.6038, 8: 0.5997}),
        ("DDR4-3200", 8, 256): (3072, {
            1: 0.8346, 2: 0.8383, 3: 0.8294, 4: 0.8359, 6: 0.8257, 8: 0.8275}),
    },
}

#: where and how the ``"sum"`` tables were measured
SUM_MEASURED = (
    "measured here (docs/results.md, DRAM utilisation of segment programs): "
    "coda.host.system.validate.measure_tile_utilisation / measure_segment_utilisation"
    "(STD, DEPTH, segment_output='sum') one configuration at a time, what coda validate "
    "--measure-nmp --segment-output sum runs "
    "(build/system/tile_util-sum.json, segment_util-sum.json)")


def _interp_k(table: dict[int, float], k: int) -> float:
    k = max(1, min(int(k), max(table)))
    if k in table:
        return table[k]
    lo = max(x for x in table if x < k)
    hi = min(x for x in table if x > k)
    return table[lo] + (table[hi] - table[lo]) * (k - lo) / (hi - lo)


def segment_utilisation(standard: str, lanes: int, depth: int, k: int,
                        words: int | None = None, segment_output: str = "sum",
                        program: int = 0) -> float:
    """Measured DRAM utilisation of a ``k``-term segment program (k <= 8; between measured
    k, linear interpolation) streaming ``words`` words per stream and rank (None: long
    streams), of the segment form ``segment_output`` (:data:`coda.host.nmp.link.SEGMENT_OUTPUTS`:
    ``"sum"`` reads x from a resident slot of zeros, ``"residual"`` from an x the host has
    just written), the ``program``-th launch of its chain (a segment of more than 8 terms).

    The forms are measured apart because the driver places their streams apart (bank
    colours, :mod:`coda.host.nmp.placement`, slots of colour c): a residual launch writes x at
    c^3 with the gate vectors in its range (bank c^2), y at c^1; a launch whose x is
    resident at c^3 (the sum form's slot of zeros) puts the gates in y's range at c^1,
    whose second half is bank c, the slots' own (row conflicts all along, more cycles). A
    chained launch reads the previous
    one's y in place: at c^1 (its y and gates at c^3, gates in bank c^2: placed as a
    residual launch) after the first launch or an even one, at c^3 (as a sum launch) after an
    odd one. So the first launch takes ``segment_output``'s table, odd launches the residual
    one, even ones the sum one.

    Two measured tile lengths: the long streams of :data:`SEGMENT_UTIL`
    (:data:`SEGMENT_UTIL_WORDS` words) and the shipped model's tiles of
    :data:`SEGMENT_UTIL_TILE` (3,072 words). A launch costs a fixed part (program start,
    pipeline fill and drain, the first rows' activations) plus a part per word, so
    ``1 / utilisation`` is linear in ``1 / words``: it is interpolated so between the two,
    and each measurement is used as is beyond it. A table measured for the ``"residual"``
    form only (a configuration missing from the ``"sum"`` table) stands for both; without a
    segment measurement for the lanes x depth, the 4-stream segment's of the lanes sweep
    (:func:`nmp_efficiency`).
    Raises ValueError for an unknown form, or when the project has no measurement."""
    from coda.host.nmp.link import check_segment_output

    form = check_segment_output(segment_output)
    if program:
        form = "residual" if program % 2 else "sum"
    name = get_standard(standard).name
    key = (name, lanes, depth)
    table = SEGMENT_UTIL[form].get(key, SEGMENT_UTIL["residual"].get(key))
    if table is None:
        return nmp_efficiency(standard, lanes, depth, 4)
    long_u = _interp_k(table, k)
    tile = SEGMENT_UTIL_TILE[form].get(key, SEGMENT_UTIL_TILE["residual"].get(key))
    if words is None or tile is None or words >= SEGMENT_UTIL_WORDS:
        return long_u
    w_s, tab_s = tile
    short_u = _interp_k(tab_s, k)
    if words <= w_s:
        return short_u
    f = (1 / words - 1 / SEGMENT_UTIL_WORDS) / (1 / w_s - 1 / SEGMENT_UTIL_WORDS)
    return 1 / (1 / long_u + f * (1 / short_u - 1 / long_u))


def nmp_efficiency(standard: str, lanes: int, depth: int, streams: int) -> float:
    """The measured DRAM utilisation of an NME program with ``streams`` memory streams (3:
    the residual add's, >= 4: the 4-stream segment's) on one rank of ``standard``.

    Raises ValueError if the project has no measurement for that configuration.
    """
    eff = NMP_EFFICIENCY.get(get_standard(standard).name)
    row = None if eff is None else eff.util.get((lanes, depth))
    if row is None:
        have = {k: sorted(v.util) for k, v in NMP_EFFICIENCY.items()}
        raise ValueError(f"no DIMM-NMP measurement for {standard} with {lanes} lanes, depth "
                         f"{depth}: measured (lanes, depth) are {have} (run "
                         "coda.experiments.design_space sweep to add one)")
    add, seg = row
    return seg if streams >= 4 or add is None else add


@dataclass(frozen=True)
class Energy:
    """Energy per event, pJ (GPU energy is power x time, :class:`GPU`).

    Attributes:
        dram_pj_per_bit: DRAM read/write core energy per bit (NME accesses and host DMA).
        dram_io_pj_per_bit: extra per bit for data crossing the DIMM's channel to the host.
        act_pj: one row activation of a rank. add16_pj, mul16_pj: one 16-bit FP add / mul.
        sram_pj_per_bit: NME buffer access per bit.
    """
    dram_pj_per_bit: float = 6.0
    dram_io_pj_per_bit: float = 1.9
    act_pj: float = 4000.0
    add16_pj: float = 0.4
    mul16_pj: float = 1.1
    sram_pj_per_bit: float = 10.0 / 64
    sources: dict = field(default_factory=lambda: {
        "dram_pj_per_bit": "literature: docs/design.md, 4-8 pJ/bit DDR4 core (Micron TN-40-07 "
                           "method), midpoint 6 (as coda.synth.energy)",
        "dram_io_pj_per_bit": "assumed: the DDR channel between DIMM and CPU costs what the "
                              "1.4-1.9 pJ/b board-level I/O of IBM's 32 nm SOI transceiver "
                              "costs (literature figure for another link; no DDR5 I/O figure "
                              "was found)",
        "act_pj": "literature: docs/design.md, row activation ~4 nJ per rank (Micron TN-40-07)",
        "add16_pj": "literature: Horowitz ISSCC 2014, 45 nm fp16 add 0.4 pJ",
        "mul16_pj": "literature: Horowitz ISSCC 2014, 45 nm fp16 mul 1.1 pJ",
        "sram_pj_per_bit": "literature: Horowitz ISSCC 2014, 8 KB SRAM 10 pJ per 64-bit access",
    }, compare=False)


ENERGY = Energy()


@dataclass(frozen=True)
class Platform:
    """GPU + PCIe + ``dimms x ranks`` host ranks of ``dram`` with one NME each.

    Attributes:
        gpu, pcie, energy: the presets. dram: the :class:`DRAMStandard` of the host DIMMs.
        dimms, ranks: DIMMs and ranks per DIMM (each rank as :mod:`coda.hw.dram.standards`
            defines it). lanes, depth: the NME's SIMD lanes and buffer depth (words).
        nme_mhz: the NMEs' own clock, MHz (None: the DRAM command clock, 1 / tCK).
        gpu_times: measured xPU times (:class:`coda.host.system.gputable.GpuTimes`, from
            ``coda calibrate``) that replace the roofline where they have an entry; None:
            the roofline everywhere.
    """
    gpu: GPU
    pcie: PCIeLink
    dram: DRAMStandard
    dimms: int
    ranks: int
    lanes: int = 8
    depth: int = NMP_DEPTH
    energy: Energy = ENERGY
    nme_mhz: float | None = None
    gpu_times: object = field(default=None, compare=False)

    @property
    def n_ranks(self) -> int:
        return self.dimms * self.ranks

    @property
    def nme_clock_hz(self) -> float:
        """NME clock, Hz: ``nme_mhz``, or the DRAM command clock 1 / tCK when it is None."""
        return self.nme_mhz * 1e6 if self.nme_mhz is not None else 1e9 / self.dram.tCK_ns

    @property
    def rank_peak_bytes_per_nme_cycle(self) -> float:
        """One rank's peak data-bus bytes per NME cycle: burst bytes per nBL tCK, times DRAM
        command clocks per NME cycle (8 for DDR5-4800 on one clock, 19.2 at 1,000 MHz)."""
        return self.dram.burst_bytes / self.dram.nBL * (1e9 / self.dram.tCK_ns) / self.nme_clock_hz

    @property
    def rank_peak_bw(self) -> float:
        """One rank's peak data-bus bandwidth, bytes/s (burst bytes per nBL tCK)."""
        return self.dram.peak_gbps * 1e9

    @property
    def rank_bytes(self) -> int:
        """Capacity of one rank, bytes (the preset's device organisation)."""
        return self.dram.rank_bytes

    @property
    def host_bytes(self) -> int:
        """Capacity of all host ranks, bytes."""
        return self.n_ranks * self.rank_bytes

    @property
    def host_channel_bw(self) -> float:
        """Peak bandwidth between the host and the DIMMs, bytes/s: one 64-bit channel per
        DIMM (DDR4: one rank bus; DDR5: two 32-bit subchannels; LPDDR5: four x16 channels),
        never more than all rank buses together."""
        per_dimm = 64 // self.dram.rank_width
        return self.dimms * min(self.ranks, per_dimm) * self.rank_peak_bw

    def describe(self) -> dict:
        return {"gpu": self.gpu.name, "pcie": self.pcie.name, "dram": self.dram.name,
                "dimms": self.dimms, "ranks": self.ranks, "n_ranks": self.n_ranks,
                "nme_lanes": self.lanes, "nme_depth": self.depth, "nme_mhz": self.nme_mhz,
                "nme_clock_hz": self.nme_clock_hz, "rank_peak_bw": self.rank_peak_bw,
                "rank_bytes": self.rank_bytes, "host_bytes": self.host_bytes,
                "gpu_peak_flops": self.gpu.peak_flops, "gpu_mem_bw": self.gpu.mem_bw,
                "gpu_mem_bytes": self.gpu.mem_bytes,
                "pcie_h2d_bw": self.pcie.h2d_bw, "pcie_d2h_bw": self.pcie.d2h_bw,
                "pcie_latency_s": self.pcie.latency_s,
                "gpu_times": ("roofline" if self.gpu_times is None
                              else self.gpu_times.describe())}

    def sources(self) -> dict:
        return {"gpu": self.gpu.sources, "pcie": self.pcie.sources,
                "gpu_times": ("roofline: peak figures x efficiencies (gpu)"
                              if self.gpu_times is None else self.gpu_times.source()),
                "energy": self.energy.sources,
                "nmp_efficiency": {k: v.source for k, v in NMP_EFFICIENCY.items()},
                "segment_utilisation": "measured here: coda validate --measure-nmp "
                                       "(SEGMENT_UTIL, SEGMENT_UTIL_TILE; "
                                       "sum form: " + SUM_MEASURED + ")",
                "dram": f"hw/dram/standards.py {self.dram.name} (JEDEC / Ramulator 2 presets)"}


PLATFORM_NAMES = tuple(GPUS)
DEFAULT_PLATFORM = "rtx4090"


def platform(gpu: str = DEFAULT_PLATFORM, dram: str = DEFAULT_STANDARD, dimms: int = 2,
             ranks: int = 2, *, lanes: int = 8, depth: int = NMP_DEPTH,
             pcie: PCIeLink | None = None, nme_mhz: float | None = None, gpu_times=None,
             **overrides) -> Platform:
    """A :class:`Platform` from preset names.

    Args:
        gpu: a key of :data:`GPUS`. dram: a :mod:`coda.hw.dram.standards` preset.
        dimms, ranks: >= 1. lanes, depth: the NME (needs a DIMM-NMP measurement).
        pcie: the host link; None: the GPU's (:data:`PCIE_LINKS`, else :data:`PCIE4_X16`).
        nme_mhz: the NMEs' own clock in MHz (:func:`coda.hw.nmp.check_nme_mhz`: 1 MHz up to
            the DRAM command clock); None: the DRAM command clock.
        gpu_times: a :class:`coda.host.system.gputable.GpuTimes` (``coda sim --gpu-table``):
            its measured operator times replace the roofline's in the replay, and its
            measured copies (if the table has them) the link's ``h2d_bw``, ``d2h_bw`` and
            ``latency_s``.
        overrides: GPU or PCIe fields to replace (e.g. ``h2d_bw=1e15`` for "infinite" PCIe
            in a sensitivity study), applied to whichever preset has the field (after the
            table's copies: an override wins).
    Raises:
        ValueError: unknown names, counts < 1, an NME configuration never measured, or a bad
            ``nme_mhz`` (the message names it and the bounds).
    """
    if gpu not in GPUS:
        raise ValueError(f"--platform {gpu!r}: expected one of {', '.join(GPUS)}")
    for flag, v in (("dimms", dimms), ("ranks", ranks), ("lanes", lanes), ("depth", depth)):
        if int(v) < 1:
            raise ValueError(f"--{flag} {v}: expected >= 1")
    if dimms * ranks > MAX_RANKS:
        raise ValueError(f"--dimms {dimms} x --ranks {ranks} = {dimms * ranks} ranks: expected "
                         f"at most {MAX_RANKS} in all (the DIMM-NMP this project describes)")
    std = get_standard(dram)
    segment_utilisation(std.name, lanes, depth, 1)  # refuse an unmeasured NME up front
    g = GPUS[gpu]
    p = pcie if pcie is not None else PCIE_LINKS.get(gpu, PCIE4_X16)
    if gpu_times is not None and gpu_times.link():
        p = replace(p, name=f"{p.name}, measured copies", **gpu_times.link(),
                    sources={**p.sources, **{k: gpu_times.source() for k in gpu_times.link()}})
    g_over = {k: v for k, v in overrides.items() if hasattr(g, k)}
    p_over = {k: v for k, v in overrides.items() if hasattr(p, k) and k not in g_over}
    unknown = set(overrides) - set(g_over) - set(p_over)
    if unknown:
        raise ValueError(f"unknown platform fields {sorted(unknown)}")
    try:
        nme_mhz = check_nme_mhz(nme_mhz, std)
    except ValueError as exc:
        raise ValueError(f"--nme-mhz: {exc}") from None
    return Platform(replace(g, **g_over), replace(p, **p_over), std, int(dimms), int(ranks),
                    int(lanes), int(depth), nme_mhz=nme_mhz, gpu_times=gpu_times)
