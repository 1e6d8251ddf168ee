"""Arm presets: a published configuration as one arm setting (`preset=NAME`).

A preset fixes an arm's fill, tail and split (the split as a rule of the
model's layer count L, applied when the arm meets the model), so a paper's
comparison arm is one line, `preset=pop`, on any model. An arm that names a
preset gives no fill, tail or split of its own.

`pop`: POP (He et al., 2026), as RidgeFill paper section 6.4 runs it ("POP
native"): the identity fill from layer L - floor(L/3) with a one-token tail.

`fastkv`: FastKV's token-selective propagation (Jo et al., 2025): every row
runs layers 0..L/2 - 1, only the rows its rule keeps (`rf_eval.selectors.tsp`,
2,048 with its 8-row window) run the layers above, whose caches hold only
them (fill `nofill`, tail 8). A budget turns its kept rows.
Paired with an arm of a longer tail, the report scores it on the items filled
under both (`rf_eval.stats.pairing` pairs only the items both arms scored:
the shared filled subset).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rf_eval.fills.identity import Identity
from rf_eval.fills.nofill import NoFill

__all__ = ["PRESETS", "Preset", "preset"]


@dataclass(frozen=True)
class Preset:
    fill: str
    tail: int
    split: Callable[[int], int]  # the split for a model of L layers
    source: str
    #: the row selector the preset runs when the arm names none (an arm may name the same selector with other
    #: parameters), None: no selector
    selector: str | None = None
    #: what `budget=` turns on the preset's arm (`rf_eval.ridgefill.arm_cost`): its split, or its rows
    knob: str = "split"

    def describe(self, n_layers: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"fill": self.fill, "tail": self.tail, "source": self.source}
        if self.selector:
            out["selector"] = self.selector
        if n_layers is not None:
            out["split"] = self.split(n_layers)
        return out


PRESETS: dict[str, Preset] = {
    "pop": Preset(fill=Identity.name, tail=1, split=lambda n_layers: n_layers - n_layers // 3,
                  source="POP (He et al., 2026) at its published configuration; RidgeFill paper section 6.4"),
    # FastKV's TSP layer T = 15 of Llama-3.1-8B's 32 (dongwonjo/FastKV's default): layers 0..T run every row,
    # so the split S = T + 1 = L / 2; the last 8 rows (its window) always propagate (`rf_eval.selectors.tsp`)
    "fastkv": Preset(fill=NoFill.name, tail=8, split=lambda n_layers: n_layers // 2, selector="tsp", knob="rows",
                     source="FastKV's token-selective propagation (Jo et al., 2025) at its published TSP layer, "
                            "window and tsp_len; RidgeFill paper section 7 (fill against drop)"),
}

#: the arm fields a preset sets
PRESET_FIELDS = ("fill", "tail", "split")


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not valid; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]
