"""The arm of one request: which prefill the server runs for it.

A request chooses its arm with the body field `rf_arm` (an object, or an arm
string `fill=identity;tail=256`), or with a URL prefix for clients that cannot
add body fields (lm-eval's API models): `/arm/fill=identity;tail=256/v1/completions`.
The body field wins over the prefix; fields left out keep the server's own
arm (the options `rf-eval serve` was started with).

Arm fields are the fields of the served method's arm (its `Method.Arm` in the
method registry, `rf_eval.methods`: `RidgeFillArm`, `RaReCacheArm`, a dropper's or a
plug-in's own dataclass, which its lm-eval adapter builds from model_args), applied by the adapter
(`PrefillLM.arm_with`) and checked by that spec: an unknown field or value is
an `ArmError` naming it and the valid ones. What loads the models or the maps
is the server's alone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from rf_eval.arm_string import parse_fields
from rf_eval.fields import ArmError
from rf_eval.ridge.maps import MapError

__all__ = ["ArmError", "as_fields", "describe", "key", "parse_rf_arm", "resolve"]


def parse_rf_arm(text: str, valid: tuple[str, ...] = ()) -> dict[str, Any]:
    """An `rf_arm` string: a JSON object, or `key=value;key=value` (`,` separates too; the arm string's one
    parser, `rf_eval.arm_string.parse_fields`) as a dict of the values' text (`valid`: named in errors)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ArmError(f"rf_arm {text!r} is not valid JSON ({err.msg})") from None
        if not isinstance(value, dict):
            raise ArmError(f"rf_arm must be an object, got {text!r}")
        return value
    try:
        return parse_fields(text, seps=";,", what="rf_arm")
    except ArmError as err:
        raise ArmError(f"{err}{'; valid fields: ' + ', '.join(valid) if valid else ''}") from None


def as_fields(value: Any, valid: tuple[str, ...] = ()) -> dict[str, Any]:
    """A request's `rf_arm` value (None, an object or an arm string) as a dict of fields."""
    if value is None:
        return {}
    if isinstance(value, str):
        return parse_rf_arm(value, valid)
    if isinstance(value, Mapping):
        return dict(value)
    raise ArmError(f"rf_arm must be an object or a 'key=value;...' string, got {type(value).__name__}")


def resolve(base: Any, fields: Mapping[str, Any], apply: Callable[[dict[str, Any]], Any],
            valid: tuple[str, ...]) -> Any:
    """The server's arm `base` with a request's fields applied by `apply` (the adapter's `PrefillLM.arm_with`);
    `valid`: the fields it takes (`PrefillLM.arm_fields`)."""
    unknown = [k for k in fields if k not in valid]
    if unknown:
        raise ArmError(f"unknown rf_arm field(s) {', '.join(map(repr, unknown))}; valid fields: {', '.join(valid)}")
    try:
        arm = apply(dict(fields))
    except (ArmError, MapError) as err:
        raise ArmError(f"rf_arm: {err}") from None
    if getattr(arm, "fill", None) != getattr(base, "fill", None):
        for changed in (arm, base):
            fill = getattr(changed, "fill_obj", None)
            if fill is not None and fill.replaces_forward:
                raise ArmError(f"rf_arm: fill={changed.fill} makes the model's own forward its own, so a server "
                               f"serves it alone: start one with fill={changed.fill} (this one serves "
                               f"fill={base.fill})")
    return arm


def key(arm: Any) -> str:
    """A stable key of an arm's fields (methods are cached by it)."""
    return json.dumps({"spec": type(arm).__name__, **describe(arm)}, sort_keys=True, default=str)


def describe(arm: Any) -> dict[str, Any]:
    """The arm's fields (None values, and allow_other_weights off and maps_device model, the defaults that
    change nothing a client sees, dropped)."""
    quiet = {("allow_other_weights", False), ("maps_device", "model")}
    names = [f.name for f in dataclasses.fields(arm) if f.init]
    return {k: v for k in names if (v := getattr(arm, k)) is not None and (k, v) not in quiet}
