"""A study's `budgets:` (issue #38): every arm a budget can set runs once per budget, and the report puts the
arms of one budget side by side, in the frontier and in a matched-budget table, in all four formats."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rf_eval.study.study_file import StudyError, load_study

STUDY = """\
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
tasks: [keytoken_nll]
arms:
  exact: {{args: {{fill: exact}}}}
  identity: {{args: {{fill: identity, split: 3, tail: 32, reference: exact}}}}
  nofill: {{args: {{fill: nofill, split: 3, tail: 32, reference: exact}}}}
  {extra}
reference: exact
budgets: [{budgets}]
metadata: {{docs: {docs}, score_tokens: 64, key_context: 128}}
"""


def write(folder: Path, model: str, docs: Path, budgets: str = "0.6", extra: str = "", edit=("", "")) -> Path:
    path = folder / "study.yaml"
    text = STUDY.format(model=model, docs=docs, budgets=budgets, extra=extra)
    path.write_text(text.replace(*edit) if edit[0] else text)
    return path


def test_budgets_expand_every_arm_a_budget_can_set(tmp_path, tiny_model_dir, keytoken_docs):
    extra = "rules: {args: {fill: identity, split: 3, selector: special}}"
    study = load_study(write(tmp_path, tiny_model_dir("llama"), keytoken_docs, "0.6, 0.8", extra))
    assert list(study.arms) == ["exact", "identity@0.6", "identity@0.8", "nofill@0.6", "nofill@0.8", "rules"]
    assert study.arms["identity@0.8"].args == {"fill": "identity", "split": 3, "tail": 32, "reference": "exact",
                                               "budget": 0.8}
    assert "budget" not in study.arms["rules"].args  # a selector that picks rows by rule has no count to turn
    assert study.budgets == (0.6, 0.8)


@pytest.mark.parametrize("budgets, edit, says", [
    ("0", ("", ""), "budgets: budget=0 is not a share"),
    ("0.6, 0.6", ("", ""), "budgets: 0.6 is given twice"),
    ("", ("budgets: []", "budgets: []"), "budgets is empty"),
    ("0.6", ("\nreference: exact", "\nreference: identity"), "reference 'identity' is an arm the budgets expand"),
    ("0.6", ("\nreference: exact", "\nreference: exact\ncontrols: {identity: [nofill]}"),
     "controls.identity names 'identity', which the budgets expand"),
    ("0.6", ("  exact: {args: {fill: exact}}", "  exact: {args: {fill: exact}}\n  identity@0.6: {args: {fill: exact}}"),
     "an arm of that name is declared already"),
])
def test_bad_budgets_name_the_problem(budgets, edit, says, tmp_path, tiny_model_dir, keytoken_docs):
    path = write(tmp_path, tiny_model_dir("llama"), keytoken_docs, budgets, edit=edit)
    with pytest.raises(StudyError, match=says):
        load_study(path)


def test_study_plan_refuses_a_budget_no_setting_meets_before_anything_runs(tmp_path, tiny_model_dir, keytoken_docs):
    from rf_eval.study.preflight import check_study

    study = load_study(write(tmp_path, tiny_model_dir("llama"), keytoken_docs, "0.02"))
    with pytest.raises(StudyError, match=r"arms.identity@0.02: budget=0.02 is below the cheapest"):
        check_study(study)


@pytest.mark.slow
def test_a_budget_study_reports_its_arms_side_by_side(tmp_path, tiny_model_dir, keytoken_docs):
    """exact + identity and nofill at budget 0.6 through the study runner: the report's frontier holds every
    arm, its HTML draws the frontier as SVG in a section titled so, and the matched-budget contrast between the
    two arms is in the HTML, Markdown, LaTeX and JSON."""
    from rf_eval.study.launch import InProcessLauncher
    from rf_eval.study.runner import run_study

    study = load_study(write(tmp_path, tiny_model_dir("llama"), keytoken_docs))
    out = tmp_path / "out"
    assert run_study(study, out, InProcessLauncher()) == 0
    summary = json.loads((out / "report.json").read_text())
    front = {a["arm"]: a for a in summary["frontier"]["arms"]}
    assert set(front) == {"exact", "identity@0.6", "nofill@0.6"}
    # the headline measure: key-token ΔNLL, or on random weights (no key tokens) the first with values
    (measure,) = [m["label"] for m in summary["frontier"]["measures"]]
    assert measure.startswith("keytoken_nll: ") and "ΔNLL" in measure
    for arm in ("identity@0.6", "nofill@0.6"):
        (point,) = front[arm]["lengths"]
        assert set(point) >= {"macs_fraction", "mac_speedup", "measured_speedup", "measures"}
        assert point["macs_fraction"] <= 0.6 and point["mac_speedup"] == pytest.approx(1 / point["macs_fraction"])
        assert set(point["measures"]) == {measure}
    (matched,) = summary["budgets"]
    assert matched["budget"] == 0.6 and {(r["arm"], r["versus"]) for r in matched["contrasts"]} == {
        ("identity@0.6", "nofill@0.6")}
    html = (out / "report.html").read_text()
    section = html[html.index('<h2 id="frontier">Quality-cost frontier</h2>'):html.index('<h2 id="matched-budget">')]
    assert "<svg" in section
    matched_html = html[html.index('<h2 id="matched-budget">'):]
    assert "identity@0.6</td><td class=\"text\">nofill@0.6" in matched_html
    md, tex = (out / "report.md").read_text(), (out / "report.tex").read_text()
    assert "### Methods at budget 0.6" in md and f"| identity@0.6 | nofill@0.6 | {measure} |" in md
    tex_measure = measure.replace("_", r"\_").replace("Δ", r"$\Delta$")
    assert r"Methods at budget 0.6" in tex and rf"identity@0.6 & nofill@0.6 & {tex_measure}" in tex


def test_the_plan_states_each_budget_arms_cost_and_knob_per_length(tmp_path):
    """`rf-eval study plan`: a budget arm's MAC fraction at each length is within its budget, at the tail its
    knob takes there, recounted by the cost model at that tail."""
    from transformers import LlamaConfig

    from rf_eval.cost.mac_model import prefill_macs
    from rf_eval.study.plan import arm_preview
    from rf_eval.study.study_file import StudyArm

    config = LlamaConfig(num_hidden_layers=32, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000)
    config.save_pretrained(tmp_path)

    class Study:
        pretrained, model_args, lengths, maps, fit = str(tmp_path), {}, [1024, 4096], None, None

    arm = StudyArm("nofill@0.6", "ridgefill", {"fill": "nofill", "split": 12, "budget": 0.6})
    costs = arm_preview(Study, arm)
    assert list(costs) == Study.lengths
    for n, (cost, knob) in costs.items():
        tail = int(knob.removeprefix("tail "))
        assert cost == pytest.approx(prefill_macs(config, n, split=12, tail=tail, fill="nofill")
                                         / prefill_macs(config, n)) and cost <= 0.6
    unbudgeted = arm_preview(Study, StudyArm("nofill", "ridgefill", {"fill": "nofill", "split": 12}))
    assert list(unbudgeted) == Study.lengths and all(knob is None for _, knob in unbudgeted.values())


DROPPERS_STUDY = """\
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
maps: {maps}
tasks: [keytoken_nll]
arms:
  exact: {{args: {{fill: exact}}}}
  ridge: {{args: {{fill: ridge, reference: exact}}}}
  nofill: {{args: {{fill: nofill, split: 3, reference: exact}}}}
  fastkv: {{args: {{preset: fastkv, reference: exact}}}}
  gemfilter: {{model: drop, args: {{method: gemfilter, reference: exact}}}}
