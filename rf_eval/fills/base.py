"""What a fill declares about itself (`Fill`); the registry is `rf_eval.fills`.

A fill decides what a late layer's *filled* prompt rows contribute
(RidgeFill paper section 2.1): the engine (`rf_eval.engine`) runs every row
of the lower layers, the exact tail and the selected rows of the late layers,
and asks the arm's fill for the rest. A method is one class with:

- `name`, the `fill=` value, and `summary`, a line for `rf-eval fills`;
- `strategy`: `"inputs"` (a predicted late-layer input x̂_l = f(l, x_S) that
  runs through the layer's own norm and projections: identity, ridge),
  `"absent"` (filled rows hold nothing in late layers: nofill), or `"kv"`
  (the method gives late layers' keys and values itself, its `row_fill`);
- `needs_maps`: it reads fitted maps (`maps=`), loaded and checked against the
  model and its weights by `rf_eval.ridge.maps`; their sha256 and
  fingerprint are recorded in every run's provenance;
- `fill_fn(maps, dtype, device)`: the predicted-input function for
  `"inputs"` (None otherwise), and `row_fill(fill_fn)`: the engine strategy;
- `filled_row_macs(config, layer, mapped)`: the multiply-accumulates a filled
  row costs in one late layer (`rf_eval.cost.mac_model`: the cost model,
  `cost_match`, the study plan, the server's ceilings all read it);
- `check(model_config, maps)`: the method's own rules for a model (an
  `ArmError` naming what to change);
- `fit_command`: the `rf-eval` command that fits its maps, if it has one, and
  `fit_target`: what `rf-eval fit --fill NAME` regresses each late layer's rows
  on (`rf_eval.ridge.targets`: the layer's input, or its keys and values),
  with `check_fit(config)` refusing a model it cannot be fitted on.

Corrections, splices and the attention probe change or read predicted rows,
so they apply to `"inputs"` methods only (`supports_corrections`).

A method whose weights live in the checkpoint (SwiftKV's projections) reads
them from the loaded model: `bind(model, maps)` gives the fill function
(default: `fill_fn` at the model's dtype and input device), `default_split`
and `check_split` state its own split rules, and `selects_rows` False refuses
row selectors. A method may make the model's own forward its own (for the
prompt and decoded tokens alike): the model then carries a `ReplacedForward`,
`check_model_forward` refuses any arm on it but that fill's and the exact
arm, and the exact arm's calls run the base forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from rf_eval.devices import input_device
from rf_eval.engine.plan import FILL_OFF
from rf_eval.engine.strategies import AbsentRows, PredictedInput
from rf_eval.families import sliding_window
from rf_eval.fields import ArmError

STRATEGIES = ("inputs", "absent", "kv")
#: the attribute of a model whose own forward a fill replaced (a `ReplacedForward`)
FORWARD_MARK = "_rf_eval_forward"


class ReplacedForward:
    """What a fill that makes the model's own forward its own leaves on the model: the fill's
    name, and a switch its hooks read, so the exact arm beside it (the reference of the same weights)
    runs the base forward while `paused`."""

    def __init__(self, fill: str):
        self.fill, self.active = fill, True

    @contextmanager
    def paused(self) -> Iterator[None]:
        before, self.active = self.active, False
        try:
            yield
        finally:
            self.active = before


def replaced_forward(model: Any) -> ReplacedForward | None:
    """The fill that replaced the model's forward, if any."""
    return getattr(model, FORWARD_MARK, None)


def check_model_forward(model: Any, fill: str) -> None:
    """Refuse (ValueError) an arm of fill `fill` on a model whose forward another fill replaced;
    the exact arm runs beside it (its calls pause the replacement: `rf_eval.methods.requests.ForwardContext`)."""
    replaced = replaced_forward(model)
    if replaced is not None and fill not in (replaced.fill, FILL_OFF):
        raise ValueError(f"this model's forward was made fill={replaced.fill}'s (an arm of that fill was built on "
                         f"it); fill={fill} needs the model loaded again")


def check_ragged_cache(fill: str, model_config: Any) -> None:
    """Refuse (`ArmError`) a fill whose late layers hold fewer rows than the prompt on a model that cannot
    decode from such a cache: a sliding-window layer's mask assumes every row, and eager attention adds
    one mask as long as the lower layers' cache to every layer (transformers' SDPA path decodes one
    query without a mask, so each layer attends to exactly the rows it holds)."""
    why = "fill={} leaves late layers with fewer rows than the prompt, which {}; use a fill, or a longer tail " \
          "(tail >= the prompt) for the exact arm"
    if sliding_window(model_config) is not None:
        raise ArmError(why.format(fill, "this model's sliding-window layers cannot decode from (their masks "
                                        "assume every row)"))
    if getattr(model_config, "_attn_implementation", None) == "eager":
        raise ArmError(why.format(fill, "eager attention cannot decode from (it adds one mask as long as the "
                                        "prompt to every layer); load the model with attn_implementation=sdpa "
                                        "(an hf model_arg)"))


