"""lm-eval model `prefill`: each prompt prefilled by a prefill method found by name (`rf_eval.methods`).

    lm_eval --model prefill --model_args pretrained=MODEL,method=NAME[,<the method's arm fields>]

The adapter of every method without one of its own (`Method.model` is
`prefill`): a method in one file, in a folder on `RF_EVAL_METHOD_PATH` (or an
entry point of the `rf_eval.methods` group), runs through `lm_eval` with no
other edit. RidgeFill, RaReCache and the droppers load more than the model
(maps, a source model) and keep their own adapters (`--model ridgefill`,
`rarecache`, `drop`).

model_args (unknown, missing or contradictory keys fail before any weights load):
  pretrained     the model: HF folder or hub id
  method         the method's name (`rf-eval methods` lists them)
  <arm fields>   the method's settings (its `Method.Arm` dataclass)
  reference, seed, name   as for `ridgefill`; every other key as for lm-eval's `hf` model

Request types are `ridgefill`'s; the results' config records the method's
provenance (`rf_eval` in get_model_info) and the tasks' samples each prompt's
prefill cost (the method's `prefill_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry imports them only when empty)
from lm_eval.api.registry import register_model

from rf_eval.errors import UserError
from rf_eval.methods import GENERIC_MODEL, Method, method_class, methods_of
from rf_eval.model_adapters.config import AdapterSettings, ModelArgsError, model_config, take_model_args
from rf_eval.model_adapters.prefill_lm import PrefillLM

#: the generic adapter's own keys beside the method's arm fields
BASE_KEYS = ("pretrained", "method", "reference", "seed", "name")


@dataclass(frozen=True, kw_only=True)
class MethodSettings(AdapterSettings):
    """The `prefill` adapter's own model_args: the method (its declaration) and its parsed arm."""

    method: type[Method]
    arm: Any


def parse_method_args(args: dict[str, Any]) -> tuple[MethodSettings, dict[str, Any]]:
    """(settings, HFLM keyword arguments): the method found and its arm parsed, before any weights load."""
    name = args.get("method")
    if not name:
        raise ModelArgsError(f"--model {GENERIC_MODEL} needs method=<a prefill method>; its methods: "
                             f"{', '.join(methods_of(GENERIC_MODEL)) or 'none found'}")
    try:
        cls = method_class(str(name))
    except UserError as err:
        raise ModelArgsError(str(err)) from None
    if cls.model != GENERIC_MODEL:
        raise ModelArgsError(f"method={name} runs as --model {cls.model} (it loads more than the model)")
    own = (*BASE_KEYS, *cls.arm_fields())
    mine, hf = take_model_args(args, own, ("pretrained", "method"), model=GENERIC_MODEL)
    try:
        arm = cls.parse_arm({k: v for k, v in mine.items() if k in cls.arm_fields()}, what="model_args")
        model_config(mine["pretrained"], hf)
    except (UserError, ValueError) as err:
        raise ModelArgsError(f"method={name}: {err}") from err
    seed = mine.get("seed")
    if seed is not None and not str(seed).lstrip("-").isdigit():
        raise ModelArgsError(f"seed={seed!r} is not an integer")
    settings = MethodSettings(pretrained=str(mine["pretrained"]), method=cls, arm=arm,
                              reference=mine.get("reference"), seed=None if seed is None else int(seed))
    return settings, hf


@register_model(GENERIC_MODEL)
class MethodLM(PrefillLM):
    """`--model prefill`: prompts prefilled by the method `method=` names; see the module docstring."""

    method_name = GENERIC_MODEL

    settings: MethodSettings

    @classmethod
    def parse(cls, args: dict[str, Any]) -> tuple[MethodSettings, dict[str, Any]]:
        return parse_method_args(args)

    def build_method(self) -> tuple[Any, Any]:
        method = self.settings.method.build(self.model, self.tokenizer, self.settings.arm)
        return method, self.exact_method()

    def arm_with(self, fields: dict[str, Any]) -> Any:
        return self.settings.method.updated_arm(self.settings.arm, fields, what="rf_arm")

    def method_for(self, arm: Any) -> Any:
        if arm == self.settings.arm:
            return self.method
        return self.settings.method.build(self.model, self.tokenizer, arm)

    def arm_fields(self) -> tuple[str, ...]:
        return self.settings.method.arm_fields()

    def floor_split(self) -> int:
        """The engine floor of `reference=exact` runs is measured at half depth (a method may have no split)."""
        return max(int(self.model.config.num_hidden_layers) // 2, 1)
