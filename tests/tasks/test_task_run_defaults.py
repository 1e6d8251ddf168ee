"""Defaults the tasks take from the run (issue #18): one tail, the run model's tokenizer,
needles=all, the pooled ruler_filled task, lm-eval's download path for the essay haystack."""

from __future__ import annotations

import pytest

from rf_eval.tasks import ruler_data
from rf_eval.tasks.common import TailMismatch

LENGTHS = [1024]


def meta(model, task_data, **extra):
    return {"max_seq_lengths": LENGTHS, "essay_haystack": str(task_data["essays"]),
            **({"pretrained": model} if model else {}), **extra}


def marks(task, limit=40):
    task.set_fewshot_seed(0)
    task.build_all_requests(limit=limit)
    return {k: (m.filled, m.rows_from_end) for k, m in task._marks.items()}


# -- item 6: one tail default, read from the run ---------------------------------------------------

def test_one_tail_default_shared_by_arm_and_tasks(tiny_llama, task_data, th):
    from rf_eval.engine.plan import DEFAULT_TAIL
    from rf_eval.ridgefill.arm_spec import RidgeFillArm
    from rf_eval.tasks import ruler_filled

    assert DEFAULT_TAIL == RidgeFillArm(fill="identity").tail == ruler_filled.DEFAULT_TAIL == 4096
    task = th.load_task("niah_single_1_filled", meta(tiny_llama, task_data))
    assert task.tail == 4096 and task.config.metadata["tail"] == 4096


def test_task_reads_the_running_arms_tail_and_refuses_a_contradiction(tiny_llama, task_data, th):
    lm = th.ridgefill_class().create_from_arg_string(f"pretrained={tiny_llama},fill=identity,split=2,tail=300,device=cpu")
    task = th.load_task("niah_single_1_filled", meta(tiny_llama, task_data))  # no tail in the metadata
    assert task.tail == 300
    assert task.config.metadata["tail"] == 300  # recorded in the results' task config
    assert th.load_task("niah_single_1_filled", meta(tiny_llama, task_data, tail=300)).tail == 300
    with pytest.raises(TailMismatch, match=r"tail=600 .*contradicts.*tail=300"):
        th.load_task("niah_single_1_filled", meta(tiny_llama, task_data, tail=600))
    # a subset other than the arm's on purpose (a longer-tail control scored on its arms' subset)
    assert th.load_task("niah_single_1_filled", meta(tiny_llama, task_data, subset_tail=600)).tail == 600
    del lm
    # an arm that fills nothing (the exact arm) is scored on the task's subset, whatever its tail
    exact = th.ridgefill_class().create_from_arg_string(f"pretrained={tiny_llama},fill=exact,tail=64,device=cpu")
    assert th.load_task("niah_single_1_filled", meta(tiny_llama, task_data, tail=600)).tail == 600
    del exact


# -- item 9: no pretrained in the run: the adapter's model sizes the samples --------------------------

def test_tasks_use_the_adapters_tokenizer_when_the_run_names_none(tiny_llama, task_data, th):
    with pytest.raises(ruler_data.RulerDataError, match="pretrained="):
        th.load_task("niah_single_1_filled", meta(None, task_data))
    lm = th.ridgefill_class().create_from_arg_string(f"pretrained={tiny_llama},fill=identity,split=2,tail=300,device=cpu")
    task = th.load_task("niah_single_1_filled", meta(None, task_data))
    named = th.load_task("niah_single_1_filled", meta(tiny_llama, task_data))
    assert list(task.eval_docs) == list(named.eval_docs)
    assert task.config.metadata["tokenizer"] == tiny_llama
    assert marks(task, 5) == marks(named, 5)
    del lm


