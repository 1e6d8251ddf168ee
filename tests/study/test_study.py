"""`rf-eval study`: the plan, the reference arm's key tokens shared by every arm,
and a three-arm study killed and resumed, and run as a Slurm array."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import adapter_helpers as helpers  # noqa: E402
from warm_start import popen_argv, run_argv

from rf_eval.cli import main as cli
from rf_eval.cost.prefill_cost import MEASURED_FIELDS
from rf_eval.study.jobs import cached_requests
from rf_eval.study.runner import run_study
from rf_eval.study.state import done_marker
from rf_eval.study.study_file import load_study

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
metadata: {{docs: {docs}, score_tokens: 64, key_context: 128}}
"""


def write_study(folder: Path, model: str, tasks_dir: Path, text: str = STUDY, docs: Path | None = None,
                name: str = "study.yaml") -> Path:
    path = folder / name
    tasks = f"{helpers.TASK}, {helpers.GEN_TASK}, keytoken_nll"
    path.write_text(text.format(model=model, tasks=tasks, tasks_dir=tasks_dir, docs=docs or folder))
    return path


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


class RecordingLauncher:
    """Runs no lm_eval: records the arms of each launch and leaves what a finished arm leaves (a keytoken_nll
    samples file, `result` for the reference arm, and its done.json)."""

    def __init__(self, result: str):
        self.result, self.launches = result, []

    def argv(self, lm_eval_args: list[str]) -> list[str]:
        return ["python", *lm_eval_args]

    def run(self, jobs, progress) -> None:
        self.launches.append([job.name for job in jobs])
        for job in jobs:
            marker = Path(job.marker)
            (marker.parent / "model").mkdir(parents=True, exist_ok=True)
            stamp = datetime.now().strftime("%Y-%m-%dT%H-%M-%S.%f")
            text = self.result if job.name == "exact" else f"{job.name}\n"
            (marker.parent / "model" / f"samples_keytoken_nll_{stamp}.jsonl").write_text(text)
            marker.write_text(json.dumps({"fingerprint": job.fingerprint, "seconds": 0.0, "started": stamp,
                                          "finished": stamp}))


def key_reference_of(out: Path, arm: str) -> str | None:
    command = json.loads((out / "study.json").read_text())["arms"][arm]["command"]
    return json.loads(command[command.index("--metadata") + 1]).get("key_reference")


def test_the_reference_arm_runs_first_and_every_other_arm_reads_its_key_tokens(tmp_path, capsys):
    study, out = load_study(write_study(tmp_path, "/m", tmp_path)), tmp_path / "out"
    launcher = RecordingLauncher("exact 1\n")
    assert run_study(study, out, launcher, report=False) == 0
    assert launcher.launches == [["exact"], ["identity", "nofill"]]  # the reference alone, before the others
    first = sorted((out / "arms" / "exact").rglob("samples_keytoken_nll_*.jsonl"))
    assert len(first) == 1 and key_reference_of(out, "exact") is None
    assert key_reference_of(out, "identity") == key_reference_of(out, "nofill") == str(first[0])
    assert "exact first (the others read its keytoken_nll key tokens)" in capsys.readouterr().out

    launcher.launches.clear()  # nothing changed: nothing runs
    assert run_study(study, out, launcher, report=False) == 0 and launcher.launches == [[], []]
    done_marker(out, "exact").unlink()  # the reference again, with the same result: its dependants stay done
    assert run_study(study, out, launcher, report=False) == 0 and launcher.launches[-2:] == [["exact"], []]
    launcher.result = "exact 2\n"  # the reference again, with another result: every dependant runs again
    done_marker(out, "exact").unlink()
    assert run_study(study, out, launcher, report=False) == 0
    assert launcher.launches[-2:] == [["exact"], ["identity", "nofill"]]
    latest = sorted((out / "arms" / "exact").rglob("samples_keytoken_nll_*.jsonl"))[-1]
    assert latest.read_text() == "exact 2\n" and key_reference_of(out, "identity") == str(latest)

    # no keytoken_nll, or a key_reference of the study's own: no order between arms, no key_reference added
    plain = STUDY.replace("tasks: [{tasks}]", "tasks: [a_task]")
    own = STUDY.replace("score_tokens: 64", "score_tokens: 64, key_reference: /k.jsonl")
    for name, text, want in (("plain.yaml", plain, None), ("own.yaml", own, "/k.jsonl")):
        study, folder = load_study(write_study(tmp_path, "/m", tmp_path, text, name=name)), tmp_path / f"out-{name}"
        launcher = RecordingLauncher("exact\n")
        assert run_study(study, folder, launcher, report=False) == 0
        assert launcher.launches == [["exact", "identity", "nofill"]]
        assert key_reference_of(folder, "identity") == want


