"""A study's `fit:` block: keyed by the sha256 of the files it reads, refitted (over the old maps) when they
change, reused when they do not."""

from __future__ import annotations

from pathlib import Path

from test_study import STUDY, write_study

from rf_eval.study.study_file import load_study


def test_an_edited_calibration_file_refits_the_maps_and_a_same_one_reuses_them(tmp_path, monkeypatch):
    """The `fit:` block is keyed by the sha256 of the files it reads: the same text reuses the fitted maps, an
    edited calibration (or held-out) file fits them again, so the arms that read them rerun (their
    fingerprints hold the maps' sha256)."""
    from types import SimpleNamespace

    import rf_eval.study.runner as runner
    from rf_eval.study.runner import fit_maps_once, maps_ready

    fits: list[str] = []

    def fake_fit(out, *, overwrite, calibration, **options):  # stands in for the capture and solve
        folder = Path(out)  # writes maps that depend on the calibration text
        assert overwrite == (folder.is_dir() and any(folder.iterdir())), "a refit must replace the old maps"
        assert options["model"] == "/m" and options["splits"] == [3]
        folder.mkdir(parents=True, exist_ok=True)
        text = "".join(Path(c).read_text() for c in calibration)
        (folder / "maps.safetensors").write_text(text)
        fits.append(text)
        return SimpleNamespace(sums_device=None, paths={})

    monkeypatch.setattr(runner, "fit_map_files", fake_fit)
    monkeypatch.setattr(runner, "load_tokenizer", lambda name: None)  # no model at /m: the word check alone
    (tmp_path / "cal.jsonl").write_text('{"text": "first"}\n')
    (tmp_path / "held.jsonl").write_text('{"text": "held"}\n')
    text = STUDY.replace("margin: 5.0", "margin: 5.0\nfit: {{calibration: [cal.jsonl], heldout: [held.jsonl], split: 3}}")
    study = load_study(write_study(tmp_path, "/m", tmp_path, text))
    out = tmp_path / "out"
    assert not maps_ready(study, out)
    fit_maps_once(study, out)
    assert maps_ready(study, out) and len(fits) == 1
    fit_maps_once(study, out)
    assert len(fits) == 1  # same inputs: reused
    (tmp_path / "cal.jsonl").write_text('{"text": "second"}\n')
    assert not maps_ready(study, out)
    fit_maps_once(study, out)
    assert fits == ['{"text": "first"}\n', '{"text": "second"}\n']
    (tmp_path / "held.jsonl").write_text('{"text": "other"}\n')
    assert not maps_ready(study, out)


def test_a_fit_block_split_the_model_does_not_have_is_refused_naming_the_fit_block(tmp_path, tiny_model_dir):
    """Before anything runs: the `fit:` block's split checked against the model's layers, the block named
    (issue #54, item 5)."""
    import pytest

    from rf_eval.study.preflight import check_arm_args, check_study
    from rf_eval.study.study_file import StudyError

    (tmp_path / "cal.jsonl").write_text('{"text": "first"}\n')
    text = STUDY.replace("margin: 5.0", "margin: 5.0\nfit: {{calibration: [cal.jsonl], split: 40}}")
    study = load_study(write_study(tmp_path, tiny_model_dir("llama"), tmp_path, text))
    for arm in study.arms.values():  # the arms alone are fine: the fit block is what is wrong
        check_arm_args(study, arm)
    with pytest.raises(StudyError, match=r"study\.yaml: fit\.split: split 40 is outside 1\.\.5"):
        check_study(study)
