"""Names for the arms of a study, from the model_args each run recorded.

An arm is one (model, model_args) setting. Its name is built from what tells it
apart from the other arms (see `name_arms`), with paths shortened to their last
component, so that `--reference exact` names the arm run with fill=exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rf_eval.cost.budget import budget_name

__all__ = ["name_arms", "parse_model_args"]

_EXPLICIT = ("arm", "name")
#: the setting an arm's name carries as a suffix, `ridge@0.5`: the compute budget (`rf_eval.cost.budget`)
BUDGET = "budget"


def parse_model_args(value: str | Mapping[str, Any] | None) -> dict[str, str]:
    """model_args as recorded by lm-eval (a dict, or the 'k=v,k=v' string of older releases)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): _text(v) for k, v in value.items()}
    out: dict[str, str] = {}
    for part in str(value).split(","):
        if part.strip():
            key, _, val = part.partition("=")
            out[key.strip()] = val.strip()
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _short(value: str) -> str:
    tail = value.rstrip("/").rsplit("/", 1)[-1]
    return tail or value


#: the resolved arm's fields (recorded by rf-eval's adapter in the results' `config.rf_eval`) a name may use
NAMING_FIELDS = ("fill",)


def naming_args(model_args: Mapping[str, Any], config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The model_args an arm is named from: as given, with the fill its run resolved where the
    given ones leave it out (an arm run on the defaults is "ridge", not "fill=unset")."""
    arm = (config or {}).get("rf_eval") or {}
    if any(k in model_args for k in (*NAMING_FIELDS, "preset", "method")):  # the arm named by what was given
        return dict(model_args)
    return {**{k: str(arm[k]) for k in NAMING_FIELDS if arm.get(k) is not None}, **model_args}


def name_arms(models: Sequence[str], model_args: Sequence[Mapping[str, str]]) -> list[str]:
    """One unique, short name per arm (same order as the inputs).

    The name is the value of the first setting that differs across arms (the
    model, then model_args keys in order), plus `key=value` for the settings
    that tell apart arms sharing that value: fill=exact, fill=ridge and
    fill=ridge,selector=attention become "exact", "ridge" and
    "ridge,selector=attention" (a number keeps its key: "split=12"). An
    explicit `arm=` or `name=` wins, and such arms are left out when telling
    the others apart (a served run named `arm=served` does not turn "exact"
    into "ridgefill,fill=exact"). An arm set by a compute budget carries it as a
    suffix, wherever else its name comes from: `budget=0.5` makes "ridge@0.5"
    (a study's `budgets:` names its arms so).
    """
    settings = [{"model": m, **{k: v for k, v in dict(a).items() if k != BUDGET}} for m, a in zip(models, model_args)]
    budgets = [dict(a).get(BUDGET) for a in model_args]
    explicit_names = [next((s[k] for k in _EXPLICIT if s.get(k)), None) for s in settings]
    unnamed = [s for s, explicit in zip(settings, explicit_names) if not explicit]
    differing = _differing(unnamed)
    names = []
    for s, explicit in zip(settings, explicit_names):
        if explicit:
            names.append(explicit)
        elif not differing:
            names.append(_short(s.get("pretrained") or s["model"]))
        else:
            first = differing[0]
            peers = [p for p in unnamed if p.get(first) == s.get(first)]
            extra = [f"{k}={_short(s[k])}" for k in _differing(peers) if k in s]
            value = _short(s[first]) if s.get(first) else "unset"
            base = f"{first}={value}" if value.replace(".", "", 1).isdigit() or value == "unset" else value
            names.append(",".join([base, *extra]))
    names = [name if explicit or not budget else budget_name(name, float(budget))
             for name, explicit, budget in zip(names, explicit_names, budgets)]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return unique


def _differing(settings: Sequence[Mapping[str, str]]) -> list[str]:
    """Keys (in order of first appearance) whose values are not the same in every setting."""
    keys: list[str] = []
    for s in settings:
        keys += [k for k in s if k not in keys]
    return [k for k in keys if len({s.get(k) for s in settings}) > 1]
