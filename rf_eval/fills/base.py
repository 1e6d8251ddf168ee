"""What a fill method declares about itself (`FillMethod`); the registry is `rf_eval.fills`.

A fill method decides what a late layer's *filled* prompt rows contribute
(RidgeFill paper section 2.1): the engine (`rf_eval.engine`) runs every row
of the lower layers, the exact tail and the selected rows of the late layers,
and asks the arm's fill method for the rest. A method is one class with:

- `name`, the `fill=` value, and `summary`, a line for `rf-eval fills`;
- `strategy`: `"inputs"` (a predicted late-layer input x̂_l = f(l, x_S) that
  runs through the layer's own norm and projections: identity, ridge),
  `"absent"` (filled rows hold nothing in late layers: nofill), or `"kv"`
  (the method gives late layers' keys and values itself, its `row_fill`);
- `needs_maps`: it reads fitted maps (`maps=`), loaded and checked against the
  model and its weights by `rf_eval.ridgefill.maps`; their sha256 and
  fingerprint are recorded in every run's provenance;
- `fill_fn(maps, dtype, device)`: the predicted-input function for
  `"inputs"` (None otherwise), and `row_fill(fill_fn)`: the engine strategy;
- `filled_row_macs(config, layer, mapped)`: the multiply-accumulates a filled
  row costs in one late layer (`rf_eval.ridgefill.cost`: the cost model,
  `cost_match`, the study plan, the server's ceilings all read it);
- `check(model_config, maps)`: the method's own rules for a model (an
  `ArmError` naming what to change);
- `fit_command`: the `rf-eval` command that fits its maps, if it has one, and
  `fit_target`: what `rf-eval fit --fill NAME` regresses each late layer's rows
  on (`rf_eval.ridgefill.targets`: the layer's input, or its keys and values),
  with `check_fit(config)` refusing a model it cannot be fitted on.

Corrections, splices and the attention probe change or read predicted rows,
so they apply to `"inputs"` methods only (`supports_corrections`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

STRATEGIES = ("inputs", "absent", "kv")


class FillMethod:
    """One fill method; subclass it in a module of its own (see the module docstring)."""

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

    def row_fill(self, fill_fn: Any) -> Any:
        """The engine's row-fill strategy (`rf_eval.engine.rowfill.RowFill`) from `fill_fn`."""
        from rf_eval.engine.fills import NoFill, PredictedInput

        if self.strategy == "absent":
            return NoFill()
        if self.strategy == "inputs":
            if fill_fn is None:
                raise ValueError(f"fill {self.name!r} needs a fill function" + (" (maps)" if self.needs_maps else ""))
            return PredictedInput(fill_fn)
        raise NotImplementedError(f"fill {self.name!r} (strategy {self.strategy!r}) must define row_fill")

    def filled_row_macs(self, config: Any, layer: Any, mapped: bool) -> int:
        """MACs one filled row costs in one late layer (`layer`: a `rf_eval.ridgefill.cost.LayerCost`;
        `mapped`: the layer reads the method's map, not x_S). Default: the layer's K/V or state update."""
        return 0 if self.strategy == "absent" else layer.write

    def check_fit(self, model_config: Any) -> None:
        """Refuse (ValueError) a model this method's maps cannot be fitted on; default: any model."""

    def check(self, model_config: Any, maps: Any) -> None:
        """The method's own rules for a model and its maps (raise `rf_eval.fields.ArmError`)."""
        if self.needs_maps and maps is None:
            from rf_eval.fields import ArmError

            fit = f" (fit them with `rf-eval {self.fit_command}`)" if self.fit_command else ""
            raise ArmError(f"fill={self.name} needs maps= (a folder or file of fitted maps){fit}")
