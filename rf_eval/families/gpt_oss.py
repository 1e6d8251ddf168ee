"""GPT-OSS: attention with per-head sinks and biased projections, sliding-window layers alternating with
full ones, and a sparse mixture-of-experts MLP (top-k router, clamped SwiGLU experts)."""

import torch
from torch import nn
from transformers.models.gpt_oss import modeling_gpt_oss

from rf_eval.families.base import Family


class GptOss(Family):
    model_types = ("gpt_oss",)
    apply_rope = staticmethod(modeling_gpt_oss.apply_rotary_pos_emb)
    moe_mlp = True
    traits = ("attention sinks", "q/k/v/o bias", "YaRN RoPE")
    tiny_settings = dict(sliding_window=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)

    @staticmethod
    def attention_sinks(attn: nn.Module) -> torch.Tensor:
        return attn.sinks
