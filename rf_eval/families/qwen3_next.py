"""Qwen3-Next: the Qwen3.5 hybrid layout with a sparse mixture-of-experts MLP."""

from transformers.models.qwen3_next import modeling_qwen3_next

from rf_eval.families.base import GatedAttentionFamily
from rf_eval.testing import TINY_HYBRID


class Qwen3Next(GatedAttentionFamily):
    model_types = ("qwen3_next",)
    apply_rope = staticmethod(modeling_qwen3_next.apply_rotary_pos_emb)
    traits = ("QK-norm", "partial RoPE", "shared expert")
    linear_attention = True
    moe_mlp = True
    tiny_settings = dict(
        TINY_HYBRID,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        decoder_sparse_step=1,
    )
