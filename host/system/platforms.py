"""Platform presets: GPU, PCIe link, host DIMMs with their NMEs, and energy per event.

Every number carries its source in the ``sources`` mapping of its preset, tagged:

- ``spec``: a vendor datasheet / JEDEC figure;
- ``measured``: a public measurement (quoted) or this project's own (command given);
- ``literature``: a published figure (paper cited);
- ``assumed``: no source was found; the assumption is stated (few, and said so in reports).

Units: FLOP/s, bytes/s, bytes, seconds, watts, picojoules (pJ).

Conventions shared with the rest of the project (what a *rank* is, the NME's clock):
:class:`Platform`.
"""

from __future__ import annotations

from coda.hw.dram.standards import DEFAULT_STANDARD
from coda.hw.nmp import NMP_DEPTH
from coda.hw.nme.isa import NMEConfig

from dataclasses import dataclass, field, replace
from pathlib import Path

from coda.hw.dram.standards import DRAMStandard, get_standard
from coda.hw.nmp import MAX_RANKS, check_nme_mhz

__all__ = ["GPU", "GPUS", "GPULink", "GPU_LINKS", "PCIE_PRESETS", "PCIeLink", "PCIE4_X16", "PCIE5_X16", "PCIE_LINKS", "NMPEfficiency", "NMP_EFFICIENCY",
           "NMP_EFFICIENCY_FILE", "load_nmp_efficiency", "save_nmp_efficiency",
           "SEGMENT_UTIL", "SEGMENT_UTIL_TILE", "SEGMENT_UTIL_FILE", "load_segment_util",
           "save_segment_util", "segment_util_sources", "segment_utilisation",
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
    # Multi-GPU validation (coda validate's scaling figures: xDiT's HunyuanVideo tables).
    "h100": GPU(
        "h100", peak_flops=989e12, mem_bw=3.35e12, mem_bytes=80 * 2**30,
        power_busy_w=700.0, power_stall_w=700.0 * _STALL_FRACTION, **_EFF,
        sources={"peak_flops": "spec: H100 SXM BF16 tensor 989 TFLOPS dense (the H200's "
                               "compute: the same GH100 with 132 SMs; NVIDIA H100 datasheet "
                               "1,979 TFLOPS with sparsity)",
                 "mem_bw": "spec: H100 SXM 3.35 TB/s HBM3 (NVIDIA H100 datasheet; "
                           "lzwjava.github.io/nvidia-h200-gpu-specs-en, H100 vs H200 table)",
                 "mem_bytes": "spec: 80 GB HBM3", "power_busy_w": "spec: 700 W (SXM)",
                 "nvlink": "spec: NVLink 4.0, 900 GB/s bidirectional (GPU_LINKS['nvlink4'])",
                 "power_stall_w": "assumed: the RTX 4090's stalled fraction (13.3 %)",
                 **_EFF_SOURCES}),
    "h20": GPU(
        "h20", peak_flops=148e12, mem_bw=4.0e12, mem_bytes=96 * 2**30,
        power_busy_w=400.0, power_stall_w=400.0 * _STALL_FRACTION, **_EFF,
        sources={"peak_flops": "spec: H20 FP16/BF16 tensor 148 TFLOPS dense "
                               "(willitrunai.com/gpus/h20-96gb; 'FP16 148TFLOPS', "
                               "zangshuxian.com/new/674733024499207168)",
                 "mem_bw": "spec: 4.0 TB/s HBM3 (willitrunai.com/gpus/h20-96gb)",
                 "mem_bytes": "spec: 96 GB HBM3 (same page)",
                 "power_busy_w": "spec: 400 W TDP (same page)",
                 "nvlink": "spec: NVLink 4.0, 900 GB/s (same page; GPU_LINKS['nvlink4'])",
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
#: (H100 SXM and H20 are Gen5 x16 parts as the H200: NVIDIA H100 datasheet, "PCIe Gen5: 128 GB/s")
PCIE_LINKS: dict[str, PCIeLink] = {"h200": PCIE5_X16, "h100": PCIE5_X16, "h20": PCIE5_X16}


def _pcie(gen: int, width: int) -> PCIeLink:
    """PCIe ``gen`` x ``width`` (:data:`PCIE_PRESETS`): the theoretical rate of the lanes and
    128b/130b encoding, and the PCIe 4.0 x16 copy engines' measured fraction of theirs."""
    gts = {3: 8e9, 4: 16e9, 5: 32e9}[gen]
    theory = gts * width * 128 / 130 / 8
    return PCIeLink(
        f"PCIe {gen}.0 x{width}", theoretical_bw=theory,
        h2d_bw=theory * (PCIE4_X16.h2d_bw / PCIE4_X16.theoretical_bw),
        d2h_bw=theory * (PCIE4_X16.d2h_bw / PCIE4_X16.theoretical_bw),
        latency_s=PCIE4_X16.latency_s, pj_per_bit=PCIE4_X16.pj_per_bit,
        sources={"theoretical_bw": f"spec: PCIe {gen}.0 {gts / 1e9:g} GT/s x {width} lanes, "
                                   f"128b/130b = {theory / 1e9:.2f} GB/s per direction",
                 "h2d_bw": "assumed: the PCIe 4.0 x16 measurement's fraction of its "
                           "theoretical bandwidth (26.09 / 31.5, nvbandwidth issue #15)",
                 "d2h_bw": "assumed: as h2d_bw, 26.83 / 31.5",
                 "latency_s": PCIE4_X16.sources["latency_s"],
                 "pj_per_bit": PCIE4_X16.sources["pj_per_bit"]})


#: host links by generation and width (``coda sim --pcie genG-xW``), as edge boxes, laptops
#: and desktops wire GPUs: PCIe 3.0 / 4.0 / 5.0 x 4 / 8 / 16
PCIE_PRESETS: dict[str, PCIeLink] = {f"gen{g}-x{w}": _pcie(g, w) for g in (3, 4, 5)
                                     for w in (4, 8, 16)}


@dataclass(frozen=True)
class GPULink:
    """The link between the GPUs of one machine (``coda sim --gpus N --gpu-link``): what a
    collective of the parallel modes (:mod:`coda.host.system.parallel`) crosses.

    Attributes:
        name: preset name. theoretical_bw: bytes/s per direction and GPU. bw: the effective
            bytes/s per direction and GPU a transfer gets. latency_s: fixed cost of one
            collective or peer-to-peer transfer, s. pj_per_bit: energy per bit moved.
        topology: ``"switch"``: every GPU has its own port at ``bw`` into a switch
            (NVSwitch; a PCIe switch), so concurrent transfers of different GPUs do not
            share bandwidth. sources: field -> source.
    """
    name: str
    theoretical_bw: float
    bw: float
    latency_s: float
    pj_per_bit: float
    topology: str = "switch"
    sources: dict = field(default_factory=dict, compare=False)


#: the achieved fraction of a link's theoretical bandwidth, the PCIe 4.0 copy engines'
#: measured one (PCIE4_X16: 26.09 of 31.5 GB/s); used where no measurement of the link was
#: found (assumed)
_LINK_FRACTION = PCIE4_X16.h2d_bw / PCIE4_X16.theoretical_bw

GPU_LINKS: dict[str, GPULink] = {
    "pcie4-p2p": GPULink(
        "PCIe 4.0 x16 peer-to-peer", theoretical_bw=PCIE4_X16.theoretical_bw,
        bw=PCIE4_X16.h2d_bw, latency_s=20e-6, pj_per_bit=PCIE4_X16.pj_per_bit,
        sources={"theoretical_bw": PCIE4_X16.sources["theoretical_bw"],
                 "bw": "assumed: the measured host-to-device copy rate of the same x16 link "
                       "(PCIE4_X16.h2d_bw, nvbandwidth issue #15), each GPU behind its own "
                       "port of a PCIe switch (L40/L20 servers; consumer GPUs have "
                       "peer-to-peer disabled and stage through host memory)",
                 "latency_s": "assumed: one driver command, the kernel launch figure (20 us)",
                 "pj_per_bit": PCIE4_X16.sources["pj_per_bit"]}),
    "nvlink4": GPULink(
        "NVLink 4 (NVSwitch)", theoretical_bw=450e9, bw=450e9 * _LINK_FRACTION,
        latency_s=20e-6, pj_per_bit=0.54,
        sources={"theoretical_bw": "spec: NVLink 4.0 900 GB/s bidirectional per H100/H20, "
                                   "450 GB/s per direction (NVIDIA H100 datasheet; "
                                   "willitrunai.com/gpus/h20-96gb)",
                 "bw": "assumed: PCIe 4.0's measured fraction of its theoretical bandwidth "
                       "(26.09 / 31.5 = 0.83) of 450 GB/s = 373 GB/s",
                 "latency_s": "assumed: one driver command, the kernel launch figure (20 us)",
                 "pj_per_bit": "literature: 0.54 pJ/b ground-referenced signalling at 20 Gb/s "
                               "(Poulton et al., IEEE JSSC 48(12), 2013, NVIDIA), a lower "
                               "bound for an NVLink SerDes"}),
}


@dataclass(frozen=True)
class NMPEfficiency:
    """Measured DRAM utilisation of one DIMM-NMP rank running long NME programs.

    ``util[(lanes, depth)] = (residual_add, segment4)``: bytes moved / peak bytes of the
    cycles (residual_add None where not measured); ``source``: each entry's command, date,
    machine and NME. Built from :data:`NMP_EFFICIENCY_FILE`.
    """
    standard: str
    util: dict
    source: str


#: The measured DRAM utilisation of the residual add (3 streams) and the 4-stream segment of
#: :func:`coda.cosim.nmp.measure.segment_programs` on the DRAM-timed DIMM-NMP, 256 KiB per
#: stream: a data file, one entry per (standard, lanes, depth) with the NME it ran on and its
#: provenance (command, date, machine), written by ``coda validate --measure-nmp --measure
#: streams`` (:func:`save_nmp_efficiency`, from
#: :func:`coda.host.system.validate.measure_stream_utilisation`).
NMP_EFFICIENCY_FILE = Path(__file__).with_name("nmp_efficiency.json")


def _read_entries(path: Path, need: set, ok, expected: str) -> list[dict]:
    """The ``entries`` of a measured-table data file, each with the keys ``need`` and
    passing ``ok``; ValueError naming the file, the entry and ``expected`` otherwise."""
    import json

    entries = json.loads(Path(path).read_text())["entries"]
    for e in entries:
        if not need <= set(e) or not ok(e):
            raise ValueError(f"{path}: entry {e!r}: expected the keys {sorted(need)}, "
                             f"{expected}")
    return entries


def _merge_entries(path: Path, new: list[dict], key, about: str, read) -> list[dict]:
    """Merge ``new`` entries into a measured-table data file (``read`` loads it): an entry
    replaces the one of the same ``key``, the others stay; written sorted with ``about``.
    Returns the entries written."""
    from coda.jsonout import json_text
    from coda.paths import write_file

    have = {key(e): e for e in (read(path) if Path(path).exists() else [])}
    have.update({key(e): e for e in new})
    entries = [have[k] for k in sorted(have)]
    write_file(Path(path), json_text({"about": about, "entries": entries}, indent=1) + "\n")
    return entries


def _efficiency_key(e: dict) -> tuple:
    return (e["dram"], int(e["lanes"]), int(e["depth"]))


def _unit_or_none(u) -> bool:
    return u is None or 0 < float(u) <= 1


def load_nmp_efficiency(path: Path = NMP_EFFICIENCY_FILE) -> list[dict]:
    """The entries of :data:`NMP_EFFICIENCY_FILE`: dicts ``dram``, ``lanes``, ``depth``,
    ``stream_bytes``, ``nme`` (preset name and register stages), ``utilisation``
    (``residual_add``: 0..1 or None, ``segment4``: 0..1) and ``provenance`` (``command``,
    ``date``, ``machine``). Raises ValueError naming the file for an entry without those
    keys or with a utilisation out of range."""
    return _read_entries(
        path, {"dram", "lanes", "depth", "stream_bytes", "nme", "utilisation", "provenance"},
        lambda e: (_unit_or_none(e["utilisation"].get("residual_add"))
                   and e["utilisation"].get("segment4") is not None
                   and _unit_or_none(e["utilisation"]["segment4"])),
        "utilisation.segment4 in (0, 1], utilisation.residual_add in (0, 1] or null")


def save_nmp_efficiency(new: list[dict], path: Path = NMP_EFFICIENCY_FILE) -> list[dict]:
    """Merge measured entries (as :func:`load_nmp_efficiency` returns them) into the data
    file: an entry replaces the one of the same standard, lanes and depth. Returns the
    entries written."""
    return _merge_entries(
        path, new, _efficiency_key,
        "DRAM utilisation of long NME programs on one DIMM-NMP rank, per standard, lanes and "
        "depth: bytes moved / peak bytes of the cycles of the residual add (3 streams; null: "
        "not measured) and of the 4-stream segment; written by coda validate --measure-nmp "
        "--measure streams (coda.host.system.platforms.NMP_EFFICIENCY_FILE)",
        load_nmp_efficiency)


def _efficiency_tables(entries: list[dict]) -> dict[str, NMPEfficiency]:
    util: dict[str, dict] = {}
    source: dict[str, list[str]] = {}
    for e in entries:
        u = e["utilisation"]
        util.setdefault(e["dram"], {})[(int(e["lanes"]), int(e["depth"]))] = (
            None if u.get("residual_add") is None else float(u["residual_add"]),
            float(u["segment4"]))
        pv = e["provenance"]
        source.setdefault(e["dram"], []).append(
            f"{e['lanes']} lanes x depth {e['depth']}: {pv['command']} ({pv['date']}, "
            f"{pv['machine']}, NME {e['nme']['preset']})")
    return {k: NMPEfficiency(k, util[k], "measured: " + "; ".join(source[k])) for k in util}


#: :data:`NMP_EFFICIENCY_FILE` as tables per standard
NMP_EFFICIENCY: dict[str, NMPEfficiency] = _efficiency_tables(load_nmp_efficiency())


#: The measured DRAM utilisation of compiled K-term segment programs (x, K per-channel gate
#: vectors re-read per token, K cached tensors, y) on the DRAM-timed DIMM-NMP: a data file,
#: one entry per (table, segment form, standard, lanes, depth) with its utilisation per K, the
#: NME it was measured on and its provenance (command, date, machine), written by the command
#: that measures it, ``coda validate --measure-nmp`` (:func:`save_segment_util`, from
#: :func:`coda.host.system.validate.measure_segment_utilisation` and
#: :func:`~coda.host.system.validate.measure_tile_utilisation`; docs/results.md, DRAM
#: utilisation of segment programs). Tables: ``"long"``, 256 tokens x 512 channels on a 1 x 1
#: DIMM-NMP (256 KiB per stream at 8 lanes); ``"tile"``, the shipped model's [512, 96] tiles on a
#: 1 x 2 DIMM-NMP (3,072 words per stream and rank), K random slots of a group of 32 (one bank
#: colour, as the driver places one branch of a video), 16 draws per K, refresh phase and open
#: rows carried over from job to job, the utilisation of the centre (min + max) / 2 of the
#: draws' cycles. Forms (:data:`coda.host.nmp.link.SEGMENT_OUTPUTS`): ``"residual"``, x
#: written by the host right before each program; ``"sum"``, x a resident slot of zeros
#: stored once (``store(..., x_of=group)``, as the cache engine places it), never rewritten,
#: the gate vectors then placed otherwise (:func:`segment_utilisation`).
SEGMENT_UTIL_FILE = Path(__file__).with_name("segment_util.json")
#: the tables of a :data:`SEGMENT_UTIL_FILE` entry
SEGMENT_UTIL_TABLES = ("long", "tile")


def _entry_key(e: dict) -> tuple:
    return (e["table"], e["segment_output"], e["dram"], int(e["lanes"]), int(e["depth"]))


def load_segment_util(path: Path = SEGMENT_UTIL_FILE) -> list[dict]:
    """The entries of the segment utilisation data file (:data:`SEGMENT_UTIL_FILE`): dicts
    ``table`` (``"long"`` / ``"tile"``), ``segment_output``, ``dram``, ``lanes``, ``depth``,
    ``tokens``, ``channels``, ``ranks``, ``words_per_stream``, ``nme`` (preset name and
    register stages), ``utilisation`` ({K: bytes streamed / peak bytes of the cycles}) and
    ``provenance`` (``command``, ``date``, ``machine``). Raises ValueError naming the file
    for an entry without those keys or with a table, form or utilisation out of range."""
    from coda.host.nmp.link import SEGMENT_OUTPUTS

    return _read_entries(
        path, {"table", "segment_output", "dram", "lanes", "depth", "words_per_stream", "nme",
               "utilisation", "provenance"},
        lambda e: (e["table"] in SEGMENT_UTIL_TABLES and e["segment_output"] in SEGMENT_OUTPUTS
                   and all(0 < float(u) <= 1 for u in e["utilisation"].values())),
        f"table in {SEGMENT_UTIL_TABLES}, segment_output in {SEGMENT_OUTPUTS}, utilisations "
        "in (0, 1]")


def save_segment_util(new: list[dict], path: Path = SEGMENT_UTIL_FILE) -> list[dict]:
    """Merge measured entries (as :func:`load_segment_util` returns them) into the data file:
    an entry replaces the one of the same table, form, standard, lanes and depth, the others
    stay; written sorted, with the file's ``about``. Returns the entries written."""
    return _merge_entries(
        path, new, _entry_key,
        "DRAM utilisation of compiled segment programs on the DRAM-timed DIMM-NMP, per table, "
        "segment form, standard, lanes and depth: {K: bytes streamed / peak bytes of the "
        "cycles}; written by coda validate --measure-nmp "
        "(coda.host.system.platforms.SEGMENT_UTIL_FILE)", load_segment_util)


def _tables(entries: list[dict]) -> tuple[dict, dict]:
    long_t: dict = {"residual": {}, "sum": {}}
    tile_t: dict = {"residual": {}, "sum": {}}
    for e in entries:
        key = (e["dram"], int(e["lanes"]), int(e["depth"]))
        util = {int(k): float(v) for k, v in e["utilisation"].items()}
        if e["table"] == "long":
            long_t[e["segment_output"]][key] = util
        else:
            tile_t[e["segment_output"]][key] = (int(e["words_per_stream"]), util)
    return long_t, tile_t


#: The entries of :data:`SEGMENT_UTIL_FILE` as tables: ``SEGMENT_UTIL[form][(standard, lanes,
#: depth)] = {K: utilisation}`` (the long streams) and ``SEGMENT_UTIL_TILE[form][(standard,
#: lanes, depth)] = (words per stream, {K: utilisation})`` (the shipped model's tiles).
SEGMENT_UTIL, SEGMENT_UTIL_TILE = _tables(load_segment_util())

#: words per stream and rank of the long-stream measurements (256 tokens x 512 channels, 8 lanes)
SEGMENT_UTIL_WORDS = 256 * 512 // 8


def segment_util_sources(standard: str, lanes: int, depth: int) -> str | list[dict]:
    """Where the segment utilisations of ``standard`` x ``lanes`` x ``depth`` come from: per
    entry of :data:`SEGMENT_UTIL_FILE` its table, form, NME and provenance; without one, the
    lanes sweep's source (:func:`nmp_efficiency`)."""
    name = get_standard(standard).name
    rows = [{"table": e["table"], "segment_output": e["segment_output"], "nme": e["nme"],
             **e["provenance"]} for e in load_segment_util()
            if (e["dram"], int(e["lanes"]), int(e["depth"])) == (name, lanes, depth)]
    if rows:
        return rows
    eff = NMP_EFFICIENCY.get(name)
    return "no segment measurement: the lanes sweep's " + (eff.source if eff else "none")


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
                         "coda.host.system.validate.measure_stream_utilisation to add one)")
    add, seg = row
    return seg if streams >= 4 or add is None else add


@dataclass(frozen=True)
class Energy:
    """Energy per event, pJ (GPU energy is power x time, :class:`GPU`; the DRAM's own, per
    command from the device's currents, :mod:`coda.hw.dram.power`).

    Attributes:
        dram_io_pj_per_bit: per bit of data crossing the DIMM's channel to the host (the
            channel's I/O, outside the device currents' differences).
        add16_pj, mul16_pj: one 16-bit FP add / mul.
        sram_pj_per_bit: NME buffer access per bit.
    """
    dram_io_pj_per_bit: float = 1.9
    add16_pj: float = 0.4
    mul16_pj: float = 1.1
    sram_pj_per_bit: float = 10.0 / 64
    sources: dict = field(default_factory=lambda: {
        "dram_io_pj_per_bit": "assumed: the DDR channel between DIMM and CPU costs what the "
                              "1.4-1.9 pJ/b board-level I/O of IBM's 32 nm SOI transceiver "
                              "costs (literature figure for another link; no DDR5 I/O figure "
                              "was found)",
        "add16_pj": "literature: Horowitz ISSCC 2014, 45 nm fp16 add 0.4 pJ",
        "mul16_pj": "literature: Horowitz ISSCC 2014, 45 nm fp16 mul 1.1 pJ",
        "sram_pj_per_bit": "literature: Horowitz ISSCC 2014, 8 KB SRAM 10 pJ per 64-bit access",
        "dram": "per command from the device's IDD/IPP currents: coda.hw.dram.power",
    }, compare=False)


ENERGY = Energy()


@dataclass(frozen=True)
class Platform:
    """GPU + PCIe + ``dimms x ranks`` host ranks of ``dram`` with one NME each.

    Conventions shared with the rest of the project:

    - a *rank* is what :mod:`coda.hw.dram.standards` calls one: what one controller drives on
      its own data bus (DDR4: a 64-bit rank; DDR5: one 32-bit subchannel; LPDDR5: one x16
      channel). Each rank has one NME (docs/design.md), so ``--dimms D --ranks R`` gives ``D·R``
      NMEs, as in the driver and the DIMM-NMP cosimulation;
    - the NME runs at the DRAM command clock (1 / tCK) unless ``nme_mhz`` gives it its own
      clock, as the DIMM-NMP cosimulation does (``coda nme run --dram ... --nme-mhz F``,
      :mod:`coda.hw.nmp`): a segment then takes ``max(ideal NME cycles / f_NME, DRAM-bound
      time)``, the roofline the two-clock cosimulation follows (tests/cosim/test_nmp_clock.py); near
      the knee (16 bytes per NME cycle at 8 lanes against a rank's measured bandwidth) the
      crossing's latency costs a few per cent more than the model says (measured: docs/results.md,
      NME clock against one DDR5-4800 rank).

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
    lanes: int = NMEConfig.lanes
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
                "segment_utilisation": segment_util_sources(self.dram.name, self.lanes,
                                                            self.depth),
                "dram": f"hw/dram/standards.py {self.dram.name} (JEDEC / Ramulator 2 presets)"}


PLATFORM_NAMES = tuple(GPUS)
DEFAULT_PLATFORM = "rtx4090"


def platform(gpu: str = DEFAULT_PLATFORM, dram: str = DEFAULT_STANDARD, dimms: int = 2,
             ranks: int = 2, *, lanes: int = NMEConfig.lanes, depth: int = NMP_DEPTH,
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
