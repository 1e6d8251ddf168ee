"""OLMo 2: post-norm blocks (no input norm; the attention and MLP outputs are normed before the residual)
and RMS QK-norm over all heads at once, before the heads split."""

import torch
from torch import nn
from transformers.models.olmo2 import modeling_olmo2

from rf_eval.families.base import Family


class Olmo2(Family):
    model_types = ("olmo2",)
    apply_rope = staticmethod(modeling_olmo2.apply_rotary_pos_emb)
    traits = ("post-norm", "full-width QK-norm")

    @staticmethod
    def input_norm(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x  # the projections read the residual stream itself

    @staticmethod
    def attention_residual(layer: nn.Module, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        return x + layer.post_attention_layernorm(mixed)

    def mlp(self, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return h + layer.post_feedforward_layernorm(layer.mlp(h))

    def project_kv(self, attn: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*h.shape[:-1], -1, attn.head_dim)
        k = attn.k_norm(attn.k_proj(h)).view(shape)
        v = attn.v_proj(h).view(shape)
        return k.transpose(1, 2), v.transpose(1, 2)

    def query(self, attn: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q = attn.q_norm(attn.q_proj(h)).view(*h.shape[:-1], -1, attn.head_dim)
        return self.rotate(q.transpose(1, 2), cos, sin), None
