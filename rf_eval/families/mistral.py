"""Mistral: grouped-query attention as Llama's, no QK-norm.

Checkpoints without a sliding window only (Mistral 7B v0.2 and later):
`family_for` refuses `sliding_window` configs, since the engine attends over
the whole prefix.
"""

from transformers.models.mistral import modeling_mistral

from rf_eval.families.base import Family


class Mistral(Family):
    model_types = ("mistral",)
    apply_rope = staticmethod(modeling_mistral.apply_rotary_pos_emb)
    tiny_settings = dict(sliding_window=None)  # v0.2 and later: no sliding window
