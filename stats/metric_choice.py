"""Which metrics a report reads of a task's samples: the ones asked for (`--metric`), the task's default
measures (`rf_eval.stats.measures`), or its first metric, which must have per-item values; and, where the
primary one has none, why (the filled-region subset empty, no key tokens under the run's settings)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rf_eval.stats.measures import default_metrics, missing_note, missing_reason
from rf_eval.stats.provenance import EmptyMetricError, RunFormatError

RULER_SCORE = "score"
LENGTH_KEYS = ("max_length", "max_seq_length", "context_length", "length")


def number(value: Any) -> float | None:
    """A finite number from a sample field (bools and non-numbers: None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def doc_length(doc: dict[str, Any]) -> int | str | None:
    """A sample document's length, from the first of LENGTH_KEYS it holds."""
    for key in LENGTH_KEYS:
        value = doc.get(key)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)) and float(value).is_integer():
            return int(value)
        if isinstance(value, str) and value.strip():
            return int(value) if value.strip().isdigit() else value.strip()
    return None


def task_metrics(
    names: list[str], samples: list[dict[str, Any]], requested: Sequence[str], where: str, task: str, notes: list[str],
    settings: dict[str, Any] | None = None,
) -> list[str]:
    """The metrics to report: `requested`, the task's default measures, or its first metric (which must have values).
    `settings`: the run's task metadata, which the reason for an empty measure names (`missing_reason`)."""
    if names and all(n.isdigit() for n in names):
        available = [RULER_SCORE]
    else:
        available = [n for n in names if any(number(s.get(n)) is not None for s in samples)]
    for metric in requested:
        if metric not in available:
            raise RunFormatError(
                f"{where}: no per-item values of metric {metric!r}; metrics with values: {', '.join(available)}"
            )
    if requested:
        return list(requested)
    defaults = [m for m in default_metrics(task) if m in names]
    # the first default measure with values is the primary one; none with values is an empty primary
    primary = next((m for m in defaults if m in available), defaults[0]) if defaults else (names or [None])[0]
    if primary is not None and available[:1] != [RULER_SCORE] and primary not in available:
        reason = missing_reason(task, primary, settings)
        why = f" ({reason})" if reason else ""
        raise EmptyMetricError(
            f"{where}: the primary metric {primary!r} has no value on any item{why_empty(samples)}{why}; "
            f"name a metric with --metric TASK=METRIC (with values: {', '.join(available) or 'none'}), "
            "or pass --allow-empty to leave the task out"
        )
    if defaults:
        notes += [f"{where}: {missing_note(task, m, settings)}" for m in defaults if m not in available]
        return [m for m in defaults if m in available]
    return available[:1]


def why_empty(samples: list[dict[str, Any]]) -> str:
    """For filled-region tasks: the tail and lengths (no needle lay before the exact tail)."""
    rows = [number(s.get("needle_rows_from_end")) for s in samples]
    rows = [int(r) for r in rows if r is not None]
    if not rows and not any("filled" in s for s in samples):
        return ""
    lengths = sorted({str(doc_length(s.get("doc") or {})) for s in samples})
    tail = next((s.get("tail") for s in samples if s.get("tail") is not None), None)
    far = f", the farthest needle {max(rows)} rows from the end" if rows else ""
    return (f" (no item is filled: the exact tail{'' if tail is None else f' {tail}'} covers every needle; "
            f"lengths {', '.join(lengths)}{far}; use a shorter tail or longer max_seq_lengths)")
