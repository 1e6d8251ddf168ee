"""The prefill cost of every prompt a `PrefillLM` run prefilled, kept until the tasks write it into their samples.

lm-eval hands a task's `process_results` only the document and the responses,
so the adapter keeps each prompt's `rf_eval.cost.prefill_cost.PrefillCost` by its
request (`request_key`: the request's first argument, the prompt string the task
built) and the task asks for it by the same prompt (`rf_eval.harness.run_context.prompt_cost`,
`rf_eval.tasks.common.cost_fields`). With `--use_cache` the records are kept in
the run's request database beside the results, so a resumed run's cached
requests still carry theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rf_eval.cost.prefill_cost import PrefillCost, request_key

#: the prefix of the cost records' keys in a --use_cache database (the results' keys are lm-eval's hashes)
DB_PREFIX = "rf-eval:cost:"


class ItemCosts:
    """Cost records by request; see the module docstring."""

    def __init__(self) -> None:
        self._fields: dict[str, dict[str, Any]] = {}
        self.db: Any = None  # lm-eval's request database (a SqliteDict), once the run has one
        #: called on each record: the adapter publishes itself as the one whose records the tasks read next
        #: (`rf_eval.harness.run_context`), so of two adapters built in one process the one running is read
        self.publish: Callable[[], None] | None = None

    def record(self, prompt: Any, cost: PrefillCost | None) -> None:
        """Keep `cost` as the cost of the request whose first argument is `prompt` (nothing for None)."""
        if cost is None or prompt is None:
            return
        if self.publish is not None:
            self.publish()
        key = request_key(prompt)
        fields = cost.fields()
        self._fields[key] = fields
        if self.db is not None:
            self.db[DB_PREFIX + key] = fields  # committed with the results (lm-eval commits per request type)

    def fields(self, prompt: Any) -> dict[str, Any] | None:
        """The recorded fields of the request whose first argument is `prompt` (None: none recorded)."""
        key = request_key(prompt)
        found = self._fields.get(key)
        if found is None and self.db is not None:
            found = self.db.get(DB_PREFIX + key)
        return dict(found) if found is not None else None
