"""The arm string: the one-line `key=value;...` format an arm and its parts are written in; its one parser.

Two shapes, one grammar (`;` separates `key=value` pairs outside parentheses):

    fill=ridge;tail=256;selector=random(seed=3;of=attention)   an arm's fields: `parse_fields`
                                                               (a served `rf_arm`, `rf-eval ttft --arm-a`)
    random(seed=3;of=attention(share=0.1))+special             named parts joined by `+`: `parse_parts`
                                                               (selectors, corrections, cost_match)

Parts fit in lm-eval's comma-separated `--model_args` (they hold no commas):

    selector=random(seed=3;of=attention(share=0.1))
    selector=probe(budget=1.0)+special
    corrections=value_rescale(c=512)+terminal_state(path=/data/dm.safetensors)

Values are converted in one module, `rf_eval.fields`. An arm's fields stay text here: each field's type
converts them when the arm is built (`fields.coerce`). A part's parameters have no declared type at this
point, so they are read by the same module's untyped rule (`fields.read_text`): integers, floats,
true/false/none/null, lists as `a|b|c` (e.g. `layers=3|7|11`), anything else the text. A value holding a
nested part (`of=attention(share=0.2)`) stays text; the registry that owns the parameter parses it again.
"""

from __future__ import annotations

import re
from typing import Any

from rf_eval.fields import ArmError, read_text

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


class ArmStringError(ArmError):
    """An arm string that does not parse."""


def _split_top(text: str, seps: str) -> list[str]:
    """Split on any of `seps` outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ArmStringError(f"unbalanced ')' in {text!r}")
        elif ch in seps and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ArmStringError(f"unbalanced '(' in {text!r}")
    parts.append(text[start:])
    return parts


def parse_fields(text: str, *, seps: str = ";", what: str = "arm string") -> dict[str, str]:
    """`key=value;key=value` as a dict of the values' text (stripped; empty pairs skipped). `seps`: the
    separators (the server also takes `,`); `what` names the string in errors."""
    out: dict[str, str] = {}
    for pair in _split_top(text, seps):
        if not pair.strip():
            continue
        key, eq, value = pair.partition("=")
        if not eq or not _NAME.fullmatch(key.strip()):
            raise ArmStringError(f"{what} part {pair.strip()!r} is not key=value (in {text!r})")
        out[key.strip()] = value.strip()
    return out


def parse_parts(text: str) -> list[tuple[str, dict[str, Any]]]:
    """`a(x=1)+b` -> [("a", {"x": 1}), ("b", {})]."""
    text = text.strip()
    if not text:
        raise ArmStringError("empty arm string: expected a name like 'attention' or 'attention(share=0.1)'")
    out = []
    for part in _split_top(text, "+"):
        part = part.strip()
        match = _NAME.match(part)
        if not match:
            raise ArmStringError(f"bad part {part!r}: expected a name like 'attention' or 'attention(share=0.1)'")
        name, rest = match.group(0), part[match.end():].strip()
        params: dict[str, Any] = {}
        if rest:
            if not (rest.startswith("(") and rest.endswith(")")):
                raise ArmStringError(f"bad part {part!r}: parameters go in parentheses, name(key=value;...)")
            fields = parse_fields(rest[1:-1], what=f"{name!r} parameter")
            params = {key: read_text(value) for key, value in fields.items()}
        out.append((name, params))
    return out


def check_params(kind: str, name: str, params: dict[str, Any], valid: tuple[str, ...]) -> None:
    """A clear error naming an unknown parameter and listing the valid ones."""
    bad = [p for p in params if p not in valid]
    if bad:
        listing = ", ".join(valid) if valid else "(none)"
        raise ValueError(f"{kind} {name!r} has no parameter {bad[0]!r}; valid parameters: {listing}")
