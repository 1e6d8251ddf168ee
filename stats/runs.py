"""Read lm-eval output folders of several arms into one DataFrame of per-item results.

lm-eval 0.4.13 with `--output_path OUT --log_samples` writes, per run,
`OUT/<model_name_sanitized>/results_<date>.json` and, per task,
`samples_<task>_<date>.jsonl` with the same date. Each sample line holds
`doc_id`, `doc`, `filter`, `doc_hash`, `prompt_hash`, `target_hash` and the
value of each of the task's metrics. A folder may hold several runs (several
arms of one model write into the same `<model>` folder); every results file
found under the given paths is read, and runs are grouped into arms by their
recorded model and model_args (see `rf_eval.stats.arms` for names). When one
arm ran a task more than once, the latest run counts and a note says so.

One row per (arm, task, filter, doc_id) with the task's primary metric: the
first metric of the task's `metric_list` that has a number per item. RULER's
per-length metrics (named by sequence length, -1 where not applicable) become
one score with the length taken from the metric's name. Accuracy-like metrics
(higher is better, all values in [0, 1]) are put in points (x100), since the
paper reports accuracy in points (section 3.4); others keep their own unit.
Optional per-item numbers that a task or model may record beside its metrics:
`prefill_seconds` (a timing) and `speedup_ceiling` (1/r of paper section 2.5).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from rf_eval.stats.arms import name_arms, parse_model_args
from rf_eval.stats.ledger import file_sha256

__all__ = ["ArmRun", "ITEM_COLUMNS", "RunFormatError", "Runs", "load_runs"]

ITEM_COLUMNS = (
    "arm", "task", "filter", "doc_id", "doc_hash", "prompt_hash", "metric", "higher_is_better",
    "unit", "score", "length", "domain", "prefill_seconds", "speedup_ceiling",
)  # fmt: skip
LENGTH_KEYS = ("max_length", "max_seq_length", "context_length", "length")
TIMING_KEYS = ("prefill_seconds", "speedup_ceiling")
#: Files hashed for registration matching: model_args paths and small non-lm-eval files in a run folder.
MAX_HASHED_BYTES = 64 * 2**20


class RunFormatError(ValueError):
    """A path holds no lm-eval output, or the output is not in the expected format."""


@dataclass(frozen=True)
class ArmRun:
    """One arm: its name, what ran, when it started and the files that configured it."""

    name: str
    model: str
    model_args: dict[str, str]
    started: datetime
    results_files: tuple[str, ...]
    config_hashes: frozenset[str]

    @property
    def model_args_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.model_args.items())


@dataclass(frozen=True)
class Runs:
    """Per-item results of every arm (`items`, columns `ITEM_COLUMNS`), the arms, and notes."""

    items: pd.DataFrame
    arms: tuple[ArmRun, ...]
    notes: tuple[str, ...]

    def arm(self, name: str) -> ArmRun:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(name)


@dataclass(eq=False)  # hashed by identity
class _ResultsFile:
    path: Path
    date_id: str
    started: float
    model: str
    model_args: dict[str, str]
    data: dict[str, Any]


def _find_results(paths: Sequence[str | Path]) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file() and path.name.startswith("results_") and path.suffix == ".json":
            hits = [path]
        elif path.is_dir():
            hits = sorted(path.rglob("results_*.json"))
        else:
            raise RunFormatError(f"{path}: no such folder or lm-eval results file")
        if not hits:
            raise RunFormatError(
                f"{path}: no lm-eval results_*.json found (run lm_eval with --output_path and --log_samples)"
            )
        found += [h for h in hits if h.resolve() not in {f.resolve() for f in found}]
    return found


def _read_results(path: Path) -> _ResultsFile:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise RunFormatError(f"{path}: cannot read lm-eval results ({err})") from None
    if not isinstance(data, dict) or "configs" not in data or "config" not in data:
        raise RunFormatError(f"{path}: not an lm-eval results file (no 'config'/'configs')")
    config = data["config"] or {}
    started = data.get("date")
    if not isinstance(started, (int, float)):
        started = path.stat().st_mtime
    return _ResultsFile(
        path=path,
        date_id=path.stem[len("results_") :],
        started=float(started),
        model=str(config.get("model") or data.get("model_name") or "model"),
        model_args=parse_model_args(config.get("model_args")),
        data=data,
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _metric_order(task_config: dict[str, Any], sample: dict[str, Any]) -> list[str]:
    names = [m.get("metric") for m in task_config.get("metric_list") or [] if isinstance(m, dict)]
    names += list(sample.get("metrics") or [])
    return [str(n) for i, n in enumerate(names) if isinstance(n, str) and n not in names[:i]]


def _doc_length(doc: dict[str, Any]) -> int | str | None:
    for key in LENGTH_KEYS:
        value = doc.get(key)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)) and float(value).is_integer():
            return int(value)
        if isinstance(value, str) and value.strip():
            return int(value) if value.strip().isdigit() else value.strip()
    return None


def _primary(sample: dict[str, Any], names: list[str]) -> tuple[str, float, int | None] | None:
    """(metric, value, length from a RULER-style metric name) of one sample, or None."""
    present = [n for n in names if n in sample]
    if present and all(n.isdigit() for n in present):  # RULER: one metric per length, -1 elsewhere
        scored = [(n, _number(sample[n])) for n in present]
        scored = [(n, v) for n, v in scored if v is not None and v != -1]
        return ("score", scored[0][1], int(scored[0][0])) if scored else None
    for name in present:
        value = _number(sample[name])
        if value is not None:
            return name, value, None
    return None


def _sample_rows(rf: _ResultsFile, task: str, samples_path: Path) -> Iterable[dict[str, Any]]:
    task_config = rf.data["configs"].get(task) or {}
    hib = (rf.data.get("higher_is_better") or {}).get(task) or {}
    with open(samples_path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
                doc_id = int(sample["doc_id"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise RunFormatError(f"{samples_path}:{number}: not an lm-eval sample line") from None
            picked = _primary(sample, _metric_order(task_config, sample))
            if picked is None:
                continue
            metric, value, length = picked
            doc = sample.get("doc") if isinstance(sample.get("doc"), dict) else {}
            domain = doc.get("domain")
            yield {
                "task": task,
                "filter": str(sample.get("filter") or "none"),
                "doc_id": doc_id,
                "doc_hash": str(sample.get("doc_hash") or ""),
                "prompt_hash": str(sample.get("prompt_hash") or ""),
                "metric": metric,
                "higher_is_better": bool(hib.get(metric, True)) if metric != "score" else True,
                "score": value,
                "length": length if length is not None else _doc_length(doc),
                "domain": str(domain) if isinstance(domain, (str, int)) else None,
                **{k: _number(sample.get(k)) for k in TIMING_KEYS},
            }


def _config_hashes(files: Sequence[_ResultsFile]) -> frozenset[str]:
    """Hashes of files an arm's runs point at: model_args paths and stray files beside results."""
    candidates: set[Path] = set()
    for rf in files:
        for value in rf.model_args.values():
            for base in (Path.cwd(), rf.path.parent):
                try:
                    if value and (base / value).is_file():
                        candidates.add((base / value).resolve())
                except OSError:  # not a path (too long, bad characters)
                    pass
        for p in rf.path.parent.iterdir():
            if p.is_file() and not p.name.startswith(("results_", "samples_")):
                candidates.add(p.resolve())
    return frozenset(file_sha256(p) for p in candidates if p.stat().st_size <= MAX_HASHED_BYTES)


