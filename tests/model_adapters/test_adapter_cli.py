"""The plain `lm_eval` command with `--model ridgefill`, in a subprocess, on a tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from adapter_helpers import GEN_TASK, TASK, loglikelihoods, run_lm_eval, samples

RULER = ["--metadata", '{"max_seq_lengths":[512]}']

# lm-eval's own CLI entry point, stopped dead (os._exit) once K results reached its --use_cache database.
KILLED_AFTER_K = """
import os, sys, time
from lm_eval.api import model
k, seen, store = int(os.environ["RFE_KILL_AFTER"]), [0], model.CacheHook.add_partial
def add_partial(self, attr, req, res):
    store(self, attr, req, res)
    seen[0] += 1
    if seen[0] >= k:
        time.sleep(0.5)  # let the database's writer thread commit, then die like a killed process
        os._exit(137)
model.CacheHook.add_partial = add_partial
sys.argv[0] = "lm_eval"
from lm_eval.__main__ import cli_evaluate
cli_evaluate()
"""


def check(proc) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_exact_arm_matches_lm_eval_hf(tiny_model_dir, adapter_task, tmp_path):
    model = tiny_model_dir("llama")
    common = ["--tasks", f"{TASK},{GEN_TASK}", "--include_path", str(adapter_task),
              "--limit", "6", "--device", "cpu", "--log_samples"]
    check(run_lm_eval(["--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
                       "--output_path", str(tmp_path / "hf"), *common], tmp_path))
    check(run_lm_eval(["--model", "ridgefill", "--model_args", f"pretrained={model},fill=exact,tail=1024",
                       "--output_path", str(tmp_path / "rf"), *common], tmp_path))
    hf, rf = loglikelihoods(tmp_path / "hf"), loglikelihoods(tmp_path / "rf")
    assert hf.keys() == rf.keys() and len(hf) == 18
    assert max(abs(hf[k][0] - rf[k][0]) for k in hf) <= 1e-5
    assert all(hf[k][1] == rf[k][1] for k in hf)
    gen_hf, gen_rf = samples(tmp_path / "hf", GEN_TASK), samples(tmp_path / "rf", GEN_TASK)
    assert gen_hf.keys() == gen_rf.keys() and len(gen_hf) == 6
    assert all(gen_hf[k]["resp"] == gen_rf[k]["resp"] for k in gen_hf)
    assert any(gen_hf[k]["resp"].strip() for k in gen_hf)  # something was generated
    results = json.loads(next((tmp_path / "rf").rglob("results_*.json")).read_text())
    info = results["config"]["rf_eval"]
    assert (info["fill"], info["split"], info["tail"], info["method"]) == ("exact", 3, 1024, "ridgefill")


def _one_line(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("rf-eval: ")]


def test_bad_model_args_exit_2_with_one_line_through_the_lm_eval_command(tiny_model_dir, adapter_task, tmp_path):
    proc = run_lm_eval(["--model", "ridgefill", "--model_args", f"pretrained={tiny_model_dir('llama')},fill=rigde",
                        "--tasks", TASK, "--include_path", str(adapter_task), "--device", "cpu"], tmp_path)
    assert proc.returncode == 2
    assert _one_line(proc.stderr) == ["rf-eval: method=ridgefill: fill='rigde' is not valid; valid fills: exact, identity, kv_ridge, nofill, ridge, swiftkv, swiftkv_released"]


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA exists here: device=cuda is valid")


@pytest.mark.parametrize("model, args, says", [
    ("ridgefill", "fill=identity,rho=0.1", "model_args rho=0.1 is a key of method=rarecache, not of method=ridgefill"),
    ("ridgefill", "fill=exact,seed=abc", "seed='abc' is not an integer"),
    ("ridgefill", "fill=exact,device=gpu", "device='gpu': device 'gpu' is not a device name"),
    pytest.param("ridgefill", "fill=exact,device=cuda", "CUDA is not available on this machine", marks=NO_CUDA),
    ("ridgefill", "fill=identity,split=99", "split 99 is outside 1..5"),
    ("ridgefill", "fill=exact,tail=0", "tail must be >= 1"),
    ("ridgefill", "fill=ridge,maps=/no/such/maps", "maps='/no/such/maps'"),
    ("ridgefill", "fill=exact,selector=attentoin", "unknown selector 'attentoin'; valid ridgefill selectors: attention"),
    ("ridgefill", "fill=exact,reference=hf", "reference='hf' is not valid; valid: exact"),
    ("ridgefill", "fill=exact,dtype=float33", "dtype='float33' is not valid"),
    ("ridgefill", "pretrained=/no/such/model,fill=exact", "model '/no/such/model': no such local folder"),
    ("rarecache", "source={model},maps=/m,split=2", "model_args split=2 is a key of method=ridgefill"),
])
def test_bad_model_args_table(model, args, says, tiny_model_dir, adapter_task, monkeypatch, capsys):
    """lm-eval's own CLI entry point (the `lm_eval` command's), in this process: exit status 2 and one line
    naming the value, before any model loads."""
    import logging

    import lm_eval.utils
    from lm_eval.__main__ import cli_evaluate

    # lm-eval makes its log handler once per process, on the stderr of the time (an earlier test's): a new one
    monkeypatch.setattr(logging.getLogger("lm_eval"), "handlers", [])
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)
    tiny = tiny_model_dir("llama")
    model_args = args.format(model=tiny) if args.startswith("pretrained=") else f"pretrained={tiny},{args.format(model=tiny)}"
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", model, "--model_args", model_args, "--tasks", TASK,
                                      "--include_path", str(adapter_task), "--device", "cpu"])
    with pytest.raises(SystemExit) as stop:
        cli_evaluate()
    assert stop.value.code == 2
    lines = _one_line(capsys.readouterr().err)
    assert len(lines) == 1 and says in lines[0], lines


def test_killed_run_resumes_from_use_cache_outside_the_repository(tiny_model_dir, adapter_task, tmp_path):
    """A run killed half-way resumes from --use_cache; started outside the repository, with no
    --include_path for the project's tasks (found through the startup hook)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert not (outside / "tasks").exists()
    model = tiny_model_dir("llama")
    args = ["--model", "ridgefill", "--model_args", f"pretrained={model},fill=identity,tail=8",
            "--tasks", f"{TASK},niah_single_1_filled", "--include_path", str(adapter_task), *RULER,
            "--limit", "2", "--device", "cpu", "--use_cache", str(tmp_path / "cache" / "rf"), "--log_samples",
            "--output_path", str(tmp_path / "out")]
    import os

    os.environ["RFE_KILL_AFTER"] = "3"
    try:
        killed = run_lm_eval(args, outside, command=[sys.executable, "-c", KILLED_AFTER_K])
    finally:
        del os.environ["RFE_KILL_AFTER"]
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert not (tmp_path / "out").exists()
    resumed = run_lm_eval(args, outside)
    check(resumed)
    assert "Cached requests: 3, Requests remaining: 3" in resumed.stderr  # 2 docs x 3 choices
    got = loglikelihoods(tmp_path / "out")

    # the same requests, computed afresh in this process by the same adapter: identical values
    import torch
    from lm_eval.api.instance import Instance

    from rf_eval.model_adapters import prefill_lm
    torch.set_num_threads(1)
    lm = prefill_lm.ridgefill.create_from_arg_string(f"pretrained={model},fill=identity,tail=8,device=cpu")
    recs = samples(tmp_path / "out", TASK)
    keys = sorted(recs)
    fresh = lm.loglikelihood([Instance("loglikelihood", {}, tuple(recs[k]["rec"]["arguments"][f"gen_args_{k[1]}"].values()), 0)
                              for k in keys])
    assert [got[k] for k in keys] == [(float(f"{lp}"), g) for lp, g in fresh]
    filled = samples(tmp_path / "out", "niah_single_1_filled")
    assert len(filled) == 2 and all("filled" in v["rec"] for v in filled.values())
    assert Path(json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["config"]["use_cache"])


