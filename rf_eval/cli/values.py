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


def positive_int(text: str) -> int:
    """An integer >= 1 (a count of tokens, requests, layers, processes)."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 1")
    return value


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (a seed, a layer index, warm-up requests)."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a ridge penalty, a margin, seconds)."""
    value = float(_number(text, float))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number > 0")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (a margin, where 0 asks for superiority)."""
    value = float(_number(text, float))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number >= 0")
    return value


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
