"""Recorded ledger heads: `verify --expect-head HASH[:COUNT]` catches entries deleted from the end (issue #15)."""

from __future__ import annotations

import pytest

from rf_eval.cli import main
from rf_eval.stats.ledger import (
    Head,
    LedgerError,
    append_entry,
    ledger_from_env,
    ledger_head,
    parse_head,
    verify_ledger,
)


@pytest.fixture
def ledger(tmp_path):
    cfg = tmp_path / "plan.yaml"
    cfg.write_text("arms: [ridge]\n")
    path = tmp_path / "ledger.jsonl"
    for i in range(3):
        append_entry(path, claim=f"c{i}", prediction=f"p{i}", configs=[cfg])
    return path


def test_a_truncated_ledger_fails_against_a_recorded_head(ledger, capsys):
    head = ledger_head(ledger)
    assert head.count == 3
    assert main(["ledger", "verify", "--ledger", str(ledger), "--expect-head", str(head)]) == 0
    assert f"holds the expected head {head}" in capsys.readouterr().out
    ledger.write_text("".join(ledger.read_text().splitlines(keepends=True)[:2]))  # last entry deleted
    assert main(["ledger", "verify", "--ledger", str(ledger)]) == 0  # what the old verify said: "chain intact"
    capsys.readouterr()
    assert main(["ledger", "verify", "--ledger", str(ledger), "--expect-head", f"{head.hash}:3"]) == 2
    assert "holds 2 entries, fewer than the 3 of the recorded head" in capsys.readouterr().err
    assert main(["ledger", "verify", "--ledger", str(ledger), "--expect-head", head.hash]) == 2  # hash only
    assert "no entry has the recorded head hash" in capsys.readouterr().err


def test_a_recorded_head_still_verifies_after_later_entries(ledger, tmp_path):
    earlier = ledger_head(ledger)
    append_entry(ledger, claim="later", prediction="p", configs=[tmp_path / "plan.yaml"])
    assert len(verify_ledger(ledger, expect=earlier)) == 4
    assert len(verify_ledger(ledger, expect=Head(earlier.hash))) == 4


def test_a_rewritten_chain_fails_against_its_recorded_head(ledger, tmp_path):
    head = ledger_head(ledger)
    ledger.write_text("")
    for i in range(3):  # a new, valid chain of the same length
        append_entry(ledger, claim=f"other {i}", prediction="p", configs=[tmp_path / "plan.yaml"])
    with pytest.raises(LedgerError, match="not the recorded head"):
        verify_ledger(ledger, expect=head)


@pytest.mark.parametrize("text, message", [
    ("abc", "not HASH\\[:COUNT\\]"),
    ("0" * 64 + ":x", "COUNT must be a whole number"),
])  # fmt: skip
def test_bad_expected_heads(text, message):
    with pytest.raises(LedgerError, match=message):
        parse_head(text)


def test_runs_read_the_head_of_the_ledger_named_in_the_environment(ledger, monkeypatch):
    monkeypatch.delenv("RF_EVAL_LEDGER", raising=False)
    assert ledger_from_env() is None
    monkeypatch.setenv("RF_EVAL_LEDGER", str(ledger))
    got = ledger_from_env()
    assert got == {"path": str(ledger.resolve()), "hash": ledger_head(ledger).hash, "count": 3}
