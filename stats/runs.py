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

One row per (arm, task, filter, doc_id, metric). By default a task reports the
measures the paper reads it by (`rf_eval.stats.measures.default_metrics`; one
without values is noted, its column a dash), else the first of its
`metric_list`; `metrics=` picks others. Items where a metric is None (a needle
in the exact tail) are left out: it does not apply to them. A primary metric
with no value on any item is an `EmptyMetricError` (for a `*_filled` task
naming the tail and lengths), never a silent switch to another metric;
`allow_empty=True` leaves such a task out with a note. RULER's per-length
metrics (named by length, -1 elsewhere) become one metric, `score`, with the
length from the metric's name; otherwise the length is the doc's `max_length`
(or `max_seq_length`, `context_length`, `length`), the domain its `domain`,
the subtask its `ruler_task` (pooled `ruler_filled`): the facts of the
bootstrap strata (`rf_eval.stats.strata`). Accuracy-like metrics (higher is
better, all in [0, 1]) are put in points (x100, section 3.4).
Per-sample facts (`ITEM_FIELDS`: `cap_hits`, `copyable_share`) and per-item cost (`COST_FIELDS`), as
rf-eval's tasks record them beside their metrics, become columns of the same rows (empty without them).
Every samples file is checked against the seal its run wrote (`rf_eval.integrity.seal`): one edited, truncated or
removed since is refused, and so is an rf-eval run without its own seal unless `allow_unsealed` (`unsealed_note`).
An arm run with `reference=exact` records its engine floor in the results'
config (`rf_eval.engine_floor`, paper sections 4.3 and 9): `ArmRun.engine_floor`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from rf_eval.cost.prefill_cost import COST_FIELDS
from rf_eval.integrity.seal import check as check_seal
from rf_eval.integrity.seal import unsealed_note
from rf_eval.stats.arms import name_arms, naming_args, parse_model_args
from rf_eval.stats.cap_hits import results_totals
from rf_eval.stats.contrasts import is_loss_metric
from rf_eval.stats.metric_choice import RULER_SCORE, doc_length, number, task_metrics
from rf_eval.stats.provenance import (
    EmptyMetricError,
    RunFormatError,
    config_hashes,
    engine_floor,
    ledger_head,
    model_identity,
    scored_text_notes,
    task_protocol,
)

__all__ = ["ArmRun", "EmptyMetricError", "ITEM_COLUMNS", "ITEM_FIELDS", "RunFormatError", "Runs", "load_runs"]

#: per-sample facts rf-eval's tasks record beside their metrics, read onto every item of the sample: `cap_hits`
#: (the answer hit max_gen_toks, `rf_eval.tasks.common.cap_hit`), `copyable_share` (`rf_eval.stats.copyable`)
ITEM_FIELDS = ("cap_hits", "copyable_share")
ITEM_COLUMNS = (
    "arm", "task", "filter", "doc_id", "metric", "primary", "doc_hash", "prompt_hash", "target_hash", "higher_is_better",
    "unit", "score", "length", "domain", "subtask", *ITEM_FIELDS, *COST_FIELDS,
)  # fmt: skip
SUBTASK_KEY = "ruler_task"


@dataclass(frozen=True)
class ArmRun:
    """One arm: its name, what ran, when it (and each task) started, the files that configured it."""

    name: str
    model: str
    model_args: dict[str, str]
    started: datetime
    results_files: tuple[str, ...]
    config_hashes: frozenset[str]
    #: the per-sample logs its items were read from
    samples_files: tuple[str, ...] = ()
    task_started: dict[str, datetime] = field(default_factory=dict)
    #: ledger heads ({path, hash, count}) the arm's runs recorded (`config.rf_eval.ledger`)
    ledger_heads: tuple[dict[str, Any], ...] = ()
    #: the engine floor its adapter measured at start (`rf_eval.engine_floor`), None when not recorded
    engine_floor: dict[str, Any] | None = None
    #: what identifies its model: `pretrained`, `num_parameters`, `weights_sha256` (None where not recorded)
    model_identity: dict[str, Any] = field(default_factory=dict)
    #: per task, the config fields of `rf_eval.stats.provenance.PROTOCOL_FIELDS` its run recorded
    task_protocol: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per task, (items, cap hits) over every item its run scored (`rf_eval.stats.cap_hits.results_totals`)
    cap_hits: dict[str, tuple[int, int]] = field(default_factory=dict)

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
        if path.is_file() and path.suffix == ".json":  # also `--output_path NAME.json` runs
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
        date_id=path.stem.rsplit("_", 1)[-1],  # results_<date>.json, or <name>_<date>.json
        started=float(started),
        model=str(config.get("model") or data.get("model_name") or "model"),
        model_args=parse_model_args(config.get("model_args")),
        data=data,
    )


