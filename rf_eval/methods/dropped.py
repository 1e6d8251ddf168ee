"""What a token-dropping prefill leaves: a cache of the kept prompt rows only, in every layer, and where
decoding goes on from.

A dropper (RidgeFill paper section 7: "a skipped token leaves no cache entry
at all") reads the whole prompt, keeps k of its N rows and prefills the model
on those alone. Its cache holds k rows in every layer, at the positions the
method gives them: renumbered 0..k-1 (GemFilter) or their original positions
(Speculative Prefill). Whatever follows the prompt (a continuation scored, the
tokens decoded) runs the stock model over that cache, at the positions after
the last kept row, or from N on where the method's authors count every prompt
token (Speculative Prefill; `continues_at_prompt_end`, `decoding_positions`).

`DroppedResult` records the kept rows and their positions beside the engine's
`PrefillResult` fields; `generation_inputs` is the one rule for what
`model.generate` is handed after a prefill (the kept tokens and their positions
for a dropper, the prompt for every other method), and `extend_dropped` runs
continuation tokens at their positions. The module sits beside the prefill
protocol (`rf_eval.methods.requests`), not in `rf_eval.drop`: every request path reads
`generation_inputs`, and the droppers import that protocol.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from rf_eval.engine import PrefillResult, extend

__all__ = ["DroppedResult", "decoding_positions", "extend_after", "extend_dropped", "generation_inputs"]


@dataclass
class DroppedResult(PrefillResult):
    """A dropper's prefill of an N-row prompt (`prompt_rows`): its cache holds the `kept` rows (sorted prompt
    indices) at `positions` (k); `prompt_length` counts the tokens read (N, then every token after them)."""

    kept: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    positions: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    prompt_rows: int = 0
    #: the token after the prompt sits at position N, the prompt's own end, not after the last kept row
    #: (Speculative Prefill: its authors' scheduler counts all N prompt tokens)
    continues_at_prompt_end: bool = False

    @property
    def offset(self) -> int:
        """The position of the token at sequence index i >= N is i + offset: after the last kept row, or at i
        itself (`continues_at_prompt_end`)."""
        if self.continues_at_prompt_end:
            return 0
        return int(self.positions[-1]) + 1 - self.prompt_rows if self.positions.numel() else -self.prompt_rows


def generation_inputs(result: PrefillResult | None, prompt: list[int]) -> tuple[list[int], list[int] | None]:
    """(the tokens `model.generate` is handed, their positions or None for 0..len-1) after `result`, for the
    token sequence `prompt` (the prompt, and for a later turn what followed it). A dropper's cache holds its
    kept rows: generate gets the kept tokens at their positions, then the rest of the sequence after them,
    and runs those of them the cache does not hold yet. A cache cut to a capacity (FastKV's) holds fewer rows
    in its first layer than the prompt: generate gets as many of the prompt's tokens as it holds (never run),
    then the rest at their own positions."""
    if not isinstance(result, DroppedResult):
        held = None if result is None else result.cache.get_seq_length()
        if held is None or held == result.prompt_length:
            return prompt, None
        return (prompt[:held] + prompt[result.prompt_length:],
                list(range(held)) + list(range(result.prompt_length, len(prompt))))
    kept = result.kept.tolist()
    after = prompt[result.prompt_rows :]
    positions = result.positions.tolist() + list(range(result.prompt_rows + result.offset,
                                                       len(prompt) + result.offset))
    return [prompt[i] for i in kept] + after, positions


@contextmanager
def decoding_positions(model: Any, result: PrefillResult | None, prompt: list[int], positions: list[int] | None):
    """Around `model.generate` handed `positions` (`generation_inputs`) after `result`: generate numbers each
    token it decodes after the last position handed to it, which for a dropper whose decoding continues at the
    prompt's end (`continues_at_prompt_end`) and whose last prompt row was not kept is too early. The tokens
    past the last handed position are moved to where the method puts them (len(prompt) + offset on); every
    other generation is left as it is."""
    gap = 0
    if isinstance(result, DroppedResult) and positions:
        gap = len(prompt) + result.offset - (positions[-1] + 1)
    if not gap:
        yield
        return
    last = positions[-1]

    def shift(_module, args, kwargs):
        given = kwargs.get("position_ids")
        if given is not None:
            kwargs["position_ids"] = torch.where(given > last, given + gap, given)
        return args, kwargs

    handle = model.register_forward_pre_hook(shift, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def extend_dropped(model, result: DroppedResult, tokens: torch.Tensor) -> torch.Tensor:
    """The stock model over `tokens` (1 x m) after a dropper's prefill, at the positions after its last kept
    row: their logits (1, m, V). Every layer holds the same rows, so the stock causal mask over the cache is
    the right one; only the positions (RoPE) are the method's. Advances `prompt_length`."""
    start = result.prompt_length + result.offset
    positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)[None]
    logits = model(input_ids=tokens, cache=result.cache, use_cache=True, position_ids=positions).logits
    result.prompt_length += tokens.shape[1]
    return logits


def extend_after(model, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
    """The stock model over `tokens` (1 x m) after any method's prefill: at the positions after a dropper's last
    kept row (`extend_dropped`), else after the prompt (`rf_eval.engine.extend`)."""
    if isinstance(result, DroppedResult):
        return extend_dropped(model, result, tokens)
    return extend(model, result, tokens)
