"""Command-line flags generated from config dataclasses: `flag()` gives a field its help (choices, flag
name, ...), `add_flags` makes an argparse argument of each such field, `given` and `config_from_args`
read them back by field. A field without `flag()` has no flag (it is set in code or a config file).

A flag is --NAME (the field's name, or `name`), dashed; its dest is NAME with a prefix when given.
Its type comes from the annotation: bool is a switch (`--x`, or `--x/--no-x` when True by default),
a list or tuple a repeatable flag (its items added to the default's) or one `sep`-joined string,
else int, float or str; `X | None` is X with default None."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterator

_KEY = "flag"  # where flag() keeps its settings in the field's metadata


def flag(
    default=dataclasses.MISSING,
    help: str = "",
    *,
    choices: list | None = None,
    name: str | tuple[str, ...] | None = None,
    metavar: str | None = None,
    sep: str | None = None,
    exclusive: str | None = None,
    **field_kwargs,
):
    """A dataclass field with a flag. name: the flag's name (and dest) where it is not the field's, a
    tuple for aliases; sep: a list given as one string ("eagle,group"), not a repeated flag;
    exclusive: flags with the same key are mutually exclusive."""
    names = (name,) if isinstance(name, str) else name
    meta = {"help": help, "choices": choices, "names": names, "metavar": metavar, "sep": sep, "exclusive": exclusive}
    return dataclasses.field(default=default, metadata={_KEY: meta}, **field_kwargs)


def _walk(cls, path: str = "") -> Iterator[tuple[str, dataclasses.Field, object]]:
    """(field path, field, type) of each field with a flag, those of nested config dataclasses (a
    field whose default_factory is one) as "FIELD.NAME"."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            yield from _walk(f.default_factory, f"{path}{f.name}.")
        elif _KEY in f.metadata:
            hint = hints[f.name]
            if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
                hint = next(a for a in typing.get_args(hint) if a is not type(None))
            yield path + f.name, f, hint


def _names(f: dataclasses.Field) -> tuple[str, ...]:
    return f.metadata[_KEY]["names"] or (f.name,)


def add_flags(
    parser,
    cls,
    *,
    prefix: str = "",
    defaults: dict | None = None,
    suppress: bool = False,
    metavars: dict | None = None,
) -> None:
    """An argument of `parser` (or of an argument group) for each field of `cls` with a flag. Its
    default: `defaults[FIELD]`, else the field's; with `suppress` none: a flag not given is absent from
    the namespace (so a config file's value stands) and its help names the field's default.
    metavars: type -> metavar (e.g. {int: "N"}) where the field names none."""
    exclusive: dict = {}
    for path, f, hint in _walk(cls):
        meta, names = f.metadata[_KEY], _names(f)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        default = (defaults or {}).get(path, None if default is dataclasses.MISSING else default)
        kw: dict = {"help": meta["help"]}
        if hint is bool:
            kw["action"] = argparse.BooleanOptionalAction if default else "store_true"
        else:
            seq = typing.get_origin(hint) in (list, tuple)
            if seq and meta["sep"]:
                hint, default = str, meta["sep"].join(default)
            elif seq:
                hint, default, kw["action"] = typing.get_args(hint)[0], list(default), "append"
            metavar = meta["metavar"] or (None if meta["choices"] else (metavars or {}).get(hint))
            kw |= {"type": hint, "choices": meta["choices"], "metavar": metavar}
        if suppress:
            if f.default is not dataclasses.MISSING and f.default is not None:
                kw["help"] += f" (default: {default})"
            default = argparse.SUPPRESS
        target = parser
        if meta["exclusive"]:
            if meta["exclusive"] not in exclusive:
                exclusive[meta["exclusive"]] = parser.add_mutually_exclusive_group()
            target = exclusive[meta["exclusive"]]
        options = ["--" + n.replace("_", "-") for n in names]
        target.add_argument(*options, dest=prefix + names[0], default=default, **kw)


def flag_dests(cls, prefix: str = "") -> dict[str, str]:
    """dest -> field path of each of `cls`'s flags (what `add_flags` makes with this prefix)."""
    return {prefix + _names(f)[0]: path for path, f, _ in _walk(cls)}


def given(cls, args: argparse.Namespace, prefix: str = "") -> dict:
    """The values of `cls`'s flags in `args` by field path (nested: "FIELD.NAME"), those absent left out; a list from a
    config file or a `sep`-joined string is made the field's list or tuple type, empty items dropped."""
    out = {}
    for path, f, hint in _walk(cls):
        dest = prefix + _names(f)[0]
        if not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        seq = typing.get_origin(hint)
        if seq in (list, tuple) and value is not None:
            if isinstance(value, str):
                value = value.split(f.metadata[_KEY]["sep"] or ",")
            value = seq(x for x in value if x)
        out[path] = value
    return out


def config_from_args(cls, args: argparse.Namespace, prefix: str = ""):
    """`cls` (a config without nested ones) from the flags in `args`; absent ones keep their default.
    Raises what `cls` raises for invalid values (ValueError)."""
    return cls(**given(cls, args, prefix))


def check_fields(obj, counts: tuple[str, ...] = ()) -> None:
    """Raise ValueError for the first field of the dataclass `obj` out of range: one of `counts` (an
    integer >= 1), or a field whose `flag()` names choices, with a value outside them."""
    for name in counts:
        value = getattr(obj, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    for f in dataclasses.fields(obj):
        choices, value = f.metadata.get(_KEY, {}).get("choices"), getattr(obj, f.name)
        if choices and not f.metadata[_KEY]["sep"] and value not in choices:
            raise ValueError(f"{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}")
