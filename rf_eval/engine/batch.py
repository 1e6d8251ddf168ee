"""Several prompts of one length through the engine at once, and their results taken apart again.

Prompts batch when their late-layer rows are the same: equal length, one plan
(its tail rows exact, every other row filled), no selector and no per-prompt
hooks (a selector's rows and a splice's reference differ by prompt). Then every
op of the partial path works row-wise on a leading batch dimension, and each
prompt's result is the one a prefill of it alone gives:

- bitwise on the dense families on CPU, when the exact rows are at least 16:
  a matrix product gives each row the same bits whatever the row count, once
  both counts are past BLAS's small-matrix kernels (16 rows on oneDNN/MKL). The
  last row's logits therefore go through the vocabulary projection one prompt
  at a time (`last_row_logits`): B rows of one each would round differently.
- within rounding (1e-6 in fp32) on the mixture-of-experts families, whose
  experts see the batch's tokens together (as `hf`'s own batches do).

`split_batch` turns a batch's result into one result per prompt, each with a
batch-1 cache of the model's own type.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from rf_eval.engine.plan import Plan, PrefillResult
from rf_eval.families import Family


def check_batch(input_ids: torch.Tensor, plan: Plan, per_prompt_parts: bool) -> None:
    """A ValueError unless `input_ids` is 1 x N, or B x N whose rows the engine can run together."""
    if input_ids.dim() != 2 or input_ids.shape[0] < 1:
        raise ValueError(f"input_ids must be a 1 x N (or B x N) tensor, got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 1:
        return
    if per_prompt_parts:
        raise ValueError(f"a batch of {input_ids.shape[0]} prompts cannot share a selector or hooks (their rows and "
                         "references are per prompt): prefill them one at a time")
    if plan.fills_no_row(input_ids.shape[1]):
        raise ValueError("a batch of prompts with no filled row is the plain model: run them through the stock "
                         "forward (or one at a time through plain_prefill, bitwise)")


def last_row_logits(model: nn.Module, family: Family, x_exact: torch.Tensor) -> torch.Tensor:
    """(B, vocab) logits of each prompt's last row, one prompt at a time (see the module docstring); (B, 0)
    when no row is exact (a generation prefill at tail 0: the held-back token's decode gives the first logits)."""
    if not x_exact.shape[1]:
        return x_exact.new_empty(x_exact.shape[0], 0)
    return torch.cat([family.logits(model, x_exact[b : b + 1, -1:])[:, -1] for b in range(x_exact.shape[0])])


def _take(value, b: int, batch: int):
    """Prompt b's share of one cache attribute: tensors (and dicts of them) whose leading dimension is the batch."""
    if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch:
        return value[b : b + 1]
    if isinstance(value, dict):
        return {k: _take(v, b, batch) for k, v in value.items()}
    return value


def split_cache(cache, b: int, batch: int):
    """Prompt b's batch-1 copy of a `transformers` cache (its tensors are views into the batch's)."""
    one = copy.copy(cache)
    one.layers = []
    for layer in cache.layers:
        mine = copy.copy(layer)
        for name, value in vars(layer).items():
            setattr(mine, name, _take(value, b, batch))
        one.layers.append(mine)
    return one


def split_batch(result: PrefillResult) -> list[PrefillResult]:
    """One `PrefillResult` per prompt of a batch's result (its timings are the whole batch's)."""
    batch = result.logits.shape[0]
    if batch == 1:
        return [result]
    timings = {**result.timings, "batch": batch}
    return [dataclasses.replace(result, cache=split_cache(result.cache, b, batch), logits=result.logits[b : b + 1],
                                timings=dict(timings)) for b in range(batch)]
