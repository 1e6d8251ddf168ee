"""POP (He et al., 2026) at its published configuration, as a method of its own: `method=pop`.

The identity fill (every late layer reads the split state x_S) from layer
L - floor(L/3), with a one-token tail: RidgeFill paper section 6.4's "POP
native", the arm of `preset=pop` (`rf_eval.ridgefill.presets`); `budget=`
turns its split. `--model ridgefill --model_args preset=pop` names this method
too.
"""

from __future__ import annotations

from rf_eval.fills.identity import Identity
from rf_eval.ridgefill.method import PresetMethod
from rf_eval.ridgefill.presets import Preset


class POP(PresetMethod):
    """POP's identity fill at its published split and tail; see the module docstring."""

    name = "pop"
    preset = "pop"
    settings = Preset(fill=Identity.name, tail=1, split=lambda n_layers: n_layers - n_layers // 3)
    budget_knob = "the split"
