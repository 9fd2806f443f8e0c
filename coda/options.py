"""One source of defaults per command: a frozen dataclass holds every option of a command
with its default, unit and source; the command's argparse options are built from it, and
its library functions take it (or read their defaults from it).

A field is declared with :func:`option`::

    @dataclass(frozen=True)
    class SimConfig:
        steps: int = option(50, "denoising steps", unit="steps")
        dram: str = option(DEFAULT_STANDARD, "host DIMMs", source="JESD79-5 ...")

:func:`add_options` adds ``--steps``, ``--dram`` (underscores become dashes) with the
field's type, default and a help text that names the default, the unit and the source;
:func:`from_args` turns the parsed namespace back into the dataclass. ``type`` is taken
from the default (``int``, ``float``, ``str``; ``bool`` becomes a ``store_true`` flag) or
given (a default of None needs it). This module imports nothing of the project, so every
layer may use it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Sequence

__all__ = ["option", "add_options", "from_args", "defaults"]

_META = "coda_option"


def option(default: Any, help: str, *, unit: str | None = None, source: str | None = None,
           type: Callable | None = None, choices: Sequence | None = None,
           metavar: str | None = None, flag: str | None = None,
           default_text: str | None = None, required: bool = False,
           group: str | None = None) -> Any:
    """A dataclass field that is also a command-line option.

    Args:
        default: the default value (immutable: a number, a string, a tuple, None).
        help: what the option sets, without its default (added from ``default``).
        unit: the unit of the value (``"words"``, ``"MHz"``, ``"steps"``...), shown in the help.
        source: where the default comes from (a JEDEC table, a paper, a measurement).
        type: the argparse type; default ``type(default)`` (required when default is None).
        choices, metavar: as in argparse. flag: the option's name if not ``--field-name``.
        default_text: how the help shows the default when None or a sentinel stands for a
            rule (e.g. ``"the DRAM command clock"``).
        required: the command line must give it (``default`` must then be None).
        group: the title of the argparse argument group the option is listed under.
    Raises ValueError for a None default without ``type``, a mutable default, or a required
    option with a default.
    """
    if required and default is not None:
        raise ValueError(f"option {help!r}: a required option has no default ({default!r})")
    if default is None and type is None:
        raise ValueError(f"option {help!r}: a None default needs type=")
    if isinstance(default, (list, dict, set)):
        raise ValueError(f"option {help!r}: default {default!r} is mutable; use a tuple")
    meta = {"help": help, "unit": unit, "source": source, "type": type, "choices": choices,
            "metavar": metavar, "flag": flag, "default_text": default_text,
            "required": required, "group": group}
    return dataclasses.field(default=default, metadata={_META: meta})


def _fields(config_cls) -> list[tuple[dataclasses.Field, dict]]:
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r}: expected a dataclass of options")
    return [(f, f.metadata[_META]) for f in dataclasses.fields(config_cls) if _META in f.metadata]


def _help(f: dataclasses.Field, meta: dict) -> str:
    if meta["required"]:
        unit = f", {meta['unit']}" if meta["unit"] else ""
        return (f"{meta['help']} (required{unit})").replace("%", "%%")
    shown = meta["default_text"] or ("off" if f.default is False else
                                     "none" if f.default in (None, "") else f"{f.default}")
    unit = f", in {meta['unit']}" if meta["unit"] and meta["default_text"] is None else ""
    text = f"{meta['help']} (default {shown}{unit}"
    if meta["source"]:
        text += f"; {meta['source']}"
    return (text + ")").replace("%", "%%")


def add_options(parser: argparse.ArgumentParser, config_cls, *,
                skip: Sequence[str] = ()) -> None:
    """Add one option per :func:`option` field of ``config_cls`` (a dataclass) to ``parser``,
    in field order, except the fields named in ``skip``; an option with a ``group`` is listed
    under that argument group."""
    groups: dict[str, Any] = {}
    for f, meta in _fields(config_cls):
        if f.name in skip:
            continue
        holder = parser
        if meta["group"]:
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_argument_group(meta["group"])
            holder = groups[meta["group"]]
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        kw: dict[str, Any] = {"dest": f.name, "default": f.default, "help": _help(f, meta)}
        if meta["required"]:
            kw["required"] = True
        if isinstance(f.default, bool) and meta["type"] is None:
            kw["action"] = "store_true"
        else:
            kw["type"] = meta["type"] or type(f.default)
            for key in ("choices", "metavar"):
                if meta[key] is not None:
                    kw[key] = meta[key]
        holder.add_argument(flag, **kw)


def from_args(config_cls, args: argparse.Namespace, **overrides):
    """``config_cls`` from the parsed ``args`` (every :func:`option` field; a field missing
    from ``args`` keeps its default), then ``overrides``."""
    values = {f.name: getattr(args, f.name) for f, _ in _fields(config_cls)
              if hasattr(args, f.name)}
    return config_cls(**{**values, **overrides})


def defaults(config_cls) -> dict[str, Any]:
    """Every option field's default, by field name."""
    return {f.name: f.default for f, _ in _fields(config_cls)}
