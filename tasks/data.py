"""The data rf-eval's tasks download, fetched ahead for machines without a network, and checked before a
run loads its model.

Some tasks read data from the network when they are built: the essay-haystack
RULER tasks the Paul Graham essays (lm-eval's `get_haystack`, from the hub)
and nltk's `punkt_tab` sentence model, the RULER QA tasks SQuAD's and
HotpotQA's JSON (lm-eval's `download_json`); `longbench_v2_cot` reads the
LongBench v2 items. On a node without a network (a cluster's compute node)
that fails, and lm-eval builds its tasks only after loading the model.

- `rf-eval fetch-data --tasks ... --out DIR` (`rf_eval.tasks.data_fetch`) downloads what the
  named tasks need into DIR, through the same lm-eval functions the tasks
  call, where the network is reachable, with a `manifest.json` (files,
  sha256, sources, time).
- The tasks read DIR when it is named in `--metadata '{"data_dir": DIR}'` or
  the RF_EVAL_DATA environment variable (`local_copy`). An option naming one
  file (`essay_haystack`, `squad_json`, `hotpotqa_json`, `data`) wins over DIR.
- `preflight(tasks, metadata)` runs before the model loads (rf-eval's
  startup hook calls it at the start of lm-eval's `simple_evaluate`; the
  study runner before its fit): a piece that is neither local nor reachable
  is one `UserError` line naming the fetch command and the local options.
  A piece is reachable when the network is (HF_HUB_OFFLINE unset and the
  source's host answers) or, offline, when the hub's datasets cache holds it.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError

DATA_ENV = "RF_EVAL_DATA"
DATA_OPTION = "data_dir"
MANIFEST = "manifest.json"
LONGBENCH_DATASET = "THUDM/LongBench-v2"  # the dataset of the LongBench v2 paper, one `train` split


class TaskDataMissing(UserError):
    """A task's data is neither local nor downloadable here."""


@dataclass(frozen=True)
class Source:
    """One piece of downloaded data: where it lands in a data folder and how it is fetched there."""

    name: str
    what: str  # in words, for messages
    path: str  # file or folder inside the data folder
    option: str | None  # the metadata key naming a local copy instead
    host: str  # where it downloads from
    fetch: Callable[[Path], None]  # writes `path` under the given folder
    cached: Callable[[], bool] = lambda: False  # offline: whether the tasks' own download finds it cached


# ---- fetchers: the tasks' own download functions, their results written to files


def _ruler(name: str):
    from rf_eval.tasks.ruler_data import ruler_module

    return ruler_module(name)


def _fetch_essays(folder: Path) -> None:
    words = _ruler("prepare_niah").get_haystack(type_haystack="essay")
    # one text file that `ruler_data.essay_haystack` splits back into exactly these words
    write_text(folder / "paul_graham_essays.txt", " ".join(words))


def _essays_cached() -> bool:
    import datasets

    try:
        datasets.load_dataset("baber/paul_graham_essays", split="train")
    except Exception:  # not in the datasets cache (offline), or any hub error
        return False
    return True


def _fetch_punkt(folder: Path) -> None:
    import nltk

    target = folder / "nltk_data"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-nltk-", dir=folder))
    try:
        if not nltk.download("punkt_tab", download_dir=str(tmp), quiet=True, raise_on_error=True):
            raise OSError("nltk could not download punkt_tab")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _punkt_installed() -> bool:
    """Whether nltk finds punkt_tab where it looks (NLTK_DATA, its default folders)."""
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        return False
    return True


def _qa_url(reader: str) -> str:
    """The URL lm-eval's RULER QA reader downloads (its `url` default)."""
    return inspect.signature(getattr(_ruler("qa_utils"), reader)).parameters["url"].default


def _fetch_qa(reader: str, name: str) -> Callable[[Path], None]:
    def fetch(folder: Path) -> None:
        data = _ruler("qa_utils").download_json(_qa_url(reader))
        write_text(folder / name, json.dumps(data))

    return fetch


def _fetch_longbench(folder: Path) -> None:
    import datasets

    items = datasets.load_dataset(LONGBENCH_DATASET, split="train").to_list()
    write_text(folder / "longbench_v2.json", json.dumps(items, ensure_ascii=False))


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("essays", "the Paul Graham essays (RULER's essay haystack)", "paul_graham_essays.txt",
           "essay_haystack", "huggingface.co", _fetch_essays, _essays_cached),
    Source("punkt_tab", "nltk's punkt_tab sentence model", "nltk_data", None, "raw.githubusercontent.com",
           _fetch_punkt),
    Source("squad", "SQuAD v2's dev set (RULER QA)", "squad.json", "squad_json", "rajpurkar.github.io",
           _fetch_qa("read_squad", "squad.json")),
    Source("hotpotqa", "HotpotQA's dev set (RULER QA)", "hotpotqa.json", "hotpotqa_json", "huggingface.co",
           _fetch_qa("read_hotpotqa", "hotpotqa.json")),
    Source("longbench_v2", "the LongBench v2 dataset", "longbench_v2.json", "data", "huggingface.co",
           _fetch_longbench),
)}


# ---- which task needs what


def ruler_sources(base_tasks: Iterable[str]) -> list[str]:
    from rf_eval.tasks.ruler_data import ESSAY_HAYSTACK

    need: list[str] = []
    for task in base_tasks:
        if task in ESSAY_HAYSTACK:
            need += ["essays", "punkt_tab"]
        elif task == "ruler_qa_squad":
            need.append("squad")
        elif task == "ruler_qa_hotpot":
            need.append("hotpotqa")
    return list(dict.fromkeys(need))


