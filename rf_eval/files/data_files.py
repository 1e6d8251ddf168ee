"""The readers of the data files users give rf-eval: one per format, each naming `file:line` and the field.

A data file is read once, where it is used, and a bad one stops there with a
`DataFileError` (a `UserError`: one line `rf-eval: ...`, exit status 2) that
names the file, the line (or byte offset) and the field, and says what the
format wants, instead of a JSONDecodeError, a KeyError or a codec error that
names nothing. Formats:

- text (`read_text`): UTF-8; a byte that is not is named by its offset and line;
- JSON (`read_json`): one document;
- JSON lines (`iter_jsonl`, `read_jsonl`): one JSON object per non-blank line;
- records (`check_fields`): the fields a record must hold, and their types;
- folders (`folder_files`): a folder that exists and holds files of the kinds read.

The callers: `keytoken_nll` / `decode_agreement` documents and key references
(`rf_eval.tasks.keytoken_files`), LongBench v2 items and prompt files
(`rf_eval.tasks.longbench_cot`), RULER haystacks and QA sources
(`rf_eval.tasks.ruler_data`), calibration text for fitting
(`rf_eval.ridge.calibration`), the fetch manifest (`rf_eval.tasks.data_fetch`).
It sits at the package root, not among the tasks: the ridge package reads
calibration text with it and sits below the tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from rf_eval.errors import UserError

#: a record's required fields and the type each must have (`str`, `dict`, `list`, or a tuple of them)
Fields = Mapping[str, type | tuple[type, ...]]

_KINDS = {str: "a string", dict: "an object", list: "a list", int: "a number", float: "a number",
          bool: "true/false", type(None): "null"}


class DataFileError(UserError):
    """A data file that is missing, unreadable, or not in the format it is read as."""


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _open(path: Path, what: str) -> BinaryIO:
    """The file opened for reading bytes, or a DataFileError naming `what` (the option or role that named
    it) and the path: missing, a folder, or unreadable."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise DataFileError(f"{what}: {path} does not exist") from None
    except IsADirectoryError:
        raise DataFileError(f"{what}: {path} is a folder; give a file") from None
    except OSError as err:
        raise DataFileError(f"{what}: cannot read {path} ({err.strerror or err})") from None


def decode(raw: bytes, path: str | Path, *, offset: int = 0, line: int | None = None) -> str:
    """`raw` as UTF-8 text, or a DataFileError naming the file, the line and the byte offset of the first
    byte that is not UTF-8 (`offset`: where `raw` starts in the file; `line`: its line number, if known)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        at = line if line is not None else raw.count(b"\n", 0, err.start) + 1
        raise DataFileError(f"{path}:{at}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte offset "
                            f"{offset + err.start}); save the file as UTF-8") from None


def read_text(path: str | Path, what: str = "data file") -> str:
    """A UTF-8 text file's text; `what` names the option or role in the missing/unreadable message."""
    p = Path(path).expanduser()
    with _open(p, what) as fh:
        return decode(fh.read(), p)


def read_json(path: str | Path, what: str = "data file") -> Any:
    """A file holding one JSON document (a truncated or hand-edited file is named with its line and column)."""
    p = Path(path).expanduser()
    text = read_text(p, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataFileError(f"{p}:{err.lineno}: not JSON ({err.msg} at column {err.colno}); the file must be "
                            "one JSON document (a truncated download? fetch it again)") from None


def _needs(fields: Fields) -> str:
    if list(fields) == ["text"]:
        return '{"text": ...}'
    return "the fields " + ", ".join(fields)


def check_fields(record: Any, fields: Fields, where: str, hint: str = "") -> dict[str, Any]:
    """`record` if it is a JSON object holding every field of `fields` with its type, else a DataFileError
    `WHERE: HINT; this one ...` naming the place (e.g. `file:line`, `file: item 3`), what each record
    should be (`hint`, default from `fields`) and the field at fault."""
    hint = hint or f"each record needs {_needs(fields)}"
    if not isinstance(record, dict):
        raise DataFileError(f"{where}: {hint}; this one is {_kind(record)}, not a JSON object")
    for name, kind in fields.items():
        if name not in record:
            raise DataFileError(f'{where}: {hint}; this one has no "{name}" field')
        if not isinstance(record[name], kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            want = " or ".join(dict.fromkeys(_KINDS.get(k, k.__name__) for k in kinds))
            raise DataFileError(f'{where}: {hint}; its "{name}" is {_kind(record[name])}, not {want}')
    return record


def iter_jsonl(
    path: str | Path, fields: Fields | None = None, what: str = "data file", hint: str = ""
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each non-blank line of a JSON-lines file, read line by line (a large
    calibration file is never held whole); each line must be a JSON object with `fields`. `hint`: what
    the file should be, for the messages (default: the line format)."""
    p = Path(path).expanduser()
    hint = hint or f"each line must be one JSON object{'' if not fields else ' with ' + _needs(fields)}"
    offset = 0
    with _open(p, what) as fh:
        for number, raw in enumerate(fh, 1):
            line = decode(raw, p, offset=offset, line=number)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                record = json.loads(line.rstrip("\r\n"))  # a column past the end names the line's end
            except json.JSONDecodeError as err:
                raise DataFileError(f"{p}:{number}: not JSON ({err.msg} at column {err.colno}); {hint}") from None
            yield number, check_fields(record, fields or {}, f"{p}:{number}", hint)


def read_jsonl(
    path: str | Path, fields: Fields | None = None, what: str = "data file", hint: str = ""
) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file (`iter_jsonl`)."""
    return [record for _, record in iter_jsonl(path, fields, what, hint)]


def check_items(items: Any, fields: Fields, path: str | Path, hint: str = "") -> list[dict[str, Any]]:
    """A JSON file's list of records, each checked (`check_fields`, named `file: item N`, N from 0)."""
    if not isinstance(items, list):
        raise DataFileError(f"{path}: {hint or 'the file must be a JSON list of records'}; it holds {_kind(items)}")
    return [check_fields(item, fields, f"{path}: item {i}", hint) for i, item in enumerate(items)]


def folder_files(folder: str | Path, suffixes: Sequence[str], what: str, recursive: bool = False) -> list[Path]:
    """The files with one of `suffixes` in `folder` (sorted; `recursive`: in its subfolders too), or a
    DataFileError naming the folder when it is missing or holds none."""
    p = Path(folder).expanduser()
    if not p.is_dir():
        raise DataFileError(f"{what}: folder {p} does not exist" if not p.exists() else f"{what}: {p} is not a folder")
    found = sorted(f for f in (p.rglob("*") if recursive else p.iterdir()) if f.suffix in suffixes and f.is_file())
    if not found:
        raise DataFileError(f"{what}: folder {p} holds no {' or '.join(suffixes)} files")
    return found
