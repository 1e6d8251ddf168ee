"""argparse types for the numbers rf-eval's commands take: a count, a size, a penalty, a probability.

Each refuses, in argparse's one line (exit status 2), what would otherwise fail deep inside a command
(`--max-tokens -5` ending in an OverflowError) or run on a meaningless value (`--lambdas nan`).
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _at_least(text: str, kind: type, low: float, strict: bool) -> int | float:
    """`text` as `kind`, refused in argparse's words unless it is >= `low` (> `low` when `strict`)."""
    value = _number(text, kind)
    if value < low or (strict and value == low):
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} must be {what} {'>' if strict else '>='} {low:g}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (a count of tokens, requests, layers, processes)."""
    return int(_at_least(text, int, 1, strict=False))


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (a seed, a layer index, warm-up requests)."""
    return int(_at_least(text, int, 0, strict=False))


def positive_float(text: str) -> float:
    """A finite number > 0 (a ridge penalty, seconds)."""
    return float(_at_least(text, float, 0, strict=True))


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (a margin, where 0 asks for superiority)."""
    return float(_at_least(text, float, 0, strict=False))


def probability(text: str) -> float:
    """A number strictly between 0 and 1 (an interval's confidence level)."""
    value = float(_number(text, float))
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie strictly between 0 and 1")
    return value


def port(text: str) -> int:
    """A TCP port, 1..65535."""
    value = int(_number(text, int))
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1..65535)")
    return value
