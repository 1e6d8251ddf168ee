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
- The probe computes the filled keys/values of every prefix row before the
  probe rows and hands them to the engine (`PrefillContext.filled_kv`), which
  writes the exact rows beside them instead of computing the filled rows
  again (unless a correction or splice changes filled K/V).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rf_eval.engine import FilledKV, Selection
from rf_eval.selectors.attention import DEFAULT_LAYERS, Attention, attention_mass
from rf_eval.selectors.base import Request, Selector, as_rows, top_rows
from rf_eval.selectors.lexical import LexicalNet
from rf_eval.selectors.tokens import ProtectedTokens, is_digit_token, request_texts


def probe_attention(req: Request, rows: int) -> torch.Tensor:
    """Attention each prompt row receives from the last `rows` rows in the late layers (N,)."""
    ctx = req.ctx
    if req.plan.fill not in ("identity", "ridge") or req.fill is None:
        raise ValueError("the probe reads a filled cache: it needs fill='identity' or 'ridge'")
    n, split = req.n, req.plan.split
    p0 = max(n - rows, 0)
    filled = torch.arange(min(req.prefix_end, p0))
    probe = torch.arange(p0, n)
    key_rows = torch.cat([filled, probe])
    x_split, cos, sin = ctx.inputs.x_split, ctx.inputs.cos, ctx.inputs.sin
    device = x_split.device
    filled_d, probe_d, key_d = filled.to(device), probe.to(device), key_rows.to(device)
    x = x_split[:, probe_d]
    received = torch.zeros(n, dtype=torch.float32)
    layers = req.layers()
    shared = FilledKV(rows=filled.numel()) if ctx.filled_kv is None and filled.numel() else None
    for index in range(split, len(layers)):
        layer = layers[index]
        h = layer.input_layernorm(x)
        if ctx.family.is_recurrent(layer):
            mixed = layer.linear_attn(hidden_states=h, cache=None, attention_mask=None)
        else:
            attn = layer.self_attn
            k, v = ctx.family.kv(attn, h, cos[:, probe_d], sin[:, probe_d])
            if filled.numel():
                x_f = x_split[:, filled_d]
                x_f = x_f if index == split else req.fill(index, x_f)
                k_f, v_f = ctx.family.kv(attn, layer.input_layernorm(x_f), cos[:, filled_d], sin[:, filled_d])
                if shared is not None:  # full-length K/V whose first rows the engine reuses
                    k_all = k_f.new_empty((*k_f.shape[:2], n, k_f.shape[-1]))
                    v_all = v_f.new_empty((*v_f.shape[:2], n, v_f.shape[-1]))
                    k_all[:, :, : filled.numel()], v_all[:, :, : filled.numel()] = k_f, v_f
                    shared.kv[index] = (k_all, v_all)
                k, v = torch.cat([k_f, k], 2), torch.cat([v_f, v], 2)
            q, gate = ctx.family.query(attn, h, cos[:, probe_d], sin[:, probe_d])
            mass, context = attention_mass(q, k, attn.scaling, probe_d, key_d, v)
            received[key_rows] += mass.cpu()
            mixed = ctx.family.attention_output(attn, context.to(h.dtype), gate)
        x = ctx.family.mlp(layer, x + mixed)
    if shared is not None:
        ctx.filled_kv = shared
    return received


class Probe(Selector):
    """Exact rows ranked by late-layer attention from the last `rows` rows, counted by the base rules."""

    name = "probe"

    def __init__(self, rows: int = 256, budget: float = 1.0, protected_share: float = 0.5,
                 attention_share: float = 0.2, window: int = 64, layers: Sequence[int] = DEFAULT_LAYERS,
                 lexical_cap: float = 0.05, lexical_window: int = 64, unigram: str | None = None):
        if rows < 1 or budget < 0:
            raise ValueError(f"probe needs rows >= 1 and budget >= 0; got rows={rows}, budget={budget}")
        self.rows, self.budget = int(rows), float(budget)
        self.protected = ProtectedTokens(rarest=protected_share, unigram=unigram)
        self.attention = Attention(share=attention_share, window=window, layers=layers, share_of="prefix")
        self.lexical = LexicalNet(window=lexical_window, cap=lexical_cap)

    def params(self):
        return {"rows": self.rows, "budget": self.budget, "protected_share": self.protected.rarest,
                "attention_share": self.attention.share, "window": self.attention.window,
                "layers": list(self.attention.layer_ids), "lexical_cap": self.lexical.cap,
                "lexical_window": self.lexical.window,
                "unigram": self.protected.params()["unigram"]}

    def captures(self, req):
        return self.attention.captures(req)

    def base_rows(self, req: Request) -> torch.Tensor:
        """The base rules' union: rarer half of protected matches, digit tokens, top 20% by attention."""
        texts = request_texts(req, self.name)
        digits = torch.tensor([r for r in req.candidates().tolist() if is_digit_token(texts[r])], dtype=torch.long)
        parts = [self.protected.rarest_rows(req, self.protected.rarest), digits, self.attention.select(req).rows]
        return as_rows(torch.cat(parts))

    def budget_count(self, req: Request) -> int:
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
        scores = probe_attention(req, self.rows)
        ranked = top_rows(scores, rest, count - lexical.numel())
        return Selection(as_rows(torch.cat([lexical, ranked])))
