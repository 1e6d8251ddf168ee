"""RaReCache's row selectors: which prompt positions the target recomputes (RaReCache sections 2, 3.2, 4.3, 4.5).

They read the source's cache mapped into the target (`reads = "mapped_cache"`), not the split layer's state
that RidgeFill's selectors read, and live in the one registry (`rf_eval.selectors.registry`) under names of
their own (found there as any selector is: no list names them). Each returns one set of positions shared
by every target layer, except `layer-prefix`, which recomputes whole layers instead (`whole_layers`). The
budget, ceil(rho * T) positions with the last prompt row counted (or ceil(rho * L) layers), is the method's
(`rf_eval.rarecache.budget`); a selector is told how many candidates it may pick (`CachePrompt.pick`).

- `rank`: rank disagreement (eq. 2 / eq. 9), the method.
- `random-positions`: uniform positions, seeded per prompt (sha256 of the seed and the candidate rows'
  tokens, every prompt token but the last), so a result never depends on request order and a generation
  prefill draws a full one's rows. (RidgeFill's `random` is a count-matched control seeded by its seed.)
- `source-attention`: attention *received* from the last 32 prompt queries, summed over heads, queries and
  the last quarter of the **source**'s layers (deployable: the source prefilled anyway). (RidgeFill's
  `attention` scores rows by the split layer's attention.)
- `oracle-attention`: the same from the **target**'s own prefill (an oracle: it needs the prefill RaReCache
  saves).
- `oracle-l2`: CacheBlend-like (section 4.5); the true relative mapping error ||mapped - true||² / ||true||²
  against the target's own cache, keys and values of a layer together, averaged over layers (appendix C,
  figure 13; an oracle).
- `layer-prefix`: DroidSpeak-like; the first ceil(rho * L) target layers recomputed for every row, the rest
  mapped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import DynamicCache

from rf_eval.engine import decoder_layers, new_cache
from rf_eval.families import Family
from rf_eval.selectors.attention import attention_mass
from rf_eval.selectors.base import Selector, top_rows

ATTENTION_QUERIES = 32


@dataclass
class CachePrompt:
    """One prompt as a RaReCache selector sees it: the prompt (1 x n), the mapped cache (`mapped.score` is
    the rank disagreement when the selector `scores_mapping`), the attention the source's positions received
    (when it reads `source_attention`), `pick` positions to choose among the first `free`, and the target's
    own prefill for the oracles (`target_prefill()`: its cache; `target_attention()`: its cache and the
    attention received)."""

    ids: torch.Tensor
    free: int
    pick: int
    mapped: Any
    seed: int
    source_received: torch.Tensor | None
    target_prefill: Callable[[], DynamicCache]
    target_attention: Callable[[], tuple[DynamicCache, torch.Tensor]]

    def top(self, score: torch.Tensor) -> torch.Tensor:
        """The `pick` highest-scoring candidate positions (ties: the earlier one), sorted."""
        return top_rows(score, torch.arange(self.free, device=score.device), self.pick)


class CacheSelector(Selector):
    """A RaReCache selector: `choose` positions from a `CachePrompt`. The flags tell the method what to
    compute first: the rank-disagreement score (`scores_mapping`), the source's received attention
    (`source_attention`); `oracle` marks a selector that reads the target's own prefill (labelled in
    provenance), `whole_layers` the layer-prefix baseline (no positions)."""

    reads: ClassVar[str] = "mapped_cache"
    scores_mapping: ClassVar[bool] = False
    source_attention: ClassVar[bool] = False
    oracle: ClassVar[bool] = False
    whole_layers: ClassVar[bool] = False

    def choose(self, prompt: CachePrompt) -> torch.Tensor:
        raise NotImplementedError

    def select(self, req: Any) -> Any:
        raise TypeError(f"selector {self.name!r} chooses RaReCache positions from a mapped cache, not RidgeFill "
                        "rows from a split state")


class RankDisagreement(CacheSelector):
    name = "rank"
    scores_mapping = True

    def choose(self, prompt):
        return prompt.top(prompt.mapped.score[: prompt.free])


class RandomPositions(CacheSelector):
    name = "random-positions"

    def choose(self, prompt):
        # the candidates' tokens: a generation prefill (the prompt minus its last token) draws a full one's rows
        return random_rows(prompt.free, prompt.pick, prompt.seed, prompt.ids[:, : prompt.free])


class SourceAttention(CacheSelector):
    name = "source-attention"
    source_attention = True

    def choose(self, prompt):
        return prompt.top(prompt.source_received[: prompt.free])


class OracleAttention(CacheSelector):
    name = "oracle-attention"
    oracle = True

    def choose(self, prompt):
        return prompt.top(prompt.target_attention()[1][: prompt.free])


class OracleL2(CacheSelector):
    name = "oracle-l2"
    oracle = True

    def choose(self, prompt):
        n = prompt.ids.shape[1]
        return prompt.top(l2_error(prompt.mapped, prompt.target_prefill(), n)[: prompt.free])


class LayerPrefix(CacheSelector):
    name = "layer-prefix"
    whole_layers = True

    def choose(self, prompt):
        raise TypeError("layer-prefix recomputes whole layers, not positions")



def random_rows(n: int, count: int, seed: int, input_ids: torch.Tensor) -> torch.Tensor:
    """`count` uniform positions of 0..n-1, seeded by (seed, prompt tokens)."""
    digest = hashlib.sha256(repr((int(seed), input_ids.flatten().tolist())).encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.sort(torch.randperm(n, generator=gen)[: max(count, 0)]).values.to(input_ids.device)


def l2_error(mapped: Any, target_cache: DynamicCache, n: int) -> torch.Tensor:
    """Oracle: per position, the mean over layers of ||ŷ - y||² / ||y||², keys and values together.

    Appendix C, figure 13: the relative mapping error against the target's own
    cache (keys compared rotated). A layer whose true entry is all zeros at a
    position adds its absolute error there (no division by zero).
    """
    layers = target_cache.layers
    total = torch.zeros(n, dtype=torch.float64, device=layers[0].keys.device)
    for layer, cached in enumerate(layers):
        err = torch.zeros(n, dtype=torch.float64, device=total.device)
        norm = torch.zeros(n, dtype=torch.float64, device=total.device)
        for pred, true in ((mapped.keys[layer], cached.keys), (mapped.values[layer], cached.values)):
            y = true[0, :, :n].double().to(total.device)
            err += (pred[0, :, :n].double().to(total.device) - y).pow(2).sum((0, 2))
            norm += y.pow(2).sum((0, 2))
        total += err / torch.where(norm > 0, norm, torch.ones_like(norm))
    return (total / len(layers)).float()


@torch.no_grad()
def prefill_with_attention(
    model: nn.Module, family: Family, input_ids: torch.Tensor, queries: int = ATTENTION_QUERIES
) -> tuple[DynamicCache, torch.Tensor]:
    """The stock prefill's cache and the attention each position receives (n,), fp32.

    Attention from the last `queries` prompt rows, summed over heads, those
    queries and the last quarter of the layers (appendix C, figure 13).
    """
    layers = decoder_layers(model)
    first = len(layers) - max(1, len(layers) // 4)
    grabbed: dict[int, tuple] = {}
    handles = []

    def grab(index):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            cos, sin = kwargs["position_embeddings"]
            grabbed[index] = (hidden[:, -queries:], cos[:, -queries:], sin[:, -queries:])

        return hook

    for index in range(first, len(layers)):
        handles.append(layers[index].register_forward_pre_hook(grab(index), with_kwargs=True))
    cache = new_cache(model)
    try:
        model.model(input_ids=input_ids, cache=cache, use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
    n = input_ids.shape[1]
    received = torch.zeros(n, dtype=torch.float32, device=input_ids.device)
    for index, (hidden, cos, sin) in grabbed.items():
        attn = layers[index].self_attn
        q, _ = family.query(attn, family.input_norm(layers[index], hidden), cos, sin)
        q_pos = torch.arange(n - q.shape[2], n, device=q.device)
        got, _ = attention_mass(q, cache.layers[index].keys, attn.scaling, q_pos, torch.arange(n, device=q.device))
        received += got
    return cache, received
