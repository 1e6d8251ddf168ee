"""One-line specs for pluggable parts: `name`, `name(key=value;key=value)`, joined by `+`.

Used for selectors, corrections and the cost-matched control, so a whole arm
fits in lm-eval's comma-separated `--model_args` (specs contain no commas):

    selector=random(seed=3;of=attention(share=0.1))
    selector=probe(budget=1.0)+special
    corrections=value_rescale(c=512)+terminal_state(path=/data/dm.safetensors)

Values: integers, floats, true/false/none, lists as `a|b|c` (e.g.
`layers=3|7|11`), anything else a string. A value holding a nested spec
(`of=attention(share=0.2)`) stays a string; the registry that owns the
parameter parses it again.
"""

from __future__ import annotations

import re
from typing import Any

from rf_eval.errors import UserError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


class SpecError(UserError):
    """A spec string that does not parse."""


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SpecError(f"unbalanced ')' in spec {text!r}")
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise SpecError(f"unbalanced '(' in spec {text!r}")
    parts.append(text[start:])
    return parts


def coerce(raw: str) -> Any:
    """A spec value: int, float, bool, None, list (`a|b`), else the string itself."""
    text = raw.strip()
    if "|" in text and "(" not in text:
        return [coerce(p) for p in text.split("|") if p.strip()]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_spec(text: str) -> list[tuple[str, dict[str, Any]]]:
    """`a(x=1)+b` -> [("a", {"x": 1}), ("b", {})]."""
    text = text.strip()
    if not text:
        raise SpecError("empty spec")
    out = []
    for part in _split_top(text, "+"):
        part = part.strip()
        match = _NAME.match(part)
        if not match:
            raise SpecError(f"bad spec part {part!r}: expected a name like 'attention' or 'attention(share=0.1)'")
        name, rest = match.group(0), part[match.end():].strip()
        params: dict[str, Any] = {}
        if rest:
            if not (rest.startswith("(") and rest.endswith(")")):
                raise SpecError(f"bad spec part {part!r}: parameters go in parentheses, name(key=value;...)")
            body = rest[1:-1].strip()
            for arg in _split_top(body, ";") if body else []:
                key, eq, value = arg.partition("=")
                if not eq or not _NAME.fullmatch(key.strip()):
                    raise SpecError(f"bad parameter {arg!r} in {part!r}: expected key=value")
                params[key.strip()] = coerce(value)
        out.append((name, params))
    return out


def check_params(kind: str, name: str, params: dict[str, Any], valid: tuple[str, ...]) -> None:
    """A clear error naming an unknown parameter and listing the valid ones."""
    bad = [p for p in params if p not in valid]
    if bad:
        listing = ", ".join(valid) if valid else "(none)"
        raise ValueError(f"{kind} {name!r} has no parameter {bad[0]!r}; valid parameters: {listing}")
