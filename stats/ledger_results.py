"""Per-item result files under the run ledger: recorded once, checked ever after (paper section 9).

The ledger's claim entries show what was predicted before the runs; they do
not cover what the runs produced, so a samples file edited after its run would
be reported as it is. A results entry (`kind: "results"`, `rf_eval.stats.
ledger`) holds the sha256 of each results and samples file a report read.
`record_results` appends one for the files no entry holds yet (a rerun of the
report adds nothing); `check_results` re-hashes every file any results entry
holds and names the first that was edited or removed. Paths under the ledger's
folder are stored relative to it, so a study folder can be moved whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from rf_eval.integrity.hashing import file_sha256
from rf_eval.stats.ledger import RESULTS, LedgerEntry, LedgerError, append_record

__all__ = ["check_results", "record_results", "recorded_files"]


def _stored(ledger: Path, file: Path) -> str:
    file, base = file.resolve(), ledger.resolve().parent
    return str(file.relative_to(base)) if file.is_relative_to(base) else str(file)


def _on_disk(ledger: Path, stored: str) -> Path:
    path = Path(stored)
    return path if path.is_absolute() else ledger.resolve().parent / path


def recorded_files(ledger: str | Path, entries: Sequence[LedgerEntry]) -> dict[Path, tuple[str, int]]:
    """Each file the results entries hold: its path on disk -> (sha256, index of the entry recording it)."""
    out: dict[Path, tuple[str, int]] = {}
    for entry in entries:
        if entry.kind == RESULTS:
            for stored, digest in entry.files:
                out.setdefault(_on_disk(Path(ledger), stored).resolve(), (digest, entry.index))
    return out


def check_results(ledger: str | Path, entries: Sequence[LedgerEntry]) -> int:
    """Re-hash every recorded result file; a `LedgerError` names the first edited or missing one.

    Returns how many files were checked.
    """
    files = recorded_files(ledger, entries)
    for path, (digest, index) in files.items():
        if not path.is_file():
            raise LedgerError(f"{path}: the result file that ledger entry {index} recorded is gone "
                              "(results registered in the ledger are kept)")
        now = file_sha256(path)
        if now != digest:
            raise LedgerError(f"{path}: edited after ledger entry {index} recorded it "
                              f"(sha256 {digest[:12]}... then, {now[:12]}... now)")
    return len(files)


def record_results(ledger: str | Path, entries: Sequence[LedgerEntry], files: Iterable[str | Path],
                   arms: Sequence[str] = ()) -> LedgerEntry | None:
    """Append a results entry for those of `files` no entry holds yet (None when every one is held).

    `entries` must be the ledger's verified entries, checked with `check_results`.
    """
    ledger = Path(ledger)
    held = recorded_files(ledger, entries)
    new = [Path(f) for f in dict.fromkeys(Path(f).resolve() for f in files) if Path(f) not in held]
    if not new:
        return None
    listed = [{"path": _stored(ledger, f), "sha256": file_sha256(f)} for f in sorted(new)]
    return append_record(ledger, entries, {"arms": list(arms), "files": listed, "kind": RESULTS})
