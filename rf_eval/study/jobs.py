"""What a study's launchers run and report: one arm's job, and the progress lines while arms run."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


@dataclass(frozen=True)
class ArmJob:
    name: str
    argv: tuple[str, ...]  # the full command (launcher prefix included)
    out: str  # the study's output folder
    fingerprint: str
    marker: str  # its done.json, written when lm_eval exits 0


def cached_requests(out: Path, arm: str) -> int:
    """Requests in the arm's --use_cache databases so far (a progress count; lm-eval writes as it goes)."""
    total = 0
    for db in (out / "cache").glob(f"{arm}_rank*.db"):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
                total += conn.execute("SELECT COUNT(*) FROM unnamed").fetchone()[0]
        except sqlite3.Error:
            pass
    return total


def iso_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="microseconds")


class Progress:
    """One line per arm as it runs: arms done, requests done, elapsed, estimate left (to `stream`).

    An arm's requests are counted as lm-eval caches them; their total is known once an arm has finished (the
    arms of a study run the same tasks on the same samples), and from then on each line shows done/total and
    an estimate of the time left at the arm's rate so far."""

    def __init__(self, out: Path, total: int, done: int):
        self.out, self.total, self.done, self.times = out, total, done, []
        self.requests: int | None = None  # one finished arm's request count
        self.lock = threading.Lock()
        self.stream = None  # None: sys.stdout

    def say(self, line: str) -> None:
        print(line, file=self.stream or sys.stdout, flush=True)

    def watch(self, job: ArmJob, stop: threading.Event) -> None:
        start, last = time.time(), -1
        while not stop.wait(5.0):
            count = cached_requests(self.out, job.name)
            if count != last:
                self.say(f"      {job.name}: {self.request_line(count, time.time() - start)}")
                last = count

    def request_line(self, count: int, elapsed: float) -> str:
        """"120/480 requests, 60s, about 180s left" (the total once an arm has finished; else the count)."""
        total = self.requests
        if not total or count > total:
            return f"{count} requests done, {elapsed:.0f}s"
        left = f", about {elapsed * (total - count) / count:.0f}s left" if count else ""
        return f"{count}/{total} requests, {elapsed:.0f}s{left}"

    def finished(self, job: ArmJob, seconds: float) -> None:
        with self.lock:
            self.requests = self.requests or cached_requests(self.out, job.name) or None
            self.done += 1
            self.times.append(seconds)
            left = (self.total - self.done) * sum(self.times) / len(self.times)
            self.say(f"[arms {self.done}/{self.total}] {job.name} done in {seconds:.0f}s; about {left:.0f}s left")
