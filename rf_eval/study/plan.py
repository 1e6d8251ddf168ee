"""`rf-eval study plan`: each arm's exact lm_eval command and its MAC-model cost, without running anything."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError
from rf_eval.mac_model import prefill_macs
from rf_eval.ridge.maps import MapError, resolve_map_file
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.study.runner import KEY_REFERENCE_PLACEHOLDER, KEY_TASK, dependants, lm_eval_command
from rf_eval.study.study_file import Study, StudyArm
from rf_eval.tensor_files import read_metadata


def plan_text(study: Study, out: Path, launcher: Any) -> str:
    """Each arm's exact command and its MAC-model cost against exact prefill at each length."""
    lines = [f"study {study.path.name} (sha256 {study.sha256[:12]}...): {len(study.arms)} arms, "
             f"tasks {', '.join(study.tasks)}, lengths {', '.join(map(str, study.lengths)) or '(task default)'}"]
    waiting = dependants(study)
    if waiting:
        lines.append(f"{study.reference} runs first: the other arms read its {KEY_TASK} key tokens")
    for arm in study.arms.values():
        key_reference = KEY_REFERENCE_PLACEHOLDER if arm.name in waiting else None
        argv = launcher.argv(lm_eval_command(study, arm, out, study.maps or "<maps from fit>", key_reference))
        lines.append(f"\n[{arm.name}] {shlex.join(argv)}")
        costs, knobs = arm_costs(study, arm), arm_knobs(study, arm)
        if costs:
            lines.append("  MAC cost / exact: " + ", ".join(
                f"N={n}: {c:.3f}" + (f" ({knobs[n]})" if n in knobs else "") for n, c in costs.items()))
    return "\n".join(lines)


def maps_split(study: Study, split: int | None) -> int | None:
    """The split of the study's maps before they load: its `fit:` block's, or the map file's header (None
    where neither says)."""
    if getattr(study, "fit", None) is not None:
        return int(study.fit["split"])
    if not getattr(study, "maps", None):
        return None

    try:
        return int(read_metadata(resolve_map_file(study.maps, split), MapError, "map file")["split"])
    except (MapError, KeyError, ValueError):
        return None


def resolved_arm(study: Study, arm: StudyArm) -> tuple[Any, Any] | None:
    """(the model's config, a ridgefill arm's spec resolved as its run resolves it: defaults, a preset's
    split), without maps: a split the maps would set is the fit block's or the map file's; None where the
    config cannot be read here."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(study.pretrained)
    except OSError:
        return None
    fields = {k: v for k, v in {**study.model_args, **arm.args}.items() if k in RidgeFillArm.fields()}
    spec = RidgeFillArm.from_fields(fields, what="args")
    try:
        spec = spec.resolve(config)
    except (ValueError, UserError):  # needs its maps (fill=ridge): at the split they have, by the arm's rule
        spec = dataclasses.replace(spec, split=spec.split_for(config, maps_split(study, spec.split)))
    return config, spec


def arm_costs(study: Study, arm: StudyArm) -> dict[int, float]:
    """The MAC model's cost of a ridgefill arm relative to exact prefill at each study length (paper section
    2.5), at the value its budget's knob takes there (`arm_knobs`); {} where unknown."""
    if arm.model != "ridgefill" or not study.lengths:
        return {}

    resolved = resolved_arm(study, arm)
    if resolved is None:
        return {}
    config, spec = resolved
    knob = spec.knob(config)
    out = {}
    for n in study.lengths:
        if knob is not None:
            out[n] = knob.fraction(n, knob.setting(n))
            continue
        exact = prefill_macs(config, n)
        out[n] = 1.0 if not spec.fills_rows else prefill_macs(
            config, n, split=spec.split, tail=min(spec.tail, n), fill=spec.fill, map_split=spec.map_split) / exact
    return out


def arm_knobs(study: Study, arm: StudyArm) -> dict[int, str]:
    """What a ridgefill arm's budget sets at each study length ("tail 812"); {} for an arm without one."""
    resolved = resolved_arm(study, arm) if arm.model == "ridgefill" and "budget" in arm.args else None
    if resolved is None:
        return {}
    config, spec = resolved
    knob = spec.knob(config)
    return {n: f"{knob.name} {knob.setting(n)}" for n in study.lengths}
