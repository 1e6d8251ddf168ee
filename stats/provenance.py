"""What an arm's results files record about where they came from: the model's identity (weights
fingerprint), each task's protocol, the engine floor, the ledger entry they point at, and the hashes of the
files their model_args name (`rf_eval.stats.runs` reads the files; `rf_eval.stats.comparable` compares
arms by these)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rf_eval.integrity.hashing import file_sha256
from rf_eval.integrity.seal import PREFIX as SEAL_PREFIX

#: task config fields that change how a document is scored without changing its prompt (`rf_eval.stats.comparable`)
PROTOCOL_FIELDS = ("output_type", "metric_list", "generation_kwargs", "filter_list", "process_results", "repeats",
                   "num_fewshot", "version")  # fmt: skip


class RunFormatError(ValueError):
    """A path holds no lm-eval output, or the output is not in the expected format."""


class EmptyMetricError(RunFormatError):
    """A task's primary metric has no value on any item (e.g. no RULER item was filled)."""


#: files hashed for registration matching: model_args paths and small non-lm-eval files in a run folder
MAX_HASHED_BYTES = 64 * 2**20


def engine_floor(files: Sequence[Any]) -> dict[str, Any] | None:
    """The latest `config.rf_eval.engine_floor` among an arm's results files (None: none recorded)."""
    for rf in sorted(files, key=lambda f: f.started, reverse=True):
        info = (rf.data.get("config") or {}).get("rf_eval")
        if isinstance(info, dict) and isinstance(info.get("engine_floor"), dict):
            return info["engine_floor"]
    return None


def config_hashes(files: Sequence[Any]) -> frozenset[str]:
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
            if p.is_file() and not p.name.startswith(("results_", "samples_", SEAL_PREFIX)):  # lm-eval's and the seal
                candidates.add(p.resolve())
    return frozenset(file_sha256(p) for p in candidates if p.stat().st_size <= MAX_HASHED_BYTES)


def model_identity(name: str, files: Sequence[Any]) -> dict[str, Any]:
    """The arm's model as its results record it; one arm's runs on two different weights are refused."""
    seen: dict[str, Path] = {}
    identity: dict[str, Any] = {}
    for rf in files:
        config = rf.data.get("config") or {}
        info = config.get("rf_eval") if isinstance(config.get("rf_eval"), dict) else {}
        weights = info.get("weights_sha256")
        if weights:
            seen.setdefault(str(weights), rf.path)
        identity = {"pretrained": rf.model_args.get("pretrained"), "num_parameters": config.get("model_num_parameters"),
                    "weights_sha256": weights or identity.get("weights_sha256")}
    if len(seen) > 1:
        (a, pa), (b, pb) = list(seen.items())[:2]
        raise RunFormatError(f"arm {name}: its runs were made on different weights with the same model_args "
                             f"({pa}: fingerprint {a[:12]}..., {pb}: {b[:12]}...); keep the runs of one model only")
    return identity


def task_protocol(rf: Any, task: str) -> dict[str, Any]:
    config = rf.data["configs"].get(task) or {}
    return {name: (rf.data.get("versions") or {}).get(task) if name == "version" else config.get(name)
            for name in PROTOCOL_FIELDS}


def ledger_head(rf: Any) -> dict[str, Any] | None:
    info = (rf.data.get("config") or {}).get("rf_eval")
    head = info.get("ledger") if isinstance(info, dict) else None
    return {**head, "results": str(rf.path)} if isinstance(head, dict) and head.get("hash") else None


def scored_text_notes(runs: Mapping[tuple[str, str], Any]) -> list[str]:
    """What text each loss task scored (its metadata `scored_text`, e.g. keytoken_nll's: under each model's
    own tokenizer or one shared one): one note per task when every arm agrees, else one per arm."""
    texts: dict[str, dict[str, str]] = {}
    for (arm, task), rf in runs.items():
        text = ((rf.data["configs"].get(task) or {}).get("metadata") or {}).get("scored_text")
        if text:
            texts.setdefault(task, {})[arm] = str(text)
    notes = []
    for task, by_arm in texts.items():
        if len(set(by_arm.values())) == 1:
            notes.append(f"{task}: scored on {next(iter(by_arm.values()))}")
        else:
            notes += [f"{task}: {arm} scored on {text}" for arm, text in by_arm.items()]
    return notes
