"""Bad inputs, one table per surface (issue #15): the Python API and its prompts, `rf-eval fit`, `rf-eval ledger`.

Each row: the input, the fragment the message must hold, and the exit code (CLI) or error type (API).
The others: maps in tests/test_maps_checks.py, the report in tests/reports/test_report_guards.py, serve in
tests/serving/test_serving_bad_inputs.py, the adapter's model_args in tests/model_adapters/test_adapter_config.py.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from rf_eval.cli import main
from rf_eval.fields import ArmError
from rf_eval.ridge.maps import MapError
from rf_eval.ridgefill.method import RidgeFill

# (RidgeFill keyword arguments, error type, message fragment)
BAD_API = [
    ({"fill": "rigde"}, ArmError, "fill='rigde' is not valid; valid fills: exact, identity, kv_ridge, nofill, ridge"),
    ({"fill": "identity", "tail": 0}, ArmError, "tail must be >= 1"),
    ({"fill": "identity", "split": 0}, ArmError, "split 0 is below 1"),
    ({"fill": "identity", "chunk_size": 0}, ArmError, "chunk_size must be >= 1 or None, got 0"),
    ({"fill": "identity", "split": 6}, ArmError, "split 6 is outside 1..5 for this 6-layer model"),
    ({"fill": "ridge"}, ArmError, "fill=ridge needs maps="),
    ({"fill": "identity", "selector": "probe", "split": 3}, ArmError,
     "no attention layer among layers [3, 7, 11, 15] lies below split 3"),
    ({"fill": "identity", "selector": "attention(layers=4)", "split": 3}, ArmError,
     "no attention layer among layers [4] lies below split 3"),
    ({"fill": "identity", "selector": "random(of=probe)", "split": 2}, ArmError, "lies below split 2"),
    ({"fill": "identity", "selector": "source-attention"}, ArmError, "selector 'source-attention' is a rarecache selector"),
    ({"fill": "exact", "splice": "keys"}, ArmError, "they need a fill from predicted inputs (identity, ridge)"),
    ({"fill": "identity", "tial": 3}, ArmError, "'tial'"),
    ({"fill": "identity", "allow_other_weights": "perhaps"}, ArmError, "allow_other_weights='perhaps'"),
    ({"fill": "ridge", "maps": "/no/such/maps"}, MapError, "map path /no/such/maps does not exist"),
    ({"fill": "identity", "corrections": "value_rescale(reduce=median)"}, ArmError,
     "reduce='median' is not valid; valid reductions: mean_of_ratios, ratio_of_means"),
    ({"fill": "nofill", "cost_match": "ridge(tail=-1)"}, ArmError, "cost_match tail must be an integer >= 1, got -1"),
    ({"fill": "nofill", "cost_match": "ridge(tail=2.5)"}, ArmError, "cost_match tail must be an integer >= 1, got 2.5"),
    ({"fill": "nofill", "cost_match": "ridge(exact_share=5)"}, ArmError, "exact_share must be a share of the prompt in [0, 1]"),
    ({"fill": "nofill", "cost_match": "ridge(exact_rows=-3)"}, ArmError, "exact_rows must be an integer >= 0"),
    ({"fill": "nofill", "cost_match": "ridge(probe_rows=-1)"}, ArmError, "probe_rows must be an integer >= 0"),
    ({"fill": "identity", "maps_device": "gpu"}, ArmError, "maps_device='gpu' is not valid; valid: model, cpu"),
    ({"fill": "identity", "maps_device": "cpu"}, ArmError, "maps_device=cpu places maps: fill=identity reads none"),
]  # fmt: skip


def test_a_maps_link_that_leads_nowhere_is_called_so(tiny_model, tmp_path):
    """A maps path that is a link to itself is there (`ls` lists it): not "does not exist" (issue #54, item 5)."""
    model, tok = tiny_model("llama")
    loop = tmp_path / "maps.safetensors"
    loop.symlink_to(loop)
    with pytest.raises(MapError, match="is a link that leads to no file"):
        RidgeFill(model, tok, fill="ridge", maps=str(loop), split=2)


@pytest.mark.parametrize("kwargs, error, message", BAD_API)
def test_api_bad_inputs(tiny_model, kwargs, error, message):
    model, tok = tiny_model("llama")
    with pytest.raises(error) as err:
        RidgeFill(model, tok, **kwargs)
    assert message in str(err.value)


# (RidgeFill method, prompt ids, message fragment): what `prefill` and `prefill_batch` refuse
BAD_PROMPTS = [
    ("prefill", torch.tensor([5, 6, 7]), "must be a 1 x N tensor, got shape (3,)"),
    ("prefill", torch.tensor([[5, 6], [7, 8]]), "must be a 1 x N tensor, got shape (2, 2)"),
    ("prefill", torch.tensor([[1.0, 2.0]]), "must hold integer token ids"),
    ("prefill", torch.tensor([[5, 100000]]), "token id 100000 is outside the model's vocabulary"),
    ("prefill_batch", torch.tensor([5, 6, 7]), "must be a B x N tensor of prompts of one length, got (3,)"),
    ("prefill_batch", [[5, 6]], "must be a B x N tensor of prompts of one length, got <class 'list'>"),
    ("prefill_batch", torch.tensor([[5, 6], [7, 100000]]), "token id 100000 is outside the model's vocabulary"),
    ("prefill_batch", torch.zeros((2, 0), dtype=torch.long), "input_ids is empty"),
]  # fmt: skip


@pytest.mark.parametrize("method, ids, message", BAD_PROMPTS)
def test_prompt_bad_inputs(tiny_model, method, ids, message):
    model, tok = tiny_model("llama")
    rf = RidgeFill(model, tok, fill="identity", tail=1)
    with pytest.raises(ValueError) as err:
        getattr(rf, method)(ids)
    assert message in str(err.value)


# (fit arguments, with {model}, {file}, {full} and {tmp} filled in; message fragment; exit code)
BAD_FIT = [
    (["--model", "./missing", "--splits", "3"], "--model: model './missing': no such local folder", 2),
    (["--model", "{file}", "--splits", "3"], "is a file; give the model's folder", 2),
    (["--model", "{model}", "--splits", "3", "--out", "{file}"], "is a file; give a folder for the map files", 2),
    (["--model", "{model}", "--splits", "3", "--out", "{full}"], "is not empty; choose a new folder, or pass --overwrite", 2),
    (["--model", "{model}", "--splits", "3", "--device", "cuda"], "CUDA is not available on this machine", 2),
    (["--model", "{model}", "--splits", "3", "--device", "gpu9"], "is not a device name", 2),
    (["--model", "{model}"], "fit needs --model and --splits", 2),
    (["--from-sums", "{tmp}"], "--from-sums needs --lambdas", 2),
    (["--from-sums", "{tmp}", "--lambdas", "0.1"], "no saved sums (sums_split*.safetensors)", 2),
    (["--from-sums", "{tmp}/nowhere", "--lambdas", "0.1"], "--from-sums {tmp}/nowhere: no saved sums", 2),
    (["--from-sums", "{othersums}", "--lambdas", "0.1", "--model", "{model}"],
     "sums_split3.safetensors was captured from another model than --model", 2),
    (["--from-sums", "{badsums}", "--lambdas", "0.1", "--model", "{model}"], "cannot read --from-sums file", 2),
    (["--model", "{model}", "--splits", "3", "99"], "--splits: split 99 is outside 1..5 for this 6-layer model", 2),
    (["--model", "{model}", "--splits", "0"], "argument --splits: '0' must be an integer >= 1", 2),
    (["--model", "{model}", "--splits", "3", "--out", "{file}/maps"], "--out {file}/maps: cannot write in {file}", 2),
    (["--model", "{model}", "--splits", "3", "--out", "/proc/rf-eval-test/maps"], "cannot write in /proc/rf-eval-test", 2),
    (["--model", "{model}", "--splits", "3", "--calibration", "{badjsonl}"], "bad.jsonl:3: not JSON", 2),
    (["--model", "{model}", "--splits", "3", "--calibration", "{notext}"], "notext.jsonl:2: each JSONL line needs a string 'text' field", 2),
    (["--model", "{model}", "--splits", "3", "--calibration", "{tmp}/none.jsonl"], "none.jsonl does not exist", 2),
    (["--model", "{model}", "--splits", "3", "--calibration", "{badjsonl}", "{file}", "--heldout", "{file}"],
     "bad.jsonl:3: not JSON", 2),
    (["--model", "{model}", "--splits", "3", "--calibration", "{file}", "--heldout", "{file}"],
     "1 of the 1 held-out documents are also calibration documents", 2),
    (["--model", "{model}", "--splits", "3", "--calibration", "{file}", "--heldout", "{notext}"],
     "notext.jsonl:2: each JSONL line needs", 2),
]  # fmt: skip


@pytest.mark.parametrize("args, message, code", BAD_FIT)
def test_fit_bad_inputs_fail_before_the_model_loads(tiny_model_dir, tmp_path, capsys, monkeypatch, args, message,
                                                    code):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # `--device cuda` on a machine without one
    cal = tmp_path / "cal.txt"
    cal.write_text("some calibration text " * 20)
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("keep me")
    out = tmp_path / "out"
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n{"text": "three"\n')
    (tmp_path / "notext.jsonl").write_text('{"text": "one"}\n{"body": "two"}\n')
    for name, header in (("othersums", {"config_hash": "f" * 64, "split": "3"}), ("badsums", None)):
        (tmp_path / name).mkdir()
        if header is None:
            (tmp_path / name / "sums_split3.safetensors").write_bytes(b"\xff" * 12)
        else:
            save_file({"mean_x": torch.zeros(2)}, str(tmp_path / name / "sums_split3.safetensors"), metadata=header)
    values = {"model": tiny_model_dir("llama"), "file": str(cal), "full": str(full), "tmp": str(tmp_path),
              "badjsonl": str(tmp_path / "bad.jsonl"), "notext": str(tmp_path / "notext.jsonl"),
              "othersums": str(tmp_path / "othersums"), "badsums": str(tmp_path / "badsums")}
    argv = [a.format(**values) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(out)]
    if "--from-sums" not in argv and "--calibration" not in argv:
        argv += ["--calibration", str(cal)]
    assert main(["fit", *argv, "--no-progress"]) == code
    err = capsys.readouterr().err
    assert message.format(**values) in err
    assert "Loading weights" not in err  # refused before the model loaded
    assert not out.exists() and (full / "notes.txt").read_text() == "keep me"
    assert not list(tmp_path.glob(".*.partial"))


def test_fit_overwrite_writes_into_a_non_empty_folder_and_stages_the_files(tiny_model_dir, tmp_path, capsys):
    cal = tmp_path / "cal.txt"
    cal.write_text("some calibration text " * 20)
    out = tmp_path / "maps"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    args = ["fit", "--model", tiny_model_dir("llama"), "--splits", "3", "--calibration", str(cal), "--out", str(out),
            "--no-progress", "--device", "cpu", "--overwrite"]
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "notes.txt", "ridgefill_split3.safetensors", "sums_split3.safetensors", "unigram.safetensors"]
    assert str(out / "ridgefill_split3.safetensors") in capsys.readouterr().out
    assert not (tmp_path / ".maps.partial").exists()


# (ledger arguments, with {ledger}, {cfg}, {head} filled in; how the ledger is changed first; fragment; exit code)
BAD_LEDGER = [
    (["verify", "--ledger", "{tmp}/none.jsonl"], None, "no ledger at", 2),
    (["verify", "--ledger", "{ledger}"], "edit", "line 1: entry hash does not match its content (edited)", 2),
    (["verify", "--ledger", "{ledger}", "--expect-head", "{head}"], "truncate", "fewer than the 2 of the recorded head", 2),
    (["verify", "--ledger", "{ledger}", "--expect-head", "nothex"], None, "not HASH[:COUNT]", 2),
    (["verify", "--ledger", "{ledger}", "--head", "{zero}"], None, "is not the expected head", 2),
    (["add", "--ledger", "{ledger}", "--claim", "c", "--prediction", "p", "--config", "{tmp}/nope.yaml"], None,
     "config file not found", 2),
    (["add", "--ledger", "{ledger}", "--claim", " ", "--prediction", "p", "--config", "{cfg}"], None,
     "argument --claim: an empty value", 2),
    (["add", "--ledger", "{ledger}", "--claim", "c", "--prediction", "p", "--config", "{cfg}"], "edit", "line 1", 2),
    (["verify", "--ledger", "{ledger}"], "results-edit", "result.jsonl: edited after ledger entry 2 recorded it", 2),
    (["verify", "--ledger", "{ledger}"], "results-gone", "result.jsonl: the result file that ledger entry 2 recorded is gone", 2),
    (["verify", "--ledger", "{ledger}", "--expect-head", "{zero}:x"], None, "COUNT must be a whole number", 2),
    (["verify", "--ledger", "{ledger}"], "fields", "line 1: fields differ from arms, claim, configs", 2),
    (["verify", "--ledger", "{ledger}"], "garbage", "line 3: not valid JSON", 2),
    (["verify", "--ledger", "{ledger}"], "nonascii", "not ASCII (a canonical ledger is ASCII)", 2),
    (["verify", "--ledger", "{ledger}"], "unterminated", "the last line does not end with a newline", 2),
    (["verify", "--ledger", "{ledger}"], "reorder", "line 1: index 1 out of order", 2),
]  # fmt: skip


@pytest.mark.parametrize("args, change, message, code", BAD_LEDGER)
def test_ledger_bad_inputs(tmp_path, capsys, args, change, message, code):
    from rf_eval.stats.ledger import append_entry, ledger_head

    cfg = tmp_path / "plan.yaml"
    cfg.write_text("arms: [ridge]\n")
    ledger = tmp_path / "ledger.jsonl"
    append_entry(ledger, claim="c0", prediction="p0", configs=[cfg])
    append_entry(ledger, claim="c1", prediction="p1", configs=[cfg])
    head = ledger_head(ledger)
    if change and change.startswith("results"):
        from rf_eval.stats.ledger import verify_ledger
        from rf_eval.stats.ledger_results import record_results

        result = tmp_path / "result.jsonl"
        result.write_text('{"doc_id": 0, "acc": 1.0}\n')
        record_results(ledger, verify_ledger(ledger), [result])
        result.unlink() if change == "results-gone" else result.write_text('{"doc_id": 0, "acc": 0.0}\n')
    lines = ledger.read_text().splitlines(keepends=True)
    edits = {
        "edit": lambda: ledger.write_text("".join(lines).replace("c0", "cX")),
        "truncate": lambda: ledger.write_text(lines[0]),
        "fields": lambda: ledger.write_text(lines[0].replace('"arms"', '"army"') + lines[1]),
        "garbage": lambda: ledger.write_text("".join(lines) + "not json\n"),
        "nonascii": lambda: ledger.write_bytes("".join(lines).replace("c0", "c\u00e9").encode()),
        "unterminated": lambda: ledger.write_text("".join(lines).rstrip("\n")),
        "reorder": lambda: ledger.write_text(lines[1] + lines[0]),
    }
    if change in edits:
        edits[change]()
    values = {"tmp": str(tmp_path), "ledger": str(ledger), "cfg": str(cfg), "head": str(head), "zero": "0" * 64}
    assert main(["ledger", *[a.format(**values) for a in args]]) == code
    assert message in capsys.readouterr().err
