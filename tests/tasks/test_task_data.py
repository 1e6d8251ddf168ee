"""`rf_eval.tasks.data` and `rf-eval fetch-data`: what each task downloads, fetched ahead through the tasks'
own download functions (with stand-in sources here: no network), read back offline, and checked before
lm_eval loads a model."""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path

import pytest

from rf_eval.harness.lm_eval_ruler import ESSAY_HAYSTACK
from rf_eval.tasks import data, data_fetch, data_needs, ruler_data
from rf_eval.tasks.data_sources import source


@pytest.mark.parametrize("task, sources", [
    ("ruler_filled", ["essays", "punkt_tab"]),  # pools niah_single_1 (repeat haystack) with three essay tasks
    ("niah_single_1_filled", []),
    ("niah_multikey_2_filled", []),  # needle haystack
    ("niah_single_2_filled", ["essays", "punkt_tab"]),
    ("ruler_qa_squad_filled", ["squad"]),
    ("ruler_qa_hotpot_filled", ["hotpotqa"]),
    ("ruler_second_question", ["essays", "punkt_tab"]),
    ("longbench_v2_cot", ["longbench_v2"]),
    ("keytoken_nll", []),
    ("hellaswag", None),  # lm-eval's own task: not rf-eval's business
])
def test_what_each_task_downloads(task, sources):
    assert data_needs.needs([task]).get(task) == sources


def test_the_essay_list_is_lm_evals():
    """ESSAY_HAYSTACK names exactly the RULER niah generators of lm-eval that read the essay haystack."""
    niah = ruler_data.ruler_module("niah_utils")
    for task, (module, func, _, _) in ruler_data.RULER_TASKS.items():
        if module != "niah_utils":
            continue
        essay = 'type_haystack="essay"' in inspect.getsource(getattr(niah, func))
        assert essay == (task in ESSAY_HAYSTACK), task


def test_fetch_writes_what_the_tasks_read(stand_in_sources, tmp_path):
    out = tmp_path / "data"
    lines: list[str] = []
    manifest = data_fetch.fetch(["ruler_filled", "ruler_qa_squad_filled", "longbench_v2_cot", "keytoken_nll"], out,
                          log=lines.append)
    assert set(manifest["sources"]) == {"essays", "punkt_tab", "squad", "longbench_v2"}
    for entry in manifest["sources"].values():
        assert (out / entry["path"]).exists()
    essay_file = out / "paul_graham_essays.txt"
    assert manifest["sources"]["essays"]["sha256"] == hashlib.sha256(essay_file.read_bytes()).hexdigest()
    # the fetched file splits into the very haystack lm-eval's get_haystack builds from the same source
    assert ruler_data.essay_haystack(essay_file) == ruler_data.ruler_module("prepare_niah").get_haystack("essay")
    squad_url = source("squad").url()
    assert json.loads((out / "squad.json").read_text())["url"] == squad_url
    assert [i["_id"] for i in json.loads((out / "longbench_v2.json").read_text())] == \
        [i["_id"] for i in stand_in_sources["items"]]
    assert (out / "nltk_data" / "tokenizers" / "punkt_tab" / "english").is_dir()
    assert any("keytoken_nll: downloads nothing" in line for line in lines)
    # a second fetch keeps what is there
    calls = len(stand_in_sources["calls"])
    data_fetch.fetch(["ruler_filled"], out, log=lines.append)
    assert len(stand_in_sources["calls"]) == calls


