"""Typed fields from loose values: one parser for every place an arm is written down.

An arm spec (`rf_eval.ridgefill.arm_spec`) is a frozen dataclass. Its values arrive as
lm-eval `model_args` (strings, or values `simple_parse_args_string` already
typed), CLI flags, a served request's JSON or Python keyword arguments;
`build(cls, mapping)` turns each of them into the same instance, once:
unknown keys and values of the wrong type are an `ArmError` that names the
key and lists the valid ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rf_eval.errors import UserError


class ArmError(UserError):
    """A bad arm setting: the message names the key or value and the valid choices."""


T = TypeVar("T")


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def build(cls: type[T], values: Mapping[str, Any], *, what: str = "arm") -> T:
    """`cls(**values)` with each value coerced to its field's type; unknown keys refused."""
    names = field_names(cls)
    unknown = [k for k in values if k not in names]
    if unknown:
        raise ArmError(f"unknown {what} key(s): {', '.join(map(repr, unknown))}; valid keys: {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: coerce(k, v, hints[k]) for k, v in values.items()})


def close_to(key: str, names: Iterable[str]) -> str | None:
    """The field name `key` is probably a typo of, if any (e.g. `tial` for `tail`)."""
    match = difflib.get_close_matches(key, list(names), n=1, cutoff=0.75)
    return match[0] if match else None


def coerce(key: str, value: Any, hint: Any) -> Any:
    """`value` as one of the types in `hint` (int | str | None ...), or an ArmError naming `key`."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if hint is Any or Any in options:
        return value
    if value is None:
        if type(None) in options:
            return None
        raise ArmError(f"{key} may not be None")
    for kind in (bool, int, float, str):  # most specific first: bool is an int, anything is a str
        if kind not in options:
            continue
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                return int(value)
        elif kind is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if isinstance(value, str) and is_number(value):
                return float(value)
        elif isinstance(value, (str, Path)):
            return str(value)
    names = " or ".join("None" if o is type(None) else getattr(o, "__name__", str(o)) for o in options)
    raise ArmError(f"{key}={value!r} has the wrong type; expected {names}")


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
