"""GemFilter (Shi et al., 2024): an early layer's attention picks the rows, the whole model reruns on them.

The authors' rule (SalesforceAIResearch/GemFilter, `my_utils/my_generation.py`
and `gem_filter_utils.py`): pass 1 runs layers 0..r (the filter layer) over the
whole prompt; at layer r the last prompt row's query (after RoPE) is dotted
with every key (after RoPE), raw logits (no 1/sqrt(d) scale, no softmax),
summed over every query head (keys repeated across their group); the scores
are smoothed along the tokens by an average pool of 5 (padding 2, counted);
the top k rows (1,024 by default; every row of a shorter prompt), in their
original order, are the prompt pass 2 prefills with the whole model, at
positions 0..k-1; decoding goes on from position k over that k-row cache.
No row is forced in: the last prompt row is kept only if it scores high.

The filter layer: the authors use 13 of Llama-3.1-8B's 32 layers (19 of
Mistral-Nemo's 40, of Phi-3.5's 32); by default rf-eval takes 13/32 of the
model's depth, floor(13 L / 32), and `filter_layer=` names another (0..L-2).
Pass 1 here stops before layer r + 1, as the authors' truncated model does;
their pass 1 also computes the last row's logits, which nothing reads and the
cost here does not charge.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rf_eval.cost.mac_model import causal_pairs, layer_costs
from rf_eval.drop.base import Dropper, DropperArm
from rf_eval.engine import decoder_layers, new_cache, run_lower_layers
from rf_eval.families import family_for
from rf_eval.fields import ArmError

__all__ = ["GemFilter", "filter_layer"]

#: the authors' default: 13 of Llama-3.1-8B's 32 layers
FILTER_DEPTH = (13, 32)
DEFAULT_KEEP = 1024
POOL = 5


def filter_layer(model_config, given: int | None) -> int:
    """The filter layer r: `given`, else floor(13 L / 32); an ArmError for one outside 0..L-2 or not an attention
    layer (the rule reads its queries and keys)."""
    n_layers = int(model_config.num_hidden_layers)
    r = given if given is not None else n_layers * FILTER_DEPTH[0] // FILTER_DEPTH[1]
    if not 0 <= r <= n_layers - 2:
        raise ArmError(f"filter_layer={r} is outside 0..{n_layers - 2} for this {n_layers}-layer model (layer "
                       f"{n_layers - 1} would make pass 1 the whole model)")
    types = getattr(model_config, "layer_types", None) or []
    if r < len(types) and types[r] != "full_attention":
        raise ArmError(f"filter_layer={r} is a {types[r]} layer; GemFilter reads a full-attention layer's queries "
                       "and keys: name another filter_layer")
    return r


class GemFilter(Dropper):
    """GemFilter's two passes; see the module docstring."""

    name = "gemfilter"
    renumbered = True
    budget_knob = "the kept rows (k)"

    @dataclass(frozen=True, kw_only=True)
    class Arm(DropperArm):
        """`keep` (k, default 1,024), `keep_share` or `budget`; `filter_layer` (r, default floor(13 L / 32))."""

        filter_layer: int | None = None

    def bind_model(self) -> None:
        self.layer = filter_layer(self.model.config, self.arm.filter_layer)

    def keep_count(self, n: int) -> int:
        if self.arm.keep_share is not None:
            return max(1, int(self.arm.keep_share * n))
        return self.arm.keep if self.arm.keep is not None else DEFAULT_KEEP

    def score_macs(self, n: int) -> int:
        """Pass 1: layers 0..r over every row, and the last row's query against every key of layer r."""
        costs = layer_costs(self.model.config)[: self.layer + 1]
        rows = sum(n * (c.write + c.rest) + c.attn_per_key * causal_pairs(0, n, c.window) for c in costs)
        return rows + costs[-1].attn_per_key // 2 * n

    @torch.no_grad()
    def scores(self, ids: torch.Tensor) -> torch.Tensor:
        """Layer r's raw last-row logits over every key, summed over the query heads, pooled (N,), fp32."""
        n = ids.shape[1]
        cache = new_cache(self.model)
        inputs, lower = run_lower_layers(self.model, ids, self.layer + 1, cache, capture={self.layer: slice(n - 1, n)})
        layer = decoder_layers(self.model)[self.layer]
        family = family_for(self.model.config)
        q, _ = family.query(layer.self_attn, family.input_norm(layer, lower[self.layer]), inputs.cos[:, -1:],
                            inputs.sin[:, -1:])
        keys = cache.layers[self.layer].keys
        keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
        logits = (q.float() @ keys.float().transpose(-1, -2))[0, :, 0].sum(0)  # (N,)
        return F.avg_pool1d(logits[None, None], POOL, stride=1, padding=POOL // 2)[0, 0]

    def keep_rows(self, ids: torch.Tensor, count: int) -> torch.Tensor:
        top = torch.topk(self.scores(ids), min(count, ids.shape[1])).indices
        return torch.sort(top).values
