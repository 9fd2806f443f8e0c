"""One source of defaults per command: a frozen dataclass holds every option of a command
with its default, unit and source; the command's argparse options are built from it, and
its library functions take it (or read their defaults from it).

A field is declared with :func:`option` (an example in its docstring).
:func:`add_options` adds the options (``--steps``, ``--dram``: underscores become dashes)
with the field's type, default and a help text naming the default, the unit and the
source; :func:`from_args` turns the parsed namespace back into the dataclass; :func:`given`
says whether the command line gave an option (also at its default), so that a command can
refuse an option that would do nothing instead of ignoring it. How ``type``, ``nargs``,
positionals and exclusive sets are given: :func:`option`. This module imports nothing of the
project, so every layer may use it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Sequence

__all__ = ["option", "add_options", "from_args", "defaults", "given"]

_META = "coda_option"
#: the namespace attribute holding the dests of the options the command line gave
_GIVEN = "_coda_given"


def option(default: Any, help: str, *, unit: str | None = None, source: str | None = None,
           type: Callable | None = None, choices: Sequence | None = None,
           metavar: str | None = None, flag: str | tuple[str, ...] | None = None,
           default_text: str | None = None, required: bool = False,
           group: str | None = None, nargs: int | str | None = None,
           action: str | None = None, positional: bool = False,
           exclusive: str | None = None) -> Any:
    """A dataclass field that is also a command-line option.

    For example::

        @dataclass(frozen=True)
        class SimConfig:
            steps: int = option(50, "denoising steps", unit="steps")
            dram: str = option(DEFAULT_STANDARD, "host DIMMs", source="JESD79-5 ...")

    ``type`` is taken
    from the default (``int``, ``float``, ``str``; ``bool`` becomes a ``store_true`` flag; a
    tuple's items' type for ``nargs`` / ``action="append"``) or given (a default of None or ``()``
    needs it). Beyond plain ``--name VALUE`` options a field may be a positional argument
    (``positional=True``), take several values (``nargs``), be repeatable (``action="append"``),
    have more than one flag (``flag=("-o", "--output")``) or be one of a mutually exclusive set
    (``exclusive=``).

    Args:
        default: the default value (immutable: a number, a string, a tuple, None).
        help: what the option sets, without its default (added from ``default``).
        unit: the unit of the value (``"words"``, ``"MHz"``, ``"steps"``...), shown in the help.
        source: where the default comes from (a JEDEC table, a paper, a measurement).
        type: the argparse type; default ``type(default)`` (required when default is None).
        choices, metavar: as in argparse. flag: the option's name if not ``--field-name``, or
            a tuple of its names (``("-o", "--output")``).
        default_text: how the help shows the default when None or a sentinel stands for a
            rule (e.g. ``"the DRAM command clock"``).
        required: the command line must give it (``default`` must then be None); for an
            ``exclusive`` option: one option of its set must be given.
        group: the title of the argparse argument group the option is listed under.
        nargs: as in argparse (``"+"``, ``"*"``, ``"?"``, a count); the default is a tuple
            (the parsed values, a list in the namespace, become a tuple in the dataclass).
        action: ``"append"``: a repeatable option collecting its values (default a tuple,
            usually ``()``; ``type=`` needed when it is empty).
        positional: a positional argument named after the field (no ``--``).
        exclusive: the name of a mutually exclusive set: at most one option of the set may be
            given (one must be, where they are ``required``).
    Raises ValueError for a None (or empty) default without ``type``, a mutable default, a
    required option with a default, an unknown ``action``, a list option whose default is
    not a tuple, or a positional with a flag or in an exclusive set.
    """
    if required and default is not None:
        raise ValueError(f"option {help!r}: a required option has no default ({default!r})")
    if type is None and (default is None or default == ()):
        raise ValueError(f"option {help!r}: a None default (or an empty tuple) needs type=")
    if isinstance(default, (list, dict, set)):
        raise ValueError(f"option {help!r}: default {default!r} is mutable; use a tuple")
    if action not in (None, "append"):
        raise ValueError(f"option {help!r}: action {action!r}: expected None or 'append'")
    if (nargs is not None or action) and not (default is None or isinstance(default, tuple)):
        raise ValueError(f"option {help!r}: a list option's default {default!r} must be a "
                         "tuple (or None)")
    if positional and (flag is not None or exclusive is not None):
        raise ValueError(f"option {help!r}: a positional argument has no flag and is in no "
                         "exclusive set")
    meta = {"help": help, "unit": unit, "source": source, "type": type, "choices": choices,
            "metavar": metavar, "flag": flag, "default_text": default_text,
            "required": required, "group": group, "nargs": nargs, "action": action,
            "positional": positional, "exclusive": exclusive}
    return dataclasses.field(default=default, metadata={_META: meta})


def _fields(config_cls) -> list[tuple[dataclasses.Field, dict]]:
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r}: expected a dataclass of options")
    return [(f, f.metadata[_META]) for f in dataclasses.fields(config_cls) if _META in f.metadata]


def _flags(f: dataclasses.Field, meta: dict) -> tuple[str, ...]:
    """The option's names on the command line (a positional's: its field name)."""
    if meta["positional"]:
        return (f.name,)
    flag = meta["flag"] or "--" + f.name.replace("_", "-")
    return (flag,) if isinstance(flag, str) else tuple(flag)


def _help(f: dataclasses.Field, meta: dict, exclusive: Sequence[str] = ()) -> str:
    if meta["required"]:
        unit = f"in {meta['unit']}" if meta["unit"] else ""
        if meta["positional"]:
            return (f"{meta['help']}{f' ({unit})' if unit else ''}").replace("%", "%%")
        need = f"required: one of {', '.join(exclusive)}" if meta["exclusive"] else "required"
        return (f"{meta['help']} ({need}{'; ' + unit if unit else ''})").replace("%", "%%")
    shown = meta["default_text"] or (
        "off" if f.default is False else "none" if f.default in (None, "", ()) else
        " ".join(map(str, f.default)) if isinstance(f.default, tuple) and meta["nargs"]
        else f"{f.default}")
    unit = f", in {meta['unit']}" if meta["unit"] and meta["default_text"] is None else ""
    text = f"{meta['help']} (default {shown}{unit}"
    if meta["source"]:
        text += f"; {meta['source']}"
    return (text + ")").replace("%", "%%")


def add_options(parser: argparse.ArgumentParser, config_cls, *,
                skip: Sequence[str] = ()) -> None:
    """Add one option per :func:`option` field of ``config_cls`` (a dataclass) to ``parser``,
    in field order, except the fields named in ``skip``; an option with a ``group`` is listed
    under that argument group, the options of one ``exclusive`` set in one argparse mutually
    exclusive group (required if any of them is). A list option's (``nargs``, ``append``)
    tuple default reaches argparse as a list, as argparse's own list options have."""
    fields = [(f, meta) for f, meta in _fields(config_cls) if f.name not in skip]
    sets: dict[str, list[str]] = {}
    for f, meta in fields:
        if meta["exclusive"]:
            sets.setdefault(meta["exclusive"], []).append(_flags(f, meta)[-1])
    groups: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    for f, meta in fields:
        holder = parser
        if meta["group"]:
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_argument_group(meta["group"])
            holder = groups[meta["group"]]
        if meta["exclusive"]:
            name = meta["exclusive"]
            if name not in exclusive:
                required = any(m["required"] for g, m in fields if m["exclusive"] == name)
                exclusive[name] = holder.add_mutually_exclusive_group(required=required)
            holder = exclusive[name]
        default = list(f.default) if isinstance(f.default, tuple) and (
            meta["nargs"] is not None or meta["action"]) else f.default
        kw: dict[str, Any] = {"default": default,
                              "help": _help(f, meta, sets.get(meta["exclusive"], ()))}
        if not meta["positional"]:
            kw["dest"] = f.name
            if meta["required"] and not meta["exclusive"]:
                kw["required"] = True
        if isinstance(f.default, bool) and meta["type"] is None:
            kw["action"] = _recording("store_true")
        else:
            kw["type"] = meta["type"] or (type(f.default[0]) if isinstance(f.default, tuple)
                                          else type(f.default))
            for key in ("choices", "metavar", "nargs"):
                if meta[key] is not None:
                    kw[key] = meta[key]
            kw["action"] = _recording(meta["action"] or "store")
        holder.add_argument(*_flags(f, meta), **kw)
    parser.set_defaults(**{_GIVEN: frozenset()})


