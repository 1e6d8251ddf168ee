"""The files `keytoken_nll` (and `decode_agreement`) read: the documents (`docs`) and an exact run's
samples file (`key_reference`), each checked where it is read (`rf_eval.files.data_files`).

Documents: a folder of `.txt` files (one document each, id = path under the
folder, domain = subfolder) and/or `.jsonl` files (one {"text", optional
"id", "domain"} per line; id default `<file name>:<line index from 0>`), or
one such file. Ids must be unique: key tokens and results are matched by id.

Key reference: the samples file lm-eval writes with `--log_samples` for an
earlier exact run of `keytoken_nll` (or its output folder: the newest
`samples_keytoken_nll*.jsonl` under it). Each line must hold the document
(`doc.doc_id`) and the scored pass's response (`filtered_resps`, written as
a Python repr of {"tokens", "logprobs", ...}); another task's samples file is
refused naming its line.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError
from rf_eval.files.data_files import DataFileError, check_fields, folder_files, iter_jsonl, read_text

DOCS_OPTION = "docs"
REFERENCE_OPTION = "key_reference"
REFERENCE_HINT = "key_reference names the samples file (--log_samples) of an exact keytoken_nll run"


class KeyTokenDataError(UserError, RuntimeError):
    """Missing documents or an unusable key-token reference."""


def documents_folder(metadata: dict | None, task: str) -> str:
    """The `docs` folder a long-document task reads, or an error saying how to pass it."""
    path = (metadata or {}).get(DOCS_OPTION)
    if not path:
        raise KeyTokenDataError(
            f"{task} reads long documents from a local folder: pass --metadata "
            f"'{{\"{DOCS_OPTION}\": \"/path/to/documents\"}}' (.txt files and/or .jsonl with a `text` field)"
        )
    return path


def load_documents(path: str | Path) -> list[dict[str, str]]:
    """Documents from a folder (recursively) or file of .txt / .jsonl, in sorted path order."""
    root = Path(path).expanduser()
    if not root.exists():
        raise KeyTokenDataError(f"{DOCS_OPTION}: {root} does not exist")
    files = [root] if root.is_file() else folder_files(root, (".txt", ".jsonl"), DOCS_OPTION, recursive=True)
    docs: list[dict[str, str]] = []
    where: dict[str, str] = {}
    for f in files:
        domain = "" if root.is_file() or f.parent == root else f.parent.relative_to(root).as_posix()
        if f.suffix != ".jsonl":
            name = f.relative_to(root).as_posix() if root.is_dir() else f.name
            found = [(str(f), {"doc_id": name, "domain": domain, "text": read_text(f, DOCS_OPTION)})]
        else:
            found = [(f"{f}:{n}", {"doc_id": str(row.get("id", f"{f.name}:{n - 1}")),
                                   "domain": str(row.get("domain", domain)), "text": row["text"]})
                     for n, row in iter_jsonl(f, {"text": str}, DOCS_OPTION)]
        for place, doc in found:
            if doc["doc_id"] in where:
                raise DataFileError(f"{place}: document id {doc['doc_id']!r} is also the id of {where[doc['doc_id']]}; "
                                    "each document needs its own id (key tokens and results are matched by id)")
            where[doc["doc_id"]] = place
            docs.append(doc)
    if not docs:
        raise KeyTokenDataError(f"{DOCS_OPTION}: no documents in {root} (its .jsonl files hold no lines)")
    return docs


def exact_logprobs(resp: dict[str, Any], arm_exact: bool) -> list[float] | None:
    """A response's exact full-context log-probabilities: the same-run reference's, else the arm's own when
    the arm is exact, else None."""
    if "exact_logprobs" in resp:
        return list(resp["exact_logprobs"])
    return list(resp["logprobs"]) if arm_exact else None


def _response(value: Any, where: str) -> dict[str, Any]:
    """One `token_logprobs` response of a samples line (lm-eval writes responses as their Python repr)."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise DataFileError(f"{where}: {value[:60]!r} is not a keytoken_nll response; {REFERENCE_HINT}") from None
    return check_fields(value, {"tokens": list, "logprobs": list}, where, REFERENCE_HINT)


def reference_file(path: str | Path) -> Path:
    """The samples file `key_reference` names: the file, or the newest name-sorted one under a folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(p.rglob("samples_keytoken_nll*.jsonl"))
        if not found:
            raise KeyTokenDataError(f"{REFERENCE_OPTION}: no samples_keytoken_nll*.jsonl under {p}")
        p = found[-1]
    if not p.is_file():
        raise KeyTokenDataError(f"{REFERENCE_OPTION}: {p} does not exist")
    return p


def read_reference(path: str | Path) -> dict[str, dict[str, Any]]:
    """{doc_id: {"tokens", "exact", "cut_exact"}} from a samples file of an exact keytoken_nll run."""
    p = reference_file(path)
    out: dict[str, dict[str, Any]] = {}
    for number, rec in iter_jsonl(p, {"doc": dict, "filtered_resps": list}, REFERENCE_OPTION, REFERENCE_HINT):
        where = f"{p}:{number}"
        doc_id = str(check_fields(rec["doc"], {"doc_id": (str, int)}, f"{where}: doc", REFERENCE_HINT)["doc_id"])
        if not rec["filtered_resps"]:
            raise DataFileError(f"{where}: filtered_resps is empty; {REFERENCE_HINT}")
        resps = [_response(r, f"{where}: filtered_resps[{i}]") for i, r in enumerate(rec["filtered_resps"])]
        arm_exact = bool(rec.get("arm_exact"))
        exact = exact_logprobs(resps[0], arm_exact)
        if exact is None:
            raise KeyTokenDataError(
                f"{REFERENCE_OPTION} {p}: document {doc_id} holds no exact losses "
                "(run the reference with fill=exact or reference=exact)"
            )
        cut = exact_logprobs(resps[1], arm_exact) if len(resps) > 1 else None
        out[doc_id] = {"tokens": list(resps[0]["tokens"]), "exact": exact, "cut_exact": cut}
    if not out:
        raise DataFileError(f"{p}: no samples in the file; {REFERENCE_HINT}")
    return out
