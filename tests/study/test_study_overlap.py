"""A study's `fit:` block checks its calibration and held-out text against the study's evaluated documents
(`docs`) before it fits (RidgeFill Appendix G; issue #42, item 6): OUT/overlap.json is written before the fit,
the fit marker records the verdict, overlap warns, and `fit: {overlap: refuse}` stops the study instead."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import rf_eval.study.runner as runner
from rf_eval.files.outputs import MARKER
from rf_eval.study.runner import fit_maps_once, maps_ready
from rf_eval.study.study_file import StudyError, load_study

STUDY = """\
model:
  pretrained: {model}
tasks: [keytoken_nll]
arms:
  exact: {{args: {{fill: exact}}}}
reference: exact
fit: {{calibration: [cal.jsonl], heldout: [held.jsonl], split: 3{extra}}}
{metadata}
"""

RUN = [f"shared{i}" for i in range(57)]  # the run a calibration line and a document share


def words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


@pytest.fixture
def study_files(tmp_path, tiny_model):
    """Calibration (line 2 holds RUN), held-out text, a docs folder whose b.txt holds RUN, and the study's
    model folder, its tokenizer alone (the fit is stood in for; the check counts runs of its tokens too)."""
    tiny_model("llama")[1].save_pretrained(tmp_path / "model")
    lines = [words("p", 80), f"{words('q', 5)} {' '.join(RUN)} {words('r', 5)}"]
    (tmp_path / "cal.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    (tmp_path / "held.jsonl").write_text(json.dumps({"text": words("h", 90)}) + "\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(words("a", 200))
    (docs / "b.txt").write_text(f"{words('b', 11)} {' '.join(RUN)}")
    return tmp_path


def write(folder: Path, extra: str = "", docs: Path | None = None) -> Path:
    path = folder / "study.yaml"
    metadata = f"metadata: {{docs: {docs}}}" if docs else ""
    path.write_text(STUDY.format(extra=extra, metadata=metadata, model=folder / "model"))
    return path


@pytest.fixture
def fits(monkeypatch):
    """Stands in for `rf-eval fit`: records, at the time of each fit, what OUT/overlap.json held."""
    seen: list[dict | None] = []

    def fake_fit(out, **options):
        record = Path(out).parent / "overlap.json"
        seen.append(json.loads(record.read_text()) if record.is_file() else None)
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "maps.safetensors").write_text("maps")
        return SimpleNamespace(sums_device=None, paths={})

    monkeypatch.setattr(runner, "fit_map_files", fake_fit)
    return seen


def test_overlap_is_checked_and_recorded_before_the_fit_and_warns(study_files, fits, capsys):
    study = load_study(write(study_files, docs=study_files / "docs"))
    out = study_files / "out"
    fit_maps_once(study, out)
    captured = capsys.readouterr()
    (record,) = fits  # the check ran first: its file was there when the fit began
    assert record is not None and record["written_by"] == MARKER and record["overlap"] is True
    (by_tokens,) = record["by_tokens"]  # and by the study model's tokens (Appendix G's first check)
    assert by_tokens["overlap"] is True and by_tokens["unit"].startswith("tokens of") and by_tokens["longest"] > 57
    (shared,) = record["shared_runs"]
    assert (shared["calibration"], shared["evaluation"], shared["words"]) == (
        f"{study_files / 'cal.jsonl'}:2", str(study_files / "docs" / "b.txt"), len(RUN))
    assert (shared["calibration_word"], shared["evaluation_word"]) == (5, 11)
    assert record["calibration_texts"] == 3 and record["evaluation_texts"] == 2  # held-out text is compared too
    marker = json.loads((out / "maps" / "fit.json").read_text())
    assert marker["overlap"]["overlap"] is True and marker["overlap"]["longest"] == len(RUN)
    assert marker["overlap"]["file"] == str(out / "overlap.json") and maps_ready(study, out)
    assert f"[overlap] overlap found: 1 calibration-evaluation pair shares a run of 50 or more words (longest " \
           f"{len(RUN)} words)" in captured.out
    warning = [line for line in captured.err.splitlines() if line.startswith("[overlap] warning")]
    assert len(warning) == 1 and f"cal.jsonl:2 ~ {study_files / 'docs' / 'b.txt'} ({len(RUN)} words)" in warning[0]


def test_overlap_refuse_stops_the_study_before_the_fit(study_files, fits):
    study = load_study(write(study_files, ", overlap: refuse", docs=study_files / "docs"))
    out = study_files / "out"
    with pytest.raises(StudyError) as err:
        fit_maps_once(study, out)
    assert fits == [] and not maps_ready(study, out)
    assert "overlap: refuse" in str(err.value) and f"b.txt ({len(RUN)} words)" in str(err.value)
    assert json.loads((out / "overlap.json").read_text())["longest"] == len(RUN)  # the evidence is kept


def test_clean_calibration_records_no_overlap_and_fits(study_files, fits, capsys):
    (study_files / "docs" / "b.txt").write_text(words("b", 300))
    study = load_study(write(study_files, ", overlap: refuse", docs=study_files / "docs"))
    fit_maps_once(study, study_files / "out")
    assert len(fits) == 1 and fits[0]["overlap"] is False and fits[0]["shared_runs"] == []
    assert json.loads((study_files / "out" / "maps" / "fit.json").read_text())["overlap"]["overlap"] is False
    assert "[overlap] no overlap" in capsys.readouterr().out


def test_a_study_without_docs_fits_without_the_check(study_files, fits):
    study = load_study(write(study_files))
    fit_maps_once(study, study_files / "out")
    assert fits == [None] and not (study_files / "out" / "overlap.json").exists()
    assert json.loads((study_files / "out" / "maps" / "fit.json").read_text())["overlap"] is None


def test_unreadable_docs_stop_the_study_before_the_fit(study_files, fits):
    (study_files / "docs" / "a.txt").write_bytes(b"caf\xe9")
    study = load_study(write(study_files, docs=study_files / "docs"))
    with pytest.raises(StudyError, match=r"overlap check, before its fit: .*a.txt:1: not UTF-8 text"):
        fit_maps_once(study, study_files / "out")
    assert fits == []


@pytest.mark.parametrize("value, says", [("never", "fit.overlap must be warn or refuse, not 'never' (line 7)"),
                                         ("1", "fit: overlap must be str, got 1")])
def test_a_bad_fit_overlap_value_is_refused_with_its_line(study_files, value, says):
    with pytest.raises(StudyError, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_study(write(study_files, f", overlap: {value}"))
