"""The two-sweep probe (paper section 2.4, figures 5 and 6).

After the lower layers ran for every row (the first sweep), the last `rows`
(256) prompt rows run the exact late layers over the prefix rows' filled
keys and values; Gated DeltaNet layers start from an empty state and scan
only the probe rows. Each prefix row is ranked by the attention it receives
from the probe rows, summed over the late attention layers and their heads.

The count is E = round(budget * |base|), the base rules' union on the same
prompt: the rarer half of the protected-class matches, every digit token,
and the top 20% of the prefix by lower-layer attention from the last 64 rows.
Lexical-net rows (at most 5% of the prefix) are reserved inside E; the rest
of E goes to the highest-ranked other rows. Special tokens are not counted:
compose `probe+special` to add them on top.

Decisions where the paper is silent:
- Probe rows are the last `rows` prompt rows; prefix rows before them are
  read filled, the rows between the prefix end and the probe rows are not
  yet computed (absent), as in figure 5.
- Layer S's filled rows read the true split state, as in the engine.
- The probe runs the engine's own late-layer step (`rf_eval.engine.run_layer`)
  with a strategy that computes every filled prefix row's keys/values before
  the probe rows, and hands them to the engine as a `Precomputed` strategy
  (`Selection.fill`): the engine writes the exact rows beside them instead of
  computing the filled rows again (unless a correction or splice wraps its fill).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rf_eval.engine import (
    AbsentRows,
    AttentionRows,
    LayerStep,
    Precomputed,
    PredictedInput,
    RowFill,
    Rows,
    Selection,
    exact_rows_beside,
    run_layers,
)
from rf_eval.fills import FILL_OFF, predicting_fills
from rf_eval.selectors.attention import DEFAULT_LAYERS, Attention, attention_mass
from rf_eval.selectors.base import Request, Selector, as_rows, top_rows
from rf_eval.selectors.lexical import LexicalNet
from rf_eval.selectors.tokens import ProtectedTokens, is_digit_token, request_texts


class ProbeSweep(RowFill):
    """The probe's late layers: filled rows' K/V from their predicted inputs, kept in `shared` for the engine.

    Attention layers read the filled rows' K/V (computed apart from the probe
    rows') beside the probe rows' own; Gated DeltaNet layers scan the probe
    rows alone from an empty state (filled rows absent, as in figure 5).
    """

    def __init__(self, predicted: PredictedInput, shared: Precomputed | None):
        self.predicted, self.shared = predicted, shared

    def attention(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> AttentionRows:
        if not step.rows.filled.numel():
            return AbsentRows().attention(step, index, x_exact)
        kv = self.predicted.filled_kv(step, index)
        if self.shared is not None:  # full-length K/V whose first rows the engine reuses
            self.shared.keep(index, kv, step.n)
        return exact_rows_beside(step, index, x_exact, kv)

    def recurrent(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> torch.Tensor:
        return AbsentRows().recurrent(step, index, x_exact)


def probe_sweep(req: Request, rows: int) -> tuple[torch.Tensor, Precomputed | None]:
    """Attention each prompt row receives from the last `rows` rows in the late layers (N,), and their K/V.

    The second value holds the filled prefix rows' K/V for the engine (None
    when no prefix row lies before the probe rows).
    """
    ctx = req.ctx

    # the arm's own strategy (bound once) when it gave one, else a fill from predicted inputs of `req.fill`
    predicted = req.strategy if req.strategy is not None else PredictedInput(req.fill)
    if req.plan.fill == FILL_OFF or type(predicted) is not PredictedInput or predicted.fill is None:
        raise ValueError(f"the probe reads a filled cache: it needs a fill from predicted inputs "
                         f"({', '.join(predicting_fills())})")
    n = req.n
    p0 = max(n - rows, 0)
    filled = torch.arange(min(req.prefix_end, p0))
    probe = torch.arange(p0, n)
    key_rows = torch.cat([filled, probe])
    device = ctx.inputs.x_split.device
    received = torch.zeros(n, dtype=torch.float32)

    def attend(step, q, keys, values, scale, attn):
        window, sinks = step.family.sliding_window(attn), step.family.attention_sinks(attn)
        mass, context = attention_mass(q, keys, scale, step.rows.exact, step.rows.keys, values, window, sinks)
        received[key_rows] += mass.cpu()
        return context.to(values.dtype)

    shared = Precomputed(predicted, filled.numel()) if filled.numel() else None
    step = LayerStep(ctx.family, req.layers(), req.plan, ctx.inputs,
                     Rows(probe.to(device), filled.to(device), key_rows.to(device)), None, attend)
    run_layers(step, ProbeSweep(predicted, shared), ctx.inputs.x_split[:, step.rows.exact])
    return received, shared


def probe_attention(req: Request, rows: int) -> torch.Tensor:
    """Attention each prompt row receives from the last `rows` rows in the late layers (N,)."""
    return probe_sweep(req, rows)[0]


class Probe(Selector):
    """Exact rows ranked by late-layer attention from the last `rows` rows, counted by the base rules."""

    name = "probe"
    counts_rows = True

    def __init__(self, rows: int = 256, budget: float = 1.0, protected_share: float = 0.5,
                 attention_share: float = 0.2, window: int = 64, layers: Sequence[int] = DEFAULT_LAYERS,
                 lexical_cap: float = 0.05, lexical_window: int = 64, unigram: str | None = None):
        if rows < 1 or budget < 0:
            raise ValueError(f"probe needs rows >= 1 and budget >= 0; got rows={rows}, budget={budget}")
        self.rows, self.budget = int(rows), float(budget)
        self.protected = ProtectedTokens(rarest=protected_share, unigram=unigram)
        self.attention = Attention(share=attention_share, window=window, layers=layers, share_of="prefix")
        self.lexical = LexicalNet(window=lexical_window, cap=lexical_cap)
        # its parameters as its parts keep them (what `params` reads back)
        self.protected_share, self.unigram = self.protected.rarest, self.protected.unigram
        self.attention_share, self.window = self.attention.share, self.attention.window
        self.layers = self.attention.layers
        self.lexical_cap, self.lexical_window = self.lexical.cap, self.lexical.window

    def captures(self, req):
        return self.attention.captures(req)

    def base_rows(self, req: Request) -> torch.Tensor:
        """The base rules' union: rarer half of protected matches, digit tokens, top 20% by attention."""
        texts = request_texts(req, self.name)
        digits = torch.tensor([r for r in req.candidates().tolist() if is_digit_token(texts[r])], dtype=torch.long)
        parts = [self.protected.rarest_rows(req, self.protected.rarest), digits, self.attention.select(req).rows]
        return as_rows(torch.cat(parts))

    def probe_rows(self) -> int:
        return self.rows

    def budget_count(self, req: Request) -> int:
        if req.row_budget is not None:  # an arm's budget sets the count
            return min(req.row_budget, req.candidates().numel())
        return min(int(round(self.budget * self.base_rows(req).numel())), req.candidates().numel())

    def count(self, req: Request) -> int:
        """The probe's count is the budget: known without running the probe sweep."""
        return self.budget_count(req)

    def select(self, req):
        count = self.budget_count(req)
        lexical = self.lexical.select(req).rows[:count]
        rest = req.candidates()
        if lexical.numel():
            rest = rest[~torch.isin(rest, lexical)]
        scores, shared = probe_sweep(req, self.rows)
        ranked = top_rows(scores, rest, count - lexical.numel())
        return Selection(as_rows(torch.cat([lexical, ranked])), fill=shared)
