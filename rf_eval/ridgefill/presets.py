"""Arm presets: a published configuration as one arm setting (`preset=NAME`).

A preset fixes an arm's fill, tail and split (the split as a rule of the
model's layer count L, applied when the arm meets the model), so a paper's
comparison arm is one line, `preset=pop`, on any model. An arm that names a
preset gives no fill, tail or split of its own.

`pop`: POP (He et al., 2026), as RidgeFill paper section 6.4 runs it ("POP
native"): the identity fill from layer L - floor(L/3) with a one-token tail.
Paired with an arm of a longer tail, the report scores it on the items filled
under both (`rf_eval.stats.pairing` pairs only the items both arms scored:
the shared filled subset).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rf_eval.fills.identity import Identity

__all__ = ["PRESETS", "Preset", "preset"]


@dataclass(frozen=True)
class Preset:
    fill: str
    tail: int
    split: Callable[[int], int]  # the split for a model of L layers
    source: str

    def describe(self, n_layers: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"fill": self.fill, "tail": self.tail, "source": self.source}
        if n_layers is not None:
            out["split"] = self.split(n_layers)
        return out


PRESETS: dict[str, Preset] = {
    "pop": Preset(fill=Identity.name, tail=1, split=lambda n_layers: n_layers - n_layers // 3,
                  source="POP (He et al., 2026) at its published configuration; RidgeFill paper section 6.4"),
}

#: the arm fields a preset sets
PRESET_FIELDS = ("fill", "tail", "split")


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not valid; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]
