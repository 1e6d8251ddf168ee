"""Calibration documents: plain-text files (one document each) or JSONL with a `text` field, read by the
shared data-file readers (`rf_eval.files.data_files`): a bad file is named with its line (or the byte
offset of the first byte that is not UTF-8) and the field; `tokenized` gives this process's share of them as
token ids (the map fit, RaReCache's transfer fit, the state-correction fit)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rf_eval.devices import rank_and_world
from rf_eval.errors import UserError
from rf_eval.files.data_files import iter_jsonl, read_text

WHAT = "calibration file"
JSONL_HINT = "each JSONL line needs a string 'text' field"


class CalibrationError(UserError):
    """Missing, unreadable or empty calibration input (a bad file's lines: `data_files.DataFileError`)."""


def iter_documents(paths: Sequence[str | Path]) -> Iterator[str]:
    """Documents in the order given: a .jsonl file yields one per line, any other file one (blank ones
    skipped). JSONL is read line by line, so a large file is never held whole."""
    for _, text in iter_named_documents(paths):
        yield text


def iter_named_documents(paths: Sequence[str | Path]) -> Iterator[tuple[str, str]]:
    """(name, text) of each document of `iter_documents`: the file's path, or `path:line` (from 1) for a
    JSONL line, so a report can name the document (`rf_eval.study.overlap`)."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            raise CalibrationError(f"{WHAT} {path} is a folder; give the files in it (e.g. {path}/*.jsonl)")
        if not path.is_file():
            raise CalibrationError(f"{WHAT} {path} does not exist")
        if path.suffix == ".jsonl":
            for number, record in iter_jsonl(path, {"text": str}, WHAT, JSONL_HINT):
                if record["text"].strip():
                    yield f"{path}:{number}", record["text"]
        else:
            text = read_text(path, WHAT)
            if text.strip():
                yield str(path), text


def check_disjoint(calibration: Sequence[str | Path], heldout: Sequence[str | Path]) -> None:
    """Held-out documents choose lambda (RidgeFill section 2.2): one that is also a calibration document
    would choose it on the training data. Refused, naming how many (documents compared by exact text)."""
    if not heldout:
        return
    fitted = {hashlib.sha256(text.encode()).digest() for text in iter_documents(calibration)}
    held = [hashlib.sha256(text.encode()).digest() for text in iter_documents(heldout)]
    shared = sum(1 for h in held if h in fitted)
    if shared:
        raise CalibrationError(f"{shared} of the {len(held)} held-out documents are also calibration documents: "
                               "lambda would be chosen on the text the maps are fitted on; give held-out text "
                               "the calibration files do not contain")


def check_nonempty(paths: Sequence[str | Path]) -> None:
    """Fail before any model work if the inputs hold no document or a line that is not one: every line is
    read here (a bad line at the end would otherwise stop a capture hours in)."""
    if not paths:
        raise CalibrationError("no calibration files given")
    if sum(1 for _ in iter_documents(paths)) == 0:  # every line read, not just up to the first document
        raise CalibrationError(f"calibration input is empty: no non-blank document in {', '.join(map(str, paths))}")


def check_has_rows(paths: Sequence[str | Path], tokenizer) -> None:
    """Fail before the model loads when no document gives a row: a document's rows start at its second token
    (`tokenized` drops shorter ones), so inputs of one-token documents would fit nothing. Stops at the first
    document long enough."""
    if not any(len(tokenizer(text).input_ids) >= 2 for text in iter_documents(paths)):
        raise CalibrationError(f"every calibration document in {', '.join(map(str, paths))} is shorter than 2 "
                               "tokens under the model's tokenizer, and a document gives rows from its second token "
                               "on; give longer documents")


def tokenized(
    tokenizer, paths: Sequence[str | Path], device, max_tokens: int, desc: str, progress: bool
) -> Iterator[torch.Tensor]:
    """This rank's share of the documents as 1 x n id tensors (truncated to max_tokens)."""
    rank, world = rank_and_world()
    docs = list(iter_documents(paths))
    for i, text in enumerate(tqdm(docs, desc=desc, disable=not progress or rank != 0, unit="doc")):
        if i % world != rank:
            continue
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_tokens).input_ids
        if ids.shape[1] >= 2:
            yield ids.to(device)
