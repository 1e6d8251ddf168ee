"""The one error type rf-eval's commands report without a traceback.

A `UserError` is bad input or a missing file that the user can fix: its message
names the value and what to do. `rf-eval` prints it as one line
(`rf_eval.cli.main`); under the `lm_eval` command (and `python -m lm_eval`,
`accelerate launch -m lm_eval`), rf-eval's startup hook wraps lm-eval's CLI
(`one_line`, `rf_eval._startup`) so that a `UserError` anywhere in the chain of
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
            found = user_error_in(err)
            if found is None or os.environ.get("RF_EVAL_TRACEBACK", "").strip().lower() in ("1", "true", "yes", "on"):
                raise
            print(f"{prog}: {' '.join(str(found).split())}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    wrapped._rf_eval = True
    return wrapped
