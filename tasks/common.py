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

from rf_eval.cost.prefill_cost import COST_FIELDS, empty_fields
from rf_eval.errors import UserError
from rf_eval.harness import run_context


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


#: the cost fields every rf-eval task writes into its samples (`rf_eval.cost.prefill_cost`), their aggregation (the
#: mean over the samples that have one) and whether higher is better
COST_METRICS: dict[str, tuple[Callable[[Iterable[Any]], float], bool]] = {
    name: (mean_present, name in ("mac_speedup", "layer_pass_speedup")) for name in COST_FIELDS
}


def cost_fields(prompt: Any) -> dict[str, Any]:
    """The prefill cost the run's rf-eval adapter recorded for the request whose first argument is `prompt`
    (`rf_eval.harness.run_context.prompt_cost`), as a sample's fields; every field None under another lm-eval model
    (the report then has no cost for that arm)."""

    return run_context.prompt_cost(prompt) or empty_fields()


#: the per-sample length-cap flag of the generation tasks (`cap_hit`): 1 or 0 per sample, summed to a count
CAP_METRICS: dict[str, tuple[Callable[[Iterable[Any]], float], bool]] = {"cap_hits": (sum_present, False)}


def max_gen_toks(generation_kwargs: Any) -> int | None:
    """The length cap of a task's generation settings (`max_gen_toks`), None where they set none."""
    if not isinstance(generation_kwargs, dict) or generation_kwargs.get("max_gen_toks") is None:
        return None
    return int(generation_kwargs["max_gen_toks"])


def cap_hit(tokenizer: Any, response: Any, cap: int | None) -> int | None:
    """1 when an answer hit its length cap, 0 when it stopped before it, None without a cap or answer (RidgeFill
    paper sections 4.5 and 4.6: "RidgeFill's cwe answers also hit the length cap more often, 12 against 8";
    "the first pass hit its 1,024-token cap on 301 items").

    The rule, one for every lm-eval model (`hf` hands a task only the answer's text): the answer, re-tokenized
    with the run's tokenizer without special tokens, has at least `cap` (max_gen_toks) tokens. An answer that
    ended at a stop sequence or at EOS spent one of its `cap` tokens or more on the stop, and lm-eval's text
    leaves the stop out (cut at the stop string; EOS is a special token, skipped when decoding), so it
    re-tokenizes to fewer. Where decoding and re-encoding do not round-trip the count can be off: a split of a
    word other than the tokenizer's own re-encodes to fewer tokens, the bytes of an incomplete character
    decode to U+FFFD and re-encode to more, special tokens other than EOS are dropped from the text, and a
    thinking model's text after its think-end marker is only its answer. Every arm of a comparison is counted
    by this rule on the same tokenizer.
    """
    if cap is None or response is None:
        return None
    ids = tokenizer(str(response), add_special_tokens=False)["input_ids"]
    return int(len(ids) >= cap)


def option(metadata: dict[str, Any] | None, key: str, default: Any, kind: Callable[[Any], Any] = lambda x: x) -> Any:
    """An option from task metadata (`--metadata` JSON or `--model_args`), typed by `kind`."""
    meta = metadata or {}
    value = meta.get(key)
    return default if value is None or value == "" else kind(value)


def as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class TailMismatch(UserError):
    """The task's tail (metadata `tail`) is not the tail of the arm it scores."""


def run_model() -> dict[str, Any] | None:
    """Facts of the rf-eval adapter this process evaluates (`rf_eval.harness.run_context`), or None."""

    return run_context.current()


def _ruler_tokenizer_name(meta: dict[str, Any]) -> str | None:
    """The tokenizer name lm-eval's RULER takes from a task's metadata: its `resolve_tokenizer_name`
    (lm-eval 0.4.13: `tokenizer`, `pretrained`, `model`). lm-eval 0.5.0.dev1 has no such function; its
    `get_tokenizer` reads `tokenizer`, then `pretrained`, which is what this falls back to there."""
    try:
        from lm_eval.tasks.ruler.common_utils import resolve_tokenizer_name
    except ImportError:
        return next((meta[k] for k in ("tokenizer", "pretrained") if isinstance(meta.get(k), str) and meta[k]), None)
    return resolve_tokenizer_name(meta)


def with_run_defaults(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """Task metadata with what the run's model implies where the run gives nothing: its tokenizer
    (e.g. the embedded demo model's under `--model ridgefill` with no model_args) and the
    model's default task options (`max_seq_lengths` of the demo model)."""
    meta = dict(metadata or {})
    run = run_model()
    if run is None:
        return meta
    named = _ruler_tokenizer_name(meta)
    if run.get("tokenizer") and (named is None or named == run.get("pretrained_alias")):
        # `pretrained=demo` reaches the metadata as given (lm-eval merges model_args in): the run resolved it
        meta["tokenizer"] = run["tokenizer"]
    for key, value in (run.get("task_defaults") or {}).items():
        if meta.get(key) is None:
            meta[key] = value
    return meta


def filled_tail(metadata: dict[str, Any] | None, run: dict[str, Any] | None = None) -> int:
    """The tail that bounds the filled region of the run this task scores.

    Metadata `tail` (from `--metadata`, or from model_args, which lm-eval merges in),
    else the tail of the rf-eval arm being run, else the run's default (the embedded demo model's tail, for
    every method on it), else the shared default (`rf_eval.engine.plan.DEFAULT_TAIL`, 4,096, the paper's). A `tail` that
    contradicts the running arm's is refused: its subset would not be the arm's
    filled region. An arm that fills no rows (fill=exact, `hf`) takes the task's tail,
    so the exact arm is scored on the same subset as the others. Metadata `subset_tail`
    sets the subset's tail on purpose apart from the arm's (the controls that spend their
    rows on a longer tail are scored on the subset of the arms they control). `run`: the run's
    facts (`rf_eval.harness.run_context`; default: the running adapter's).
    """
    from rf_eval.engine.plan import DEFAULT_TAIL

    if (metadata or {}).get("subset_tail") not in (None, ""):
        return int(metadata["subset_tail"])
    given = (metadata or {}).get("tail")
    run = (run_model() if run is None else run) or {}
    arm_tail = run.get("tail") if run.get("fills_rows") else None
    if given is None or given == "":
        if arm_tail is not None:
            return int(arm_tail)
        return int(run.get("default_tail") or DEFAULT_TAIL)
    if arm_tail is not None and int(given) != int(arm_tail):
        raise TailMismatch(
            f"tail={int(given)} (task metadata) contradicts the tail of the arm being run "
            f"({run.get('adapter', 'the model')}, tail={int(arm_tail)}): the filled region is the arm's "
            "prefix, so give the tail once, in --model_args (the task reads it from there), or set "
            "--metadata subset_tail to score a subset other than the arm's filled region on purpose"
        )
    return int(given)


def tokenizer_name(metadata: dict[str, Any] | None) -> str | None:
    """The tokenizer lm-eval's RULER would use (`tokenizer`, `pretrained`, `model`), else the run model's."""
    return _ruler_tokenizer_name(metadata or {}) or (run_model() or {}).get("tokenizer")


def tokenizer_from(metadata: dict[str, Any] | None):
    """The model's tokenizer, found the way lm-eval's RULER finds it (`tokenizer`, `pretrained`, `model`),
    else the tokenizer of the rf-eval adapter being run (`run_model`)."""
    from lm_eval.tasks.ruler.common_utils import get_tokenizer

    name = tokenizer_name(metadata)
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
