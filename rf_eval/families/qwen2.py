"""Qwen2 / Qwen2.5: grouped-query attention as Llama's with biased q/k/v projections, no QK-norm.

`use_sliding_window` configs name `sliding_attention` layers (those from
`max_window_layers` on); the engine attends inside each one's window.
"""

from transformers.models.qwen2 import modeling_qwen2

from rf_eval.families.base import Family


class Qwen2(Family):
    model_types = ("qwen2", "qwen2_swiftkv")  # SwiftKV checkpoints: rf_eval.files.checkpoints
    apply_rope = staticmethod(modeling_qwen2.apply_rotary_pos_emb)
    traits = ("q/k/v bias",)
