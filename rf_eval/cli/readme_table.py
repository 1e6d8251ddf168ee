"""A generated table between two markers of a README (`rf-eval families --readme`, `rf-eval fills --readme`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ReadmeTable:
    """A command's generated table: printed, or (`--readme FILE`) rewritten between its markers in FILE."""

    begin: str
    end: str
    header: tuple[str, ...]
    rows: Callable[[], list[tuple[str, ...]]]
    what: str  # the table, in the messages: "fills table"
    unit: str  # what a row is, in the messages: "fills"

    def table(self) -> str:
        return markdown_table(self.header, self.rows())

    def with_table(self, text: str) -> str:
        """`text` (a README) with the block between the markers replaced by the current table."""
        return replace_block(text, self.begin, self.end, self.table(), self.what)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--readme", default=None, help="rewrite the table between this file's markers")

    def run(self, args: argparse.Namespace) -> int:
        if args.readme is None:
            print(self.table(), end="")
            return 0
        path = Path(args.readme)
        path.write_text(self.with_table(path.read_text()))
        print(f"wrote the {self.what} ({len(self.rows())} {self.unit}) to {path}")
        return 0