reference: exact
budgets: [0.6]
metadata: {{docs: {docs}, score_tokens: 64, key_context: 128}}
"""


@pytest.mark.slow
def test_fills_and_drops_run_side_by_side_at_one_budget(tmp_path, tiny_model_dir, keytoken_docs):
    """Issue #40's study: ridge, nofill, FastKV and GemFilter at one budget (0.6: the tiny model's 6 layers split
    at 3 cannot reach 0.5), every arm within it, and the report pairs each two of them."""
    import torch
    from transformers import AutoConfig

    from rf_eval.ridge.maps import RidgeMaps, config_hash
    from rf_eval.study.launch import InProcessLauncher
    from rf_eval.study.runner import run_study

    model = tiny_model_dir("llama")
    cfg = AutoConfig.from_pretrained(model)
    late = range(3, cfg.num_hidden_layers)
    maps = RidgeMaps(split=3, A={i: torch.eye(cfg.hidden_size) for i in late},
                     b={i: torch.zeros(cfg.hidden_size) for i in late},
                     metadata={"config_hash": config_hash(cfg), "lambda": "0.01", "rows": "10"}).save(tmp_path / "maps")
    path = tmp_path / "study.yaml"
    path.write_text(DROPPERS_STUDY.format(model=model, maps=maps, docs=keytoken_docs))
    study = load_study(path)
    assert list(study.arms) == ["exact", "ridge@0.6", "nofill@0.6", "fastkv@0.6", "gemfilter@0.6"]
    out = tmp_path / "out"
    assert run_study(study, out, InProcessLauncher()) == 0
    summary = json.loads((out / "report.json").read_text())
    (matched,) = summary["budgets"]
    arms = {a["arm"]: a for a in matched["arms"]}
    assert set(arms) == {"ridge@0.6", "nofill@0.6", "fastkv@0.6", "gemfilter@0.6"}, arms  # the study's names
    assert all(a["macs_fraction"] <= 0.6 for a in arms.values()), arms
    assert len({(r["arm"], r["versus"]) for r in matched["contrasts"]}) == 6  # every pair of the four
    md = (out / "report.md").read_text()
    assert "### Methods at budget 0.6" in md and md.count("@0.6 |") >= 6


RULER_STUDY = """\
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
tasks: [niah_single_1_filled]
lengths: [512]
limit: 2
metadata: {{docs: {docs}}}
arms:
  exact: {{args: {{fill: exact}}}}
  sparse: {{model: prefill, args: {{method: {method}, block: 16, reference: exact}}}}
