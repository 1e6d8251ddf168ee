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
