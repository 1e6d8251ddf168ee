"""Log-probabilities for responses: of generated tokens, and of a prompt's own tokens under an arm (echo)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TokenScore:
    """A token, its log-probability (None where the arm computes no logits) and the top-k alternatives."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


def token_score(logits: torch.Tensor, token: int, k: int) -> TokenScore:
    """`token`'s log-probability under one row of logits (V,), with the k most likely tokens."""
    logp = F.log_softmax(logits.float(), dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        values, indices = logp.topk(min(k, logp.shape[-1]))
        top = tuple(zip(indices.tolist(), values.tolist()))
    return TokenScore(int(token), float(logp[token]), top)


@torch.no_grad()
def score_prompt(model: nn.Module, method: Any, ids: list[int], k: int) -> list[TokenScore]:
    """Log-probabilities of the prompt's own tokens under `method`'s arm.

    A plain prompt: one stock forward over it (the first token has none). A
    filled arm computes logits for its tail rows only: the prompt minus its
    last T-1 tokens is prefilled with those tokens held back (`held_back`:
    every row keeps its class, selectors and cost match included), and they
    run through the stock model over that cache (the plan's `exact_tail`: RaReCache's
    exact rows depend on the whole prompt, so only its last row is, and none
    of its prompt tokens are scored). Tokens predicted by filled rows get
    None: lm-eval's loglikelihood requests through such an arm must keep
    their continuation within the tail.
    """
    n = len(ids)
    device = method.device
    plan = method.plan(n)  # the request's one decision
    if plan.plain:
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0]
        first = 1
    else:
        m = min(plan.exact_tail - 1, n - 1)
        result = method.prefill(torch.tensor([ids[: n - m]], device=device), held_back=m, plan=plan)
        rows = [result.logits]
        if m > 1:
            rows.append(method.extend(result, torch.tensor([ids[n - m : n - 1]], device=device))[0])
        logits = torch.cat(rows, 0)
        first = n - m
    scored = [token_score(logits[i - first], ids[i], k) for i in range(first, n)]
    return [TokenScore(t, None) for t in ids[:first]] + scored
