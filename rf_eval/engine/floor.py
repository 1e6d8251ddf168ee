"""The engine floor: the partial path with every row exact against the stock model.

RidgeFill paper section 4.3 (equivalence checks) and section 9, recipe step 4:
"check that the engine with the fill switched off reproduces exact bitwise,
so that every difference you measure is the fill's". A check that compares a
method's plain prompts (`Method.plan`: no filled row) compares the plain model
with itself. These functions run the partial path itself (the lower layers
stopped at the split, a selector, the late layers of `layers`) with every
prompt row selected exact, and compare its logits and every cache tensor
with `plain_prefill`:

- `rf_eval.engine.partial_every_row_exact`: `prefill` itself, a selector that returns every
  prefix row. Each late layer then calls the stock layer's own attention
  function with the stock mask (`attention.attend_like_stock`), so the result
  is bitwise the stock model's wherever the family's layer pieces are the
  stock ones.
- `filled_kernel_every_row_exact`: the same rows through the attention that
  filled arms' exact rows use (`attention.attend_exact_rows`, a masked SDPA
  over the key rows; stock uses `is_causal`). Not bitwise: its max |Δ| and
  KL are the rounding floor under every filled arm's difference from exact.

`rf_eval.engine.engine_floor` measures both on one prompt (`compare_results`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from rf_eval.engine.attention import QueryChunks, attend_exact_rows
from rf_eval.engine.layers import run_layers
from rf_eval.engine.lower import decoder_layers, new_cache, run_lower_layers
from rf_eval.engine.plan import EVERY_ROW_EXACT, Plan, PrefillResult
from rf_eval.engine.step import LayerStep, Rows
from rf_eval.engine.strategies import PredictedInput
from rf_eval.families import family_for

#: Why the filled-row kernel is not bitwise the stock layer.
FILLED_KERNEL_WHY = "masked SDPA over the key rows (the kernel filled arms' exact rows use); stock uses is_causal"
#: Why the partial path with every row exact is expected bitwise.
PARTIAL_WHY = "same computation: lower layers are the stock forward, late layers call the stock attention function"


@dataclass(frozen=True)
class Floor:
    """How far one prefill is from the stock model's (`compare_results`).

    bitwise: logits and every cache tensor equal. max_abs: the largest |Δ| over
    the last row's logits and every cache tensor. kl: KL(stock || partial) of
    the last row's next-token distribution (nats, fp64). first_diff: the first
    tensor that differs, in cache order (`layer L keys`, ...), then `logits`;
    None when bitwise.
    """

    bitwise: bool
    max_abs: float
    kl: float
    first_diff: str | None = None
    why: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def named_cache_tensors(cache) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a cache holds, named `layer L keys` etc. (K/V, conv and recurrent states), in a fixed order.

    Gated DeltaNet layers keep their states per state index in a dict (transformers 5.24), named
    `layer L recurrent_states[k]` here, so hybrid families' states are compared like any other tensor.
    """
    out = []
    for index, layer in enumerate(cache.layers):
        for name in ("keys", "values", "conv_states", "recurrent_states"):
            value = getattr(layer, name, None)
            if isinstance(value, torch.Tensor):
                out.append((f"layer {index} {name}", value))
            elif isinstance(value, dict):
                out.extend((f"layer {index} {name}[{k}]", value[k]) for k in sorted(value)
                           if isinstance(value[k], torch.Tensor))
            elif isinstance(value, (list, tuple)):
                out.extend((f"layer {index} {name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor))
    return out


def last_row_kl(stock: torch.Tensor, other: torch.Tensor) -> float:
    """KL(stock || other) of the next-token distributions given by two logit rows (fp64, nats)."""
    log_p = torch.log_softmax(stock.double().reshape(-1), -1)
    log_q = torch.log_softmax(other.double().reshape(-1), -1)
    return max(float((log_p.exp() * (log_p - log_q)).sum()), 0.0)


def compare_results(stock: PrefillResult, other: PrefillResult, why: str = "") -> Floor:
    """`Floor` of `other` against `stock`: every cache tensor in cache order, then the logits."""
    a, b = named_cache_tensors(stock.cache), named_cache_tensors(other.cache)
    if [name for name, _ in a] != [name for name, _ in b]:
        raise ValueError(f"the caches hold different tensors: {[n for n, _ in a]} vs {[n for n, _ in b]}")
    pairs = [*((name, x, y) for (name, x), (_, y) in zip(a, b)), ("logits", stock.logits, other.logits)]
    first, max_abs = None, 0.0
    for name, x, y in pairs:
        if x.shape != y.shape:
            raise ValueError(f"{name}: shape {tuple(y.shape)}, stock {tuple(x.shape)}")
        if not torch.equal(x, y):
            first = first or name
            max_abs = max(max_abs, float((x.double() - y.double()).abs().max()))
    return Floor(first is None, max_abs, last_row_kl(stock.logits, other.logits), first, why)


def every_prefix_row(context) -> torch.Tensor:
    """A selector that makes every prefix row exact."""
    n, tail = context.input_ids.shape[1], context.plan.tail
    return torch.arange(max(n - tail, 0), device=context.input_ids.device)


def _masked_attention(step: LayerStep, q, keys, values, scale: float, attn) -> torch.Tensor:
    chunks = QueryChunks(step.plan.query_chunk, step.prefix_end, step.family.sliding_window(attn),
                         step.family.attention_sinks(attn))
    return attend_exact_rows(q, keys, values, step.rows.exact, step.rows.keys, scale, chunks)


@torch.no_grad()
def filled_kernel_every_row_exact(model: nn.Module, input_ids: torch.Tensor, split: int) -> PrefillResult:
    """The partial path with every row exact, attending through the filled arms' kernel (`attend_exact_rows`)."""
    n = input_ids.shape[1]
    plan = Plan(split, tail=1, fill=EVERY_ROW_EXACT)  # a fill that is never read: every row is exact
    cache = new_cache(model)
    inputs, _ = run_lower_layers(model, input_ids, split, cache)
    exact = torch.arange(n, device=input_ids.device)
    step = LayerStep(family_for(model.config), decoder_layers(model), plan, inputs, Rows.of(n, exact, False), cache,
                     attend=_masked_attention)
    x = run_layers(step, PredictedInput(None), inputs.x_split)
    logits = step.family.logits(model, x[:, -1:])[:, -1]  # the family's head (Gemma 3: its softcap)
    return PrefillResult(cache=cache, logits=logits, exact_rows=exact, prompt_length=n, plan=plan)