reference: exact
budgets: [{budget}]
"""


def ruler_study(tmp_path: Path, model: str, method: str, budget: float):
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "a.txt").write_text("the river ran by the old mill and the miller sang " * 40)
    path = tmp_path / "study.yaml"
    path.write_text(RULER_STUDY.format(model=model, docs=docs, method=method, budget=budget))
    return load_study(path)


@pytest.mark.parametrize("method, budget", [("sinkwindow", 0.5), ("xattention", 0.5), ("flexprefill", 0.5)])
def test_a_sparse_budget_unmet_at_a_study_length_is_refused_before_anything_runs(method, budget, tmp_path,
                                                                                tiny_model_dir):
    """A sparse-attention arm (and any method whose budget knob is built with the method) is built on the meta
    device and plans each study length, so `study plan` refuses a budget it cannot meet at 512 tokens; its
    run would refuse it only before its own first prompt, after the arms before it ran."""
    from rf_eval.study.preflight import check_study

    study = ruler_study(tmp_path, tiny_model_dir("llama"), method, budget)
    with pytest.raises(StudyError, match=rf"arms.sparse@{budget}: budget={budget}: .*a 512-token prompt"):
        check_study(study)


def test_a_budget_unmet_at_the_built_prompts_is_refused_before_the_study_registers_anything(tmp_path, tiny_model_dir):
    """A RULER prompt runs shorter than its length (the template and the generation's reserve): the sink-and-
    window control at budget 0.6 meets it at 512 tokens but not at the prompts the study builds (each under 512
    tokens, the shortest beyond the budget), so `build_task_data` refuses it, naming the prompts' range; at 0.65
    it meets both and the data builds."""
    from lm_eval.tasks import TaskManager
    from transformers import AutoConfig

    from rf_eval.cost.budget import BudgetError
    from rf_eval.methods import method_class
    from rf_eval.methods.base import ModelSource
    from rf_eval.study.preflight import build_task_data, built_prompt_lengths, check_study
    from rf_eval.study.runner import model_args, task_metadata

    model = tiny_model_dir("llama")
    low = ruler_study(tmp_path, model, "sinkwindow", 0.6)
    check_study(low)  # met at the study's length
    with pytest.raises(StudyError, match=r"arms.sparse@0.6: the study's prompts run [\d,]+ to [\d,]+ tokens: "
                                         r"budget=0.6: a [\d,]+-token prompt costs at least"):
        build_task_data(low)
    assert build_task_data(ruler_study(tmp_path, model, "sinkwindow", 0.65)) == 1
    # the lengths checked are the built prompts' own token counts, and the shortest one is what fails 0.6
    args = model_args(low, low.arms["sparse@0.6"], None)
    tasks = TaskManager(metadata={**args, **task_metadata(low)}).load(["niah_single_1_filled"])
    lengths = built_prompt_lengths(low, tasks, args)
    assert len(lengths) >= 1 and all(n < 512 for n in lengths)
    chat = built_prompt_lengths(dataclasses.replace(low, apply_chat_template=True), tasks, args)
    assert len(chat) == len(lengths) and all(c > n for c, n in zip(chat, lengths))  # the template's tokens too
    cls = method_class("sinkwindow")
    method = cls.on_meta(cls.parse_arm({"block": 16, "budget": 0.6}),
                         ModelSource(model, AutoConfig.from_pretrained(model), model))
    method.plan(512)
    with pytest.raises(BudgetError):
        method.plan(lengths[0])
