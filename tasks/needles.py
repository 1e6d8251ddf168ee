"""Where a RULER sample's needles sit in the final prompt, in tokens (paper section 3.1).

A sample counts for filled-region retrieval only if every needle lies in the
prefix, before the exact tail: with N prompt tokens and a tail of T, every
token of every needle has a position below N - T. Positions come from the
model's tokenizer over the final prompt string (chat template included when
applied), so the subset depends on the tokenizer, the prompt protocol and T
only, never on the arm or the split.

Needles by task kind (what the answer can only be read from):
- niah: the needle sentences ("One of the special magic ... for KEY is: VALUE.")
  holding the answer values (`queried`), or every needle sentence of the
  prompt (`all`: a multi-key sample's distractor keys too, the paper's
  condition).
- vt: every assignment of the queried chain ("VAR X = ...").
- cwe / fwe: every occurrence of every answer word.
- qa: the documents lm-eval's generator counts as the question's own.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any

from rf_eval.tasks.ruler_data import qa_gold_documents

NEEDLE_START = "One of the special magic "
NEEDLE_SENTENCE = re.compile(r"One of the special magic \w+ for [^\n]*? is: [\w-]+\.")


@dataclass(frozen=True)
class NeedleMark:
    """Token facts of one sample's prompt: length, needle token spans (inclusive), tail."""

    n_tokens: int
    spans: tuple[tuple[int, int], ...]
    tail: int

    @property
    def rows_from_end(self) -> int:
        """Prompt rows after the last needle token (-1 when no needle was found)."""
        if not self.spans:
            return -1
        return self.n_tokens - 1 - max(end for _, end in self.spans)

    @property
    def filled(self) -> bool:
        """Every needle token lies in the prefix rows 0 .. N-T-1."""
        return bool(self.spans) and self.rows_from_end >= self.tail


def _question_line(text: str) -> str:
    return text.rsplit("\n", 1)[-1]


def niah_spans(text: str, values: list[str]) -> list[tuple[int, int]]:
    """Character spans of the needle sentences that hold `values`.

    A value found in several needle sentences (possible in the needle haystack of
    multikey_2/3) keeps those whose key is named in the question line; if that
    leaves none or several, all are kept (a sample then counts as filled only
    if all of them are in the prefix).
    """
    question = _question_line(text)
    spans: list[tuple[int, int]] = []
    for value in values:
        found = []
        for m in re.finditer(re.escape(f" is: {value}."), text):
            start = text.rfind(NEEDLE_START, 0, m.start())
            if start < 0:
                continue
            head = text[start : m.start()]
            key = head.split(" for ", 1)[1] if " for " in head else ""
            found.append((start, m.end(), key))
        if not found:
            continue
        named = [f for f in found if f[2] and f[2] in question]
        keep = named if len(named) == 1 else found
        spans += [(s, e) for s, e, _ in keep]
    return spans


def all_niah_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of every needle sentence in `text` (queried and distractor keys)."""
    return [(m.start(), m.end()) for m in NEEDLE_SENTENCE.finditer(text)]


def vt_spans(text: str, variables: list[str]) -> list[tuple[int, int]]:
    """Character spans of the chain's assignments `VAR X = 12345` / `VAR X = VAR Y`."""
    spans = []
    for var in variables:
        for m in re.finditer(rf"VAR {re.escape(var)} = (?:VAR [A-Z]+|\d+)", text):
            spans.append((m.start(), m.end()))
    return spans


def word_spans(text: str, words: list[str], numbered: bool) -> list[tuple[int, int]]:
    """Every occurrence of each answer word (cwe: items of a numbered list; fwe: whole words)."""
    spans = []
    for word in words:
        if numbered:
            pattern = rf"(?<=\d\. ){re.escape(word)}(?=\s|$)"
        else:
            pattern = rf"(?<![A-Za-z]){re.escape(word)}(?![A-Za-z])"
        spans += [(m.start(), m.end()) for m in re.finditer(pattern, text)]
    return spans


def document_spans(text: str, documents: list[str]) -> list[tuple[int, int]]:
    spans = []
    for doc in documents:
        at = text.find(doc)
        if at >= 0:
            spans.append((at, at + len(doc)))
    return spans


def needle_char_spans(
    kind: str, text: str, doc: dict[str, Any], base_task: str = "", which: str = "queried"
) -> list[tuple[int, int]]:
    """Character spans of a sample's needles in `text` (the final prompt or the doc input);
    `which` (niah): `queried` needles or `all` needle sentences."""
    outputs = [str(v) for v in doc["outputs"]]
    if kind == "niah":
        queried = niah_spans(text, outputs)
        return sorted(set(queried) | set(all_niah_spans(text))) if which == "all" and queried else queried
    if kind == "vt":
        return vt_spans(text, outputs)
    if kind == "cwe":
        return word_spans(text, outputs, numbered=True)
    if kind == "fwe":
        return word_spans(text, outputs, numbered=False)
    if kind == "qa":
        return document_spans(text, qa_gold_documents(base_task, int(doc["index"])))
    raise ValueError(f"unknown needle kind {kind!r}")


def token_spans(tokenizer: Any, text: str, char_spans: list[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
    """Token count of `text` and the inclusive token span covering each character span.

    Special-token strings in `text` (chat templates) tokenize as the model sees
    them; no BOS is added, which does not move positions counted from the end.
    """
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        ends = [b for _, b in offsets]
        starts = [a for a, _ in offsets]
        out = []
        for cs, ce in char_spans:
            first = bisect.bisect_right(ends, cs)  # first token ending after cs
            last = bisect.bisect_left(starts, ce) - 1  # last token starting before ce
            out.append((first, max(first, last)))
        return len(offsets), out
    # slow tokenizers: count the tokens of the text before each span's edges
    count = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    out = []
    for cs, ce in char_spans:
        first = len(tokenizer(text[:cs], add_special_tokens=False)["input_ids"])
        last = len(tokenizer(text[:ce], add_special_tokens=False)["input_ids"]) - 1
        out.append((first, max(first, last)))
    return count, out


def mark(
    tokenizer: Any, kind: str, prompt: str, doc: dict[str, Any], tail: int, base_task: str = "",
    which: str = "queried",
) -> NeedleMark:
    """The needle marks of one sample in its final prompt string (`which`: see needle_char_spans)."""
    chars = needle_char_spans(kind, prompt, doc, base_task, which)
    n, spans = token_spans(tokenizer, prompt, chars)
    return NeedleMark(n_tokens=n, spans=tuple(spans), tail=int(tail))
