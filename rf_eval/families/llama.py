"""Llama: plain multi-head / grouped-query attention, no QK-norm."""

from transformers.models.llama import modeling_llama

from rf_eval.families.base import Family


class Llama(Family):
    model_types = ("llama", "llama_swiftkv")  # SwiftKV checkpoints: rf_eval.files.checkpoints
    apply_rope = staticmethod(modeling_llama.apply_rotary_pos_emb)
    tiny_settings = dict(rope_theta=10000.0)
