"""SwiftKV's projections in a SwiftKV checkpoint (its layout: `rf_eval.checkpoints`).

SwiftKV's definition, as its authors' training code has it: the state
entering layer L, x_L, is normed by `norm_swiftkv`; every late layer's keys
and values, for every row, are its group's `k/v_proj_swiftkv` of that normed
state (keys then rotated at their positions); its queries are
`q_proj_swiftkv` of the layer's own normed input. `SwiftKV.kv` gives the
keys and values; `use_released_forward` makes a model's own forward SwiftKV's.
"""

from __future__ import annotations

import torch
from torch import nn

from rf_eval.checkpoints import MODEL_TYPES, is_swiftkv
from rf_eval.engine.lower import decoder_layers
from rf_eval.fills.base import FORWARD_MARK, ReplacedForward, replaced_forward

__all__ = ["MODEL_TYPES", "SwiftKV", "is_swiftkv", "use_released_forward"]


class SwiftKV:
    """SwiftKV's projections in one loaded checkpoint (see the module docstring)."""

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
