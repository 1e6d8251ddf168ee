"""`PrefillLM`: lm-eval's `hf` model with prompts prefilled by an approximate-prefill method.

A thin `HFLM` subclass, in the style of lm-eval's own `hf_steered.py`: HFLM
loads the model and tokenizer (every `hf` model_arg works as for `--model hf`:
`revision`, `dtype`, `parallelize`, `peft`, `enable_thinking`,
`chat_template_args`, ...), tokenizes, truncates, applies chat templates and
runs data parallel. This class overrides only the token-level requests
(`_loglikelihood_tokens`, `generate_until`) and adds two request types
(`token_logprobs`, `multiturn_generate`, in scoring.py and generation.py):
requests whose prompt has no filled row go to `super()` unchanged (bitwise
`hf`); the others are prefilled by the method (`rf_eval.method.PrefillMethod`)
and read by the stock model.

With `$RF_EVAL_LEDGER` naming a run ledger (`rf-eval ledger`), the head it
had when the run started (hash and entry count) is recorded in the results'
`config.rf_eval.ledger`.

A subclass names its own model_args (`own_keys`) and builds its method in
`build_method`; settings are checked in `parse` before any weights load.

Thinking off by default (RidgeFill paper, section 3.2 and appendix E: the
protocols run with thinking off): when the model's chat template has an
`enable_thinking` switch (Qwen3, Qwen3.5) and the run sets neither
`enable_thinking` nor `chat_template_args={"enable_thinking": ...}`, the
adapter renders chat prompts with enable_thinking=False. A value the user
gives wins; one the template cannot render (the same prompt with
enable_thinking True and False, or no chat template) is refused before the
weights load. The results record what was rendered
(`rf_eval.chat_template`: the switch, enable_thinking, the template's sha256
and a rendered example with its sha256). The rule is `rf_eval.chat`'s, which
`rf-eval serve` uses too, so served and adapter arms render alike.

The adapter publishes its run facts (`rf_eval.run_context`): the arm's tail
and the tokenizer's checkpoint, which the tasks read (`rf_eval.tasks.common`).

With `reference=exact` the adapter measures the engine floor once at start
(`measure_engine_floor`: the partial path with every row exact against the
stock model on a short probe prompt, RidgeFill paper sections 4.3 and 9) and
records it in the results as `rf_eval.engine_floor`, so every reported
difference from exact can be read against the engine's own rounding.
"""

from __future__ import annotations

import json
import logging
from typing import Any, ClassVar

import torch
from lm_eval.api.model import hash_args
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm

from rf_eval import run_context
from rf_eval.loading_report import recording_missing_keys
from rf_eval.method import input_device
from rf_eval.model_adapters.config import ModelArgsError, merge_lm_eval_flags
from rf_eval.model_adapters.generation import GenerationMixin
from rf_eval.model_adapters.item_costs import ItemCosts
from rf_eval.model_adapters.run_records import ChatRendering, ledger_head, measure_engine_floor
from rf_eval.model_adapters.scoring import ScoringMixin
from rf_eval.prefill_timer import FirstForward, timer_label
from rf_eval.ridgefill.api import RidgeFill
from rf_eval.version import __version__
from rf_eval.weights import weights_fingerprint

log = logging.getLogger(__name__)

ARM_KEY = "rf-eval:arm"  # where the adapter records its arm in a --use_cache database
#: `hf` keys that never change a result (left out of the --use_cache arm fingerprint)
_NOT_RESULTS = {"device", "batch_size", "max_batch_size", "parallelize", "device_map", "max_memory_per_gpu",
                "max_cpu_memory", "offload_folder"}


#: what the arm's fingerprint records of its inputs' contents, beside its settings (name in a warning)
_CONTENTS = {"weights": "weights", "weights_sha256": "weights", "maps_sha256": "maps", "maps_metadata": "maps",
             "source_weights_sha256": "weights"}


def stale_contents(stored: str, fingerprint: dict[str, Any]) -> list[str] | None:
    """What changed between a cache's recorded arm and this arm when only their inputs' contents differ
    (weights or maps changed in place: the cache is stale), else None (another arm's settings)."""
    try:
        old = json.loads(stored)
    except json.JSONDecodeError:
        return None
    if not isinstance(old, dict):
        return None
    new = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))

    def settings(fp: dict[str, Any]) -> dict[str, Any]:
        arm = {k: v for k, v in (fp.get("arm") or {}).items() if k not in _CONTENTS}
        return {**{k: v for k, v in fp.items() if k not in _CONTENTS}, "arm": arm}

    if settings(old) != settings(new):
        return None
    pairs = [(old, new), (old.get("arm") or {}, new.get("arm") or {})]
    return sorted({_CONTENTS[k] for a, b in pairs for k in _CONTENTS if a.get(k) != b.get(k)})


