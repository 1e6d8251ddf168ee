"""The rf-eval lm-eval model this process evaluates, as the tasks that score it see it.

lm-eval builds the model before it loads the tasks (`simple_evaluate`) and hands a
task only one dict: model_args merged with `--metadata` (`--metadata` wins). The
rf-eval adapters publish here what a task needs beyond that dict:

- `tail`: the arm's exact tail (the filled region's edge), when the arm fills rows;
- `tokenizer`: the checkpoint whose tokenizer sizes and marks the samples (the
  embedded demo model when no `pretrained` was given);
- `task_defaults`: task options the model implies when the run gives none (the
  demo model's lengths);
- `default_tail`: the filled region's edge for an arm that fills no rows (the demo's tail on the demo);
- `pretrained_alias`: the `pretrained` name the adapter resolved ("demo"), which reaches the tasks'
  metadata as given.

`expect` goes the other way: lm-eval's `simple_evaluate` (wrapped by `rf_eval.tasks.data_needs`) records the
tasks and metadata of the run before it builds the model, so an adapter can refuse tasks that its arm cannot
score before its weights load.

Only the adapter that published last and is still alive counts (a weak reference:
a model that was freed publishes nothing); an adapter publishes when it is built and
again whenever it records a prompt's cost, so of two adapters built in one process
the tasks read the one that ran. `prompt_cost` asks that adapter for the prefill cost
it recorded for a prompt (`rf_eval.model_adapters.item_costs`).
"""

from __future__ import annotations

import weakref
from typing import Any

_current: tuple[weakref.ReferenceType, dict[str, Any]] | None = None


def publish(model: Any, info: dict[str, Any]) -> None:
    """Record `info` as the facts of `model`, the model this process now evaluates."""
    global _current
    _current = (weakref.ref(model), dict(info))


def current() -> dict[str, Any] | None:
    """The facts of the newest published model that is still alive, else None."""
    if _current is None:
        return None
    ref, info = _current
    return dict(info) if ref() is not None else None


def clear() -> None:
    global _current, _expected
    _current = _expected = None


_expected: tuple[list[str], dict[str, Any]] | None = None


def expect(tasks: list[str], metadata: dict[str, Any]) -> None:
    """Record the task names and metadata of the run about to build its model."""
    global _expected
    _expected = (list(tasks), dict(metadata))


def expected() -> tuple[list[str], dict[str, Any]] | None:
    """(task names, metadata) of the run being started, else None (a model built outside `simple_evaluate`)."""
    return _expected


def prompt_cost(prompt: Any) -> dict[str, Any] | None:
    """The cost fields the current adapter recorded for the request whose first argument is `prompt`
    (`rf_eval.cost.prefill_cost`), else None (no rf-eval adapter, or no record)."""
    if _current is None:
        return None
    model = _current[0]()
    costs = getattr(model, "item_costs", None)
    return costs.fields(prompt) if costs is not None else None
