"""`PrefillLM`: lm-eval's `hf` model with prompts prefilled by a prefill method, the one adapter of every method.

    lm_eval --model prefill --model_args pretrained=MODEL,method=NAME[,<the method's arm fields>]

lm-eval's names `ridgefill`, `rarecache`, `drop` and `prefill` are this one
class with a default method (`rf_eval.methods.MODELS`: ridgefill, rarecache,
gemfilter, none), so `--model ridgefill --model_args fill=ridge,...` and
`--model prefill --model_args method=ridgefill,fill=ridge,...` are one run.

A thin `HFLM` subclass, in the style of lm-eval's own `hf_steered.py`: HFLM
loads the model and tokenizer (every `hf` model_arg works as for `--model hf`:
`revision`, `dtype`, `parallelize`, `peft`, `enable_thinking`,
`chat_template_args`, ...), tokenizes, truncates, applies chat templates and
runs data parallel. This class overrides only the token-level requests
(`_loglikelihood_tokens`, `generate_until`) and adds two request types
(`token_logprobs`, `multiturn_generate`, in scoring.py and generation.py):
requests whose prompt is plain go to `super()` unchanged (bitwise `hf`); the
others are prefilled by the method (`rf_eval.methods.base.Method`) and read by
the stock model.

model_args (`rf_eval.model_adapters.config.parse_model_args`: unknown, missing
or contradictory keys fail before any weights load):
  pretrained   HF folder or hub id; `demo` or absent: the embedded demo model
  method       the prefill method (`rf-eval methods` lists them and their arm fields)
  <loads>      what the method reads beside the model (RidgeFill's `maps`, RaReCache's `source` and `maps`)
  <arm fields> the method's settings
  reference    `exact`: also run the exact method on the same inputs (token_logprobs, multiturn_generate)
               and record the engine floor (the partial path with every row exact against the stock model,
               RidgeFill paper sections 4.3 and 9) as `rf_eval.engine_floor`
  paired_timing `false`: no exact prefill timed beside each scored prompt's (on by default with reference=exact)
  seed         sampled generation draws from a torch seed made of (seed, prompt tokens), per request
  name         the arm's name in reports (a label)
  every other key: as for lm-eval's `hf` model

Thinking off by default (RidgeFill paper, section 3.2 and appendix E): where
the chat template has an `enable_thinking` switch and the run sets neither
`enable_thinking` nor `chat_template_args`, prompts render with
enable_thinking=False (`rf_eval.chat`; `rf-eval serve` renders alike).

The adapter publishes its run facts (`rf_eval.run_context`): the arm's tail and
the tokenizer's checkpoint, which the tasks read. With `$RF_EVAL_LEDGER` naming
a run ledger (`rf-eval ledger`), the head it had when the run started is
recorded in `config.rf_eval.ledger`. Results of every request type go to
lm-eval's --use_cache database as they finish (`request_cache`).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from lm_eval.models.huggingface import HFLM

from rf_eval.demo.study import demo_tail, demo_task_defaults
from rf_eval.devices import input_device
from rf_eval.fields import ArmError
from rf_eval.fills.loading_report import recording_missing_keys
from rf_eval.harness import run_context
from rf_eval.methods.exact import Exact
from rf_eval.model_adapters.config import ModelArgsError, RunSettings, merge_lm_eval_flags, parse_model_args
from rf_eval.model_adapters.generation import GenerationMixin
from rf_eval.model_adapters.item_costs import ItemCosts
from rf_eval.model_adapters.request_cache import RequestCacheMixin
from rf_eval.model_adapters.run_records import ChatRendering, ledger_head, measure_engine_floor
from rf_eval.model_adapters.scoring import ScoringMixin
from rf_eval.prefill_timer import FirstForward, timer_label
from rf_eval.ridge.maps import MapError
from rf_eval.tasks.data_needs import check_filled_region
from rf_eval.version import __version__

log = logging.getLogger(__name__)


class PrefillLM(RequestCacheMixin, ScoringMixin, GenerationMixin, HFLM):
    """Every rf-eval lm-eval model; see the module docstring."""

    def __init__(self, pretrained: str | None = None, *, model_name: str = "prefill", **model_args: Any) -> None:
        settings, hf_args = parse_model_args({"pretrained": pretrained, **model_args}, model_name)
        expected = run_context.expected()
        if expected is not None:  # tasks its arm cannot score, refused before the weights load
            check_filled_region(*expected, self.settings_facts(settings))
        self.ledger_head = ledger_head()  # read (and verified) before the weights load
        ChatRendering.check_before_load(settings.pretrained, hf_args)  # a thinking setting no prompt can carry
        self.settings, self._hf_args = settings, hf_args
        self.item_costs = ItemCosts()  # each prompt's prefill cost, for the tasks' samples
        self._plain_seconds: dict[int, float | None] = {}  # `hf`'s own prefills, by the hash of their tokens
        with recording_missing_keys():  # an arm that reads a tensor the checkpoint lacked is refused
            super().__init__(pretrained=settings.pretrained, backend="causal", **hf_args)
        self.chat = ChatRendering.for_run(hf_args, self.tokenizer)
        self.chat_template_args = self.chat.args  # what HFLM's apply_chat_template renders with
        if self.chat.thinking_default:
            self.enable_thinking = False
        self.method = self.build_method(settings)
        self.exact = Exact(self.model, self.tokenizer)  # the `reference=exact` pass, over the same weights
        facts, me = self.run_facts(), weakref.ref(self)
        run_context.publish(self, facts)
        self.item_costs.publish = lambda: run_context.publish(me(), facts)
        self.engine_floor = (measure_engine_floor(self.model, self.exact, self.method.floor_split(), self.max_length,
                                                  self.input_device)
                             if settings.reference == "exact" else None)

    def build_method(self, settings: RunSettings) -> Any:
        """The arm's method over the loaded model, with what it loads beside it (`Method.load`)."""
        cls = settings.method
        try:
            parts = {**settings.parts, **cls.load(settings.arm, settings.source, self.model)}
            return cls(self.model, self.tokenizer, settings.arm, **parts)
        except MapError as err:  # maps fitted on other weights: the one rule that needs them loaded
            raise ModelArgsError(f"maps={settings.source.files.get('maps')!r}: {err}") from err
        except ArmError as err:
            raise ModelArgsError(f"method={cls.name}: {err}") from err

    # ---- construction: lm-eval's names of this class ------------------------------------
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None,
                               model_name: str = "prefill") -> PrefillLM:
        from lm_eval.utils import simple_parse_args_string

        return cls(model_name=model_name, **merge_lm_eval_flags(simple_parse_args_string(arg_string),
                                                                additional_config))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None,
                            model_name: str = "prefill") -> PrefillLM:
        return cls(model_name=model_name, **merge_lm_eval_flags(arg_dict, additional_config))

    # ---- a served request's arm (`rf_eval.serving`) -----------------------------------------
    def arm_fields(self) -> tuple[str, ...]:
        """The fields a served request's arm may set: the method's arm's."""
        return type(self.method).arm_fields()

    def arm_with(self, fields: dict[str, Any]) -> Any:
        """The arm with `fields` applied and checked (an `ArmError` naming a bad one)."""
        return self.method.updated_arm(fields)

    def method_for(self, arm: Any) -> Any:
        """The method of `arm` (one `arm_with` made) over this adapter's model and parts."""
        return self.method.rebuilt(arm)

    # ---- what the run records ---------------------------------------------------------------
    def arm_info(self) -> dict[str, Any]:
        """The method's provenance, the files it read, the reference and the chat rendering."""
        files = {f"{key}_path": self.settings.source.files.get(key) for key in type(self.method).loads}
        return {**self.method.provenance(), **files, "reference": self.settings.reference,
                "chat_template": self.chat.record()}

    @staticmethod
    def settings_facts(settings: RunSettings) -> dict[str, Any]:
        """The run's facts its settings decide (`rf_eval.harness.run_context`), known before the weights load:
        the arm's tail, and the embedded demo model's defaults (lengths, tail, the `demo` alias) on it."""
        facts = {"adapter": settings.method.name, "pretrained": settings.pretrained,
                 **settings.method.run_facts(settings.arm)}
        if settings.demo:
            facts.update(task_defaults=demo_task_defaults(), default_tail=demo_tail(), pretrained_alias="demo")
        return facts

    def run_facts(self) -> dict[str, Any]:
        """What the tasks scoring this run read (`rf_eval.run_context`)."""
        tokenizer = self._hf_args.get("tokenizer")
        return {**self.settings_facts(self.settings), "max_length": self.max_length,
                "tokenizer": tokenizer if isinstance(tokenizer, str) else self.settings.pretrained}

    def get_model_info(self) -> dict[str, Any]:
        """Recorded by lm-eval in the results JSON ("config"): `hf`'s, plus the arm (and its engine floor)."""
        info = {**self.arm_info(), "prefill_timer": timer_label(self.input_device)}
        if self.ledger_head is not None:  # `rf-eval report --ledger` / `ledger verify --expect-head` check it
            info = {**info, "ledger": self.ledger_head}
        if self.engine_floor is not None:
            info = {**info, "engine_floor": self.engine_floor}
        return {**super().get_model_info(), "rf_eval_version": __version__, "rf_eval": info}

    # ---- the engine path's helpers --------------------------------------------------------
    @property
    def input_device(self) -> torch.device:
        """Where prompt ids go (also for a model placed across devices or offloaded by accelerate)."""
        return input_device(self.model)

    @property
    def continuation_batch(self) -> int:
        """batch_size as a number for the engine path ('auto' means 1: prompts are prefilled one at a time)."""
        return self.batch_size if isinstance(self.batch_size, int) else 1

    def ids_tensor(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], device=self.input_device)

    def plain_cost(self, plan: Any, seconds: float | None = None) -> Any:
        """The cost of a prompt the stock model prefilled (`plan`: its plain plan; `seconds` where timed)."""
        return self.method.prefill_cost(plan.n, plan=plan).timed(seconds)

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **kwargs: Any) -> torch.Tensor:
        """`hf`'s generate, with the prefill of a single prompt timed (`FirstForward`: hooks, the computation
        unchanged), kept by its tokens for `generate_until`'s cost records."""
        if context.shape[0] != 1:
            return super()._model_generate(context, max_length, stop, **kwargs)
        with FirstForward(self.model, self.input_device) as clock:
            out = super()._model_generate(context, max_length, stop, **kwargs)
        self._plain_seconds[hash(tuple(context[0].tolist()))] = clock.seconds
        return out


