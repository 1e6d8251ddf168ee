"""What a correction to a filled cache is (`Correction`); the registry is `rf_eval.ridgefill.corrections`."""

from __future__ import annotations

from typing import Any, ClassVar

from rf_eval.plugins import param_values


class Correction:
    """A correction: its `name` (the arm string's, `corrections=NAME(key=value)`), its constructor's
    parameters (the arm string's keys, each kept as an attribute of its name: `describe` reads them back),
    and at least one of the hooks the engine calls in late layers (`rf_eval.engine.LateLayerHooks`):

    - `kv(view, k, v) -> (k, v)`: a late attention layer's keys and values (1, kv_heads, rows, head_dim),
      given back with their shapes;
    - `prefix_state(view, state) -> state`: a late Gated DeltaNet layer's state at the end of the prefix.

    `check(config_hash, plan, maps_sha)` refuses (ValueError) an arm it cannot serve, when the arm is resolved.
    """

    name: ClassVar[str] = ""

    def describe(self) -> dict[str, Any]:
        """Name and parameters, recorded in the run's provenance."""
        return {"name": self.name, **param_values(self)}

    def check(self, config_hash: str, plan: Any, maps_sha: str) -> None:
        """Raise ValueError when this correction cannot serve the arm `plan` (its split, fill, maps) on the model
        of `config_hash`."""
