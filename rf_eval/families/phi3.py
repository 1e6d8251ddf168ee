"""Phi-3 / Phi-4-mini: one fused qkv projection and one fused gate/up projection; partial RoPE on Phi-4-mini.

The family reads keys/values and queries from their own rows of `qkv_proj`'s
weight, so a filled row pays for its K/V only, as the cost model charges.
Phi-3-mini-4k's `sliding_window` (every layer) is served by the engine's
windowed attention.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.phi3 import modeling_phi3

from rf_eval.families.base import Family


def _rows_of(proj: nn.Linear, h: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Output features start..stop-1 of a fused projection, computed from those weight rows only.

    The weight is read under accelerate's `align_module_device`, so an offloaded layer's is loaded first.
    """
    from accelerate.utils import align_module_device

    with align_module_device(proj):
        bias = None if proj.bias is None else proj.bias[start:stop]
        return F.linear(h, proj.weight[start:stop], bias)


class Phi3(Family):
    model_types = ("phi3",)
    apply_rope = staticmethod(modeling_phi3.apply_rotary_pos_emb)
    traits = ("fused qkv and gate/up", "partial RoPE")
    tiny_settings = dict(partial_rotary_factor=0.5)  # exercises partial RoPE (Phi-4-mini: 0.75)

    @staticmethod
    def _widths(attn: nn.Module) -> tuple[int, int]:
        return attn.config.num_attention_heads * attn.head_dim, attn.num_key_value_heads * attn.head_dim

    def project_kv(self, attn: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_width, kv_width = self._widths(attn)
        shape = (*h.shape[:-1], -1, attn.head_dim)
        kv = _rows_of(attn.qkv_proj, h, q_width, q_width + 2 * kv_width)
        k, v = kv[..., :kv_width].view(shape), kv[..., kv_width:].view(shape)
        return k.transpose(1, 2), v.transpose(1, 2)

    def query(self, attn: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q_width, _ = self._widths(attn)
        q = _rows_of(attn.qkv_proj, h, 0, q_width).view(*h.shape[:-1], -1, attn.head_dim)
        return self.rotate(q.transpose(1, 2), cos, sin), None
