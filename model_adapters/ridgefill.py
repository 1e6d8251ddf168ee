"""lm-eval model `ridgefill`: every prompt is prefilled by the RidgeFill engine.

    lm_eval --model ridgefill \\
        --model_args pretrained=PATH,fill=ridge,maps=MAPS_DIR,tail=4096[,split=S][,reference=exact] \\
        --tasks ...

Everything after the prompt is the stock `transformers` model reading the
engine's cache (continuation tokens, generated tokens, later turns are never
filled), so a run differs from lm-eval's `hf` model in nothing but the prefill.
The adapter is lm-eval's `hf` model (an `HFLM` subclass: every `hf` model_arg
works as for `--model hf`, e.g. revision, dtype, parallelize, device_map, peft,
enable_thinking, chat_template_args, think_end_token). Requests whose prompt
has no filled rows (fill=exact, or a prompt no longer than the tail) are run by
`hf`'s own code, batched as `hf` batches them: the exact arm is `hf`, bitwise,
at any batch size.

model_args of the arm (a `rf_eval.ridgefill.arm_spec.RidgeFillArm`, checked with the maps
against the model's config before the weights load; a key that looks like a
typo of a known one is refused):
  pretrained   HF folder or hub id; `demo` or absent: the embedded demo model (rf_eval.demo.study)
  fill         exact (the fill off) or a fill method (`rf-eval fills` lists them; required, except
               with the demo model, where it defaults to ridge with the demo's own maps, fitted on first use)
  maps     folder or file of fitted maps (required for a fill method that reads maps: ridge)
  split    first filled layer (default: the maps' split, else L/2)
  tail     last prompt rows kept exact (default 4096, the paper's; the demo model: 512)
  chunk_size  lower layers run in chunks of this many rows (memory)
  map_split   false (default): layer S's filled rows read x_S (exact); true (the paper's released
              maps and MAC accounting): they read A_S x_S + b_S
  reference   `exact`: also run the exact arm on the same inputs (see token_logprobs,
              multiturn_generate); other request types ignore it
  selector, corrections, splice, cost_match, unigram
              the engine's parts, as one-line arm strings (rf_eval.arm_string; no commas, so they fit
              model_args): selector=attention(share=0.1), selector=random(seed=3;of=attention),
              corrections=value_rescale(c=512)+terminal_state(path=F), splice=keys|values|both,
              cost_match=ridge(tail=4096;exact_share=0.1) (fill=nofill). Rows are chosen once per
              prompt; continuation tokens and later turns never choose rows.
  seed        sampled generation draws from a torch seed made of (seed, prompt tokens), per
              request, so arms and resumed runs sample the same stream (without it: lm-eval's
              --seed, one stream for the run, as `hf`)
  every other key: as for `hf` (batch_size batches `hf`'s plain requests and the
              continuations of one engine-prefilled prompt; prompts with filled rows are
              prefilled one at a time, the engine takes 1 x N)

Request types: loglikelihood, loglikelihood_rolling and generate_until as `hf`
(the engine prefills each distinct context once; continuation and generated
tokens are the stock model's). loglikelihood_rolling scores nearly every token
exactly (continuation tokens are never filled): use token_logprobs to measure
loss over a filled prompt. The custom types `token_logprobs` and
`multiturn_generate` document their formats on their methods (scoring.py,
generation.py).

Results of every request type are written to lm-eval's --use_cache database as
they finish (custom types included, except sampled generations), so a killed
run resumes. The cache keys on request arguments only (lm-eval's design): the
adapter stores its arm in the database and refuses a database written by
another arm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: its registry imports them only when empty)
from lm_eval.api.registry import register_model

from rf_eval.demo.study import demo_defaults, demo_task_defaults
from rf_eval.fields import ArmError
from rf_eval.model_adapters.config import (
    AdapterSettings,
    ModelArgsError,
    adapter_keys,
    model_config,
    take_model_args,
)
from rf_eval.model_adapters.prefill_lm import PrefillLM
from rf_eval.ridge.maps import MapError, load_arm_maps
from rf_eval.ridgefill.api import RidgeFill
from rf_eval.ridgefill.arm_spec import RidgeFillArm

OWN_KEYS = adapter_keys()["ridgefill"]


@dataclass(frozen=True, kw_only=True)
class RidgeFillSettings(AdapterSettings):
    """The `ridgefill` adapter's own model_args, resolved against the model's config."""

    arm: RidgeFillArm
    maps: str | None = None
    maps_obj: Any = None  # the loaded RidgeMaps (read once, before the weights)
    demo: bool = False  # the embedded demo model (no pretrained, or pretrained=demo)


def parse_ridgefill_args(args: dict[str, Any]) -> tuple[RidgeFillSettings, dict[str, Any]]:
    """(settings, HFLM keyword arguments) from `--model_args`; every check that needs no weights."""
    demo = str(args.get("pretrained") or "demo").strip().lower() == "demo"
    mine, hf = take_model_args(args, OWN_KEYS, RidgeFillArm.required(args), defaults=demo_defaults, model="ridgefill")
    try:
        arm = RidgeFillArm.from_fields({k: v for k, v in mine.items() if k in RidgeFillArm.fields()},
                                       what="model_args")
        maps = load_arm_maps(mine["maps"], arm.split) if mine.get("maps") is not None else None
        arm = arm.resolve(model_config(mine["pretrained"], hf), maps)
        settings = RidgeFillSettings(pretrained=str(mine["pretrained"]), arm=arm, maps=mine.get("maps"),
                                     maps_obj=maps, reference=mine.get("reference"), seed=_int(mine.get("seed")),
                                     demo=demo)
    except (ArmError, MapError) as err:
        raise ModelArgsError(f"{'maps=' + repr(mine['maps']) + ': ' if isinstance(err, MapError) else ''}{err}") from err
    return settings, hf


def _int(value: Any, key: str = "seed") -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        raise ModelArgsError(f"{key}={value!r} is not an integer") from None


@register_model("ridgefill")
class RidgeFillLM(PrefillLM):
    """`--model ridgefill`: prompts prefilled by `rf_eval.RidgeFill`; see the module docstring."""

    method_name = "ridgefill"

    settings: RidgeFillSettings

    @classmethod
    def parse(cls, args: dict[str, Any]) -> tuple[RidgeFillSettings, dict[str, Any]]:
        return parse_ridgefill_args(args)

    @classmethod
    def preflight(cls, args: dict[str, Any]) -> RidgeFillArm:
        """The keys and the arm, without reading the maps (a study's `fit:` block writes them later)."""
        mine, _ = take_model_args(args, OWN_KEYS, RidgeFillArm.required(args), model="ridgefill")
        return RidgeFillArm.from_fields({k: v for k, v in mine.items() if k in RidgeFillArm.fields()}, what="args")

    def build_method(self) -> tuple[Any, Any]:
        s = self.settings
        try:  # the maps' weights fingerprint can only be checked now, with the weights loaded
            method = RidgeFill(self.model, self.tokenizer, arm=s.arm, maps=s.maps_obj)
        except MapError as err:
            raise ModelArgsError(f"maps={s.maps!r}: {err}") from err
        return method, method.reference()  # the exact pass: the same model and arm, the fill off

    def arm_with(self, fields: dict[str, Any]) -> RidgeFillArm:
        return self.settings.arm.updated(fields, self.model.config, self.settings.maps_obj, what="rf_arm")

    def method_for(self, arm: RidgeFillArm) -> Any:
        if arm == self.settings.arm:
            return self.method
        return RidgeFill(self.model, self.tokenizer, arm=arm, maps=self.settings.maps_obj)

    def run_facts(self) -> dict[str, Any]:
        """The base facts plus the arm's tail (the filled region's edge) and, for the embedded
        demo model, the task lengths its context fits."""
        facts = {**super().run_facts(), "tail": self.settings.arm.tail, "fills_rows": self.settings.arm.fills_rows}
        if self.settings.demo:
            facts["task_defaults"] = demo_task_defaults()
        return facts

    def arm_info(self) -> dict[str, Any]:
        """The method's provenance (fill, split, tail, selector, corrections, splice, cost_match, maps sha256
        and fit metadata) plus the adapter's own settings."""
        return {**super().arm_info(), "maps_path": self.settings.maps}
