"""Money: the purchase prices of the modelled machine's parts, electricity, and the cost of a
video (:func:`video_cost`, ``coda sim``) or of a served request (:func:`serving_cost`, ``coda
serve``).

A video's cost is the machine's capital amortised over its working life plus the
electricity of the generation:

``cost = capital x latency / (lifetime x utilisation) + energy x price per kWh``

where ``capital`` is every GPU of the generation with its host DIMMs (``dimms x ranks``
ranks of the DRAM preset, priced per GiB) and, in the NMP systems d..g, one NME per rank
(:func:`machine_capital`); ``energy`` is the replay's (:func:`coda.host.system.energy.energy`,
all GPUs). Every system a..g is charged the same GPUs and DIMMs (the machine of the model is
one machine, as the energy model charges every system the DIMMs' background power); only the
NMEs differ. Host CPU, board, power supply and cooling are the same in every system and not
counted.

Every constant carries its source, tagged as the platform presets' are
(:mod:`coda.host.system.platforms`):

- ``list``: the vendor's published price;
- ``market``: a named reseller's, analyst's or market report's figure, with its date;
- ``statistic``: a named public statistic;
- ``measured``: this project's own measurement (command given);
- ``assumed``: no source was found; the assumption and why are stated.

Units: US dollars (USD), bytes, seconds, joules; DRAM is priced per GiB (a "64 GB" RDIMM holds
64 GiB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from coda.options import option

__all__ = ["GPU_PRICES", "DRAM_USD_PER_GIB", "NME_AREA_MM2", "WAFER_USD", "WAFER_MM2",
           "NME_USD", "USD_PER_KWH", "LIFETIME_YEARS", "NMP_SYSTEMS", "SOURCES", "Prices",
           "PriceConfig", "prices", "machine_capital", "video_cost", "serving_cost",
           "YEAR_S"]

#: seconds of a year (365.25 days)
YEAR_S = 365.25 * 86400.0
#: the systems that have an NME in every rank (:data:`coda.host.system.replay.SYSTEMS`)
NMP_SYSTEMS = "defg"

#: purchase price of one GPU of a preset, USD, and its source; None: no price was sourced
#: (the presets only used to check the model against published latencies)
GPU_PRICES: dict[str, tuple[float | None, str]] = {
    "rtx4090": (1599.0, "list: NVIDIA's launch price of the GeForce RTX 4090 Founders "
                        "Edition, USD 1,599, announced 20 September 2022, on sale 12 October 2022 "
                        "(pcgamer.com, 'RTX 4090 release date, price, specs'; tomsguide.com)"),
    "l4": (2500.0, "market: NVIDIA publishes no list price; USD 2,500 retail (runlocalai.co/"
                   "hardware/nvidia-l4, 2026; chipversus.com/hardware/gpu/l4 lists an MSRP of "
                   "USD 2,345)"),
    "a10": (2500.0, "assumed: no A10 list or reseller price was found; the A10G, AWS's "
                    "variant of the A10 (same GA102, 24 GB GDDR6, 600 GB/s), is listed at an "
                    "MSRP of USD 2,500 (chipversus.com/hardware/gpu/l4, value table)"),
    "h100": (27500.0, "market: USD 25,000-30,000 per H100 sold to end customers (Raymond "
                      "James estimate, reported by Barron's, August 2023; techspot.com, "
                      "'Nvidia garners reported 1,000% profit on each H100'): the midpoint"),
    "h20": (13500.0, "market: NVIDIA priced H20 orders to distributors in China at USD "
                     "12,000-15,000 per card (Reuters, February 2024, via dunyanews.tv): the "
                     "midpoint"),
    "a100": (None, "no price sourced: a validation-only preset (give --price-gpu)"),
    "a800": (None, "no price sourced: a validation-only preset (give --price-gpu)"),
    "h200": (None, "no price sourced: a validation-only preset (give --price-gpu)"),
}

#: DDR5 server RDIMM, USD per GiB
DRAM_USD_PER_GIB = 85.0 / 32
#: the NME's cell area in SkyWater 130 nm, mm^2 (8 lanes, bf16, depth 64, timing-closed)
NME_AREA_MM2 = 2.585632
#: foundry sale price of one 300 mm wafer at 90 nm, USD
WAFER_USD = 1650.0
#: area of one 300 mm wafer, mm^2
WAFER_MM2 = math.pi * 150.0 ** 2
#: the silicon of one NME, USD: its area at the wafer's price per mm^2
NME_USD = NME_AREA_MM2 * WAFER_USD / WAFER_MM2
#: electricity, USD per kWh
USD_PER_KWH = 172_257e6 / 1_390_873e6
#: working life over which the capital is amortised, years
LIFETIME_YEARS = 5.0

SOURCES = {
    "dram_usd_per_gib": "market: TrendForce's estimate of the DDR5 server RDIMM 32 GB contract "
                        "price, USD 80-90 in April-May 2023 (TrendForce press release, May "
                        "2023, reported by ic-find.com and crn.pl): the midpoint, USD 85 / 32 "
                        "GiB = 2.66 per GiB; TrendForce expected contract prices up 18-23 % in "
                        "2025 Q4 (particle.news), so a later purchase may cost more",
    "nme_usd": "measured and market: the NME's cells, 2,585,632 um^2 in SkyWater 130 nm "
               "(coda synth --lanes 8 --fmt bf16 --target sky130; docs/synthesis.md, the "
               "timing-closed NME), at TSMC's sale price of a 300 mm wafer at 90 nm, the "
               "oldest node listed, USD 1,650 (CSET, Khan & Mann, 'AI Chips: What They Are and "
               "Why They Matter', 2020; gadgetcrutches.com, 'TSMC wafer prices leaked'), over "
               "the whole wafer's area: USD 0.060 an NME. Assumed: the NME is added to the "
               "DIMM's existing buffer chip (no package, test or yield loss of its own; a "
               "2.6 mm^2 block's defect-limited yield is near 1); a 130 nm wafer costs less "
               "than a 90 nm one, while a newer node would shrink the area. Not counted: the "
               "design's NRE and a vendor's margin on NMP DIMMs (give --price-nme)",
    "usd_per_kwh": "statistic: US average retail price of electricity to the commercial "
                   "sector in 2022, USD 172,257 million of revenue over 1,390,873 thousand "
                   "MWh sold (EIA Electric Power Monthly, Tables 5.2 and 5.1): 12.4 cents "
                   "per kWh",
    "lifetime_years": "market: Amazon's estimated useful life of servers, 5 years since "
                      "1 January 2022 (Amazon 10-K 2022; Microsoft and Alphabet use 6 years, "
                      "Meta 5; shaulkoral.com, 'Useful life of servers and network assets')",
    "utilisation": "assumed: the machine generates videos for its whole working life (a "
                   "lower bound of the capital per video; coda serve measures the cluster's "
                   "utilisation from its load instead)",
}


@dataclass(frozen=True)
class Prices:
    """The prices one cost is computed with.

    Attributes:
        gpu: the GPU preset priced. gpu_usd: one GPU, USD (None: no price, costs not computed).
        dram_usd_per_gib: host DIMMs, USD per GiB. nme_usd: one NME's silicon, USD.
        usd_per_kwh: electricity. lifetime_years: amortisation period. utilisation: the
            fraction of it the machine generates videos (``coda sim``; ``coda serve``
            measures it).
        sources: field -> source (an option given on the command line: ``"given"``).
    """
    gpu: str
    gpu_usd: float | None
    dram_usd_per_gib: float = DRAM_USD_PER_GIB
    nme_usd: float = NME_USD
    usd_per_kwh: float = USD_PER_KWH
    lifetime_years: float = LIFETIME_YEARS
    utilisation: float = 1.0
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def lifetime_s(self) -> float:
        return self.lifetime_years * YEAR_S

    def describe(self) -> dict:
        return {"gpu": self.gpu, "gpu_usd": self.gpu_usd,
                "dram_usd_per_gib": self.dram_usd_per_gib, "nme_usd": self.nme_usd,
                "usd_per_kwh": self.usd_per_kwh, "lifetime_years": self.lifetime_years,
                "utilisation": self.utilisation, "sources": self.sources}


def _positive(value, flag: str, upper: float | None = None) -> float:
    v = float(value)
    if not (v > 0 and math.isfinite(v)) or (upper is not None and v > upper):
        bound = f"a number > 0 and <= {upper:g}" if upper is not None else "a finite number > 0"
        raise ValueError(f"--{flag} {value!r}: expected {bound}")
    return v


def prices(gpu: str, *, price_gpu: float | None = None, price_dram_gb: float | None = None,
           price_nme: float | None = None, usd_per_kwh: float | None = None,
           lifetime_years: float | None = None, utilisation: float | None = None) -> Prices:
    """The :class:`Prices` of GPU preset ``gpu``: the sourced constants of this module, each
    replaced by the option given (None: the constant). ``price_nme`` may be 0 (an NME given
    away); the others must be > 0, ``utilisation`` at most 1.

    Raises:
        ValueError: an unknown GPU preset, or a bad price (the message names the flag and
            what it expects).
    """
    if gpu not in GPU_PRICES:
        raise ValueError(f"--platform {gpu!r}: expected one of {', '.join(GPU_PRICES)}")
    usd, gpu_source = GPU_PRICES[gpu]
    src = {"gpu_usd": gpu_source, **SOURCES}
    given = {}
    if price_gpu is not None:
        given["gpu_usd"] = _positive(price_gpu, "price-gpu")
    if price_dram_gb is not None:
        given["dram_usd_per_gib"] = _positive(price_dram_gb, "price-dram-gb")
    if price_nme is not None:
        v = float(price_nme)
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"--price-nme {price_nme!r}: expected a finite number >= 0")
        given["nme_usd"] = v
    if usd_per_kwh is not None:
        given["usd_per_kwh"] = _positive(usd_per_kwh, "usd-per-kwh")
    if lifetime_years is not None:
        given["lifetime_years"] = _positive(lifetime_years, "lifetime-years")
    if utilisation is not None:
        given["utilisation"] = _positive(utilisation, "utilisation", upper=1.0)
    src.update({k: "given" for k in given})
    return Prices(gpu, given.pop("gpu_usd", usd), sources=src, **given)


def machine_capital(plat, pr: Prices, system: str, gpus: int = 1) -> dict:
    """Purchase price of the machine one generation runs on, USD: ``gpus`` x (one GPU + its
    host DIMMs, ``plat.host_bytes`` at ``pr.dram_usd_per_gib`` + in the NMP systems
    (:data:`NMP_SYSTEMS`) one NME per rank, ``plat.n_ranks x pr.nme_usd``).

    Returns ``{"gpu_usd", "dimm_usd", "nme_usd", "total_usd"}`` (all GPUs), or None when
    ``pr`` has no GPU price. Raises ValueError for ``gpus < 1``."""
    if int(gpus) < 1:
        raise ValueError(f"gpus {gpus!r}: expected >= 1")
    if pr.gpu_usd is None:
        return None
    n = int(gpus)
    parts = {"gpu_usd": n * pr.gpu_usd,
             "dimm_usd": n * plat.host_bytes / 2**30 * pr.dram_usd_per_gib,
             "nme_usd": n * plat.n_ranks * pr.nme_usd if system in NMP_SYSTEMS else 0.0}
    return {**parts, "total_usd": sum(parts.values())}


def video_cost(latency_s: float, energy_j: float, capital: dict | None, pr: Prices) -> dict:
    """Cost of one video, USD: the capital (:func:`machine_capital`) amortised over the
    generation's ``latency_s`` at ``pr.utilisation`` of ``pr.lifetime_years``, plus
    ``energy_j`` at ``pr.usd_per_kwh``.

    Returns ``{"usd", "capital_usd", "energy_usd", "gpu_usd", "dimm_usd", "nme_usd",
    "machine_usd"}`` (``gpu_usd``, ``dimm_usd``, ``nme_usd``: the capital part split by the
    parts of the machine; ``machine_usd``: the machine's purchase price), or ``{"usd": None,
    "reason"}`` without a GPU price. Raises ValueError for a negative or non-finite latency
    or energy."""
    for name, v in (("latency_s", latency_s), ("energy_j", energy_j)):
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"{name} {v!r}: expected a finite number >= 0")
    if capital is None:
        return {"usd": None, "reason": f"no price of the {pr.gpu} GPU (give --price-gpu)"}
    share = latency_s / (pr.lifetime_s * pr.utilisation)
    parts = {k: capital[k] * share for k in ("gpu_usd", "dimm_usd", "nme_usd")}
    energy_usd = energy_j / 3.6e6 * pr.usd_per_kwh
    cap = sum(parts.values())
    return {"usd": cap + energy_usd, "capital_usd": cap, "energy_usd": energy_usd, **parts,
            "machine_usd": capital["total_usd"]}


def serving_cost(capital: dict | None, span_s: float, energy_j: float, videos: int,
                 pr: Prices) -> dict:
    """Cost per served video of a serving simulation, USD: the cluster's capital
    (:func:`machine_capital` of all its GPUs) over the simulated ``span_s`` (first arrival to
    last completion: idle time is paid for, so the utilisation is the simulation's, not
    ``pr.utilisation``), plus ``energy_j`` (the cluster's over the span) at
    ``pr.usd_per_kwh``, divided by the ``videos`` served.

    Returns ``{"usd", "capital_usd", "energy_usd"}`` per video, or ``{"usd": None,
    "reason"}`` without a GPU price. Raises ValueError for ``videos < 1`` or a negative
    span or energy."""
    if int(videos) < 1:
        raise ValueError(f"videos {videos!r}: expected >= 1")
    for name, v in (("span_s", span_s), ("energy_j", energy_j)):
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"{name} {v!r}: expected a finite number >= 0")
    if capital is None:
        return {"usd": None, "reason": f"no price of the {pr.gpu} GPU (give --price-gpu)"}
    cap = capital["total_usd"] * span_s / pr.lifetime_s / videos
    energy_usd = energy_j / 3.6e6 * pr.usd_per_kwh / videos
    return {"usd": cap + energy_usd, "capital_usd": cap, "energy_usd": energy_usd}


@dataclass(frozen=True)
class PriceConfig:
    """The price options of ``coda sim`` and ``coda serve`` (their configs derive from it,
    as the NME commands' from :class:`coda.hw.verilog.NMEUnitsConfig`): each None unless
    given, then replacing this module's sourced constant (:func:`prices`)."""
    price_gpu: float = option(None, "purchase price of one GPU", group="cost per video", type=float, unit="USD",
                              default_text="the --platform preset's (coda.host.system."
                              "prices.GPU_PRICES, with sources)")
    price_dram_gb: float = option(None, "host DIMMs, per GiB", group="cost per video", type=float, unit="USD",
                                  default_text=f"{DRAM_USD_PER_GIB:.2f}, "
                                  "coda.host.system.prices.SOURCES")
    price_nme: float = option(None, "one NME (one per rank, systems d-g)", group="cost per video", type=float,
                              unit="USD", default_text=f"{NME_USD:.3f}, its silicon: "
                              "coda.host.system.prices.SOURCES")
    usd_per_kwh: float = option(None, "electricity", group="cost per video", type=float, unit="USD/kWh",
                                default_text=f"{USD_PER_KWH:.4f}, "
                                "coda.host.system.prices.SOURCES")
    lifetime_years: float = option(None, "working life the machine's price is amortised "
                                   "over", group="cost per video", type=float, unit="years",
                                   default_text=f"{LIFETIME_YEARS:g}, "
                                   "coda.host.system.prices.SOURCES")

    def price_options(self) -> dict:
        """The price options as :func:`prices`' keywords."""
        return {k: getattr(self, k) for k in ("price_gpu", "price_dram_gb", "price_nme",
                                              "usd_per_kwh", "lifetime_years")}
