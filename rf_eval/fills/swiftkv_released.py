"""`swiftkv_released`: a SwiftKV checkpoint's own forward at its own split (RidgeFill paper Tables 19-20).

SwiftKV as its authors define it (`rf_eval.swiftkv`): from layer L =
`num_key_value_layers` on, every row's keys and values, for the prompt and
for every decoded token, are its group's `k/v_proj_swiftkv(norm_swiftkv(x_L))`
and its queries `q_proj_swiftkv` of the layer's own normed input. Binding an
arm makes the model's own forward SwiftKV's (its late projections wrapped
in place; the weights' fingerprint stays the checkpoint's), so decoding and
plain prompts run it too; the model then serves this fill, and the exact
arm beside it runs the base forward (`rf_eval.method.method_forward`).

The split is L. In the engine the exact rows (the tail) run the late layers
over keys and values that every row takes from x_L, so a prompt's logits do
not depend on the tail: SwiftKV's prefill skips the late layers for all but
the last row, and the tail only sets which rows are called filled. No row
selectors, corrections or splices: no row is computed any other way.
"""

from __future__ import annotations

from typing import Any

from rf_eval.fills.swiftkv import SwiftKVInPipeline


class SwiftKVReleased(SwiftKVInPipeline):
    name = "swiftkv_released"
    summary = "a SwiftKV checkpoint's own forward: every row's late keys and values from x_L, SwiftKV's queries"
    source = "SwiftKV (Snowflake) as released, at its own split: RidgeFill Tables 19-20"
    selects_rows = False
    replaces_forward = True

    def bind(self, model: Any, maps: Any) -> Any:
        from rf_eval.swiftkv import SwiftKV, use_released_forward

        use_released_forward(model, self.name)
        return SwiftKV(model).kv

    def row_fill(self, fill_fn: Any) -> Any:
        from rf_eval.engine.strategies import EveryRowKV

        if fill_fn is None:
            raise ValueError(f"fill {self.name!r} reads a SwiftKV checkpoint's projections: build it with bind()")
        return EveryRowKV(fill_fn)

    def check_split(self, model_config: Any, split: int) -> None:
        first = int(model_config.num_key_value_layers)
        if split != first:
            from rf_eval.fields import ArmError

            raise ArmError(f"split={split}: fill={self.name} runs at SwiftKV's own split {first} "
                           "(num_key_value_layers); leave split out")
