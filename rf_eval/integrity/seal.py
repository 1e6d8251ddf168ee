"""Results sealed when written: `rf-eval report` refuses per-item results that changed after their run.

lm-eval writes a run's per-item results (`samples_<task>_<date>.jsonl`, with `--log_samples`) through its
`EvaluationTracker` after the evaluation, out of the adapter's sight. For runs of rf-eval's own models
(`--model ridgefill | rarecache | drop`, `rf_eval.model_adapters.startup.MODELS`), rf-eval's startup hook wraps
`EvaluationTracker.save_results_samples` (`wrap_tracker`): once lm-eval has written and closed a task's
samples file, the file's sha256, size and line count go into `rf_eval_seal_<date>.json` beside the run's
`results_<date>.json` (one seal per run, one entry per samples file). The one hook serves every way lm-eval
saves a run: the `lm_eval` command, `python -m lm_eval`, `accelerate launch -m lm_eval`, a study's arms
(`rf-eval study run` runs `-m lm_eval` in a child process or in its own) and Python callers that save
through a tracker. Runs of other models (`--model hf`, `"CUSTOM"` LM objects) are left exactly as lm-eval
writes them: rf-eval writes nothing into another model's output.

`check` (called by `rf_eval.stats.runs` for every samples file a report reads): a sealed file that was
edited, truncated, extended or removed since its run is refused (`SealError`, naming the file; the fix is
to rerun that run); a file without a seal of its own run (none, or another run's seal in its place) reads as
unsealed: the report notes it for another model's run, and refuses it, unless `--allow-unsealed`, for a run of
rf-eval's models, which always seal (`rf_eval.stats.runs`).

A seal catches accidents (an edit, a truncated copy, a half-synced folder), not someone who rewrites the
seal too: the run ledger (`rf-eval ledger`, `report --ledger`) keeps hashes outside the run folder.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError
from rf_eval.integrity.hashing import file_sha256_and_lines

log = logging.getLogger(__name__)

PREFIX = "rf_eval_seal_"  # rf_eval_seal_<date>.json, <date> the run's (its results_<date>.json)
KIND = "rf-eval-seal"
RERUN = "rerun that run (lm_eval ... --log_samples) to report it"


class SealError(UserError):
    """A sealed samples file differs from what its run wrote, or its seal cannot be read."""


def seal_path(folder: str | Path, date_id: str) -> Path:
    """The seal of the run with this date (lm-eval's `date_id`) in an output folder."""
    return Path(folder) / f"{PREFIX}{date_id}.json"


def record(samples: str | Path, date_id: str, written: int) -> Path | None:
    """Seal `samples` (a file lm-eval has just written, `written` sample lines) into its run's seal; None (with a
    warning) when the file holds fewer lines than lm-eval was given: lm-eval failed to write it, and a seal
    would vouch for a partial file."""
    samples = Path(samples)
    sha256, size, lines = file_sha256_and_lines(samples)
    if lines < written:
        log.warning("rf-eval: %s holds %d of %d samples (lm-eval could not write them all); not sealed",
                    samples, lines, written)
        return None
    path = seal_path(samples.parent, date_id)
    try:
        data = _read(path) if path.exists() else None
    except SealError:
        data = None  # an unreadable seal of this same run: rewritten from what is on disk now
    data = data or {"kind": KIND, "date": date_id, "files": {}}
    data["files"][samples.name] = {"sha256": sha256, "bytes": size, "lines": lines}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a seal
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SealError(f"{path}: not a readable rf-eval results seal ({err}); {RERUN}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or not isinstance(data.get("files"), dict):
        raise SealError(f"{path}: not an rf-eval results seal (kind {data.get('kind') if isinstance(data, dict) else None!r}); "
                        f"{RERUN}")
    return data


def check(samples: str | Path, date_id: str) -> bool:
    """True when `samples` is sealed and unchanged, False when its run left no seal for it (read as unsealed);
    a `SealError` naming the file when it differs from what its run wrote, or was removed."""
    samples = Path(samples)
    path = seal_path(samples.parent, date_id)
    if not path.exists():
        return False
    data = _read(path)
    if str(data.get("date")) != date_id:  # another run's seal put in this one's place: vouches for nothing here
        return False
    sealed = data["files"].get(samples.name)
    if not isinstance(sealed, dict):
        return False
    if not samples.is_file():
        raise SealError(f"{samples}: its run wrote it ({path.name} seals it) but it is gone; {RERUN}")
    sha256, size, lines = file_sha256_and_lines(samples)
    if sha256 == sealed.get("sha256"):
        return True
    was = int(sealed.get("lines") or 0)
    if lines < was:
        how = f"holds {lines} of the {was} lines its run wrote: it was truncated"
    elif lines > was:
        how = f"holds {lines} lines, its run wrote {was}: lines were added"
    else:
        how = "differs from what its run wrote: it was edited"
    raise SealError(f"{samples}: {how} after lm-eval wrote it (sha256 {sha256[:12]}..., sealed "
                    f"{str(sealed.get('sha256'))[:12]}... in {path.name}); {RERUN}")


def samples_file(tracker: Any, task_name: str) -> Path | None:
    """Where lm-eval's `save_results_samples` writes `task_name`'s samples (its own rule; None without an
    output path)."""
    if not tracker.output_path:
        return None
    path = Path(tracker.output_path)
    folder = path.parent if path.suffix == ".json" else path / str(tracker.general_config_tracker.model_name_sanitized)
    return folder / f"samples_{task_name}_{tracker.date_id}.jsonl"


def seals(tracker: Any) -> bool:
    """Whether this tracker saves a run of an rf-eval model (lm-eval records the `--model` name it was given)."""
    return getattr(tracker.general_config_tracker, "model_source", None) in rf_eval_models()


@functools.cache
def rf_eval_models() -> frozenset[str]:
    """The lm-eval model names rf-eval declares (its `lm_eval.models` entry points, which
    tests/test_packaging.py checks against the startup hook's `MODELS`)."""
    from importlib.metadata import entry_points

    return frozenset(ep.name for ep in entry_points(group="lm_eval.models") if ep.value.startswith("rf_eval."))


def wrap_tracker(module: Any) -> None:
    """`module.EvaluationTracker.save_results_samples` wrapped to seal what it wrote (once; see the docstring)."""
    cls = module.EvaluationTracker
    original = cls.save_results_samples
    if getattr(original, "_rf_eval", False):
        return

    @functools.wraps(original)
    def save_results_samples(self, task_name, samples, *args, **kwargs):
        out = original(self, task_name, samples, *args, **kwargs)
        try:
            path = samples_file(self, task_name) if seals(self) else None
            if path is not None and path.is_file():
                record(path, str(self.date_id), len(samples))
        except Exception as err:  # a seal that cannot be written leaves the run unsealed, never failed
            log.warning("rf-eval: could not seal the samples of %s (%s); the report will read them as unsealed",
                        task_name, err)
        return out

    save_results_samples._rf_eval = True
    cls.save_results_samples = save_results_samples


def unsealed_note(name: str, model: str, files: list[str], allowed: bool) -> str:
    """The report's note on arm `name`, whose samples `files` carry no seal of their run. A run of one of
    rf-eval's own lm-eval models always seals (`wrap_tracker`), so there a missing or foreign seal means it was
    removed, replaced or left behind in a copy: refused (SealError) unless `allowed` (`--allow-unsealed`),
    which the note records. Runs of other models (`hf`, API models) cannot carry one and get the plain note."""
    listed = ", ".join(files)
    if model not in rf_eval_models():
        return (f"{name}: unsealed: {listed} carry no rf-eval seal (a run of another lm-eval model), so a change "
                "made after the run cannot be detected")
    if not allowed:
        raise SealError(
            f"{name}: {listed} carry no seal of their run, though every run of --model {model} seals its "
            "per-item results: the seal file was removed or replaced by another run's, or the folder was copied "
            "without it. Rerun the arm, or pass --allow-unsealed to report these files anyway (the report says so)")
    return (f"{name}: unsealed, reported with --allow-unsealed: {listed} lost the seal their --model {model} run "
            "wrote, so a change made after the run cannot be detected")
