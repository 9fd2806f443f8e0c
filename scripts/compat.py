#!/usr/bin/env python3
"""The cache engine's adapter tests on several diffusers releases (``make compat``).

For each version V (default :data:`VERSIONS`: each has LatteTransformer3DModel,
CogVideoXTransformer3DModel, WanTransformer3DModel and HunyuanVideoTransformer3DModel, and the
``cache_context`` API the engine reads; an older release is refused by the engine in one line,
``coda.host.cache.arch.base.check_diffusers_api``), one at a time:

1. a virtualenv ``OUT/V/venv`` with the project's pinned requirements (pyproject.toml) except
   diffusers, ``diffusers==V`` with whatever it needs, and the project itself
   (``pip install --no-deps -e .``); torch is pinned to the exact build of the project's
   ``.venv`` (the CPU wheel on disk), so a release that asks for another torch fails to
   install instead of fetching one. A venv whose requirements are unchanged is reused
   (``OUT/V/installed`` holds them);
2. ``pytest -q -p no:xdist`` of :data:`TESTS` there (``OUT/V/pytest.log``,
   ``OUT/V/junit.xml``).

``OUT/results.json``: per version ``status`` (``passed``, ``failed``, ``install failed``),
the ``passed`` / ``failed`` / ``errors`` / ``skipped`` counts, the failed tests, ``seconds``
and when it ``finished`` (UTC); versions of earlier runs stay in it.
Exit status 1 when any version did not pass, 2 for bad options.

Example: ``.venv/bin/python scripts/compat.py`` (what ``make compat`` runs);
``.venv/bin/python scripts/compat.py --versions 0.38.0 --out build/compat``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: diffusers releases checked by default: those with the four transformer classes and the
#: cache-context API the engine reads (CacheContext, from 0.41.0), the pinned one last
VERSIONS = ("0.41.0", "0.42.0", "0.42.1")
#: the adapter tests: every architecture's battery, the pipelines end to end
TESTS = ("tests/host/cache/test_arch_adapters.py", "tests/host/cache/test_pipeline_api.py")


def pinned_requirements(version: str, torch_version: str) -> list[str]:
    """pyproject.toml's dependencies with diffusers replaced by ``diffusers==version`` and
    torch by ``torch==torch_version``."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        name = re.split(r"[\s=<>!~\[;]", dep, maxsplit=1)[0].lower()
        if name == "diffusers":
            continue
        out.append(f"torch=={torch_version}" if name == "torch" else dep)
    return out + [f"diffusers=={version}"]


def project_torch() -> str:
    """The torch version of the project's ``.venv`` (e.g. ``2.13.0+cpu``)."""
    python = ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        sys.exit("compat: error: the project's .venv is missing: run `make venv` first")
    return subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                          check=True, capture_output=True, text=True).stdout.strip()


def install(version: str, folder: Path, torch_version: str, log) -> bool:
    """Make (or reuse) the version's virtualenv; False if pip failed (see the log)."""
    venv, stamp = folder / "venv", folder / "installed"
    reqs = pinned_requirements(version, torch_version)
    if stamp.exists() and stamp.read_text() == "\n".join(reqs):
        return True
    stamp.unlink(missing_ok=True)
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(venv / "bin" / "pip"), "install", "--no-compile", "--only-binary", "torch",
              *reqs],
             [str(venv / "bin" / "pip"), "install", "--no-compile", "--no-deps", "-e", str(ROOT)]]
    for cmd in steps:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode:
            return False
    stamp.write_text("\n".join(reqs))
    return True


def counts(junit: Path) -> dict:
    """passed / failed / errors / skipped and the failed tests' ids of a junit file."""
    out = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
        key = {"failure": "failed", "error": "errors", "skipped": "skipped"}.get(kind, "passed")
        out[key] += 1
        if kind in ("failure", "error"):
            out["failures"].append(f"{case.get('classname')}::{case.get('name')}")
    return out


def check(version: str, out: Path, torch_version: str, tests: list[str]) -> dict:
    folder = out / version
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(folder / "install.log", "w") as log:
        ok = install(version, folder, torch_version, log)
    if not ok:
        return {"status": "install failed", "log": str(folder / "install.log"),
                "seconds": round(time.monotonic() - start)}
    junit = folder / "junit.xml"
    junit.unlink(missing_ok=True)
    with open(folder / "pytest.log", "w") as log:
        rc = subprocess.run([str(folder / "venv" / "bin" / "python"), "-m", "pytest", "-q",
                             "-p", "no:xdist", "-p", "no:cacheprovider", f"--junitxml={junit}",
                             *tests], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    result = counts(junit)
    passed = rc == 0 and result["passed"] > 0
    return {"status": "passed" if passed else "failed", **result, "pytest_exit": rc,
            "log": str(folder / "pytest.log"), "seconds": round(time.monotonic() - start)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="compat", description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default=",".join(VERSIONS),
                    help="diffusers versions, comma-separated (default %(default)s)")
    ap.add_argument("--out", default="build/compat", help="folder of the venvs and results")
    ap.add_argument("--tests", default=",".join(TESTS), help="test files (default %(default)s)")
    args = ap.parse_args(argv)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    bad = [v for v in versions if not re.fullmatch(r"\d+\.\d+\.\d+", v)]
    if not versions or bad:
        ap.error(f"--versions {args.versions!r}: expected releases such as 0.38.0")
    out = Path(args.out)
    if not out.is_absolute():
        out = ROOT / out
    torch_version = project_torch()
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for version in versions:
        print(f"compat: diffusers {version} ...", flush=True)
        results[version] = check(version, out, torch_version,
                                 [t for t in args.tests.split(",") if t])
        results[version]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        r = results[version]
        print(f"compat: diffusers {version}: {r['status']}"
              + (f", {r['passed']} passed, {r['failed']} failed, {r['errors']} errors, "
                 f"{r['skipped']} skipped" if "passed" in r else f" ({r['log']})")
              + f", {r['seconds']} s", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0 if all(results[v]["status"] == "passed" for v in versions) else 1


if __name__ == "__main__":
    sys.exit(main())
