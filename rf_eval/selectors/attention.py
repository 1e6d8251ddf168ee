"""Attention-selected rows and the question-hidden control (paper sections 2.4, 6.5).

`attention`: the `share` (default 10%) of prompt rows that receive the most
attention from the last `window` (64) prompt rows, summed over the heads of
every attention layer among `layers` (3, 7, 11, 15) that lies below the
split. Queries are recomputed from each layer's captured input for the
window rows; keys are the lower layer's own cached (rotated) keys.

Decisions where the paper is silent:
- The count is round(share * N) (N = prompt rows; `share_of="prefix"` counts
  from the prefix instead, as the probe's base rule does), and rows are
  ranked among prefix rows only: the tail is exact anyway, so the selection
  adds exactly that many exact rows. Ties go to the earlier row.
- Layers in `layers` that are Gated DeltaNet layers, or at/above the split,
  are skipped; if none remains the selector refuses to run (pass `layers=`).

`question_hidden`: the same rule with the window placed so that the question
is outside it. The question is taken to start at `question_start` =
N - `offset` (default offset = `window`: the question is the span the plain
selector reads), or, with `marker=TEXT`, at the row holding the first
character of the marker's last occurrence in the prompt. The window is the
`window` rows just before the question start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rf_eval.engine import Selection
from rf_eval.engine.attention import visible_keys
from rf_eval.selectors.base import Request, Selector, top_rows
from rf_eval.selectors.tokens import row_texts

DEFAULT_LAYERS = (3, 7, 11, 15)


def attention_mass(
    q: torch.Tensor, k: torch.Tensor, scale: float, q_pos: torch.Tensor, k_pos: torch.Tensor,
    v: torch.Tensor | None = None, window: int | None = None, sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal softmax attention of q (1, H, w, D) over k (1, KVH, M, D) (inside `window`, a sliding layer's).

    `sinks`: per-head attention-sink logits (H,) (GPT-OSS): one more softmax
    column per head that takes weight and gives no value, so the mass and the
    output are the stock layer's.

    Returns the attention each key receives summed over heads and queries
    (M,) in fp32, and, with `v`, the attention output (1, w, H*Dv).
    One key-value group at a time, so memory is (H/KVH) * w * M.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    blocked = ~visible_keys(q_pos.to(q.device), k_pos.to(q.device), window)
    # Only the key columns some query cannot see are masked (in place): the probe's prefix keys, seen by
    # every probe row, make most of the matrix and need no pass of their own.
    cols = blocked.any(0).nonzero().squeeze(1)
    masked = slice(int(cols[0]), int(cols[-1]) + 1) if cols.numel() else slice(0, 0)
    received = torch.zeros(k.shape[2], dtype=torch.float32, device=q.device)
    outs = []
    for g in range(kv_heads):
        qs = q[0, g * group : (g + 1) * group].float()
        scores = (qs @ k[0, g].float().T).mul_(scale)
        scores[..., masked].masked_fill_(blocked[:, masked], float("-inf"))
        if sinks is not None:
            sink = sinks[g * group : (g + 1) * group].float().to(q.device)
            scores = torch.cat([scores, sink.view(-1, 1, 1).expand(-1, scores.shape[1], 1)], -1)
        probs = F.softmax(scores, dim=-1)[..., : k.shape[2]]
        received += probs.sum((0, 1))
        if v is not None:
            outs.append(probs.to(v.dtype) @ v[0, g])  # (group, w, Dv)
    if v is None:
        return received, None
    out = torch.cat(outs, 0)  # (H, w, Dv)
    return received, out.transpose(0, 1).reshape(1, q.shape[2], -1)


def selector_layers(req: Request, layers: Sequence[int]) -> list[int]:
    """The full-attention layers among `layers` below the split.

    Sliding-window layers are skipped: their cache keeps only the last window - 1
    rows, and rows outside a query's window receive nothing from it anyway.
    """
    family = req.ctx.family if req.ctx is not None else None
    stack = req.layers()
    keep = []
    for i in layers:
        if not 0 <= i < req.plan.split:
            continue
        recurrent = family.is_recurrent(stack[i]) if family else hasattr(stack[i], "linear_attn")
        sliding = not recurrent and family is not None and family.sliding_window(stack[i].self_attn) is not None
        if not recurrent and not sliding:
            keep.append(i)
    if not keep:
        raise ValueError(
            f"no full-attention layer among layers {list(layers)} lies below split {req.plan.split}; "
            "pass layers= with lower attention layers (sliding-window layers are not read)"
        )
    return keep


def lower_attention(req: Request, layers: Sequence[int], start: int, stop: int) -> torch.Tensor:
    """Attention each prompt row receives from rows start..stop-1, summed over heads and `layers` (N,)."""
    key = ("lower_attention", tuple(layers), start, stop)
    if key in req.memo:
        return req.memo[key]
    ctx = req.ctx
    total = torch.zeros(req.n, dtype=torch.float32)
    q_pos = torch.arange(start, stop)
    k_pos = torch.arange(req.n)
    for index in layers:
        layer = req.layers()[index]
        x = req.lower_input(index, start, stop)
        h = ctx.family.input_norm(layer, x)
        cos, sin = ctx.inputs.cos[:, start:stop], ctx.inputs.sin[:, start:stop]
        q, _ = ctx.family.query(layer.self_attn, h, cos, sin)
        keys = ctx.cache.layers[index].keys
        received, _ = attention_mass(q, keys, layer.self_attn.scaling, q_pos, k_pos,
                                     sinks=ctx.family.attention_sinks(layer.self_attn))
        total += received.cpu()
    req.memo[key] = total
    return total


class Attention(Selector):
    """Top `share` of rows by attention received from the last `window` rows (lower layers)."""

    name = "attention"
    counts_rows = True

    def __init__(self, share: float = 0.1, window: int = 64, layers: Sequence[int] = DEFAULT_LAYERS,
                 share_of: str = "prompt"):
        if not 0 <= share <= 1:
            raise ValueError(f"share must lie in [0, 1], got {share}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if share_of not in ("prompt", "prefix"):
            raise ValueError(f"share_of must be 'prompt' or 'prefix', got {share_of!r}")
        self.share, self.window, self.share_of = float(share), int(window), share_of
        self.layers = [int(i) for i in (layers if isinstance(layers, (list, tuple)) else [layers])]

    def check_layers(self, model_config: Any, split: int) -> None:
        """At least one attention layer among `layers` below the split (what `selector_layers` needs)."""
        types = getattr(model_config, "layer_types", None) or []
        below = [i for i in self.layers if 0 <= i < split
                 and not (i < len(types) and types[i] == "linear_attention")]
        if not below:
            raise ValueError(
                f"no attention layer among layers {self.layers} lies below split {split}; "
                f"pass layers= with attention layers below {split} (e.g. layers=0), or a later split"
            )

    def window_rows(self, req: Request) -> tuple[int, int]:
        return max(req.n - self.window, 0), req.n

    def captures(self, req):
        start, stop = self.window_rows(req)
        return {i: (start, stop) for i in selector_layers(req, self.layers)}

    def planned_rows(self, n: int, prefix: int) -> int | None:
        return min(int(round(self.share * (n if self.share_of == "prompt" else prefix))), prefix)

    def k(self, req: Request) -> int:
        """round(share * N) (at most the prefix: `planned_rows`), or the rows an arm's budget grants
        (`Request.row_budget`)."""
        return req.row_budget if req.row_budget is not None else self.planned_rows(req.n, req.prefix_end)

    def scores(self, req: Request) -> torch.Tensor:
        start, stop = self.window_rows(req)
        return lower_attention(req, selector_layers(req, self.layers), start, stop)

    def select(self, req):
        return Selection(top_rows(self.scores(req), req.candidates(), self.k(req)))


class QuestionHidden(Attention):
    """The attention rule with the window just before the question (the paper's control, section 6.5)."""

    name = "question_hidden"

    def __init__(self, share: float = 0.1, window: int = 64, layers: Sequence[int] = DEFAULT_LAYERS,
                 share_of: str = "prompt", offset: int | None = None, marker: str | None = None):
        super().__init__(share, window, layers, share_of)
        self.offset = self.window if offset is None else int(offset)
        self.marker = marker

    def question_start(self, req: Request) -> int:
        if self.marker:
            texts = row_texts(req.need_tokenizer(self.name), req.ids)
            text = "".join(texts)
            at = text.rfind(self.marker)
            if at < 0:
                raise ValueError(f"question_hidden: marker {self.marker!r} does not occur in the prompt")
            ends = torch.tensor([len(t) for t in texts]).cumsum(0)
            return int(torch.searchsorted(ends, at, right=True))
        return max(req.n - self.offset, 0)

    def window_rows(self, req):
        q0 = self.question_start(req)
        return max(q0 - self.window, 0), max(q0, 1)
