"""SwiftKV checkpoints (Snowflake's layout) as `transformers` models: the layout `transformers` lacks.

The layout (RidgeFill paper Tables 19-20 compare against it): the config's
`model_type` is `llama_swiftkv` or `qwen2_swiftkv`, with
`num_key_value_layers` L (layers 0..L-1 are the base model's) and
`key_value_group_size` g; the tensors beyond the base model's are
`model.norm_swiftkv.weight` and, for every layer i >= L,
`model.layers.{i}.self_attn.q_proj_swiftkv` and, where (i - L) % g == 0,
`k_proj_swiftkv` and `v_proj_swiftkv` (biased where the base model's
projections are: Qwen2 always, Llama with `attention_bias`). A layer with no
K/V projections of its own shares those of the group's first layer.

`register_checkpoint_types()` tells `AutoConfig` and `AutoModelForCausalLM`
about the two model types, with no remote code: the model is `transformers`'
own Llama / Qwen2 class, holding SwiftKV's tensors as extra modules that its
forward does not read. So an `exact`, `identity` or `ridge` arm on a SwiftKV
checkpoint runs its base model, as on any Llama. `rf_eval.families` registers
them wherever a model is loaded; SwiftKV's projections and forward are the fills `rf_eval.fills.swiftkv` and
`rf_eval.fills.swiftkv_released`.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

#: SwiftKV's model types -> the base model type whose classes read them
MODEL_TYPES = {"llama_swiftkv": "llama", "qwen2_swiftkv": "qwen2"}


def _check_groups(config: Any) -> None:
    """SwiftKV's defaults (every layer its own keys: no late layer; groups of one), and groups that tile the
    late layers."""
    if config.num_key_value_layers is None:
        config.num_key_value_layers = config.num_hidden_layers
    if config.key_value_group_size is None:
        config.key_value_group_size = 1
    late = config.num_hidden_layers - config.num_key_value_layers
    if late < 0 or config.key_value_group_size < 1 or late % config.key_value_group_size:
        raise ValueError(f"num_key_value_layers={config.num_key_value_layers} and key_value_group_size="
                         f"{config.key_value_group_size} do not tile the {config.num_hidden_layers} layers "
                         "into groups of late layers")


@strict
class LlamaSwiftKVConfig(LlamaConfig):
    """A Llama config with SwiftKV's two settings (see the module docstring)."""

    model_type = "llama_swiftkv"
    num_key_value_layers: int | None = None
    key_value_group_size: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        _check_groups(self)


@strict
class Qwen2SwiftKVConfig(Qwen2Config):
    """A Qwen2 config with SwiftKV's two settings (see the module docstring)."""

    model_type = "qwen2_swiftkv"
    num_key_value_layers: int | None = None
    key_value_group_size: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        _check_groups(self)


def _add_swiftkv_modules(model: nn.Module, bias: bool) -> None:
    config = model.config
    inner = model.model
    inner.norm_swiftkv = type(inner.norm)(config.hidden_size, eps=config.rms_norm_eps)
    first, group = config.num_key_value_layers, config.key_value_group_size
    for index in range(first, config.num_hidden_layers):
        attn = inner.layers[index].self_attn
        attn.q_proj_swiftkv = nn.Linear(config.hidden_size, attn.q_proj.out_features, bias=bias)
        if (index - first) % group == 0:
            attn.k_proj_swiftkv = nn.Linear(config.hidden_size, attn.k_proj.out_features, bias=bias)
            attn.v_proj_swiftkv = nn.Linear(config.hidden_size, attn.v_proj.out_features, bias=bias)


class LlamaSwiftKVForCausalLM(LlamaForCausalLM):
    """`transformers`' Llama, holding a SwiftKV checkpoint's extra tensors; its forward is the base model's."""

    config_class = LlamaSwiftKVConfig

    def __init__(self, config: LlamaSwiftKVConfig):
        super().__init__(config)
        _add_swiftkv_modules(self, bias=bool(config.attention_bias))


class Qwen2SwiftKVForCausalLM(Qwen2ForCausalLM):
    """`transformers`' Qwen2, holding a SwiftKV checkpoint's extra tensors; its forward is the base model's."""

    config_class = Qwen2SwiftKVConfig

    def __init__(self, config: Qwen2SwiftKVConfig):
        super().__init__(config)
        _add_swiftkv_modules(self, bias=True)


def register_checkpoint_types() -> None:
    """Make `AutoConfig` / `AutoModelForCausalLM` read SwiftKV folders (idempotent)."""
    for config_class, model_class in ((LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM),
                                      (Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM)):
        try:
            AutoConfig.register(config_class.model_type, config_class)
        except ValueError:
            pass  # registered before
        try:
            AutoModelForCausalLM.register(config_class, model_class)
        except ValueError:
            pass


def is_swiftkv(config: Any) -> bool:
    """True for the config of a SwiftKV checkpoint."""
    return getattr(config, "model_type", None) in MODEL_TYPES
