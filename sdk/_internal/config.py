"""Daemon configuration from one frozen dataclass per concern.

Each field has a default and a one-line doc in `field(metadata={"help": ...})`; the command
line flags (`--slots`) and environment variables (`OMNIRT_SLOTS`) derive from the fields.
Precedence: flag, then environment, then default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def env_name(field_name: str) -> str:
    """The environment variable of a config field: `max_queue` -> `OMNIRT_MAX_QUEUE`."""
    return "OMNIRT_" + field_name.upper()


def _base_type(tp: Any) -> Any:
    """`int | None` -> int, `list[str]` -> list."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    return origin or tp


def _parse(tp: Any, raw: str) -> Any:
    base = _base_type(tp)
    if base is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if base in (list, tuple):
        items = [x.strip() for x in raw.split(",") if x.strip()]
        return tuple(items) if base is tuple else items
    return base(raw)


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of the config dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        base = _base_type(tp)
        flag = "--" + f.name.replace("_", "-")
        doc = f.metadata.get("help", "")
        # The flags' own default is None (so the environment can fill in); the field's is shown.
        env = f"default: {_shown_default(f)}; {env_name(f.name)}"
        if base is bool:
            parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=f"{doc} [{env}]"
            )
        elif base in (list, tuple):
            parser.add_argument(
                flag,
                dest=f.name,
                action="append",
                default=None,
                help=f"{doc} (repeatable, or comma separated) [{env}]",
            )
        else:
            parser.add_argument(flag, dest=f.name, type=base, default=None, help=f"{doc} [{env}]")


def _shown_default(f: dataclasses.Field[Any]) -> str:
    """A field's default as a person would type it: `8`, `on`, `none` for an empty value."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = str(value)
    # `%` would be read as a format by argparse's help.
    return (text or "none").replace("%", "%%")


def from_args(cls: type[T], args: argparse.Namespace, environ: typing.Mapping[str, str] | None = None) -> T:
    """Build the config: flags first, then `OMNIRT_*` environment variables, then defaults."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name, None)
        tp = hints[f.name]
        if value is not None and _base_type(tp) in (list, tuple):
            items = [x.strip() for v in value for x in str(v).split(",") if x.strip()]
            value = tuple(items) if _base_type(tp) is tuple else items
        if value is None and env_name(f.name) in environ:
            value = _parse(tp, environ[env_name(f.name)])
        if value is not None:
            values[f.name] = value
    return cls(**values)
