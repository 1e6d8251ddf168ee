"""The one error type rf-eval's commands report without a traceback.

A `UserError` is bad input or a missing file that the user can fix: its message
names the value and what to do. `rf-eval` prints it as one line
(`rf_eval.cli.main`); under the `lm_eval` command, rf-eval's startup hook does
the same for a `UserError` anywhere in an uncaught exception's chain
(`rf_eval._startup`), so a missing data folder is one line on stderr, not a
traceback through lm-eval (the exit status stays Python's 1 for an uncaught
error). Set RF_EVAL_TRACEBACK=1 to see the traceback.
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


def install_one_line_hook(prog: str) -> None:
    """Make an uncaught UserError print as one line, `PROG: error: MESSAGE` (other errors unchanged)."""
    if os.environ.get("RF_EVAL_TRACEBACK", "").strip().lower() in ("1", "true", "yes", "on"):
        return
    previous = sys.excepthook
    if getattr(previous, "_rf_eval", False):
        return

    def hook(kind, value, tb):
        found = user_error_in(value)
        if found is None:
            return previous(kind, value, tb)
        print(f"{prog}: error: {' '.join(str(found).split())}", file=sys.stderr, flush=True)

    hook._rf_eval = True
    sys.excepthook = hook