def samples_of(out: Path) -> dict[str, list[dict]]:
    """Every arm's --log_samples records, per arm and task (order-independent), but for the measured prefill
    seconds, which no rerun repeats."""
    got = {}
    for arm_dir in sorted((out / "arms").iterdir()):
        for file in sorted(arm_dir.rglob("samples_*.jsonl")):
            task = file.name.split("samples_")[1].rsplit("_", 1)[0]
            rows = [json.loads(line) for line in file.read_text().splitlines()]
            rows = [{k: v for k, v in r.items() if k not in MEASURED_FIELDS} for r in rows]  # timings differ
            got[f"{arm_dir.name}/{task}"] = sorted(json.dumps(r, sort_keys=True) for r in rows)
    return got


def study_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rf_eval", "study", *args]


@pytest.fixture(scope="module")
def study_file(tiny_model_dir, adapter_task, keytoken_docs, tmp_path_factory) -> Path:
    return write_study(tmp_path_factory.mktemp("study"), tiny_model_dir("llama"), adapter_task, docs=keytoken_docs)


@pytest.fixture(scope="module")
def whole(study_file) -> Path:
    """One uninterrupted run of the three-arm study, report included: what the other runs must reproduce. Its
    arms run in this process (`InProcessLauncher`, the demo's: 10 s here against 40 s for a process per arm);
    the killed-and-resumed and the Slurm runs give each arm a process of its own, so their equality with
    this run also checks that the two launchers give the same samples."""
    from rf_eval.study.launch import InProcessLauncher

    out = study_file.parent / "whole"
    with pytest.MonkeyPatch.context() as env:
        for key, value in helpers.cli_env().items():
            env.setenv(key, value)
        assert run_study(load_study(study_file), out, InProcessLauncher()) == 0
    return out


def exact_arm_only(study_file: Path, folder: Path) -> Path:
    """The study with its exact arm alone (in `folder`)."""
    path = folder / "exact_only.yaml"
    path.write_text("".join(line for line in study_file.read_text().splitlines(keepends=True)
                            if not line.lstrip().startswith(("identity:", "nofill:"))))
    return path


