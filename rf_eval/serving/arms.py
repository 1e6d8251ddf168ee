"""The arm of one request: which prefill the server runs for it.

A request chooses its arm with the body field `rf_arm` (an object, or a spec
string `fill=identity;tail=256`), or with a URL prefix for clients that cannot
add body fields (lm-eval's API models): `/arm/fill=identity;tail=256/v1/completions`.
The body field wins over the prefix; fields left out keep the server's own
arm (the options `rf-eval serve` was started with).

Arm fields are the fields of `rf_eval.ridgefill.arm_spec.RidgeFillArm` (the same spec
`--model ridgefill` builds from its model_args), checked by that spec: an
unknown field or value is an `ArmError` naming it and the valid ones. What
loads the model or the maps is the server's alone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from rf_eval.fields import ArmError
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.ridgefill.maps import MapError

__all__ = ["ArmError", "arm_fields", "as_fields", "describe", "key", "parse_spec", "resolve"]


def arm_fields() -> tuple[str, ...]:
    """Field names a request's arm may set (in the spec's order)."""
    return RidgeFillArm.fields()


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


def resolve(base: RidgeFillArm, fields: Mapping[str, Any], model_config: Any, maps: Any = None) -> RidgeFillArm:
    """The server's arm with a request's fields applied, checked against the model and the server's maps."""
    valid = arm_fields()
    unknown = [k for k in fields if k not in valid]
    if unknown:
        raise ArmError(f"unknown rf_arm field(s) {', '.join(map(repr, unknown))}; valid fields: {', '.join(valid)}")
    from rf_eval.ridgefill.presets import PRESET_FIELDS

    merged = {k: v for k, v in dataclasses.asdict(base).items() if v is not None}
    if fields.get("preset"):  # a request's preset replaces the server's fill, tail and split
        merged = {k: v for k, v in merged.items() if k not in PRESET_FIELDS}
    elif any(k in fields for k in PRESET_FIELDS):  # a request's own fill, tail or split leaves the server's preset
        merged.pop("preset", None)
    merged.update(fields)
    try:
        arm = RidgeFillArm.from_fields(merged, what="rf_arm").resolve(model_config, maps)
    except (ArmError, MapError) as err:
        raise ArmError(f"rf_arm: {err}") from None
    if arm.fill != base.fill:
        for changed in (arm, base):
            if changed.method is not None and changed.method.replaces_forward:
                raise ArmError(f"rf_arm: fill={changed.fill} makes the model's own forward its own, so a server "
                               f"serves it alone: start one with fill={changed.fill} (this one serves "
                               f"fill={base.fill})")
    return arm


def key(arm: RidgeFillArm) -> str:
    """A stable key of an arm's fields (methods are cached by it)."""
    return json.dumps(describe(arm), sort_keys=True, default=str)


def describe(arm: RidgeFillArm) -> dict[str, Any]:
    """The arm's fields (None values, and allow_other_weights off and maps_device model, the defaults that
    change nothing a client sees, dropped)."""
    quiet = {("allow_other_weights", False), ("maps_device", "model")}
    return {k: v for k in arm_fields() if (v := getattr(arm, k)) is not None and (k, v) not in quiet}
