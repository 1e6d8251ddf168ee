"""RULER lengths the model can hold: refused up front when a length is beyond the model's positions.

lm-eval left-truncates a prompt longer than the model's `max_length` (`hf`'s generate_until keeps its last
`max_length - max_gen_toks` tokens). A RULER sample built at such a length loses its haystack's beginning, and
with it any needle placed there, yet `acc_filled` would still score it as a filled-region sample. So a
filled RULER task refuses every `max_seq_lengths` entry above the model's `max_length` (lm-eval's own
resolution: the `max_length` model_arg, else the config's `n_positions` / `max_position_embeddings` /
`n_ctx`, nested `text_config` first), twice:

- before the weights load (`check_lengths_fit`, from `rf_eval.tasks.data_needs.preflight`, which lm_eval and
  `rf-eval study plan/run` call), reading only the model's config;
- when the task is built (`refuse_beyond`), against the running adapter's own `max_length`, which also
  covers a limit only the tokenizer states and the demo model's defaults.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rf_eval.errors import UserError


def as_lengths(value: Any) -> list[int]:
    """`max_seq_lengths` as a list of positive ints (one int is taken as a list of one); a UserError names a
    value that is neither."""
    items = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(items, str) or not isinstance(items, (list, tuple)):
        raise UserError(f"max_seq_lengths={value!r} is not a list of token counts; give e.g. "
                        "--metadata '{\"max_seq_lengths\": [4096, 8192]}'")
    lengths = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item <= 0:
            raise UserError(f"max_seq_lengths holds {item!r}, not a positive number of tokens; give e.g. "
                            "--metadata '{\"max_seq_lengths\": [4096, 8192]}'")
        lengths.append(item)
    return lengths


def refuse_beyond(task: str, lengths: Iterable[int], max_length: int | None, where: str) -> None:
    """A UserError naming the lengths above `max_length` (the model's positions, as lm-eval resolves them)."""
    if not max_length:
        return
    over = [n for n in lengths if n > max_length]
    if over:
        raise UserError(
            f"{task}: max_seq_lengths {', '.join(map(str, over))} exceed{'s' if len(over) == 1 else ''} the "
            f"model's {max_length:,} positions ({where}); lm-eval would cut the prompt's start, needles "
            f"included. Give max_seq_lengths up to {max_length}, or a larger max_length model_arg if the "
            "model's position encoding holds it")


def refuse_unfilled(task: str, lengths: Iterable[int], tail: int, where: str, own_tail: bool = True) -> None:
    """A UserError where every length is within the tail: no needle can lie in the filled region (the rows
    before the exact tail), so `acc_filled` would be empty (NaN) while the run exits 0. `own_tail`: whether
    the tail is one the run set (an arm's, or given); else the default, for a method with no tail of its own
    (a dropper, a sparse prefill), whose fix is the subset's tail, not a `tail=` it would refuse."""
    lengths = list(lengths)
    if lengths and all(n <= tail for n in lengths):
        smaller = ("a smaller tail= in --model_args" if own_tail else
                   f"the rows the task counts as exact: --metadata '{{\"subset_tail\": {min(lengths) // 4}}}'")
        raise UserError(
            f"{task}: every max_seq_lengths entry ({', '.join(map(str, lengths))}) is within the exact tail "
            f"of {tail:,} rows ({where}), so no item has a filled region to score. Give lengths above the tail "
            f"(--metadata '{{\"max_seq_lengths\": [{2 * tail}]}}') or {smaller}")


def config_max_length(metadata: dict[str, Any]) -> tuple[int | None, str]:
    """The model's `max_length` as lm-eval would resolve it, read without the weights: the `max_length`
    model_arg, else the checkpoint's config; (None, "") where neither is readable here (the task's own
    check, with the loaded model, still runs)."""
    given = metadata.get("max_length")
    if given not in (None, ""):
        try:
            value = int(float(given))
        except (TypeError, ValueError):
            return None, ""  # the adapter names a bad max_length itself
        return (value, f"max_length={given}") if value >= 2 else (None, "")
    pretrained = metadata.get("pretrained")
    if not isinstance(pretrained, str) or not pretrained:
        return None, ""
    try:
        from lm_eval.models.utils import resolve_max_length
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(pretrained, revision=metadata.get("revision") or "main",
                                            trust_remote_code=bool(metadata.get("trust_remote_code")))
        found = resolve_max_length(config, None, default=0)
    except Exception:  # an unreadable config is the model load's to report, with its own message
        return None, ""
    return (int(found), f"{pretrained}'s config") if found else (None, "")


def check_lengths_fit(tasks: Iterable[str], metadata: dict[str, Any]) -> list[str]:
    """One problem line per filled RULER task of `tasks` whose `max_seq_lengths` exceed the model's positions."""
    if metadata.get("max_seq_lengths") in (None, ""):
        return []  # the task's default lengths: checked when it is built, against the running model
    max_length, where = config_max_length(metadata)
    problems = []
    for task in tasks:
        try:
            refuse_beyond(task, as_lengths(metadata["max_seq_lengths"]), max_length, where)
        except UserError as err:
            problems.append(str(err))
    return problems
