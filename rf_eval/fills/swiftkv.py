"""`swiftkv`: SwiftKV's trained K/V projections inside RidgeFill's pipeline (RidgeFill paper Tables 19-20).

A SwiftKV checkpoint (Snowflake's layout, loaded by `rf_eval.files.checkpoints`)
carries, for every layer from its `num_key_value_layers` L on, projections
trained to write that layer's keys and values from the state entering layer
L. Here they fill the filled rows only: a filled row's late-layer keys and
values are its group's `k/v_proj_swiftkv(norm_swiftkv(x_S))`, the keys rotated
at its own position; exact rows (the tail, selected rows) and decoded tokens
run the model's own weights, as for any fill. The split defaults to L and
may lie above it (the projections then read x_S); every selector and the
tail work as for any fill. Attention layers only (Llama and Qwen2 SwiftKV
checkpoints).

SwiftKV's method code is this folder's two SwiftKV modules: the projections
(`SwiftKV`, here) and the checkpoint's own forward at its own split
(`rf_eval.fills.swiftkv_released`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rf_eval.engine.kv_strategies import PredictedKV
from rf_eval.engine.lower import decoder_layers
from rf_eval.fields import ArmError
from rf_eval.files.checkpoints import MODEL_TYPES, is_swiftkv
from rf_eval.fills.base import Fill
from rf_eval.ridge.targets import kv_width

__all__ = ["MODEL_TYPES", "SwiftKV", "SwiftKVInPipeline", "is_swiftkv"]


class SwiftKV:
    """SwiftKV's projections in one loaded checkpoint, as its authors' training code has them.

    The state entering layer L, x_L, is normed by `norm_swiftkv`; every late
    layer's keys and values, for every row, are its group's `k/v_proj_swiftkv`
    of that normed state (keys then rotated at their positions); its queries are
    `q_proj_swiftkv` of the layer's own normed input. `kv` gives the keys and
    values.
    """

    def __init__(self, model: nn.Module):
        config = model.config
        if not is_swiftkv(config):
            raise ValueError(f"model_type {getattr(config, 'model_type', None)!r} is not a SwiftKV checkpoint "
                             f"(model_type {' or '.join(MODEL_TYPES)}, with SwiftKV's tensors)")
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


class SwiftKVInPipeline(Fill):
    name = "swiftkv"
    summary = "filled rows' late keys and values from SwiftKV's trained projections of x_S (a SwiftKV checkpoint)"
    strategy = "kv"
    source = "SwiftKV (Snowflake), inside RidgeFill's pipeline: RidgeFill Tables 19-20"
    weights = "the checkpoint's SwiftKV projections"
    extra_tensors = "_swiftkv"
    cost = "SwiftKV's K/V projections (2 x kv width x d) in the first layer of each group, else nothing"

    def bind(self, model: Any, maps: Any) -> Any:
        return SwiftKV(model).kv

    def row_fill(self, fill_fn: Any) -> Any:
        if fill_fn is None:
            raise ValueError(f"fill {self.name!r} reads a SwiftKV checkpoint's projections: build it with bind()")
        return PredictedKV(fill_fn, own_at_split=False)

    def runs_on(self, model_config: Any) -> bool:
        return is_swiftkv(model_config)

    def default_split(self, model_config: Any) -> int | None:
        return int(model_config.num_key_value_layers) if is_swiftkv(model_config) else None

    def check(self, model_config: Any, maps: Any) -> None:
        if not is_swiftkv(model_config):
            raise ArmError(f"fill={self.name} reads SwiftKV's projections: it needs a SwiftKV checkpoint (model_type "
                           f"{' or '.join(MODEL_TYPES)}), not model_type {model_config.model_type!r}")
        if maps is not None:
            raise ArmError(f"fill={self.name} reads the checkpoint's own projections: leave out maps=")

    def check_split(self, model_config: Any, split: int) -> None:
        first = int(model_config.num_key_value_layers)
        if split < first:
                raise ArmError(f"split={split}: SwiftKV's projections start at layer {first} "
                           f"(num_key_value_layers); give split >= {first}")

    def filled_row_macs(self, config: Any, layer: Any, mapped: bool) -> int:
        first, group = int(config.num_key_value_layers), int(config.key_value_group_size)
        return config.hidden_size * kv_width(config) if (layer.index - first) % group == 0 else 0
