"""Was an arm's run registered in the ledger before it ran? (paper section 9, Registration).

A ledger entry covers an arm when it names the arm (`arms`) or holds the hash
of a file that configured the arm's run (a file named in its model_args, or a
file kept beside its results). The comparison is "registered" when such an
entry is older than the run's start (of the task's run for a per-task
comparison; of the earliest of the arm's runs for a pooled one), "follow-up" when the only covering
entries came after it, and "not registered" when none covers it. Results
entries (the sha256 of result files, recorded after the runs) register nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rf_eval.stats.ledger import LedgerEntry
from rf_eval.stats.runs import ArmRun

__all__ = ["Registration", "registration"]

Status = Literal["registered", "follow-up", "not registered"]


@dataclass(frozen=True)
class Registration:
    """Status of one arm, with the ledger entry it rests on (None when not registered)."""

    status: Status
    entry: int | None
    entry_time: str | None
    claim: str | None


def registration(entries: Sequence[LedgerEntry], arm: ArmRun, task: str | None = None) -> Registration:
    """The registration status of `arm`'s run (of one `task`, or of all) against verified `entries`."""
    started = arm.task_started.get(task, arm.started) if task is not None else arm.started
    covering = [e for e in entries if e.kind == "claim" and (arm.name in e.arms or e.config_hashes() & arm.config_hashes)]
    before = [e for e in covering if e.time < started]
    chosen = before[0] if before else (covering[0] if covering else None)
    if chosen is None:
        return Registration("not registered", None, None, None)
    status: Status = "registered" if before else "follow-up"
    return Registration(status, chosen.index, chosen.time.isoformat(timespec="seconds"), chosen.claim)