@pytest.mark.slow
def test_a_killed_study_resumes_to_the_samples_of_an_uninterrupted_run(study_file, whole, tmp_path):
    path, env = study_file, helpers.cli_env()
    assert (whole / "report.html").is_file() and (whole / "report.tex").is_file()
    state = json.loads((whole / "study.json").read_text())
    assert state["study_sha256"] == load_study(path).sha256 and list(state["arms"]) == ["exact", "identity", "nofill"]
    first_arm = min(datetime.fromisoformat(json.loads(done_marker(whole, a).read_text())["started"])
                    for a in state["arms"])
    registered = datetime.fromisoformat(state["claims"][0]["time"])
    assert registered < first_arm  # the claim is dated before the first arm started
    (reference,) = (whole / "arms" / "exact").rglob("samples_keytoken_nll_*.jsonl")
    assert key_reference_of(whole, "identity") == key_reference_of(whole, "nofill") == str(reference)

    killed = tmp_path / "killed"
    proc = popen_argv(study_cli("run", str(path), "--out", str(killed)), env=env, stdout=tmp_path / "killed.log")
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
    again = run_argv(study_cli("run", str(path), "--out", str(killed)), env=env, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "exact: done before (fingerprint matches), skipped" in again.stdout
    assert samples_of(killed) == samples_of(whole) and len(samples_of(whole)) == 9  # 3 arms x 3 tasks
    assert len(json.loads((killed / "study.json").read_text())["claims"]) == 1  # registered once

    status = run_argv(study_cli("status", str(killed)), env=env)
    assert status.returncode == 0 and status.stdout.count(" done ") == 3

    changed = tmp_path / "changed.yaml"
    changed.write_text(path.read_text().replace("margin: 5.0", "margin: 4.0"))
    mixed = run_argv(study_cli("run", str(changed), "--out", str(killed)), env=env)
    assert mixed.returncode == 2 and "another version of the study file" in mixed.stderr


@pytest.mark.slow
def test_the_slurm_launcher_through_submitits_local_executor_gives_the_same_samples(study_file, whole, tmp_path):
    """Every step is submitted at once (the reference, the other arms as one array, the report job); the local
    executor knows no `afterok`, so each job waits for the steps it needs, as the Slurm jobs would."""
    out = tmp_path / "slurm"
    done = run_argv(study_cli("run", str(study_file), "--out", str(out), "--launcher", "slurm",
                              "--slurm-cluster", "local", "--parallel", "2"), env=helpers.cli_env(), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert samples_of(out) == samples_of(whole) and len(samples_of(whole)) == 9
    assert any((out / "slurm").glob("*_log.out"))  # submitit's own job logs
    assert "[slurm] identity,nofill: job" in done.stdout and "[slurm] report: job" in done.stdout
    times = {a: json.loads(done_marker(out, a).read_text()) for a in ("exact", "identity", "nofill")}
    for arm in ("identity", "nofill"):  # two at a time, yet the reference finished before the others began
        assert datetime.fromisoformat(times["exact"]["finished"]) < datetime.fromisoformat(times[arm]["started"])
    last = max(datetime.fromisoformat(t["finished"]).timestamp() for t in times.values())
    assert (out / "report.html").stat().st_mtime > last and (out / "report.tex").is_file()  # the report job
    state = json.loads((out / "study.json").read_text())
    assert all(state["arms"][a]["status"] == "done" and state["arms"][a]["command"] for a in times)


@pytest.mark.slow
def test_the_accelerate_launcher_runs_an_arm_data_parallel_with_the_same_samples(study_file, whole, tmp_path):
    """`--launcher accelerate --processes 2`: the arm runs as two torch.distributed processes (gloo on this CPU
    machine, one per GPU on a GPU machine); lm-eval gathers their samples, which equal the one-process run's."""
    out = tmp_path / "accelerate"
    done = run_argv(study_cli("run", str(exact_arm_only(study_file, tmp_path)), "--out", str(out),
                              "--launcher", "accelerate", "--processes", "2", "--no-report"),
                    env=dict(helpers.cli_env(), ACCELERATE_USE_CPU="true"),  # accelerate's CPU switch: gloo
                    timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    command = json.loads(done_marker(out, "exact").read_text())["command"]
    assert command[1:6] == ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    log = (out / "logs" / "exact.log").read_text()
    assert "exact_rank0.db" in log and "exact_rank1.db" in log  # two ranks of one world, each its own cache
    got, want = samples_of(out), samples_of(whole)
    assert list(got) == [k for k in want if k.startswith("exact/")] and all(got[k] == want[k] for k in got)


@pytest.mark.slow
def test_the_in_process_launcher_sends_each_arms_output_to_its_log_and_progress_to_the_terminal(
        study_file, whole, tmp_path, monkeypatch, capfd):
    """InProcessLauncher (the demo's, and `whole`'s): the arm's lm_eval output goes to its log, progress to the
    terminal, and its recorded command is the one a user reruns; the samples are `whole`'s, arm for arm (the
    exact arm again: that launcher against the per-process runs is the killed and Slurm tests' comparison)."""
    from rf_eval.study.launch import InProcessLauncher

    for key, value in helpers.cli_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "in_process"
    assert run_study(load_study(exact_arm_only(study_file, tmp_path)), out, InProcessLauncher(), report=False) == 0
    got, want = samples_of(out), samples_of(whole)
    assert list(got) == [k for k in want if k.startswith("exact/")] and all(got[k] == want[k] for k in got)
    terminal = capfd.readouterr().out
    assert "[arms 1/1]" in terminal and "Running generate_until requests" not in terminal
    assert "Running generate_until requests" in (out / "logs" / "exact.log").read_text()
    command = json.loads(done_marker(out, "exact").read_text())["command"]
    assert command[:3] == [sys.executable, "-m", "lm_eval"]
