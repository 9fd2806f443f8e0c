"""Result records (coda.results): written only where CODA_RECORD_DIR says, read back exactly,
rendered into a page's markers; bad names, figures, pictures and markers refused."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from coda.results import RECORD_ENV, RecordError, load_record, machine, record, render

WHEN = datetime(2026, 12, 7, 5, 0, tzinfo=timezone.utc)
DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_nothing_is_written_without_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert record("demo", "t", {"a": 1}) is None
    assert list(tmp_path.iterdir()) == []


def test_a_record_is_read_back_exactly_and_rendered(tmp_path, monkeypatch):
    picture = tmp_path / "grid.png"
    picture.write_bytes(b"\x89PNG fake")
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "records"))
    figures = {"PSNR (dB)": 47.48, "operators skipped": 0.5, "segments": 3160,
               "bit-exact": True, "model": "digits"}
    path = record("demo", "make demo", figures, pictures={"the grid": picture},
                  command="coda run --out out", when=WHEN)
    body = json.loads(path.read_text())
    assert body["figures"] == [[k, v] for k, v in figures.items()]
    assert body["date"] == "2026-12-07" and body["machine"] == machine()
    assert body["pictures"] == [["the grid", "img/demo-0.png"]]
    assert (tmp_path / "records" / "img" / "demo-0.png").read_bytes() == picture.read_bytes()
    assert load_record(tmp_path / "records", "demo") == body

    page = "# Results\n\n<!-- record: demo -->\n\nafter\n"
    out = render(page, tmp_path / "records", prefix="../records/")
    assert out.startswith("# Results\n\n*Measured with `coda run --out out` on 2026-12-07, ")
    assert "| PSNR (dB) | 47.48 |" in out and "| segments | 3,160 |" in out
    assert "| bit-exact | True |" in out and "| model | digits |" in out
    assert "![the grid](../records/img/demo-0.png)" in out and out.endswith("\nafter\n")
    assert render("no marker\n", tmp_path) == "no marker\n"


@pytest.mark.parametrize("name", ["", "Demo", "-x", "a/b", "x" * 65, 3])
def test_bad_names_are_refused(name, tmp_path, monkeypatch):
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    with pytest.raises(RecordError, match="record name"):
        record(name, "t", {})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None, [1], {"a": 1}])
def test_bad_figures_are_refused(value, tmp_path, monkeypatch):
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    with pytest.raises(RecordError, match="expected a finite number, a string or a bool"):
        record("x", "t", {"f": value})
    assert list(tmp_path.iterdir()) == []


def test_a_missing_picture_or_record_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    with pytest.raises(RecordError, match="no such file"):
        record("x", "t", {}, pictures={"p": tmp_path / "none.png"})
    with pytest.raises(RecordError, match="record gone: no .*gone.json"):
        render("<!-- record: gone -->\n", tmp_path)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(RecordError, match="record bad: .* has keys list"):
        load_record(tmp_path, "bad")


def test_every_marker_in_the_docs_has_its_record():
    import re

    for page in DOCS.rglob("*.md"):
        for name in re.findall(r"^<!-- record: ([^ ]+) -->$", page.read_text(), re.M):
            load_record(DOCS / "records", name)
