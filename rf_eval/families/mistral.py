"""Mistral: grouped-query attention as Llama's, no QK-norm.

Mistral 7B v0.1's `sliding_window` (every layer) is served too: the engine
attends inside `Family.sliding_window` of each layer.
"""

from transformers.models.mistral import modeling_mistral

from rf_eval.families.base import Family


class Mistral(Family):
    model_types = ("mistral",)
    apply_rope = staticmethod(modeling_mistral.apply_rotary_pos_emb)
    tiny_settings = dict(sliding_window=None)  # v0.2 and later: no sliding window
