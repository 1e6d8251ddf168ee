"""What `rf-eval study plan` and `study run` check before anything is registered, fitted or run: every
rf-eval arm's model_args as its adapter checks them, every task name is one lm-eval knows (rf-eval's tasks and the study's `include_path` included), and every arm's
tasks can get their data here (`rf_eval.tasks.data_needs.preflight`). A study that would fail in its third arm
for a misspelled task, or after fitting maps for minutes for a missing essay haystack, fails here in one
message instead. Before `study run` registers anything it also builds the tasks' data (`build_task_data`),
so a generator that fails does too."""

from __future__ import annotations

import difflib
import json
import os
from contextlib import AbstractContextManager
from pathlib import Path

from rf_eval.devices import check_model_source
from rf_eval.errors import UserError
from rf_eval.methods import method_for_arm
from rf_eval.study.launch import CACHE_VARIABLES, environ_set, with_study_caches
from rf_eval.study.plan import maps_split
from rf_eval.study.runner import model_args, task_metadata
from rf_eval.study.spec import ADAPTERS, Study, StudyError
from rf_eval.tasks.data import TaskDataMissing
from rf_eval.tasks.data_needs import preflight


def _study_caches() -> AbstractContextManager[None]:
    """lm-eval's task index and RULER samples read from (and written to) rf-eval's disk caches, as the
    study's own lm_eval processes do."""
    env = with_study_caches(dict(os.environ))
    return environ_set({name: env[name] for name in CACHE_VARIABLES})


