"""Result records: what a command measured, how and where, kept where the docs read it.

A command whose figures the docs quote ends with :func:`record`: a name, the figures
(label -> value, JSON numbers or strings), the command line, the date (UTC), the machine
(:func:`machine`) and the pictures it drew. Records are written only when the environment
variable ``CODA_RECORD_DIR`` names a folder (``make demo``, ``make eval`` and ``make bench``
set it to ``docs/records``); tests and ad-hoc runs write none. The docs build replaces each
``<!-- record: NAME -->`` line of a page by the record's table and pictures
(``docs/hooks.py``, :func:`render`), so a page shows the figures of the last run and cannot
drift from it; a marker without its record fails the build.

Files: ``DIR/NAME.json`` and ``DIR/img/NAME-<picture>`` (copies of the pictures).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

from coda.jsonout import json_text
from coda.paths import write_file

__all__ = ["record", "render", "load_record", "machine", "cpu_model", "RECORD_ENV",
           "RecordError"]

#: the environment variable naming the folder records are written to (unset: none written)
RECORD_ENV = "CODA_RECORD_DIR"
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_MARKER = re.compile(r"^<!-- record: ([^ ]+) -->$", re.M)


class RecordError(ValueError):
    """A bad record name, figure or picture, or a marker without its record."""


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` prints it (``/proc/cpuinfo``), or "" where there is
    no such file."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine() -> str:
    """The machine a figure was measured on: the CPU's model name and its logical CPUs,
    e.g. ``"<model name>, 2 CPUs"``."""
    name = cpu_model() or platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} CPUs"


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RecordError(f"record name {name!r}: expected 1-64 characters a-z, 0-9 and -, "
                          "starting with a letter or digit")
    return name


def record(name: str, title: str, figures: dict, *, pictures: dict | None = None,
           command: str | None = None, when: datetime | None = None) -> Path | None:
    """Write the record ``name`` if ``CODA_RECORD_DIR`` is set; None (nothing written) if not.

    Args:
        name: the record's file stem (a-z, 0-9, -), the docs' marker name.
        title: one line saying what was measured.
        figures: label -> value (int, float, str or bool; units belong in the label).
        pictures: caption -> path of a picture the command wrote (PNG or GIF), copied.
        command: the command line (default: this process's, ``coda ...``).
        when: the time of the measurement (default: now, UTC); the record keeps the date.
    Returns:
        The JSON file written, or None.
    Raises:
        RecordError: a bad name, a figure that is not a number, string or bool (or not
            finite), a picture that is not a file.
    """
    folder = os.environ.get(RECORD_ENV)
    _check_name(name)
    rows = []
    for label, value in figures.items():
        ok = isinstance(value, (bool, int, str)) or (isinstance(value, float)
                                                     and value == value and abs(value) != float("inf"))
        if not ok:
            raise RecordError(f"record {name}: figure {label!r} = {value!r}; expected a finite "
                              "number, a string or a bool")
        rows.append([str(label), value])
    pictures = dict(pictures or {})
    for caption, path in pictures.items():
        if not Path(path).is_file():
            raise RecordError(f"record {name}: picture {caption!r} at {path}: no such file")
    if not folder:
        return None
    out = Path(folder)
    images = []
    for i, (caption, path) in enumerate(pictures.items()):
        target = out / "img" / f"{name}-{i}{Path(path).suffix.lower()}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        images.append([str(caption), f"img/{target.name}"])
    argv = [Path(sys.argv[0]).name] + sys.argv[1:]
    body = {"name": name, "title": title,
            "command": command or " ".join(shlex.quote(a) for a in argv),
            "date": (when or datetime.now(timezone.utc)).strftime("%Y-%m-%d"),
            "machine": machine(), "figures": rows, "pictures": images}
    path = out / f"{name}.json"
    write_file(path, json_text(body, indent=2) + "\n")
    return path


def load_record(folder: str | Path, name: str) -> dict:
    """The record ``name`` of ``folder``. RecordError if there is none or it is not one."""
    import json

    path = Path(folder) / f"{_check_name(name)}.json"
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"record {name}: no {path}; expected one written by the command "
                          f"that measures it (with {RECORD_ENV} set)") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"record {name}: {path} is not a record ({exc})") from None
    keys = {"name", "title", "command", "date", "machine", "figures", "pictures"}
    if not isinstance(body, dict) or set(body) != keys:
        raise RecordError(f"record {name}: {path} has keys "
                          f"{sorted(body) if isinstance(body, dict) else type(body).__name__}, "
                          f"expected {sorted(keys)}")
    return body


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def render(markdown: str, folder: str | Path, prefix: str = "records/") -> str:
    """``markdown`` with each ``<!-- record: NAME -->`` line replaced by the record's
    provenance line, its figures as a table and its pictures (paths ``prefix`` + the
    record's, relative to the page). RecordError for a marker without its record."""
    def one(m):
        body = load_record(folder, m.group(1))
        lines = [f"*Measured with `{body['command']}` on {body['date']}, {body['machine']}.*",
                 "", "| figure | value |", "|---|---|"]
        lines += [f"| {label} | {_cell(value)} |" for label, value in body["figures"]]
        for caption, path in body["pictures"]:
            lines += ["", f"![{caption}]({prefix}{path})", "", f"*{caption}*"]
        return "\n".join(lines)
    return _MARKER.sub(one, markdown)