@dataclass(frozen=True)
class ModelName:
    """One of lm-eval's names of `PrefillLM` (`--model ridgefill`): the class with a default method.

    lm-eval builds a model with `create_from_arg_string` (or `_obj`) of what its registry holds under the
    name; this object builds a `PrefillLM` that runs `MODELS[name]` when model_args name no method."""

    name: str
    #: the class every name builds
    lm_class = PrefillLM

    def create_from_arg_string(self, arg_string: str, additional_config: dict | None = None) -> PrefillLM:
        return PrefillLM.create_from_arg_string(arg_string, additional_config, model_name=self.name)

    def create_from_arg_obj(self, arg_dict: dict, additional_config: dict | None = None) -> PrefillLM:
        return PrefillLM.create_from_arg_obj(arg_dict, additional_config, model_name=self.name)

    def __call__(self, *args: Any, **model_args: Any) -> PrefillLM:
        return PrefillLM(*args, model_name=self.name, **model_args)


#: what lm-eval's registry holds under each name (`rf_eval.model_adapters.startup.MODELS`, pyproject's entry
#: points): `PrefillLM`, running `rf_eval.methods.MODELS[name]` where model_args name no method
ridgefill = ModelName("ridgefill")
rarecache = ModelName("rarecache")
drop = ModelName("drop")
prefill = ModelName("prefill")
