"""The shapes of every family's tiny test model (`Family.tiny_config`): small enough for fast CPU tests,
large enough that grouped-query attention, QK-norm and partial RoPE are all exercised. Here, not in
`rf_eval.testing`, so that no family imports test code (`_`: not a family module)."""

from __future__ import annotations

from typing import Any

# Shared by every family.
TINY_SHAPES: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
# Shared by the hybrid families (Qwen3.5, Qwen3-Next) in their `tiny_settings`.
TINY_HYBRID: dict[str, Any] = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    # alternate Gated DeltaNet and gated attention so both sides of a split hold both kinds
    layer_types=["linear_attention", "full_attention"] * 3,
)
