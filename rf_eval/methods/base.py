"""`Method`: the one base every prefill method subclasses, built in or a plug-in (one file, found by name).

A method replaces how a prompt is prefilled; after the prompt everything is
the stock model reading the cache it wrote. One class says all of it:

- `name`: its `method=` value and its name in results;
- `Arm`: the frozen dataclass of its settings, parsed once (`parse_arm`) from
  model_args, CLI flags, a served request or Python keywords;
- `loads`: the model_args naming what it reads beside the model (files such as
  maps; `second_model`, the one naming a second model of the target's
  tokenizer: a source, a speculator), each required unless `required_loads`
  says otherwise;
- `budget_knob`: what `budget=` turns, `budget_sets`: the arm fields it sets
  in their place; whether an arm takes a budget is `budget_refusal`'s rule;
- before any weights load, `prepare(arm, source)`: the arm checked against the
  model's config and tokenizer, and what it reads then (maps), as parts; after
  them, `load(arm, source, model)`: what it loads beside the model (the second
  model); then `cls(model, tokenizer, arm, **parts)`;
- per prompt, `plan(n)`: the one decision of what an n-token prompt runs (a
  `PromptPlan`: plain or not, and the method's own setting for it), which
  `prefill`, `prefill_cost` and the shells read as a value; `prefill`: the
  cache of a 1 x N prompt and its last row's logits; `prefill_cost`: its
  multiply-accumulates and cache rows against exact prefill; `provenance`:
  what results record of the arm.

A plug-in defines `Arm`, `prefill`, `prefill_cost` and `is_plain(n)` (or
`plan(n)`); the rest (generation, batches, the extension after the prompt, a
served request's arm, the weights fingerprint) is shared here. The shells
(`rf_eval.model_adapters.prefill_lm.PrefillLM`, `rf-eval serve`, the study
runner) read a method through this class only.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.devices import default_device, input_device, parse_dtype
from rf_eval.engine import PrefillResult
from rf_eval.fields import ArmError
from rf_eval.fields import build as build_dataclass
from rf_eval.fills.loading_report import recording_missing_keys
from rf_eval.integrity.weights import weights_fingerprint
from rf_eval.methods import requests
from rf_eval.methods.dropped import extend_after
from rf_eval.methods.source import ModelSource

__all__ = ["Method", "ModelSource", "NoSettings", "PromptPlan", "MapsSplit"]


@dataclass(frozen=True)
class NoSettings:
    """The arm of a method that takes no settings."""


@dataclass(frozen=True)
class PromptPlan:
    """What an n-token prompt runs under one method's arm, decided once per prompt (`Method.plan`) and passed
    on as a value to its prefill, its cost and the shells.

    `plain`: the stock model's prefill, bitwise (no row filled, dropped or mapped). `exact_tail`: how many of
    the last rows run the stock model in every layer whatever the prompt (so a prefill may hold back all but
    one of them). `setting`: the method's own decision for this length (RidgeFill's engine plan, a dropper's
    kept rows, RaReCache's recomputed rows). `knob_value`: the value a budget set its knob to (None without
    a budget)."""

    n: int
    plain: bool
    exact_tail: int = 0
    setting: Any = None
    knob_value: Any = None


#: the split of maps not read yet, given the arm's own split (None where nothing says): a study's preview
MapsSplit = Any


class Method:
    """A prefill method: its declaration and the shared protocol (see the module docstring)."""

    name: ClassVar[str] = ""
    Arm: ClassVar[type] = NoSettings
    loads: ClassVar[tuple[str, ...]] = ()
    second_model: ClassVar[str | None] = None
    budget_sets: ClassVar[tuple[str, ...]] = ()
    #: what `budget=` turns per prompt length to spend its share of exact's MACs (`rf_eval.cost.budget`), in words
    budget_knob: ClassVar[str] = ""

    # -- the arm --------------------------------------------------------------------------------
    @classmethod
    def arm_fields(cls) -> tuple[str, ...]:
        """The model_args keys of the method's arm."""
        return tuple(f.name for f in dataclasses.fields(cls.Arm) if f.init)

    @classmethod
    def parse_arm(cls, values: Mapping[str, Any], *, what: str = "model_args") -> Any:
        """The arm of `values` (strings as model_args give them, or typed values), checked: an `ArmError`
        naming a bad key or value."""
        return build_dataclass(cls.Arm, values, what=what)

    @classmethod
    def alias(cls, args: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """(another method's name, its model_args) where `args` of this method name another method (RidgeFill's
        `preset=fastkv` is the method `fastkv`), else None."""
        return None

    @classmethod
    def missing_fields(cls, fields: Mapping[str, Any]) -> dict[str, str]:
        """The fields an arm must name and `fields` lacks, each with the values it takes (a study file that
        leaves one out is refused as it is read); none by default."""
        return {}

    @classmethod
    def budget_refusal(cls, arm: Any) -> str | None:
        """Why `arm` (given no budget of its own) cannot take one, else None: the one rule for "does this arm
        take a budget" (a study's `budgets:`). A method whose arm has no `budget` field takes none."""
        if "budget" not in cls.arm_fields():
            return f"method={cls.name} takes no budget"
        return None

    def updated_arm(self, fields: Mapping[str, Any], *, what: str = "rf_arm") -> Any:
        """This method's arm with `fields` applied and checked (a served request's arm): a field that a
        budget sets, or `budget`, replaces the other."""
        current = {f.name: getattr(self.arm, f.name) for f in dataclasses.fields(self.arm) if f.init}
        if fields.get("budget") is not None:
            current = {k: v for k, v in current.items() if k not in self.budget_sets}
        if any(fields.get(k) is not None for k in self.budget_sets):
            current.pop("budget", None)
        return self.parse_arm({**{k: v for k, v in current.items() if v is not None}, **fields}, what=what)

    # -- before and after the weights load ---------------------------------------------------------
    @classmethod
    def required_loads(cls, arm: Any) -> tuple[str, ...]:
        """The `loads` keys `arm` cannot run without (all of them, unless the method says)."""
        return cls.loads

    @classmethod
    def check_loads(cls, arm: Any, source: ModelSource) -> Any:
        """Refuse a missing `loads` key (`required_loads`); the second model's config, checked (it loads, and
        its tokenizer is the target's, token for token), else None."""
        missing = [k for k in cls.required_loads(arm) if not source.files.get(k)]
        if missing:
            raise ArmError(f"method={cls.name} needs {', '.join(f'{k}=' for k in missing)} "
                           f"({cls.describe_loads()})")
        if cls.second_model is None or not source.files.get(cls.second_model):
            return None
        return requests.check_second_model(source, cls.second_model, cls.name)

    @classmethod
    def prepare(cls, arm: Any, source: ModelSource) -> tuple[Any, dict[str, Any]]:
        """(the arm as it runs on this model, the parts read before the weights): every check that needs the
        model's config and tokenizer but no weights (`check_loads` by default)."""
        cls.check_loads(arm, source)
        return arm, {}

    @classmethod
    def describe_loads(cls) -> str:
        """What the method's `loads` keys name, for messages (`rf-eval methods`)."""
        return ", ".join(f"{k}: {'a second model of the same tokenizer' if k == cls.second_model else 'a path'}"
                         for k in cls.loads) or "nothing beside the model"

    @classmethod
    def load(cls, arm: Any, source: ModelSource, model: Any) -> dict[str, Any]:
        """What the method loads beside `model` once its weights are in: the second model, with the model's
        dtype on its input device."""
        given = source.files.get(cls.second_model) if cls.second_model else None
        if given is None:
            return {}
        if not isinstance(given, (str, os.PathLike)):  # loaded already (the Python API)
            return {cls.second_model: given}
        return {cls.second_model: requests.load_second_model(str(given), model, source.remote, cls.second_model)}

    def __init__(self, model: Any, tokenizer: Any = None, arm: Any = None, **given: Any) -> None:
        """The method of `arm` over a loaded model (or of the arm's fields given as keywords); `given` also
        holds the parts its `loads` name (a second model, maps)."""
        fields = {k: given.pop(k) for k in list(given) if k in self.arm_fields() and k not in self.loads}
        unknown = [k for k in given if k not in self.loads]
        if unknown:
            raise ArmError(f"{', '.join(unknown)} is not a setting of method={self.name}; its arm's fields: "
                           f"{', '.join(self.arm_fields())}; what it loads: {', '.join(self.loads) or 'nothing'}")
        if arm is None:
            arm = self.parse_arm(fields, what=type(self).__name__)
        elif fields:
            raise TypeError(f"give arm= or the arm's fields, not both (got {', '.join(fields)})")
        self.model, self.tokenizer, self.arm, self.parts = model.eval(), tokenizer, arm, given

    @classmethod
    def from_pretrained(cls, pretrained: str, *, device: str | None = None, dtype: Any = None,
                        trust_remote_code: bool = False, device_map: Any = None, offload_folder: str | None = None,
                        **given: Any) -> Method:
        """The Python API: a checkpoint loaded with the method of the arm `given` names (its fields, and what its
        `loads` name: a path, or the object itself), every check that needs no weights made before they load
        (`prepare`). `device_map` (with `offload_folder` for "disk" entries): `transformers`' big-model
        dispatch; `device` then only picks the dtype "auto" means."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        loads = {k: v for k in cls.loads if (v := given.pop(k, None)) is not None}
        arm = cls.parse_arm(given, what=cls.__name__)
        remote = {"trust_remote_code": True} if trust_remote_code else {}
        source = ModelSource(str(pretrained), AutoConfig.from_pretrained(pretrained, **remote), str(pretrained),
                             remote, loads)
        arm, parts = cls.prepare(arm, source)
        device = device or default_device()
        placement = {} if device_map is None else {"device_map": device_map, **(
            {"offload_folder": str(offload_folder)} if offload_folder is not None else {})}
        with recording_missing_keys():  # `__init__` refuses an arm that reads a tensor the checkpoint lacked
            model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=parse_dtype(dtype, device),
                                                         **remote, **placement)
        if device_map is None:
            model = model.to(device)
        tokenizer = AutoTokenizer.from_pretrained(pretrained, **remote)
        return cls(model, tokenizer, arm, **{**parts, **cls.load(arm, source, model)})

    def rebuilt(self, arm: Any) -> Method:
        """This method with another arm over the same model and parts (a served request's arm)."""
        return self if arm == self.arm else type(self)(self.model, self.tokenizer, arm, **self.parts)

    # -- per prompt ------------------------------------------------------------------------------
    def plan(self, n: int) -> PromptPlan:
        """What an n-token prompt runs (see `PromptPlan`); the default asks `is_plain` once."""
        plain = self.is_plain(n)
        return PromptPlan(n, plain, n if plain else 0)

    def is_plain(self, n: int) -> bool:
        """Whether an n-token prompt runs the stock model's prefill (bitwise)."""
        if type(self).plan is Method.plan:
            raise NotImplementedError(f"method {self.name!r} defines neither plan nor is_plain")
        return self.plan(n).plain

    @property
    def device(self) -> torch.device:
        return input_device(self.model)

    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0,
                plan: PromptPlan | None = None) -> PrefillResult:
        """The cache of a 1 x N prompt and its last row's logits. `for_generation`: `input_ids` is a prompt
        minus its last token, which `generate` runs; `held_back` (k < the plan's `exact_tail`): the prompt
        minus its last k tokens, which the caller runs with `extend`. `plan`: the whole prompt's, where the
        caller decided it."""
        raise NotImplementedError

    def prefill_batch(self, input_ids: torch.Tensor, *, for_generation: bool = False,
                      plan: PromptPlan | None = None) -> list[PrefillResult]:
        """`prefill` of each row of a B x N batch of prompts of one length (one engine call where the
        method's rows are the same for every prompt; one prefill each by default)."""
        return [self.prefill(row[None], for_generation=for_generation, plan=plan) for row in input_ids]

    def prefills_together(self, n: int) -> bool:
        """Whether a batch's n-token prompts share one forward (`prefill_batch`'s engine call, or the stock
        model's for plain prompts) rather than prefill one after another: what a load test compares."""
        return self.plan(n).plain

    def prefill_cost(self, n: int, result: PrefillResult | None = None, plan: PromptPlan | None = None
                     ) -> PrefillCost:
        """What prefilling an n-token prompt cost against exact prefill (`rf_eval.cost.prefill_cost`), at the
        rows `result` ran; exact's for a plain prompt. `plan`: the prompt's, where the caller has it."""
        raise NotImplementedError

    def speedup_ceilings(self, n: int, plan: PromptPlan | None = None) -> dict[str, float]:
        """The method's compute-bound speedup ceilings on an n-token prompt, by name (1.0 for a plain one)."""
        return {"mac_ceiling": self.prefill_cost(n, plan=plan).mac_speedup}

    def extend(self, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
        """The stock model over `tokens` (1 x k) after the prompt (after a dropper's kept rows): their logits."""
        with self.forward_context():
            return extend_after(self.model, result, tokens.to(self.device))

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """`model.generate` (its own keyword arguments) over the method's cache of the prompt."""
        return requests.generate(self, input_ids, **kwargs)

    def forward_context(self) -> AbstractContextManager:
        """The context a request runs the model in for this method, entered once around the whole request
        (re-entrant: the method's own entry points find it open). See `requests.ForwardContext`."""
        return requests.ForwardContext(self)

    #: the fill whose forward replaced the model's own (`rf_eval.fills.base.ReplacedForward`), where this
    #: method's arm runs it: the forward context pauses any other
    forward_fill: ClassVar[str | None] = None

    # -- what results record -------------------------------------------------------------------
    @functools.cached_property
    def weights_sha256(self) -> str:
        """The model's weights fingerprint (`rf_eval.integrity.weights`), read when first recorded."""
        return weights_fingerprint(self.model)

    def provenance(self) -> dict[str, Any]:
        """The method's name, its arm's settings and the model's identity (`requests.model_identity`)."""
        settings = {f.name: getattr(self.arm, f.name) for f in dataclasses.fields(self.arm)}
        return {"method": self.name, **settings, **requests.model_identity(self.model, self.weights_sha256)}

    @classmethod
    def run_facts(cls, arm: Any) -> dict[str, Any]:
        """What the tasks scoring a run of `arm` read beside the run's own facts (`rf_eval.run_context`): the
        arm's exact tail (the filled region's edge), where it has one. Read from the arm alone, so that the
        adapter can check the tasks against it before the weights load."""
        return {}

    def floor_split(self) -> int:
        """The split the engine floor of a `reference=exact` run is measured at: half the depth (a fill's
        own split where it has one)."""
        return max(int(self.model.config.num_hidden_layers) // 2, 1)

    # -- a study's preview, before anything loads ------------------------------------------------
    @classmethod
    def reads_study_maps(cls, model_args: Mapping[str, Any]) -> bool:
        """Whether an arm with `model_args`, naming no `maps`, reads the study's maps."""
        return False

    @classmethod
    def preview_costs(cls, config: Any, arm: Any, lengths: Sequence[int], *,
                      maps_split: MapsSplit) -> dict[int, tuple[float, str | None]]:
        """`rf-eval study plan`'s preview of an arm: at each length, its MAC cost relative to exact prefill and
        what its budget sets there ("tail 812"). The default previews nothing: the run costs each item."""
        return {}

    @classmethod
    def check_budget(cls, model_args: Mapping[str, Any], arm: Any, lengths: Sequence[int] | None, *,
                     maps_split: MapsSplit) -> None:
        """Refuse, before a study runs, a budget the arm cannot meet at one of `lengths` (a `BudgetError`): by
        default the method built on the meta device (`on_meta`) plans each length; else the run refuses it."""
        requests.plan_on_meta(cls, model_args, arm, lengths)

    @classmethod
    def on_meta(cls, arm: Any, source: ModelSource) -> Method | None:
        """The method over the model on the meta device, where its rules need no weights; else None."""
