"""The ridge lambda: the paper's default, the grid's checks, and the choice on held-out documents (section 2.2).

A lambda is chosen per split by the mean cache-write cosine the solved maps
reach on held-out documents (`choose_lambda`); with one lambda, or none and
no held-out text, nothing is scored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from rf_eval.devices import all_reduce, rank_and_world
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT
from rf_eval.ridge.calibration import tokenized
from rf_eval.ridge.capture import heldout_cosines
from rf_eval.ridge.fit_memory import gib, heldout_budget, lambdas_per_pass, maps_bytes
from rf_eval.ridge.sums import LAMBDA_GRID, RidgeSums

log = logging.getLogger(__name__)

Maps = tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]  # (A, b) per late layer, fp32
DEFAULT_LAMBDA = 0.03  # the value the paper's grid search chose on most models (section 2.2)


def check_lambdas(lambdas: Sequence[float] | None, have_heldout: bool) -> tuple[float, ...]:
    """The lambdas to solve for: the grid when held-out text can choose, else the default; each > 0, and
    several only with held-out text."""
    if lambdas is None:
        return LAMBDA_GRID if have_heldout else (DEFAULT_LAMBDA,)
    bad = [lam for lam in lambdas if not lam > 0]
    if bad or not lambdas:
        raise ValueError(f"lambda must be > 0; got {list(lambdas)}")
    if len(lambdas) > 1 and not have_heldout:
        raise ValueError(f"choosing among {len(lambdas)} lambdas needs held-out documents (--heldout)")
    return tuple(lambdas)


@dataclass(frozen=True)
class HeldoutScoring:
    """How the held-out documents score each lambda (`choose_lambda`): the documents, their length cap,
    whether layer S's own map is scored (`map_split`) and the GiB of maps one pass may hold (`memory`)."""

    documents: Sequence[str | Path] = ()
    max_tokens: int = 32768
    progress: bool = True
    map_split: bool = DEFAULT_MAP_SPLIT
    memory: str | float | None = "auto"


def choose_lambda(
    model: nn.Module,
    tokenizer,
    sums: RidgeSums,
    lambdas: Sequence[float],
    scoring: HeldoutScoring,
    target: str = "inputs",
) -> tuple[float, dict[float, float], Maps]:
    """Pick the lambda with the best mean cache-write cosine on held-out documents (section 2.2).

    Returns (best lambda, score per lambda, the best lambda's (A, b)). The grid
    is scored in passes of `lambdas_per_pass` lambdas within `scoring.memory`
    GiB of maps (`heldout_budget`; auto: a share of the available memory):
    each pass solves its lambdas, runs the held-out documents once and frees
    its maps, keeping the best lambda's so far. Scores do not depend on the
    grouping (each lambda's cosines are summed on its own), and ties go to the
    earlier lambda of the grid as in one pass. Every process uses the smallest
    group any process chose, so the all-reduced passes line up.
    `scoring.map_split`: layer S's own map is scored too (the arm's `map_split`, see `heldout_cosines`).
    """
    if len(lambdas) == 1:
        return lambdas[0], {}, sums.solve(lambdas[0])
    d_out = sums.cxy[sums.layers[0]].shape[1] if sums.cxy else sums.d_in
    per_lambda = maps_bytes(sums.d_in, len(sums.layers), d_out)
    budget, why = heldout_budget(scoring.memory)
    group = _smallest_over_ranks(lambdas_per_pass(budget, per_lambda, len(lambdas)))
    passes = [tuple(lambdas[i:i + group]) for i in range(0, len(lambdas), group)]
    log.info("held-out: %d lambdas in %d pass%s of <= %d (%s; %s of maps per lambda)",
             len(lambdas), len(passes), "" if len(passes) == 1 else "es", group, why, gib(per_lambda))
    device = next(model.parameters()).device
    scores: dict[float, float] = {}
    best, best_maps = lambdas[0], None
    for i, chunk in enumerate(passes):
        solved = {lam: sums.solve(lam) for lam in chunk}
        desc = f"held-out (split {sums.split}, pass {i + 1}/{len(passes)})"
        docs = tokenized(tokenizer, scoring.documents, device, scoring.max_tokens, desc, scoring.progress)
        raw = heldout_cosines(model, docs, sums.split, solved, scoring.map_split, target)
        totals = torch.tensor([[raw[lam][0], raw[lam][1]] for lam in chunk], dtype=torch.float64)
        if rank_and_world()[1] > 1:
            all_reduce(totals)
        for j, lam in enumerate(chunk):
            scores[lam] = float(totals[j, 0] / max(totals[j, 1], 1))
            if best_maps is None or scores[lam] > scores[best]:  # max()'s rule: the first best wins
                best, best_maps = lam, solved[lam]
        del solved, raw  # this pass's maps, except the best's
    return best, scores, best_maps


def _smallest_over_ranks(group: int) -> int:
    if rank_and_world()[1] <= 1:
        return group
    value = torch.tensor([group], dtype=torch.int64)
    all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())
