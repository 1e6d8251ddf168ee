"""Qwen3.5 (text path): Gated DeltaNet layers interleaved with gated attention
(QK-norm, partial RoPE, sigmoid output gate)."""

from transformers.models.qwen3_5 import modeling_qwen3_5

from rf_eval.families.base import GatedAttentionFamily
from rf_eval.testing import TINY_HYBRID


class Qwen3_5(GatedAttentionFamily):
    model_types = ("qwen3_5_text", "qwen3_5")
    apply_rope = staticmethod(modeling_qwen3_5.apply_rotary_pos_emb)
    traits = ("QK-norm", "partial RoPE")
    linear_attention = True
    tiny_settings = TINY_HYBRID