def _to_points(items: pd.DataFrame) -> pd.DataFrame:
    """Accuracy-like metrics (higher is better, all in [0, 1] over every arm) to points."""
    items = items.copy()
    items["unit"] = "raw"
    for _, idx in items.groupby(["task", "filter", "metric"], sort=False).groups.items():
        block = items.loc[idx]
        if block["higher_is_better"].all() and block["score"].between(0.0, 1.0).all():
            items.loc[idx, "score"] = block["score"] * 100.0
            items.loc[idx, "unit"] = "points"
    return items


def load_runs(paths: Sequence[str | Path]) -> Runs:
    """Load every lm-eval run under `paths` (folders or results files) into `Runs`."""
    results = [_read_results(p) for p in _find_results(paths)]
    keys = [(rf.model, json.dumps(rf.model_args, sort_keys=True)) for rf in results]
    arm_keys = list(dict.fromkeys(keys))
    notes: list[str] = []
    chosen: dict[tuple[tuple[str, str], str], _ResultsFile] = {}
    for key, rf in sorted(zip(keys, results), key=lambda kr: kr[1].started):
        for task in rf.data["configs"]:
            if (key, task) in chosen:
                notes.append(f"{task}: {rf.path} replaces the earlier run {chosen[(key, task)].path}")
            chosen[(key, task)] = rf
    names = name_arms([k[0] for k in arm_keys], [json.loads(k[1]) for k in arm_keys])
    rows: list[dict[str, Any]] = []
    arms: list[ArmRun] = []
    for key, name in zip(arm_keys, names):
        used = [(task, rf) for (k, task), rf in chosen.items() if k == key]
        n_rows = len(rows)
        for task, rf in used:
            samples = rf.path.parent / f"samples_{task}_{rf.date_id}.jsonl"
            if not samples.is_file():
                notes.append(f"{name}: no per-sample log for {task} in {rf.path.parent} (use --log_samples)")
                continue
            rows += [{"arm": name, **row} for row in _sample_rows(rf, task, samples)]
        if len(rows) == n_rows:
            notes.append(f"{name}: no per-item results found; the arm is left out")
            continue
        files = list(dict.fromkeys(rf for _, rf in used))
        arms.append(
            ArmRun(
                name=name,
                model=key[0],
                model_args=json.loads(key[1]),
                started=datetime.fromtimestamp(min(rf.started for rf in files), tz=timezone.utc),
                results_files=tuple(str(rf.path) for rf in files),
                config_hashes=_config_hashes(files),
            )
        )
    if not rows:
        raise RunFormatError("no per-item results in any run (run lm_eval with --log_samples)")
    items = _to_points(pd.DataFrame(rows, columns=[c for c in ITEM_COLUMNS if c != "unit"]))
    return Runs(items=items[list(ITEM_COLUMNS)], arms=tuple(arms), notes=tuple(notes))
