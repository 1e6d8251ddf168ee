"""lm-eval model `rarecache`: the target's prompt cache mapped from a source model's, with selective recomputation.

    lm_eval --model rarecache \\
        --model_args pretrained=TARGET,source=SOURCE,maps=MAPS_DIR,rho=0.3[,selector=rank][,seed=0] \\
        --tasks ...

RaReCache (paper section 3): the source prefills each prompt; the maps written
by `rf-eval fit-transfer` predict the target's cache; the target recomputes
ceil(rho * T) positions (the last prompt row included) chosen by `selector`
and reads the mapped cache elsewhere. Everything after the prompt is the stock
target model, so a run differs from lm-eval's `hf` model (on the target) in
nothing but the prefill; rho=1 is bitwise `hf`.

model_args (unknown, missing or contradictory keys fail before any model loads):
  pretrained (required)  the target: HF folder or hub id
  source (required)      the source model; must share the target's tokenizer
  maps (required)        folder or file written by `rf-eval fit-transfer` for this pair
  rho                    recompute budget in [0, 1] (default 0.3)
  selector               rank (default) | random-positions | source-attention | oracle-attention |
                         oracle-l2 | layer-prefix (`rf_eval.selectors.mapped_cache`; RidgeFill's
                         `random` and `attention` mean other things). The oracle-* selectors read the target's own prefill
                         (CacheBlend-like l2 error; the target's attention): analysis only,
                         and flagged `oracle: true` in the results' config. layer-prefix is
                         the DroidSpeak-like baseline: ceil(rho * L) first layers recomputed.
  seed                   random-positions' seed (default 0); also seeds sampled generation
  reference              as for `ridgefill`
  every other key        as for lm-eval's `hf` model (an `HFLM` subclass: revision, dtype,
                         parallelize, enable_thinking, ...); the source loads with the target's
                         dtype onto the target's input device, with the same revision rules

Request types are `ridgefill`'s (loglikelihood, loglikelihood_rolling,
generate_until, token_logprobs, multiturn_generate): see
`rf_eval.model_adapters.ridgefill` for their formats. The results' config
records the arm (`rf_eval` in get_model_info): budget, selector, oracle flag,
both models, the maps' sha256 and metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry imports them only when empty)
from lm_eval.api.registry import register_model

from rf_eval.fields import ArmError
from rf_eval.fills import FILL_OFF
from rf_eval.loading_report import check_loaded, recording_missing_keys
from rf_eval.methods import method_class
from rf_eval.model_adapters.config import (
    AdapterSettings,
    ModelArgsError,
    adapter_keys,
    model_config,
    take_model_args,
)
from rf_eval.model_adapters.prefill_lm import PrefillLM
from rf_eval.rarecache.arm_spec import RaReCacheArm
from rf_eval.rarecache.budget import knob_from_configs
from rf_eval.rarecache.maps import TokenizerMismatch, check_tokenizers, load_transfer_maps
from rf_eval.ridge.maps import MapError

OWN_KEYS = adapter_keys()["rarecache"]
#: the model_args a rarecache run cannot start without: the target, the source and their transfer maps
REQUIRED = ("pretrained", "source", "maps")


@dataclass(frozen=True, kw_only=True)
class RaReCacheSettings(AdapterSettings):
    """The `rarecache` adapter's own model_args."""

    source: str
    maps: str
    arm: RaReCacheArm
    maps_obj: Any = None  # the loaded TransferMaps (read once, before the weights)


def parse_rarecache_args(args: dict[str, Any]) -> tuple[RaReCacheSettings, dict[str, Any]]:
    """(settings, HFLM keyword arguments): tokenizers compared and maps checked for the pair, before any weights."""
    from transformers import AutoTokenizer

    mine, hf = take_model_args(args, OWN_KEYS, REQUIRED, model="rarecache")
    remote = {k: hf[k] for k in ("trust_remote_code",) if hf.get(k) is not None}
    try:
        arm = RaReCacheArm.from_fields({k: v for k, v in mine.items() if k in RaReCacheArm.fields()},
                                       what="model_args")
        target_tok = hf.get("tokenizer") if isinstance(hf.get("tokenizer"), str) else mine["pretrained"]
        check_tokenizers(AutoTokenizer.from_pretrained(mine["source"], **remote),
                         AutoTokenizer.from_pretrained(target_tok, **remote))
        maps = load_transfer_maps(mine["maps"])
        source_config, target_config = model_config(mine["source"], hf, checks_keys=False), model_config(mine["pretrained"], hf)
        maps.check_pair(source_config, target_config)
        if arm.budget is not None:  # a budget no recompute count meets is refused before any weights load
            knob_from_configs(arm, maps, source_config, target_config).check_reachable()
        settings = RaReCacheSettings(pretrained=str(mine["pretrained"]), source=str(mine["source"]),
                                     maps=str(mine["maps"]), arm=arm, maps_obj=maps,
                                     reference=mine.get("reference"), seed=arm.seed)
    except (ArmError, MapError, TokenizerMismatch) as err:
        raise ModelArgsError(f"rarecache: {err}") from err
    return settings, hf


@register_model("rarecache")
class RaReCacheLM(PrefillLM):
    """`--model rarecache`: prompts prefilled by `rf_eval.rarecache.RaReCache`; see the module docstring."""

    method_name = "rarecache"

    settings: RaReCacheSettings

    @classmethod
    def parse(cls, args: dict[str, Any]) -> tuple[RaReCacheSettings, dict[str, Any]]:
        return parse_rarecache_args(args)

    @classmethod
    def preflight(cls, args: dict[str, Any]) -> RaReCacheArm:
        """The keys and the arm, without loading the tokenizers and maps `parse` compares (the study's own
        budget check reads the maps where a budget needs them)."""
        mine, _ = take_model_args(args, OWN_KEYS, REQUIRED, model="rarecache")
        return RaReCacheArm.from_fields({k: v for k, v in mine.items() if k in RaReCacheArm.fields()}, what="args")

    def build_method(self) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM

        s = self.settings
        remote = bool(self._hf_args.get("trust_remote_code", False))
        with recording_missing_keys():
            source = AutoModelForCausalLM.from_pretrained(s.source, dtype=self.model.dtype,
                                                          trust_remote_code=remote)
        check_loaded(source, FILL_OFF, "the source model")
        # The tokenizers were compared in parse (before configure_pad_token could touch this one).
        method = method_class(self.method_name).build(self.model, None, s.arm, source=source.to(self.input_device).eval(),
                                                      maps=s.maps_obj)
        return method, self.exact_method()

    def arm_with(self, fields: dict[str, Any]) -> RaReCacheArm:
        return self.settings.arm.updated(fields, what="rf_arm")

    def method_for(self, arm: RaReCacheArm) -> Any:
        if arm == self.settings.arm:
            return self.method
        return method_class(self.method_name).build(self.model, None, arm, source=self.method.source,
                                                    maps=self.settings.maps_obj)

    def arm_info(self) -> dict[str, Any]:
        info = super().arm_info()
        info.update(selectors=[info["selector"]], corrections=[], splices=[], maps_path=self.settings.maps,
                    source_path=self.settings.source,
                    source_num_parameters=sum(p.numel() for p in self.method.source.parameters()))
        return info
