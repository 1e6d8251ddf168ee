"""FastKV's token-selective propagation (Jo et al., 2025), as a method of its own: `method=fastkv`.

Every row runs layers 0..T (the TSP layer, L/2 - 1) and writes its cache
there; the TSP layer's last 8 rows (the window) attend over the prompt, and
only the top `keep` rows (2,048 with the window, the authors' `tsp_len`) run
the layers above, whose caches hold only them. In RidgeFill's engine that is
the arm of `preset=fastkv` (`rf_eval.ridgefill.presets`): fill `nofill`, split
L/2, tail 8 (the window), the row rule `selector=tsp(...)`
(`rf_eval.selectors.tsp`, where the authors' code is cited); `budget=` turns
the propagated rows. `--model ridgefill --model_args preset=fastkv` names this
method too.
"""

from __future__ import annotations

from rf_eval.fills.nofill import NoFill
from rf_eval.ridgefill.method import PresetMethod
from rf_eval.ridgefill.presets import Preset


class FastKV(PresetMethod):
    """FastKV's token-selective propagation; see the module docstring."""

    name = "fastkv"
    preset = "fastkv"
    # the TSP layer T = 15 of Llama-3.1-8B's 32 (dongwonjo/FastKV's default): layers 0..T run every row, so the
    # split S = T + 1 = L / 2; the last 8 rows (its window) always propagate (`rf_eval.selectors.tsp`)
    settings = Preset(fill=NoFill.name, tail=8, split=lambda n_layers: n_layers // 2, selector="tsp", knob="rows")
    budget_knob = "the propagated rows"
