"""A study folder's resumable state: OUT/study.json (the study file's sha256, the registered claims, every
arm's command, timings and fingerprint) and each arm's `done.json`, which `rf_eval.study.runner` and the
Slurm steps (`rf_eval.study.slurm`) read to skip finished arms and to refuse a folder of another study."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rf_eval.study.jobs import cached_requests
from rf_eval.study.spec import Study, StudyError

STATE = "study.json"


def done_marker(out: Path, arm: str, arms_folder: str = "arms") -> Path:
    """The arm's `done.json`: written when its `lm_eval` process finished, with its fingerprint."""
    return out / arms_folder / arm / "done.json"


def is_done(out: Path, arm: str, want: str, arms_folder: str = "arms") -> bool:
    """Whether the arm finished with the fingerprint `want`."""
    marker = done_marker(out, arm, arms_folder)
    return marker.is_file() and json.loads(marker.read_text()).get("fingerprint") == want


def load_state(out: Path) -> dict[str, Any] | None:
    """The folder's study.json, or None where no study has run."""
    path = out / STATE
    return json.loads(path.read_text()) if path.is_file() else None


def save_state(out: Path, state: dict[str, Any]) -> None:
    """Write study.json."""
    tmp = out / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    tmp.replace(out / STATE)  # atomic: a kill never leaves half a state file


def check_folder(study: Study, out: Path) -> dict[str, Any]:
    """The folder's state for this study; refuses a folder of another version of the study file."""
    state = load_state(out)
    if state is not None and state.get("study_sha256") != study.sha256:
        raise StudyError(f"{out} holds results of another version of the study file (sha256 "
                         f"{state.get('study_sha256', '')[:12]}..., this file {study.sha256[:12]}...): "
                         "results of a changed study are never mixed; give a new --out")
    return state or {"study": str(study.path), "study_sha256": study.sha256, "arms_folder": study.arms_folder,
                     "arms": {}}


def status_text(out: Path) -> str:
    """`rf-eval study status`: the claims' registration and each arm's status, cached requests and time."""
    state = load_state(out)
    if state is None:
        return f"{out}: no study has run here"
    lines = [f"study {state['study']} (sha256 {state['study_sha256'][:12]}...)",
             f"claims registered: {'yes' if state.get('registered') else 'no'}"]
    for name, info in state["arms"].items():
        marker = done_marker(out, name, state.get("arms_folder", "arms"))
        status = "done" if marker.is_file() else info.get("status", "pending")
        seconds, job = info.get("seconds"), info.get("job")
        lines.append(f"  {name:<20} {status:<9} requests cached {cached_requests(out, name):>6}"
                     + (f"  {seconds:.0f}s" if seconds is not None else "")
                     + (f"  slurm job {job}" if job and status != "done" else ""))
    return "\n".join(lines)
