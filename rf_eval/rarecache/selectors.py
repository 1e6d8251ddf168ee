"""Which prompt positions the target recomputes (paper sections 3.2, 4.3, 4.5).

Every selector returns one set of positions shared by all target layers,
except `layer-prefix`, which recomputes whole layers instead (see
`layer_budget`). Budgets are matched: ceil(rho * T) positions, or
ceil(rho * L) layers.

- `rank`: rank disagreement (eq. 2 / eq. 9), the method.
- `random`: uniform positions, seeded per prompt (sha256 of the seed and the
  candidate rows' tokens, every prompt token but the last), so a result never
  depends on request order, and a generation prefill draws a full one's rows.
- `attention`: attention *received* from the last 32 prompt queries,
  summed over heads, queries and the last quarter of the **source**'s layers
  (deployable: the source prefilled anyway).
- `oracle-attention`: the same from the **target**'s own prefill (an
  oracle: it needs the prefill RaReCache saves).
- `oracle-l2`: CacheBlend-like (section 4.5); the true relative mapping
  error ||mapped - true||² / ||true||² against the target's own cache, keys
  and values of a layer together, averaged over layers (appendix C,
  figure 13; an oracle).
- `layer-prefix`: DroidSpeak-like; the first ceil(rho * L) target layers
  recomputed for every row, the rest mapped.
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from rf_eval.engine import decoder_layers, new_cache
from rf_eval.families import Family

SELECTORS = ("rank", "random", "attention", "oracle-attention", "oracle-l2", "layer-prefix")
ORACLES = ("oracle-attention", "oracle-l2")
ATTENTION_QUERIES = 32


def budget(rho: float, total: int) -> int:
    """ceil(rho * total), exact for decimal rho (0.3 * 10 is 3, not 4)."""
    if not 0 <= rho <= 1:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    return math.ceil(Fraction(repr(float(rho))) * total)


def layer_budget(rho: float, n_layers: int) -> int:
    """Layers the layer-prefix baseline recomputes at the same budget: ceil(rho * L)."""
    return budget(rho, n_layers)


def top_rows(score: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` highest-scoring positions (ties: the earlier position), sorted."""
    if count <= 0:
        return torch.zeros(0, dtype=torch.long, device=score.device)
    order = torch.argsort(score.float(), descending=True, stable=True)
    return torch.sort(order[:count]).values


def random_rows(n: int, count: int, seed: int, input_ids: torch.Tensor) -> torch.Tensor:
    """`count` uniform positions of 0..n-1, seeded by (seed, prompt tokens)."""
    digest = hashlib.sha256(repr((int(seed), input_ids.flatten().tolist())).encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.sort(torch.randperm(n, generator=gen)[: max(count, 0)]).values.to(input_ids.device)


def l2_error(mapped, target_cache: DynamicCache, n: int) -> torch.Tensor:
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
        keys = cache.layers[index].keys
        keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
        logits = (q.float() @ keys.float().transpose(-1, -2)) * attn.scaling
        q_pos = torch.arange(n - q.shape[2], n, device=logits.device)
        mask = torch.arange(n, device=logits.device)[None, :] > q_pos[:, None]
        weights = F.softmax(logits.masked_fill(mask, float("-inf")), dim=-1)
        received += weights.sum((0, 1, 2))
    return cache, received