class PrefillLM(ScoringMixin, GenerationMixin, HFLM):
    """Shared by `--model ridgefill` and `--model rarecache`; see the module docstring."""

    method_name: ClassVar[str] = ""  # the lm-eval model name (`run_context` tells the tasks which adapter runs)

    def __init__(self, pretrained: str | None = None, **model_args: Any) -> None:
        settings, hf_args = self.parse({"pretrained": pretrained, **model_args})
        self.ledger_head = ledger_head()  # read (and verified) before the weights load
        ChatRendering.check_before_load(settings.pretrained, hf_args)  # a thinking setting no prompt can carry
        self.settings = settings
        self._hf_args = hf_args
        self.item_costs = ItemCosts()  # each prompt's prefill cost, for the tasks' samples
        self._plain_seconds: dict[int, float | None] = {}  # `hf`'s own prefills, by the hash of their tokens
        with recording_missing_keys():  # an arm that reads a tensor the checkpoint lacked is refused
            super().__init__(pretrained=settings.pretrained, backend="causal", **hf_args)
        self.chat = ChatRendering.for_run(hf_args, self.tokenizer)
        self.chat_template_args = self.chat.args  # what HFLM's apply_chat_template renders with
        if self.chat.thinking_default:
            self.enable_thinking = False
        self.method, self.exact = self.build_method()
        run_context.publish(self, self.run_facts())
        self.engine_floor = (measure_engine_floor(self.model, self.exact, self.floor_split(), self.max_length,
                                                  self.input_device)
                             if settings.reference == "exact" else None)

    # ---- what a subclass provides -------------------------------------------------
    @classmethod
    def parse(cls, args: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(settings, keyword arguments for HFLM), checked before any weights load."""
        raise NotImplementedError

    @classmethod
    def preflight(cls, args: dict[str, Any]) -> Any:
        """The arm of `args`, checked as far as can be before a study runs (`rf_eval.study.preflight`): a
        ModelArgsError or ArmError naming a bad value. The default is `parse`'s arm; an adapter whose parse
        reads files a study may only write later (RidgeFill's maps) checks without reading them."""
        return cls.parse(args)[0].arm

    def build_method(self) -> tuple[Any, Any]:
        """(the arm's method, the exact method) over `self.model`."""
        raise NotImplementedError

    def exact_method(self) -> RidgeFill:
        """The exact arm over `self.model` (the `reference=exact` pass and the engine floor's), for an adapter
        whose method has no exact arm of its own (RidgeFill's is `RidgeFill.reference`)."""
        return RidgeFill(self.model, self.tokenizer, fill="exact")

    def arm_with(self, fields: dict[str, Any]) -> Any:
        """The adapter's arm with `fields` applied and checked (an `ArmError` naming a bad one): the arm of a
        served request (`rf_eval.serving.arms`)."""
        raise NotImplementedError

    def method_for(self, arm: Any) -> Any:
        """The method of `arm` (one `arm_with` made) over this adapter's models; its own for its own arm."""
        raise NotImplementedError

    def arm_fields(self) -> tuple[str, ...]:
        """The fields `arm_with` takes: the arm spec's."""
        return type(self.settings.arm).fields()

    def arm_info(self) -> dict[str, Any]:
        return {**self.method.provenance(), "reference": self.settings.reference,
                "chat_template": self.chat.record()}

    def run_facts(self) -> dict[str, Any]:
        """What the tasks scoring this run read (`rf_eval.run_context`); a subclass adds its arm's tail."""
        tokenizer = self._hf_args.get("tokenizer")
        return {"adapter": self.method_name, "pretrained": self.settings.pretrained, "max_length": self.max_length,
                "tokenizer": tokenizer if isinstance(tokenizer, str) else self.settings.pretrained}

    def floor_split(self) -> int:
        """The split the engine floor is measured at: the arm's (at least 1: a fill from split states)."""
        plan = getattr(self.method, "plan", None)
        return max(int(getattr(plan, "split", 1)), 1)

    # ---- construction -------------------------------------------------------------
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls(**merge_lm_eval_flags(simple_parse_args_string(arg_string), additional_config))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        return cls(**merge_lm_eval_flags(arg_dict, additional_config))

    # ---- the engine path's helpers --------------------------------------------------
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

    # ---- cost records ---------------------------------------------------------------
    def plain_cost(self, prompt: list[int], seconds: float | None = None) -> Any:
        """The cost of a prompt the stock model prefilled (exact's; `seconds` where its prefill was timed)."""
        return self.method.prefill_cost(len(prompt)).timed(seconds)

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **kwargs: Any) -> torch.Tensor:
        """`hf`'s generate, with the prefill of a single prompt timed (`FirstForward`: hooks, the computation
        unchanged), kept by its tokens for `generate_until`'s cost records."""
        if context.shape[0] != 1:
            return super()._model_generate(context, max_length, stop, **kwargs)
        with FirstForward(self.model, self.input_device) as clock:
            out = super()._model_generate(context, max_length, stop, **kwargs)
        self._plain_seconds[hash(tuple(context[0].tolist()))] = clock.seconds
        return out

    # ---- lm-eval plumbing -----------------------------------------------------------
    def get_model_info(self) -> dict[str, Any]:
        """Recorded by lm-eval in the results JSON ("config"): `hf`'s, plus the arm (and its engine floor)."""
        info = {**self.arm_info(), "prefill_timer": timer_label(self.input_device)}
        if self.ledger_head is not None:  # `rf-eval report --ledger` / `ledger verify --expect-head` check it
            info = {**info, "ledger": self.ledger_head}
        if self.engine_floor is not None:
            info = {**info, "engine_floor": self.engine_floor}
        return {**super().get_model_info(), "rf_eval_version": __version__, "rf_eval": info}

    def set_cache_hook(self, cache_hook) -> None:
        """Refuse a --use_cache database written by another arm (its keys are request args only); empty one
        written by this arm on other weights or maps (`stale_contents`: refit in place), so it reruns."""
        super().set_cache_hook(cache_hook)
        db = cache_hook.dbdict
        if db is None:
            return
        self.item_costs.db = db
        fingerprint = self.arm_fingerprint()
        mine = json.dumps(fingerprint, sort_keys=True, default=str)
        stored = db.get(ARM_KEY)
        if stored is None and len(db) > 0:
            raise ModelArgsError("the --use_cache database holds results of another model; give this arm its own path")
        if stored is not None and stored != mine:
            changed = stale_contents(stored, fingerprint)
            if changed is None:
                raise ModelArgsError(
                    f"the --use_cache database holds results of another arm ({stored}); this arm is {mine}. "
                    "Give each arm its own --use_cache path."
                )
            log.warning("the --use_cache database %s holds this arm's results from other %s: its %d entries are "
                        "dropped and recomputed", getattr(db, "filename", ""), " and ".join(changed), len(db) - 1)
            db.clear()
            stored = None
        if stored is None:
            db[ARM_KEY] = mine
            db.commit()

    def arm_fingerprint(self) -> dict[str, Any]:
        hf = {k: v for k, v in self._hf_args.items() if k not in _NOT_RESULTS}

        # the weights themselves, not only their path: weights changed in place get a fresh cache
        return {"adapter": type(self).__name__, "pretrained": self.settings.pretrained, "hf": hf,
                "arm": self.arm_info(), "max_length": self.max_length, "weights": weights_fingerprint(self.model)}

    def _cached(self, attr: str, requests: list, compute) -> list:
        """Results of a custom request type, through the --use_cache database like lm-eval's own types."""
        db = self.cache_hook.dbdict
        out = []
        for req in tqdm(requests, desc=f"Running {attr} requests", disable=self.rank != 0):
            sampled = _samples(req.args)
            key = hash_args(attr, req.args) if db is not None and not sampled else None
            if key is not None and key in db:
                out.append(db[key])
                continue
            res = compute(*req.args)
            self.cache_hook.add_partial(attr, req.args, res)
            out.append(res)
        return out


def _samples(args: tuple) -> bool:
    """True for requests that sample (lm-eval does not cache those)."""
    kwargs = args[-1] if args else None
    items = kwargs if isinstance(kwargs, list) else [kwargs]
    return any(isinstance(k, dict) and k.get("do_sample") for k in items)