def test_demo_adapter_publishes_the_demo_lengths_and_tail(monkeypatch, tiny_model_dir, tmp_path):
    import importlib.util
    from pathlib import Path

    from rf_eval.demo import model as demo_model
    from rf_eval.demo import study as demo
    from rf_eval.harness import run_context
    from rf_eval.model_adapters import prefill_lm
    path = Path(__file__).parents[1] / "model_adapters" / "adapter_helpers.py"
    spec = importlib.util.spec_from_file_location("rf_eval_tests_adapter_helpers", path)
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    model_dir = tiny_model_dir("llama")
    maps = helpers.identity_maps(model_dir, 3, tmp_path / "maps")
    monkeypatch.setattr(demo_model, "resolve_pretrained", lambda name, log=None: str(model_dir))
    monkeypatch.setattr(demo, "demo_maps", lambda d, s: maps)
    monkeypatch.setattr(demo, "SPLIT", 3)
    lm = prefill_lm.ridgefill(device="cpu")  # `lm_eval --model ridgefill` with no model_args
    facts = run_context.current()
    assert facts["tokenizer"] == model_dir and facts["fills_rows"] and lm.settings.arm.fill == "ridge"
    assert facts["tail"] == demo.settings(quick=False).tail == lm.settings.arm.tail
    assert facts["task_defaults"]["max_seq_lengths"] == list(demo.settings(quick=False).lengths)


def _demo_run(monkeypatch, tiny_model_dir):
    from rf_eval.demo import model as demo_model

    model_dir = tiny_model_dir("llama")
    monkeypatch.setattr(demo_model, "resolve_pretrained", lambda name, log=None: str(model_dir))
    return model_dir


def test_pretrained_demo_sizes_ruler_samples_with_the_resolved_tokenizer(monkeypatch, tiny_model_dir, task_data, th):
    """`--model_args pretrained=demo` reaches the task's metadata as given (lm-eval merges model_args in):
    RULER's samples are built with the tokenizer the run resolved, not a hub id `demo` (issue #54, item 1)."""
    from rf_eval.model_adapters import prefill_lm

    model_dir = _demo_run(monkeypatch, tiny_model_dir)
    lm = prefill_lm.ridgefill(pretrained="demo", fill="exact", device="cpu")
    task = th.load_task("niah_single_1_filled", {**meta(None, task_data), "pretrained": "demo"})
    assert task.config.metadata["tokenizer"] == model_dir
    del lm


@pytest.mark.parametrize("model,args", [("ridgefill", {"fill": "exact"}), ("prefill", {"method": "exact"}),
                                        ("drop", {"method": "gemfilter", "keep": 64})])
def test_every_method_on_the_demo_scores_the_demos_filled_region(monkeypatch, tiny_model_dir, task_data, th,
                                                                  model, args):
    """An arm that fills no rows (exact) or has no tail (a dropper) shares the fills' filled region on the demo
    model: the demo's tail, not the shared 4,096 under which no demo length has a filled item (issue #54)."""
    from rf_eval.demo import study as demo
    from rf_eval.model_adapters import prefill_lm

    _demo_run(monkeypatch, tiny_model_dir)
    lm = getattr(prefill_lm, model)(device="cpu", **args)
    task = th.load_task("niah_single_1_filled", meta(None, task_data))
    assert task.tail == demo.demo_tail() == demo.settings(quick=False).tail
    del lm


@pytest.mark.parametrize("fill,metadata,says", [
    ("identity", {"max_seq_lengths": [512]},
     "every max_seq_lengths entry (512) is within the exact tail of 4,096 rows (the arm's)"),
    ("exact", {"max_seq_lengths": [512, 1024], "tail": 1024},
     "entry (512, 1024) is within the exact tail of 1,024 rows (model_args or --metadata)"),
])
def test_a_run_with_no_filled_item_is_refused_before_the_weights_load(monkeypatch, tiny_llama, fill, metadata, says):
    """Lengths within the tail leave `acc_filled` empty (NaN, exit 0): refused by the adapter from the arm and
    the run's tasks, before `HFLM` loads anything (issue #54, item 1)."""
    from lm_eval.models.huggingface import HFLM

    from rf_eval.errors import UserError
    from rf_eval.harness import run_context
    from rf_eval.model_adapters import prefill_lm

    monkeypatch.setattr(HFLM, "__init__", lambda *a, **k: pytest.fail("the weights loaded"))
    run_context.expect(["niah_single_1_filled"], metadata)
    try:
        with pytest.raises(UserError, match="Give lengths above the tail") as err:
            prefill_lm.ridgefill(pretrained=tiny_llama, fill=fill, split=2, device="cpu")
        assert says in str(err.value)
    finally:
        run_context.clear()


