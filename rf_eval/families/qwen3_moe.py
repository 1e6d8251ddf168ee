"""Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's QK-norm attention with a sparse mixture-of-experts MLP."""

from transformers.models.qwen3_moe import modeling_qwen3_moe

from rf_eval.families.base import Family


class Qwen3Moe(Family):
    model_types = ("qwen3_moe",)
    apply_rope = staticmethod(modeling_qwen3_moe.apply_rotary_pos_emb)
    traits = ("QK-norm",)
    moe_mlp = True
    tiny_settings = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                         mlp_only_layers=[])
