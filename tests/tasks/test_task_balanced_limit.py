"""`--limit N` takes the same number of RULER samples of every length (and pooled task) (issue #23 item 5).

lm-eval's RULER generators emit 500 samples of one length, then of the next, so lm-eval's `--limit N`
alone runs the first length only; the paper runs 25 samples per task and length (RidgeFill section 3.2).
The rf-eval RULER tasks order their docs one of each (task, length) in turn; a sample's identity is its
doc's `ruler_task`, `max_length` and `index`.
"""

from __future__ import annotations

from collections import Counter

from rf_eval.tasks import ruler_data
from rf_eval.tasks.ruler_filled import balanced_order

LENGTHS = [1024, 2048]
POOL = ["niah_single_1", "niah_multikey_1", "niah_multivalue", "niah_multiquery"]


def meta(model, task_data, **extra):
    return {"max_seq_lengths": LENGTHS, "essay_haystack": str(task_data["essays"]), "pretrained": model,
            "tail": 190, **extra}


def evaluate(th, task, limit, metadata):
    from lm_eval import simple_evaluate

    out = simple_evaluate(model=th.gold_lm(), tasks=[task], limit=limit, log_samples=True, bootstrap_iters=0,
                          task_manager=th.task_manager(metadata), verbosity="WARNING")
    return out["results"][task], out["samples"][task]


def cell(sample):
    return sample["doc"]["ruler_task"], sample["doc"]["max_length"]


def test_balanced_order_spreads_every_prefix_over_tasks_and_lengths():
    for t in range(1, 5):
        for k in range(1, 4):
            tasks = [f"t{i}" for i in range(t) for _ in range(k) for _ in range(3)]
            lengths = [n for _ in range(t) for n in range(k) for _ in range(3)]
            order = balanced_order(tasks, lengths)
            assert sorted(order) == list(range(len(tasks)))  # a reordering: every sample, once
            for turn in range(3):  # each turn holds every (task, length) cell once
                cells = [(tasks[i], lengths[i]) for i in order[turn * t * k:(turn + 1) * t * k]]
                assert len(set(cells)) == t * k
            first = order[: max(t, k)]  # a prefix shorter than a turn still varies task and length
            assert len({tasks[i] for i in first}) == t and len({lengths[i] for i in first}) == k
    # within a cell the generator's order is kept; a cell left short ends early
    tasks, lengths = ["a"] * 5, [1, 1, 1, 2, 2]
    assert balanced_order(tasks, lengths) == [0, 3, 1, 4, 2]


def test_limit_takes_each_length_alike_in_one_task(tiny_llama, task_data, th):
    res, samples = evaluate(th, "niah_single_1_filled", 4, meta(tiny_llama, task_data))
    assert [cell(s) for s in samples] == [("niah_single_1", 1024), ("niah_single_1", 2048)] * 2
    assert sorted((s["doc"]["max_length"], s["doc"]["index"]) for s in samples) == [
        (1024, 0), (1024, 1), (2048, 0), (2048, 1)]  # the generator's first two samples of each length
    assert [s["doc_id"] for s in samples] == [0, 1, 2, 3]
    # the docs are lm-eval's own samples, only reordered
    generated = ruler_data.generate("niah_single_1", meta(tiny_llama, task_data))["test"]
    own = {(int(r["max_length"]), int(r["index"])): r["input"] for r in generated}
    assert all(s["doc"]["input"] == own[(s["doc"]["max_length"], s["doc"]["index"])] for s in samples)
    for n in LENGTHS:  # the per-length metrics see two samples each
        assert res[f"n_filled_{n},none"] + res[f"n_excluded_{n},none"] == 2


def test_limit_takes_each_task_and_length_alike_in_the_pool(tiny_llama, task_data, th):
    res, samples = evaluate(th, "ruler_filled", 16, meta(tiny_llama, task_data))
    assert Counter(cell(s) for s in samples) == {(t, n): 2 for t in POOL for n in LENGTHS}
    assert len({cell(s) for s in samples[:8]}) == 8  # the first turn: each task x length once
    assert Counter(s["doc"]["max_length"] for s in samples[:4]) == {1024: 2, 2048: 2}  # a part turn, too
    assert [s["doc"]["ruler_task"] for s in samples[:4]] == POOL
    keys = {(s["doc"]["ruler_task"], s["doc"]["max_length"], s["doc"]["index"]) for s in samples}
    assert len(keys) == 16  # (ruler_task, max_length, index) identifies a sample
    assert sum(res[f"n_filled_{t},none"] for t in POOL) == res["n_filled,none"]


def test_second_question_docs_are_balanced_too(tiny_llama, task_data, th):
    task = th.load_task("ruler_second_question", meta(tiny_llama, task_data))
    docs = list(task.eval_docs)
    assert [(d["ruler_task"], d["max_length"]) for d in docs[:4]] == [("niah_multikey_1", 1024),
                                                                       ("niah_multikey_1", 2048)] * 2
    assert Counter(d["max_length"] for d in docs) == Counter(
        int(r["max_length"]) for r in ruler_data.generate("niah_multikey_1", meta(tiny_llama, task_data))["test"])


def test_demo_samples_take_each_length_alike(tmp_path):
    from rf_eval.demo.study import render_study, settings
    from rf_eval.study.study_file import load_study

    for s in (settings(quick=True), settings(quick=False)):
        study = load_study(render_study(tmp_path, s, tmp_path / "model", tmp_path / "maps", tmp_path / "docs", 0.7))
        for task in s.ruler_tasks:
            ids = study.samples[task]
            # balanced order: position p is length p mod k, so n turns are n samples of each length
            assert Counter(i % len(s.lengths) for i in ids) == {j: s.samples_per_length for j in range(len(s.lengths))}

