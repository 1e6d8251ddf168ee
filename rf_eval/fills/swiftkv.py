"""`swiftkv`: SwiftKV's trained K/V projections inside RidgeFill's pipeline (RidgeFill paper Tables 19-20).

A SwiftKV checkpoint (`rf_eval.swiftkv`: Snowflake's layout) carries, for
every layer from its `num_key_value_layers` L on, projections trained to
write that layer's keys and values from the state entering layer L. Here
they fill the filled rows only: a filled row's late-layer keys and values
are its group's `k/v_proj_swiftkv(norm_swiftkv(x_S))`, the keys rotated at
its own position; exact rows (the tail, selected rows) and decoded tokens
run the model's own weights, as for any fill. The split defaults to L and
may lie above it (the projections then read x_S); every selector and the
tail work as for any fill. Attention layers only (Llama and Qwen2 SwiftKV
checkpoints).
"""

from __future__ import annotations

from typing import Any

from rf_eval.fills.base import FillMethod


class SwiftKVInPipeline(FillMethod):
    name = "swiftkv"
    summary = "filled rows' late keys and values from SwiftKV's trained projections of x_S (a SwiftKV checkpoint)"
    strategy = "kv"
    source = "SwiftKV (Snowflake), inside RidgeFill's pipeline: RidgeFill Tables 19-20"
    weights = "the checkpoint's SwiftKV projections"
    extra_tensors = "_swiftkv"
    cost = "SwiftKV's K/V projections (2 x kv width x d) in the first layer of each group, else nothing"

    def bind(self, model: Any, maps: Any) -> Any:
        from rf_eval.swiftkv import SwiftKV

        return SwiftKV(model).kv

    def row_fill(self, fill_fn: Any) -> Any:
        from rf_eval.engine.strategies import PredictedKV

        if fill_fn is None:
            raise ValueError(f"fill {self.name!r} reads a SwiftKV checkpoint's projections: build it with bind()")
        return PredictedKV(fill_fn, own_at_split=False)

    def runs_on(self, model_config: Any) -> bool:
        return _swiftkv_config(model_config)

    def default_split(self, model_config: Any) -> int | None:
        return int(model_config.num_key_value_layers) if _swiftkv_config(model_config) else None

    def check(self, model_config: Any, maps: Any) -> None:
        from rf_eval.fields import ArmError

        if not _swiftkv_config(model_config):
            from rf_eval.swiftkv import MODEL_TYPES

            raise ArmError(f"fill={self.name} reads SwiftKV's projections: it needs a SwiftKV checkpoint (model_type "
                           f"{' or '.join(MODEL_TYPES)}), not model_type {model_config.model_type!r}")
        if maps is not None:
            raise ArmError(f"fill={self.name} reads the checkpoint's own projections: leave out maps=")

    def check_split(self, model_config: Any, split: int) -> None:
        first = int(model_config.num_key_value_layers)
        if split < first:
            from rf_eval.fields import ArmError

            raise ArmError(f"split={split}: SwiftKV's projections start at layer {first} "
                           f"(num_key_value_layers); give split >= {first}")

    def filled_row_macs(self, config: Any, layer: Any, mapped: bool) -> int:
        from rf_eval.ridge.targets import kv_width

        first, group = int(config.num_key_value_layers), int(config.key_value_group_size)
        return config.hidden_size * kv_width(config) if (layer.index - first) % group == 0 else 0


def _swiftkv_config(config: Any) -> bool:
    from rf_eval.swiftkv import is_swiftkv

    return is_swiftkv(config)
