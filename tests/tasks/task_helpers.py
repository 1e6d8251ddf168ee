"""Helpers of the task tests (loaded by path by conftest.py as the `th` fixture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from warm_start import WarmProcess, popen_argv


def task_manager(metadata: dict):
    """An lm-eval TaskManager over this package's tasks only (lm-eval's own index takes seconds)."""
    from lm_eval.tasks import TaskManager

    from rf_eval.tasks import task_dir

    return TaskManager(include_path=task_dir(), include_defaults=False, metadata=metadata)


def gold_lm():
    """A stand-in lm-eval model: the gold answer on RULER samples with an even index, a wrong one on the others."""
    from lm_eval.api.model import LM

    class Gold(LM):
        def generate_until(self, requests, disable_tqdm=False):
            return [" ".join(r.doc["outputs"]) if r.doc["index"] % 2 == 0 else "no" for r in requests]

        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

    return Gold()


def load_task(name: str, metadata: dict):
    return task_manager(metadata).load([name])["tasks"][name]


def ridgefill_class():
    """The ridgefill adapter class (an import failure fails the test)."""
    from rf_eval.model_adapters import prefill_lm
    return prefill_lm.ridgefill


def plain_lm_eval() -> bool:
    """True when rf-eval's startup hook is installed: plain `lm_eval` finds `ridgefill` and the tasks."""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any(Path(d, "rf_eval_lm_eval.pth").exists() for d in dirs)


def lm_eval_argv() -> list[str]:
    """The lm_eval command line: the installed `lm_eval` script when the startup hook is
    installed, else lm-eval's own CLI entry point run after importing the adapter."""
    if plain_lm_eval():
        return [str(Path(sys.executable).parent / "lm_eval")]
    boot = (
        "import sys\n"
        "try:\n    import rf_eval.model_adapters.ridgefill  # noqa\nexcept ImportError:\n    pass\n"
        "from lm_eval.__main__ import cli_evaluate\n"
        "sys.argv[0] = 'lm_eval'\n"
        "sys.exit(cli_evaluate())\n"
    )
    return [sys.executable, "-c", boot]


def start_lm_eval(args: list[str], out_dir: Path, extra_env: dict[str, str]) -> subprocess.Popen | WarmProcess:
    """Start the lm_eval CLI with `args` (plus --output_path, --log_samples, and --include_path
    of `rf_eval.tasks.task_dir()`, which the startup hook makes redundant but harmless)."""
    from rf_eval.tasks import task_dir

    env = {**os.environ, **extra_env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = lm_eval_argv() + args + ["--include_path", task_dir(), "--output_path", str(out_dir), "--log_samples"]
    return popen_argv(cmd, stdout=out_dir.parent / f"{out_dir.name}.log", env=env, cwd=out_dir.parent)


def finish(proc: subprocess.Popen | WarmProcess, out_dir: Path, timeout: float = 600) -> dict:
    """Wait for a CLI run; return {"results": results json, "samples": {task: [records]}}."""
    proc.wait(timeout=timeout)
    log = (out_dir.parent / f"{out_dir.name}.log").read_text()
    assert proc.returncode == 0, log[-4000:]
    results = sorted(out_dir.rglob("results_*.json"))
    assert results, log[-4000:]
    samples = {}
    for f in out_dir.rglob("samples_*.jsonl"):
        task = f.name[len("samples_") :].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return {"results": json.loads(results[-1].read_text()), "samples": samples, "log": log}
