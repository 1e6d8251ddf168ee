"""What `rf-eval study plan` and `study run` check before anything is registered, fitted or run: every
rf-eval arm's model_args as its adapter checks them, every task name is one lm-eval knows (rf-eval's tasks and the study's `include_path` included), and every arm's
tasks can get their data here (`rf_eval.tasks.data.preflight`). A study that would fail in its third arm
for a misspelled task, or after fitting maps for minutes for a missing essay haystack, fails here in one
message instead."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rf_eval.study.runner import model_args
from rf_eval.study.spec import Study, StudyError


@contextmanager
def _task_index_cache() -> Iterator[None]:
    """lm-eval's task index read from rf-eval's disk cache, as the study's own lm_eval processes do."""
    from rf_eval.task_index_cache import ENV, child_env

    before = os.environ.get(ENV)
    os.environ.update(child_env(dict(os.environ)))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def unknown_tasks(study: Study) -> list[str]:
    """The study's task names lm-eval's TaskManager does not know (each with its closest names)."""
    from lm_eval.tasks import TaskManager

    with _task_index_cache():
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
    """An rf-eval arm's model_args, checked as its adapter checks them before loading anything (keys, fill,
    selector, corrections, tail; a StudyError naming the arm), its split against the model's layer count
    (from its config) and the maps, model and source paths it names. Maps a study's `fit:` block writes
    are checked by the arm's own run: they exist only later."""
    from rf_eval.errors import UserError

    if arm.model == "ridgefill":
        from rf_eval.model_adapters.ridgefill import OWN_KEYS
        from rf_eval.ridgefill.arm_spec import RidgeFillArm as ArmSpec

        needed: tuple[str, ...] = () if arm.args.get("preset") else ("fill",)
    elif arm.model == "rarecache":
        from rf_eval.model_adapters.rarecache import OWN_KEYS
        from rf_eval.rarecache.arm_spec import RaReCacheArm as ArmSpec

        needed = ("pretrained", "source", "maps")
    else:
        return  # an API model: its own arguments, checked by lm-eval
    from rf_eval.model_adapters.config import take_model_args

    try:
        args = model_args(study, arm, study.maps or "<maps>")
        mine, _ = take_model_args(args, OWN_KEYS, needed, model=arm.model)
        spec = ArmSpec.from_fields({k: v for k, v in mine.items() if k in ArmSpec.fields()}, what="args")
        check_paths(args)
        check_split(args["pretrained"], getattr(spec, "split", None))
    except (UserError, ValueError) as err:
        raise StudyError(f"{study.path.name}: arms.{arm.name}: {err}") from None


def check_paths(args: dict) -> None:
    """The model and source folders an arm names, and its maps unless the study's `fit:` block writes them
    (`<maps>`, the placeholder `check_arm_args` puts there)."""
    from rf_eval.devices import check_model_source

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
    from rf_eval.tasks.data import TaskDataMissing, preflight

    for arm in study.arms.values():
        check_arm_args(study, arm)

    unknown = unknown_tasks(study)
    if unknown:
        where = f", rf-eval's or in include_path {study.include_path}" if study.include_path else " or rf-eval's"
        raise StudyError(f"{study.path.name}: tasks {', '.join(unknown)} are not lm-eval's{where}; "
                         "`lm_eval ls tasks` lists them")
    for arm in study.arms.values():
        metadata = {**model_args(study, arm, study.maps), **study.metadata}
        try:
            preflight(study.tasks, metadata)
        except TaskDataMissing as err:
            raise StudyError(f"arm {arm.name}: {err}") from None
