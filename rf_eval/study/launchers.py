"""The launcher a study runs its arms with, by name: `local`, `accelerate` (`rf_eval.study.launch`), `slurm`
(`rf_eval.study.slurm`)."""

from __future__ import annotations

from pathlib import Path

from rf_eval.study.launch import AccelerateLauncher, LocalLauncher
from rf_eval.study.slurm import SlurmLauncher


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
        return SlurmLauncher(out / "slurm", partition=partition, gpus=gpus, minutes=minutes, parallel=parallel or 64,
                             cluster=slurm_cluster, detach=detach)
    raise ValueError(f"unknown launcher {name!r}; valid launchers: local, accelerate, slurm")