class Fill:
    """One fill; subclass it in a module of its own (see the module docstring)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    strategy: ClassVar[str] = "inputs"
    needs_maps: ClassVar[bool] = False
    fit_command: ClassVar[str | None] = None
    fit_target: ClassVar[str | None] = None
    #: where the method is defined (a paper section), for `rf-eval fills`
    source: ClassVar[str] = ""
    #: what a filled row costs in a late layer, in words, for `rf-eval fills` (default: by strategy)
    cost: ClassVar[str] = ""
    #: what the method reads beyond the model's own layers when it needs no maps (for `rf-eval fills`)
    weights: ClassVar[str] = ""
    #: False: the method has no exact prefix rows to select (a row selector is refused)
    selects_rows: ClassVar[bool] = True
    #: True: `bind` makes the model's own forward the method's (`FORWARD_MARK`)
    replaces_forward: ClassVar[bool] = False
    #: the name part of the checkpoint tensors beyond the base model's that this method reads (SwiftKV's
    #: `_swiftkv`); no other method reads them, so their absence matters to this one alone (`rf_eval.fills.loading_report.check_loaded`)
    extra_tensors: ClassVar[str] = ""

    @property
    def cost_text(self) -> str:
        return self.cost or {"inputs": "K/V projections (attention) or the state update (Gated DeltaNet)",
                             "absent": "nothing", "kv": "the method's own K/V"}[self.strategy]

    @property
    def supports_corrections(self) -> bool:
        """Corrections, splices and the probe change or read predicted rows: "inputs" methods only."""
        return self.strategy == "inputs"

    @property
    def absent(self) -> bool:
        """Filled rows hold no keys in late layers (the cache is ragged)."""
        return self.strategy == "absent"

    def fill_fn(self, maps: Any, dtype: torch.dtype, device: torch.device) -> Any:
        """The predicted-input function (late layer, split states) -> input for "inputs" methods, else None."""
        return None

    def bind(self, model: Any, maps: Any) -> Any:
        """The fill function for one loaded model (default: `fill_fn` at its dtype and input device)."""
        return self.fill_fn(maps, next(model.parameters()).dtype, input_device(model))

    def default_split(self, model_config: Any) -> int | None:
        """The split an arm of this method takes when neither it nor its maps give one (None: L // 2)."""
        return None

    def check_split(self, model_config: Any, split: int) -> None:
        """Refuse (`rf_eval.fields.ArmError`) a split this method cannot run at; default: any."""

    def row_fill(self, fill_fn: Any) -> Any:
        """The engine's row-fill strategy (`rf_eval.engine.rowfill.RowFill`) from `fill_fn`."""
        if self.strategy == "absent":
            return AbsentRows()
        if self.strategy == "inputs":
            if fill_fn is None:
                raise ValueError(f"fill {self.name!r} needs a fill function" + (" (maps)" if self.needs_maps else ""))
            return PredictedInput(fill_fn)
        raise NotImplementedError(f"fill {self.name!r} (strategy {self.strategy!r}) must define row_fill")

    def filled_row_macs(self, config: Any, layer: Any, mapped: bool) -> int:
        """MACs one filled row costs in one late layer (`layer`: a `rf_eval.cost.mac_model.LayerCost`;
        `mapped`: the layer reads the method's map, not x_S). Default: the layer's K/V or state update."""
        return 0 if self.strategy == "absent" else layer.write

    def runs_on(self, model_config: Any) -> bool:
        """Whether the method can run on models of this config at all (the README's families table);
        default: wherever its maps can be fitted (`check_fit`)."""
        try:
            self.check_fit(model_config)
        except ValueError:
            return False
        return True

    def check_fit(self, model_config: Any) -> None:
        """Refuse (ValueError) a model this method's maps cannot be fitted on; default: any model."""

    def check(self, model_config: Any, maps: Any) -> None:
        """The method's own rules for a model and its maps (raise `rf_eval.fields.ArmError`)."""
        if self.needs_maps and maps is None:
            fit = f" (fit them with `rf-eval {self.fit_command}`)" if self.fit_command else ""
            raise ArmError(f"fill={self.name} needs maps= (a folder or file of fitted maps){fit}")
        if self.absent:
            check_ragged_cache(self.name, model_config)
