"""A study of the sparse-attention family (issue #56): FlexPrefill, XAttention and the sink+window control at one
budget, every arm within it, each item recording its attention density, and the report pairing them."""

from __future__ import annotations

import json

import pytest

from rf_eval.study.study_file import load_study

SPARSE_STUDY = """\
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
tasks: [keytoken_nll]
arms:
  exact: {{args: {{fill: exact}}}}
  flex: {{model: prefill, args: {{method: flexprefill, block: 16, min_budget: 16, reference: exact}}}}
  xattn: {{model: prefill, args: {{method: xattention, block: 16, stride: 4, reference: exact}}}}
  sink: {{model: prefill, args: {{method: sinkwindow, block: 16, reference: exact}}}}
reference: exact
budgets: [0.9]
metadata: {{docs: {docs}, score_tokens: 64, key_context: 192}}
"""


@pytest.mark.slow
def test_sparse_arms_run_side_by_side_at_one_budget(tmp_path, tiny_model_dir, keytoken_docs):
    from rf_eval.study.launch import InProcessLauncher
    from rf_eval.study.runner import run_study

    path = tmp_path / "study.yaml"
    path.write_text(SPARSE_STUDY.format(model=tiny_model_dir("llama"), docs=keytoken_docs))
    study = load_study(path)
    assert list(study.arms) == ["exact", "flex@0.9", "xattn@0.9", "sink@0.9"]
    assert study.arms["sink@0.9"].args["budget"] == 0.9
    out = tmp_path / "out"
    assert run_study(study, out, InProcessLauncher()) == 0
    summary = json.loads((out / "report.json").read_text())
    (matched,) = summary["budgets"]
    arms = {a["arm"]: a for a in matched["arms"]}
    assert set(arms) == {"flex@0.9", "xattn@0.9", "sink@0.9"}
    assert all(a["macs_fraction"] <= 0.9 for a in arms.values()), arms
    assert len({(r["arm"], r["versus"]) for r in matched["contrasts"]}) == 3  # every pair of the three
    for name in arms:
        samples = [json.loads(line) for f in (out / "arms" / name).rglob("samples_keytoken_nll_*.jsonl")
                   for line in f.read_text().splitlines()]
        assert samples and all(0 < s["attention_density"] < 1 for s in samples), name
    md = (out / "report.md").read_text()
    assert "### Methods at budget 0.9" in md and "| attention computed |" in md  # the sparse arms' own column
    front = {a["arm"]: a for a in summary["frontier"]["arms"]}
    assert summary["frontier"]["attention"] is True
    assert all(0 < e["attention_density"] < 1 for name in arms for e in front[name]["lengths"])
    assert all(e["attention_density"] is None for e in front["exact"]["lengths"])
