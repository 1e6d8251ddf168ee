"""Arm presets: a published configuration as one arm setting (`preset=NAME`), each a method of its own.

A preset fixes an arm's fill, tail and split (the split as a rule of the
model's layer count L, applied when the arm meets the model), so a paper's
comparison arm is one line on any model. An arm that names a preset gives no
fill, tail or split of its own. Each preset is declared by its method, in its
own file (`rf_eval.ridgefill.method.PresetMethod`: `pop`, POP at its published
configuration; `fastkv`, FastKV's token-selective propagation), and found here
through the method registry by its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rf_eval.methods import METHODS

__all__ = ["PRESET_FIELDS", "Preset", "preset"]

#: the arm fields a preset sets
PRESET_FIELDS = ("fill", "tail", "split")


@dataclass(frozen=True)
class Preset:
    fill: str
    tail: int
    split: Callable[[int], int]  # the split for a model of L layers
    #: the row selector the preset runs when the arm names none (an arm may name the same selector with other
    #: parameters), None: no selector
    selector: str | None = None
    #: what `budget=` turns on the preset's arm (`rf_eval.ridgefill.arm_cost`): its split, or its rows
    knob: str = "split"


def preset(name: str) -> Preset:
    """The preset of the method named `name` (`PresetMethod.settings`); a ValueError naming the valid ones."""
    named = {n: METHODS[n].settings for n in METHODS if isinstance(getattr(METHODS[n], "settings", None), Preset)}
    if name not in named:
        raise ValueError(f"preset={name!r} is not valid; valid presets: {', '.join(named)}")
    return named[name]