def _class_name(config: dict[str, Any]) -> str:
    return str(config.get("class") or "").rsplit(".", 1)[-1]


def sources_of(config: dict[str, Any]) -> list[str]:
    """The SOURCES a task (its YAML config) downloads."""
    kind = _class_name(config)
    if kind == "RulerFilledPool":
        return ruler_sources(config.get("ruler_tasks") or ())
    if kind == "RulerFilledTask":
        return ruler_sources([config.get("ruler_task") or str(config["task"]).removesuffix("_filled")])
    if kind == "SecondQuestionTask":
        from rf_eval.tasks.second_question import BASE_TASK

        return ruler_sources([BASE_TASK])
    if kind == "LongBenchCoTTask":
        return ["longbench_v2"]
    return []


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
    from rf_eval.tasks import task_dir

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


# ---- where a piece is


def data_dir(metadata: dict[str, Any] | None) -> Path | None:
    """The data folder: metadata `data_dir`, else RF_EVAL_DATA, else None."""
    value = (metadata or {}).get(DATA_OPTION) or os.environ.get(DATA_ENV)
    return Path(str(value)).expanduser() if value else None


def local_copy(name: str, metadata: dict[str, Any] | None) -> Path | None:
    """The local copy of source `name`: the file its option names, else the data folder's, else None."""
    source = SOURCES[name]
    given = (metadata or {}).get(source.option) if source.option else None
    if given:
        return Path(str(given)).expanduser()
    folder = data_dir(metadata)
    if folder is not None and (folder / source.path).exists():
        return folder / source.path
    return None


def use_nltk_data(metadata: dict[str, Any] | None) -> None:
    """Put the data folder's `nltk_data` on nltk's search path (first), when it has one."""
    found = local_copy("punkt_tab", metadata)
    if found is not None:
        import nltk

        if str(found) not in nltk.data.path:
            nltk.data.path.insert(0, str(found))


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def reachable(host: str, timeout: float = 5.0) -> bool:
    """Whether https://HOST answers at all (any status), through the environment's proxies."""
    import requests

    try:
        requests.head(f"https://{host}", timeout=timeout)
    except requests.RequestException:
        return False
    return True


def available(name: str, metadata: dict[str, Any] | None, hosts: dict[str, bool] | None = None) -> bool:
    """Whether a run here gets source `name`: a local copy, nltk's own install (punkt_tab), the datasets
    cache when offline, else the network (`hosts` caches the reachability of each host)."""
    source = SOURCES[name]
    if local_copy(name, metadata) is not None:
        return True
    if name == "longbench_v2":  # the task reads a local file only
        return False
    if name == "punkt_tab" and _punkt_installed():
        return True
    if offline():
        return source.cached()
    hosts = {} if hosts is None else hosts
    if source.host not in hosts:
        hosts[source.host] = reachable(source.host)
    return hosts[source.host]


def missing_message(task: str, names: list[str], why: str) -> str:
    """One line: what `task` lacks, why, the fetch command and the local options."""
    what = " and ".join(SOURCES[n].what for n in names)
    options = [f'"{SOURCES[n].option}": "PATH"' for n in names if SOURCES[n].option]
    local = f"; or name a local copy: --metadata '{{{', '.join(options)}}}'" if options else ""
    if "punkt_tab" in names:
        local += "; nltk's punkt_tab can also be put under a folder listed in NLTK_DATA"
    verb = "is" if len(names) == 1 else "are"
    return (f"{task} needs {what}, which {verb} {why}: run `rf-eval fetch-data --tasks {task} --out DIR` where the "
            f"network is reachable, then pass --metadata '{{\"{DATA_OPTION}\": \"DIR\"}}' (or set {DATA_ENV}=DIR)"
            f"{local}")


def why_missing(names: list[str]) -> str:
    if "longbench_v2" in names:
        return "not in a local file here"
    return "not here and cannot be downloaded (" + ("HF_HUB_OFFLINE is set)" if offline() else "no network)")


def preflight(tasks: Iterable[str], metadata: dict[str, Any] | None) -> None:
    """Refuse, in one line per task, a run whose rf-eval tasks cannot get their data (see the module doc)."""
    problems, hosts = [], {}
    for task, names in needs(tasks).items():
        for name in names:
            given = local_copy(name, metadata)
            if given is not None and not given.exists():
                problems.append(f"{task}: {SOURCES[name].option}={given} does not exist")
        absent = [n for n in names if not available(n, metadata, hosts)]
        if absent:
            problems.append(missing_message(task, absent, why_missing(absent)))
        if task in ("keytoken_nll", "decode_agreement"):
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
        if names:
            preflight(names, metadata)
        return original(*args, **kwargs)

    simple_evaluate._rf_eval = True
    evaluator.simple_evaluate = simple_evaluate


def _run_metadata(bound: dict[str, Any]) -> dict[str, Any]:
    """What a task of this run sees in its metadata: model_args, the task manager's, then --metadata."""
    model_args = bound.get("model_args") or {}
    if isinstance(model_args, str):
        from lm_eval.utils import simple_parse_args_string

        model_args = simple_parse_args_string(model_args)
    manager = getattr(bound.get("task_manager"), "metadata", None) or {}
    return {**dict(model_args), **dict(manager), **dict(bound.get("metadata") or {})}
