"""Qwen3.5-MoE (text path): the Qwen3.5 hybrid layout (Gated DeltaNet + gated attention) with a sparse
mixture-of-experts MLP and a shared expert in every layer."""

from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

from rf_eval.families._tiny import TINY_HYBRID
from rf_eval.families.qwen3_5 import Qwen3_5


class Qwen3_5Moe(Qwen3_5):  # Qwen3.5's layers (and its Gated DeltaNet inputs), a MoE MLP
    model_types = ("qwen3_5_moe_text", "qwen3_5_moe")
    apply_rope = staticmethod(modeling_qwen3_5_moe.apply_rotary_pos_emb)
    traits = ("QK-norm", "partial RoPE", "shared expert")
    linear_attention = True
    moe_mlp = True
    tiny_settings = dict(TINY_HYBRID, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=32)
