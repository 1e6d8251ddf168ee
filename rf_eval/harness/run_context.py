"""The rf-eval lm-eval model this process evaluates, as the tasks that score it see it.

lm-eval builds the model before it loads the tasks (`simple_evaluate`) and hands a
task only one dict: model_args merged with `--metadata` (`--metadata` wins). The
rf-eval adapters publish here what a task needs beyond that dict:

- `tail`: the arm's exact tail (the filled region's edge), when the arm fills rows;
- `tokenizer`: the checkpoint whose tokenizer sizes and marks the samples (the
  embedded demo model when no `pretrained` was given);
- `task_defaults`: task options the model implies when the run gives none (the
  demo model's lengths).

Only the newest adapter still alive counts (a weak reference: a model that was
freed publishes nothing). `prompt_cost` asks that adapter for the prefill cost
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
    global _current
    _current = None


def prompt_cost(prompt: Any) -> dict[str, Any] | None:
    """The cost fields the current adapter recorded for the request whose first argument is `prompt`
    (`rf_eval.cost.prefill_cost`), else None (no rf-eval adapter, or no record)."""
    if _current is None:
        return None
    model = _current[0]()
    costs = getattr(model, "item_costs", None)
    return costs.fields(prompt) if costs is not None else None
