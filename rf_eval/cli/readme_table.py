"""A generated table between two markers of a README (`rf-eval families --readme`, `rf-eval fills --readme`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def replace_block(text: str, begin: str, end: str, body: str, what: str) -> str:
    """`text` with the block between `begin` and `end` replaced by `body` (ValueError naming `what` without them)."""
    if begin not in text or end not in text:
        raise ValueError(f"the README has no {what} markers ({begin!r} ... {end!r})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def add_readme_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--readme", default=None, help="rewrite the table between this file's markers")


def print_or_rewrite(args: argparse.Namespace, table: Callable[[], str], with_table: Callable[[str], str],
                     what: str) -> int:
    """Print the table, or (`--readme FILE`) rewrite it in place in FILE."""
    if args.readme is None:
        print(table(), end="")
        return 0
    path = Path(args.readme)
    path.write_text(with_table(path.read_text()))
    print(f"wrote the {what} to {path}")
    return 0
