"""The run ledger: a hash-chained log of registered claims (paper section 9, Registration).

Each entry records a claim, its predictions with their decision rules, the
sha256 of each of the run's configuration files and the hash of the entry
before it, so no entry can be edited, reordered or deleted without breaking
the chain. The file is JSON Lines; every line is the canonical serialization
of its entry (sorted keys, no spaces, ASCII), and `hash` is the sha256 of that
serialization without the `hash` field. Verification re-serializes every line
and compares bytes, so changing any byte fails. Deleting the *last* entries
leaves a valid shorter chain: record the head (hash and entry count) that
`append_entry` returns or `ledger_head` reads (the paper publishes a chain
index) and pass it to `verify_ledger(expect=...)`. Runs record it: the lm-eval
adapters put the head of the ledger named by `$RF_EVAL_LEDGER` in their
results (`config.rf_eval.ledger`), and `rf-eval report --ledger` checks every
run's recorded head against the ledger and records the head it saw.

A second kind of entry, `kind: "results"`, records the sha256 of per-item
result files after their runs (`rf_eval.stats.ledger_results`: a report with
`--ledger` adds one for the files it reads), so that an edit to a samples
file after it was registered fails `rf-eval ledger verify`. Claim entries have
no `kind` field (the ledger format before results entries existed).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rf_eval.integrity.hashing import file_sha256

__all__ = [
    "GENESIS", "LEDGER_ENV", "RESULTS", "Head", "LedgerEntry", "LedgerError", "append_entry", "append_record",
    "check_head", "file_sha256",
    "ledger_from_env", "ledger_head", "parse_head", "verify_ledger", "verify_ledger_bytes",
]  # fmt: skip

#: `prev` of the first entry.
GENESIS = "0" * 64
#: the environment variable naming the ledger whose head runs record
LEDGER_ENV = "RF_EVAL_LEDGER"
_FIELDS = ("arms", "claim", "configs", "hash", "index", "prediction", "prev", "time")
_RESULTS_FIELDS = ("arms", "files", "hash", "index", "kind", "prev", "time")
RESULTS = "results"


class LedgerError(ValueError):
    """The ledger is broken, or an entry cannot be added; the message names the line."""


@dataclass(frozen=True)
class LedgerEntry:
    """One registered claim (`configs` holds (path as given, sha256) pairs), or, with `kind` "results",
    the result files of runs (`files`: (path, sha256) pairs, paths relative to the ledger's folder
    where they lie under it)."""

    index: int
    time: datetime
    claim: str
    prediction: str
    configs: tuple[tuple[str, str], ...]
    arms: tuple[str, ...]
    prev: str
    hash: str
    kind: str = "claim"
    files: tuple[tuple[str, str], ...] = ()

    def config_hashes(self) -> frozenset[str]:
        return frozenset(digest for _, digest in self.configs)


def _canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _entry_hash(record: dict) -> str:
    return hashlib.sha256(_canonical({k: v for k, v in record.items() if k != "hash"}).encode()).hexdigest()


def _parse_line(number: int, line: str, prev: str) -> LedgerEntry:
    where = f"line {number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise LedgerError(f"{where}: not valid JSON ({err.msg})") from None
    fields = _RESULTS_FIELDS if isinstance(record, dict) and record.get("kind") == RESULTS else _FIELDS
    if not isinstance(record, dict) or tuple(sorted(record)) != fields:
        raise LedgerError(f"{where}: fields differ from {', '.join(fields)}")
    if _canonical(record) != line:
        raise LedgerError(f"{where}: bytes differ from the entry's canonical form (edited)")
    if record["index"] != number - 1:
        raise LedgerError(f"{where}: index {record['index']} out of order (entries reordered or deleted)")
    if record["prev"] != prev:
        raise LedgerError(f"{where}: previous-entry hash does not match (entry edited, reordered or deleted)")
    if record["hash"] != _entry_hash(record):
        raise LedgerError(f"{where}: entry hash does not match its content (edited)")
    try:
        when = datetime.fromisoformat(record["time"])
        configs = tuple((str(c["path"]), str(c["sha256"])) for c in record.get("configs", ()))
        files = tuple((str(c["path"]), str(c["sha256"])) for c in record.get("files", ()))
    except (TypeError, ValueError, KeyError):
        raise LedgerError(f"{where}: malformed time, config or file list") from None
    return LedgerEntry(
        index=record["index"],
        time=when,
        claim=record.get("claim", ""),
        prediction=record.get("prediction", ""),
        configs=configs,
        arms=tuple(record["arms"]),
        prev=record["prev"],
        hash=record["hash"],
        kind=record.get("kind", "claim"),
        files=files,
    )


@dataclass(frozen=True)
class Head:
    """A recorded head of the chain: the last entry's hash and the entry count (None: unknown)."""

    hash: str
    count: int | None = None

    def __str__(self) -> str:
        return self.hash if self.count is None else f"{self.hash}:{self.count}"


