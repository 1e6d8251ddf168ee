"""Typed fields from loose values: the one converter of arm values, for every place an arm is written down.

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
#: the text that means "not set" (None) wherever a field takes None
NONE_TEXT = ("none", "null")


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


def _quoted(text: str) -> bool:
    return len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""


def read_text(text: str) -> Any:
    """The untyped reading of a value's text: int, float, true/false, none/null (None), a list `a|b`, text in
    matching quotes as that text (`"123"`: the string 123, as lm-eval's model_args read it), else the text
    itself (stripped). Used where no type is declared (a part's parameters in an arm string,
    `rf_eval.arm_string.parse_parts`) and by `coerce` before it checks a typed field's type."""
    text = text.strip()
    if _quoted(text):
        return text[1:-1]
    if "|" in text and "(" not in text:
        return [read_text(p) for p in text.split("|") if p.strip()]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in NONE_TEXT:
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def coerce(key: str, value: Any, hint: Any) -> Any:
    """`value` as one of the types in `hint` (int | str | None ...), or an ArmError naming `key`: the one
    converter of arm field values, whatever format they were written in (model_args, a study file's YAML, a
    served `rf_arm`, Python keyword arguments).

    Text is read by `read_text`'s rules, then checked against the hint: `none`/`null` is None (refused
    where the field takes no None, as lm-eval's model_args already refused `fill=none`); an integral
    number is an int where the field takes an int (`4096.0`, as lm-eval's own model_args parsing already
    gives it); an int is a float where the field takes a float; a field that takes text keeps the text as
    written (`unigram=123` is the file `123`; text in quotes is the text inside, as in lm-eval's model_args).
    Refused as before: a bool field takes only true/false (not 1/0), an int field no bool and no fraction,
    a scalar field no list (`3|7`), a text field no number that a format already read as one (lm-eval's
    model_args and YAML read `unigram=007` as 7, and the text is lost: quote it). A field typed `Any` (a
    selector or correction string, a dict or an object, which its own parser reads) takes the value as it
    is (`none`/`null` as None)."""
    shown = value
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    if isinstance(value, str) and value.strip().lower() in NONE_TEXT:
        value = None  # "not set", in every format (lm-eval's model_args read `none` so already)
    if hint is Any or Any in options:
        return value
    if isinstance(value, str):
        value = read_text(value)
        if str in options and (isinstance(value, str) or not {bool, int, float} & set(options)):
            return value if _quoted(shown.strip()) else shown  # text as written; quotes mark text
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
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
        elif kind is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif isinstance(value, (str, Path)):
            return str(value)
    names = " or ".join("None" if o is type(None) else getattr(o, "__name__", str(o)) for o in options)
    raise ArmError(f"{key}={shown!r} has the wrong type; expected {names}")
