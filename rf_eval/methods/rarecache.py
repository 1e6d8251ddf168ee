"""`rarecache`: the target's prompt cache mapped from a source model's, a share recomputed
(`rf_eval.rarecache.api.RaReCache`).

Run by `--model rarecache` (`rf_eval.model_adapters.rarecache`), which loads the source and the maps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import AutoConfig

from rf_eval.methods.base import MapsSplit, Method
from rf_eval.rarecache.api import RaReCache
from rf_eval.rarecache.arm_spec import RaReCacheArm
from rf_eval.rarecache.budget import knob_from_configs
from rf_eval.rarecache.maps import load_transfer_maps


class RaReCacheMethod(Method):
    name = "rarecache"
    Arm = RaReCacheArm
    keys = ("source", "maps")
    model = "rarecache"
    budget_sets = ("rho",)

    @classmethod
    def build(cls, model: Any, tokenizer: Any, arm: Any, *, source: Any, maps: Any, **parts: Any) -> Any:
        return RaReCache(model, source, tokenizer, maps=maps, arm=arm, **parts)

    @classmethod
    def check_budget(cls, model_args: Mapping[str, Any], arm: RaReCacheArm, lengths: Sequence[int] | None, *,
                     maps_split: MapsSplit) -> None:
        """The budget's knob from the source's and target's configs and the maps (eq. 11), before any weights."""
        configs = [AutoConfig.from_pretrained(model_args[k]) for k in ("source", "pretrained")]
        knob_from_configs(arm, load_transfer_maps(model_args["maps"]), *configs).check_reachable(lengths)