def parse_head(text: str) -> Head:
    """`HASH` or `HASH:COUNT` (as `rf-eval ledger verify` prints and results record)."""
    digest, sep, count = str(text).strip().partition(":")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
        raise LedgerError(f"expected head {text!r}: not HASH[:COUNT] with a 64-hex-digit sha256")
    if sep and not count.isdigit():
        raise LedgerError(f"expected head {text!r}: COUNT must be a whole number")
    return Head(digest.lower(), int(count) if sep else None)


def check_head(entries: Sequence[LedgerEntry], expect: Head) -> None:
    """The chain must hold the recorded head: entry COUNT-1 has hash HASH (any entry, without a count).

    Entries appended after the head was recorded are fine; a chain cut before
    it, or rewritten, fails.
    """
    if expect.count is not None:
        if expect.count == 0:
            return
        if len(entries) < expect.count:
            raise LedgerError(f"the ledger holds {len(entries)} entries, fewer than the {expect.count} of the "
                              f"recorded head {expect.hash[:12]}... (entries deleted from the end)")
        if entries[expect.count - 1].hash != expect.hash:
            raise LedgerError(f"entry {expect.count - 1} has hash {entries[expect.count - 1].hash[:12]}..., not the "
                              f"recorded head {expect.hash[:12]}... (the chain was rewritten)")
        return
    if expect.hash not in {e.hash for e in entries}:
        raise LedgerError(f"no entry has the recorded head hash {expect.hash[:12]}... "
                          "(entries deleted from the end, or the chain rewritten)")


def verify_ledger(path: str | Path, *, head: str | None = None, expect: Head | None = None) -> list[LedgerEntry]:
    """Read and verify the whole chain; return its entries or raise `LedgerError`.

    `head`, if given, must be the hash of the last entry (catches deleted tail entries);
    `expect`, a recorded `Head`, must be in the chain (see `check_head`).
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise LedgerError(f"no ledger at {path}") from None
    entries = verify_ledger_bytes(data, head=head)
    if expect is not None:
        check_head(entries, expect)
    return entries


def ledger_head(path: str | Path) -> Head:
    """The verified head of the ledger at `path` (count 0 and GENESIS for an empty one)."""
    entries = verify_ledger(path)
    return Head(entries[-1].hash if entries else GENESIS, len(entries))


def ledger_from_env() -> dict[str, object] | None:
    """{path, hash, count} of the ledger named by $RF_EVAL_LEDGER (None when unset); an error when unreadable."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return None
    head = ledger_head(path)
    return {"path": str(Path(path).resolve()), "hash": head.hash, "count": head.count}


def verify_ledger_bytes(data: bytes, *, head: str | None = None) -> list[LedgerEntry]:
    """`verify_ledger` on the ledger's content."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as err:
        raise LedgerError(f"byte {err.start}: not ASCII (a canonical ledger is ASCII)") from None
    if text and not text.endswith("\n"):
        raise LedgerError("the last line does not end with a newline (truncated or edited)")
    entries: list[LedgerEntry] = []
    prev = GENESIS
    lines = text[:-1].split("\n") if text else []
    for number, line in enumerate(lines, start=1):
        entry = _parse_line(number, line, prev)
        if entries and entry.time < entries[-1].time:
            raise LedgerError(f"line {number}: time goes backwards")
        entries.append(entry)
        prev = entry.hash
    if head is not None and prev != head:
        raise LedgerError(f"the last entry's hash {prev[:12]}... is not the expected head {head[:12]}...")
    return entries


def append_entry(
    path: str | Path,
    *,
    claim: str,
    prediction: str,
    configs: Sequence[str | Path],
    arms: Sequence[str] = (),
    now: datetime | None = None,
) -> LedgerEntry:
    """Verify the ledger (a missing file starts a new one), then append one entry.

    Returns the new entry; its `hash` is the new head of the chain.
    """
    path = Path(path)
    entries = verify_ledger(path) if path.exists() else []
    if not claim.strip() or not prediction.strip():
        raise LedgerError("an entry needs a claim and a prediction")
    if not configs:
        raise LedgerError("an entry needs at least one config file")
    hashed = []
    for cfg in configs:
        if not Path(cfg).is_file():
            raise LedgerError(f"config file not found: {cfg}")
        hashed.append({"path": str(cfg), "sha256": file_sha256(cfg)})
    record = {"arms": list(arms), "claim": claim, "configs": hashed, "prediction": prediction}
    return append_record(path, entries, record, now)


def append_record(path: str | Path, entries: Sequence[LedgerEntry], record: dict, now: datetime | None = None
                  ) -> LedgerEntry:
    """Chain `record` (an entry's own fields) after the verified `entries` of the ledger at `path` and append it."""
    path = Path(path)
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    if entries and when < entries[-1].time:
        raise LedgerError("the clock is behind the last entry's time")
    record = {**record, "index": len(entries), "prev": entries[-1].hash if entries else GENESIS,
              "time": when.isoformat(timespec="microseconds")}
    record["hash"] = _entry_hash(record)
    line = _canonical(record) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="ascii") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    return _parse_line(len(entries) + 1, line[:-1], record["prev"])
