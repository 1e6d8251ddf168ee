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

This module is the one place that rule lives: `default_metrics` is what
`load_runs` reads for a task when no `--metric` names others, and
`TaskMeasures` lays out the report's measures table for `keytoken_nll`
(computed in `rf_eval.stats.summary`, rendered by the report templates).

Kinds of measure: `delta`, the paired mean difference arm - reference of a
per-document loss, with its interval, median and heavy-tail flag; `gap`, the
perplexity gap of the same paired loss, domain-averaged; `own`, a value the
arm's run measured against its own exact pass (KL): the arm's mean with its
interval (resampled within the same strata) and median, not a difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KEYTOKEN", "Measure", "TaskMeasures", "default_metrics", "missing_note", "missing_reason", "task_label",
           "task_measures"]

KEYTOKEN_TASK = "keytoken_nll"
FILLED_SUFFIX = "_filled"
FILLED_METRIC = "acc_filled"


@dataclass(frozen=True)
class Measure:
    """One column of a measures table: `key` names it in the summary, `label` in a report."""

    key: str
    label: str
    metric: str
    kind: str  # "delta" | "gap" | "own"
    secondary: bool = False


@dataclass(frozen=True)
class TaskMeasures:
    """A task's measures table: its title, its columns in order, and what its numbers are."""

    title: str
    measures: tuple[Measure, ...]
    description: str

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


KEYTOKEN = TaskMeasures(
    title="Loss on the tokens that need the prefix",
    measures=(
        Measure("key", "key-token ΔNLL", "nll_key", "delta"),
        Measure("novel", "novel-token ΔNLL", "nll_novel", "delta"),
        Measure("novel_gap", "perplexity gap, novel tokens", "nll_novel", "gap"),
        Measure("kl", "KL(exact‖arm)", "kl", "own"),
        Measure("all", "all-token ΔNLL (secondary)", "nll_all", "delta", secondary=True),
    ),
    description=(
        "ΔNLL: the arm's loss minus the reference's, nats per token, per-document means; perplexity gap "
        "exp(ΔNLL) - 1 per document, domain-averaged; KL(exact‖arm): the arm's own mean per-token divergence "
        "from its same-run exact pass (mean, interval, median). All-token ΔNLL is secondary: most scored "
        "tokens do not depend on the prefix (paper sections 3.1, 4.7)."
    ),
)

#: Why a measure can have no per-item values, for the note a report prints (`nll_key`: `missing_reason`).
_MISSING = {
    "nll_novel": "no document has novel tokens",
    "kl": "KL(exact‖arm) needs the arm's same-run exact pass (reference=exact in --model_args)",
    "nll_all": "no document was scored",
}


def task_label(task: str, filt: str, metric: str | None = None) -> str:
    """A task as a report's tables name it: "task", "task [filter]", then ": metric" where one is given."""
    label = task if filt == "none" else f"{task} [{filt}]"
    return label if metric is None else f"{label}: {metric}"


def task_measures(task: str) -> TaskMeasures | None:
    """The measures table a task is reported in (None: the generic tables)."""
    return KEYTOKEN if task == KEYTOKEN_TASK else None


def default_metrics(task: str) -> tuple[str, ...]:
    """The metrics a report reads for `task` unless `--metric` names others (empty: its first metric)."""
    spec = task_measures(task)
    if spec is not None:
        return tuple(spec.metrics)
    if task.endswith(FILLED_SUFFIX):
        return (FILLED_METRIC,)
    return ()


def missing_reason(task: str, metric: str, settings: Mapping[str, Any] | None = None) -> str:
    """Why a measure of `task`'s table can have no per-item values ("" where nothing is known). `settings`:
    the run's task metadata, whose `key_threshold` and `key_context` (keytoken_nll records them) the
    key-token reason names; the task's own warning says the same (`token_masks.no_key_tokens`)."""
    if task_measures(task) is None:
        return ""
    if metric == "nll_key":
        from rf_eval.tasks.token_masks import no_key_tokens

        given = settings or {}
        return no_key_tokens(given.get("key_threshold"), given.get("key_context"))
    return _MISSING.get(metric, "")


def missing_note(task: str, metric: str, settings: Mapping[str, Any] | None = None) -> str:
    """The note for one of a task's default measures absent from a run (`settings`: see `missing_reason`)."""
    why = missing_reason(task, metric, settings) or "the run recorded none"
    return f"no per-item values of {metric}: {why}; its column shows –"
