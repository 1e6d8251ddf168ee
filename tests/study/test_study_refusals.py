"""A study file refused before anything runs: bad keys and values (named with their block and line), task
names and data that cannot build, a bad setting in any arm, and lengths beyond the model's positions: each
one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import pytest
from conftest import adapter_helpers as helpers  # noqa: E402
from test_study import STUDY, write_study

from rf_eval.cli import main as cli
from rf_eval.study.study_file import StudyError, load_study


@pytest.mark.parametrize(
    "edit, message",
    [
        (("margin: 5.0", "margn: 5.0"), "unknown key 'margn' (line 11)"),
        (("{{args: {{fill: identity, tail: 4, split: 3}}}}", "{{args: {{tail: 4}}}}"), "arms.identity: a ridgefill arm needs args.fill"),
        (("reference: exact", "reference: ridge"), "reference 'ridge' is not a declared arm (line 10); arms: exact"),
        (("margin: 5.0", "margin: 5.0\ncontrols: {{identity: [random_rows]}}"), "controls.identity names no declared arm 'random_rows'"),
        (("tasks:", "tasks: 3\nx:"), "tasks must be list"),
        (("  pretrained: {model}\n", ""), "model: missing key(s) pretrained"),
        (("exact: {{args: {{fill: exact}}}}", "exact: {{args: {{fill: exact}}, modle: hf}}"), "arms.exact: unknown key 'modle'"),
        (("exact: {{args: {{fill: exact}}}}", "exact: {{model: flexprefill}}"),
         "arms.exact: model: flexprefill names an rf-eval method, not an lm-eval model; give model: prefill and "
         "args.method: flexprefill"),
        (("  nofill:", "  exact: {{args: {{fill: identity}}}}\n  nofill:"), "arms.exact is given twice (line 7 and line 9)"),
        (("margin: 5.0", "margin: 5.0\nmargin: 2.0"), "margin is given twice (line 11 and line 12)"),
        (("{{args: {{fill: exact}}}}", "{{args: {{fill: exact, tail: 4, tail: 8}}}}"), "arms.exact.args.tail is given twice"),
        (("margin: 5.0", "margin: 5.0\nlengths: [abc]"), "lengths holds 'abc', not a positive number of tokens (line 12)"),
        (("margin: 5.0", "margin: 5.0\nlengths: [1024, -5]"), "lengths holds -5"),
        (("margin: 5.0", "margin: 5.0\nlimit: 0"), "limit must be a positive number of samples per task, not 0 (line 12)"),
        # an arm's name is its folder: none writes into another's (#54)
        (("  nofill:", "  Nofill: {{args: {{fill: exact}}}}\n  nofill:"), "arms 'Nofill' and 'nofill' would write one folder"),
        (("  nofill:", "  identity/x: {{args: {{fill: exact}}}}\n  nofill:"), "arms.identity/x: the arm's name is its output folder"),
        (("  nofill:", "  ..: {{args: {{fill: exact}}}}\n  nofill:"), "arms...: the arm's name is its output folder"),
    ],
)
def test_bad_study_files_fail_before_anything_runs(tmp_path, edit, message):
    old, new = edit
    text = STUDY.replace(old, new)
    assert text != STUDY
    path = write_study(tmp_path, "/m", tmp_path, text)
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert message in str(err.value)
    assert cli(["study", "run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


@pytest.mark.parametrize("tasks, message", [
    ("rfe_adapter_mcq", "tasks 'rfe_adapter_mcq' (did you mean rfe_adapter_mc"),
    ("rfe_adapter_mc, ruler_filled", "arm exact: ruler_filled needs the Paul Graham essays"),
    ("longbench_v2_cot", "rf-eval fetch-data --tasks longbench_v2_cot --out DIR"),
])
def test_a_study_whose_tasks_cannot_build_refuses_before_the_fit(tasks, message, tiny_model_dir, adapter_task,
                                                                tmp_path, monkeypatch, capsys):
    """Task names and their data are checked before the claims are registered and the `fit:` block runs."""
    import nltk

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("NLTK_DATA", raising=False)
    monkeypatch.delenv("RF_EVAL_DATA", raising=False)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "no-nltk-data")])
    (tmp_path / "cal.jsonl").write_text('{"text": "calibration text"}\n')
    text = STUDY.replace("margin: 5.0", "margin: 5.0\nfit: {{calibration: [cal.jsonl], split: 3}}")
    path = write_study(tmp_path, tiny_model_dir("llama"), adapter_task, text)
    path.write_text(path.read_text().replace(f"tasks: [{helpers.TASK}, {helpers.GEN_TASK}, keytoken_nll]",
                                             f"tasks: [{tasks}]"))
    for action in ("plan", "run"):
        assert cli(["study", action, str(path), "--out", str(tmp_path / "out")]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rf-eval study: error:")]
        assert len(errors) == 1 and message in errors[0], errors
    assert not (tmp_path / "out").exists()  # no claims registered, no maps fitted, no arm run


def test_study_run_builds_the_tasks_data_before_it_registers_anything(tiny_model_dir, adapter_task, tmp_path,
                                                                       capsys):
    """keytoken_nll with no `docs` passes the data check (no path to test) but cannot build its samples:
    `study run` builds them first and stops before a claim is registered or a map fitted; `plan` builds
    nothing."""
    (tmp_path / "cal.jsonl").write_text('{"text": "calibration text"}\n')
    text = STUDY.replace("margin: 5.0", "margin: 5.0\nfit: {{calibration: [cal.jsonl], split: 3}}").replace(
        "metadata: {{docs: {docs}, ", "metadata: {{")
    path = write_study(tmp_path, tiny_model_dir("llama"), adapter_task, text)
    assert cli(["study", "plan", str(path), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert cli(["study", "run", str(path), "--out", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rf-eval study: error:")]
    assert len(errors) == 1 and "arm exact: building the data of" in errors[0], errors
    assert "keytoken_nll reads long documents from a local folder" in errors[0]
    assert not (tmp_path / "out").exists()  # no claims registered, no maps fitted, no arm run


@pytest.mark.parametrize("edit, message", [
    (("fill: identity, tail: 4", "fill: identty, tail: 4"), "arms.identity: method=ridgefill: fill='identty' is not valid; valid fills"),
    (("fill: nofill, tail: 8", "fill: nofill, tail: 8, selector: attentoin"), "arms.nofill: method=ridgefill: selector='attentoin'"),
    (("fill: nofill, tail: 8", "fill: nofill, tail: 8, rho: 0.2"), "arms.nofill: model_args rho=0.2 is a key of method=rarecache"),
    (("fill: identity, tail: 4", "fill: identity, tail: -4"), "arms.identity: method=ridgefill: tail must be >= 1"),
    (("fill: identity, tail: 4, split: 3", "fill: identity, tail: 4, split: 9"),
     "arms.identity: split 9 is outside 1..5 for this 6-layer model"),
    (("fill: identity, tail: 4", "fill: ridge, tail: 4, maps: ./no-maps"), "arms.identity: maps=./no-maps: no such file"),
    (("fill: nofill, tail: 8", "fill: nofill, tail: 8, pretrained: ./no-model"),
     "arms.nofill: model './no-model': no such local folder"),
])
def test_a_bad_setting_in_a_later_arm_refuses_the_study_before_the_fit(edit, message, tiny_model_dir, adapter_task,
                                                                      tmp_path, capsys):
    (tmp_path / "cal.jsonl").write_text('{"text": "calibration text"}\n')
    text = STUDY.replace("margin: 5.0", "margin: 5.0\nfit: {{calibration: [cal.jsonl], split: 3}}").replace(*edit)
    path = write_study(tmp_path, tiny_model_dir("llama"), adapter_task, text)
    assert cli(["study", "run", str(path), "--out", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rf-eval study: error:")]
    assert len(errors) == 1 and message in errors[0], errors
    assert not (tmp_path / "out").exists()


def test_a_study_at_lengths_beyond_the_models_positions_is_refused_by_its_plan(tmp_path, tiny_model_dir, adapter_task,
                                                                               capsys):
    """lm-eval would left-truncate those prompts (needles included); the plan says so before anything runs."""
    text = STUDY.replace("margin: 5.0", "margin: 5.0\nlengths: [1024, 16384]").replace(
        "tasks: [{tasks}]", "tasks: [niah_single_1_filled]")
    path = tmp_path / "study.yaml"
    path.write_text(text.format(model=tiny_model_dir("llama"), tasks_dir=adapter_task, docs=tmp_path))
    assert cli(["study", "plan", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "niah_single_1_filled: max_seq_lengths 16384 exceeds the model's 8,192 positions" in err
    assert not (tmp_path / "out").exists()
