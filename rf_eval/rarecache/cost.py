"""RaReCache's analytical speedup ceiling (paper appendix B.4, eq. 11).

    Target FLOPs / RaReCache FLOPs
        = (2 P_T T + ½ α T²) / ((2 P_map + 2 P_probe + 2 ρ P_T) T + ρ α T²),   α = 4 L_T H_T d_h

P_T, P_map, P_probe: parameters of the target, the linear maps and the
rank-disagreement probe (one d_t x r basis per layer and side); L_T, H_T,
d_h: target depth, query-head count and head dimension. The recomputed
rows attend over all T keys through an explicit mask (ρ α T², as the
paper's implementation and this package's engine do); `causal_skip=True`
charges ½ ρ α T² instead (a kernel that skips masked pairs). As T grows the
ceiling tends to 1 / (2ρ) (1 / ρ with `causal_skip`).

P_T here counts the weights every prompt row multiplies: the decoder
layers and the final norm. The input embedding is a lookup and a prefill
computes logits for the last row only, so neither the embedding table nor
the LM head is charged (the paper's 1.3e10 for Qwen3-14B is this count).
The source's own prefill is not charged by `speedup_ceiling` (the paper's
cascade setting: the source has already read the prompt). A run's per-item
cost (`EquationCost`, `rf_eval.cost.prefill_cost`) charges it: the same count for
the source, P_S T + α_S T² / 4 multiply-accumulates, so a study compares
RaReCache with a method that reads the prompt once at what it spends in all.
Multiply-accumulates are FLOPs / 2 throughout.

P_probe: the paper's text describes the probe as one d_t x r basis V_r per
target layer and side (`probe_count="basis"`, the default). Its printed
ceilings for Qwen3-0.6B -> 14B (2.74x at T=2,048, 2.28x at 32,768, 2.95x with
the causal skip) come out only when each layer and side also stores the
reduced-rank map W V_r, (d_s + d_t) r parameters (`probe_count="reduced_map"`);
the text's count gives 2.78x, 2.30x and 2.99x (tests/rarecache, with the
model's exact parameter counts). The paper disagrees with itself; both
counts are offered and the default follows its text.
"""

from __future__ import annotations

from torch import nn

#: How eq. 11 counts the probe's parameters per target layer and side (see the module docstring).
PROBE_COUNTS = ("basis", "reduced_map")


def probe_parameters(d_source: int, d_target: int, rank: int, probe_count: str = "basis") -> int:
    """The probe's parameters for one target layer and side: d_t r (`basis`) or (d_s + d_t) r (`reduced_map`)."""
    if probe_count not in PROBE_COUNTS:
        raise ValueError(f"probe_count={probe_count!r} is not valid; valid counts: {', '.join(PROBE_COUNTS)}")
    return (d_target if probe_count == "basis" else d_source + d_target) * rank


def attention_alpha(n_layers: int, n_heads: int, head_dim: int) -> int:
    """α = 4 L_T H_T d_h: FLOPs per (query, key) pair over all layers (QK^T and AV, 2 each)."""
    return 4 * n_layers * n_heads * head_dim


def speedup_ceiling(
    p_target: float,
    p_map: float,
    p_probe: float,
    T: int,
    rho: float,
    alpha: float,
    *,
    causal_skip: bool = False,
) -> float:
    """Eq. 11: target prefill FLOPs over RaReCache FLOPs at prompt length T and budget rho, for a target of
    α = 4 L_T H_T d_h (`attention_alpha`)."""
    if T <= 0 or not 0 <= rho <= 1:
        raise ValueError(f"need T > 0 and 0 <= rho <= 1; got T={T}, rho={rho}")
    full = 2 * p_target * T + 0.5 * alpha * T**2
    attention = (0.5 if causal_skip else 1.0) * rho * alpha * T**2
    ours = (2 * p_map + 2 * p_probe + 2 * rho * p_target) * T + attention
    return full / ours


def target_parameters(model: nn.Module) -> int:
    """P_T: parameters of the decoder layers and final norm (see the module docstring)."""
    inner = model.model
    return sum(p.numel() for p in inner.layers.parameters()) + sum(p.numel() for p in inner.norm.parameters())


def ceiling_for(target: nn.Module, maps, T: int, rho: float, causal_skip: bool = False,
                target_side_only: bool = False, probe_count: str = "basis") -> float:
    """Eq. 11 for a loaded target and its TransferMaps; `target_side_only` sets P_map = P_probe = 0;
    `probe_count`: see `PROBE_COUNTS`."""
    cfg = target.config
    p_map, p_probe = (0, 0) if target_side_only else maps.parameter_counts(probe_count)
    alpha = attention_alpha(cfg.num_hidden_layers, cfg.num_attention_heads, _head_dim(cfg))
    return speedup_ceiling(target_parameters(target), p_map, p_probe, T, rho, alpha, causal_skip=causal_skip)


class EquationCost:
    """Eq. 11's terms in multiply-accumulates for one target, source and maps, per prompt length T.

    exact(T) = P_T T + α T² / 4 (the numerator / 2); arm(T, k) = (P_map + P_probe) T + k P_T + k α T / 2 for
    k recomputed rows (ρ = k / T; a quarter with `causal_skip`) plus the source's prefill, P_S T + α_S T² / 4;
    `layers(T, m)`: the layer-prefix baseline, the target's first m of L layers exact for every row and
    the maps of the other layers read.
    """

    def __init__(self, target: nn.Module, source: nn.Module, maps, causal_skip: bool = False,
                 probe_count: str = "basis"):
        cfg, scfg = target.config, source.config
        self.p_target, self.p_source = target_parameters(target), target_parameters(source)
        self.p_map, self.p_probe = maps.parameter_counts(probe_count)
        self.alpha, self.alpha_source = (attention_alpha(c.num_hidden_layers, c.num_attention_heads, _head_dim(c))
                                         for c in (cfg, scfg))
        self.n_layers = int(cfg.num_hidden_layers)
        self.causal_skip = causal_skip

    def exact(self, T: int) -> int:
        return _macs(2 * self.p_target * T + 0.5 * self.alpha * T * T)

    def source(self, T: int) -> int:
        return _macs(2 * self.p_source * T + 0.5 * self.alpha_source * T * T)

    def rows(self, T: int, k: int) -> int:
        attention = (0.5 if self.causal_skip else 1.0) * k * self.alpha * T
        return _macs((2 * self.p_map + 2 * self.p_probe) * T + 2 * k * self.p_target + attention) + self.source(T)

    def layers(self, T: int, m: int) -> int:
        share = m / self.n_layers
        return (_macs(share * (2 * self.p_target * T + 0.5 * self.alpha * T * T) + 2 * self.p_map * (1 - share) * T)
                + self.source(T))


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _macs(flops: float) -> int:
    return int(round(flops / 2))
