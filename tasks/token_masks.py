"""Token subsets of key-token loss (paper sections 3.1 and 4.7).

All functions take a token sequence (the prompt the model read, then the
scored tokens) and the index where scoring starts, and return one flag per
scored token.

- novel: not inside any `n`-token run (default 8) that also occurs earlier in
  the sequence (section 3.1);
- copyable: the token and the `n` tokens before it already occur earlier in
  the sequence (section 4.7's slightly stricter rule: "the token and the 8
  tokens before it already occur earlier in the window"; the sequence is the
  window the model read, context then scored tokens); a document's copyable
  share is the fraction of its scored tokens that are copyable;
- key: the exact loss rises by more than `threshold` nats (default 2) when the
  context is cut to its last 4,096 tokens (section 3.1); with none in a document
  set, `no_key_tokens` says why (the key-token measures have nothing to average).
"""

from __future__ import annotations

from collections.abc import Sequence


def repeated_starts(tokens: Sequence[int], n: int) -> list[bool]:
    """For each start s, whether the run tokens[s:s+n] also starts at some earlier position."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for s in range(len(tokens) - n + 1):
        gram = tuple(tokens[s : s + n])
        out.append(gram in seen)
        seen.add(gram)
    return out


def novel_mask(tokens: Sequence[int], start: int, n: int = 8) -> list[bool]:
    """Scored tokens (positions start..end) that lie inside no repeated `n`-token run."""
    rep = repeated_starts(tokens, n)
    out = []
    for i in range(start, len(tokens)):
        lo, hi = max(0, i - n + 1), min(i, len(rep) - 1)
        out.append(not any(rep[s] for s in range(lo, hi + 1)))
    return out


def copyable_mask(tokens: Sequence[int], start: int, n: int = 8) -> list[bool]:
    """Scored tokens whose run of n+1 tokens ending at them occurs earlier in the sequence."""
    rep = repeated_starts(tokens, n + 1)
    return [i - n >= 0 and rep[i - n] for i in range(start, len(tokens))]


def copyable_share(tokens: Sequence[int], start: int, n: int = 8) -> float | None:
    """The share of the scored tokens that are copyable (`copyable_mask`): section 4.7's "copyable share" of a
    document, the fact its Table 13 splits documents by (`rf_eval.stats.copyable`); None with none scored."""
    mask = copyable_mask(tokens, start, n)
    return sum(mask) / len(mask) if mask else None


def key_mask(full_logprobs: Sequence[float], cut_logprobs: Sequence[float], threshold: float = 2.0) -> list[bool]:
    """Tokens whose exact loss with the cut context exceeds the full-context loss by > threshold nats."""
    if len(full_logprobs) != len(cut_logprobs):
        raise ValueError(f"{len(full_logprobs)} full-context and {len(cut_logprobs)} cut-context log-probabilities")
    return [(f - c) > threshold for f, c in zip(full_logprobs, cut_logprobs)]


def masked_mean(values: Sequence[float], mask: Sequence[bool] | None = None) -> float | None:
    """Mean of the values where mask is true (all values without a mask); None if none."""
    xs = list(values) if mask is None else [v for v, m in zip(values, mask) if m]
    return sum(xs) / len(xs) if xs else None


def no_key_tokens(threshold: float | None = None, context: int | None = None) -> str:
    """Why a set of documents has no key tokens, for the task's warning and a report's note (the
    settings in words when they are not known)."""
    settings = (f"key_threshold={threshold} nats, key_context={context} tokens"
                if threshold is not None and context is not None else "key_threshold, key_context")
    return (f"no key tokens in these documents ({settings}): no scored token's exact loss rises by more than "
            "key_threshold when the context is cut to its last key_context tokens (a document whose context is "
            "not longer than key_context has none); lower key_threshold or key_context in --metadata, or give "
            "longer documents")
