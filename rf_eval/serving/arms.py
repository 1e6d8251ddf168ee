"""The arm of one request: which prefill the server runs for it.

A request chooses its arm with the body field `rf_arm` (an object, or a spec
string `fill=identity;tail=256`), or with a URL prefix for clients that cannot
add body fields (lm-eval's API models): `/arm/fill=identity;tail=256/v1/completions`.
The body field wins over the prefix; fields left out keep the server's own
arm (the options `rf-eval serve` was started with).

Arm fields are the arm-defining model_args of the `ridgefill` adapter
(`RidgeFillConfig` minus what loads the model and the maps), and values are
checked by the adapter's own parser: an unknown field or value is an
`ArmError` naming it and the valid ones.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from rf_eval.model_adapters.config import ModelArgs, ModelArgsError, RidgeFillConfig, parse_model_args

#: RidgeFillConfig fields a request may not change: they load the model or the maps, or are per run.
SERVER_ONLY = frozenset({f.name for f in dataclasses.fields(ModelArgs)} | {"maps", "reference"})


class ArmError(ValueError):
    """A bad arm in a request: answered with HTTP 400, naming the bad field or value."""


def arm_fields() -> tuple[str, ...]:
    """Field names a request's arm may set (in the config's order)."""
    return tuple(f.name for f in dataclasses.fields(RidgeFillConfig) if f.name not in SERVER_ONLY)


def parse_spec(text: str) -> dict[str, str]:
    """`key=value;key=value` (or `,` as separator, or a JSON object) as a dict."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ArmError(f"rf_arm {text!r} is not valid JSON ({err.msg})") from None
        if not isinstance(value, dict):
            raise ArmError(f"rf_arm must be an object, got {text!r}")
        return value
    out: dict[str, str] = {}
    for part in text.replace(",", ";").split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ArmError(f"rf_arm part {part!r} is not key=value (spec {text!r}); valid fields: {', '.join(arm_fields())}")
        out[key.strip()] = value.strip()
    return out


def as_fields(value: Any) -> dict[str, Any]:
    """A request's `rf_arm` value (None, an object or a spec string) as a dict of fields."""
    if value is None:
        return {}
    if isinstance(value, str):
        return parse_spec(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise ArmError(f"rf_arm must be an object or a 'key=value;...' string, got {type(value).__name__}")


def resolve(base: RidgeFillConfig, fields: Mapping[str, Any], n_layers: int) -> RidgeFillConfig:
    """The server's config with a request's arm fields applied, checked by the adapter's parser."""
    valid = arm_fields()
    unknown = [k for k in fields if k not in valid]
    if unknown:
        raise ArmError(f"unknown rf_arm field(s) {', '.join(map(repr, unknown))}; valid fields: {', '.join(valid)}")
    merged = {k: v for k, v in dataclasses.asdict(base).items() if v is not None}
    merged.update(fields)
    try:
        config = parse_model_args(RidgeFillConfig, merged)
    except ModelArgsError as err:
        raise ArmError(f"rf_arm: {err}") from None
    if config.split is not None and not 1 <= config.split <= n_layers - 1:
        raise ArmError(f"rf_arm: split={config.split} is outside 1..{n_layers - 1} for this {n_layers}-layer model")
    return config


def key(config: RidgeFillConfig) -> str:
    """A stable key of a config's arm fields (engines are cached by it)."""
    return json.dumps({k: getattr(config, k) for k in arm_fields()}, sort_keys=True, default=str)


def describe(config: RidgeFillConfig) -> dict[str, Any]:
    """The arm fields of a config (None values dropped)."""
    return {k: v for k in arm_fields() if (v := getattr(config, k)) is not None}
