"""SwiftKV's fills through `lm_eval --model ridgefill` (#25 item 5): a SwiftKV checkpoint loads with no
remote code, and `swiftkv_released` is the checkpoint's own forward in both of the adapter's paths: the
engine's (a short tail) and lm-eval's own batched forward of plain prompts (a tail covering every prompt)."""

from __future__ import annotations

import json

from adapter_helpers import TASK, loglikelihoods, run_lm_eval

from rf_eval.testing import make_tiny_swiftkv


def test_swiftkv_fills_run_through_lm_eval(adapter_task, tmp_path):
    model = make_tiny_swiftkv(tmp_path / "swiftkv", num_key_value_layers=2, key_value_group_size=2)
    common = ["--tasks", TASK, "--include_path", str(adapter_task), "--limit", "4", "--device", "cpu",
              "--log_samples"]
    runs = {"swiftkv": "fill=swiftkv,tail=2", "released": "fill=swiftkv_released,tail=2,reference=exact",
            "released_plain": "fill=swiftkv_released,tail=100000"}
    for name, args in runs.items():
        proc = run_lm_eval(["--model", "ridgefill", "--model_args", f"pretrained={model},{args}",
                            "--output_path", str(tmp_path / name), *common], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next((tmp_path / "released").rglob("results_*.json")).read_text())
    info = results["config"]["rf_eval"]
    assert (info["fill"], info["split"], info["model_type"]) == ("swiftkv_released", 2, "llama_swiftkv")
    assert info["engine_floor"]["bitwise"]  # measured on the base forward, which the released hooks leave alone
    got = {name: loglikelihoods(tmp_path / name) for name in runs}
    assert got["released"].keys() == got["released_plain"].keys() and len(got["released"]) >= 4
    # the tail only names rows filled: SwiftKV's forward gives every row's late K/V from x_L either way
    assert max(abs(got["released"][k][0] - got["released_plain"][k][0]) for k in got["released"]) < 1e-4
    assert max(abs(got["released"][k][0] - got["swiftkv"][k][0]) for k in got["released"]) > 1e-3


def test_a_swiftkv_fill_on_weights_without_swiftkvs_tensors_exits_2_naming_them(adapter_task, tmp_path):
    """Issue #41, item 4: a config that says llama_swiftkv over weights without SwiftKV's tensors ran on
    projections transformers initialised at random, with exit 0."""
    from safetensors.torch import load_file, save_file

    model = make_tiny_swiftkv(tmp_path / "swiftkv", num_key_value_layers=2, key_value_group_size=2)
    path = model / "model.safetensors"
    save_file({k: v for k, v in load_file(str(path)).items() if "_swiftkv" not in k}, str(path),
              metadata={"format": "pt"})
    proc = run_lm_eval(["--model", "ridgefill", "--model_args", f"pretrained={model},fill=swiftkv,tail=2",
                        "--tasks", TASK, "--include_path", str(adapter_task), "--limit", "1", "--device", "cpu",
                        "--output_path", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rf-eval: ") and "lacks" in last and "fill=swiftkv reads" in last and "Traceback" not in proc.stderr
