"""Public Python API: `RidgeFill.from_pretrained(...)`, `.prefill`, `.extend`, `.generate`."""

from __future__ import annotations

import copy
import dataclasses
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rf_eval import engine
from rf_eval.devices import default_device, parse_dtype
from rf_eval.engine import Plan, PrefillResult
from rf_eval.fields import ArmError
from rf_eval.fills.base import check_model_forward
from rf_eval.loading_report import check_loaded, recording_missing_keys
from rf_eval.mac_model import ceiling_r, speedup_ceiling
from rf_eval.method import check_prompt, generate, input_device, method_forward, model_identity, prefill_each
from rf_eval.prefill_cost import PrefillCost
from rf_eval.ridge.maps import RidgeMaps, load_arm_maps
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.ridgefill.arm_cost import ridgefill_prefill_cost, selector_probe_rows
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.weights import weights_fingerprint


class RidgeFill:
    """A causal LM whose prompt prefill runs through the partial-prefill engine.

    The arm is a `RidgeFillArm` (`rf_eval.ridgefill.arm_spec`): give it as `arm=`, or
    give its fields as keyword arguments (`fill=`, `split=`, `tail=`,
    `chunk_size=`, `selector=`, `corrections=`, `splice=`, `cost_match=`,
    `unigram=`, `map_split=`; see that module for each). `maps`: a `RidgeMaps`, or a folder
    or file written by `rf-eval fit` (needed for fill `ridge`). The arm is
    checked against the model and the maps once, here, and its fill method
    bound to the model once: every prompt runs the same row-fill strategy
    (`rf_eval.engine.rowfill.RowFill`), no fill is looked up by name per prompt.
    `reference()` is the exact arm beside it, over the same model and arm.

    Implements the prefill-method protocol (`rf_eval.method.PrefillMethod`):
    `prefill`, `extend`, `is_plain`, `provenance`.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        *,
        arm: RidgeFillArm | None = None,
        maps: RidgeMaps | str | Path | None = None,
        **fields: Any,
    ):
        if arm is None:
            arm = RidgeFillArm.from_fields(fields, what="RidgeFill")
        elif fields:
            raise TypeError(f"give arm= or the arm's fields, not both (got {', '.join(fields)})")
        self.model = model.eval()
        self.tokenizer = tokenizer
        if maps is not None and not isinstance(maps, RidgeMaps):
            maps = load_arm_maps(maps, arm.split)
        self.maps = maps
        self.weights_sha256 = weights_fingerprint(model)
        self.spec = arm.resolve(model.config, maps, weights=self.weights_sha256)
        spec = self.spec
        self.plan = spec.plan
        self.resources = {"unigram": spec.unigram} if spec.unigram else {}
        self.selector = spec.selector_obj
        method = spec.method
        try:
            check_model_forward(model, spec.fill)
            check_loaded(model, spec.fill)
            placed = maps.on_host() if maps is not None and spec.maps_device == "cpu" else maps
            self._fill = None if method is None else method.bind(model, placed)
            #: the engine's row-fill strategy for every prompt, made once (None: the exact arm fills no row)
            self._strategy = None if method is None else method.row_fill(self._fill)
        except ValueError as err:
            raise ArmError(str(err)) from None

    @classmethod
    def from_pretrained(
        cls,
        pretrained: str | Path,
        *,
        maps: RidgeMaps | str | Path | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        trust_remote_code: bool = False,
        device_map: str | dict[str, Any] | None = None,
        offload_folder: str | Path | None = None,
        **fields: Any,
    ) -> RidgeFill:
        """Load a checkpoint (maps and arm checked against its config before the weights load).

        `device_map` (with `offload_folder` for "disk" entries): `transformers`' big-model
        dispatch through accelerate ("auto", or module name -> device / "cpu" / "disk");
        the engine runs each late layer on its execution device. `device` then only picks
        the dtype that "auto" means.
        """
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        arm = RidgeFillArm.from_fields(fields, what="RidgeFill")
        if maps is not None and not isinstance(maps, RidgeMaps):
            maps = load_arm_maps(maps, arm.split)
        arm.resolve(AutoConfig.from_pretrained(pretrained, trust_remote_code=trust_remote_code), maps)
        device = device or default_device()
        torch_dtype = parse_dtype(dtype, device)
        with recording_missing_keys():  # `__init__` refuses an arm that reads a tensor the checkpoint lacked
            if device_map is None:
                model = AutoModelForCausalLM.from_pretrained(
                    pretrained, dtype=torch_dtype, trust_remote_code=trust_remote_code
                ).to(device)
            else:
                offload = {} if offload_folder is None else {"offload_folder": str(offload_folder)}
                model = AutoModelForCausalLM.from_pretrained(
                    pretrained, dtype=torch_dtype, trust_remote_code=trust_remote_code, device_map=device_map,
                    **offload
                )
        tokenizer = AutoTokenizer.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, arm=arm, maps=maps)

    @property
    def fill_fn(self) -> engine.FillFn | None:
        """The fill function this arm's filled rows use (None for exact and nofill)."""
        return self._fill

    @property
    def row_fill(self) -> engine.RowFill | None:
        """The engine's row-fill strategy every prompt of this arm runs, made once (None for the exact arm)."""
        return self._strategy

    def reference(self) -> RidgeFill:
        """The exact arm over this method's loaded model (the `reference=exact` pass): this arm's split and tail
        with the fill off (`RidgeFillArm.reference`), sharing the model, tokenizer and weights fingerprint; no
        second load, fingerprint, resolve or fill method."""
        exact = copy.copy(self)
        exact.spec = self.spec.reference()
        exact.plan, exact.maps, exact.resources, exact.selector = exact.spec.plan, None, {}, None
        exact._fill = exact._strategy = None
        return exact

    @property
    def device(self) -> torch.device:
        """Where prompt ids go (the input embedding's execution device)."""
        return input_device(self.model)

    # -- the prefill-method protocol -------------------------------------------------------
    def plan_for(self, n: int) -> Plan:
        """The plan of an n-token prompt (a cost-matched control's tail depends on n)."""
        return self.spec.plan_for(n)

    def is_plain(self, n: int) -> bool:
        """True when an n-token prompt is prefilled by the plain model (no filled rows), bitwise."""
        return engine.runs_plain(self.plan_for(n), n, self.selector is not None)

    def forward_context(self) -> AbstractContextManager:
        """The model's forward for this arm (`rf_eval.method.method_forward`: the base one beside a fill that
        replaced it), entered once per request; its own entry points enter it again only outside one."""
        return method_forward(self)

    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0) -> PrefillResult:
        """Prefill a 1 x N prompt; `.cache` is the model's own cache, `.logits` the last row's.

        `held_back` (k): `input_ids` is a prompt without its last k tokens, which
        the caller runs afterwards through the stock model (`extend`, or
        `generate` for `for_generation`, which is k = 1). The plan is the full
        prompt's with the tail shortened by k, so every row keeps the class it
        has in a prefill of the whole prompt.
        """
        input_ids = check_prompt(input_ids, self.model).to(self.device)
        given = input_ids.shape[1]
        whole = given + (1 if for_generation else int(held_back))
        with self.forward_context():
            plan = self._plan_given(given, for_generation, held_back)
            return self._run(input_ids, plan, self.spec.row_budget(whole))

    def prefill_batch(self, input_ids: torch.Tensor, *, for_generation: bool = False) -> list[PrefillResult]:
        """`prefill` of each row of a B x N batch: one engine call when the arm has no per-prompt part
        (`RidgeFillArm.batches`) and the prompts have filled rows, else one prefill each."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a B x N tensor of prompts of one length, got "
                             f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids)}")
        n = input_ids.shape[1] + (1 if for_generation else 0)
        if len(input_ids) == 1 or not self.spec.batches or self.is_plain(n):
            return prefill_each(self, input_ids, for_generation=for_generation)  # each `prefill` checks its prompt
        for row in input_ids:
            check_prompt(row[None], self.model)
        with self.forward_context():
            plan = self._plan_given(input_ids.shape[1], for_generation, 0)
            return engine.split_batch(self._run(input_ids.long().to(self.device), plan))

    def _run(self, input_ids: torch.Tensor, plan: Plan, row_budget: int | None = None) -> PrefillResult:
        """One engine call: the arm's parts and its row-fill strategy, both bound once."""
        return prefill_arm(self.model, self.tokenizer, self.spec, input_ids, plan, self._strategy,
                           resources=self.resources, row_budget=row_budget)

    def _plan_given(self, given: int, for_generation: bool, held_back: int) -> Plan:
        """The plan of a prompt of which `given` tokens are prefilled: the whole prompt's, its tail shortened
        by the tokens held back (1 for generation), so every row keeps its class. A generation prefill at
        tail 1 runs no tail row (tail 0): the held-back last token is the tail (POP's one-token tail, paper
        sections 6.4 and 7); a caller that scores the given prompt's last row keeps one exact row. A selector
        reads the given prompt: one that scores rows by the attention of the prompt's last rows (attention,
        probe) reads a window one row earlier than a whole-prompt prefill's, so its picks can differ."""
        k = 1 if for_generation else int(held_back)
        plan = self.plan_for(given + k)
        return dataclasses.replace(plan, tail=max(plan.tail - k, 0 if for_generation else 1)) if k else plan

    def exact_tail(self, n: int) -> int:
        """The plan's tail rows of an n-token prompt (all n for a plain one)."""
        return n if self.is_plain(n) else min(self.plan_for(n).tail, n)

    def speedup_ceilings(self, n: int) -> dict[str, float]:
        """On an n-token prompt: `ceiling`, 1/r of layer passes, and `mac_ceiling`, the MAC model's (where it
        knows the family; `rf_eval.mac_model`)."""
        if self.is_plain(n):
            return {"ceiling": 1.0, "mac_ceiling": 1.0}
        plan = self.plan_for(n)
        out = {"ceiling": 1.0 / ceiling_r(len(engine.decoder_layers(self.model)), plan.split, plan.tail, n)}
        try:
            out["mac_ceiling"] = speedup_ceiling(self.model.config, n, split=plan.split, tail=plan.tail,
                                                 fill=self._cost_fill, map_split=plan.map_split)
        except (ValueError, AttributeError, TypeError):  # a family the MAC model does not know
            pass
        return out

    def prefill_cost(self, n: int, result: PrefillResult | None = None) -> PrefillCost:
        """What the prefill of an n-token prompt cost (`rf_eval.prefill_cost`), by the MAC model at the rows
        `result` ran (its prompt minus the tokens held back, which run as tail rows); a plain prompt's
        (or no `result`: the plan's rows) is exact's."""
        plan = self.plan_for(n)
        budget = {"budget": self.spec.budget, "knob_value": self.spec.knob_value(n)} \
            if self.spec.budget is not None else {}
        if result is None or result.plan is None:  # a filled prefill's result has a plan (a plain one's none)
            tail, selected = (n, 0) if self.is_plain(n) else (plan.tail, 0)
            ran = plan
        else:
            ran = result.plan
            held_back = n - result.prompt_length
            tail = min(ran.tail + held_back, n)
            selected = max(int(result.exact_rows.numel()) - min(ran.tail, result.prompt_length), 0)
        return ridgefill_prefill_cost(self.model.config, n, split=ran.split, tail=tail, selected=selected,
                                      fill=self._cost_fill, map_split=ran.map_split,
                                      probe_rows=selector_probe_rows(self.selector), **budget)

    @property
    def _cost_fill(self) -> Any:
        """What the MAC model reads of the arm's fill: its method, bound once (the name for the exact arm)."""
        return self.spec.method if self.spec.method is not None else self.spec.fill

    def extend(self, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
        """Run the stock model over `tokens` (1 x k) after the prompt; returns their logits (1, k, V).

        Continuation tokens are never filled: they read the prompt's cache like
        decoding steps. Caches whose late layers hold fewer rows (nofill) are
        extended one token at a time, since the stock mask assumes equal lengths.
        """
        with self.forward_context():
            return engine.extend(self.model, result, tokens.to(self.device))

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """`model.generate` over an engine-prefilled cache; kwargs are generate's own."""
        return generate(self, input_ids, **kwargs)

    def provenance(self) -> dict[str, Any]:
        """What ran: the arm and the maps' identity, for results files."""
        info: dict[str, Any] = {
            "method": "ridgefill",
            **self.spec.describe(),  # fill, split, tail, chunk_size, map_split, selector, corrections, ...
            **model_identity(self.model, self.weights_sha256, self.maps),
        }
        if self.spec.allow_other_weights:
            info["allow_other_weights"] = True
        return info
