"""Shared fixtures: tiny random models of each family, built once per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (pyproject's addopts: one worker per core), each worker and the processes it starts
# get their share of the cores, so that workers do not oversubscribe them with torch threads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
# Measured: the quick demo's arms took 2.5-3 min each instead of 52 s when its 2-thread torch shared the
# cores with the other worker; its README table comes out the same on one thread.
# MKL's count likewise, so that the commands a test starts with the adapters' one-thread environment
# (adapter_helpers.cli_env) find the worker's warm starter instead of starting one of their own.
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
# scikit-learn sets these two at its import (a test's in-process lm-eval scorer imports it) and the commands a
# test starts afterwards inherit them: set as it sets them before any command starts, so that the warm
# starters' environment (tests/warm_start.py, where KMP_ counts as read at import) does not change midway
# (measured: one extra starter per worker, about 12 s each)
os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True")
os.environ.setdefault("KMP_INIT_AT_FORK", "FALSE")
# Every `lm_eval` process the tests start (dozens) reads lm-eval's task index from one cache instead of
# parsing its ~14,000 YAML files again (10-15 s each here); tests/test_task_index_cache.py checks that the
# cached index equals lm-eval's own build and is rebuilt when a file changes.
if "RF_EVAL_TASK_INDEX_CACHE" not in os.environ:
    import tempfile

    os.environ["RF_EVAL_TASK_INDEX_CACHE"] = tempfile.mkdtemp(prefix="rf-eval-task-index-")
# and generate each RULER setting once (rf_eval.tasks.ruler_cache, as a study's arms share one), in a folder
# of this run's: the task tests that check the generator itself switch it off (tests/tasks/conftest.py)
if "RF_EVAL_RULER_CACHE" not in os.environ:
    import tempfile

    os.environ["RF_EVAL_RULER_CACHE"] = tempfile.mkdtemp(prefix="rf-eval-ruler-samples-")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """`tiny_model_dir(family)` -> path of a tiny model folder (built once per family)."""
    from rf_eval.testing import make_tiny_model

    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            built[family] = str(make_tiny_model(family, tmp_path_factory.mktemp(f"tiny_{family}")))
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    """`tiny_model(family)` -> (model, tokenizer), fp32, eval mode, loaded once per family."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded: dict = {}

    def get(family: str):
        if family not in loaded:
            path = tiny_model_dir(family)
            model = AutoModelForCausalLM.from_pretrained(path).eval()
            loaded[family] = (model, AutoTokenizer.from_pretrained(path))
        return loaded[family]

    return get


@pytest.fixture
def one_torch_thread():
    """Run a test on one torch thread (tiny models only contend with themselves on more)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def run_in_gloo_processes():
    """`run(argv, world=2)`: `python -m rf_eval *argv` as `world` torch.distributed (gloo) processes.

    Asserts every process exits 0 and returns their outputs.
    """
    import socket
    import subprocess
    import sys

    def run(argv: list[str], world: int = 2) -> list[str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, "-m", "rf_eval", *argv], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outputs
        return outputs

    return run


#: (module, the folder after whose tests it runs). The demo quality tests read the demo maps that the
#: quick demo test's run fits (one process fits, the others wait: rf_eval.demo.cache_lock); after the
#: adapter tests, their worker has done other modules meanwhile instead of waiting minutes on the lock.
#: The README blocks (one module, 3-4 minutes, last in file order) start right after the demo folder on
#: the other worker: at the end, they kept one worker busy for 3 minutes while the other sat idle.
RUN_AFTER = {"tests/test_readme.py": "tests/demo/", "tests/demo/test_quality.py": "tests/model_adapters/"}


def pytest_collection_modifyitems(config, items):
    """Move each RUN_AFTER module behind its folder's tests; every xdist worker collects the same order."""
    for module, after in RUN_AFTER.items():
        moved = [item for item in items if item.nodeid.split("::")[0] == module]
        if not moved:
            continue
        rest = [item for item in items if item.nodeid.split("::")[0] != module]
        anchors = [i for i, item in enumerate(rest) if item.nodeid.startswith(after)]
        at = anchors[-1] + 1 if anchors else len(rest)
        items[:] = rest[:at] + moved + rest[at:]
