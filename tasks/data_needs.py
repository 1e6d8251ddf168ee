"""Which rf-eval task needs which downloaded data, and the check that refuses a run lacking it before the
model loads (`preflight`, wired into lm-eval's `simple_evaluate` by `check_before_model`). Each piece says
which tasks need it (`rf_eval.tasks.data_sources`); where the pieces are: `rf_eval.tasks.data`."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError
from rf_eval.harness import run_context
from rf_eval.integrity.seal import rf_eval_models
from rf_eval.tasks import task_dir
from rf_eval.tasks.common import filled_tail
from rf_eval.tasks.data import (
    DATA_ENV,
    DATA_OPTION,
    SOURCES,
    TaskDataMissing,
    available,
    data_dir,
    local_copy,
    missing_message,
    why_missing,
)
from rf_eval.tasks.positions import as_lengths, check_lengths_fit, refuse_unfilled
from rf_eval.tasks.request_types import adapter_only_problems
from rf_eval.tasks.second_question import BASE_TASK

DOCS_TASKS = ("keytoken_nll", "decode_agreement")  # the tasks that read the user's own documents (`docs`)


def class_name(config: dict[str, Any]) -> str:
    """A task config's class (the last part of its `class`; "" for a plain YAML task)."""
    return str(config.get("class") or "").rsplit(".", 1)[-1]


def ruler_tasks(config: dict[str, Any]) -> list[str] | None:
    """The RULER tasks a length-sized RULER task (its YAML config) is built on; None for another task."""
    kind = class_name(config)
    if kind == "RulerFilledPool":
        return list(config.get("ruler_tasks") or ())
    if kind == "RulerFilledTask":
        return [config.get("ruler_task") or str(config["task"]).removesuffix("_filled")]
    if kind == "SecondQuestionTask":
        return [BASE_TASK]
    return None


def sources_of(config: dict[str, Any]) -> list[str]:
    """The data sources a task (its YAML config) downloads, in the registry's order."""
    kind, ruler = class_name(config), ruler_tasks(config) or []
    return [name for name, cls in SOURCES.items() if cls().needed_by(kind, ruler)]


def load_task_yaml(path: Path) -> dict[str, Any]:
    """A task YAML as lm-eval reads it, without importing anything: `!function x.y` is the string `x.y`,
    and an `include:`d file's keys come first (then this file's)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    config = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader) or {}
    if not isinstance(config, dict):
        return {}
    include = config.pop("include", None)
    return {**load_task_yaml(path.parent / include), **config} if include else config


def task_configs() -> dict[str, dict[str, Any]]:
    """rf-eval's tasks by name: their YAML configs."""
    configs = {}
    for path in sorted(Path(task_dir()).glob("*/*.yaml")):
        config = load_task_yaml(path)
        if config.get("task"):
            configs[str(config["task"])] = config
    return configs


def needs(tasks: Iterable[str]) -> dict[str, list[str]]:
    """{task: its SOURCES} for the named tasks that are rf-eval's (others, lm-eval's own, are left out)."""
    configs = task_configs()
    return {t: sources_of(configs[t]) for t in tasks if t in configs}



def preflight(tasks: Iterable[str], metadata: dict[str, Any] | None) -> None:
    """Refuse, in one line per task, a run whose rf-eval tasks cannot get their data (see the module doc)."""
    problems, hosts = [], {}
    configs = task_configs()  # every rf-eval task YAML, read once
    ours = [t for t in tasks if t in configs]
    folder = data_dir(metadata)
    if ours and folder is not None and not folder.is_dir():
        named = f"data_dir={folder}" if (metadata or {}).get(DATA_OPTION) else f"{DATA_ENV}={folder}"
        problems.append(f"{named}: no such folder (write one with `rf-eval fetch-data --tasks ... --out DIR`)")
    for task, names in ((t, sources_of(configs[t])) for t in ours):
        for name in names:
            given = local_copy(name, metadata)
            if given is not None and not given.exists():
                problems.append(f"{task}: {SOURCES[name].option}={given} does not exist")
        absent = [n for n in names if not available(n, metadata, hosts)]
        if absent:
            problems.append(missing_message(task, absent, why_missing(absent)))
        if ruler_tasks(configs[task]) is not None:
            problems += check_lengths_fit([task], metadata or {})
        if task in DOCS_TASKS:
            docs = (metadata or {}).get("docs")
            if docs and not Path(str(docs)).expanduser().exists():
                problems.append(f"{task}: docs={docs} does not exist (a folder or file of .txt / .jsonl documents)")
    if problems:
        raise TaskDataMissing(" | ".join(problems))