def unknown_tasks(study: Study) -> list[str]:
    """The study's task names lm-eval's TaskManager does not know (each with its closest names)."""
    from lm_eval.tasks import TaskManager

    with _study_caches():
        manager = TaskManager(include_path=study.include_path)
    known = manager.all_tasks
    problems = []
    for task in study.tasks:
        if task in known or manager.match_tasks([task]):
            continue
        close = difflib.get_close_matches(task, known, n=3)
        problems.append(f"{task!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return problems


def check_arm_args(study: Study, arm) -> None:
    """An rf-eval arm's model_args, checked by the adapter's rules before loading anything
    (`rf_eval.model_adapters.config.preflight`: keys, method, its arm's fields; a StudyError naming the arm), its
    split against the model's layer count (from its config), its budget against the study's lengths, and the model, source and
    maps paths it names. Maps a study's `fit:` block writes are checked by the arm's own run: they exist
    only later."""
    if arm.model not in ADAPTERS:
        return  # an API model: its own arguments, checked by lm-eval
    from rf_eval.model_adapters.config import preflight

    try:
        args = model_args(study, arm, study.maps or "<maps>")
        spec = preflight(args, arm.model)
        check_paths(args)
        check_split(args["pretrained"], getattr(spec, "split", None))
        if getattr(spec, "budget", None) is not None:
            check_budget(study, arm, args, spec)
    except (UserError, ValueError) as err:
        raise StudyError(f"{study.path.name}: arms.{arm.name}: {err}") from None


def check_budget(study: Study, arm, args: dict, spec, lengths: list[int] | None = None) -> None:
    """A budget the arm meets at every one of `lengths` (the study's lengths by default; without them, every
    length the model takes): its method's `check_budget` raises a `BudgetError` naming the length and the
    cheapest fraction otherwise, before anything runs."""
    chosen = method_for_arm(arm.model, args)
    if chosen is not None:
        chosen[0].check_budget(chosen[1], spec, lengths or list(study.lengths) or None,
                               maps_split=lambda split: maps_split(study, split))


def check_built_budgets(study: Study, arms: list, tasks: dict) -> None:
    """The budgets of `arms` (of one data setting) at the token counts of the prompts the study built: a
    RULER prompt runs shorter than its length (its template and the generation's reserve), so a budget met at
    the length can fail at the prompt, in the arm's own run, after the arms before it ran. A StudyError names
    the arm and the prompts' range."""
    from rf_eval.model_adapters.config import preflight as parse_arm

    budgeted = []
    for arm in arms:
        args = model_args(study, arm, study.maps)
        spec = parse_arm(args, arm.model) if arm.model in ADAPTERS else None
        if getattr(spec, "budget", None) is not None:
            budgeted.append((arm, args, spec))
    try:
        lengths = built_prompt_lengths(study, tasks, budgeted[0][1]) if budgeted else []
    except Exception as err:  # a tokenizer without a chat template, a task's own prompt error: its run's too
        raise StudyError(f"{study.path.name}: arms.{budgeted[0][0].name}: building the study's prompts to check "
                         f"its budget failed: {type(err).__name__}: {err}") from None
    for arm, args, spec in budgeted if lengths else ():
        try:
            check_budget(study, arm, args, spec, lengths)
        except (UserError, ValueError) as err:
            raise StudyError(f"{study.path.name}: arms.{arm.name}: the study's prompts run {lengths[0]:,} to "
                             f"{lengths[-1]:,} tokens: {err}") from None


def built_prompt_lengths(study: Study, tasks: dict, args: dict) -> list[int]:
    """The distinct token counts of the prompts the study's generation and loglikelihood requests give the
    arm's prefill (the context, after the chat template where the study applies it), by the arm's tokenizer;
    other request types (rolling, rf-eval's own) are left to the run."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.get("tokenizer") or args["pretrained"]))

    def chat(history: list, add_generation_prompt: bool = True) -> str:  # `HFLM.apply_chat_template`'s
        return tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=not add_generation_prompt)

    counts = set()
    for name, task in tasks["tasks"].items():
        task.build_all_requests(limit=study.limit, samples=(study.samples or {}).get(name), rank=0, world_size=1,
                                apply_chat_template=study.apply_chat_template, chat_template=chat,
                                tokenizer_name=tokenizer.name_or_path)
        counts |= {len(tokenizer(i.args[0], add_special_tokens=False).input_ids) for i in task.instances
                   if i.request_type in ("generate_until", "loglikelihood")}
    return sorted(counts)


def check_paths(args: dict) -> None:
    """The model and source folders an arm names, and its maps unless the study's `fit:` block writes them
    (`<maps>`, the placeholder `check_arm_args` puts there)."""
    for key in ("pretrained", "source"):
        if args.get(key):
            check_model_source(str(args[key]))
    maps = args.get("maps")
    if maps and maps != "<maps>":
        if not Path(str(maps)).expanduser().exists():
            raise ValueError(f"maps={maps}: no such file or folder (fit them with `rf-eval fit`, or give the "
                             "study a `fit:` block)")


def check_split(pretrained: str, split: int | None) -> None:
    """A split in 1..L-1 of the model's L layers, read from its config; a config not readable here is left
    to the arm's own run, which says why."""
    if split is None:
        return
    from transformers import AutoConfig

    from rf_eval.ridgefill.fitting import check_splits

    try:
        layers = AutoConfig.from_pretrained(pretrained).get_text_config().num_hidden_layers
    except (OSError, ValueError):
        return
    check_splits([split], layers)


def check_study(study: Study) -> None:
    """Refuse (StudyError) a study whose arms' settings are bad, whose tasks lm-eval cannot find or whose
    arms' tasks lack their data."""
    for arm in study.arms.values():
        check_arm_args(study, arm)
    if study.fit is not None:  # the split the `fit:` block fits maps at, against the model's layers
        try:
            check_split(study.pretrained, int(study.fit["split"]))
        except (UserError, ValueError) as err:
            raise StudyError(f"{study.path.name}: fit.split: {err}") from None

    unknown = unknown_tasks(study)
    if unknown:
        where = f", rf-eval's or in include_path {study.include_path}" if study.include_path else " or rf-eval's"
        raise StudyError(f"{study.path.name}: tasks {', '.join(unknown)} are not lm-eval's{where}; "
                         "`lm_eval ls tasks` lists them")
    for arm in study.arms.values():
        metadata = {**model_args(study, arm, study.maps), **task_metadata(study)}  # as the arm's lm_eval gets them
        try:
            preflight(study.tasks, metadata)
        except TaskDataMissing as err:
            raise StudyError(f"arm {arm.name}: {err}") from None


def build_task_data(study: Study) -> int:
    """Build the study's tasks, their samples included, as each arm's lm_eval will; returns the builds run.

    Once per distinct data setting: the study's metadata with an arm's model and tokenizer (lm-eval hands
    the model_args to the tasks, and RULER sizes its samples with the tokenizer), so a study of arms of one
    model builds once. A generator that fails (a tokenizer that does not load, a docs file it cannot read,
    a RULER setting it refuses) is a StudyError naming the arm, before anything is registered or fitted.
    lm-eval keeps no samples between processes; the RULER samples built here are written to rf-eval's
    samples cache (`rf_eval.tasks.ruler_cache`), which the arms read instead of generating them again.
    """
    from lm_eval.tasks import TaskManager

    def data_key(arm) -> str:
        args = model_args(study, arm, study.maps)
        return json.dumps([args.get("pretrained"), args.get("tokenizer"), task_metadata(study)], sort_keys=True,
                          default=str)

    built: set[str] = set()
    for arm in study.arms.values():
        metadata = {**model_args(study, arm, study.maps), **task_metadata(study)}  # the samples the arms read
        key = data_key(arm)
        if key in built:
            continue
        built.add(key)
        with _study_caches():
            manager = TaskManager(include_path=study.include_path, metadata=metadata)
            try:
                tasks = manager.load(list(study.tasks))
            except UserError as err:
                raise StudyError(f"arm {arm.name}: building the data of {', '.join(study.tasks)}: {err}") from None
            except Exception as err:  # lm-eval's and the generators' own errors, of many types
                raise StudyError(f"arm {arm.name}: building the data of {', '.join(study.tasks)} failed: "
                                 f"{type(err).__name__}: {err}") from None
            check_built_budgets(study, [a for a in study.arms.values() if data_key(a) == key], tasks)
    return len(built)
