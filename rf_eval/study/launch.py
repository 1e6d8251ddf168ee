"""Where a study's arms run: one after another (or K at a time) here, data parallel under accelerate, or
as dependent Slurm jobs through `submitit` (`rf_eval.study.slurm`; its local executor runs the same path on
one machine).

Each arm is `run_arm(job)`: one `lm_eval` process whose output goes to the
arm's log, then an atomic `done.json` with its fingerprint and timings. A
launcher only decides where and how many `run_arm` calls run at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ArmJob:
    name: str
    argv: tuple[str, ...]  # the full command (launcher prefix included)
    out: str  # the study's output folder
    fingerprint: str
    marker: str  # its done.json, written when lm_eval exits 0


def run_arm(job: ArmJob) -> dict[str, Any]:
    """Run one arm to the end; its `done.json` is written only when lm_eval exits 0."""
    from rf_eval.task_index_cache import child_env

    out = Path(job.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = child_env(dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    started = time.time()
    with open(out / "logs" / f"{job.name}.log", "a") as log:
        code = subprocess.run(list(job.argv), env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.time() - started
    if code != 0:
        raise RuntimeError(f"arm {job.name!r}: lm_eval exited {code}; see {out / 'logs' / f'{job.name}.log'}")
    record = {"arm": job.name, "fingerprint": job.fingerprint, "command": list(job.argv), "seconds": seconds,
              "started": _iso(started), "finished": _iso(time.time())}
    marker = Path(job.marker)
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(marker)
    return record


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="microseconds")


class Progress:
    """One line per arm as it runs: arms done, requests done, elapsed, estimate left."""

    def __init__(self, out: Path, total: int, done: int):
        self.out, self.total, self.done, self.times = out, total, done, []
        self.lock = threading.Lock()

    def watch(self, job: ArmJob, stop: threading.Event) -> None:
        from rf_eval.study.runner import cached_requests

        start, last = time.time(), -1
        while not stop.wait(5.0):
            count = cached_requests(self.out, job.name)
            if count != last:
                print(f"      {job.name}: {count} requests done, {time.time() - start:.0f}s", flush=True)
                last = count

    def finished(self, job: ArmJob, seconds: float) -> None:
        with self.lock:
            self.done += 1
            self.times.append(seconds)
            left = (self.total - self.done) * sum(self.times) / len(self.times)
            print(f"[arms {self.done}/{self.total}] {job.name} done in {seconds:.0f}s; about {left:.0f}s left", flush=True)


class LocalLauncher:
    """Arms as processes on this machine, `parallel` at a time (default 1: one after another)."""

    def __init__(self, parallel: int = 1):
        self.parallel = max(1, int(parallel))

    def argv(self, lm_eval_args: list[str]) -> list[str]:
        return [sys.executable, *lm_eval_args]

    def run(self, jobs: list[ArmJob], progress: Progress) -> None:
        def one(job: ArmJob) -> None:
            stop = threading.Event()
            watcher = threading.Thread(target=progress.watch, args=(job, stop), daemon=True)
            watcher.start()
            try:
                record = run_arm(job)
            finally:
                stop.set()
            progress.finished(job, record["seconds"])

        with ThreadPoolExecutor(self.parallel) as pool:
            for result in [pool.submit(one, job) for job in jobs]:
                result.result()  # an arm's failure stops the study (finished arms stay done)


class AccelerateLauncher(LocalLauncher):
    """Each arm data parallel over this machine's devices: `accelerate launch -m lm_eval` (one arm at a time)."""

    def __init__(self, processes: int):
        super().__init__(1)
        self.processes = int(processes)

    def argv(self, lm_eval_args: list[str]) -> list[str]:
        # --multi_gpu: one process per device through torch.distributed (gloo where there is no GPU)
        several = ["--multi_gpu"] if self.processes > 1 else []
        return [sys.executable, "-m", "accelerate.commands.launch", *several, "--num_processes", str(self.processes),
                *lm_eval_args]


def make_launcher(name: str, out: Path, *, parallel: int | None = None, processes: int = 1, partition: str | None = None,
                  gpus: int = 1, minutes: int = 240, slurm_cluster: str | None = None, detach: bool = False):
    """The launcher `name` (local, accelerate, slurm); a ValueError names a bad choice before anything runs."""
    if detach and name != "slurm":
        raise ValueError(f"--detach is for --launcher slurm (its jobs run on without this process), not {name}")
    if name == "local":
        return LocalLauncher(parallel or 1)
    if name == "accelerate":
        return AccelerateLauncher(processes)
    if name == "slurm":
        from rf_eval.study.slurm import SlurmLauncher

        return SlurmLauncher(out / "slurm", partition=partition, gpus=gpus, minutes=minutes, parallel=parallel or 64,
                             cluster=slurm_cluster, detach=detach)
    raise ValueError(f"unknown launcher {name!r}; valid launchers: local, accelerate, slurm")
