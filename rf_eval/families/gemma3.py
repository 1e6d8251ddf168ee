"""Gemma 3 (text path; `gemma3_text`): sandwich norms around attention and MLP, per-head QK-norm,
scaled embeddings (inside the model's own embedding), local sliding-window layers interleaved with
global ones, each kind with its own RoPE tables, and attention scaled by `query_pre_attn_scalar`."""

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.models.gemma3 import modeling_gemma3

from rf_eval.families.base import Family


class Gemma3(Family):
    model_types = ("gemma3_text",)
    apply_rope = staticmethod(modeling_gemma3.apply_rotary_pos_emb)
    traits = ("sandwich norms", "QK-norm", "scaled embeddings", "local/global RoPE")
    # a window shorter than the tests' prompts, local and global layers on both sides of a split
    tiny_settings = dict(sliding_window=16, query_pre_attn_scalar=16, sliding_window_pattern=2)

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise ValueError("attn_logit_softcapping is set: the engine's attention has no logit soft-capping")
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention is set: the engine's attention is causal")

    @staticmethod
    def attention_residual(layer: nn.Module, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        return x + layer.post_attention_layernorm(mixed)

    def mlp(self, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))

    @staticmethod
    def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        logits = Family.logits(model, x)
        cap = model.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap  # as Gemma3ForCausalLM

    @staticmethod
    def rope_kind(layer: nn.Module) -> str:
        return layer.self_attn.layer_type

    @staticmethod
    def rope_tables(model: nn.Module, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict:
        rotary = model.model.rotary_emb
        return {kind: rotary(hidden, position_ids, kind) for kind in rotary.layer_types}
