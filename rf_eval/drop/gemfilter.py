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

The filter layer: the authors' own for the three models they ran
(`needle_eval.py`, and each model's `*_select_attention.py` default, 0-based):
13 of Llama-3.1-8B-Instruct's 32 layers, 19 of Mistral-Nemo-Instruct-2407's
40, 19 of Phi-3.5-mini-instruct's 32 (`AUTHORS_LAYERS`, matched by the model's
shape so a local copy matches too); for any other model 13/32 of its depth,
floor(13 L / 32), a formula of ours, not theirs; `filter_layer=` names another
(0..L-2). The arm's provenance says which (`filter_layer_from`).
Pass 1 here stops before layer r + 1, as the authors' truncated model does;
their pass 1 also computes the last row's logits, which nothing reads and the
cost here does not charge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rf_eval.cost.mac_model import causal_pairs, layer_costs
from rf_eval.drop.base import Dropper, DropperArm
from rf_eval.engine import decoder_layers, new_cache, run_lower_layers
from rf_eval.families import family_for
from rf_eval.fields import ArmError

__all__ = ["AUTHORS_LAYERS", "GemFilter", "default_filter_layer", "filter_layer"]

#: the authors' filter layer per model they ran, by the model's shape (model_type, layers, hidden size,
#: vocabulary): SalesforceAIResearch/GemFilter `needle_eval.py` (select_layer_idx, 0-based)
AUTHORS_LAYERS = {
    ("llama", 32, 4096, 128256): ("Llama-3.1-8B-Instruct", 13),
    ("mistral", 40, 5120, 131072): ("Mistral-Nemo-Instruct-2407", 19),
    ("phi3", 32, 3072, 32064): ("Phi-3.5-mini-instruct", 19),
}
#: every other model: the depth share of the authors' Llama-3.1-8B layer, 13 of 32
FILTER_DEPTH = (13, 32)
DEFAULT_KEEP = 1024
POOL = 5


def default_filter_layer(model_config) -> tuple[int, str]:
    """(the filter layer of a model given none, where it comes from): the authors' table, else floor(13 L / 32)."""
    n_layers = int(model_config.num_hidden_layers)
    shape = (getattr(model_config, "model_type", None), n_layers, getattr(model_config, "hidden_size", None),
             getattr(model_config, "vocab_size", None))
    if shape in AUTHORS_LAYERS:
        name, layer = AUTHORS_LAYERS[shape]
        return layer, f"the authors' layer for {name}"
    return n_layers * FILTER_DEPTH[0] // FILTER_DEPTH[1], "floor(13 L / 32): no layer of the authors' for this model"


def filter_layer(model_config, given: int | None) -> int:
    """The filter layer r: `given`, else the default (`default_filter_layer`); an ArmError for one outside
    0..L-2 or not an attention layer (the rule reads its queries and keys)."""
    n_layers = int(model_config.num_hidden_layers)
    r = given if given is not None else default_filter_layer(model_config)[0]
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

    def provenance(self) -> dict[str, Any]:
        given = self.arm.filter_layer is not None
        return {**super().provenance(), "filter_layer": self.layer,
                "filter_layer_from": "filter_layer=" if given else default_filter_layer(self.model.config)[1]}

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
