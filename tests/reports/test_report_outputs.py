"""Outputs never replace a file rf-eval did not write (issue #41, item 3; `rf_eval.files.outputs`): every output is
checked before anything is written, `--overwrite` allows the replacement, rf-eval's own outputs are replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from rf_eval.cli import main
from rf_eval.files.outputs import MARKER, written_by_rf_eval

PAPER = "\\documentclass{article}\n\\begin{document}\nMy paper, three months of work.\n\\end{document}\n"


@pytest.fixture
def arms(tmp_path, lmeval_format) -> list[str]:
    lmeval_format.accuracy_run(tmp_path / "a", "exact", {"t": [True, False, True, True]})
    lmeval_format.accuracy_run(tmp_path / "b", "ridge", {"t": [True, True, False, True]}, started=1.8e9)
    return [str(tmp_path / "a"), str(tmp_path / "b")]


def _outputs(folder: Path) -> dict[str, str]:
    return {"--html": str(folder / "r.html"), "--markdown": str(folder / "r.md"), "--json": str(folder / "r.json")}


def _report(arms: list[str], outputs: dict[str, str], *extra: str) -> int:
    argv = ["report", *arms, "--reference", "exact", "--resamples", "50", *extra]
    for option, path in outputs.items():
        argv += [option, path]
    return main(argv)


def _one_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rf-eval report: error: "), lines
    return lines[0].removeprefix("rf-eval report: error: ")


def test_an_existing_file_rf_eval_did_not_write_is_refused_and_nothing_is_written(arms, tmp_path, capsys):
    paper = tmp_path / "paper.tex"
    paper.write_text(PAPER)
    outputs = {**_outputs(tmp_path / "out"), "--latex": str(paper)}
    assert _report(arms, outputs) == 2
    assert _one_error(capsys) == (f"--latex {paper} exists and carries no mark that rf-eval wrote it; name another "
                                  "file, or pass --overwrite to replace it")
    assert paper.read_text() == PAPER
    assert not (tmp_path / "out").exists()  # the HTML, Markdown and JSON were not written either


def test_overwrite_replaces_it_and_rf_eval_replaces_its_own_outputs(arms, tmp_path, capsys):
    paper = tmp_path / "paper.tex"
    paper.write_text(PAPER)
    outputs = {**_outputs(tmp_path), "--latex": str(paper)}
    assert _report(arms, outputs, "--overwrite") == 0
    assert "My paper" not in paper.read_text() and "\\toprule" in paper.read_text()
    for path in outputs.values():  # every output carries the mark, so a rerun replaces it without --overwrite
        assert written_by_rf_eval(path), path
    assert Path(outputs["--html"]).read_text().startswith(f"<!DOCTYPE html>\n<!-- {MARKER} -->\n")
    assert paper.read_text().startswith(f"% {MARKER}\n")
    capsys.readouterr()
    assert _report(arms, outputs) == 0
    # a file that merely mentions rf-eval further down is not rf-eval's
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\n" + "x" * 5000 + f"\n{MARKER}\n")
    assert _report(arms, {"--html": outputs["--html"], "--markdown": str(notes)}) == 2
    assert "--markdown" in _one_error(capsys)


@pytest.mark.parametrize("name, says", [
    ("folder", "is a folder; name a file in it, e.g. {path}/report.tex"),
    ("new/", "ends in a path separator; name a file"),
    ("afile/paper.tex", "{tmp}/afile is a file, not a folder"),
])
def test_latex_naming_a_folder_is_one_line_before_any_output(arms, tmp_path, capsys, name, says):
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("x")
    target = f"{tmp_path}/{name}"
    assert _report(arms, {**_outputs(tmp_path / "out"), "--latex": target}) == 2
    message = _one_error(capsys)
    assert message.startswith(f"--latex {target}") and says.format(path=tmp_path / "folder", tmp=tmp_path) in message
    assert not (tmp_path / "out").exists() and not (tmp_path / "new").exists()


def test_other_commands_refuse_a_file_they_did_not_write_before_any_work(tmp_path, capsys, tiny_model_dir):
    """`ttft --out` before any request, `check-equivalence --json` and `fit-state-correction --out FILE` before
    the model loads."""
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "data"}\n')
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("some text " * 50)
    weights = tmp_path / "mine.safetensors"
    weights.write_bytes(b"not rf-eval's")
    model = tiny_model_dir("llama")
    capsys.readouterr()
    commands = {
        "ttft": ["ttft", "--base-url", "http://127.0.0.1:9", "--lengths", "8", "--prompt", str(prompt),
                 "--out", str(mine)],
        "check-equivalence": ["check-equivalence", "--model", model, "--device", "cpu",
                              "--json", str(mine)],
        "fit-state-correction": ["fit-state-correction", "--model", str(tmp_path / "no-model"), "--fill", "identity",
                                 "--split", "2", "--calibration", str(prompt), "--out", str(weights)],
    }
    for name, argv in commands.items():
        assert main(argv) == 2, name
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "exists and carries no mark that rf-eval wrote it" in lines[0], (name, lines)
    assert mine.read_text() == '{"my": "data"}\n' and weights.read_bytes() == b"not rf-eval's"


@pytest.mark.parametrize("option,suffix", [("--markdown", "md"), ("--latex", "tex"), ("--json", "json")])
def test_one_format_alone_is_written_without_html(arms, tmp_path, capsys, option, suffix):
    """`rf-eval report` writes whichever formats are asked for (issue #54 item 3): no --html needed."""
    assert _report(arms, {option: str(tmp_path / f"r.{suffix}")}) == 0
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [f"r.{suffix}"]
    assert written_by_rf_eval(tmp_path / f"r.{suffix}")


def test_no_format_at_all_is_refused_naming_the_options(arms, capsys):
    assert _report(arms, {}) == 2
    assert _one_error(capsys) == ("no output asked for: give one or more of --html FILE, --latex FILE, "
                                  "--markdown FILE, --json FILE")
