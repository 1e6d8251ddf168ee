"""Qwen3-Next: the Qwen3.5 hybrid layout with a sparse mixture-of-experts MLP."""

from transformers.models.qwen3_next import modeling_qwen3_next

from rf_eval.families.base import GatedAttentionFamily


class Qwen3Next(GatedAttentionFamily):
    model_types = ("qwen3_next",)
    apply_rope = staticmethod(modeling_qwen3_next.apply_rotary_pos_emb)
