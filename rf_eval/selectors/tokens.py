"""Token texts and classes; the special-token and protected-token selectors (paper 2.4, I.3).

Token classes (section 2.4, appendix I.3), decided on a token's decoded text
t, with s = t stripped of whitespace:
- `special`: control, unknown and user-defined (added) tokens;
- `space`: s empty; `number`: s all digits; `punctuation`: s all punctuation
  or symbols; `digits_punct`: digits and punctuation only (e.g. "3.14");
- all letters: a *word start* if t begins with whitespace or the previous
  token does not end in a letter or digit (or there is none), else a *word
  piece*; *capitalized* if s[0] is upper- or title-case, else *lower-case*
  (uncased scripts count as lower-case);
- `mixed`: anything else (a letter with digits or punctuation, e.g. "x2", "_id").
Letters are Unicode categories L* and M*, digits N*, punctuation P* and S*.
Eligible for protection: cap_word_start, cap_word_piece, lower_word_piece, mixed.

`protected`: of the eligible prefix rows, the rarest `rarest` (25%) by
add-one unigram frequency (count + 1) over the calibration documents, from
the table `rf-eval fit` saves beside the maps (`unigram.safetensors`). The
count is round(rarest * eligible rows); ties go to the earlier row. The
question is not read.

`special`: every prefix row holding a special token, on top of any other
selector's count (no cap).
"""

from __future__ import annotations

import unicodedata

import torch

from rf_eval.engine import Selection
from rf_eval.ridge.unigram import load_unigram
from rf_eval.selectors.base import Request, Selector, as_rows, top_rows

ELIGIBLE = ("cap_word_start", "cap_word_piece", "lower_word_piece", "mixed")
CLASSES = ("special", "space", "number", "punctuation", "digits_punct", "cap_word_start", "cap_word_piece",
           "lower_word_start", "lower_word_piece", "mixed")


def _kind(ch: str) -> str:
    cat = unicodedata.category(ch)
    if cat[0] in "LM":
        return "letter"
    if cat[0] == "N":
        return "digit"
    if cat[0] in "PS":
        return "punct"
    return "space" if ch.isspace() else "other"


def token_class(text: str, prev: str | None = None, special: bool = False) -> str:
    """The class of a token with decoded `text`, after a token with text `prev` (None: first)."""
    if special:
        return "special"
    s = text.strip()
    if not s:
        return "space"
    kinds = {_kind(c) for c in s}
    if kinds == {"digit"}:
        return "number"
    if kinds == {"punct"}:
        return "punctuation"
    if kinds == {"digit", "punct"}:
        return "digits_punct"
    if kinds == {"letter"}:
        starts = text[0].isspace() or not prev or _kind(prev[-1]) not in ("letter", "digit")
        cap = s[0].isupper() or s[0].istitle()
        return f"{'cap' if cap else 'lower'}_word_{'start' if starts else 'piece'}"
    return "mixed"


def is_digit_token(text: str) -> bool:
    """A digit token (the probe's base rule): its text, whitespace stripped, is all digits."""
    s = text.strip()
    return bool(s) and all(_kind(c) == "digit" for c in s)


def special_ids(tokenizer) -> set[int]:
    """Control, unknown and user-defined tokens: all special ids, the unknown id and every added token."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None:
        ids.add(unk)
    ids.update(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", {}) or {}))
    return ids


def _single_texts(tokenizer, ids: list[int]) -> dict[int, str]:
    out = {}
    for i in set(ids):
        text = tokenizer.decode([i])
        piece = tokenizer.convert_ids_to_tokens(i)
        if isinstance(piece, str) and piece.startswith("\u2581") and not text.startswith(" "):
            text = " " + text  # SentencePiece drops the word-boundary space when decoding one piece
        out[i] = text
    return out


def row_texts(tokenizer, ids: list[int]) -> list[str]:
    """Each row's text. A character split over several byte tokens goes to its first row (others '')."""
    single = _single_texts(tokenizer, ids)
    texts, i, n = [], 0, len(ids)
    while i < n:
        text, j = single[ids[i]], i + 1
        if "\ufffd" in text:
            for stop in range(i + 2, min(i + 4, n) + 1):
                joined = tokenizer.decode(ids[i:stop])
                if "\ufffd" not in joined:
                    text, j = joined, stop
                    break
        texts.append(text)
        texts.extend([""] * (j - i - 1))
        i = j
    return texts


def request_texts(req: Request, who: str) -> list[str]:
    if "texts" not in req.memo:
        req.memo["texts"] = row_texts(req.need_tokenizer(who), req.ids)
    return req.memo["texts"]


def request_specials(req: Request, who: str) -> torch.Tensor:
    """Bool mask over prompt rows: special tokens."""
    if "specials" not in req.memo:
        sids = special_ids(req.need_tokenizer(who))
        req.memo["specials"] = torch.tensor([i in sids for i in req.ids], dtype=torch.bool)
    return req.memo["specials"]


def request_classes(req: Request, who: str) -> list[str]:
    if "classes" not in req.memo:
        texts, specials = request_texts(req, who), request_specials(req, who).tolist()
        prev, out = None, []
        for text, sp in zip(texts, specials):
            out.append(token_class(text, prev, sp))
            if text:
                prev = text
        req.memo["classes"] = out
    return req.memo["classes"]


class SpecialTokens(Selector):
    """Special-token rows, always on top of the other selectors' counts."""

    name = "special"
    on_top = True

    def select(self, req):
        mask = request_specials(req, self.name)[: req.prefix_end]
        rows = mask.nonzero().flatten()
        return Selection(rows[~req.exclude[rows]] if rows.numel() else rows)


class ProtectedTokens(Selector):
    """The rarest share of eligible-class prefix rows by add-one unigram frequency."""

    name = "protected"

    def __init__(self, rarest: float = 0.25, unigram: str | None = None):
        if not 0 <= rarest <= 1:
            raise ValueError(f"rarest must lie in [0, 1], got {rarest}")
        self.rarest, self.unigram = float(rarest), str(unigram) if unigram else None
        self._counts: torch.Tensor | None = None

    def counts(self, req: Request) -> torch.Tensor:
        if self._counts is None:
            source = self.unigram or req.resources.get("unigram")
            if source is None:
                raise ValueError(
                    f"selector {self.name!r} needs a unigram table: pass unigram=PATH, or maps= from a folder "
                    "that `rf-eval fit` wrote (it saves unigram.safetensors beside the maps)"
                )
            self._counts = source if isinstance(source, torch.Tensor) else load_unigram(source)
        return self._counts

    def eligible(self, req: Request) -> torch.Tensor:
        classes = request_classes(req, self.name)
        cand = req.candidates()
        keep = [r for r in cand.tolist() if classes[r] in ELIGIBLE]
        return torch.tensor(keep, dtype=torch.long)

    def rarest_rows(self, req: Request, share: float) -> torch.Tensor:
        rows = self.eligible(req)
        counts = self.counts(req)
        ids = torch.tensor(req.ids, dtype=torch.long)
        freq = torch.ones(req.n, dtype=torch.float64)
        inside = ids < counts.numel()
        freq[inside] += counts[ids[inside]].double()
        return as_rows(top_rows(-freq, rows, round(share * rows.numel())))

    def select(self, req):
        return Selection(self.rarest_rows(req, self.rarest))
