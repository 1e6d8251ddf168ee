"""A RidgeFill arm's `sparse=` part: its exact layers run a sparse-attention method's pattern.

`fill=ridge,sparse=flexprefill(gamma=0.9)` is one arm whose two savings add (issue #56 item 6): the lower
layers (0..split-1, every prompt row) run the sparse method's blocks as that method would in those layers,
and the late layers fill most rows from the split's state while their exact rows (the tail, selected rows)
read only the key blocks the method keeps for their query blocks (`attend_kept_blocks`). In a late layer
only the exact rows have queries: the method chooses its pattern from those queries (the filled rows' left
at zero, so a query block that is partly filled pools over its exact rows diluted: FlexPrefill's pooled
queries, XAttention's antidiagonals) and the full layer's keys, and its estimation pass is charged whole.
The arm's cost is the fill's MAC count less the pairs every sparse layer skipped plus the method's
estimation passes (`sparse_savings`), and its items record `attention_density` over those layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from rf_eval.arm_string import parse_parts
from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.engine import PrefillResult
from rf_eval.engine.layers import late_attention
from rf_eval.engine.step import AttendFn
from rf_eval.fields import ArmError
from rf_eval.methods import METHODS, method_class
from rf_eval.methods.base import PromptPlan
from rf_eval.sparse.attention import attend_kept_blocks
from rf_eval.sparse.blocks import keeps_every_block
from rf_eval.sparse.method import Record, SparsePrefill, attention_density, sparse_savings

__all__ = ["SparsePart", "exact_layers_sparse", "sparse_from", "with_sparse_savings"]


@dataclass(frozen=True)
class SparsePart:
    """A sparse-attention method by name and its settings (each checked by the method's own arm)."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"name": self.method, **self.params}

    def bind(self, model: Any, tokenizer: Any = None) -> SparsePrefill:
        """The method over `model`, made once per arm."""
        return method_class(self.method)(model, tokenizer, **self.params)


def sparse_methods() -> list[str]:
    return sorted(name for name in METHODS if issubclass(METHODS[name], SparsePrefill))


def sparse_from(spec: str | dict | SparsePart | None) -> SparsePart | None:
    """`flexprefill`, `xattention(threshold=0.8;stride=8)`, a dict with `name`, or a SparsePart; its settings
    checked by the method's arm, a budget refused (the arm's own `budget=` turns its fill's knob)."""
    if spec is None or isinstance(spec, SparsePart):
        return spec
    if isinstance(spec, dict):
        params = dict(spec)
        name = params.pop("name", None)
    else:
        (name, params), *rest = parse_parts(spec)
        if rest:
            raise ValueError(f"sparse names one method, got {spec!r}")
    if name not in sparse_methods():
        raise ValueError(f"{name!r} is not a sparse-attention method; valid: {', '.join(sparse_methods())}")
    if "budget" in params:
        raise ValueError("the sparse part takes no budget: the arm's own budget= sets its fill's knob")
    method_class(name).parse_arm(params, what=f"sparse={name}")
    return SparsePart(name, params)


@contextmanager
def exact_layers_sparse(method: SparsePrefill | None, n: int, split: int) -> Iterator[Record]:
    """Inside: an n-row prefill runs `method`'s pattern in its sparse layers, below `split` over every row and
    from `split` on over the exact rows (`late_rows_attention`); the record fills as they run. Nothing
    changes where `method` is None or runs n rows dense."""
    if method is None:
        yield Record({}, 0)
        return
    plan = method.plan(n)
    if plan.plain:
        yield Record({}, 0)
        return
    with method.sparse_attention(n, plan, below=split) as record, late_attention(
            late_rows_attention(method, plan, record)):
        yield record


def late_rows_attention(method: SparsePrefill, plan: PromptPlan, record: Record) -> AttendFn:
    """A late layer's attention of the exact rows under `method`'s pattern of that layer (see the module
    docstring); the engine's own where the layer is not sparse, a row has no key (nofill's absent rows) or the
    pattern keeps every block (bitwise the fill alone)."""

    def attend(step: Any, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, attn: Any):
        layer, n, block = int(attn.layer_idx), step.n, method.arm.block
        if layer not in method.layers or keys.shape[2] != n:
            return step.engine_attention(q, keys, values, attn)
        exact = step.rows.exact
        queries = q.new_zeros(*q.shape[:2], n, q.shape[3])
        queries[:, :, exact] = q
        keep, macs, _ = method.pattern(layer, queries, keys, plan)
        record.estimate += macs
        record.causal[layer] = float((exact + 1).sum())  # the pairs the exact rows read densely
        if keeps_every_block(keep.to(q.device), n, block):
            record.pairs[layer] = record.causal[layer]
            return step.engine_attention(q, keys, values, attn)
        out, record.pairs[layer] = attend_kept_blocks(q, keys, values, exact, keep, block, scale)
        return out

    return attend


def with_sparse_savings(cost: PrefillCost, config: Any, result: PrefillResult | None) -> PrefillCost:
    """`cost` (the fill's MAC count) less what the sparse layers saved in the prefill that gave `result`, its
    density recorded; `cost` itself for a prefill without one. The lower layers ran every row of the prompt
    the prefill read, the last one too where the cache gave it back (`without_last_row`)."""
    record = None if result is None else result.attention
    if record is None or not record.pairs:
        return cost
    rows = result.prompt_length + int(bool((result.exact_rows == result.prompt_length).any()))
    saved = sparse_savings(config, rows, record.pairs, record.estimate, record.causal)
    return dataclasses.replace(cost, prefill_macs=cost.prefill_macs - saved,
                               attention_density=attention_density(rows, record.pairs, record.causal))


def check_fill(part: SparsePart | None, fill: Any) -> None:
    """A sparse part beside a fill: the exact arm's sparse prefill is the method itself."""
    if part is not None and fill is None:
        raise ArmError(f"fill=exact with sparse={part.method} is method={part.method}: give a fill, or run "
                       f"--model prefill --model_args method={part.method}")