def test_offline_preflight_names_the_fetch_command_and_the_local_option(no_punkt, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(data.TaskDataMissing) as err:
        data_needs.preflight(["ruler_filled", "niah_single_1_filled"], {"data_dir": str(tmp_path / "empty")})
    message = str(err.value)
    assert "\n" not in message
    assert "rf-eval fetch-data --tasks ruler_filled --out DIR" in message and "essay_haystack" in message
    assert "punkt_tab" in message and "niah_single_1_filled" not in message
    data_needs.preflight(["niah_single_1_filled", "hellaswag"], {})  # nothing to download: passes offline


def test_offline_preflight_passes_with_a_data_folder(no_punkt, stand_in_sources, monkeypatch, tmp_path):
    out = tmp_path / "data"
    data_fetch.fetch(["ruler_filled", "longbench_v2_cot"], out, log=lambda line: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data_needs.preflight(["ruler_filled", "longbench_v2_cot"], {"data_dir": str(out)})
    monkeypatch.setenv(data.DATA_ENV, str(out))
    data_needs.preflight(["ruler_filled", "longbench_v2_cot"], {})
    assert data.local_copy("essays", {}) == out / "paul_graham_essays.txt"
    assert data.local_copy("essays", {"essay_haystack": "/elsewhere"}) == Path("/elsewhere")  # the option wins


@pytest.mark.parametrize("metadata, says", [
    ({"essay_haystack": "/no/such/essays"}, "essay_haystack=/no/such/essays does not exist"),
    ({"data": "/no/such/longbench.json"}, "data=/no/such/longbench.json does not exist"),
    ({"docs": "/no/such/docs"}, "docs=/no/such/docs does not exist"),
    ({"data_dir": "/no/such/data"}, "data_dir=/no/such/data: no such folder"),
])
def test_preflight_refuses_local_copies_that_are_not_there(metadata, says):
    with pytest.raises(data.TaskDataMissing, match=says.replace(".", r"\.")):
        data_needs.preflight(["niah_single_2_filled", "longbench_v2_cot", "keytoken_nll"], metadata)


def test_a_data_folder_variable_naming_no_folder_is_said_to_be_missing(monkeypatch):
    monkeypatch.setenv("RF_EVAL_DATA", "/no/such/data")
    with pytest.raises(data.TaskDataMissing, match="RF_EVAL_DATA=/no/such/data: no such folder"):
        data_needs.preflight(["niah_single_1_filled"], {})
    data_needs.preflight(["hellaswag"], {})  # no rf-eval task reads it: not this run's concern


@pytest.mark.parametrize("argv, env, says", [
    (["--tasks", "ruler_filed", "--out", "{tmp}/d"], {}, "'ruler_filed' is not an rf-eval task; valid: "),
    (["--tasks", "ruler_filled", "--out", "{tmp}/file"], {}, "is a file; give a folder"),
    (["--tasks", "ruler_filled", "--out", "/proc/rf-eval/d"], {}, "--out /proc/rf-eval/d: cannot create this folder"),
    (["--tasks", "ruler_filled", "--out", "{tmp}/d"], {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
    (["--tasks", ",", "--out", "{tmp}/d"], {}, "--tasks ',' names no task"),
    (["--tasks", " , ,", "--out", "{tmp}/d"], {}, "names no task"),
])
def test_fetch_data_bad_input(argv, env, says, tmp_path, monkeypatch, capsys):
    from rf_eval.cli import main

    (tmp_path / "file").write_text("x")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["fetch-data", *[a.format(tmp=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_fetch_data_reports_a_failed_download(monkeypatch, tmp_path, capsys):
    import datasets

    from rf_eval.cli import main

    def refuse(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", refuse)
    assert main(["fetch-data", "--tasks", "longbench_v2_cot", "--out", str(tmp_path / "d")]) == 2
    assert "could not download the LongBench v2 dataset from huggingface.co (ConnectionError" in capsys.readouterr().err
    assert not (tmp_path / "d" / "longbench_v2.json").exists()


def _lm_eval(th, tiny_llama, tmp_path, name, metadata, env):
    args = ["--model", "ridgefill", "--model_args", f"pretrained={tiny_llama},fill=identity,split=1,tail=300,device=cpu",
            "--tasks", "ruler_filled", "--metadata", json.dumps(metadata), "--limit", "4",
            "--gen_kwargs", "max_gen_toks=4", "--device", "cpu"]
    out = tmp_path / name
    out.mkdir()
    proc = th.start_lm_eval(args, out, env)
    proc.wait(timeout=600)
    return proc, (tmp_path / f"{name}.log").read_text(), out


def test_lm_eval_offline_refuses_before_the_model_then_runs_from_fetched_data(
        th, tiny_llama, stand_in_sources, tmp_path, monkeypatch):
    """The acceptance of the data step: offline and without the data, the headline command stops in one line
    before any model loads; after fetch-data into a folder, the same command runs offline from it."""
    import os

    monkeypatch.delenv("NLTK_DATA", raising=False)
    env = {"NLTK_DATA": str(tmp_path / "no-nltk-data")}  # no punkt_tab anywhere nltk looks
    meta = {"max_seq_lengths": [1024]}
    proc, log, _ = _lm_eval(th, tiny_llama, tmp_path, "without", meta, env)
    assert proc.returncode == 2, log[-3000:]
    errors = [line for line in log.splitlines() if "rf-eval fetch-data" in line]
    assert len(errors) == 1 and errors[0].startswith("rf-eval: ruler_filled needs"), log[-3000:]
    assert "essay_haystack" in errors[0]
    assert "Traceback" not in log and "Initializing ridgefill model" not in log, log[-3000:]

    folder = tmp_path / "data"
    data_fetch.fetch(["ruler_filled"], folder, log=lambda line: None)  # the stand-in sources, no network
    os.environ.pop(data.DATA_ENV, None)
    proc, log, out = _lm_eval(th, tiny_llama, tmp_path, "with", {**meta, "data_dir": str(folder)}, env)
    assert proc.returncode == 0, log[-3000:]
    results = json.loads(sorted(out.rglob("results_*.json"))[-1].read_text())
    assert results["results"]["ruler_filled"]["n_filled,none"] + results["results"]["ruler_filled"]["n_excluded,none"] == 4


def test_a_fetched_file_edited_since_is_refused_where_it_is_read(stand_in_sources, monkeypatch, tmp_path):
    """The data folder's pieces are checked against the sha256 fetch-data recorded: an edited file is named,
    not scored; a folder without a manifest is the user's own and is read as it is."""
    out = tmp_path / "data"
    data_fetch.fetch(["ruler_filled", "longbench_v2_cot"], out, log=lambda line: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    essays = out / "paul_graham_essays.txt"
    original = essays.read_bytes()
    essays.write_bytes(original + b" one more sentence.")
    with pytest.raises(data.UserError, match=r"paul_graham_essays.txt: its sha256 .* is not the .* that fetch-data "
                                             r"recorded in .*manifest.json \(edited or replaced since\)"):
        data_needs.preflight(["ruler_filled"], {"data_dir": str(out)})
    with pytest.raises(data.UserError, match="paul_graham_essays.txt: its sha256"):  # where RULER reads it
        with ruler_data.local_sources({"data_dir": str(out)}, "niah_multikey_1"):
            pass
    essays.write_bytes(original)
    data_needs.preflight(["ruler_filled", "longbench_v2_cot"], {"data_dir": str(out)})  # restored: read again
    items = out / "longbench_v2.json"
    items.write_text(items.read_text().replace('"A"', '"B"', 1))
    with pytest.raises(data.UserError, match="longbench_v2.json: its sha256"):
        data.local_copy("longbench_v2", {"data_dir": str(out)})
    (out / data.MANIFEST).unlink()
    assert data.local_copy("longbench_v2", {"data_dir": str(out)}) == items  # no manifest: the user's own folder
