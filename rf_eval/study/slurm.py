"""`--launcher slurm`: a registered study as dependent Slurm jobs, submitted at once through `submitit`.

    fit (when the study's `fit:` block has not run) -> reference arm (when the others read its
    key tokens) -> the other arms, one job array -> the report

Each job starts only after the jobs before it ended well (`--dependency=afterok:...`,
with `--kill-on-invalid-dep=yes`, so a failure cancels what waits for it), and
each resolves what it needs inside its own job: the maps the fit job wrote, the
reference arm's samples file (`key_reference`), the arm's fingerprint. So
nothing waits on the login node: `--detach` returns once the jobs are
submitted, and the report job writes the report after the last arm. Without
`--detach` the runner follows the jobs and prints each as it ends.

Inside a job, the steps are the local runner's own (`arm_job`, `run_arm`,
`fit_maps_once`, `finish_study`), so a study gives the same samples on either.
A step whose inputs are not in the study's folder when it starts (which
`afterok` rules out unless the folder is not on a filesystem every node sees)
fails naming the folder. submitit's local executor (`--slurm-cluster local`,
what the tests use) knows no dependencies: its jobs start at once, and each
waits until the steps before it are done, or one of them failed.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rf_eval.study.launch import run_arm
from rf_eval.study.runner import (
    arm_finished,
    arm_job,
    arm_stages,
    finish_study,
    fit_maps_once,
    maps_location,
    maps_ready,
)
from rf_eval.study.spec import Study, StudyError
from rf_eval.study.state import is_done, load_state, save_state

FIT, REPORT = "fit", "report"  # the steps that are not arms


class SlurmLauncher:
    """The study's steps as Slurm jobs with `afterok` dependencies (see the module docstring);
    `cluster="local"` runs them with submitit's local executor."""

    submits_study = True

    def __init__(self, folder: Path, *, partition: str | None = None, gpus: int = 1, minutes: int = 240,
                 parallel: int = 64, cluster: str | None = None, detach: bool = False, poll: float = 2.0):
        self.folder, self.partition, self.gpus, self.minutes = Path(folder), partition, gpus, minutes
        if cluster is None:  # submitit would fall back to its local executor without a word
            if shutil.which("sbatch") is None or shutil.which("srun") is None:
                raise ValueError("--launcher slurm: no Slurm here (no sbatch and srun on PATH); run it on the cluster's "
                                 "login node, or pass --slurm-cluster local to run the jobs on this machine")
            cluster = "slurm"
        self.parallel, self.cluster, self.detach, self.poll = parallel, cluster, detach, poll
        if detach and cluster == "local":
            raise ValueError("--detach needs a Slurm cluster: the local executor's jobs end with this process")

    def argv(self, lm_eval_args: list[str]) -> list[str]:
        return [sys.executable, *lm_eval_args]

    # ---- submission (on the login node)

    def executor(self, name: str, after: list[str], *, gpus: int | None = None, minutes: int | None = None):
        try:
            import submitit
        except ImportError:
            raise RuntimeError("--launcher slurm needs submitit: pip install 'rf-eval[cluster]'") from None
        executor = submitit.AutoExecutor(folder=str(self.folder), cluster=self.cluster)
        params: dict[str, Any] = {"timeout_min": minutes or self.minutes, "name": f"rf-eval-{name}",
                                  "slurm_array_parallelism": self.parallel}
        if self.cluster != "local":
            gpus = self.gpus if gpus is None else gpus
            params.update(gpus_per_node=gpus or None, slurm_partition=self.partition)  # 0: ask for none
            if after:
                params["slurm_additional_parameters"] = {"dependency": "afterok:" + ":".join(after),
                                                         "kill-on-invalid-dep": "yes"}
        executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
        return executor

    def submit_study(self, study: Study, out: Path, *, ledger: Path, report: bool) -> int:
        """Submit every step not yet done, each after the ones it needs; follow them unless detached."""
        for stale in (self.folder / "steps").glob("*.failed"):
            stale.unlink()  # failures of an earlier submission
        submitted: list[tuple[list[str], list[Any]]] = []  # (step names, their jobs, one each) in order
        after: list[str] = []  # the ids the next step waits for
        if not maps_ready(study, out):
            job = self.executor(FIT, []).submit(fit_step, study, out, self)
            submitted.append(([FIT], [job]))
            after = job_ids([job])
        needs: list[str] = [FIT] if after else []
        for names in arm_stages(study):
            todo = names if after else [n for n in names if not arm_finished(study, out, self, n)]
            if todo:
                jobs = self.executor("arms" if len(todo) > 1 else todo[0], after).map_array(
                    arm_step, [study] * len(todo), [out] * len(todo), [self] * len(todo), todo,
                    [needs] * len(todo))
                submitted.append((todo, jobs))
                after, needs = job_ids(jobs), list(todo)
        everything = [i for _, jobs in submitted for i in job_ids(jobs)]
        if report:
            job = self.executor(REPORT, everything, gpus=0, minutes=60).submit(
                report_step, study, out, self, ledger, list(study.arms))
            submitted.append(([REPORT], [job]))
        self._record(study, out, submitted)
        for names, jobs in submitted:
            print(f"[slurm] {','.join(names)}: job {', '.join(j.job_id for j in jobs)}", flush=True)
        print(f"[slurm] logs in {self.folder}; `rf-eval study status {out}` shows what is done", flush=True)
        if not submitted:
            print("[slurm] every arm is done and no report was asked for: nothing to submit", flush=True)
        if self.detach:
            return 0
        return self._follow(study, out, ledger, submitted, report)

    def _record(self, study: Study, out: Path, submitted: list[tuple[list[str], list[Any]]]) -> None:
        state = load_state(out)
        for names, jobs in submitted:
            for name, job in zip(names, jobs):
                if name in study.arms:
                    state["arms"][name].update(status="submitted", job=job.job_id)
        state["slurm"] = {",".join(names): [j.job_id for j in jobs] for names, jobs in submitted}
        save_state(out, state)

    def _follow(self, study: Study, out: Path, ledger: Path, submitted: list[tuple[list[str], list[Any]]],
                report: bool) -> int:
        """Wait for each job in order; on a failure cancel what is left and raise its error."""
        code, pending = 0, [job for _, jobs in submitted for job in jobs]
        try:
            for names, jobs in submitted:
                for name, job in zip(names, jobs):
                    result = job.result()  # waits; raises the job's error
                    pending.remove(job)
                    seconds = f" in {result['seconds']:.0f}s" if isinstance(result, dict) else ""
                    print(f"[slurm] {name} done{seconds}", flush=True)
                    code = result if name == REPORT else code
        except Exception:
            for job in pending:
                job.cancel(check=False)
            raise
        if not report:
            return finish_study(study, out, ledger, report=False)
        return int(code)


