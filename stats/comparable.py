"""May two arms be paired at all? Same model weights, same task protocol (paper section 3.3).

Pairing item by item (`rf_eval.stats.pairing`) checks that both arms saw the
same document, prompt and target. That does not catch two arms run on
*different weights* of one architecture (a fine-tune and its base score the
same prompts), or a task scored another way (other generation settings, metric
list, filters or task version): the report would present such a difference as
the method's. `check_comparable` compares every arm with the reference on

- the model: the weights fingerprint the rf-eval adapters record
  (`config.rf_eval.weights_sha256`, `rf_eval.integrity.weights`) where both arms have
  one; otherwise the number of parameters lm-eval records and the
  `pretrained` model_arg;
- each shared task's protocol fields (`PROTOCOL_FIELDS` of the task's config
  and its version). Task `metadata` and dataset paths are not compared: lm-eval
  merges every model_arg into the metadata, and local paths differ between
  machines; what they change about the documents is caught per item.

A difference stops the report naming the field, unless the user asks for a
cross-model comparison (`cross_model=True`): then each difference is returned
as a label the report prints in every output format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rf_eval.stats.provenance import PROTOCOL_FIELDS
from rf_eval.stats.runs import ArmRun, Runs

__all__ = ["PROTOCOL_FIELDS", "NotComparableError", "check_comparable", "differences"]

class NotComparableError(ValueError):
    """An arm ran on other weights, or another task protocol, than the reference."""


def _model_differences(arm: ArmRun, ref: ArmRun) -> list[str]:
    a, r = arm.model_identity, ref.model_identity
    if a.get("weights_sha256") and r.get("weights_sha256"):
        if a["weights_sha256"] != r["weights_sha256"]:
            return [f"weights fingerprint {a['weights_sha256'][:12]}... vs {r['weights_sha256'][:12]}..."]
        return []
    found = []
    if a.get("num_parameters") and r.get("num_parameters") and a["num_parameters"] != r["num_parameters"]:
        found.append(f"number of parameters {a['num_parameters']} vs {r['num_parameters']}")
    if a.get("pretrained") != r.get("pretrained"):
        found.append(f"model (pretrained) {a.get('pretrained')!r} vs {r.get('pretrained')!r}")
    return found


def _protocol_differences(arm: ArmRun, ref: ArmRun) -> list[str]:
    found = []
    for task in sorted(set(arm.task_protocol) & set(ref.task_protocol)):
        a, r = arm.task_protocol[task], ref.task_protocol[task]
        for name in PROTOCOL_FIELDS:
            if a.get(name) != r.get(name):
                found.append(f"task {task}: {name} {_short(a.get(name))} vs {_short(r.get(name))}")
    return found


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def differences(arm: ArmRun, ref: ArmRun) -> list[str]:
    """What tells `arm`'s run apart from `ref`'s beyond the arm's own settings (empty: pairable)."""
    return _model_differences(arm, ref) + _protocol_differences(arm, ref)


def check_comparable(runs: Runs, reference: str, *, cross_model: bool = False,
                     only: Mapping[str, Any] | None = None) -> list[str]:
    """Refuse (NotComparableError) an arm that differs from `reference` as `differences` finds.

    With `cross_model`, return one label per differing arm instead. `only`
    limits the check to these arm names (default: every arm).
    """
    ref = runs.arm(reference)
    labels = []
    for arm in runs.arms:
        if arm.name == reference or (only is not None and arm.name not in only):
            continue
        found = differences(arm, ref)
        if not found:
            continue
        if not cross_model:
            raise NotComparableError(
                f"arm {arm.name!r} cannot be paired with the reference {reference!r}: {found[0]}"
                + (f" (and {len(found) - 1} more difference{'s' if len(found) > 2 else ''})" if len(found) > 1 else "")
                + "; pass --cross-model to compare them anyway (the report then labels the comparison)"
            )
        labels.append(f"cross-model comparison: {arm.name} vs {reference} differ in {'; '.join(found)}")
    return labels
