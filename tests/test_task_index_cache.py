"""The task-index cache returns lm-eval's own index, and rebuilds when any file the index read changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lm_eval.tasks
import pytest
from lm_eval.tasks._index import TaskIndex

from rf_eval.harness import task_index_cache
from rf_eval.harness.task_index_cache import ENV, cached_build, child_env, folder_from_env
from rf_eval.model_adapters.startup import tasks_dir

ORIGINAL = getattr(TaskIndex.build, "__wrapped__", TaskIndex.build)
LM_EVAL_TASKS = Path(lm_eval.tasks.__file__).parent


def _tree(root: Path) -> Path:
    """A task folder whose tasks include a shared file one folder up."""
    (root / "sub").mkdir(parents=True)
    (root / "base.yaml").write_text("output_type: generate_until\ndoc_to_text: q\ntag: [shared]\n")
    (root / "sub" / "a.yaml").write_text("include: ../base.yaml\ntask: task_a\n")
    (root / "sub" / "b.yaml").write_text("include: ../base.yaml\ntask: task_b\n")
    return root


def _counting(calls: list):
    def build(paths, *, resolve_includes=True):
        calls.append(1)
        return ORIGINAL(paths, resolve_includes=resolve_includes)

    return build


def test_a_cached_index_equals_lm_evals_own_build_on_its_real_task_folders(tmp_path):
    roots = [LM_EVAL_TASKS / "ruler", LM_EVAL_TASKS / "mmlu", Path(tasks_dir())]
    fresh = ORIGINAL(roots)
    calls: list = []
    first = cached_build(_counting(calls), tmp_path, roots)
    second = cached_build(_counting(calls), tmp_path, roots)
    assert len(calls) == len(roots)  # one build per root; the second call came from disk
    assert len(fresh) > 100 and first == fresh and second == fresh


@pytest.mark.parametrize("change", ["edit an included file", "add a task file", "remove a task file",
                                    "same size, other content"])
def test_any_change_to_a_file_it_read_or_to_the_listing_rebuilds(tmp_path, change):
    root = _tree(tmp_path / "tasks")
    calls: list = []
    before = cached_build(_counting(calls), tmp_path / "cache", [root])
    assert set(before) >= {"task_a", "task_b", "shared"}
    if change == "edit an included file":
        (root / "base.yaml").write_text("output_type: loglikelihood\ndoc_to_text: q\ntag: [renamed]\n")
    elif change == "add a task file":
        (root / "sub" / "c.yaml").write_text("include: ../base.yaml\ntask: task_c\n")
    elif change == "remove a task file":
        (root / "sub" / "b.yaml").unlink()
    else:  # one letter changed, size and mtime kept: the content is what the cache checks
        path = root / "sub" / "a.yaml"
        st, text = os.stat(path), path.read_text()
        path.write_text(text.replace("task_a", "task_z"))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = cached_build(_counting(calls), tmp_path / "cache", [root])
    assert len(calls) == 2 and after == ORIGINAL([root])
    again = cached_build(_counting(calls), tmp_path / "cache", [root])
    assert len(calls) == 2 and again == after  # and the rebuilt index is cached in turn


def test_a_touched_file_with_its_content_unchanged_is_read_from_the_cache(tmp_path):
    root = _tree(tmp_path / "tasks")
    calls: list = []
    before = cached_build(_counting(calls), tmp_path / "cache", [root])
    st = os.stat(root / "sub" / "a.yaml")
    os.utime(root / "sub" / "a.yaml", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cached_build(_counting(calls), tmp_path / "cache", [root]) == before and len(calls) == 1


def test_roots_merge_as_lm_eval_merges_them_a_later_root_replacing_an_earlier_task(tmp_path):
    first, second = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    (second / "sub" / "a.yaml").write_text("include: ../base.yaml\ntask: task_a\ndoc_to_text: other\n")
    (second / "sub" / "own.yaml").write_text("include: ../base.yaml\ntask: task_own\n")
    calls: list = []
    for roots in ([first, second], [second, first], [first]):  # per-root parts are reused across root lists
        assert cached_build(_counting(calls), tmp_path / "cache", roots) == ORIGINAL(roots)
    assert len(calls) == 2
    assert cached_build(_counting(calls), tmp_path / "cache", [first, second])["task_a"].yaml_path.is_relative_to(second)


def test_a_corrupt_cache_file_is_rebuilt_not_trusted(tmp_path):
    root = _tree(tmp_path / "tasks")
    calls: list = []
    cached_build(_counting(calls), tmp_path / "cache", [root])
    (stored,) = (tmp_path / "cache").glob("*.pickle")
    stored.write_bytes(b"not a pickle")
    assert cached_build(_counting(calls), tmp_path / "cache", [root]) == ORIGINAL([root]) and len(calls) == 2


@pytest.mark.parametrize(("value", "expected"), [("", None), ("off", None), ("0", None), ("/x/y", Path("/x/y"))])
def test_the_switch(monkeypatch, value, expected):
    monkeypatch.setenv(ENV, value)
    assert folder_from_env() == expected
    monkeypatch.delenv(ENV)
    assert folder_from_env() == task_index_cache.default_folder()  # on by default (issue #54, item 3)
    assert child_env({ENV: "off"})[ENV] == "off"  # the user's choice wins
    assert child_env({})[ENV] == str(task_index_cache.default_folder())


def test_the_startup_hook_routes_lm_evals_build_through_the_cache(tmp_path):
    """In a fresh interpreter (as `lm_eval` starts): TaskManager's index comes from the cache on the second start."""
    root = _tree(tmp_path / "tasks")
    code = ("import sys; from lm_eval.tasks import TaskManager; from lm_eval.tasks import _index; "
            f"tm = TaskManager(include_path={str(root)!r}, include_defaults=False); "
            "print(_index.TaskIndex.build.__wrapped__ is not None, 'task_a' in tm.all_tasks)")
    env = dict(os.environ, **{ENV: str(tmp_path / "cache")})
    written = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["True", "True"]
        stored = sorted((tmp_path / "cache").glob("*.pickle"))  # this root and rf-eval's tasks folder
        written.append([(p.stat().st_ino, p.stat().st_mtime_ns) for p in stored])
    assert len(written[0]) == 2 and written[0] == written[1]  # the second start read them, and wrote none
