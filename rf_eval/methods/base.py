"""`Method`: what a prefill method declares so that rf-eval finds it by name (`rf_eval.methods`).

A method replaces how a prompt is prefilled (RidgeFill, RaReCache, the token
droppers); what it builds is a `rf_eval.method.PrefillMethod`. Its declaration
says, once:

- `name`: its `method=` value (and its name in results);
- `Arm`: the frozen dataclass of its settings, which parses its model_args
  (a class with `from_fields`/`fields`, as `RidgeFillArm`, or any dataclass:
  values are coerced to the fields' types by `rf_eval.fields.build`);
- `model`: the lm-eval model that runs it (`prefill`, the generic adapter
  `rf_eval.model_adapters.method_lm`, unless the method has an adapter of its
  own that loads more than the model: maps, a source model);
- `keys`: the model_args its adapter reads beside the arm's fields (the
  files it loads: `maps`, `source`);
- `build(model, tokenizer, arm, **parts)`: the method over a loaded model
  (`parts`: what its adapter loaded beside the model, e.g. `source`, `maps`);
- its cost and provenance: the built method's `prefill_cost` and `provenance`.

A method written in its own class (a plug-in: one file) subclasses `Method`
and defines `prefill`, `is_plain`, `prefill_cost` (and `provenance`, where
its arm and the model's identity are not enough); `build` then constructs the
class itself, and the rest of the protocol is shared here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch

from rf_eval.devices import input_device
from rf_eval.dropped_result import extend_after
from rf_eval.engine import PrefillResult
from rf_eval.fields import build as build_dataclass
from rf_eval.method import PrefillMethod, generate, method_forward, model_identity, prefill_each
from rf_eval.prefill_cost import PrefillCost
from rf_eval.weights import weights_fingerprint

__all__ = ["GENERIC_MODEL", "MapsSplit", "Method", "NoSettings"]

#: the split of maps not loaded yet, given the arm's own split (None where nothing says): `rf-eval study plan`
MapsSplit = Callable[[int | None], int | None]

#: the lm-eval model of a method with no adapter of its own (`--model prefill --model_args method=NAME,...`)
GENERIC_MODEL = "prefill"


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """The arm of a method that takes no settings."""


class Method:
    """A prefill method's declaration, and the shared protocol of one written in its own class."""

    name: ClassVar[str] = ""
    Arm: ClassVar[type] = NoSettings
    model: ClassVar[str] = GENERIC_MODEL
    #: the model_args its adapter reads beside the arm's fields (what it loads for `build`: `maps`, `source`)
    keys: ClassVar[tuple[str, ...]] = ()
    #: the arm fields a `budget` sets instead (RaReCache's `rho`, a dropper's `keep`): a study's `budgets:`
    #: leaves them out of the arms it makes of one arm, one per budget (`rf_eval.study.study_file`)
    budget_sets: ClassVar[tuple[str, ...]] = ()

    # -- the declaration ------------------------------------------------------------------
    @classmethod
    def arm_fields(cls) -> tuple[str, ...]:
        """The model_args keys of the method's arm."""
        own = getattr(cls.Arm, "fields", None)
        return tuple(own()) if callable(own) else tuple(f.name for f in dataclasses.fields(cls.Arm))

    @classmethod
    def parse_arm(cls, values: Mapping[str, Any], *, what: str = "model_args") -> Any:
        """The arm of `values` (strings as model_args give them), checked: an `ArmError` naming a bad key."""
        own = getattr(cls.Arm, "from_fields", None)
        return own(dict(values), what=what) if callable(own) else build_dataclass(cls.Arm, values, what=what)

    @classmethod
    def updated_arm(cls, arm: Any, fields: Mapping[str, Any], *, what: str = "rf_arm") -> Any:
        """`arm` with `fields` applied and checked (a served request's arm)."""
        own = getattr(arm, "updated", None)
        if callable(own):
            return own(dict(fields), what=what)
        return cls.parse_arm({**{f.name: getattr(arm, f.name) for f in dataclasses.fields(arm)}, **fields},
                             what=what)

    @classmethod
    def missing_fields(cls, fields: Mapping[str, Any]) -> dict[str, str]:
        """The fields a study arm of this method must name and `fields` (its `args`) lacks, each with the
        values it takes: a study file that leaves one out is refused as it is read, at the arm's line."""
        return {}

    @classmethod
    def reads_study_maps(cls, model_args: Mapping[str, Any]) -> bool:
        """Whether an arm with `model_args`, naming no `maps` of its own, reads the study's (its `maps:`, or
        the maps its `fit:` block writes)."""
        return False

    @classmethod
    def planned_costs(cls, config: Any, arm: Any, lengths: Sequence[int], *,
                      maps_split: MapsSplit) -> dict[int, tuple[float, str | None]]:
        """`rf-eval study plan`'s preview of an arm before anything loads: at each of `lengths`, its MAC cost
        relative to exact prefill and what its budget sets there ("tail 812"; None without one). `config`:
        the model's `transformers` config; `maps_split(split)`: the split of maps not yet loaded (None where
        nothing says). The default, {}, previews nothing: the run costs each item (`prefill_cost`)."""
        return {}

    @classmethod
    def check_budget(cls, model_args: Mapping[str, Any], arm: Any, lengths: Sequence[int] | None, *,
                     maps_split: MapsSplit) -> None:
        """Refuse, before a study runs anything, a budget the arm cannot meet at some length (a `BudgetError`
        naming it; `lengths` None: every length the model takes). `model_args`: the arm's, with the files
        it loads. The default checks nothing here: the run refuses the budget before its first prompt."""

    @classmethod
    def build(cls, model: Any, tokenizer: Any, arm: Any, **parts: Any) -> PrefillMethod:
        """The method of `arm` over a loaded model; `parts`: what its adapter loaded beside it."""
        if parts:
            raise TypeError(f"method {cls.name!r} takes no {', '.join(parts)}")
        return cls(model, tokenizer, arm)

    # -- a method written in its own class ------------------------------------------------------
    def __init__(self, model: Any, tokenizer: Any = None, arm: Any = None) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.spec = self.parse_arm({}, what=self.name) if arm is None else arm

    @property
    def device(self) -> torch.device:
        return input_device(self.model)

    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0) -> PrefillResult:
        raise NotImplementedError

    def is_plain(self, n: int) -> bool:
        raise NotImplementedError

    def forward_context(self) -> AbstractContextManager:
        """The context a request runs the model in (`rf_eval.method.method_forward`), entered once per request."""
        return method_forward(self)

    def prefill_cost(self, n: int, result: PrefillResult | None = None) -> PrefillCost:
        raise NotImplementedError

    def prefill_batch(self, input_ids: torch.Tensor, *, for_generation: bool = False) -> list[PrefillResult]:
        return prefill_each(self, input_ids, for_generation=for_generation)

    def exact_tail(self, n: int) -> int:
        return n if self.is_plain(n) else 0

    def speedup_ceilings(self, n: int) -> dict[str, float]:
        return {"mac_ceiling": self.prefill_cost(n).mac_speedup}

    def extend(self, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
        """The stock model over `tokens` after the prompt (after the kept rows of a `DroppedResult`)."""
        return extend_after(self.model, result, tokens.to(self.device))

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return generate(self, input_ids, **kwargs)

    @functools.cached_property
    def weights_sha256(self) -> str:
        """The model's weights fingerprint (`rf_eval.weights`), read when first recorded."""
        return weights_fingerprint(self.model)

    def provenance(self) -> dict[str, Any]:
        """The method's name, its arm's settings and the model's identity (`rf_eval.method.model_identity`)."""
        settings = {f.name: getattr(self.spec, f.name) for f in dataclasses.fields(self.spec)}
        return {"method": self.name, **settings, **model_identity(self.model, self.weights_sha256)}
