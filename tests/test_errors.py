"""`rf_eval.errors`: a UserError anywhere in an exception's chain is one line and exit status 2."""

from __future__ import annotations

import pytest

from rf_eval.errors import UserError, one_line, user_error_in


def _raises_wrapped():
    try:
        raise UserError("split=99 is outside 1..5\n(for this 6-layer model)")
    except UserError as err:
        raise RuntimeError("lm-eval could not build the model") from err


def test_a_user_error_inside_another_error_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        one_line(_raises_wrapped, "prog")()
    assert stop.value.code == 2
    assert capsys.readouterr().err == "prog: split=99 is outside 1..5 (for this 6-layer model)\n"


def test_other_errors_and_rf_eval_traceback_keep_the_traceback(monkeypatch):
    with pytest.raises(KeyError):
        one_line(lambda: {}["x"])()
    monkeypatch.setenv("RF_EVAL_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="could not build"):
        one_line(_raises_wrapped)()


def test_user_error_in_follows_causes_and_contexts_without_looping():
    err = RuntimeError("outer")
    err.__context__ = err  # a cycle
    assert user_error_in(err) is None
    assert isinstance(user_error_in(ValueError("x")), type(None))
    with pytest.raises(RuntimeError) as info:
        _raises_wrapped()
    assert str(user_error_in(info.value)).startswith("split=99")


def _json():
    import json

    json.loads('{"a": 1,')


def _not_utf8():
    b"\xff\xfe text".decode("utf-8")


def _folder(tmp_path):
    return lambda: open(tmp_path).read()


def _yaml():
    import yaml

    yaml.safe_load("a: [1, 2")


def _transformers_value():
    from transformers import AutoConfig

    AutoConfig.for_model("no_such_model_type")


@pytest.mark.parametrize("make, says", [
    (lambda tmp: _json, "not valid JSON: Expecting property name enclosed in double quotes (line 1, column 9)"),
    (lambda tmp: _not_utf8, "a file is not UTF-8 text (invalid start byte at byte 0)"),
    (_folder, ": a folder where a file is expected"),
    (lambda tmp: _yaml, "not valid YAML: while parsing a flow sequence"),
    (lambda tmp: _transformers_value, "transformers refused the input: Unrecognized model identifier: no_such_model_type"),
])
def test_errors_of_the_layers_below_are_one_line_and_exit_2(tmp_path, capsys, make, says):
    with pytest.raises(SystemExit) as stop:
        one_line(make(tmp_path), "prog")()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("prog: ") and err.count("\n") == 1 and says in err


def test_a_bug_in_rf_eval_keeps_its_traceback():
    """A ValueError or KeyError raised in rf-eval's own code (not a library's input check) is a bug."""
    from rf_eval.errors import explain

    def ours():
        raise ValueError("internal invariant broken")

    with pytest.raises(ValueError):
        one_line(ours)()
    try:
        {}["x"]
    except KeyError as err:
        assert explain(err) is None