def check_before_model(evaluator) -> None:
    """Wrap lm-eval's `simple_evaluate` (in module `evaluator`) so that it runs `preflight` on its task
    names and metadata before it loads the model. A failure of this check's own code never stops lm-eval."""
    import functools

    original = evaluator.simple_evaluate
    if getattr(original, "_rf_eval", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def simple_evaluate(*args, **kwargs):
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
            names = [t for t in bound.get("tasks") or () if isinstance(t, str)]
            metadata = _run_metadata(bound)
        except Exception:
            names, metadata = [], {}
        other = bool(names) and isinstance(bound.get("model"), str) and bound["model"] not in rf_eval_models()
        if other and (problems := adapter_only_problems(names, bound["model"])):
            raise UserError(" | ".join(problems))
        if names:
            preflight(names, metadata)
            run_context.expect(names, metadata)  # an rf-eval adapter checks its arm against them before loading
            if other:
                check_filled_region(names, metadata, {})  # another model's run: the tasks' own defaults
        check_run_options(bound if names else {})
        return original(*args, **kwargs)

    simple_evaluate._rf_eval = True
    evaluator.simple_evaluate = simple_evaluate


FILLED_KINDS = ("RulerFilledTask", "RulerFilledPool")  # the tasks that score a filled region (`acc_filled`)


def check_filled_region(tasks: Iterable[str], metadata: dict[str, Any], run: dict[str, Any]) -> None:
    """Refuse (UserError) a run in which a filled task has no item to score: every length within the exact
    tail, so `acc_filled` would be NaN while the run exits 0. `run`: the facts the run's tasks will read
    (`rf_eval.harness.run_context`), known before the weights load: the arm's tail, the model's defaults
    ({} for another lm-eval model). The same rule as the task's own check when it is built (`refuse_unfilled`),
    on the same tail (`filled_tail`); a `subset_tail` is the user's choice and is left alone."""
    if metadata.get("subset_tail") not in (None, ""):
        return
    from lm_eval.tasks.ruler.common_utils import DEFAULT_SEQ_LENGTHS

    configs = task_configs()
    filled = [t for t in tasks if t in configs and class_name(configs[t]) in FILLED_KINDS]
    if not filled:
        return
    given = metadata.get("max_seq_lengths")
    if given in (None, ""):
        given = (run.get("task_defaults") or {}).get("max_seq_lengths") or list(DEFAULT_SEQ_LENGTHS)
    lengths, tail = as_lengths(given), filled_tail(metadata, run)
    given = metadata.get("tail") not in (None, "")
    own = given or bool(run.get("fills_rows"))
    where = ("model_args or --metadata" if given else "the arm's" if own
             else "the default: this method has no tail of its own")
    problems = []
    for task in filled:
        try:
            refuse_unfilled(task, lengths, tail, where, own)
        except UserError as err:
            problems.append(str(err))
    if problems:
        raise UserError(" | ".join(problems))


def check_run_options(bound: dict[str, Any]) -> None:
    """lm_eval options that would fail only after the model loaded, refused now in one line: `--limit` 0 or
    below (lm-eval stops at "did not find any docs"), `--apply_chat_template` with a tokenizer that has no
    chat template (transformers stops at the first prompt)."""
    limit = bound.get("limit")
    if limit is not None and float(limit) <= 0:
        raise UserError(f"--limit {limit} runs no sample; give a count >= 1, a fraction in (0, 1), or leave it out")
    if bound.get("apply_chat_template") in (None, False, ""):
        return
    model_args = bound.get("model_args") or {}
    if isinstance(model_args, str):
        from lm_eval.utils import simple_parse_args_string

        model_args = simple_parse_args_string(model_args)
    name = model_args.get("tokenizer") or model_args.get("pretrained")
    if not isinstance(name, str) or not name or not isinstance(bound.get("apply_chat_template"), bool):
        return  # a named template (--apply_chat_template NAME) or no local tokenizer: left to lm-eval
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name, revision=model_args.get("revision") or "main",
                                                  trust_remote_code=bool(model_args.get("trust_remote_code")))
    except Exception:  # a tokenizer that does not load is the model load's to report
        return
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"--apply_chat_template: the tokenizer of {name} has no chat template; leave out "
                        "--apply_chat_template, or give tokenizer=<a tokenizer with one> in --model_args")


def _run_metadata(bound: dict[str, Any]) -> dict[str, Any]:
    """What a task of this run sees in its metadata: model_args, the task manager's, then --metadata."""
    model_args = bound.get("model_args") or {}
    if isinstance(model_args, str):
        from lm_eval.utils import simple_parse_args_string

        model_args = simple_parse_args_string(model_args)
    manager = getattr(bound.get("task_manager"), "metadata", None) or {}
    return {**dict(model_args), **dict(manager), **dict(bound.get("metadata") or {})}