def test_a_method_with_no_tail_is_told_the_subset_tail_not_a_tail_it_would_refuse():
    """A dropper or sparse prefill off the demo has no tail: the refusal names the default it met and the fix
    that method takes (`subset_tail`), which then passes; an arm with a tail is still told `tail=`."""
    from rf_eval.errors import UserError
    from rf_eval.tasks.data_needs import check_filled_region

    with pytest.raises(UserError) as err:
        check_filled_region(["niah_single_1_filled"], {"max_seq_lengths": [512]}, {"adapter": "prefill"})
    assert "(the default: this method has no tail of its own)" in str(err.value)
    assert """--metadata '{"subset_tail": 128}'""" in str(err.value) and "tail= in --model_args" not in str(err.value)
    check_filled_region(["niah_single_1_filled"], {"max_seq_lengths": [512], "subset_tail": 128}, {"adapter": "prefill"})
    with pytest.raises(UserError, match="a smaller tail= in --model_args"):
        check_filled_region(["niah_single_1_filled"], {"max_seq_lengths": [512]}, {"fills_rows": True, "tail": 4096})


def test_another_models_run_is_checked_on_the_tasks_defaults():
    from rf_eval.errors import UserError
    from rf_eval.tasks.data_needs import check_filled_region

    with pytest.raises(UserError, match=r"niah_single_1_filled: every max_seq_lengths entry \(4096\) is within"):
        check_filled_region(["niah_single_1_filled", "hellaswag"], {}, {})  # RULER's default length, tail
    check_filled_region(["niah_single_1_filled"], {"max_seq_lengths": [8192]}, {})
    check_filled_region(["niah_single_1_filled"], {"max_seq_lengths": [512], "subset_tail": 64}, {})


# -- item 8: needles=all for multi-key samples; ruler_filled pools samples -------------------------------------

def test_multikey_needles_all_is_the_default_and_stricter(tiny_llama, task_data, th):
    base = meta(tiny_llama, task_data, tail=300)
    every = th.load_task("niah_multikey_1_filled", base)
    queried = th.load_task("niah_multikey_1_filled", {**base, "needles": "queried"})
    assert every.config.metadata["needles"] == "all" and queried.config.metadata["needles"] == "queried"
    a, q = marks(every), marks(queried)
    assert a.keys() == q.keys()
    assert all(q[k][0] for k in a if a[k][0])  # every needle in the prefix implies the queried one is
    assert any(q[k][0] and not a[k][0] for k in a)  # and a distractor in the tail excludes a sample
    assert all(len(m.spans) == 4 for m in every._marks.values())  # niah_multikey_1's four keyed needles
    with pytest.raises(ValueError, match="needles='some'"):
        th.load_task("niah_multikey_1_filled", {**base, "needles": "some"})


def test_ruler_filled_is_one_task_whose_acc_filled_pools_every_filled_sample(tiny_llama, task_data, th):
    """lm-eval's printed `ruler_filled` acc_filled is the paper's pooled figure (each filled sample of every
    task counted once), which no lm-eval group can print: a group weighs a task by all its samples."""
    from collections import Counter
    from statistics import mean

    from lm_eval import simple_evaluate

    tasks = ["niah_single_1", "niah_multikey_1", "niah_multivalue", "niah_multiquery"]

    out = simple_evaluate(model=th.gold_lm(), tasks=["ruler_filled"], limit=40, log_samples=True, bootstrap_iters=0,
                          task_manager=th.task_manager(meta(tiny_llama, task_data, tail=190)), verbosity="WARNING")
    res, samples = out["results"]["ruler_filled"], out["samples"]["ruler_filled"]
    assert [s["doc"]["ruler_task"] for s in samples[:8]] == tasks * 2  # interleaved: --limit takes from each
    assert Counter(s["doc"]["ruler_task"] for s in samples) == {t: 10 for t in tasks}
    filled = [s for s in samples if s["filled"] == 1]
    assert 0 < len(filled) < len(samples) and {s["acc_filled"] for s in filled} == {0.0, 1.0}
    assert res["acc_filled,none"] == pytest.approx(mean(s["acc_filled"] for s in filled))
    assert res["acc_all,none"] == pytest.approx(mean(s["acc_all"] for s in samples))
    share, acc = {}, {}
    for t in tasks:
        mine = [s["acc_filled"] for s in filled if s["doc"]["ruler_task"] == t]
        acc[t], share[t] = mean(mine), len(mine)
        assert res[f"acc_filled_{t},none"] == pytest.approx(acc[t]) and res[f"n_filled_{t},none"] == len(mine)
    grouped = sum(acc[t] * 10 for t in tasks) / 40  # what a weight_by_size group of the four tasks prints
    assert len(set(share.values())) > 1 and grouped != pytest.approx(res["acc_filled,none"])


