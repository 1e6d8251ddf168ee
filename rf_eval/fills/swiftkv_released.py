"""`swiftkv_released`: a SwiftKV checkpoint's own forward at its own split (RidgeFill paper Tables 19-20).

SwiftKV as its authors define it (`rf_eval.fills.swiftkv.SwiftKV`): from layer
L = `num_key_value_layers` on, every row's keys and values, for the prompt and
for every decoded token, are its group's `k/v_proj_swiftkv(norm_swiftkv(x_L))`
and its queries `q_proj_swiftkv` of the layer's own normed input. Binding an
arm makes the model's own forward SwiftKV's (`use_released_forward`: its late
projections wrapped in place; the weights' fingerprint stays the checkpoint's),
so decoding and plain prompts run it too; the model then serves this fill, and
the exact arm beside it runs the base forward (`rf_eval.methods.requests.ForwardContext`).

The split is L. In the engine the exact rows (the tail) run the late layers
over keys and values that every row takes from x_L, so a prompt's logits do
not depend on the tail: SwiftKV's prefill skips the late layers for all but
the last row, and the tail only sets which rows are called filled. No row
selectors, corrections or splices: no row is computed any other way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rf_eval.engine.kv_strategies import EveryRowKV
from rf_eval.fields import ArmError
from rf_eval.fills.base import FORWARD_MARK, ReplacedForward, replaced_forward
from rf_eval.fills.swiftkv import SwiftKV, SwiftKVInPipeline

__all__ = ["SwiftKVReleased", "use_released_forward"]


class SwiftKVReleased(SwiftKVInPipeline):
    name = "swiftkv_released"
    summary = "a SwiftKV checkpoint's own forward: every row's late keys and values from x_L, SwiftKV's queries"
    source = "SwiftKV (Snowflake) as released, at its own split: RidgeFill Tables 19-20"
    selects_rows = False
    replaces_forward = True

    def bind(self, model: Any, maps: Any) -> Any:
        use_released_forward(model, self.name)
        return SwiftKV(model).kv

    def row_fill(self, fill_fn: Any) -> Any:
        if fill_fn is None:
            raise ValueError(f"fill {self.name!r} reads a SwiftKV checkpoint's projections: build it with bind()")
        return EveryRowKV(fill_fn)

    def check_split(self, model_config: Any, split: int) -> None:
        first = int(model_config.num_key_value_layers)
        if split != first:
                raise ArmError(f"split={split}: fill={self.name} runs at SwiftKV's own split {first} "
                           "(num_key_value_layers); leave split out")


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
