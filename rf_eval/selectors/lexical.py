"""Lexical-net rows: sentences that name what the end of the prompt names (paper 2.4, appendix H).

Normalization (appendix H): words are runs of Unicode letters and number
characters (categories L* and N*); punctuation, underscores, combining marks
and everything else separate them. ASCII letters are lower-cased, every other
character is kept. A final `s` is dropped from words of four or more
characters unless the word ends in `ss`. A sentence ends at a line break; at
`.`, `!` or `?` followed by whitespace or the end of the text; at the CJK
full stop, exclamation and question marks; and at special tokens (control,
user-defined, unknown, unused).

Rule (section 2.4): a prefix sentence is kept exact if it shares a run of
`run` (4) or more consecutive words with the last `window` (64) content
tokens of the prompt, and that run holds a word occurring at most
`max_count` (2) times in the whole prefix. At most the first `sentence_rows`
(80) rows of a sentence are kept, and at most `cap` (5%) of the prefix.

Decisions where the paper is silent:
- A run of >= 4 shared words contains a rare word iff one of its 4-word
  sub-runs does, so the rule is checked on 4-word runs.
- Content tokens: special tokens, and a special token's following text up
  to and including the next line break (a chat role header), are not content.
  The window's words are read across the gaps this leaves.
- A row belongs to the sentence holding its first character.
- When the cap binds, sentences whose matching run holds the rarest word go
  first (then the earlier sentence); the last one kept is cut to fit.
"""

from __future__ import annotations

import unicodedata
from collections import Counter

import torch

from rf_eval.engine import Selection
from rf_eval.selectors.base import Request, Selector, as_rows
from rf_eval.selectors.tokens import request_specials, request_texts

SENTENCE_MARKS = ".!?"
CJK_MARKS = "\u3002\uff01\uff1f"  # 。！？
LINE_BREAKS = "\n\r\u2028\u2029\x0b\x0c\x85"


def is_word_char(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "LN"


def normalize_word(word: str) -> str:
    """Lower-case ASCII letters; drop a final s from words of >= 4 characters not ending in ss."""
    w = "".join(c.lower() if "A" <= c <= "Z" else c for c in word)
    if len(w) >= 4 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    return w


def words(text: str) -> list[tuple[int, str]]:
    """(start offset, normalized word) for each word of `text`."""
    out, start = [], None
    for i, ch in enumerate(text + " "):
        if i < len(text) and is_word_char(ch):
            if start is None:
                start = i
        elif start is not None:
            out.append((start, normalize_word(text[start:i])))
            start = None
    return out


def sentence_ends(text: str) -> list[int]:
    """Offsets just after each sentence end in `text` (the text's end included)."""
    ends = []
    for i, ch in enumerate(text):
        nxt = text[i + 1] if i + 1 < len(text) else None
        if ch in LINE_BREAKS or ch in CJK_MARKS or (ch in SENTENCE_MARKS and (nxt is None or nxt.isspace())):
            ends.append(i + 1)
    if not ends or ends[-1] != len(text):
        ends.append(len(text))
    return ends


def content_mask(texts: list[str], specials: list[bool]) -> list[bool]:
    """Rows that are content: not special, not a role header after a special token."""
    out, header = [], False
    for text, sp in zip(texts, specials):
        if sp:
            out.append(False)
            header = True
            continue
        out.append(not header)
        if header and any(c in LINE_BREAKS for c in text):
            header = False
    return out


def sentences(texts: list[str], specials: list[bool]) -> list[list[int]]:
    """Rows grouped by sentence; special-token rows end a sentence and belong to none."""
    groups: list[list[int]] = []

    def flush(rows: list[int]) -> None:
        if not rows:
            return
        ends = sentence_ends("".join(texts[r] for r in rows))
        offset, current, k = 0, [], 0
        for r in rows:
            while k < len(ends) and offset >= ends[k]:
                k += 1
                if current:
                    groups.append(current)
                current = []
            current.append(r)
            offset += len(texts[r])
        if current:
            groups.append(current)

    segment: list[int] = []
    for row, special in enumerate(specials):
        if special:
            flush(segment)
            segment = []
        else:
            segment.append(row)
    flush(segment)
    return groups


def joined_text(texts: list[str], rows: list[int]) -> str:
    """The text of `rows`; a gap between non-adjacent rows reads as a space."""
    parts, prev = [], None
    for r in rows:
        if prev is not None and r != prev + 1:
            parts.append(" ")
        parts.append(texts[r])
        prev = r
    return "".join(parts)


class LexicalNet(Selector):
    """Sentences sharing a rare run of words with the end of the prompt (appendix H rules)."""

    name = "lexical_net"

    def __init__(self, window: int = 64, run: int = 4, max_count: int = 2, sentence_rows: int = 80,
                 cap: float = 0.05):
        self.window, self.run, self.max_count = int(window), int(run), int(max_count)
        self.sentence_rows, self.cap = int(sentence_rows), float(cap)

    def limit(self, req: Request) -> int:
        return int(self.cap * req.prefix_end)

    def select(self, req):
        texts = request_texts(req, self.name)
        specials = request_specials(req, self.name).tolist()
        content = content_mask(texts, specials)
        window_rows = [r for r in range(req.n) if content[r]][-self.window :]
        window_words = [w for _, w in words(joined_text(texts, window_rows))]
        grams = {tuple(window_words[i : i + self.run]) for i in range(len(window_words) - self.run + 1)}
        prefix = req.prefix_end
        groups = sentences(texts[:prefix], specials[:prefix])
        sent_words = [[w for _, w in words(joined_text(texts, rows))] for rows in groups]
        counts = Counter(w for ws in sent_words for w in ws)
        ranked = []
        for rows, ws in zip(groups, sent_words):
            best = None
            for i in range(len(ws) - self.run + 1):
                gram = tuple(ws[i : i + self.run])
                rare = [counts[w] for w in gram if counts[w] <= self.max_count]
                if rare and gram in grams:
                    best = min(rare) if best is None else min(best, min(rare))
            if best is not None:
                ranked.append((best, rows[0], rows))
        ranked.sort(key=lambda item: (item[0], item[1]))
        keep, budget = [], self.limit(req)
        for _, _, rows in ranked:
            free = [r for r in rows[: self.sentence_rows] if not req.exclude[r]]
            take = free[: max(budget - len(keep), 0)]
            keep.extend(take)
            if len(keep) >= budget:
                break
        return Selection(as_rows(torch.tensor(keep, dtype=torch.long)) if keep else torch.zeros(0, dtype=torch.long))