def test_probe_with_a_maps_folder_runs_to_the_end(tiny_model, tiny_model_dir, adapter_task, tmp_path, monkeypatch):
    """`--model_args ...,maps=FOLDER,selector=probe` through the lm_eval CLI (issue #15 acceptance): a folder
    written by a fit (maps, sums, unigram table) at a split with an attention layer below it runs to the end
    and records the ledger head; at a split with none below it fails before the weights load."""
    from rf_eval.ridgefill.fitting import fit_maps
    from rf_eval.stats.ledger import append_entry, ledger_head

    model, tok = tiny_model("llama")
    cal = tmp_path / "cal.txt"
    cal.write_text("the cat sat on the mat and the dog ran to the red house by the river " * 8)
    for split in (3, 4):
        fit_maps(model, tok, splits=[split], calibration=[str(cal)], lambdas=[0.03], out=tmp_path / f"maps{split}",
                 progress=False)
    ledger = tmp_path / "ledger.jsonl"
    append_entry(ledger, claim="probe arm runs", prediction="acc recorded", configs=[cal])
    monkeypatch.setenv("RF_EVAL_LEDGER", str(ledger))
    path = tiny_model_dir("llama")
    common = ["--tasks", TASK, "--include_path", str(adapter_task), "--limit", "3", "--device", "cpu"]
    proc = run_lm_eval(["--model", "ridgefill", "--model_args",
                        f"pretrained={path},fill=ridge,maps={tmp_path / 'maps4'},selector=probe,tail=8",
                        "--output_path", str(tmp_path / "out"), "--log_samples", *common], tmp_path)
    check(proc)
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    info = results["config"]["rf_eval"]
    assert info["selector"]["name"] == "probe" and info["split"] == 4
    assert info["weights_sha256"] == info["maps_metadata"]["weights_sha256"]
    head = ledger_head(ledger)
    assert info["ledger"] == {"path": str(ledger.resolve()), "hash": head.hash, "count": 1}
    assert len(loglikelihoods(tmp_path / "out")) == 9
    early = run_lm_eval(["--model", "ridgefill", "--model_args",
                         f"pretrained={path},fill=ridge,maps={tmp_path / 'maps3'},selector=probe,tail=8", *common],
                        tmp_path)
    assert early.returncode != 0
    assert "no attention layer among layers [3, 7, 11, 15] lies below split 3" in early.stderr
    assert "Loading weights" not in early.stderr  # refused at arm resolve, before the weights load
