"""The measures a task is read by: what a report shows by default (RidgeFill paper sections 3, 3.1, 4.7).

"Loss averaged over tokens was the wrong stick" (section 3): most scored
tokens do not depend on the prefix, so the fill's error is diluted by tokens
it cannot affect. The paper reads a long-document run by its loss on the
tokens that need the prefix (section 3.1): ΔNLL (an arm's loss minus the
reference's, nats per token) on key tokens and on novel tokens, the
perplexity gap exp(ΔNLL) - 1 on novel tokens (section 5.3), and the
divergence KL(exact || arm) with its median (sections 3.1 and 4.7). The
all-token loss is shown beside them, as a secondary column, never as the
headline. A RULER `*_filled` task is read by its filled-region accuracy,
`acc_filled` (section 3.1).

A task's reading is one plug-in (a `TaskMeasures`, `base`: which tasks, the table's columns, the default
metrics, why a column can be empty), found with no list to edit (the one plug-in pattern,
`rf_eval.plugins`): the modules of this package (`keytoken`, `ruler_filled`), those of the folders in
`RF_EVAL_MEASURES_PATH` (separated like PATH, read when the package is first imported; they import as
`rf_eval.stats.measures.<module>`), the classes of installed packages' `rf_eval.measures` entry points, and
classes given to `register_measures`. So a new task's measures are one file. `default_metrics` is what
`load_runs` reads for a task when no `--metric` names others, and `task_measures` lays out the report's
measures table (computed in `rf_eval.stats.tables`, rendered by the report templates).

Kinds of measure: `delta`, the paired mean difference arm - reference of a
per-document loss, with its interval, median and heavy-tail flag; `gap`, the
perplexity gap of the same paired loss, domain-averaged; `own`, a value the
arm's run measured against its own exact pass (KL): the arm's mean with its
interval (resampled within the same strata) and median, not a difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rf_eval.plugins import Discovery, PluginError, Registry
from rf_eval.stats.measures.base import KINDS, Measure, TaskMeasures

__all__ = ["MEASURES", "Measure", "TaskMeasures", "default_metrics", "missing_note", "missing_reason",
           "reading", "register_measures", "task_label", "task_measures", "unregister_measures"]

MEASURES_PATH_ENV = "RF_EVAL_MEASURES_PATH"
ENTRY_POINTS = "rf_eval.measures"


def _check(cls: type[TaskMeasures], where: str) -> None:
    """A reading's contract beyond its name: tasks it reads, and a table or default metrics."""
    if not (cls.tasks or cls.suffix) and cls.reads is TaskMeasures.reads:
        raise PluginError(f"{where}: measures {cls.name!r} must say which tasks they read (tasks, suffix, "
                          "or reads)")
    if not (cls.measures or cls.metrics_read):
        raise PluginError(f"{where}: measures {cls.name!r} must set measures (a table) or metrics_read")
    bad = [m.key for m in cls.measures if not isinstance(m, Measure) or m.kind not in KINDS]
    if bad:
        raise PluginError(f"{where}: measures {cls.name!r}: columns {bad} are not Measures of a kind in {KINDS}")


#: every task reading by name (`rf_eval.plugins.Registry`)
MEASURES: Registry[TaskMeasures] = Registry("measures", TaskMeasures, __name__,
                                            Discovery(env=MEASURES_PATH_ENV, group=ENTRY_POINTS), check=_check)


def register_measures(cls: type[TaskMeasures]) -> type[TaskMeasures]:
    """Add a task reading at run time (a test's throwaway; a notebook's own). Returns `cls`."""
    return MEASURES.register(cls)


def unregister_measures(name: str) -> None:
    """Remove a reading `register_measures` added."""
    MEASURES.unregister(name)


_read: dict[tuple[Any, str], TaskMeasures | None] = {}  # (registry version, task) -> its reading


def reading(task: str) -> TaskMeasures | None:
    """The reading of `task`: the first registered one that reads it (None: none does)."""
    key = (MEASURES.version(), task)
    if key not in _read:
        _read[key] = next((cls() for cls in MEASURES.values() if cls().reads(task)), None)
    return _read[key]


def task_label(task: str, filt: str, metric: str | None = None) -> str:
    """A task as a report's tables name it: "task", "task [filter]", then ": metric" where one is given."""
    label = task if filt == "none" else f"{task} [{filt}]"
    return label if metric is None else f"{label}: {metric}"


def task_measures(task: str) -> TaskMeasures | None:
    """The measures table a task is reported in (None: the generic tables)."""
    found = reading(task)
    return found if found is not None and found.measures else None


def default_metrics(task: str) -> tuple[str, ...]:
    """The metrics a report reads for `task` unless `--metric` names others (empty: its first metric)."""
    found = reading(task)
    return () if found is None else found.default_metrics()


def missing_reason(task: str, metric: str, settings: Mapping[str, Any] | None = None) -> str:
    """Why a measure of `task`'s table can have no per-item values ("" where nothing is known). `settings`:
    the run's task metadata (keytoken_nll's key-token reason names its `key_threshold` and `key_context`)."""
    found = task_measures(task)
    return "" if found is None else found.missing_reason(metric, settings or {})


def missing_note(task: str, metric: str, settings: Mapping[str, Any] | None = None) -> str:
    """The note for one of a task's default measures absent from a run (`settings`: see `missing_reason`)."""
    why = missing_reason(task, metric, settings) or "the run recorded none"
    return f"no per-item values of {metric}: {why}; its column shows –"
