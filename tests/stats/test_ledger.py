"""rf_eval.stats.ledger and registration; the `rf-eval ledger` command (paper section 9)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from rf_eval.cli import main
from rf_eval.stats.ledger import (
    GENESIS,
    LedgerError,
    append_entry,
    file_sha256,
    verify_ledger,
    verify_ledger_bytes,
)
from rf_eval.stats.registration import registration
from rf_eval.stats.runs import ArmRun

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def ledger(tmp_path):
    cfg = tmp_path / "arm.yaml"
    cfg.write_text("fill: ridge\nsplit: 12\n")
    other = tmp_path / "tasks.txt"
    other.write_text("niah_single_1\n")
    path = tmp_path / "ledger.jsonl"
    append_entry(path, claim="ridge is within 2 points of exact", prediction="NI bound > -2", configs=[cfg], now=T0)
    append_entry(path, claim="identity is worse", prediction="difference < -5", configs=[cfg, other], arms=["identity"], now=T0 + timedelta(hours=1))
    append_entry(path, claim="rows help ü", prediction="margin > 0 over random rows", configs=[other], now=T0 + timedelta(hours=2))
    return path, cfg


def test_chain_verifies_and_links(ledger):
    path, cfg = ledger
    entries = verify_ledger(path)
    assert [e.index for e in entries] == [0, 1, 2]
    assert entries[0].prev == GENESIS and entries[1].prev == entries[0].hash and entries[2].prev == entries[1].hash
    assert entries[0].configs == ((str(cfg), file_sha256(cfg)),)
    assert entries[2].claim == "rows help ü"  # stored as ASCII escapes, read back as text
    assert verify_ledger(path, head=entries[-1].hash) == entries


def test_changing_any_byte_fails_verification(ledger):
    path, _ = ledger
    original = path.read_bytes()
    verify_ledger_bytes(original)
    for i in range(len(original)):  # every byte, flipped to another value
        with pytest.raises(LedgerError):
            verify_ledger_bytes(original[:i] + bytes([original[i] ^ 0x01]) + original[i + 1 :])
    colon = original.index(b":")  # the same JSON content in other bytes (added whitespace)
    for tampered in (original[:colon] + b" " + original[colon:], original.replace(b"\n", b"\r\n", 1)):
        with pytest.raises(LedgerError):
            verify_ledger_bytes(tampered)
    for i in (0, len(original) // 2, len(original) - 1):  # and through the file
        path.write_bytes(original[:i] + bytes([original[i] ^ 0x20]) + original[i + 1 :])
        with pytest.raises(LedgerError):
            verify_ledger(path)


def test_reordering_and_deletion_fail(ledger):
    path, _ = ledger
    lines = path.read_bytes().splitlines(keepends=True)
    head = verify_ledger(path)[-1].hash
    for broken in ([lines[1], lines[0], lines[2]], [lines[0], lines[2]], [lines[1], lines[2]], lines + [lines[2]]):
        path.write_bytes(b"".join(broken))
        with pytest.raises(LedgerError):
            verify_ledger(path)
    path.write_bytes(b"".join(lines[:2]))  # deleting the last entry leaves a valid chain...
    verify_ledger(path)
    with pytest.raises(LedgerError, match="expected head"):  # ...which the recorded head catches
        verify_ledger(path, head=head)


def test_add_refuses_broken_ledgers_and_missing_configs(ledger, tmp_path):
    path, cfg = ledger
    with pytest.raises(LedgerError, match="config file not found"):
        append_entry(path, claim="c", prediction="p", configs=[tmp_path / "nope.yaml"])
    data = path.read_bytes()
    path.write_bytes(data.replace(b"ridge is within 2", b"ridge is within 3"))
    with pytest.raises(LedgerError, match="line 1"):
        append_entry(path, claim="c", prediction="p", configs=[cfg])


def _arm(name, started, hashes=()):
    return ArmRun(name, "hf", {}, started, (), frozenset(hashes))


def test_registration_before_or_after_the_run(ledger):
    path, cfg = ledger
    entries = verify_ledger(path)
    digest = file_sha256(cfg)
    assert registration(entries, _arm("ridge", T0 + timedelta(minutes=5), [digest])).status == "registered"
    late = registration(entries, _arm("ridge", T0 - timedelta(days=1), [digest]))
    assert late.status == "follow-up" and late.entry == 0
    named = registration(entries, _arm("identity", T0 + timedelta(days=1)))
    assert named.status == "registered" and named.entry == 1
    assert registration(entries, _arm("other", T0 + timedelta(days=1), ["f" * 64])).status == "not registered"


def test_cli_add_and_verify(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model_args: fill=ridge\n")
    led = tmp_path / "l.jsonl"
    assert main(["ledger", "add", "--claim", "c1", "--prediction", "p1", "--config", str(cfg), "--ledger", str(led)]) == 0
    head = capsys.readouterr().out.split("head ")[1].strip()
    assert main(["ledger", "verify", "--ledger", str(led), "--head", head]) == 0
    assert "chain intact" in capsys.readouterr().out
    led.write_text(led.read_text().replace("c1", "c2"))
    assert main(["ledger", "verify", "--ledger", str(led)]) == 2
    assert "line 1" in capsys.readouterr().err
    assert main(["ledger", "add", "--claim", "c", "--prediction", "p", "--config", str(tmp_path / "x"), "--ledger", str(tmp_path / "n.jsonl")]) == 2
