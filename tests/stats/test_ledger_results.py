"""Per-item results under the ledger (#24 item 2): a samples file edited after a registered run fails."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rf_eval.cli import main
from rf_eval.stats.ledger import LedgerError, append_entry, verify_ledger, verify_ledger_bytes
from rf_eval.stats.ledger_results import check_results, record_results

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def fmt():
    spec = importlib.util.spec_from_file_location("rf_eval_tests_lmeval_format_lr", HERE / "lmeval_format.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def study(tmp_path, fmt):
    """A registered study folder: the ledger with one claim, then two arms' runs under it."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("arms: [exact, ridge]\n")
    ledger = tmp_path / "ledger.jsonl"
    append_entry(ledger, claim="ridge keeps accuracy", prediction="NI at 2 points", configs=[plan], arms=["ridge"])
    fmt.accuracy_run(tmp_path / "arms" / "exact", "exact", {"t": [True, False, True]}, started=1.9e9)
    fmt.accuracy_run(tmp_path / "arms" / "ridge", "ridge", {"t": [True, True, True]}, started=1.9e9 + 1)
    return tmp_path, ledger


def _report(folder: Path, ledger: Path, *extra: str) -> int:
    return main(["report", str(folder / "arms" / "exact"), str(folder / "arms" / "ridge"), "--reference", "exact",
                 "--ledger", str(ledger), "--html", str(folder / "r.html"), "--json", str(folder / "r.json"),
                 "--resamples", "100", *extra])


def _samples(folder: Path, arm: str) -> Path:
    return next((folder / "arms" / arm).rglob("samples_t_*.jsonl"))


def test_a_report_records_every_file_it_read_once(study, capsys):
    folder, ledger = study
    assert _report(folder, ledger) == 0
    assert "entry 1 records the sha256 of 4 result files" in capsys.readouterr().out
    entries = verify_ledger(ledger)
    results = entries[-1]
    assert results.kind == "results" and results.arms == ("exact", "ridge")
    stored = {p for p, _ in results.files}
    assert all(not Path(p).is_absolute() for p in stored)  # relative to the ledger: the folder can move whole
    assert any(p.startswith("arms/ridge/") and "samples_t_" in p for p in stored)
    assert _report(folder, ledger) == 0  # the same files: nothing new to record
    assert len(verify_ledger(ledger)) == 2
    assert main(["ledger", "verify", "--ledger", str(ledger)]) == 0
    assert "4 recorded result files unchanged" in capsys.readouterr().out
    # the results entry registers nothing: the claim before the runs still decides the status
    assert json.loads((folder / "r.json").read_text())["overall"][0]["registration"] == "registered"


def _score_flipped(path: Path) -> None:
    text = path.read_text()
    assert '"acc": 1.0' in text
    path.write_text(text.replace('"acc": 1.0', '"acc": 0.0', 1))  # one item's result turned into a failure


@pytest.mark.parametrize("tamper, message", [
    (_score_flipped, "edited after ledger entry 1 recorded it"),
    (lambda p: p.write_text(p.read_text() + "\n"), "edited after ledger entry 1 recorded it"),
    (lambda p: p.unlink(), "the result file that ledger entry 1 recorded is gone"),
])  # fmt: skip
def test_an_edited_or_removed_samples_file_fails_verify_and_the_report(study, capsys, tamper, message):
    folder, ledger = study
    assert _report(folder, ledger) == 0
    samples = _samples(folder, "ridge")
    tamper(samples)
    capsys.readouterr()
    assert main(["ledger", "verify", "--ledger", str(ledger)]) == 2
    err = capsys.readouterr().err
    assert str(samples.resolve()) in err and message in err
    (folder / "r.html").unlink()
    assert _report(folder, ledger) == 2
    err = capsys.readouterr().err
    assert str(samples.resolve()) in err and message in err
    assert not (folder / "r.html").exists()


def test_a_results_entry_is_chained_like_a_claim(study):
    folder, ledger = study
    entries = verify_ledger(ledger)
    entry = record_results(ledger, entries, [_samples(folder, "exact")], arms=["exact"])
    assert entry is not None and entry.prev == entries[-1].hash
    data = ledger.read_bytes()
    last = data.rindex(b'"sha256":"') + len(b'"sha256":"')
    flipped = data[:last] + (b"0" if data[last:last + 1] != b"0" else b"1") + data[last + 1:]
    with pytest.raises(LedgerError, match="line 2"):
        verify_ledger_bytes(flipped)
    assert check_results(ledger, verify_ledger(ledger)) == 1
    assert record_results(ledger, verify_ledger(ledger), [_samples(folder, "exact")]) is None
