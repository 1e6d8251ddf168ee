"""Map a source cache into the target's, and score each position by rank disagreement.

Paper section 3.2, eq. 2, appendix A and B.1. For one prompt:

1. the source's keys are de-rotated and each source layer's block is
   centred (x_j - x̄_j) once; every target layer that reads block j shares
   it (B.1: no block is rebuilt per target layer or head);
2. per target layer and side the centred prediction z = (x - x̄) W over the
   chosen blocks; the mapped entry ŷ = z + μ̂ with μ̂ = x̄ W + b (eq. 3), which
   equals x W + b;
3. the score s_t = Σ_{l,σ} ||z_t||² - ||z_t V_r||² (eq. 9), one d_t x r
   projection per layer and side;
4. the target's mapped keys are re-rotated at their positions with the
   target's own RoPE tables.

The maps run in `dtype` (the target's by default; the paper runs them in
bf16 on GPU); scores accumulate in fp32.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from rf_eval.families import family_for
from rf_eval.rarecache.features import heads, kv_shape, rope_tables
from rf_eval.rarecache.maps import SIDES, TransferMaps


@dataclass
class MappedCache:
    """The target-side cache predicted for one prompt: per target layer (1, n_kv, n, D) keys (rotated) and values."""

    keys: dict[int, torch.Tensor]
    values: dict[int, torch.Tensor]
    score: torch.Tensor | None  # (n,) rank disagreement, fp32; None when not asked for
    timings: dict[str, float] = field(default_factory=dict)

    def kv_fill(self, layer: int, filled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's cache-to-cache fill: mapped K/V of the filled rows of one layer."""
        return self.keys[layer][:, :, filled], self.values[layer][:, :, filled]


class Mapper:
    """Transfer maps prepared for inference on one device and dtype."""

    def __init__(self, maps: TransferMaps, target: nn.Module, dtype: torch.dtype, device,
                 clock: Callable[[], float] = time.perf_counter):
        self.maps = maps
        self.clock = clock
        self.target = target
        self.dtype = dtype
        self.device = torch.device(device)
        self.kv_heads, _ = kv_shape(target.config)
        put = dict(device=self.device, dtype=dtype)
        self.weight, self.mu, self.basis, self.blocks = {}, {}, {}, {}
        for (side, layer), m in maps.maps.items():
            mean = torch.cat([maps.source_mean[(side, j)] for j in m.source_layers])
            self.weight[(side, layer)] = m.weight.to(**put)
            self.mu[(side, layer)] = (mean.double() @ m.weight.double() + m.bias.double()).to(**put)
            self.basis[(side, layer)] = m.basis.to(**put)
            self.blocks[(side, layer)] = m.source_layers
        self.source_mean = {key: t.to(**put) for key, t in maps.source_mean.items()}

    def centred_blocks(self, entries: dict[str, list[torch.Tensor]], layers: list[int] | None = None):
        """(side, source layer) -> x_j - x̄_j for every source layer a map reads (computed once per prompt)."""
        wanted = {(side, j) for (side, layer), js in self.blocks.items() if layers is None or layer in layers
                  for j in js}
        return {(side, j): entries[side][j].to(device=self.device, dtype=self.dtype) - self.source_mean[(side, j)]
                for side, j in wanted}

    @torch.no_grad()
    def map_prompt(
        self, entries: dict[str, list[torch.Tensor]], score: bool = True, layers: list[int] | None = None
    ) -> MappedCache:
        """Map the source entries (side -> per-layer (n, d_s) de-rotated) into target K/V (+ scores)."""
        t0 = self.clock()
        layers = self.maps.target_layers if layers is None else layers
        blocks = self.centred_blocks(entries, layers)
        n = next(iter(blocks.values())).shape[0]
        cos, sin = rope_tables(self.target, n, self.device, self.dtype)
        family = family_for(self.target.config)
        total = torch.zeros(n, dtype=torch.float32, device=self.device) if score else None
        t_score = 0.0
        out: dict[str, dict[int, torch.Tensor]] = {s: {} for s in SIDES}
        for layer in layers:
            for side in SIDES:
                x = torch.cat([blocks[(side, j)] for j in self.blocks[(side, layer)]], -1)
                z = x @ self.weight[(side, layer)]
                if score:
                    ts = self.clock()
                    proj = z @ self.basis[(side, layer)]
                    total += z.float().pow(2).sum(-1) - proj.float().pow(2).sum(-1)
                    t_score += self.clock() - ts
                y = heads(z + self.mu[(side, layer)], self.kv_heads)
                out[side][layer] = family.rotate(y, cos, sin) if side == "key" else y
        elapsed = self.clock() - t0
        return MappedCache(out["key"], out["value"], total,
                           {"map": elapsed - t_score, "score": t_score})
