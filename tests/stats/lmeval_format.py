"""Write lm-eval 0.4.13 output folders (results JSON + --log_samples JSONL) without running lm-eval.

The layout and fields are the ones lm-eval's evaluator and EvaluationTracker
write (checked against real runs in tests/reports): OUT/<model_name_sanitized>/
results_<date_id>.json and samples_<task>_<date_id>.jsonl, with doc_hash =
sha256 of the doc as indented JSON, prompt_hash = sha256 of the first
request's context and target_hash = sha256 of the target.

Loaded by path from the conftest files of tests/stats and tests/reports.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sample_line(
    doc_id: int, doc: dict, prompt: str, target: str, metrics: Mapping[str, Any], *, filter_key: str = "none", extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One --log_samples line, as lm-eval writes it for a generate_until task."""
    line = {
        "doc_id": doc_id,
        "doc": doc,
        "target": str(target),
        "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": {"until": ["\n"]}}},
        "resps": [["lol"]],
        "filtered_resps": ["lol"],
        "filter": filter_key,
        "metrics": list(metrics),
        "doc_hash": _sha(json.dumps(doc, indent=2, ensure_ascii=False)),
        "prompt_hash": _sha(prompt),
        "target_hash": _sha(str(target)),
    }
    line.update(metrics)
    line.update(extra or {})
    return line


def write_run(
    out: str | Path,
    *,
    model_args: Mapping[str, Any],
    tasks: Mapping[str, Sequence[dict[str, Any]]],
    model: str = "hf",
    higher_is_better: Mapping[str, Mapping[str, bool]] | None = None,
    started: float = 1_790_000_000.0,
    config_extra: Mapping[str, Any] | None = None,
    task_extra: Mapping[str, Any] | None = None,
    version: float = 1.0,
) -> Path:
    """Write one run: `tasks` maps a task name to its sample lines (see `sample_line`).

    Returns the results file. The model folder is named from `pretrained` like lm-eval does.
    `config_extra` joins the results' `config` (what the model's get_model_info adds),
    `task_extra` every task's config; `version` is every task's version.
    """
    date_id = datetime.fromtimestamp(started, tz=timezone.utc).isoformat().replace(":", "-").replace("+00-00", "")
    name = str(model_args.get("pretrained", "model"))
    folder = Path(out) / re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)
    folder.mkdir(parents=True, exist_ok=True)
    hib = dict(higher_is_better or {})
    configs, results = {}, {}
    for task, samples in tasks.items():
        metrics = list(samples[0]["metrics"]) if samples else ["acc"]
        hib.setdefault(task, {m: True for m in metrics})
        configs[task] = {
            "task": task,
            "output_type": "generate_until",
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": hib[task][m]} for m in metrics],
            "metadata": {"version": version},
            **(task_extra or {}),
        }
        results[task] = {"alias": task, **{f"{m},none": 0.0 for m in metrics}}
        if any("cap_hits" in s for s in samples):  # lm-eval sums the samples' flags (the task's `sum` metric)
            results[task]["cap_hits,none"] = float(sum(s.get("cap_hits") or 0 for s in samples))
        with open(folder / f"samples_{task}_{date_id}.jsonl", "w", encoding="utf-8") as fh:
            for s in samples:
                fh.write(json.dumps(s, ensure_ascii=False) + "\n")
    data = {
        "results": results,
        "group_subtasks": {},
        "configs": configs,
        "versions": {t: version for t in tasks},
        "n-shot": {t: 0 for t in tasks},
        "higher_is_better": hib,
        "n-samples": {t: {"original": len(s), "effective": len(s)} for t, s in tasks.items()},
        "config": {"model": model, "model_args": dict(model_args), "batch_size": 1, "random_seed": 0,
                   **(config_extra or {})},
        "git_hash": None,
        "date": started,
        "task_hashes": {},
        "model_source": model,
        "model_name": name,
        "model_name_sanitized": folder.name,
        "lm_eval_version": "0.4.13",
        "total_evaluation_time_seconds": "1.0",
    }
    path = folder / f"results_{date_id}.json"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def accuracy_run(
    out: str | Path,
    arm: str,
    correct: Mapping[str, Sequence[bool]],
    *,
    lengths: Sequence[int] | None = None,
    started: float = 1_790_000_000.0,
    timings: Sequence[float] | None = None,
    ceiling: float | None = None,
    budget: float | None = None,
    prompt_suffix: str = "",
    target_suffix: str = "",
    model_args: Mapping[str, Any] | None = None,
    **run_extra: Any,
) -> Path:
    """A run of RULER-style tasks (metrics named by length, -1 elsewhere) or plain `acc` tasks.

    `correct[task][i]` is item i's outcome (None, with `lengths`: not scored); with `lengths`, item i has length
    lengths[i % len(lengths)] and RULER's per-length metrics. `model_args` join
    the arm's; `run_extra` goes to `write_run` (config_extra, task_extra, version). `ceiling`: each item's
    MAC speedup over exact (its cost fields, as rf-eval's tasks write them); `budget`: the arm's budget, in its
    items and model_args.
    """
    tasks = {}
    for task, outcomes in correct.items():
        lines = []
        for i, ok in enumerate(outcomes):
            doc = {"index": i, "input": f"{task} haystack {i}", "outputs": [str(1000 + i)]}
            if lengths:
                length = lengths[i % len(lengths)]
                doc["max_length"] = length
                metrics = {str(n): -1.0 for n in sorted(set(lengths))}
                if ok is not None:  # None: an item the arm does not score (a needle in its exact tail)
                    metrics[str(length)] = 1.0 if ok else 0.0
            else:
                metrics = {"acc": 1.0 if ok else 0.0}
            extra = {}
            if timings is not None:
                extra["prefill_seconds"] = timings[i % len(timings)] * (1 + (doc.get("max_length", 1) / 4096))
            if ceiling is not None:  # the cost fields rf-eval's tasks write (`rf_eval.cost.prefill_cost`)
                exact = 1_000 * doc.get("max_length", 1000)
                extra.update(exact_macs=exact, prefill_macs=exact / ceiling, macs_fraction=1 / ceiling,
                             mac_speedup=ceiling)
            if budget is not None:
                extra["budget"] = budget
            prompt = f"{doc['input']}\nWhat is the number?{prompt_suffix}"
            lines.append(sample_line(i, doc, prompt, doc["outputs"][0] + target_suffix, metrics, extra=extra))
        tasks[task] = lines
    args = {"pretrained": "/models/tiny", "fill": arm, "split": 12, **(model_args or {})}
    if budget is not None:
        args["budget"] = budget
    return write_run(out, model_args=args, tasks=tasks, started=started, **run_extra)