_RECORDING: dict[str, type] = {}


def _recording(action: str) -> type:
    """argparse's ``action`` ("store", "store_true", "append") that also notes its dest in
    the namespace as given (:func:`given`)."""
    if action not in _RECORDING:
        base = {"store": argparse._StoreAction, "store_true": argparse._StoreTrueAction,
                "append": argparse._AppendAction}[action]

        def __call__(self, parser, namespace, values, option_string=None):
            base.__call__(self, parser, namespace, values, option_string)
            setattr(namespace, _GIVEN, getattr(namespace, _GIVEN, frozenset()) | {self.dest})

        _RECORDING[action] = type(f"Given{base.__name__}", (base,), {"__call__": __call__})
    return _RECORDING[action]


def given(args: Any, name: str, default: Any = None) -> bool:
    """Whether the command line gave the option of field ``name`` (a flag or value typed,
    also one equal to its default): ``args`` parsed from options of :func:`add_options`, or
    the config :func:`from_args` made of them. For a namespace or config made otherwise (a
    test's, a library caller's): whether its value is neither None nor ``default`` (the
    field's default)."""
    recorded = getattr(args, _GIVEN, None)
    if recorded is None:
        value = getattr(args, name, None)
        return value is not None and value != default
    return name in recorded


def from_args(config_cls, args: argparse.Namespace, **overrides):
    """``config_cls`` from the parsed ``args`` (every :func:`option` field; a field missing
    from ``args`` keeps its default; a list, as argparse gives ``nargs`` and ``append``
    values, becomes a tuple), then ``overrides``. The config keeps which options the
    command line gave (:func:`given` answers for it as for ``args``); a copy made with
    :func:`dataclasses.replace` forgets them."""
    values = {f.name: getattr(args, f.name) for f, _ in _fields(config_cls)
              if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    config = config_cls(**{**values, **overrides})
    recorded = getattr(args, _GIVEN, None)
    if recorded is not None:     # frozen dataclasses too: not a field, so not compared
        object.__setattr__(config, _GIVEN, frozenset(recorded))
    return config


def defaults(config_cls) -> dict[str, Any]:
    """Every option field's default, by field name."""
    return {f.name: f.default for f, _ in _fields(config_cls)}
