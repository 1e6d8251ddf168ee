"""rf_eval.stats.runs / pairing / arms: lm-eval output folders into paired per-item results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rf_eval.stats.arms import name_arms, parse_model_args
from rf_eval.stats.pairing import PairingError, pair_arms
from rf_eval.stats.runs import RunFormatError, load_runs

OUTCOMES = {"niah_single_1": [True, True, False, True, True, False], "niah_multikey_1": [True, False, True, True, True, True]}


def _flip(outcomes, *idx):
    return {t: [(not ok) if i in idx else ok for i, ok in enumerate(v)] for t, v in outcomes.items()}


def test_loads_ruler_style_runs_into_points_with_lengths(tmp_path, lmeval_format):
    lmeval_format.accuracy_run(tmp_path, "exact", OUTCOMES, lengths=[4096, 8192], started=1.79e9)
    lmeval_format.accuracy_run(tmp_path, "ridge", _flip(OUTCOMES, 0), lengths=[4096, 8192], started=1.79e9 + 60)
    runs = load_runs([tmp_path])
    assert [a.name for a in runs.arms] == ["exact", "ridge"]
    items = runs.items
    assert len(items) == 24 and set(items["unit"]) == {"points"}
    assert set(items["score"]) == {0.0, 100.0}
    assert set(items["length"]) == {4096, 8192} and set(items["metric"]) == {"score"}
    exact = items[(items.arm == "exact") & (items.task == "niah_single_1")].sort_values("doc_id")
    assert list(exact["score"]) == [100.0 if ok else 0.0 for ok in OUTCOMES["niah_single_1"]]
    assert runs.arm("ridge").model_args["fill"] == "ridge"
    assert runs.arm("exact").started.timestamp() == pytest.approx(1.79e9)


def test_pairs_by_task_and_document(tmp_path, lmeval_format):
    lmeval_format.accuracy_run(tmp_path, "exact", OUTCOMES, started=1.79e9)
    lmeval_format.accuracy_run(tmp_path, "ridge", _flip(OUTCOMES, 1, 2), started=1.79e9 + 1)
    runs = load_runs([tmp_path])
    pairs = pair_arms(runs.items, "ridge", "exact")
    assert len(pairs) == 12 and pairs.attrs["unpaired"] == 0
    assert (pairs["arm"] != pairs["ref"]).sum() == 4
    assert pairs["length"].isna().all()  # plain acc tasks without a length: handled


def test_refuses_to_pair_items_whose_prompts_differ(tmp_path, lmeval_format):
    lmeval_format.accuracy_run(tmp_path / "a", "exact", OUTCOMES, started=1.79e9)
    lmeval_format.accuracy_run(tmp_path / "b", "ridge", OUTCOMES, started=1.79e9 + 1, prompt_suffix=" Answer:")
    runs = load_runs([tmp_path / "a", tmp_path / "b"])
    with pytest.raises(PairingError, match=r"task 'niah_single_1', doc 0: the prompts differ"):
        pair_arms(runs.items, "ridge", "exact")


def test_items_missing_from_one_arm_are_counted_not_paired(tmp_path, lmeval_format):
    lmeval_format.accuracy_run(tmp_path, "exact", OUTCOMES, started=1.79e9)
    short = {t: v[:4] for t, v in OUTCOMES.items()}
    lmeval_format.accuracy_run(tmp_path, "ridge", short, started=1.79e9 + 1)
    pairs = pair_arms(load_runs([tmp_path]).items, "ridge", "exact")
    assert len(pairs) == 8 and pairs.attrs["unpaired"] == 4


def test_latest_run_of_an_arm_wins_and_is_noted(tmp_path, lmeval_format):
    lmeval_format.accuracy_run(tmp_path, "exact", OUTCOMES, started=1.79e9)
    lmeval_format.accuracy_run(tmp_path, "exact", _flip(OUTCOMES, 0), started=1.79e9 + 5)
    runs = load_runs([tmp_path])
    assert [a.name for a in runs.arms] == ["tiny"]  # one arm: named after its model
    assert len(runs.items) == 12
    first = runs.items[(runs.items.task == "niah_single_1") & (runs.items.doc_id == 0)]
    assert first["score"].item() == 0.0  # the later (flipped) run
    assert any("replaces the earlier run" in n for n in runs.notes)


def test_raw_metrics_keep_their_unit_and_missing_samples_are_noted(tmp_path, lmeval_format):
    lines = [
        lmeval_format.sample_line(i, {"text": f"doc {i}", "domain": "code" if i % 2 else "prose"}, f"doc {i}", "", {"nll": 2.0 + 0.1 * i})
        for i in range(4)
    ]
    lmeval_format.write_run(tmp_path, model_args={"pretrained": "m", "fill": "exact"}, tasks={"key_nll": lines},
                            higher_is_better={"key_nll": {"nll": False}})
    runs = load_runs([tmp_path])
    items = runs.items
    assert set(items["unit"]) == {"nats"} and not items["higher_is_better"].any()  # a per-token loss
    assert list(items["score"]) == pytest.approx([2.0, 2.1, 2.2, 2.3])
    assert set(items["domain"]) == {"code", "prose"}
    # a results file whose task has no samples file: noted, arm left out
    res = next(tmp_path.rglob("results_*.json"))
    data = json.loads(res.read_text())
    data["config"]["model_args"] = {"pretrained": "m", "fill": "ridge"}
    (res.parent / "results_2030-01-01T00-00-00.json").write_text(json.dumps(data))
    runs = load_runs([tmp_path])
    assert any("no per-sample log for key_nll" in n for n in runs.notes)


def test_format_errors_name_the_path(tmp_path):
    with pytest.raises(RunFormatError, match="no lm-eval results"):
        load_runs([tmp_path])
    with pytest.raises(RunFormatError, match="no such folder"):
        load_runs([tmp_path / "missing"])
    (tmp_path / "results_x.json").write_text("{}")
    with pytest.raises(RunFormatError, match="not an lm-eval results file"):
        load_runs([tmp_path])


def test_arm_names_from_model_args():
    assert parse_model_args("pretrained=/m/llama,fill=ridge,split=12") == {"pretrained": "/m/llama", "fill": "ridge", "split": "12"}
    assert parse_model_args({"split": 12}) == {"split": "12"}
    demo = [  # the arms of `rf-eval demo`
        {"pretrained": "demo", "fill": "exact", "tail": "64"},
        {"pretrained": "demo", "fill": "identity", "split": "12", "tail": "64"},
        {"pretrained": "demo", "fill": "ridge", "maps": "/out/maps", "tail": "64"},
        {"pretrained": "demo", "fill": "ridge", "maps": "/out/maps", "selector": "attention", "tail": "64"},
    ]
    assert name_arms(["ridgefill"] * 4, demo) == ["exact", "identity", "ridge", "ridge,selector=attention"]
    args = [{"pretrained": "/m/x", "fill": "exact"}, {"pretrained": "/m/x", "fill": "ridge", "split": "12"}]
    assert name_arms(["hf", "ridgefill"], args) == ["hf", "ridgefill"]
    assert name_arms(["hf", "hf"], [{"fill": "ridge", "split": "8"}, {"fill": "ridge", "split": "12"}]) == ["split=8", "split=12"]
    assert name_arms(["hf", "hf"], [{"pretrained": "/a/m1"}, {"pretrained": "/b/m2/"}]) == ["m1", "m2"]
    assert name_arms(["hf"], [{"pretrained": "/a/m1"}]) == ["m1"]
    assert name_arms(["dummy", "dummy"], [{"arm": "exact", "x": "1"}, {"arm": "exact", "x": "2"}]) == ["exact", "exact#2"]
    # a served run named with arm= does not change how the in-process arms are told apart
    served = {"model": "M", "base_url": "http://127.0.0.1:8000/arm/fill=identity;tail=4096/v1/completions",
              "arm": "served_identity"}
    assert name_arms(["ridgefill", "ridgefill", "local-completions"], [demo[0], demo[1], served]) == \
        ["exact", "identity", "served_identity"]
    assert np.array_equal(name_arms([], []), [])


def test_output_path_given_as_a_json_file_name(tmp_path, lmeval_format):
    # `lm_eval --output_path run.json` writes run_<date>.json beside the samples files
    results = lmeval_format.accuracy_run(tmp_path, "exact", OUTCOMES)
    renamed = results.with_name("run_" + results.name[len("results_") :])
    results.rename(renamed)
    runs = load_runs([renamed])
    assert len(runs.items) == 12 and runs.arms[0].results_files == (str(renamed),)


def test_the_scored_text_of_a_loss_task_is_noted_once_or_per_arm(tmp_path, lmeval_format):
    """keytoken_nll records which text it scored (`scored_text`); the report says it once when every arm
    scored the same, else per arm."""
    docs = [{"nll_all": 2.0, "n_tokens": 10}, {"nll_all": 2.5, "n_tokens": 12}]
    shared = "the last 512 tokens of each document under the Qwen tokenizer (the same text for every model)"
    for arm, when in (("exact", 1.79e9), ("ridge", 1.79e9 + 1)):
        lmeval_format.keytoken_run(tmp_path / "same", arm, docs, started=when,
                                   task_extra={"metadata": {"scored_text": shared}})
    assert f"keytoken_nll: scored on {shared}" in load_runs([tmp_path / "same"]).notes
    own = "the last 512 tokens of each document under each model's own tokenizer"
    for arm, text, when in (("exact", shared, 1.79e9), ("ridge", own, 1.79e9 + 1)):
        lmeval_format.keytoken_run(tmp_path / "mixed", arm, docs, started=when,
                                   task_extra={"metadata": {"scored_text": text}})
    notes = load_runs([tmp_path / "mixed"]).notes
    assert sum("keytoken_nll: " in n and "scored on" in n for n in notes) == 2
    assert any(n.endswith(f"scored on {own}") and "ridge" in n for n in notes)


def test_a_measure_with_no_items_is_said_with_the_runs_settings_not_nan():
    """Issue #41 item 2: no key tokens is a note naming the run's key_threshold and key_context, not a nan."""
    from rf_eval.stats.measures import default_metrics
    from rf_eval.stats.metric_choice import task_metrics

    names = list(default_metrics("keytoken_nll"))
    samples = [{**{n: None for n in names}, "kl": 0.1, "nll_all": 0.2, "nll_novel": 0.3, "doc_id": 0}]
    notes: list[str] = []
    task_metrics(names, samples, (), "keytoken_nll (s.jsonl)", "keytoken_nll", notes,
                  {"key_threshold": 2.0, "key_context": 4096})
    said = [n for n in notes if "nll_key" in n]
    assert said and "no key tokens in these documents (key_threshold=2.0 nats, key_context=4096 tokens)" in said[0]


def test_an_arm_run_on_the_defaults_is_named_by_its_resolved_fill_not_unset():
    """An arm given no fill (the demo's defaults) is named by the fill its run recorded (issue #54, item 2)."""
    from rf_eval.stats.arms import name_arms, naming_args

    given = [{"fill": "exact"}, {}]
    configs = [{"rf_eval": {"method": "ridgefill", "fill": "exact"}}, {"rf_eval": {"method": "ridgefill", "fill": "ridge"}}]
    assert name_arms(["ridgefill"] * 2, given) == ["exact", "fill=unset"]  # what the given args alone say
    args = [naming_args(a, c) for a, c in zip(given, configs)]
    assert name_arms(["ridgefill"] * 2, args) == ["exact", "ridge"]
    assert naming_args({"fill": "identity"}, configs[1]) == {"fill": "identity"}  # the given fill wins
    assert naming_args({"preset": "pop"}, configs[1]) == {"preset": "pop"}  # a preset names its arm
    assert naming_args({}, None) == {}  # another model's run records no resolved arm
