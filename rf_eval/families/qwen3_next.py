"""Qwen3-Next: the Qwen3.5 hybrid layout with a sparse mixture-of-experts MLP."""

import torch
from torch import nn
from transformers.models.qwen3_next import modeling_qwen3_next

from rf_eval.families._tiny import TINY_HYBRID
from rf_eval.families.base import GatedAttentionFamily


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

    def delta_inputs(self, mixer: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Qwen3-Next's fused projections in_proj_qkvz and in_proj_ba, split by the module's own
        `fix_query_key_value_ordering` (the output gate z is dropped: it reads no state).
        See `Family.delta_inputs`."""
        q, k, v, _z, b, a = mixer.fix_query_key_value_ordering(mixer.in_proj_qkvz(h), mixer.in_proj_ba(h))
        qkv = torch.cat([t.reshape(*t.shape[:2], -1) for t in (q, k, v)], -1)
        return qkv, b, a
