"""The documentation site builds strictly (`make docs`): every page of the nav exists, every
link and anchor resolves, every API reference (`::: coda.…`) names a module that loads. And
the README, the front door, stays short and points only at files the repository has."""

from __future__ import annotations

import re
import shutil
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    # not --quiet: it drops the warnings before --strict can count them
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
         "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})   # mkdocs-material's banner


def test_docs_build_strictly():
    site = ROOT / "build" / "docs"
    proc = _build(ROOT / "mkdocs.yml", site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("index.html", "design/index.html", "results/index.html",
                 "api/host/index.html"):
        assert (site / page).is_file(), page
    # the API pages are rendered from the docstrings, not left as `::: name`
    api = (site / "api" / "host" / "index.html").read_text()
    assert "apply_coda_cache" in api and ":::" not in api


def test_docs_build_fails_on_a_broken_link(tmp_path):
    """The strict build is really strict: the same configuration with one link to a page
    that does not exist fails (a copy of docs/, built without mkdocstrings for speed)."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    config = (ROOT / "mkdocs.yml").read_text()
    config = re.sub(r"  - mkdocstrings:.*?\n(?=nav:)", "", config, flags=re.S)
    config = config.replace("hooks:\n  - docs/hooks.py\n", "")
    assert "mkdocstrings" not in config and "hooks.py\n" not in config.split("exclude_docs")[0]
    (tmp_path / "mkdocs.yml").write_text(config)
    assert _build(tmp_path / "mkdocs.yml", tmp_path / "site").returncode == 0
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [nothing](no-such-page.md).\n")
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0 and "no-such-page.md" in proc.stdout + proc.stderr


def test_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "make demo" in readme and "make test" in readme
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in link:
            assert (ROOT / link).exists(), link


def test_no_reference_to_files_outside_the_repository():
    """The design the code cites is docs/design.md, not a file a clone does not have."""
    # the patterns are spelled in pieces so that this file does not match them itself
    patterns = ["." * 2 + "/shared", "DESIGN" + ".md", "SYSTEM" + ".md"]
    args = [a for p in patterns for a in ("-e", p)]
    out = subprocess.run(["git", "grep", "-n", "-I", "-F", *args],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode > 1:
        pytest.skip("not a git checkout")
    assert out.stdout == ""
