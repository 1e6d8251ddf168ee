"""Corrections to a filled cache (paper section 2.3, 6.6) and splices (section 6.6), as late-layer hooks.

A correction is a `Correction` (`base`) found by name, with no list to edit (the one plug-in pattern,
`rf_eval.plugins`): the modules of this package (`rescale`: `value_rescale`, `key_rescale`;
`terminal_state`), those of the folders in `RF_EVAL_CORRECTION_PATH` (separated like PATH, read when the
package is first imported; they import as `rf_eval.ridgefill.corrections.<module>`), the classes of
installed packages' `rf_eval.corrections` entry points, and classes given to `register_correction`. Its
parameters in an arm string are its constructor's. So a new correction is one file.

Splices replace the filled rows' keys, values or both with the exact ones in
every filled attention layer, from an exact reference prefill of the same
prompt. The paper inserts exact keys before RoPE and rotates them at their
own positions; the reference cache holds exactly that, RoPE(k_exact_j, j),
computed by the same rotation with the same tables, so copying the cached
rotated key is the same operation (tests/ridgefill/test_corrections.py checks it).
Gated DeltaNet layers stay filled under every splice, as in the paper.
Order: corrections run first, a splice last (it overrides what it replaces).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rf_eval.arm_string import check_params, parse_parts
from rf_eval.engine import LateLayerHooks, LayerView, new_cache
from rf_eval.plugins import REQUIRED, Discovery, PluginError, Registry, parameters
from rf_eval.ridgefill.corrections.base import Correction

CORRECTION_PATH_ENV = "RF_EVAL_CORRECTION_PATH"
ENTRY_POINTS = "rf_eval.corrections"
#: the late-layer hooks a correction defines one or both of (`Correction`)
HOOKS = ("kv", "prefix_state")


def _check(cls: type[Correction], where: str) -> None:
    """A correction's contract beyond its name: a hook the engine calls."""
    if not any(callable(getattr(cls, hook, None)) for hook in HOOKS):
        raise PluginError(f"{where}: correction {cls.name!r} must define {' or '.join(HOOKS)}")


#: every correction by name (`rf_eval.plugins.Registry`)
CORRECTIONS: Registry[Correction] = Registry("correction", Correction, __name__,
                                             Discovery(env=CORRECTION_PATH_ENV, group=ENTRY_POINTS,
                                                       one_per_module=False), check=_check)


def register_correction(cls: type[Correction]) -> type[Correction]:
    """Add a correction class at run time (a test's throwaway; a notebook's own). Returns `cls`."""
    return CORRECTIONS.register(cls)


def unregister_correction(name: str) -> None:
    """Remove a correction `register_correction` added."""
    CORRECTIONS.unregister(name)


def make_correction(name: str, **params: Any) -> Correction:
    """A correction by name; clear errors for unknown names and parameters (its constructor's)."""
    if name not in CORRECTIONS:
        raise ValueError(f"unknown correction {name!r}; valid corrections: {', '.join(CORRECTIONS)}")
    accepted = parameters(CORRECTIONS[name])
    check_params("correction", name, params, tuple(p.name for p in accepted))
    missing = [f"{p.name}=" for p in accepted if p.default is REQUIRED and p.name not in params]
    if missing:
        raise ValueError(f"correction {name!r} needs {', '.join(missing)}")
    return CORRECTIONS[name](**params)


def corrections_from(given: str | Sequence | None) -> list[Correction]:
    """Corrections from an arm string ('value_rescale(c=512)+terminal_state(path=F)'), a list of such strings
    or objects, or None."""
    if given is None or given == "" or given == []:
        return []
    if isinstance(given, str):
        return [make_correction(name, **params) for name, params in parse_parts(given)]
    out = []
    for item in given:
        if isinstance(item, str):
            out.extend(corrections_from(item))
        elif isinstance(item, dict):
            params = dict(item)
            out.append(make_correction(params.pop("name"), **params))
        else:
            out.append(item)
    return out


def splice_kv(part: str, reference):
    """A kv hook copying the exact reference cache's keys/values into the filled rows."""

    def kv(view: LayerView, k: torch.Tensor, v: torch.Tensor):
        rows = view.filled
        if rows.numel() == 0:
            return k, v
        layer = reference.layers[view.index]
        if part in ("keys", "both"):
            k[:, :, rows] = layer.keys[:, :, rows].to(k)
        if part in ("values", "both"):
            v[:, :, rows] = layer.values[:, :, rows].to(v)
        return k, v

    return kv


@torch.no_grad()
def reference_cache(model, input_ids: torch.Tensor):
    """The stock prefill's cache with every row's K/V kept: its sliding-window layers hold the whole prompt
    (the model's own `DynamicSlidingWindowLayer` keeps only the last window - 1 rows)."""
    from transformers.cache_utils import DynamicLayer

    cache = new_cache(model)
    cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
    model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def build_hooks(corrections: list, splice: str | None, model, input_ids: torch.Tensor) -> LateLayerHooks | None:
    """One LateLayerHooks for a request: kv corrections, then the splice; the state correction."""
    kv_steps = [c.kv for c in corrections if hasattr(c, "kv")]
    states = [c.prefix_state for c in corrections if hasattr(c, "prefix_state")]
    if splice is not None:
        kv_steps.append(splice_kv(splice, reference_cache(model, input_ids)))
    if not kv_steps and not states:
        return None

    def kv(view, k, v):
        for step in kv_steps:
            k, v = step(view, k, v)
        return k, v

    def prefix_state(view, state):
        for step in states:
            state = step(view, state)
        return state

    return LateLayerHooks(kv=kv if kv_steps else None, prefix_state=prefix_state if states else None)
