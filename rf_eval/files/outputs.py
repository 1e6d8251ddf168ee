"""Files rf-eval writes where the user names them: never over a file rf-eval did not write.

Every text file a command writes at a path the user names (`rf-eval report --html/--latex/--markdown/--json`,
`rf-eval ttft --out`, `rf-eval check-equivalence --json`) carries `MARKER` at its start: a comment in HTML,
LaTeX and Markdown (`stamp`), a `written_by` key in JSON (`stamp_json`). Before it writes anything, a command
checks all its outputs at once (`check_outputs`): a path that is a folder, ends in a path separator or lies
under a file is refused, and so is an existing file without the marker (`--latex paper.tex` naming the
user's own paper) unless the command was given `--overwrite`. An earlier rf-eval output is replaced, so a
report reruns into the same files. The refusal is one `UserError` line naming the option and the file, and
nothing has been written when it comes.

A file rf-eval wrote before it marked its outputs carries no marker: it is refused like any other until
`--overwrite` replaces it (with a marked one). Binary outputs cannot carry the mark: a command that writes
one where the user names the file (`rf-eval fit-state-correction --out FILE.safetensors`) replaces an
existing file only with `--overwrite`, as the map-writing commands do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError

MARKER = "written by rf-eval, which may replace this file"
HEAD_BYTES = 4096  # the marker is looked for in a file's first bytes only
_COMMENT = {"html": "<!-- {} -->", "tex": "% {}", "md": "<!-- {} -->"}


def stamp(text: str, fmt: str) -> str:
    """`text` (an `fmt` document: html, tex or md) with the marker as a comment line at its start (HTML: after
    its doctype, which must stay first)."""
    line = _COMMENT[fmt].format(MARKER)
    if fmt == "html" and text.lstrip()[:9].lower() == "<!doctype":
        doctype, _, rest = text.lstrip().partition("\n")
        return f"{doctype}\n{line}\n{rest}"
    return f"{line}\n{text}"


def stamp_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with the marker as its first key (`written_by`)."""
    return {"written_by": MARKER, **{k: v for k, v in data.items() if k != "written_by"}}


def written_by_rf_eval(path: str | Path) -> bool:
    """Whether the file at `path` carries rf-eval's output marker near its start."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        return False
    return MARKER.encode() in head


def _nearest_existing(path: Path) -> Path:
    for parent in path.parents:
        if parent.exists():
            return parent
    return Path(".")


def check_output(option: str, value: str | Path, *, overwrite: bool) -> Path:
    """The path `option` names, checked as an output file (see the module docstring); a UserError otherwise."""
    text = str(value)
    path = Path(text).expanduser()
    if path.is_dir():
        raise UserError(f"{option} {text} is a folder; name a file in it, e.g. {path / ('report' + _suffix(option))}")
    if text.endswith(("/", os.sep)):
        raise UserError(f"{option} {text} ends in a path separator; name a file, e.g. {path / ('report' + _suffix(option))}")
    above = _nearest_existing(path)
    if not above.is_dir():
        raise UserError(f"{option} {text}: {above} is a file, not a folder; name a file in a folder")
    if not os.access(above if not path.exists() else path, os.W_OK):
        raise UserError(f"{option} {text}: {'the file' if path.exists() else above} is not writable here")
    if path.exists() and not overwrite and not written_by_rf_eval(path):
        raise UserError(f"{option} {text} exists and carries no mark that rf-eval wrote it; name another file, "
                        "or pass --overwrite to replace it")
    return path


def _suffix(option: str) -> str:
    return {"--html": ".html", "--latex": ".tex", "--markdown": ".md"}.get(option, ".json")


def check_outputs(outputs: Mapping[str, str | Path | None], *, overwrite: bool) -> dict[str, Path]:
    """Every named output (option -> path; None: not asked for) checked at once, before any is written: each by
    `check_output`, and no two naming one file. Returns option -> path."""
    checked: dict[str, Path] = {}
    seen: dict[Path, str] = {}
    for option, value in outputs.items():
        if not value:
            continue
        resolved = Path(value).expanduser().resolve()
        if resolved in seen:
            raise UserError(f"{seen[resolved]} and {option} both name {value}; give each output its own file")
        seen[resolved] = option
        checked[option] = check_output(option, value, overwrite=overwrite)
    return checked


def write_output(path: str | Path, text: str) -> Path:
    """Write `text` (already stamped) at a checked output path, creating its folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