def test_a_pool_names_ruler_tasks_of_one_kind(th):
    from rf_eval.tasks.ruler_filled import RulerFilledPool

    base = {"task": "pool", "output_type": "generate_until", "metadata": {"tokenizer": "x", "tail": 8}}
    with pytest.raises(ValueError, match="unknown: \\['niah_single_9'\\]"):
        RulerFilledPool(config={**base, "ruler_tasks": ["niah_single_1", "niah_single_9"]})
    with pytest.raises(ValueError, match="mixes kinds"):
        RulerFilledPool(config={**base, "ruler_tasks": ["niah_single_1", "ruler_qa_squad"]})


# -- item 10: the essay haystack comes the way lm-eval's ruler gets it -------------------------------

@pytest.fixture
def hub(monkeypatch, task_data):
    """lm-eval's essay download, answered from the test essays (as a machine online would)."""
    import datasets
    from lm_eval.tasks.ruler import prepare_niah

    texts = ruler_data.load_essays(task_data["essays"])
    calls = []

    def load_dataset(name, *args, **kwargs):
        calls.append(name)
        return {"text": texts}

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    prepare_niah.get_haystack.cache_clear()
    yield calls
    prepare_niah.get_haystack.cache_clear()


def test_essay_haystack_downloads_through_lm_eval(tiny_llama, task_data, th, hub):
    local = th.load_task("niah_multikey_1_filled", meta(tiny_llama, task_data))
    hub_meta = {k: v for k, v in meta(tiny_llama, task_data).items() if k != "essay_haystack"}
    downloaded = th.load_task("niah_multikey_1_filled", hub_meta)
    assert hub == ["baber/paul_graham_essays"]
    assert list(downloaded.eval_docs) == list(local.eval_docs)


def test_failed_download_names_the_local_option(tiny_llama, task_data, th, monkeypatch):
    import datasets
    from lm_eval.tasks.ruler import prepare_niah

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    prepare_niah.get_haystack.cache_clear()
    hub_meta = {k: v for k, v in meta(tiny_llama, task_data).items() if k != "essay_haystack"}
    with pytest.raises(ruler_data.RulerDataError, match="cannot be downloaded.*rf-eval fetch-data.*essay_haystack"):
        th.load_task("niah_multikey_1_filled", hub_meta)


def test_punkt_is_fetched_quietly_when_a_task_needs_it(monkeypatch):
    import nltk

    state = {"installed": False, "downloads": 0}
    real_find = nltk.data.find

    def find(name, *args, **kwargs):
        if name.startswith("tokenizers/punkt_tab") and not state["installed"]:
            raise LookupError(name)
        return real_find(name, *args, **kwargs)

    def download(name, **kwargs):
        assert name == "punkt_tab" and kwargs == {"quiet": True, "raise_on_error": False}
        state["downloads"] += 1
        state["installed"] = True

    monkeypatch.setattr(nltk.data, "find", find)
    monkeypatch.setattr(nltk, "download", download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ruler_data.RulerDataError, match="punkt_tab"):
        ruler_data.check_punkt()  # offline: no download attempt, today's message
    assert state["downloads"] == 0
    monkeypatch.delenv("HF_HUB_OFFLINE")
    ruler_data.check_punkt()
    assert state["downloads"] == 1


def test_a_preset_on_the_default_model_takes_a_budget(monkeypatch, tiny_model_dir):
    """`--model ridgefill --model_args preset=fastkv,budget=...` on the default (demo) model: the demo's default
    tail does not count as a tail the user gave beside the preset (issue #54, command 2)."""
    from rf_eval.model_adapters.config import parse_model_args

    _demo_run(monkeypatch, tiny_model_dir)
    settings, _ = parse_model_args({"preset": "fastkv", "budget": "0.9"}, "ridgefill")
    assert settings.demo and settings.method.name == "fastkv" and settings.arm.budget == 0.9
