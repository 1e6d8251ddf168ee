"""Overlap of calibration text with evaluation text: the checks of RidgeFill Appendix G ("Overlap with the test
sets"), with the 50-word rule of section 6.7.

Maps fitted on text a study then evaluates would be scored on their own training data. Appendix G's first check
looks for runs of 50 *tokens* under each model's tokenizer (`find_overlap(..., tokenizer=)`: the same run search
over token ids, `rf_eval.study.word_runs.shared_id_runs`); its third compares every calibration text with every
evaluation text in two ways, and so does this module:

- whole-text hashes: the sha256 of each text's UTF-8 bytes, exactly as read (a file's text, or a JSONL line's
  `text` field); equal hashes mean the same text;
- shared runs of words: a calibration text and an evaluation text *share a run* of k words when k consecutive
  words of one equal k consecutive words of the other; a pair is reported when it shares a run of N or more
  words (default 50, the paper's rule), with the length of its longest such run (extended to the maximal run,
  not N), how many maximal runs of N or more words it shares, and a short excerpt.

Words, as the rule counts them (NFKC, split at whitespace, compared case-folded), and how the runs are found
fast, a hash collision never reporting a run: `rf_eval.study.word_runs`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rf_eval.demo.model import resolve_pretrained
from rf_eval.errors import UserError
from rf_eval.files.outputs import stamp_json, write_output
from rf_eval.study.word_runs import TOKENISATION, shared_id_runs, shared_runs, words_of
from rf_eval.tasks.keytoken_files import load_documents

DEFAULT_WORDS = 50  # the paper's 50-word rule (section 6.7, Appendix G)
EXCERPT_WORDS = 12  # words of a run shown in the table and the JSON


class OverlapError(UserError):
    """Input the overlap check cannot use (no texts, a bad word count)."""


@dataclass(frozen=True)
class Text:
    """One text compared: its name (file, `file:line`, or a document id under its folder) and its text."""

    name: str
    text: str


@dataclass(frozen=True)
class Identical:
    """A calibration text with the same sha256 as an evaluation text."""

    calibration: str
    evaluation: str
    sha256: str


@dataclass(frozen=True)
class SharedRun:
    """A calibration-evaluation pair sharing a run of N or more words (or tokens, `Overlap.unit`): the longest
    run's length in those units and where it starts in each text (index from 0), how many maximal runs of N
    or more the pair shares
    (each alignment once: a run the evaluation text holds twice counts twice), and the longest run's first
    words."""

    calibration: str
    evaluation: str
    words: int
    runs: int
    calibration_word: int
    evaluation_word: int
    excerpt: str


@dataclass(frozen=True)
class Overlap:
    """The result of `find_overlap`."""

    words: int  # N, the rule's run length
    calibration_texts: int
    evaluation_texts: int
    identical: tuple[Identical, ...]
    pairs: tuple[SharedRun, ...]
    #: what a run counts: "words" (section 6.7's rule), or "tokens of NAME" (Appendix G's, per tokenizer)
    unit: str = "words"

    @property
    def found(self) -> bool:
        """Whether any pair shares a run of N or more words, or any two texts have the same hash."""
        return bool(self.identical or self.pairs)

    @property
    def longest(self) -> int:
        """The longest shared run of N or more words, over all pairs (0 when none)."""
        return max((p.words for p in self.pairs), default=0)

    def line(self) -> str:
        """The one-line verdict."""
        compared = f"{self.calibration_texts} calibration texts vs {self.evaluation_texts} evaluation texts"
        if not self.found:
            return (f"no overlap: no calibration text shares a run of {self.words} or more {self.unit} with an "
                    f"evaluation text, and none has the same sha256 ({compared})")
        parts = []
        if self.pairs:
            one = len(self.pairs) == 1
            parts.append(f"{len(self.pairs)} calibration-evaluation {'pair shares' if one else 'pairs share'} a run "
                         f"of {self.words} or more {self.unit} (longest {self.longest} {self.unit.split()[0]})")
        if self.identical:
            parts.append(f"{len(self.identical)} pair{'s' if len(self.identical) != 1 else ''} of identical texts "
                         "(same sha256)")
        return f"overlap found: {'; '.join(parts)} ({compared})"

    def table(self) -> str:
        """The pairs as a plain-text table (longest run first), then the identical texts ('' when none)."""
        lines: list[str] = []
        if self.pairs:
            rows = [("calibration", "evaluation", self.unit.split()[0], "runs", "excerpt")]
            rows += [(p.calibration, p.evaluation, str(p.words), str(p.runs), p.excerpt) for p in self.pairs]
            widths = [max(len(r[i]) for r in rows) for i in range(4)]
            for r in rows:
                cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2].rjust(widths[2]), r[3].rjust(widths[3])]
                lines.append("  ".join([*cells, r[4]]))
        for same in self.identical:
            lines.append(f"identical (sha256 {same.sha256[:16]}...): {same.calibration} = {same.evaluation}")
        return "\n".join(lines)

    def record(self) -> dict[str, Any]:
        """Everything, as JSON-ready data."""
        return {"overlap": self.found, "words": self.words, "unit": self.unit,
                "tokenisation": TOKENISATION if self.unit == "words" else self.unit,
                "calibration_texts": self.calibration_texts, "evaluation_texts": self.evaluation_texts,
                "pairs": len(self.pairs), "longest": self.longest, "line": self.line(),
                "identical": [asdict(i) for i in self.identical], "shared_runs": [asdict(p) for p in self.pairs]}


def calibration_texts(paths: Sequence[str | Path]) -> list[Text]:
    """The documents of calibration files, read as `rf-eval fit --calibration` reads them (plain text, one
    document a file; JSONL with a `text` field, one a line, named `file:line`)."""
    from rf_eval.ridge.calibration import CalibrationError, iter_named_documents

    if not paths:
        raise CalibrationError("no calibration files given")
    texts = [Text(name, text) for name, text in iter_named_documents(paths)]
    if not texts:
        raise CalibrationError(f"calibration input is empty: no non-blank document in {', '.join(map(str, paths))}")
    return texts


def evaluation_texts(paths: Sequence[str | Path]) -> list[Text]:
    """The documents of each path as `keytoken_nll` reads its `docs` (a folder of .txt / .jsonl files, or one
    such file; `rf_eval.tasks.keytoken_files.load_documents`). A text document is named by its file's path;
    a JSONL line by the path given and the id keytoken_nll matches results by (`PATH [id ID]`: its `id`
    field, else `file.jsonl:<line index from 0>`)."""

    if not paths:
        raise OverlapError("no evaluation texts given")
    texts: list[Text] = []
    for raw in paths:
        root = Path(raw).expanduser()
        base = root if root.is_dir() else root.parent
        for doc in load_documents(root):
            file = base / doc["doc_id"]
            name = str(file) if file.suffix != ".jsonl" and file.is_file() else f"{root} [id {doc['doc_id']}]"
            texts.append(Text(name, doc["text"]))
    return texts


def find_overlap(calibration: Sequence[Text], evaluation: Sequence[Text], words: int = DEFAULT_WORDS,
                 tokenizer: Any = None) -> Overlap:
    """Every calibration-evaluation pair with the same sha256 or sharing a run of `words` or more words (module
    docstring), or with `tokenizer` (a `transformers` tokenizer) of that many of its tokens; pairs with the
    longest run first. The whole-text hashes do not depend on the unit: the word check compares them, a token
    check does not again."""
    if isinstance(words, bool) or not isinstance(words, int) or words < 1:
        raise OverlapError(f"the run length must be a whole number of words >= 1, not {words!r}")
    identical = _identical(calibration, evaluation) if tokenizer is None else ()
    pairs: list[SharedRun] = []
    if tokenizer is None:
        found, unit = shared_runs([c.text for c in calibration], [e.text for e in evaluation], words), "words"
    else:
        def tokens(texts: Sequence[Text]) -> list[list[int]]:
            return [tokenizer(t.text, add_special_tokens=False)["input_ids"] for t in texts]

        cal_tokens = tokens(calibration)
        found = shared_id_runs(cal_tokens, tokens(evaluation), words)
        unit = f"tokens of {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}"
    for ci, runs_by_text in enumerate(found):
        for ei, runs in runs_by_text.items():
            start, other, length = max(runs, key=lambda r: (r[2], -r[0]))
            shown = min(length, EXCERPT_WORDS)
            excerpt = (" ".join(words_of(calibration[ci].text)[start:start + shown]) if tokenizer is None
                       else tokenizer.decode(cal_tokens[ci][start:start + shown]))
            excerpt += " ..." if length > EXCERPT_WORDS else ""
            pairs.append(SharedRun(calibration[ci].name, evaluation[ei].name, length, len(runs), start, other, excerpt))
    pairs.sort(key=lambda p: (-p.words, p.calibration, p.evaluation))
    return Overlap(words, len(calibration), len(evaluation), identical, tuple(pairs), unit)


def check_files(calibration: Sequence[str | Path], evaluation: Sequence[str | Path],
                words: int = DEFAULT_WORDS, tokenizers: Sequence[Any] = ()) -> list[Overlap]:
    """`find_overlap` over the documents of calibration files and evaluation documents (folders or files): by
    words, then by the tokens of each of `tokenizers` (Appendix G's check per model)."""
    cal, ev = calibration_texts(calibration), evaluation_texts(evaluation)
    return [find_overlap(cal, ev, words), *(find_overlap(cal, ev, words, tok) for tok in tokenizers)]


REFUSE, WARN = "refuse", "warn"  # what a study's `fit: {overlap: ...}` does when the check finds overlap


def check_before_fit(calibration: Sequence[str | Path], documents: str | Path, record: str | Path,
                     action: str = WARN, tokenizer: Any = None) -> dict[str, Any]:
    """The check a study runs before its `fit:` block fits maps (`rf_eval.study.runner.fit_maps_once`): the
    block's calibration and held-out files against the study's evaluation documents (`docs`), by words and by
    the study model's tokens (`tokenizer`). Writes the full result to `record` (JSON), prints the verdict
    lines, and on overlap a warning naming the pairs; with `action` = "refuse" an overlap is an OverlapError
    instead (the file is written first). Returns the summary the fit marker records."""
    if action not in (WARN, REFUSE):
        raise OverlapError(f"overlap: {action!r} is not {WARN} or {REFUSE}")

    results = check_files(calibration, [documents], tokenizers=[tokenizer] if tokenizer is not None else [])
    result = results[0]
    write_output(record, json.dumps(stamp_json({**result.record(), "by_tokens": [r.record() for r in results[1:]],
                                                "calibration_files": [str(c) for c in calibration],
                                                "evaluation": [str(documents)]}), indent=1) + "\n")
    for one in results:
        print(f"[overlap] {one.line()} -> {record}", flush=True)
    found = [one for one in results if one.found]
    if found:
        pairs = [(p, one.unit) for one in found for p in one.pairs]
        identical = result.identical
        named = "; ".join([f"{p.calibration} ~ {p.evaluation} ({p.words} {unit})" for p, unit in pairs[:5]]
                          + [f"{i.calibration} = {i.evaluation} (same text)" for i in identical[:5]])
        more = len(pairs) + len(identical) - min(len(pairs), 5) - min(len(identical), 5)
        named += f"; and {more} more (see {record})" if more else ""
        why = "the maps would be fitted on text the study evaluates (RidgeFill Appendix G)"
        if action == REFUSE:
            raise OverlapError(f"{found[0].line()}: {named}; {why}, and the fit: block says overlap: {REFUSE}. "
                               "Remove those documents from the calibration files (or the evaluation documents)")
        print(f"[overlap] warning: {why}: {named}. The fit goes on; `overlap: {REFUSE}` in the fit: block "
              "stops it instead", file=sys.stderr, flush=True)
    return {"file": str(record), "overlap": bool(found), "words": result.words, "pairs": len(result.pairs),
            "identical": len(result.identical), "longest": result.longest, "line": result.line(),
            **({"token_pairs": len(results[1].pairs), "token_line": results[1].line()} if len(results) > 1 else {})}


def load_tokenizer(name: str) -> Any:
    """A tokenizer by hub name or local folder (the demo model's for `demo`), or a UserError naming it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(resolve_pretrained(name))
    except (OSError, ValueError) as err:
        raise UserError(f"tokenizer {name!r}: none could be loaded ({str(err).splitlines()[0]}); give a "
                        "local folder, or a hub name on a machine that reaches the hub") from None


def _identical(calibration: Sequence[Text], evaluation: Sequence[Text]) -> tuple[Identical, ...]:
    """Every calibration text with the same sha256 as an evaluation text."""
    by_hash: dict[str, list[str]] = defaultdict(list)
    for e in evaluation:
        by_hash[_sha256(e.text)].append(e.name)
    return tuple(Identical(c.name, name, digest) for c in calibration
                 for digest in [_sha256(c.text)] for name in by_hash.get(digest, []))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
