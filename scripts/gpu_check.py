#!/usr/bin/env python3
"""The GPU check of the system model in one call, for a GPU machine that may have no package
index and another torch than the project's pin (scripts/README.md says how to run it there).

Before anything of the project is imported, with the standard library alone:

1. wheels carried in ``--wheels DIR`` (default ``.whl/`` at the repository root, when it
   holds any) are installed into a private folder (pip, ``--no-index --no-deps``) that goes
   first on ``sys.path``;
2. the versions are checked: Python >= 3.11; torch, diffusers (exactly the 0.42.1 the cache
   engine's adapters replay), numpy, simpy, amaranth, rich, jsonschema importable. What was
   found is printed; a missing or wrong package ends the run with one line saying which and
   how to bring it (exit 3);
3. without an installed ``coda`` (``pip install -e .``), the repository is put on the path
   and ``coda``'s sub-packages mapped onto its folders as pyproject.toml maps them.

Then :func:`coda.experiments.gpu_check.main` runs with the remaining options (``--help``
lists them): calibrate, full compute, cached generation, coda sim a and b for the H200
preset, roofline and calibrated; ``OUT/gpu_check.json``, ``OUT/gpu_check.txt``,
``OUT/gpu_table.json``.

Example (a GPU machine): ``python3 scripts/gpu_check.py --out $OUT``; a smaller size:
``python3 scripts/gpu_check.py --resolution 832x480 --frames 33 --steps 4 --out $OUT``; on a
CPU (the test): ``python3 scripts/gpu_check.py --device cpu --resolution 32x32 --frames 5
--layers 2 --steps 3 --out DIR``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (module, version required or None): what the check imports
NEEDS = (("torch", None), ("diffusers", "0.42.1"), ("numpy", None), ("simpy", None),
         ("amaranth", None), ("rich", None), ("jsonschema", None))


def _package_dirs() -> tuple[str, ...]:
    """The folders of coda's top-level sub-packages (coda.hw -> hw, ...), read from
    pyproject.toml's [tool.setuptools.package-dir], the one place that maps them."""
    import re

    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib      # Python 3.11+; the device's Python may be older
        mapping = tomllib.loads(text)["tool"]["setuptools"]["package-dir"]
    except ImportError:
        section = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
        mapping = dict(re.findall(r'^"([\w.]+)"\s*=\s*"([^"]+)"', section, re.M))
    return tuple(folder for name, folder in mapping.items() if name.count(".") == 1)


#: coda's sub-packages' folders
PACKAGE_DIRS = _package_dirs()


def install_wheels(folder: Path) -> None:
    """pip-install every ``*.whl`` of ``folder`` (no index, no dependencies) into a
    temporary folder put first on ``sys.path``; nothing if it holds none."""
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if not wheels:
        return
    target = Path(tempfile.mkdtemp(prefix="coda-wheels-"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--target", str(target),
                    *map(str, wheels)], check=True)
    sys.path.insert(0, str(target))
    print(f"installed {len(wheels)} wheels from {folder} into {target}")


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def check_versions() -> list[str]:
    """Print what is installed; return the problems (empty: all there)."""
    problems = []
    if sys.version_info < (3, 11):
        problems.append(f"Python {sys.version.split()[0]}: expected >= 3.11")
    print(f"python {sys.version.split()[0]} ({sys.executable})")
    for name, want in NEEDS:
        try:
            mod = importlib.import_module(name)
        except Exception as exc:          # ImportError, or a broken install
            print(f"{name}: missing ({type(exc).__name__}: {exc})")
            problems.append(f"{name} is not importable")
            continue
        with warnings.catch_warnings():     # jsonschema deprecates its __version__
            warnings.simplefilter("ignore", DeprecationWarning)
            have = getattr(mod, "__version__", None) or _dist_version(name)
        print(f"{name} {have}")
        if want is not None and have != want:
            problems.append(f"{name} {have}: expected {want}")
    if not problems:
        import torch

        cuda = torch.cuda.is_available()
        print(f"torch CUDA {torch.version.cuda}, device: "
              f"{torch.cuda.get_device_name() if cuda else 'none (CPU only)'}")
    return problems


def import_coda():
    """``coda.experiments.gpu_check``, from the installed package or from this checkout."""
    try:
        return importlib.import_module("coda.experiments.gpu_check")
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT))
    for name in [m for m in sys.modules if m == "coda" or m.startswith("coda.")]:
        del sys.modules[name]
    import coda

    coda.__path__.append(str(ROOT))   # coda.hw -> ROOT/hw, ... (PACKAGE_DIRS)
    missing = [d for d in PACKAGE_DIRS if not (ROOT / d / "__init__.py").is_file()]
    if missing:
        raise SystemExit(f"gpu_check: error: {ROOT} lacks the package folders {missing}")
    return importlib.import_module("coda.experiments.gpu_check")


def main(argv: list[str]) -> int:
    wheels = ROOT / ".whl"
    if "--wheels" in argv:
        i = argv.index("--wheels")
        if i + 1 >= len(argv):
            print("gpu_check: error: --wheels needs a folder", file=sys.stderr)
            return 2
        wheels = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    install_wheels(wheels)
    problems = check_versions()
    if problems:
        print("gpu_check: error: " + "; ".join(problems) + " (carry the wheels: "
              "scripts/README.md)", file=sys.stderr)
        return 3
    return import_coda().main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
