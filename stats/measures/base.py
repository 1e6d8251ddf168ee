"""What a report measure is: a column (`Measure`) and a task's reading (`TaskMeasures`, the plug-in); the
registry is `rf_eval.stats.measures`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar


@dataclass(frozen=True)
class Measure:
    """One column of a measures table: `key` names it in the summary, `label` in a report."""

    key: str
    label: str
    metric: str
    kind: str  # "delta" | "gap" | "own"
    secondary: bool = False


#: the kinds of measure a column can be (see the package docstring)
KINDS = ("delta", "gap", "own")


class TaskMeasures:
    """How a report reads some tasks: its `name` (the plug-in's), the tasks it reads (`tasks` by name, or
    every task whose name ends in `suffix`; `reads` decides), and

    - a measures table: its `title`, its columns in order (`measures`; none: the generic tables) and what
      its numbers are (`description`);
    - the metrics a report reads unless `--metric` names others (`default_metrics`: the columns' metrics,
      or `metrics` where there is no table);
    - why a column can have no per-item values (`missing`, metric -> reason; `missing_reason` may read the
      run's task settings).
    """

    name: ClassVar[str] = ""
    tasks: ClassVar[frozenset[str]] = frozenset()
    suffix: ClassVar[str] = ""
    title: ClassVar[str] = ""
    measures: ClassVar[tuple[Measure, ...]] = ()
    description: ClassVar[str] = ""
    metrics_read: ClassVar[tuple[str, ...]] = ()  #: the default metrics of a reading with no table
    missing: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def reads(self, task: str) -> bool:
        """Whether this reading is `task`'s."""
        return task in self.tasks or bool(self.suffix and task.endswith(self.suffix))

    @property
    def metrics(self) -> list[str]:
        """The per-item metrics behind the columns, headline ones first, each once."""
        return list(dict.fromkeys(m.metric for m in self.measures))

    @property
    def columns(self) -> list[dict[str, Any]]:
        """The columns as plain data, for a report's table."""
        return [{"key": m.key, "label": m.label, "metric": m.metric, "kind": m.kind, "secondary": m.secondary}
                for m in self.measures]

    @property
    def own_metrics(self) -> set[str]:
        """The metrics an arm measured against its own exact pass: read per arm, never paired."""
        return {m.metric for m in self.measures if m.kind == "own"}

    def default_metrics(self) -> tuple[str, ...]:
        """The metrics a report reads for the task unless `--metric` names others."""
        return tuple(self.metrics) if self.measures else tuple(self.metrics_read)

    def missing_reason(self, metric: str, settings: Mapping[str, Any]) -> str:
        """Why `metric` can have no per-item values ("" where nothing is known); `settings`: the run's task
        metadata."""
        return self.missing.get(metric, "")
