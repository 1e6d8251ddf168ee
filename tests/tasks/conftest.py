"""Fixtures of the task tests: project-written data, the tiny model, helpers (`th`)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"rf_eval_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fixtures = _load("task_fixtures")
helpers = _load("task_helpers")


@pytest.fixture(autouse=True)
def no_run_model():
    """Each test starts with no published adapter (`rf_eval.harness.run_context`): a model an earlier
    test built, still alive, must not give its tail or tokenizer to this test's tasks."""
    from rf_eval.harness import run_context

    run_context.clear()
    yield
    run_context.clear()


@pytest.fixture(autouse=True)
def fresh_ruler_samples(monkeypatch):
    """The task tests check lm-eval's generator and rf-eval's seeding around it: each generates its samples
    itself, never reading another test's from the RULER samples cache (tests/tasks/test_ruler_cache.py
    switches the cache on where it tests it)."""
    monkeypatch.setenv("RF_EVAL_RULER_CACHE", "off")


@pytest.fixture(scope="session")
def th():
    """The helper module (task loading, the lm_eval command line)."""
    return helpers


@pytest.fixture(scope="session")
def fx():
    """The fixture-data writers (task_fixtures.py)."""
    return fixtures


@pytest.fixture(scope="session")
def task_data(tmp_path_factory) -> dict[str, Path]:
    """Essay haystack, nltk punkt params (set on NLTK_DATA), long documents, LongBench v2 items."""
    root = tmp_path_factory.mktemp("task_data")
    nltk_root = fixtures.write_punkt(root / "nltk")
    os.environ["NLTK_DATA"] = str(nltk_root)
    import nltk

    if str(nltk_root) not in nltk.data.path:
        nltk.data.path.insert(0, str(nltk_root))
    return {
        "essays": fixtures.write_essays(root / "essays"),
        "nltk": nltk_root,
        "docs": fixtures.write_documents(root / "docs", [1000, 700, 1100]),
        "longbench": fixtures.write_longbench(root / "longbench.json", n=3),
    }


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dir) -> str:
    return tiny_model_dir("llama")


CLI_TEST_FILE = "test_task_zz_cli.py"


def cli_metadata(task_data) -> dict:
    return {
        "max_seq_lengths": [1024], "tail": 300, "essay_haystack": str(task_data["essays"]),
        "docs": str(task_data["docs"]), "score_tokens": 128, "key_context": 512,
        "data": str(task_data["longbench"]), "cot_tokens": 16, "answer_tokens": 8, "max_prompt_tokens": 1200,
    }


@pytest.fixture(scope="session", autouse=True)
def cli_runs(request, tmp_path_factory, task_data, tiny_model_dir):
    """The two lm_eval CLI runs of the end-to-end tests, started at the session's start so that
    they run beside the in-process tests: `hf` on the generate_until tasks, and `ridgefill`
    (exact arm with its exact reference) on all four protocols."""
    import json

    if not any(CLI_TEST_FILE in item.nodeid for item in request.session.items):
        yield None
        return
    model = tiny_model_dir("llama")
    root = tmp_path_factory.mktemp("cli")
    meta = json.dumps(cli_metadata(task_data))
    common = ["--metadata", meta, "--limit", "2", "--gen_kwargs", "max_gen_toks=16", "--device", "cpu"]
    env = {"NLTK_DATA": str(task_data["nltk"])}
    runs = {
        "hf": (["--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
                "--tasks", "niah_single_1_filled,longbench_v2_cot", *common]),
        "ridgefill": (["--model", "ridgefill", "--model_args",
                       f"pretrained={model},fill=exact,tail=300,reference=exact,device=cpu",
                       "--tasks", "niah_single_1_filled,ruler_second_question,keytoken_nll,longbench_v2_cot",
                       *common]),
    }
    started = {name: (helpers.start_lm_eval(args, root / name, env), root / name) for name, args in runs.items()}
    yield started
    for proc, _ in started.values():
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def no_punkt(monkeypatch, tmp_path):
    """nltk finds no punkt_tab (the session's stand-in, on NLTK_DATA and nltk's path, is hidden)."""
    import nltk

    from rf_eval.tasks.data import DATA_ENV

    monkeypatch.delenv("NLTK_DATA", raising=False)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "no-nltk-data")])
    monkeypatch.delenv(DATA_ENV, raising=False)


@pytest.fixture
def stand_in_sources(monkeypatch, fx, tmp_path):
    """The download functions the tasks use, answering from project-written data instead of the network:
    datasets.load_dataset (the essays, LongBench v2), nltk.download (punkt_tab), lm-eval's download_json."""
    import datasets
    import nltk

    from rf_eval.tasks import ruler_data
    from rf_eval.tasks.data_sources.longbench_v2 import LONGBENCH_DATASET

    essays = [p.read_text() for p in sorted(fx.write_essays(tmp_path / "essay_src", n_files=2).glob("*.txt"))]
    items = fx.longbench_items(3)
    calls: list[str] = []

    def load_dataset(name, split=None, **kwargs):
        calls.append(name)
        rows = {"baber/paul_graham_essays": [{"text": t} for t in essays], LONGBENCH_DATASET: items}[name]
        return datasets.Dataset.from_list(rows)

    def download(info_or_id, download_dir=None, quiet=False, raise_on_error=False, **kwargs):
        calls.append(info_or_id)
        fx.write_punkt(Path(download_dir))
        return True

    qa = ruler_data.ruler_module("qa_utils")
    haystack = ruler_data.ruler_module("prepare_niah").get_haystack  # lm-eval caches what it downloaded
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(nltk, "download", download)
    monkeypatch.setattr(qa, "download_json", lambda url: calls.append(url) or {"data": [], "url": url})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    haystack.cache_clear()
    yield {"essays": essays, "items": items, "calls": calls}
    haystack.cache_clear()  # the stand-in essays must not reach a later test