def job_ids(jobs: list[Any]) -> list[str]:
    """The ids a dependency names: an array's own id (`123` for tasks `123_0`, `123_1`), once."""
    return list(dict.fromkeys(str(j.job_id).split("_")[0] for j in jobs))


# ---- the steps (inside the jobs)

def _failed(launcher: SlurmLauncher, step: str) -> Path:
    return launcher.folder / "steps" / f"{step}.failed"


def _step(launcher: SlurmLauncher, step: str, body: Any) -> Any:
    """Run a step; a failure leaves `steps/STEP.failed` for the steps waiting on it (the local executor)."""
    try:
        return body()
    except BaseException as err:
        marker = _failed(launcher, step)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"step": step, "error": repr(err)}))
        raise


def wait_for(study: Study, out: Path, launcher: SlurmLauncher, needs: list[str]) -> None:
    """Return once every step in `needs` is done; on Slurm (where `afterok` ordered the jobs) that must
    already be so. The local executor's jobs poll instead, and stop when a step they need failed."""
    def done(step: str) -> bool:
        return maps_ready(study, out) if step == FIT else arm_finished(study, out, launcher, step)

    deadline = time.time() + 60 * launcher.minutes
    while True:
        missing = [s for s in needs if not done(s)]
        if not missing:
            return
        if launcher.cluster != "local":
            raise StudyError(f"steps {', '.join(missing)} ended well (afterok) but their results are not in "
                             f"{out}: the study's --out must be a folder every node sees (a shared filesystem)")
        failed = [s for s in missing if _failed(launcher, s).is_file()]
        if failed:
            raise StudyError(f"step(s) {', '.join(failed)} failed: see {launcher.folder}")
        if time.time() > deadline:
            raise StudyError(f"gave up waiting for {', '.join(missing)} after {launcher.minutes} minutes")
        time.sleep(launcher.poll)


def fit_step(study: Study, out: Path, launcher: SlurmLauncher) -> str | None:
    return _step(launcher, FIT, lambda: fit_maps_once(study, out))


def arm_step(study: Study, out: Path, launcher: SlurmLauncher, name: str, needs: list[str]) -> dict[str, Any]:
    """One arm in its own job: wait for what it needs, resolve its command and fingerprint, run it
    (or return its record when it is done with that fingerprint already)."""
    def body() -> dict[str, Any]:
        wait_for(study, out, launcher, needs)
        job = arm_job(study, out, launcher, maps_location(study, out), name)
        if is_done(out, name, job.fingerprint, study.arms_folder):
            return json.loads(Path(job.marker).read_text())
        return run_arm(job)

    return _step(launcher, name, body)


def report_step(study: Study, out: Path, launcher: SlurmLauncher, ledger: Path, needs: list[str]) -> int:
    def body() -> int:
        wait_for(study, out, launcher, needs)
        code = finish_study(study, out, ledger, report=True)
        if code != 0:
            raise RuntimeError(f"rf-eval report exited {code}")
        return code

    return _step(launcher, REPORT, body)
