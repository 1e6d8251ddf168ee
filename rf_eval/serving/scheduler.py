"""First-come-first-served dynamic batching for `rf-eval serve` (RaReCache, appendix B.3).

Every generation request becomes a `Job` in one queue. One worker thread owns
the model: whenever it is idle it takes up to `max_batch` queued jobs, oldest
first, as one batch, and leaves the rest queued for the next one. A job whose
client has gone (its `cancel` event set) is dropped when it reaches the head
of the queue, and takes no place in a batch. `max_batch=1` serves one request
at a time, in arrival order.

What a batch shares is the backend's business (`Backend._run_batch`): the
prompts of one arm and one length are prefilled together where the method can
(`Method.prefill_batch`); every request's first token and the rest of
its generation then run one request after another, oldest first.

Each job carries `batch`, the record a response reports as `rf_batch`: the
batch's id (1, 2, ... in dispatch order), its size and the server's limit, the
job's position in it (0: the oldest), how long the job queued, and on the
scheduler's clock (seconds since it started) when the batch started and when
this job finished. A batch's end is the latest `finished` of its jobs.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_BATCH = 32  # the paper's scheduler (appendix B.3)


class Cancelled(Exception):
    """The job's client went away before the job ran."""


@dataclass(eq=False)
class Job:
    """One queued request: what the batch runner needs, and its outcome."""

    payload: Any  # what the runner reads (the backend's: prompt ids, arm, generation parameters, callbacks)
    cancel: threading.Event | None = None
    submitted: float = field(default_factory=time.perf_counter)
    seq: int = -1  # arrival order at the scheduler
    batch: dict[str, Any] | None = None
    result: Any = None
    error: BaseException | None = None
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def gone(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


class BatchScheduler:
    """The queue and the worker thread; `run(jobs, finish)` serves one batch and calls `finish(job, result,
    error)` for each job as it is done (a job it leaves unfinished is failed afterwards)."""

    def __init__(self, run: Callable[[list[Job], Callable[..., None]], None], max_batch: int = MAX_BATCH,
                 name: str = "rf-eval-scheduler", history: int = 4096):
        if int(max_batch) < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.run, self.max_batch, self.name = run, int(max_batch), name
        self.t0 = time.perf_counter()
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self.running: dict[str, Any] | None = None  # the batch being served
        self.history: deque[dict[str, Any]] = deque(maxlen=history)  # the last batches served
        self.batches = self.served = self.dropped = 0

    def clock(self) -> float:
        """Seconds since the scheduler started (the clock of `Job.batch`)."""
        return time.perf_counter() - self.t0

    # ---- the callers' side

    def submit(self, payload: Any, cancel: threading.Event | None = None) -> Job:
        job = Job(payload, cancel)
        with self._cond:
            job.seq = next(self._seq)
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return job

    def call(self, payload: Any, cancel: threading.Event | None = None) -> Any:
        """Queue `payload`, wait for its batch, return its result (its error raised; `Cancelled` if dropped)."""
        job = self.submit(payload, cancel)
        job.done.wait()
        if job.cancelled:
            raise Cancelled()
        if job.error is not None:
            raise job.error
        return job.result

    def state(self) -> dict[str, Any]:
        """What `/rf/info` reports: the limit, the queue, the batch in service and the totals so far."""
        with self._cond:
            queued = len(self._queue)
        running = self.running
        return {"max_batch": self.max_batch, "queued": queued, "running": running["size"] if running else 0,
                "batches": self.batches, "served": self.served, "dropped": self.dropped,
                "mean_batch_size": self.served / self.batches if self.batches else None}

    # ---- the worker's side

    def _take(self) -> list[Job]:
        """Up to max_batch live jobs from the head of the queue (waiting for one); gone clients dropped."""
        with self._cond:
            while True:
                batch: list[Job] = []
                while self._queue and len(batch) < self.max_batch:
                    job = self._queue.popleft()
                    if job.gone:
                        self._drop(job)
                        continue
                    batch.append(job)
                if batch:
                    return batch
                self._cond.wait()

    def _drop(self, job: Job) -> None:
        job.cancelled = True
        self.dropped += 1
        job.done.set()

    def finish(self, job: Job, result: Any = None, error: BaseException | None = None) -> None:
        """The runner's report that `job` is done (its result, or its error, or `Cancelled()`)."""
        if job.done.is_set():
            return
        if job.batch is not None:
            job.batch["finished"] = self.clock()
        if isinstance(error, Cancelled):
            self._drop(job)
            return
        job.result, job.error = result, error
        job.done.set()

    def _loop(self) -> None:
        while True:
            batch = self._take()
            started = self.clock()
            info = {"id": next(self._ids), "size": len(batch), "max": self.max_batch, "started": started}
            for position, job in enumerate(batch):
                job.batch = {**info, "position": position, "queued_seconds": started - (job.submitted - self.t0)}
            self.running = info
            try:
                self.run(batch, self.finish)
            except BaseException as err:  # the batch failed as a whole: each unfinished job gets the reason
                for job in batch:
                    self.finish(job, error=err)
            finally:
                for job in batch:
                    self.finish(job, error=RuntimeError("the batch ended without serving this request"))
                self.batches += 1
                self.served += len(batch)
                ends = [j.batch["finished"] for j in batch if j.batch and "finished" in j.batch]
                self.history.append({**info, "ended": max(ends) if ends else self.clock()})
                self.running = None
