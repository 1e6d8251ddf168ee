"""Qwen3 dense: grouped-query attention with per-head RMS QK-norm before RoPE."""

from transformers.models.qwen3 import modeling_qwen3

from rf_eval.families.base import Family


class Qwen3(Family):
    model_types = ("qwen3",)
    apply_rope = staticmethod(modeling_qwen3.apply_rotary_pos_emb)
    traits = ("QK-norm",)