def pooled_ruler_run(
    out: str | Path,
    arm: str,
    outcomes: Mapping[tuple[str, int], Sequence[bool]],
    *,
    started: float = 1_790_000_000.0,
    model_args: Mapping[str, Any] | None = None,
) -> Path:
    """A `ruler_filled` run as rf-eval's pooled task logs it: one lm-eval task, each doc carrying its
    `ruler_task` and `max_length`, every sample filled; `outcomes[(ruler_task, length)][i]` is the i-th
    sample of that cell (the docs interleave the cells, as `balanced_order` does)."""
    cells = list(outcomes)
    rows = [(cell, i) for i in range(max(len(v) for v in outcomes.values())) for cell in cells if i < len(outcomes[cell])]
    lines = []
    for doc_id, ((task, length), i) in enumerate(rows):
        doc = {"index": i, "input": f"{task} haystack {length} {i}", "outputs": [str(1000 + i)],
               "max_length": length, "ruler_task": task}
        score = 1.0 if outcomes[(task, length)][i] else 0.0
        metrics = {"acc_filled": score, "acc_all": score, "n_filled": 1, "n_excluded": 0, "filled": 1,
                   f"acc_filled_{task}": score}
        lines.append(sample_line(doc_id, doc, doc["input"] + "\nWhat is the number?", doc["outputs"][0], metrics))
    args = {"pretrained": "/models/tiny", "fill": arm, "split": 12, **(model_args or {})}
    return write_run(out, model_args=args, tasks={"ruler_filled": lines}, started=started)


def keytoken_run(
    out: str | Path,
    arm: str,
    docs: Sequence[Mapping[str, Any]],
    *,
    started: float = 1_790_000_000.0,
    task_extra: Mapping[str, Any] | None = None,
) -> Path:
    """A `keytoken_nll` run as rf-eval's task logs it: `docs[i]` holds document i's `domain` and its
    per-document metrics (nll_all, nll_novel, nll_key, kl, ...; None where one does not apply);
    `task_extra` joins the task's config (e.g. its `metadata`); a `copyable_share` in any doc is logged too."""
    names = ("nll_all", "nll_novel", "nll_key", "dnll_all", "dnll_novel", "dnll_key", "kl", "top1_agree", "n_tokens")
    names += ("copyable_share",) if any("copyable_share" in d for d in docs) else ()  # recorded since issue #42
    lines = []
    for i, d in enumerate(docs):
        doc = {"doc_id": f"doc{i}", "domain": d.get("domain", ""), "text": f"document {i}"}
        metrics = {name: d.get(name) for name in names}
        lines.append(sample_line(i, doc, "", "", metrics))
    hib = {name: name in ("top1_agree", "n_tokens") for name in names}
    return write_run(out, model_args={"pretrained": "/models/tiny", "fill": arm, "split": 12},
                     tasks={"keytoken_nll": lines}, higher_is_better={"keytoken_nll": hib}, started=started,
                     task_extra=task_extra)
