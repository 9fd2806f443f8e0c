"""mkdocs hooks: make `coda.*` visible to the API reference's static analysis, and render the
result records (`<!-- record: NAME -->` lines: :mod:`coda.results`) into the pages.

The package `coda` is spread over the repository's top-level folders (pyproject.toml's
`[tool.setuptools.package-dir]`: coda.hw = hw/, coda.host = host/, ...), which a search of
`coda/` alone cannot see. Before the build this lays out build/docs-api/coda/ as symbolic links
to those folders, read from pyproject.toml, and mkdocstrings searches there first
(`paths: [build/docs-api]` in mkdocs.yml). Nothing is imported.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "docs-api"


def on_startup(**kwargs) -> None:
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    top = TREE / "coda"
    top.mkdir(parents=True)
    for entry in (ROOT / package_dir["coda"]).iterdir():       # coda/__init__.py, cli/, ...
        (top / entry.name).symlink_to(entry)
    for name, folder in package_dir.items():
        parts = name.split(".")
        if len(parts) != 2:                     # coda itself; coda.host.model lies inside host/
            continue
        link = top / parts[1]
        if not link.exists():
            link.symlink_to(ROOT / folder, target_is_directory=True)


def on_page_markdown(markdown, page, **kwargs):
    """Each `<!-- record: NAME -->` line -> docs/records/NAME.json's figures and pictures
    (:func:`coda.results.render`); a marker without its record fails the build."""
    from coda.results import render

    depth = page.file.src_uri.count("/")
    return render(markdown, ROOT / "docs" / "records", prefix="../" * depth + "records/")
