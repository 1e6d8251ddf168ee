"""FastKV's token-selective propagation (Jo et al., 2025): which prompt rows run the layers above the TSP layer.

The authors' rule (dongwonjo/FastKV at the commit that carries the paper's
title, `baseline/fastkv/fastkv_utils.py`; the defaults here are its May 2025
release's, b6ca98a, `scripts/run_longbench.sh`): at the TSP layer T, the
queries of the last `window` (8) prompt rows attend over every key (softmax in
fp32 after the 1/sqrt(d) scale, causal among the window rows); the attention
each key before the window receives is summed over the window rows, smoothed
along the tokens by a pool of `kernel` (7, padding kernel // 2, the padding
counted; `pooling` avg, the release's, or max, their current scripts') and
summed over every query head (`window_scores`);
the `keep - window` highest rows propagate with the window rows, in their
original order and at their original positions. With no more prompt rows than
`keep`, every row propagates (the authors also skip it below `capacity`; with
the defaults, keep = capacity, the two agree).

FastKV also cuts every layer's KV cache to `capacity` rows (2,048, the
release's `max_prompt`) or `capacity_share` of the prompt (their current
proportional mode, 0.1 with `keep_share` 0.2), each key-value head its own
rows; `capacity=none` is the propagation alone (`rf_eval.drop.fastkv_capacity`,
which the method `fastkv` applies after the prefill).

`layer=` reads another layer below the split than S - 1 (a hybrid model's
Gated DeltaNet layer has no attention to read).

In rf-eval's engine this is an arm (`preset=fastkv`,
`rf_eval.ridgefill.presets`): split S = T + 1 (layers 0..T run every row and
write its cache), fill `nofill` (the layers above hold only the propagated
rows, which attend to each other only), tail = `window` (those rows always
propagate), and this selector for the rest. Scores are those of
`attention.lower_attention` at the one layer T = S - 1; the average pool is
linear, so pooling the head sum is pooling each head and summing.

`keep` counts rows as the authors' `tsp_len` does (2,048, the window
included); `keep_share` counts them as a share of the prompt instead (their
later proportional mode, 0.2); an arm's budget sets the count per prompt
length (`Request.row_budget`, the rows beyond the window).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rf_eval.engine import Selection, rows_can_be_given_back
from rf_eval.selectors.attention import selector_layers
from rf_eval.selectors.base import Request, Selector, top_rows

__all__ = ["DEFAULT_CAPACITY", "POOLINGS", "TokenSelectivePropagation", "window_scores"]

POOLINGS = ("avg", "max")
#: the release's per-layer cache capacity (`max_prompt`); a model with other than full-attention layers keeps
#: its caches whole under it (`rf_eval.drop.fastkv.FastKV.capacity`), and refuses any other capacity
DEFAULT_CAPACITY = 2048


def window_scores(q: torch.Tensor, keys: torch.Tensor, scale: float, kernel: int, pooling: str,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The window's pooled attention on each key before it, per key-value head: (KVH, M - w), fp32.

    `q` (1, H, w, D): the window rows' rotated queries; `keys` (1, KVH, M, D): the layer's keys, the window's
    the last w; `sinks` (H,): per-head attention-sink logits (GPT-OSS), a softmax column that is dropped."""
    heads, kv_heads, w, m = q.shape[1], keys.shape[1], q.shape[2], keys.shape[2]
    group = heads // kv_heads
    logits = (q[0].float() @ keys[0].float().repeat_interleave(group, 0).transpose(-1, -2)).mul_(scale)  # (H, w, M)
    logits[..., m - w:].masked_fill_(~torch.ones(w, w, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    if sinks is not None:
        logits = torch.cat([logits, sinks.float().to(q.device).view(-1, 1, 1).expand(-1, w, 1)], -1)
    received = logits.softmax(-1)[..., : m - w].sum(1)  # (H, M - w)
    pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
    pooled = pool(received[:, None], kernel, stride=1, padding=kernel // 2)[:, 0]
    return pooled.view(kv_heads, group, m - w).sum(1)


class TokenSelectivePropagation(Selector):
    """FastKV's TSP rule at layer S - 1; see the module docstring."""

    name = "tsp"
    counts_rows = True

    def __init__(self, keep: int | None = 2048, keep_share: float | None = None, window: int = 8, kernel: int = 7,
                 layer: int | None = None, capacity: int | str | None = DEFAULT_CAPACITY,
                 capacity_share: float | None = None,
                 pooling: str = "avg"):
        if keep_share is not None:
            keep = None
        if capacity_share is not None or capacity == "none":
            capacity = None
        if capacity is not None and (not isinstance(capacity, int) or capacity <= window):
            raise ValueError(f"tsp capacity must be more rows than the window ({window}) or none (the propagation "
                             f"alone), got {capacity!r}")
        if capacity_share is not None and not 0 < capacity_share <= 1:
            raise ValueError(f"tsp capacity_share must lie in (0, 1], got {capacity_share}")
        if pooling not in POOLINGS:
            raise ValueError(f"tsp pooling={pooling!r} is not valid; valid: {', '.join(POOLINGS)}")
        self.capacity, self.capacity_share, self.pooling = capacity, capacity_share, pooling
        if keep is None and keep_share is None:
            raise ValueError("tsp needs keep= (rows, the window included) or keep_share= (a share of the prompt)")
        if keep is not None and keep < 1:
            raise ValueError(f"tsp keep must be >= 1 row, got {keep}")
        if keep_share is not None and not 0 < keep_share <= 1:
            raise ValueError(f"tsp keep_share must lie in (0, 1], got {keep_share}")
        if window < 1 or kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"tsp needs window >= 1 and an odd kernel >= 1; got window={window}, kernel={kernel}")
        self.keep, self.keep_share = (None if keep is None else int(keep)), keep_share
        self.window, self.kernel, self.layer_ = int(window), int(kernel), layer  # layer_: `layer` is the method

    def tsp_layer(self, split: int) -> int:
        """The layer whose attention decides: S - 1 (FastKV's TSP layer), unless `layer` names a lower one."""
        return split - 1 if self.layer_ is None else int(self.layer_)

    def check_layers(self, model_config, split: int) -> None:
        """The TSP layer must be a full-attention layer below the split (its keys and queries are read)."""
        types = getattr(model_config, "layer_types", None) or []
        layer = self.tsp_layer(split)
        if not 0 <= layer < split:
            raise ValueError(f"tsp layer={layer} does not lie below split {split}")
        if layer < len(types) and types[layer] != "full_attention":
            raise ValueError(f"tsp reads layer {layer}, a {types[layer]} layer; FastKV's rule needs a full-attention "
                             "layer: choose another split, or name one with layer=")
        cut = self.capacity not in (None, DEFAULT_CAPACITY) or self.capacity_share is not None
        if cut and not rows_can_be_given_back(model_config):
            raise ValueError("tsp's per-layer capacity cuts caches that hold their rows, and this model has "
                             "sliding-window or recurrent layers: give capacity=none (the propagation alone)")

    def layer(self, req: Request) -> list[int]:
        return selector_layers(req, [self.tsp_layer(req.plan.split)])

    def captures(self, req):
        start = max(req.n - self.window, 0)
        return {self.tsp_layer(req.plan.split): (start, req.n)}

    def planned_rows(self, n: int, prefix: int) -> int | None:
        total = self.keep if self.keep is not None else int(self.keep_share * n)
        return max(0, min(total - self.window, prefix))

    def count(self, req: Request) -> int:
        """Propagated rows beyond the window: the budget's, else keep (or keep_share of N) less the window."""
        rows = req.row_budget if req.row_budget is not None else self.planned_rows(req.n, req.prefix_end)
        return max(0, min(rows, req.candidates().numel()))

    def capacity_at(self, n: int) -> int | None:
        """The rows each layer's cache keeps per key-value head after an n-token prefill (None: every row)."""
        if self.capacity_share is not None:
            return max(int(self.capacity_share * n), self.window + 1)
        return self.capacity

    def scores(self, req: Request) -> torch.Tensor:
        """Window attention each key before the window receives at the TSP layer, pooled along the tokens and
        summed over the heads; the window's own keys (which always propagate) score -inf."""
        start = max(req.n - self.window, 0)
        if start == 0:
            return torch.full((req.n,), float("-inf"))
        index = self.layer(req)[0]
        ctx, layer = req.ctx, req.layers()[index]
        h = ctx.family.input_norm(layer, req.lower_input(index, start, req.n))
        q, _ = ctx.family.query(layer.self_attn, h, ctx.inputs.cos[:, start:], ctx.inputs.sin[:, start:])
        scores = window_scores(q, ctx.cache.layers[index].keys[:, :, : req.n], layer.self_attn.scaling, self.kernel,
                               self.pooling, ctx.family.attention_sinks(layer.self_attn)).sum(0)
        return torch.cat([scores.cpu(), torch.full((req.n - start,), float("-inf"))])

    def select(self, req):
        return Selection(top_rows(self.scores(req), req.candidates(), self.count(req)))
