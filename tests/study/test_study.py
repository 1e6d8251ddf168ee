"""`rf-eval study`: the study file's checks, the plan, and a three-arm study killed and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import adapter_helpers as helpers  # noqa: E402

from rf_eval.cli import main as cli
from rf_eval.study.runner import cached_requests, done_marker
from rf_eval.study.spec import StudyError, load_study

STUDY = """\
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
tasks: [{tasks}]
include_path: {tasks_dir}
arms:
  exact: {{args: {{fill: exact}}}}
  identity: {{args: {{fill: identity, tail: 4, split: 3}}}}
  nofill: {{args: {{fill: nofill, tail: 8, split: 3}}}}
reference: exact
margin: 5.0
claims:
  - {{claim: "identity is non-inferior to exact", prediction: "lower bound above -5 points"}}
"""


def write_study(folder: Path, model: str, tasks_dir: Path, text: str = STUDY) -> Path:
    path = folder / "study.yaml"
    path.write_text(text.format(model=model, tasks=f"{helpers.TASK}, {helpers.GEN_TASK}", tasks_dir=tasks_dir))
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (("margin: 5.0", "margn: 5.0"), "unknown key 'margn' (line 11)"),
        (("{{args: {{fill: identity, tail: 4, split: 3}}}}", "{{args: {{tail: 4}}}}"), "arms.identity: a ridgefill arm needs args.fill"),
        (("reference: exact", "reference: ridge"), "reference 'ridge' is not a declared arm (line 10); arms: exact"),
        (("margin: 5.0", "margin: 5.0\ncontrols: {{identity: [random_rows]}}"), "controls.identity names no declared arm 'random_rows'"),
        (("tasks:", "tasks: 3\nx:"), "tasks must be list"),
        (("  pretrained: {model}\n", ""), "model: missing key(s) pretrained"),
        (("exact: {{args: {{fill: exact}}}}", "exact: {{args: {{fill: exact}}, modle: hf}}"), "arms.exact: unknown key 'modle'"),
    ],
)
def test_bad_study_files_fail_before_anything_runs(tmp_path, edit, message):
    old, new = edit
    text = STUDY.replace(old, new)
    assert text != STUDY
    path = write_study(tmp_path, "/m", tmp_path, text)
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert message in str(err.value)
    assert cli(["study", "run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_plan_prints_each_arm_command_and_cost(tiny_model_dir, adapter_task, tmp_path, capsys):
    path = write_study(tmp_path, tiny_model_dir("llama"), adapter_task,
                       STUDY.replace("reference: exact", "reference: exact\nlengths: [64, 128]"))
    assert cli(["study", "plan", str(path), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    for arm in ("exact", "identity", "nofill"):
        assert f"[{arm}] " in text
    assert text.count("-m lm_eval --model ridgefill") == 3 and '"fill": "identity"' in text
    assert "MAC cost / exact: N=64: 1.000, N=128: 1.000" in text  # the exact arm
    identity = text.split("[identity]")[1].split("[nofill]")[0]
    cost = float(identity.split("N=128: ")[1].split()[0])
    assert 0.5 < cost < 1.0  # half the layers filled for most rows
    assert not (tmp_path / "out").exists()


def samples_of(out: Path) -> dict[str, list[dict]]:
    """Every arm's --log_samples records, per arm and task (order-independent)."""
    got = {}
    for arm_dir in sorted((out / "arms").iterdir()):
        for file in sorted(arm_dir.rglob("samples_*.jsonl")):
            task = file.name.split("samples_")[1].rsplit("_", 1)[0]
            rows = [json.loads(line) for line in file.read_text().splitlines()]
            got[f"{arm_dir.name}/{task}"] = sorted(json.dumps(r, sort_keys=True) for r in rows)
    return got


def study_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rf_eval", "study", *args]


@pytest.mark.slow
def test_a_killed_study_resumes_to_the_samples_of_an_uninterrupted_run(tiny_model_dir, adapter_task, tmp_path):
    path = write_study(tmp_path, tiny_model_dir("llama"), adapter_task)
    env = helpers.cli_env()
    whole = tmp_path / "whole"
    done = subprocess.run(study_cli("run", str(path), "--out", str(whole)), env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (whole / "report.html").is_file() and (whole / "report.tex").is_file()
    state = json.loads((whole / "study.json").read_text())
    assert state["study_sha256"] == load_study(path).sha256 and set(state["arms"]) == {"exact", "identity", "nofill"}
    first_arm = min(datetime.fromisoformat(json.loads(done_marker(whole, a).read_text())["started"])
                    for a in state["arms"])
    registered = datetime.fromisoformat(state["claims"][0]["time"])
    assert registered < first_arm  # the claim is dated before the first arm started

    killed = tmp_path / "killed"
    proc = subprocess.Popen(study_cli("run", str(path), "--out", str(killed)), env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline:
        if done_marker(killed, "exact").is_file() and cached_requests(killed, "identity") > 0:
            break
        assert not done_marker(killed, "identity").is_file(), "the second arm finished before it could be killed"
        assert proc.poll() is None, "the study stopped by itself"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the runner and its lm_eval child, mid-arm
    proc.wait()
    assert not done_marker(killed, "identity").is_file() and not done_marker(killed, "nofill").is_file()
    again = subprocess.run(study_cli("run", str(path), "--out", str(killed)), env=env, capture_output=True,
                           text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "exact: done before (fingerprint matches), skipped" in again.stdout
    assert samples_of(killed) == samples_of(whole) and len(samples_of(whole)) == 6
    assert len(json.loads((killed / "study.json").read_text())["claims"]) == 1  # registered once

    status = subprocess.run(study_cli("status", str(killed)), env=env, capture_output=True, text=True)
    assert status.returncode == 0 and status.stdout.count(" done ") == 3

    changed = path.read_text().replace("margin: 5.0", "margin: 4.0")
    path.write_text(changed)
    mixed = subprocess.run(study_cli("run", str(path), "--out", str(killed)), env=env, capture_output=True, text=True)
    assert mixed.returncode == 2 and "another version of the study file" in mixed.stderr


@pytest.mark.slow
def test_the_slurm_launcher_through_submitits_local_executor_gives_the_same_samples(tiny_model_dir, adapter_task,
                                                                                    tmp_path):
    path = write_study(tmp_path, tiny_model_dir("llama"), adapter_task)
    env = helpers.cli_env()
    runs = {}
    for launcher in ("local", "slurm"):
        out = tmp_path / launcher
        extra = ["--slurm-cluster", "local", "--parallel", "2"] if launcher == "slurm" else []
        done = subprocess.run(study_cli("run", str(path), "--out", str(out), "--launcher", launcher, "--no-report",
                                        *extra), env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[launcher] = samples_of(out)
    assert runs["slurm"] == runs["local"] and len(runs["local"]) == 6
    assert any((tmp_path / "slurm" / "slurm").glob("*_log.out"))  # submitit's own job logs
