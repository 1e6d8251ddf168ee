"""`rarecache`: the target's prompt cache mapped from a source model's, a share recomputed
(`rf_eval.rarecache.api.RaReCache`).

Run by `--model rarecache` (`rf_eval.model_adapters.rarecache`), which loads the source and the maps."""

from __future__ import annotations

from typing import Any

from rf_eval.methods.base import Method
from rf_eval.rarecache.api import RaReCache
from rf_eval.rarecache.arm_spec import RaReCacheArm


class RaReCacheMethod(Method):
    name = "rarecache"
    Arm = RaReCacheArm
    keys = ("source", "maps")
    model = "rarecache"

    @classmethod
    def build(cls, model: Any, tokenizer: Any, arm: Any, *, source: Any, maps: Any, **parts: Any) -> Any:
        return RaReCache(model, source, tokenizer, maps=maps, arm=arm, **parts)
