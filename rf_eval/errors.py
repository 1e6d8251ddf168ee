"""The one error type rf-eval's commands report without a traceback, and the errors below rf-eval it
translates into one line (`explain`).

A `UserError` is bad input or a missing file that the user can fix: its message
names the value and what to do. `rf-eval` prints it as one line
(`rf_eval.cli.main`); under the `lm_eval` command (and `python -m lm_eval`,
`accelerate launch -m lm_eval`), rf-eval's startup hook wraps lm-eval's CLI
(`one_line`, `rf_eval.model_adapters.startup`) so that a `UserError` anywhere in the chain of
what it raises, a missing data folder or a bad model_args value, is one line
on stderr with exit status 2, not a traceback through lm-eval. Set
RF_EVAL_TRACEBACK=1 to see the traceback.
"""

from __future__ import annotations

import os
import sys


class UserError(ValueError):
    """Bad input from the user (a value, a path, a file): reported without a traceback."""


def user_error_in(exc: BaseException | None) -> UserError | None:
    """The first UserError in `exc`'s chain (itself, its cause, its context), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UserError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


# The libraries below rf-eval whose input-checking errors a user's value or file causes: a ValueError or
# TypeError raised inside one of them (its innermost frame in their code) is reported as one line.
LOWER_LAYERS = ("lm_eval", "transformers", "tokenizers", "huggingface_hub", "datasets", "safetensors", "jinja2")


def _raised_in(exc: BaseException) -> str:
    """The top-level package of the innermost frame `exc` was raised in ('' when unknown)."""
    tb = exc.__traceback__
    module = ""
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    return module.split(".", 1)[0]


def _translated(exc: BaseException) -> str | None:
    """A one-line message for an error below rf-eval that bad input causes, else None (a bug: traceback)."""
    import json

    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}); check the file or value given"
    if isinstance(exc, UnicodeDecodeError):
        return (f"a file is not UTF-8 text ({exc.reason} at byte {exc.start}); give a UTF-8 text file "
                "(e.g. `iconv -t UTF-8`)")
    if type(exc).__module__.startswith("yaml") and type(exc).__name__.endswith("Error"):
        return f"not valid YAML: {' '.join(str(exc).split())}"
    if isinstance(exc, OSError):
        if getattr(exc, "filename", None):
            hint = {IsADirectoryError: "a folder where a file is expected",
                    NotADirectoryError: "a file where a folder is expected",
                    FileNotFoundError: "no such file or folder",
                    PermissionError: "no permission",
                    FileExistsError: "it exists already"}.get(type(exc), exc.strerror or type(exc).__name__)
            return f"{exc.filename}: {hint}"
        return str(exc) if _raised_in(exc) in LOWER_LAYERS else None
    if isinstance(exc, (ValueError, TypeError, KeyError)) and _raised_in(exc) in LOWER_LAYERS:
        return f"{_raised_in(exc)} refused the input: {exc} (RF_EVAL_TRACEBACK=1 shows where)"
    return None


def explain(exc: BaseException) -> str | None:
    """The one-line message for `exc`: a UserError in its chain, else a known error of the layers below
    rf-eval caused by bad input (files, JSON/YAML, transformers' and lm-eval's checks); None for anything
    else, which is a bug and keeps its traceback."""
    found = user_error_in(exc)
    if found is not None:
        return " ".join(str(found).split())
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        message = _translated(exc)
        if message is not None:
            return " ".join(message.split())
        exc = exc.__cause__ or exc.__context__
    return None


def traceback_wanted() -> bool:
    return os.environ.get("RF_EVAL_TRACEBACK", "").strip().lower() in ("1", "true", "yes", "on")


def one_line(run, prog: str = "rf-eval"):
    """`run` wrapped so that a UserError anywhere in what it raises prints as one line, `PROG: MESSAGE`,
    and exits with status 2, as bad arguments do (other errors pass unchanged). RF_EVAL_TRACEBACK=1
    keeps the traceback."""
    import functools

    @functools.wraps(run)
    def wrapped(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        except Exception as err:
            message = explain(err)
            if message is None or traceback_wanted():
                raise
            print(f"{prog}: {message}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    wrapped._rf_eval = True
    return wrapped
