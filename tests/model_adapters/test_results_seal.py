"""Results sealed when written (issue #41, item 3): a run of an rf-eval model seals its per-item results, and
`rf-eval report` refuses a samples file edited or truncated since, with no ledger; a run of another model is
read as before and noted as unsealed, while an rf-eval run whose seal is missing or another run's is refused
unless `--allow-unsealed`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from adapter_helpers import TASK, cli_env, run_lm_eval
from warm_start import run_argv

from rf_eval.cli import main
from rf_eval.integrity.seal import PREFIX, SealError, check, record


@pytest.fixture(scope="module")
def runs(tiny_model_dir, adapter_task, tmp_path_factory) -> Path:
    """`--model hf` and `--model ridgefill fill=exact` on the tiny llama, through the plain `lm_eval` command."""
    out = tmp_path_factory.mktemp("sealed_runs")
    model = tiny_model_dir("llama")
    common = ["--tasks", TASK, "--include_path", str(adapter_task), "--limit", "4", "--device", "cpu", "--log_samples"]
    for folder, args in (("hf", ["--model", "hf", "--model_args", f"pretrained={model},dtype=float32"]),
                         ("rf", ["--model", "ridgefill", "--model_args", f"pretrained={model},fill=exact,tail=1024"])):
        proc = run_lm_eval([*args, "--output_path", str(out / folder), *common], out)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _copy(runs: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(runs / "hf", tmp_path / "hf")
    shutil.copytree(runs / "rf", tmp_path / "rf")
    return tmp_path / "hf", tmp_path / "rf"


def _report(tmp_path: Path, *folders: Path) -> int:
    return main(["report", *map(str, folders), "--reference", "hf", "--html", str(tmp_path / "r.html"),
                 "--resamples", "50"])


def _samples(folder: Path) -> Path:
    return next(folder.rglob(f"samples_{TASK}_*.jsonl"))


def test_the_rf_eval_run_is_sealed_and_the_hf_run_is_not(runs):
    rf_samples = _samples(runs / "rf")
    seals = list((runs / "rf").rglob(f"{PREFIX}*.json"))
    assert [s.name for s in seals] == [f"{PREFIX}{rf_samples.stem.rsplit('_', 1)[-1]}.json"]
    entry = json.loads(seals[0].read_text())["files"][rf_samples.name]
    from rf_eval.integrity.hashing import file_sha256

    assert entry == {"sha256": file_sha256(rf_samples), "bytes": rf_samples.stat().st_size, "lines": 4}
    assert not list((runs / "hf").rglob(f"{PREFIX}*"))  # another model's output is left as lm-eval wrote it


def test_the_report_reads_both_and_notes_the_unsealed_arm(runs, tmp_path, capsys):
    assert _report(tmp_path, runs / "hf", runs / "rf") == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "unsealed" in line]
    assert len(notes) == 1 and notes[0].startswith("note: hf: unsealed: samples_") and "no rf-eval seal" in notes[0]


def test_an_edited_samples_file_is_refused_without_a_ledger(runs, tmp_path):
    hf, rf = _copy(runs, tmp_path)
    samples = _samples(rf)
    lines = samples.read_text().splitlines(keepends=True)
    rec = json.loads(lines[1])
    rec["acc"] = 1.0 - rec["acc"]  # one item's score flipped, the file still well-formed
    lines[1] = json.dumps(rec) + "\n"
    samples.write_text("".join(lines))
    env = cli_env()
    proc = run_argv([sys.executable, "-m", "rf_eval", "report", str(hf), str(rf), "--reference", "hf",
                     "--html", str(tmp_path / "r.html"), "--resamples", "50"], env=env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rf-eval report: error: ")]
    assert len(errors) == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert errors[0].startswith(f"rf-eval report: error: {samples}: differs from what its run wrote: it was "
                                "edited after lm-eval")
    assert "rerun that run" in errors[0]
    assert not (tmp_path / "r.html").exists()


def test_a_truncated_or_removed_samples_file_is_refused(runs, tmp_path, capsys):
    hf, rf = _copy(runs, tmp_path)
    samples = _samples(rf)
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:3]))  # the last item cut off
    assert _report(tmp_path, hf, rf) == 2
    err = capsys.readouterr().err
    assert f"{samples}: holds 3 of the 4 lines its run wrote: it was truncated" in err and "rerun that run" in err
    samples.unlink()  # a removed file the seal vouches for is refused too, not read as a run without samples
    assert _report(tmp_path, hf, rf) == 2
    assert f"{samples}: its run wrote it" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def _foreign_seal(rf: Path, seal: Path) -> None:
    """Another run's seal in this run's place: a seal of the same shape for another date."""
    data = json.loads(seal.read_text())
    other = "2020-01-01T00-00-00.000000"
    data["date"] = other
    data["files"] = {name.rsplit("_", 1)[0] + f"_{other}.jsonl": entry for name, entry in data["files"].items()}
    seal.write_text(json.dumps(data))


@pytest.mark.parametrize("how", ["removed", "foreign"])
def test_a_removed_or_foreign_seal_of_an_rf_eval_run_is_refused_unless_allowed(runs, tmp_path, capsys, how):
    """A run of rf-eval's models always seals (issue #54 item 4): without its own seal it is refused, and
    `--allow-unsealed` reports it with a note saying so; the `hf` arm keeps its plain note."""
    hf, rf = _copy(runs, tmp_path)
    seal = next(rf.rglob(f"{PREFIX}*.json"))
    if how == "removed":
        seal.unlink()
    else:
        _foreign_seal(rf, seal)
    assert _report(tmp_path, hf, rf) == 2
    err = capsys.readouterr().err
    assert "carry no seal of their run, though every run of --model ridgefill seals" in err
    assert "--allow-unsealed" in err and not (tmp_path / "r.html").exists()
    argv = ["report", str(hf), str(rf), "--reference", "hf", "--html", str(tmp_path / "r.html"),
            "--json", str(tmp_path / "r.json"), "--resamples", "50", "--allow-unsealed"]
    assert main(argv) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "unsealed" in line]
    assert any("unsealed, reported with --allow-unsealed" in n for n in notes), notes
    assert any(n.startswith("note: hf: unsealed: ") for n in notes), notes
    assert "reported with --allow-unsealed" in (tmp_path / "r.json").read_text()


def test_a_seal_is_not_written_for_a_partial_file_and_a_broken_seal_is_refused(tmp_path):
    samples = tmp_path / "samples_t_2026-01-01T00-00-00.jsonl"
    samples.write_text('{"doc_id": 0}\n')
    assert record(samples, "2026-01-01T00-00-00", written=2) is None  # lm-eval wrote 1 of 2 lines: no seal
    assert check(samples, "2026-01-01T00-00-00") is False
    seal = record(samples, "2026-01-01T00-00-00", written=1)
    assert check(samples, "2026-01-01T00-00-00") is True
    seal.write_text("{not json")
    with pytest.raises(SealError, match="not a readable rf-eval results seal"):
        check(samples, "2026-01-01T00-00-00")


def test_a_study_arm_run_in_process_is_sealed(tiny_model_dir, adapter_task, tmp_path):
    """A study's arm is `-m lm_eval` as `rf_eval.study.runner.lm_eval_command` builds it, run in a child process
    (the `lm_eval` command above) or in the study's own (`InProcessLauncher`, `lm_eval_here`): sealed there too."""
    from rf_eval.study.launch import lm_eval_here

    model_args = json.dumps({"pretrained": tiny_model_dir("llama"), "fill": "exact", "name": "exact"})
    argv = [sys.executable, "-m", "lm_eval", "--model", "ridgefill", "--model_args", model_args, "--tasks", TASK,
            "--include_path", str(adapter_task), "--output_path", str(tmp_path / "arm"), "--log_samples",
            "--limit", "2", "--device", "cpu"]
    assert lm_eval_here(argv, tmp_path / "arm.log") == 0, (tmp_path / "arm.log").read_text()[-3000:]
    samples = _samples(tmp_path / "arm")
    assert check(samples, samples.stem.rsplit("_", 1)[-1]) is True