def _metric_order(task_config: dict[str, Any], samples: list[dict[str, Any]]) -> list[str]:
    names = [m.get("metric") for m in task_config.get("metric_list") or [] if isinstance(m, dict)]
    for sample in samples:
        names += [n for n in sample.get("metrics") or [] if n not in names]
    return [str(n) for i, n in enumerate(names) if isinstance(n, str) and n not in names[:i]]


def _ruler_score(sample: dict[str, Any], names: list[str]) -> tuple[float, int] | None:
    """RULER's per-length metrics (named by length, -1 elsewhere): (score, length) or None."""
    for name in names:
        value = number(sample.get(name))
        if value is not None and value != -1:
            return value, int(name)
    return None


def _read_samples(path: Path) -> list[dict[str, Any]]:
    samples = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
                sample["doc_id"] = int(sample["doc_id"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise RunFormatError(f"{path}:{number}: not an lm-eval sample line") from None
            samples.append(sample)
    return samples


def _subtask(sample: dict[str, Any], doc: dict[str, Any]) -> str | None:
    value = doc.get(SUBTASK_KEY, sample.get(SUBTASK_KEY))
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def _sample_rows(
    rf: _ResultsFile, task: str, samples_path: Path, requested: Sequence[str], notes: list[str]
) -> Iterable[dict[str, Any]]:
    samples = _read_samples(samples_path)
    task_config = rf.data["configs"].get(task) or {}
    names = _metric_order(task_config, samples)
    tail = (task_config.get("metadata") or {}).get("tail") or rf.model_args.get("tail")
    if tail is not None:
        samples = [{"tail": tail, **s} for s in samples]
    metrics = task_metrics(names, samples, requested, f"{task} ({samples_path.name})", task, notes,
                            task_config.get("metadata"))
    hib = (rf.data.get("higher_is_better") or {}).get(task) or {}
    for sample in samples:
        doc = sample.get("doc") if isinstance(sample.get("doc"), dict) else {}
        domain = doc.get("domain")
        base = {
            "task": task,
            "filter": str(sample.get("filter") or "none"),
            "doc_id": sample["doc_id"],
            "doc_hash": str(sample.get("doc_hash") or ""),
            "prompt_hash": str(sample.get("prompt_hash") or ""),
            "target_hash": str(sample.get("target_hash") or ""),
            "length": doc_length(doc),
            "domain": str(domain) if isinstance(domain, (str, int)) else None,
            "subtask": _subtask(sample, doc),
            **{k: number(sample.get(k)) for k in (*ITEM_FIELDS, *COST_FIELDS)},
        }
        for i, metric in enumerate(metrics):
            if metric == RULER_SCORE:
                scored = _ruler_score(sample, names)
                if scored is None:
                    continue
                value, length = scored
                row = {**base, "length": length, "higher_is_better": True}
            else:
                value = number(sample.get(metric))
                if value is None:  # the metric does not apply to this item (e.g. a needle in the tail)
                    continue
                row = {**base, "higher_is_better": bool(hib.get(metric, True))}
            yield {**row, "metric": metric, "primary": i == 0, "score": value}


def _to_points(items: pd.DataFrame) -> pd.DataFrame:
    """Accuracy-like metrics (higher is better, in [0, 1] for every arm) to points; losses in nats, others raw."""
    items = items.copy()
    items["unit"] = ["nats" if is_loss_metric(*mh) else "raw" for mh in zip(items["metric"], items["higher_is_better"])]
    for _, idx in items.groupby(["task", "filter", "metric"], sort=False).groups.items():
        block = items.loc[idx]
        if block["higher_is_better"].all() and block["score"].between(0.0, 1.0).all():
            items.loc[idx, "score"] = block["score"] * 100.0
            items.loc[idx, "unit"] = "points"
    return items


def _arm_rows(name: str, used: list[tuple[str, _ResultsFile]], metrics: Mapping[str, Sequence[str]],
              allow_empty: bool, notes: list[str]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """One arm's item rows from each task's samples log, the logs read, the unsealed ones (notes: `notes`)."""
    rows: list[dict[str, Any]] = []
    samples_files: list[str] = []
    unsealed: list[str] = []
    for task, rf in used:
        samples = rf.path.parent / f"samples_{task}_{rf.date_id}.jsonl"
        if not check_seal(samples, rf.date_id) and samples.is_file():  # a changed sealed file is refused
            unsealed.append(samples.name)
        if not samples.is_file():
            notes.append(f"{name}: no per-sample log for {task} in {rf.path.parent} (use --log_samples)")
            continue
        requested = metrics.get(task, ())
        samples_files.append(str(samples))
        try:
            found: list[str] = []
            rows += [{"arm": name, **row} for row in _sample_rows(rf, task, samples, requested, found)]
            notes += [f"{name}: {note}" for note in found]
        except EmptyMetricError as err:
            if not allow_empty:
                raise
            notes.append(f"{name}: {task} left out (--allow-empty): {err}")
    return rows, samples_files, unsealed


def _arm_run(name: str, key: tuple[str, str], used: list[tuple[str, _ResultsFile]],
             samples_files: list[str]) -> ArmRun:
    """The arm `name` from the runs it `used` (task, results file) and the per-sample logs read."""
    files = list(dict.fromkeys(rf for _, rf in used))
    return ArmRun(
        name=name, model=key[0], model_args=json.loads(key[1]),
        started=datetime.fromtimestamp(min(rf.started for rf in files), tz=timezone.utc),
        results_files=tuple(str(rf.path) for rf in files), config_hashes=config_hashes(files),
        samples_files=tuple(samples_files),
        task_started={t: datetime.fromtimestamp(rf.started, tz=timezone.utc) for t, rf in used},
        ledger_heads=tuple(h for h in (ledger_head(rf) for rf in files) if h is not None),
        engine_floor=engine_floor(files), model_identity=model_identity(name, files),
        task_protocol={t: task_protocol(rf, t) for t, rf in used},
        cap_hits={t: n for t, rf in used if (n := results_totals(rf.data, t)) is not None},
    )


def load_runs(
    paths: Sequence[str | Path], *, metrics: Mapping[str, Sequence[str]] | None = None, allow_empty: bool = False,
    allow_unsealed: bool = False,
) -> Runs:
    """Load every lm-eval run under `paths` (folders or results files) into `Runs`.

    `metrics` maps a task to the metrics to report (the first is its primary
    one); other tasks report their first metric, which must have per-item
    values (else `EmptyMetricError`; with `allow_empty` the task is left out
    with a note).
    """
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
    ran = sorted({task for _key, task in chosen})
    absent = [task for task in (metrics or {}) if task not in ran]
    if absent:
        raise RunFormatError(f"--metric names task(s) {', '.join(map(repr, absent))} that no run has; the runs' "
                             f"tasks: {', '.join(ran)}")
    config = {key: rf.data.get("config") for key, rf in zip(keys, results)}  # the resolved arm, for its name
    names = name_arms([k[0] for k in arm_keys], [naming_args(json.loads(k[1]), config[k]) for k in arm_keys])
    rows: list[dict[str, Any]] = []
    arms: list[ArmRun] = []
    for key, name in zip(arm_keys, names):
        used = [(task, rf) for (k, task), rf in chosen.items() if k == key]
        arm_rows, samples_files, unsealed = _arm_rows(name, used, metrics or {}, allow_empty, notes)
        if not arm_rows:
            notes.append(f"{name}: no per-item results found; the arm is left out")
            continue
        if unsealed:
            notes.append(unsealed_note(name, key[0], unsealed, allow_unsealed))
        rows += arm_rows
        arms.append(_arm_run(name, key, used, samples_files))
    if not rows:
        raise RunFormatError("no per-item results in any run (run lm_eval with --log_samples)")
    name_of = dict(zip(arm_keys, names))
    notes += scored_text_notes({(name_of[key], task): rf for (key, task), rf in chosen.items()})
    frame = pd.DataFrame(rows, columns=[c for c in ITEM_COLUMNS if c != "unit"])
    frame["length"] = pd.Series([r["length"] for r in rows], dtype=object, index=frame.index)  # ints stay ints
    items = _to_points(frame)
    return Runs(items=items[list(ITEM_COLUMNS)], arms=tuple(arms), notes=tuple(notes))
