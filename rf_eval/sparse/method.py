"""What every sparse-attention prefill shares: the prefill protocol around one rule, "which key blocks each
query block of a layer computes".

The third family of prefill approximations (DESIGN section 3): every row keeps its cache entry and every
layer runs, but in the prompt's prefill each query block of a full-attention layer attends to a chosen set
of key blocks (`rf_eval.sparse.blocks`), computed by FlexAttention so the skipped blocks cost nothing
(`rf_eval.sparse.attention`). Sliding-window layers keep their own pattern and linear-attention layers
their recurrence (both run stock); decoding over the full cache is the stock model. A method subclasses
`SparsePrefill` in a file of its own, with an `Arm` that extends `SparseArm`, and says
- `pattern(layer, query, key, plan)`: a `Choice`: the layer's kept blocks (heads, blocks, blocks) for one
  prompt, the MACs of the estimation pass that chose them (0 for a fixed pattern), and the rule's own block
  scores, which rank the blocks when a budget caps them;
- `dense(n)`: whether the method runs an n-token prompt dense (the authors' short-prompt rule);
- `estimate_macs(n)`: the most its estimation pass costs per sparse layer (a preview's count);
- `planned_pairs(n, plan)`: where the pattern does not depend on the prompt, the pairs each layer computes
  (a preview and the served ceilings read it; None: known only once the prompt ran).

Cost (issue #56 item 5): exact prefill's MACs less each sparse layer's attention over the pairs it skipped
(`blocks.computed_pairs`, averaged over heads), plus the estimation pass; `attention_density` is the
fraction of the causal triangle computed, over the sparse layers. `budget=F` caps, per prompt length, the
share of each layer's causal pairs every head may compute, the largest whose MACs (with the estimation pass
at its most) stay within F of exact's; the method's rule chooses its blocks, and those past the cap go,
lowest score first, keeping the first key block and the diagonal (`blocks.within_pairs`). A budget below the
cost of those forced blocks and the estimation pass is refused before the weights load.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from rf_eval.cost.budget import BudgetError, Knob, check_budget
from rf_eval.cost.mac_model import cache_rows, causal_pairs, layer_costs, prefill_macs
from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.engine import (
    PrefillResult,
    decoder_layers,
    new_cache,
    plain_prefill,
    rows_can_be_given_back,
    without_last_row,
)
from rf_eval.families import attention_shape, family_class_for
from rf_eval.families.base import Family
from rf_eval.fields import ArmError
from rf_eval.methods.base import Method, ModelSource, PromptPlan
from rf_eval.methods.requests import check_prompt, meta_model
from rf_eval.sparse.attention import sparse_prefill, warm
from rf_eval.sparse.blocks import block_count, block_pairs, computed_pairs, forced_blocks, within_pairs

__all__ = ["Choice", "Record", "SparseArm", "SparsePrefill", "attention_density", "sparse_layers", "sparse_savings"]

#: the authors' block (FlexPrefill's and XAttention's default)
DEFAULT_BLOCK = 128


@dataclass(frozen=True, kw_only=True)
class SparseArm:
    """`block`: rows per query and key block (128, the authors'; smaller for tests); `budget`: a share of exact
    prefill's MACs the prompt's prefill may not exceed."""

    block: int = DEFAULT_BLOCK
    budget: float | None = None

    def __post_init__(self) -> None:
        if self.block < 16 or self.block & (self.block - 1):
            raise ArmError(f"block={self.block}: give a power of two >= 16 (FlexAttention's blocks; 128 is the "
                           "authors')")
        check_budget(self.budget)


class Choice(NamedTuple):
    """One layer's pattern for one prompt: its kept blocks, the estimation's MACs, the rule's block scores
    (None: a pattern a budget does not cut, the fixed control's)."""

    keep: torch.Tensor
    macs: int = 0
    priority: torch.Tensor | None = None


@dataclass
class Record:
    """What a sparse prefill computed: each sparse layer's causal pairs (mean over heads), the estimation's
    MACs, and for a layer whose queries were some rows only (a fill's late layers) the causal pairs those
    rows read densely (`causal`; a layer not in it: the prompt's whole triangle)."""

    pairs: dict[int, float]
    estimate: int
    causal: dict[int, float] = field(default_factory=dict)

def dense_pairs(n: int, pairs: dict[int, float], causal: dict[int, float] | None = None) -> dict[int, float]:
    """Each sparse layer's causal pairs of the rows it ran in an n-row prompt: `causal`'s where given (a fill's
    late layers, some rows only), else the whole triangle."""
    return {i: (causal or {}).get(i, causal_pairs(0, n)) for i in pairs}


def sparse_savings(config: Any, n: int, pairs: dict[int, float], estimate: int,
                   causal: dict[int, float] | None = None) -> int:
    """The MACs an n-token prefill saves against exact: the attention over the pairs each sparse layer
    skipped (of its `dense_pairs`), less the estimation pass."""
    costs = {c.index: c for c in layer_costs(config)}
    dense = dense_pairs(n, pairs, causal)
    return round(sum(costs[i].attn_per_key * (dense[i] - p) for i, p in pairs.items())) - estimate


def attention_density(n: int, pairs: dict[int, float], causal: dict[int, float] | None = None) -> float:
    """The share of the causal pairs (`dense_pairs`) computed over the sparse layers (1.0 with none)."""
    return sum(pairs.values()) / sum(dense_pairs(n, pairs, causal).values()) if pairs else 1.0


def sparse_layers(config: Any) -> list[int]:
    """The layers a sparse pattern applies to: full attention (no sliding window, not linear attention)."""
    return [c.index for c in layer_costs(config) if c.kind == "attention" and c.window is None]


class SparsePrefill(Method):
    """A sparse-attention prefill method over one model; see the module docstring."""

    Arm: ClassVar[type] = SparseArm
    budget_knob = "the share of each layer's causal pairs a head's blocks may hold"

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Refuse, by name, a model the block pattern cannot apply to."""
        family = family_class_for(config)
        if family.attention_sinks is not Family.attention_sinks:
            raise ArmError(f"method={cls.name}: {family.__name__} attention has per-head sinks (a softmax column "
                           "outside the prompt's blocks), which the block-sparse prefill does not carry")
        if not sparse_layers(config):
            raise ArmError(f"method={cls.name}: this model has no full-attention layer (only sliding-window or "
                           "linear-attention layers, which keep their own pattern): nothing to make sparse")

    @classmethod
    def prepare(cls, arm: Any, source: ModelSource) -> tuple[Any, dict[str, Any]]:
        """The method built once over the model on the meta device: its family refused by name, a budget
        below its cheapest pattern refused, before the weights load."""
        arm, parts = super().prepare(arm, source)
        cls.on_meta(arm, source)
        return arm, parts

    @classmethod
    def on_meta(cls, arm: Any, source: ModelSource) -> SparsePrefill:
        return cls(meta_model(source), None, arm)

    def __init__(self, model: Any, tokenizer: Any = None, arm: Any = None, **given: Any):
        super().__init__(model, tokenizer, arm, **given)
        self.check_config(model.config)
        self.layers = sparse_layers(model.config)
        #: (query heads, key-value heads, head dim) of the attention the pattern runs in
        self.shape = attention_shape(model.config)
        attn = decoder_layers(model)[self.layers[0]].self_attn
        if next(attn.parameters()).device.type != "meta":  # a loaded model: its kernel compiled before any timing
            warm(attn, *self.shape, self.arm.block)
        self.knob = self.budget_knob_for(model.config) if self.arm.budget is not None else None
        if self.knob is not None:
            self.knob.check_reachable()

    def budget_knob_for(self, config: Any) -> Knob:
        """The budget's knob: the share (in thousandths) of each layer's causal pairs, from the forced blocks'
        share up, the estimation pass charged at its most."""
        def macs(n: int, share: int) -> int:
            return self.macs(n, dict.fromkeys(self.layers, share / 1000 * causal_pairs(0, n)),
                             len(self.layers) * self.estimate_macs(n))

        def lowest(n: int) -> int:
            forced = forced_blocks(block_count(n, self.arm.block)) * block_pairs(n, self.arm.block)
            return -(-int(1000 * float(forced.sum())) // causal_pairs(0, n))

        positions = getattr(config, "max_position_embeddings", None) or 1 << 20
        return Knob("pairs per mille", float(self.arm.budget), macs, lambda n: prefill_macs(config, n), lowest,
                    lambda n: 1000, max_length=int(positions))

    # -- what a method provides ---------------------------------------------------------
    def pattern(self, layer: int, query: torch.Tensor, key: torch.Tensor, plan: PromptPlan) -> Choice:
        """One layer's `Choice` for a prompt's prefill."""
        raise NotImplementedError

    def dense(self, n: int) -> bool:
        """Whether an n-token prompt runs dense: one block, nothing to skip."""
        return n <= self.arm.block

    def estimate_macs(self, n: int) -> int:
        """The most the estimation pass of one sparse layer costs on an n-token prompt (a preview's count)."""
        return 0

    def planned_pairs(self, n: int, plan: PromptPlan) -> dict[int, float] | None:
        """Each sparse layer's computed pairs where the pattern does not depend on the prompt, else None."""
        return None

    # -- the protocol ---------------------------------------------------------------------
    def plan(self, n: int) -> PromptPlan:
        """Plain where the method runs dense; with a budget, the cap on each head's pairs (`setting`) and
        its share of the causal pairs (`knob_value`)."""
        if self.dense(n):
            if self.knob is not None:
                raise BudgetError(f"budget={self.arm.budget:g}: method={self.name} runs a {n:,}-token prompt "
                                  "dense, at all of exact prefill's MACs; give longer prompts, or no budget")
            return PromptPlan(n, True, n)
        if self.knob is None:
            return PromptPlan(n, False, 0)
        share = self.knob.setting(n) / 1000
        return PromptPlan(n, False, 0, share * causal_pairs(0, n), share)

    @property
    def reads_whole_prompt(self) -> bool:
        """A generation prefill reads the whole prompt (the pattern reads its last block), then gives back the
        last row, where every layer's cache can (`rows_can_be_given_back`)."""
        return rows_can_be_given_back(self.model.config)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0,
                plan: PromptPlan | None = None) -> PrefillResult:
        if held_back:
            raise ValueError(f"held_back={held_back}: {self.name} chooses its blocks from the whole prompt")
        ids = check_prompt(input_ids, self.model).to(self.device)
        whole = for_generation and self.reads_whole_prompt
        run = ids if whole or not for_generation else ids[:, :-1]
        n = run.shape[1]
        plan = plan if plan is not None else self.plan(ids.shape[1])
        with self.forward_context():
            if plan.plain or self.dense(n):
                return plain_prefill(self.model, ids[:, :-1] if for_generation else ids)
            cache = new_cache(self.model)
            with self.sparse_attention(n, plan) as record:
                out = self.model(input_ids=run, cache=cache, use_cache=True, logits_to_keep=1)
        result = PrefillResult(cache, out.logits[:, -1], torch.arange(n, device=ids.device), prompt_length=n)
        result.attention = record
        return without_last_row(result) if whole else result

    @contextmanager
    def sparse_attention(self, n: int, plan: PromptPlan, below: int | None = None) -> Iterator[Record]:
        """Inside: the model's prefill of n rows runs this method's pattern in its sparse layers (those below
        layer `below` alone, where given: a RidgeFill arm's lower layers); the record fills as they run."""
        record = Record({}, 0)

        def choose(layer: int, query: torch.Tensor, key: torch.Tensor):
            if layer not in self.layers or (below is not None and layer >= below):
                return None
            keep, macs, priority = self.pattern(layer, query, key, plan)
            if self.knob is not None and priority is not None:  # the budget's cap, the rule's order
                keep = within_pairs(keep, priority, n, self.arm.block, plan.knob_value * causal_pairs(0, n))
            record.pairs[layer] = float(computed_pairs(keep, n, self.arm.block).mean())
            record.estimate += macs
            return keep, self.arm.block

        with sparse_prefill(self.model, choose):
            yield record

    def macs(self, n: int, pairs: dict[int, float], estimate: int) -> int:
        """Exact prefill's MACs less the attention each sparse layer skipped, plus the estimation pass."""
        return prefill_macs(self.model.config, n) - sparse_savings(self.model.config, n, pairs, estimate)

    def prefill_cost(self, n: int, result: PrefillResult | None = None, plan: PromptPlan | None = None
                     ) -> PrefillCost:
        """The prompt's MACs at the pairs its prefill computed (`result`), else at the planned pairs (a fixed
        pattern), else at the most it can cost (the budget's cap or every pair, and the estimation pass at its
        most); cache and rows are exact's."""
        plan = plan if plan is not None else self.plan(n)
        config = self.model.config
        exact, rows = prefill_macs(config, n), cache_rows(config, n)
        record = None if result is None else result.attention
        if plan.plain or (result is not None and (record is None or not record.pairs)):
            return PrefillCost(n, exact, exact, n, rows, rows, None, attention_density=1.0)
        if record is not None:
            pairs, estimate = record.pairs, record.estimate
        else:
            pairs = self.planned_pairs(n, plan)
            estimate = len(self.layers) * self.estimate_macs(n)
            if pairs is None:  # the most the prompt can cost: its budget's cap, else every pair
                share = plan.knob_value if self.knob is not None else 1.0
                pairs = dict.fromkeys(self.layers, share * causal_pairs(0, n))
        knob = {"budget": self.knob.budget, "knob_value": plan.knob_value} if self.knob is not None else {}
        return PrefillCost(n, self.macs(n, pairs, estimate), exact, n, rows, rows, None,
                           attention_density=attention_density(n, pairs), **knob)

    def speedup_ceilings(self, n: int, plan: PromptPlan | None = None) -> dict[str, float]:
        """The MAC ceiling where the pattern is known before the prompt runs; none for an adaptive one."""
        plan = plan if plan is not None else self.plan(n)
        if not plan.plain and self.planned_pairs(n, plan) is None:
            return {}
        return super().speedup_ceilings(n, plan)

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "sparse_layers": self.layers}
