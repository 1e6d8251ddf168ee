"""A study as data: what `rf_eval.study.study_file.load_study` reads from a study file (RidgeFill paper
section 3.4), and what the runner, the plan, the preflight checks and the launchers take."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rf_eval.methods import MODELS

#: the rf-eval models (`rf_eval.methods.MODELS`: lm-eval's names of the one adapter); any other name is an
#: lm-eval model (API arms)
ADAPTERS: tuple[str, ...] = tuple(MODELS)


class StudyError(ValueError):
    """A bad study file: the message names the key and its line."""


@dataclass(frozen=True)
class StudyArm:
    name: str
    model: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Study:
    path: Path
    sha256: str
    pretrained: str
    model_args: dict[str, Any]
    tasks: tuple[str, ...]
    arms: dict[str, StudyArm]
    reference: str
    maps: str | None = None
    fit: dict[str, Any] | None = None
    include_path: str | None = None
    lengths: tuple[int, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    limit: int | None = None  # lm-eval --limit, per task; RULER tasks split it evenly over lengths (and pooled tasks)
    samples: dict[str, list[int]] | None = None
    apply_chat_template: bool = False
    seed: int = 0
    margin: float = 2.0
    controls: dict[str, list[str]] = field(default_factory=dict)
    claims: tuple[dict[str, str], ...] = ()
    budgets: tuple[float, ...] = ()  # the arms are already expanded (`study_file.expand_budgets`); kept for the record
    # not a study-file key: the folder under --out that holds each arm's lm-eval output (`rf-eval demo`
    # keeps its runs/ there)
    arms_folder: str = "arms"

    def folder(self) -> Path:
        return self.path.parent

    def fit_options(self) -> dict[str, Any]:
        """`rf-eval fit`'s options (by destination name) for the `fit:` block: its files relative to the study
        file, the model's dtype and device from `model.args`. Empty without a `fit:` block."""
        if self.fit is None:
            return {}
        given: dict[str, Any] = {
            "model": self.pretrained, "splits": [int(self.fit["split"])],
            "calibration": [str(self.folder() / c) for c in self.fit["calibration"]],
            "heldout": [str(self.folder() / c) for c in self.fit.get("heldout") or []],
        }
        if self.fit.get("lambdas"):
            given["lambdas"] = [float(x) for x in self.fit["lambdas"]]
        given.update({k: str(self.model_args[k]) for k in ("dtype", "device") if k in self.model_args})
        return given
