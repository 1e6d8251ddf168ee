"""Calibration text for fitting is checked where it is read (issue #41, item 2): a bad file is named with
its line, the byte offset of a byte that is not UTF-8, or the field, before any model work."""

from __future__ import annotations

import pytest

from rf_eval.errors import UserError
from rf_eval.ridge.calibration import CalibrationError, check_nonempty, iter_documents

BAD_CALIBRATION = [
    ("cal.txt", b"plain text\nthen \xe9t\xe9\n", "cal.txt:2: not UTF-8 text (byte 0xe9 at byte offset 16)"),
    ("cal.jsonl", b'{"text": "one"}\n{"text": "t\xffo"}\n', "cal.jsonl:2: not UTF-8 text (byte 0xff at byte offset 27)"),
    ("cal.jsonl", b'{"text": "one"}\n{"text": "two"\n', "cal.jsonl:2: not JSON (Expecting ',' delimiter at column 15)"),
    ("cal.jsonl", b'{"text": "one"}\n{"text": ["two"]}\n',
     "cal.jsonl:2: each JSONL line needs a string 'text' field; its \"text\" is a list, not a string"),
    ("cal.jsonl", b'"just a string"\n', "cal.jsonl:1: each JSONL line needs a string 'text' field; this one is a string"),
]


@pytest.mark.parametrize("name, content, says", BAD_CALIBRATION)
def test_bad_calibration_files_are_named_before_the_fit(tmp_path, name, content, says):
    good = tmp_path / "good.txt"
    good.write_text("some calibration text", encoding="utf-8")
    bad = tmp_path / name
    bad.write_bytes(content)
    with pytest.raises(UserError) as err:
        check_nonempty([good, bad])  # what `rf-eval fit` runs before it loads the model
    assert str(err.value).startswith(f"{tmp_path}/{says}"), str(err.value)


def test_good_and_missing_calibration_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n\n{"text": "  "}\n{"text": "two"}\n', encoding="utf-8")
    (tmp_path / "b.txt").write_text("café", encoding="utf-8")
    assert list(iter_documents([tmp_path / "a.jsonl", tmp_path / "b.txt"])) == ["one", "two", "café"]
    with pytest.raises(CalibrationError, match="calibration file .*none.txt does not exist"):
        check_nonempty([tmp_path / "none.txt"])


def test_rf_eval_fit_prints_the_named_byte_as_one_line(tiny_model_dir, tmp_path, capsys):
    from rf_eval.cli import main

    bad = tmp_path / "latin1.txt"
    bad.write_bytes("calibration text in Latin-1: r\xe9sum\xe9\n".encode("latin-1"))
    code = main(["fit", "--model", tiny_model_dir("llama"), "--splits", "1", "--calibration", str(bad),
                 "--out", str(tmp_path / "maps"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if str(bad) in line]
    assert lines == [f"rf-eval fit: error: {bad}:1: not UTF-8 text (byte 0xe9 at byte offset 30); save the file "
                     "as UTF-8"], err
    assert "codec" not in err and not (tmp_path / "maps").exists()
