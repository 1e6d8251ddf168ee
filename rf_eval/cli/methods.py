"""`rf-eval methods`: the prefill methods as a Markdown table, from the registry (`rf_eval.methods`).

Each row is one registered method: its `method=` name, the lm-eval model name
that runs it when model_args name no method (every method runs as
`--model prefill --model_args method=NAME`), what it loads beside the model
(`Method.loads`), its arm's fields, what a `budget=` turns (`Method.budget_knob`,
where its arm takes one) and the module that defines it (a plug-in on
`RF_EVAL_METHOD_PATH` shows its file's module)."""

from __future__ import annotations

import argparse

from rf_eval.cli.readme_table import markdown_table

HEADER = ("method", "run as", "loads", "arm fields", "budget= turns", "defined in")


def rows() -> list[tuple[str, ...]]:
    from rf_eval.methods import METHODS, MODELS

    out = []
    for name in sorted(METHODS):
        cls = METHODS[name]
        named = [model for model, default in MODELS.items() if default == name]
        run = f"`--model {named[0]}`" if named else f"`--model prefill` `method={name}`"
        fields = cls.arm_fields()
        budget = (cls.budget_knob or "its knob") + (f", in place of {', '.join(cls.budget_sets)}" if cls.budget_sets
                                                    else "") if "budget" in fields else "-"
        out.append((f"`{name}`", run, ", ".join(cls.loads) or "-", ", ".join(fields) or "-", budget,
                    cls.__module__))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: the table of every method the registry finds."""


def run(args: argparse.Namespace) -> int:
    print(markdown_table(HEADER, rows()), end="")
    return 0
