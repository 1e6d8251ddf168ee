"""SwiftKV checkpoints (Snowflake's layout) as `transformers` models, and SwiftKV's projections.

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
checkpoint runs its base model, as on any Llama.

SwiftKV's definition, as its authors' training code has it: the state
entering layer L, x_L, is normed by `norm_swiftkv`; every late layer's keys
and values, for every row, are its group's `k/v_proj_swiftkv` of that normed
state (keys then rotated at their positions); its queries are
`q_proj_swiftkv` of the layer's own normed input. `SwiftKV.kv` gives the
keys and values; `use_released_forward` makes a model's own forward SwiftKV's.
"""

from __future__ import annotations

from typing import Any

import torch
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


class SwiftKV:
    """SwiftKV's projections in one loaded checkpoint (see the module docstring)."""

    def __init__(self, model: nn.Module):
        config = model.config
        if not is_swiftkv(config):
            raise ValueError(f"model_type {getattr(config, 'model_type', None)!r} is not a SwiftKV checkpoint "
                             f"(model_type {' or '.join(MODEL_TYPES)}, with SwiftKV's tensors)")
        from rf_eval.engine.lower import decoder_layers

        self.first = int(config.num_key_value_layers)
        self.group = int(config.key_value_group_size)
        self.layers = decoder_layers(model)
        self.norm = model.model.norm_swiftkv

    def leader(self, index: int) -> int:
        """The layer whose K/V projections late layer `index` uses (its group's first)."""
        if index < self.first:
            raise ValueError(f"layer {index} is below SwiftKV's first late layer {self.first}")
        return self.first + (index - self.first) // self.group * self.group

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x).to(x.device)

    def kv(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """[keys before RoPE; values] (1, n, 2 x kv width) of late layer `index` for rows whose state is x."""
        attn = self.layers[self.leader(index)].self_attn
        h = self.normed(x)
        return torch.cat([attn.k_proj_swiftkv(h), attn.v_proj_swiftkv(h)], dim=-1)


def use_released_forward(model: nn.Module, name: str) -> None:
    """Make the model's own forward SwiftKV's, for the prompt and every decoded token (idempotent).

    The module tree and the weights' fingerprint stay the checkpoint's: layer
    L's pre-hook keeps norm_swiftkv(x_L) of the rows it runs, until the last
    layer has run; a late layer's `q_proj` forwards to `q_proj_swiftkv`, its
    `k_proj` / `v_proj` to its group's SwiftKV projections of the kept state
    (their `forward` wrapped in place: the stock projections do not run). The
    model then carries a `ReplacedForward` named `name`: the exact arm beside
    it pauses it, and the wrapped projections are the stock ones again.
    """
    from rf_eval.fills.base import FORWARD_MARK, ReplacedForward, replaced_forward

    if replaced_forward(model) is not None:
        if replaced_forward(model).fill == name:
            return
        raise ValueError(f"this model's forward was made fill={replaced_forward(model).fill}'s already")
    swift = SwiftKV(model)
    switch = ReplacedForward(name)
    kept: dict[str, torch.Tensor | None] = {"h": None}

    def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
        kept["h"] = swift.normed(args[0] if args else kwargs["hidden_states"]) if switch.active else None

    def from_kept(module: nn.Module, projection: nn.Module, what: str) -> None:
        own = module.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            if not switch.active:
                return own(x)
            h = kept["h"]
            if h is None or h.shape[:-1] != x.shape[:-1]:
                raise RuntimeError(f"a late layer's {what} ran outside the model's own forward; under fill={name} "
                                   f"its keys and values come from the state entering layer {swift.first}")
            return projection(h)
        module.forward = forward

    def queries(module: nn.Module, projection: nn.Module) -> None:
        own = module.forward
        module.forward = lambda x: projection(x) if switch.active else own(x)

    def forget(module: nn.Module, args: tuple, out: object) -> None:
        kept["h"] = None  # a late projection outside this forward must not read this forward's state

    swift.layers[swift.first].register_forward_pre_hook(keep, with_kwargs=True)
    swift.layers[-1].register_forward_hook(forget)
    for index in range(swift.first, len(swift.layers)):
        attn, lead = swift.layers[index].self_attn, swift.layers[swift.leader(index)].self_attn
        queries(attn.q_proj, attn.q_proj_swiftkv)
        from_kept(attn.k_proj, lead.k_proj_swiftkv, "k_proj")
        from_kept(attn.v_proj, lead.v_proj_swiftkv, "v_proj")
    setattr(model, FORWARD_MARK, switch)
