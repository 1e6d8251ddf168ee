"""What a RidgeFill arm costs per prompt, and the knob `budget=` turns on it.

The cost is the MAC model of RidgeFill section 2.5 (`rf_eval.cost.mac_model`)
at the rows the prefill actually ran: the whole prompt's tail (a generation
prefill holds back its last token, which decoding runs as a tail row), the
selected prefix rows and a probe's sweep rows; 1/r counts the tail and the
selected rows as the exact rows of section 2.5's r = S/L + (1 - S/L) T/N.

The knob (`rf_eval.cost.budget`): a preset's arm turns its preset's knob (POP's
split: a deeper split buys more exact layers; FastKV's propagated rows); an arm with
a row selector that counts its rows turns that count (`Selector.counts_rows`:
attention, random, probe, longer_tail), its tail fixed; any other fill turns
its tail (the compute-matched `nofill` control of section 3.3, generalised).
"""

from __future__ import annotations

import functools
from typing import Any

from rf_eval.cost.budget import Knob
from rf_eval.cost.mac_model import cache_rows, ceiling_r, prefill_macs
from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.ridgefill.presets import preset as named

__all__ = ["KNOBS", "knob_name", "planned_rows", "ridgefill_knob", "ridgefill_prefill_cost", "selector_probe_rows"]

#: the knobs a RidgeFill arm can turn, by what decides it (see the module docstring)
KNOBS = ("split", "rows", "tail")


def selector_probe_rows(selector: Any) -> int:
    """Rows a selector runs through the late layers beyond the prompt's own (the probe's sweep)."""
    return int(getattr(selector, "probe_rows", lambda: 0)()) if selector is not None else 0


def knob_name(preset: str | None, selector: Any) -> str:
    """The knob an arm turns: a preset's own (POP: `split`; FastKV: `rows`), `rows` with a row selector, else
    `tail`."""
    if preset is not None:
        return named(preset).knob
    return "rows" if selector is not None else "tail"


def planned_rows(arm: Any, n: int) -> int | None:
    """The prefix rows an n-token prompt of `arm` (a `RidgeFillArm`) runs exactly beside its tail, known before
    it runs: a budget's rows, else the selector's where the length decides them (`Selector.planned_rows`), 0
    without a selector; None where they depend on the text (the run counts them). The preview's and a served
    answer's ceilings (the preview's arm of a ridge fill is not resolved before its maps exist: its own tail,
    and no budget)."""
    plan, rows, _ = arm.plan_at(n) if "_plan" in arm.__dict__ else (None, None, None)
    if rows is not None or arm.selector_obj is None:
        return rows or 0
    tail = plan.tail if plan is not None else arm.tail
    return arm.selector_obj.planned_rows(n, max(n - min(tail, n), 0))


def ridgefill_knob(arm: Any, model_config: Any) -> Knob | None:
    """The knob of a resolved `RidgeFillArm` with a budget on a model of `model_config` (None without one)."""
    if arm.budget is None:
        return None
    config = model_config
    common = {"fill": arm.fill_obj if arm.fill_obj is not None else arm.fill, "map_split": arm.map_split}
    probe = selector_probe_rows(arm.selector_obj)
    name = knob_name(arm.preset, arm.selector_obj)
    if name == "split":
        def macs(n: int, split: int) -> int:
            return prefill_macs(config, n, split=split, tail=arm.tail, **common)

        lowest, highest = (lambda n: 1), (lambda n: int(config.num_hidden_layers) - 1)
    elif name == "rows":
        def macs(n: int, rows: int) -> int:
            return prefill_macs(config, n, split=arm.split, tail=arm.tail, exact_rows=rows, probe_rows=probe,
                                **common)

        lowest, highest = (lambda n: 0), (lambda n: max(n - arm.tail, 0))
    else:
        def macs(n: int, tail: int) -> int:
            return prefill_macs(config, n, split=arm.split, tail=tail, **common)

        lowest, highest = (lambda n: 1), (lambda n: n)
    positions = getattr(config, "max_position_embeddings", None) or 1 << 20
    return Knob(name, float(arm.budget), macs, functools.partial(prefill_macs, config), lowest, highest,
                max_length=int(positions))


def ridgefill_prefill_cost(config: Any, n: int, *, split: int, tail: int, selected: int, fill: Any,
                           map_split: bool, probe_rows: int = 0) -> PrefillCost:
    """The cost of one n-token prompt that ran `tail` exact tail rows and `selected` exact prefix rows in the
    late layers from `split` on (`tail >= n`: the plain model's prefill); `fill`: the arm's fill (or
    a fill's name)."""
    exact = prefill_macs(config, n)
    full_cache = cache_rows(config, n)
    if tail >= n:
        return PrefillCost(n, exact, exact, n, full_cache, full_cache, 1.0)
    exact_rows = min(tail + selected, n)
    macs = prefill_macs(config, n, split=split, tail=tail, exact_rows=selected, fill=fill, probe_rows=probe_rows,
                        map_split=map_split)
    layers = int(config.num_hidden_layers)
    return PrefillCost(n, macs, exact, exact_rows,
                       cache_rows(config, n, split=split, exact_rows=exact_rows, fill=fill), full_cache,
                       1.0 / ceiling_r(layers, split, exact_rows, n))
