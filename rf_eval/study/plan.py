"""`rf-eval study plan`: each arm's exact lm_eval command and its MAC-model cost, without running anything."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from rf_eval.files.tensor_files import read_metadata
from rf_eval.methods import method_for_arm
from rf_eval.ridge.maps import MapError, resolve_map_file
from rf_eval.study.runner import KEY_REFERENCE_PLACEHOLDER, KEY_TASK, dependants, lm_eval_command
from rf_eval.study.spec import Study, StudyArm


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
        costs = arm_preview(study, arm)
        if costs:
            lines.append("  MAC cost / exact: " + ", ".join(
                f"N={n}: {c:.3f}" + (f" ({knob})" if knob else "") for n, (c, knob) in costs.items()))
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


def arm_preview(study: Study, arm: StudyArm) -> dict[int, tuple[float, str | None]]:
    """An arm's MAC-model cost relative to exact prefill at each study length, with what its budget sets
    there, as its method previews it (`Method.preview_costs`); {} where its method previews none, the study
    names no lengths or the model's config cannot be read here."""
    chosen = method_for_arm(arm.model, {**study.model_args, **arm.args})
    if chosen is None or not study.lengths:
        return {}
    method, args = chosen
    try:
        config = AutoConfig.from_pretrained(study.pretrained)
    except OSError:
        return {}
    parsed = method.parse_arm({k: v for k, v in args.items() if k in method.arm_fields()}, what="args")
    return method.preview_costs(config, parsed, study.lengths, maps_split=lambda split: maps_split(study, split))
