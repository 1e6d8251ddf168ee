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
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rf_eval.engine import shared_rows
from rf_eval.harness import task_index_cache
from rf_eval.study.jobs import ArmJob, Progress, iso_time
from rf_eval.tasks import ruler_cache

#: the variables of the disk caches a study turns on for what it runs (unless the user set them)
CACHE_VARIABLES = (task_index_cache.ENV, ruler_cache.ENV)


def with_study_caches(env: dict[str, str]) -> dict[str, str]:
    """`env` with the lm-eval task index and RULER samples caches on (`rf_eval.files.cache_folder.CacheFolder`)."""
    return ruler_cache.child_env(task_index_cache.child_env(env))


@contextmanager
def environ_set(values: Mapping[str, str]) -> Iterator[None]:
    """`os.environ` with `values` while the block runs; each of those variables as it was (or unset) after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def arm_env() -> dict[str, str]:
    """The environment an arm's lm_eval runs in: this one, with the study's caches on."""
    return with_study_caches(dict(os.environ, TOKENIZERS_PARALLELISM="false"))


def run_arm(job: ArmJob, in_process: bool = False) -> dict[str, Any]:
    """Run one arm to the end (a child process, or `in_process`: see InProcessLauncher); its `done.json`
    is written only when lm_eval exits 0."""
    out = Path(job.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    started = time.time()
    log_path = out / "logs" / f"{job.name}.log"
    if in_process:
        code = lm_eval_here(list(job.argv), log_path)
    else:
        with open(log_path, "a") as log:
            code = subprocess.run(list(job.argv), env=arm_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = time.time() - started
    if code != 0:
        raise RuntimeError(f"arm {job.name!r}: lm_eval exited {code}; see {out / 'logs' / f'{job.name}.log'}")
    record = {"arm": job.name, "fingerprint": job.fingerprint, "command": list(job.argv), "seconds": seconds,
              "started": iso_time(started), "finished": iso_time(time.time())}
    marker = Path(job.marker)
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(marker)
    return record


def lm_eval_here(argv: list[str], log_path: Path) -> int:
    """Run `python -m lm_eval ARGS` (argv as LocalLauncher builds it) in this process through lm-eval's own
    entry point, as a child process would: the arm's environment, torch on the thread count
    OMP_NUM_THREADS gives a child (reductions, so results, depend on it), everything written to
    stdout/stderr (file descriptors 1 and 2: Python, tqdm and C code alike) appended to `log_path`.
    Returns its exit status."""
    if argv[1:3] != ["-m", "lm_eval"]:
        raise ValueError(f"not an lm_eval command: {argv[:3]}")
    import traceback

    import torch
    from lm_eval.__main__ import cli_evaluate

    saved_argv, saved_env, saved_streams = sys.argv, dict(os.environ), (sys.stdout, sys.stderr)
    threads = torch.get_num_threads()
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    with open(log_path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            os.environ.update(arm_env())
            if os.environ.get("OMP_NUM_THREADS", "").isdigit():
                torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
            sys.stdout, sys.stderr = _fd_streams()  # also where a test harness had replaced them
            sys.argv = [saved_argv[0], *argv[3:]]
            cli_evaluate()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        except BaseException:  # noqa: BLE001 - an arm's failure is its exit status, as in a child process
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            sys.argv, (sys.stdout, sys.stderr) = saved_argv, saved_streams
            torch.set_num_threads(threads)
            os.environ.clear()
            os.environ.update(saved_env)
    return code


_STREAMS: list = []


def _fd_streams():
    """Text streams on file descriptors 1 and 2 themselves, made once and never closed: lm-eval's log handler
    keeps the stream it was made with, and it must write to whichever log fd 2 is at the time."""
    if not _STREAMS:
        _STREAMS.extend(open(fd, "w", buffering=1, closefd=False) for fd in (1, 2))  # noqa: SIM115
    return tuple(_STREAMS)


class LocalLauncher:
    """Arms as processes on this machine, `parallel` at a time (default 1: one after another)."""

    def __init__(self, parallel: int = 1):
        self.parallel = max(1, int(parallel))

    def argv(self, lm_eval_args: list[str]) -> list[str]:
        return [sys.executable, *lm_eval_args]

    in_process = False

    def run_one(self, job: ArmJob, progress: Progress) -> None:
        stop = threading.Event()
        watcher = threading.Thread(target=progress.watch, args=(job, stop), daemon=True)
        watcher.start()
        try:
            record = run_arm(job, self.in_process)
        finally:
            stop.set()
            watcher.join()
        progress.finished(job, record["seconds"])

    def run(self, jobs: list[ArmJob], progress: Progress) -> None:
        with ThreadPoolExecutor(self.parallel) as pool:
            for result in [pool.submit(self.run_one, job, progress) for job in jobs]:
                result.result()  # an arm's failure stops the study (finished arms stay done)


class InProcessLauncher(LocalLauncher):
    """Arms one after another inside this process, through lm-eval's own CLI entry point (`lm_eval_here`):
    each arm's command, log, `done.json` and results are those of LocalLauncher; what is saved is each
    arm's interpreter start and imports (about 15 s an arm on 2 cores, 12-13 s of them lm-eval's RULER
    word list), the stock model's rows that every `reference=exact` arm computes again for the same
    documents and the lower layers every arm of one split runs again over the same prompts
    (`rf_eval.engine.shared_rows`: found only under the full weights' sha256, the device, the thread count and
    the tokens, so bit for bit what the arm would compute; `rf_eval.engine.shared_lower`). For `rf-eval demo`, whose
    arms take under a minute; a study's arms each get a process (nothing else one arm leaves in memory
    can reach the next). Progress lines go to the terminal the launcher started on while the arm's
    output goes to its log."""

    in_process = True

    def __init__(self):
        super().__init__(1)
        self.rows = shared_rows.SharedRows()  # for every run() of this launcher: the reference, then the rest

    def run(self, jobs: list[ArmJob], progress: Progress) -> None:
        sys.stdout.flush()
        terminal = os.fdopen(os.dup(1), "w", buffering=1)
        progress.stream = terminal
        before = self.rows.hits, self.rows.passes
        try:
            with shared_rows.shared_rows(self.rows):
                for job in jobs:  # in this (the main) thread, one after another
                    self.run_one(job, progress)
            rows, passes = self.rows.hits - before[0], self.rows.passes - before[1]
            if rows or passes:
                print(f"[arms] read back from an earlier arm instead of computed again: the stock model's rows of "
                      f"{rows} prompts, the lower layers of {passes}", file=terminal)
        finally:
            progress.stream = None
            terminal.close()


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
