"""The launcher a study runs its arms with, by name: `local`, `accelerate` (`rf_eval.study.launch`), `slurm`
(`rf_eval.study.slurm`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rf_eval.study.launch import AccelerateLauncher, LocalLauncher
from rf_eval.study.slurm import SlurmLauncher


@dataclass(frozen=True)
class LauncherOptions:
    """`rf-eval study run`'s launcher options; each launcher reads those of its own."""

    parallel: int | None = None  # local: arms at once (default 1); slurm: arms of the array at once (default 64)
    processes: int = 1  # accelerate: processes (devices) per arm
    partition: str | None = None  # slurm
    gpus: int = 1  # slurm: GPUs per arm
    minutes: int = 240  # slurm: time limit per arm
    slurm_cluster: str | None = None  # submitit's cluster (`rf_eval.study.slurm`)
    detach: bool = False  # slurm: return once the jobs are submitted


def make_launcher(name: str, out: Path, options: LauncherOptions | None = None
                  ) -> LocalLauncher | AccelerateLauncher | SlurmLauncher:
    """The launcher `name` (local, accelerate, slurm); a ValueError names a bad choice before anything runs."""
    o = options or LauncherOptions()
    if o.detach and name != "slurm":
        raise ValueError(f"--detach is for --launcher slurm (its jobs run on without this process), not {name}")
    if name == "local":
        return LocalLauncher(o.parallel or 1)
    if name == "accelerate":
        return AccelerateLauncher(o.processes)
    if name == "slurm":
        return SlurmLauncher(out / "slurm", partition=o.partition, gpus=o.gpus, minutes=o.minutes,
                             parallel=o.parallel or 64, cluster=o.slurm_cluster, detach=o.detach)
    raise ValueError(f"unknown launcher {name!r}; valid launchers: local, accelerate, slurm")
