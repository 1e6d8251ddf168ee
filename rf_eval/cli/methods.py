"""`rf-eval methods`: the prefill methods as a Markdown table, from the registry (`rf_eval.methods`).

Each row is one registered method: its `method=` name, the lm-eval model that
runs it (`--model prefill` for a method with no adapter of its own), what its
adapter loads beside the model (`Method.keys`), its arm's fields and the
module that declares it (a plug-in on `RF_EVAL_METHOD_PATH` shows its file's
module)."""

from __future__ import annotations

import argparse

from rf_eval.cli.readme_table import markdown_table

HEADER = ("method", "run as", "loads", "arm fields", "declared in")


def rows() -> list[tuple[str, ...]]:
    from rf_eval.methods import METHODS

    out = []
    for name in sorted(METHODS):
        cls = METHODS[name]
        run = f"`--model {cls.model}`" + (f" `method={name}`" if cls.model != name else "")
        out.append((f"`{name}`", run, ", ".join(cls.keys) or "-", ", ".join(cls.arm_fields()) or "-", cls.__module__))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: the table of every method the registry finds."""


def run(args: argparse.Namespace) -> int:
    print(markdown_table(HEADER, rows()), end="")
    return 0
