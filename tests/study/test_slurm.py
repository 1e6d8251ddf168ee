"""`--launcher slurm`: the study submitted at once as jobs with `afterok` dependencies (checked on the sbatch
files submitit writes, with stand-in `sbatch`/`srun` commands), and the steps' own checks inside a job.
The jobs themselves run in tests/study/test_study.py, through submitit's local executor."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from rf_eval.cli import main as cli
from rf_eval.study.runner import fingerprint
from rf_eval.study.slurm import SlurmLauncher, wait_for
from rf_eval.study.state import done_marker
from rf_eval.study.study_file import StudyError, load_study

STUDY = """\
model:
  pretrained: {model}
tasks: [{tasks}]
lengths: [512]
metadata: {{docs: {docs}}}
{maps}
arms:
  exact: {{args: {{fill: exact, tail: 4}}}}
  ridge: {{args: {{fill: ridge, tail: 4}}}}
  nofill: {{args: {{fill: nofill, tail: 8}}}}
reference: exact
claims:
  - {{claim: "ridge is non-inferior to exact", prediction: "lower bound above -2 points"}}
"""
FAKE_SBATCH = """#!/bin/sh
n=$(cat "$(dirname "$0")/count" 2>/dev/null || echo 100); n=$((n+1)); echo $n > "$(dirname "$0")/count"
echo "Submitted batch job $n"
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    """`sbatch` that answers with job ids 101, 102, ... and an `srun` that does nothing, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return bin_dir


def write(tmp_path: Path, tasks: str, maps: str, model: str | None = None) -> Path:
    """The study of `model` (a tiny model folder: `study run` builds the tasks' data with its tokenizer
    before it submits anything), or of an empty folder where nothing is built; no job runs here."""
    if model is None:
        model = tmp_path / "m"
        model.mkdir(exist_ok=True)
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "a.txt").write_text("the river ran by the old mill and the miller sang " * 40)
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(tasks=tasks, maps=maps, model=model, docs=docs))
    return path


def sbatch_flags(out: Path, job: str) -> dict[str, str]:
    text = (out / "slurm" / f"{job}_submission.sh").read_text()
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", text, re.M))


def test_the_study_is_submitted_as_jobs_that_each_wait_for_the_ones_they_need(fake_slurm, tmp_path, capsys,
                                                                             tiny_model_dir):
    study = write(tmp_path, "niah_single_1_filled, keytoken_nll", "fit: {calibration: [cal.jsonl], split: 2}",
                  tiny_model_dir("llama"))
    out = tmp_path / "out"
    assert cli(["study", "run", str(study), "--out", str(out), "--launcher", "slurm", "--partition", "gpu",
                "--gpus", "2", "--detach"]) == 0
    printed = capsys.readouterr().out
    assert "fit: job 101" in printed and "ridge,nofill: job 103_0, 103_1" in printed and "report: job 104" in printed
    fit, reference, array, report = (sbatch_flags(out, j) for j in ("101", "102", "103", "104"))
    assert "dependency" not in fit and fit["job-name"] == "rf-eval-fit" and fit["gpus-per-node"] == "2"
    assert reference["dependency"] == "afterok:101" and reference["job-name"] == "rf-eval-exact"
    assert array["dependency"] == "afterok:102" and array["array"] == "0-1%2"  # one array, after the reference, all at once
    assert report["dependency"] == "afterok:101:102:103" and "gpus-per-node" not in report
    for flags in (reference, array, report):
        assert flags["kill-on-invalid-dep"] == "yes" and flags["partition"] == "gpu"
    state = json.loads((out / "study.json").read_text())
    assert state["registered"] and len(state["claims"]) == 1  # registered at submission, before any arm
    assert {a: s["job"] for a, s in state["arms"].items()} == {"exact": "102", "ridge": "103_0", "nofill": "103_1"}
    assert state["slurm"]["report"] == ["104"]


def test_without_a_fit_or_shared_key_tokens_the_arms_are_one_array_and_done_arms_are_not_submitted_again(
        fake_slurm, tmp_path, capsys, tiny_model_dir):
    study_path = write(tmp_path, "niah_single_1_filled", f"maps: {tmp_path}", tiny_model_dir("llama"))
    out = tmp_path / "out"
    run = ["study", "run", str(study_path), "--out", str(out), "--launcher", "slurm", "--detach", "--parallel", "2"]
    assert cli(run) == 0
    assert "exact,ridge,nofill: job 101_0, 101_1, 101_2" in capsys.readouterr().out
    array, report = sbatch_flags(out, "101"), sbatch_flags(out, "102")
    assert "dependency" not in array and array["array"] == "0-2%2" and report["dependency"] == "afterok:101"

    study = load_study(study_path)  # nofill finishes with this study's fingerprint; the study is submitted again
    marker = done_marker(out, "nofill")
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"fingerprint": fingerprint(study, study.arms["nofill"], str(tmp_path))}))
    assert cli(run) == 0
    assert "exact,ridge: job 103_0, 103_1" in capsys.readouterr().out
    assert sbatch_flags(out, "104")["dependency"] == "afterok:103"
    assert json.loads((out / "study.json").read_text())["arms"]["nofill"]["job"] == "101_2"  # not submitted again


@pytest.mark.parametrize(
    "args, path, message",
    [
        (["--detach"], None, "--detach is for --launcher slurm"),
        (["--launcher", "slurm", "--slurm-cluster", "local", "--detach"], None, "--detach needs a Slurm cluster"),
        (["--launcher", "slurm"], "/nonexistent", "no Slurm here (no sbatch and srun on PATH)"),
    ],
)
def test_bad_launcher_choices_fail_before_anything_is_registered(tmp_path, monkeypatch, capsys, args, path,
                                                                 message):
    if path:
        monkeypatch.setenv("PATH", path)
    study, out = write(tmp_path, "niah_single_1_filled", f"maps: {tmp_path}"), tmp_path / "out"
    assert cli(["study", "run", str(study), "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_a_step_waits_for_what_it_needs_and_stops_when_that_failed(tmp_path):
    study = load_study(write(tmp_path, "niah_single_1_filled", f"maps: {tmp_path}"))
    out = tmp_path / "out"
    local = SlurmLauncher(out / "slurm", cluster="local", poll=0.02)
    marker = done_marker(out, "exact")
    marker.parent.mkdir(parents=True)

    def finish_later() -> None:
        time.sleep(0.3)
        tmp = marker.with_suffix(".tmp")  # atomic, as run_arm writes it: the poller never reads half a file
        tmp.write_text(json.dumps({"fingerprint": fingerprint(study, study.arms["exact"], str(tmp_path))}))
        tmp.replace(marker)

    writer = threading.Thread(target=finish_later)
    started = time.time()
    writer.start()
    wait_for(study, out, local, ["exact"])  # the local executor's job polls until the step is done
    writer.join()
    assert time.time() - started >= 0.3

    (out / "slurm" / "steps").mkdir(parents=True)
    (out / "slurm" / "steps" / "ridge.failed").write_text("{}")
    with pytest.raises(StudyError, match="step\\(s\\) ridge failed"):
        wait_for(study, out, local, ["exact", "ridge"])

    on_slurm = SlurmLauncher(out / "slurm", cluster="slurm")
    with pytest.raises(StudyError, match="every node sees"):  # afterok ran it, yet the results are not here
        wait_for(study, out, on_slurm, ["ridge"])
    wait_for(study, out, on_slurm, ["exact"])  # done: returns at once
