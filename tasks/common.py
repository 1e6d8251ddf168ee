"""Shared pieces of the rf-eval tasks: metric aggregations, options, the tokenizer.

Metrics that do not apply to a sample (a filled-region score of a sample whose
needle is in the tail, a per-length score of another length) are `None` in
that sample's record; the aggregations below skip `None`. An aggregate with no
value to average is NaN.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any


def _present(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def mean_present(values: Iterable[Any]) -> float:
    """Mean of the values that are not None (NaN when there are none)."""
    xs = _present(values)
    return sum(xs) / len(xs) if xs else math.nan


def sum_present(values: Iterable[Any]) -> float:
    """Sum of the values that are not None (a count when the values are 0/1)."""
    return float(sum(_present(values)))


def median_present(values: Iterable[Any]) -> float:
    xs = _present(values)
    return float(statistics.median(xs)) if xs else math.nan


def metric_list(spec: dict[str, tuple[Callable[[Iterable[Any]], float], bool]]) -> list[dict[str, Any]]:
    """lm-eval `metric_list` entries from {name: (aggregation, higher_is_better)}."""
    return [{"metric": k, "aggregation": agg, "higher_is_better": hib} for k, (agg, hib) in spec.items()]


def option(metadata: dict[str, Any] | None, key: str, default: Any, kind: Callable[[Any], Any] = lambda x: x) -> Any:
    """An option from task metadata (`--metadata` JSON or `--model_args`), typed by `kind`."""
    meta = metadata or {}
    value = meta.get(key)
    return default if value is None or value == "" else kind(value)


def as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def tokenizer_from(metadata: dict[str, Any] | None):
    """The model's tokenizer, found the way lm-eval's RULER finds it (`tokenizer`, `pretrained`, `model`)."""
    from lm_eval.tasks.ruler.common_utils import get_tokenizer, resolve_tokenizer_name

    name = resolve_tokenizer_name(metadata or {})
    if name is None:
        raise ValueError(
            "this task tokenizes its prompts with the model's tokenizer: pass `pretrained=` or "
            "`tokenizer=` in --model_args (or `tokenizer` in --metadata)"
        )
    return get_tokenizer(name)


def strip_task_keys(config: dict[str, Any] | None, *keys: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config without `class` and `keys`, the popped keys): lm-eval's TaskConfig takes no others."""
    cfg = dict(config or {})
    cfg.pop("class", None)
    popped = {k: cfg.pop(k) for k in keys if k in cfg}
    return cfg, popped
