"""Qwen3.5 (text path): Gated DeltaNet layers interleaved with gated attention
(QK-norm, partial RoPE, sigmoid output gate)."""

import torch
from torch import nn
from transformers.models.qwen3_5 import modeling_qwen3_5

from rf_eval.families._tiny import TINY_HYBRID
from rf_eval.families.base import GatedAttentionFamily


class Qwen3_5(GatedAttentionFamily):
    model_types = ("qwen3_5_text", "qwen3_5")
    apply_rope = staticmethod(modeling_qwen3_5.apply_rotary_pos_emb)
    traits = ("QK-norm", "partial RoPE")
    linear_attention = True
    tiny_settings = TINY_HYBRID

    def delta_inputs(self, mixer: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Qwen3.5's separate projections: in_proj_qkv, in_proj_b, in_proj_a (see `Family.delta_inputs`)."""
        return mixer.in_proj_qkv(h), mixer.in_proj_b(h), mixer.in_proj_a(h)
