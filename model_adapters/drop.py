"""lm-eval model `drop`: each prompt prefilled by a token-dropping method (GemFilter, Speculative Prefill).

    lm_eval --model drop --model_args pretrained=MODEL,method=gemfilter[,keep=1024|keep_share=S|budget=F][,filter_layer=R]
    lm_eval --model drop --model_args pretrained=TARGET,method=specprefill,source=SPECULATOR[,keep_share=0.1|budget=F]

A dropper keeps k of a prompt's N rows and prefills the model on those alone
(`rf_eval.drop`): its cache holds k rows in every layer, so its arm is not a
fill of RidgeFill's (which keeps every row's entry) and has settings of its
own; a new adapter rather than `--model ridgefill`. FastKV's token-selective
propagation keeps every row below its layer and runs in RidgeFill's engine:
`--model ridgefill --model_args preset=fastkv`.

model_args (unknown, missing or contradictory keys fail before any weights load):
  pretrained     the model (the target of specprefill): HF folder or hub id
  method         gemfilter (default) | specprefill
  keep           rows kept, a count (gemfilter's k, default 1024)
  keep_share     rows kept, a share of the prompt (specprefill's, default 0.1, whole chunks)
  budget         a share of exact prefill's MACs: the rows (chunks) set per prompt length to spend it
  filter_layer   gemfilter's r (default floor(13 L / 32), the authors' 13 of 32)
  source         specprefill's speculator: a smaller model of the same tokenizer (compared before loading)
  lookahead, chunk  specprefill's (8, 32)
  reference, seed   as for `ridgefill`; every other key as for lm-eval's `hf` model

Everything after the prompt is the stock model over the kept rows' cache, at
the positions after the last kept row (`rf_eval.dropped_result`); request types
are `ridgefill`'s. A prompt whose every row is kept runs `hf`'s own code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry imports them only when empty)
import torch
from lm_eval.api.registry import register_model

from rf_eval.drop.arm_spec import DropArm
from rf_eval.errors import UserError
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
from rf_eval.rarecache.maps import TokenizerMismatch, check_tokenizers

OWN_KEYS = adapter_keys()["drop"]


@dataclass(frozen=True, kw_only=True)
class DropSettings(AdapterSettings):
    """The `drop` adapter's own model_args."""

    arm: DropArm
    source: str | None = None


def parse_drop_args(args: dict[str, Any]) -> tuple[DropSettings, dict[str, Any]]:
    """(settings, HFLM keyword arguments): the arm built and run once on models on the meta device (no
    weights: the filter layer, the budget's reach), the tokenizers compared, before anything loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mine, hf = take_model_args(args, OWN_KEYS, ("pretrained",), model="drop")
    remote = {k: hf[k] for k in ("trust_remote_code",) if hf.get(k) is not None}
    try:
        arm = DropArm.from_fields({k: v for k, v in mine.items() if k in DropArm.fields()}, what="model_args")
        source = mine.get("source")
        if ("source" in method_class(arm.method).keys) != (source is not None):  # the methods that load a speculator
            raise ModelArgsError(f"method={arm.method} " + ("needs source=<a speculator of the same tokenizer>"
                                                           if source is None else "reads no source= (specprefill's speculator)"))
        configs = [model_config(mine["pretrained"], hf)] + ([model_config(source, hf, checks_keys=False)] if source else [])
        if source:
            target_tok = hf.get("tokenizer") if isinstance(hf.get("tokenizer"), str) else mine["pretrained"]
            check_tokenizers(AutoTokenizer.from_pretrained(source, **remote),
                             AutoTokenizer.from_pretrained(target_tok, **remote))
        with torch.device("meta"):
            models = [AutoModelForCausalLM.from_config(c) for c in configs]
        parts = {"source": models[1]} if source else {}
        method_class(arm.method).build(models[0], None, arm, **parts)  # its rules for this model, before the weights
    except (UserError, TokenizerMismatch, ValueError) as err:
        raise ModelArgsError(f"drop: {err}") from err
    settings = DropSettings(pretrained=str(mine["pretrained"]), arm=arm, source=source,
                            reference=mine.get("reference"), seed=mine.get("seed"))
    return settings, hf


@register_model("drop")
class DropLM(PrefillLM):
    """`--model drop`: prompts prefilled by a dropper (`rf_eval.drop`); see the module docstring."""

    method_name = "drop"

    settings: DropSettings

    @classmethod
    def parse(cls, args: dict[str, Any]) -> tuple[DropSettings, dict[str, Any]]:
        return parse_drop_args(args)

    def speculator(self) -> list[Any]:
        """specprefill's speculator, loaded with the target's dtype onto its input device ([] for gemfilter)."""
        from transformers import AutoModelForCausalLM

        if self.settings.source is None:
            return []

        remote = bool(self._hf_args.get("trust_remote_code", False))
        with recording_missing_keys():
            model = AutoModelForCausalLM.from_pretrained(self.settings.source, dtype=self.model.dtype,
                                                         trust_remote_code=remote)
        check_loaded(model, FILL_OFF, "the speculator")
        return [model.to(self.input_device).eval()]

    def build_method(self) -> tuple[Any, Any]:
        self.speculators = self.speculator()
        method = self.dropper(self.settings.arm)
        return method, self.exact_method()

    def arm_with(self, fields: dict[str, Any]) -> DropArm:
        return self.settings.arm.updated(fields, what="rf_arm")

    def method_for(self, arm: DropArm) -> Any:
        if arm == self.settings.arm:
            return self.method
        return self.dropper(arm)

    def dropper(self, arm: DropArm) -> Any:
        """The dropper `arm.method` names (`rf_eval.methods`) over the loaded target (and speculator)."""
        parts = {"source": self.speculators[0]} if self.speculators else {}
        return method_class(arm.method).build(self.model, self.tokenizer, arm, **parts)

    def floor_split(self) -> int:
        """The engine floor of `reference=exact` runs is measured at half depth (a dropper has no split)."""
        return max(int(self.model.config.num_hidden_layers) // 2, 1)

    def arm_info(self) -> dict[str, Any]:
        return {**super().arm_info(), "source_path": self.settings.source}
