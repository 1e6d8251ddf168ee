"""Shared runs of words between texts, found fast: the run search of `rf_eval.study.overlap` (RidgeFill
Appendix G, the 50-word rule of section 6.7), and the words it counts.

Words, as the rule counts them here (the paper does not define its word tokenisation; this is ours): the text
is normalised to Unicode NFKC, split at runs of Unicode whitespace (Python's `str.split()`), and each
whitespace-separated token is one word, punctuation attached ("end." is one word). Words are compared
case-folded (`str.casefold`), so a run differing only in capitals still counts; the excerpt shows the
calibration text's words as written (after NFKC).

How (fast for hundreds of texts of tens of thousands of words): each word gets an integer id and a random
64-bit value; every N-word window ("shingle") of an evaluation text is hashed (polynomial hash mod 2^64), and
all windows are sorted once; each calibration text's windows are looked up by binary search. A hit only
proposes an alignment: the words themselves are compared, so a hash collision can never report a run, and each
proposed run is extended word by word to its maximal length. A window that occurs more than `MAX_OCCURRENCES`
times within one text is looked up at its first `MAX_OCCURRENCES` occurrences only (bounding the work on
degenerate repetitive text); such a pair is still reported, but its longest run could then be
underestimated. A text shorter than N words can share no run; only its hash is compared.
"""

from __future__ import annotations

import unicodedata
from collections import defaultdict
from collections.abc import Iterator, Sequence

import numpy as np

MAX_OCCURRENCES = 64  # a window's occurrences looked up per text (see the module docstring)
TOKENISATION = ("Unicode NFKC, split at runs of whitespace (str.split), words compared case-folded; "
                "punctuation stays part of its word")
_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: the polynomial hash's base


def words_of(text: str) -> list[str]:
    """The text's words as the rule counts them (module docstring), as written after NFKC."""
    return unicodedata.normalize("NFKC", text).split()


def shared_runs(calibration: Sequence[str], evaluation: Sequence[str], n: int
                ) -> Iterator[dict[int, list[tuple[int, int, int]]]]:
    """For each calibration text in turn, {evaluation text: [(start in it, start in the evaluation text,
    length)]}: the maximal runs of `n` or more words the two share (the module docstring)."""
    vocab: dict[str, int] = defaultdict(lambda: len(vocab))
    cal_ids = [_ids(text, vocab) for text in calibration]
    eval_ids = [_ids(text, vocab) for text in evaluation]
    return shared_id_runs(cal_ids, eval_ids, n)


def shared_id_runs(calibration: Sequence[Sequence[int]], evaluation: Sequence[Sequence[int]], n: int
                   ) -> Iterator[dict[int, list[tuple[int, int, int]]]]:
    """`shared_runs` over texts already cut into units with integer ids (word ids, or a tokenizer's token ids:
    Appendix G's runs of 50 tokens)."""
    cal_ids = [np.asarray(ids, dtype=np.int64) for ids in calibration]
    eval_ids = [np.asarray(ids, dtype=np.int64) for ids in evaluation]
    size = 1 + max((int(ids.max()) for ids in (*cal_ids, *eval_ids) if len(ids)), default=0)
    values = np.random.default_rng(0).integers(0, 2**63, size=size, dtype=np.uint64) * 2 + 1
    index = _Index(eval_ids, values, n)
    for ids in cal_ids:
        yield index.runs(ids, values)


def _ids(text: str, vocab: dict[str, int]) -> np.ndarray:
    """The text's words (`words_of`, case-folded) as integer ids, each new word getting the next id. Folding
    the whole text keeps its words where they were: no character's NFKC form or case fold adds or removes
    whitespace (checked over all of Unicode in tests/test_overlap.py)."""
    words = unicodedata.normalize("NFKC", text).casefold().split()
    return np.fromiter(map(vocab.__getitem__, words), dtype=np.int64, count=len(words))


def _windows(ids: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """The hash of every n-word window of `ids` (position i: words i .. i+n-1), mod 2^64."""
    m = len(ids) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    mixed = values[ids]
    h = np.zeros(m, dtype=np.uint64)
    for j in range(n):
        h *= _BASE
        h += mixed[j:j + m]
    return h


def _first_occurrences(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, positions) of `h`'s windows, sorted by hash, each hash at its first `MAX_OCCURRENCES` positions."""
    if not len(h):
        return h, np.zeros(0, dtype=np.int64)
    order = np.argsort(h, kind="stable")
    sorted_h = h[order]
    at = np.arange(len(h))
    group = np.maximum.accumulate(np.where(np.r_[True, sorted_h[1:] != sorted_h[:-1]], at, 0))
    keep = at - group < MAX_OCCURRENCES
    return sorted_h[keep], order[keep]


def _matched(a: np.ndarray, i: int, b: np.ndarray, j: int) -> int:
    """How many words match from a[i], b[j] onward (0 when either index is past its end)."""
    k, chunk = 0, 64
    while True:
        x, y = a[i + k:i + k + chunk], b[j + k:j + k + chunk]
        m = min(len(x), len(y))
        if m == 0:
            return k
        differ = np.flatnonzero(x[:m] != y[:m])
        if len(differ):
            return k + int(differ[0])
        k, chunk = k + m, chunk * 2


class _Index:
    """The evaluation texts' n-word windows, sorted by hash, for lookups by calibration texts."""

    def __init__(self, texts: Sequence[np.ndarray], values: np.ndarray, n: int) -> None:
        self.texts, self.n = list(texts), n
        hashes, docs, positions = [], [], []
        for d, ids in enumerate(self.texts):
            h, p = _first_occurrences(_windows(ids, values, n))
            hashes.append(h)
            positions.append(p)
            docs.append(np.full(len(h), d, dtype=np.int64))
        h = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
        order = np.argsort(h, kind="stable")
        self.hashes = h[order]
        self.docs = np.concatenate(docs)[order] if docs else np.zeros(0, dtype=np.int64)
        self.positions = np.concatenate(positions)[order] if positions else np.zeros(0, dtype=np.int64)

    def runs(self, ids: np.ndarray, values: np.ndarray) -> dict[int, list[tuple[int, int, int]]]:
        """{evaluation text: [(start in `ids`, start in it, length)]}: the maximal runs of n or more words
        the calibration text `ids` shares with each evaluation text."""
        h, cal_pos = _first_occurrences(_windows(ids, values, self.n))
        if not len(h) or not len(self.hashes):
            return {}
        lo = np.searchsorted(self.hashes, h, "left")  # `h` is sorted: numpy's search walks on from the last key
        hit = self.hashes[np.minimum(lo, len(self.hashes) - 1)] == h
        if not hit.any():
            return {}
        h, lo, cal_pos = h[hit], lo[hit], cal_pos[hit]
        count = np.searchsorted(self.hashes, h, "right") - lo
        first = np.repeat(np.cumsum(count) - count, count)
        at = np.repeat(lo, count) + np.arange(int(count.sum())) - first
        p = np.repeat(cal_pos, count)
        d, q = self.docs[at], self.positions[at]
        diagonal = q - p
        order = np.lexsort((p, diagonal, d))
        p, d, diagonal = p[order], d[order], diagonal[order]
        new_chain = np.r_[True, (d[1:] != d[:-1]) | (diagonal[1:] != diagonal[:-1]) | (p[1:] != p[:-1] + 1)]
        starts = np.flatnonzero(new_chain)
        ends = np.r_[starts[1:], len(p)] - 1
        found: dict[int, dict[tuple[int, int], int]] = defaultdict(dict)
        for s, e in zip(starts.tolist(), ends.tolist()):
            doc, diag = int(d[s]), int(diagonal[s])
            for start, length in self._chain_runs(ids, self.texts[doc], int(p[s]), int(p[e]), diag):
                found[doc][(diag, start)] = length
        return {doc: [(start, start + diag, length) for (diag, start), length in sorted(runs.items())]
                for doc, runs in found.items() if runs}

    def _chain_runs(self, a: np.ndarray, b: np.ndarray, first: int, last: int, diag: int) -> list[tuple[int, int]]:
        """The maximal runs of n or more equal words (start in `a`, length) through the windows first..last of
        `a` aligned with b at offset `diag`: the words compared (a hash collision proposes nothing), and a run
        extended past the chain's ends word by word."""
        n = self.n
        equal = a[first:last + n] == b[first + diag:last + n + diag]
        edges = np.flatnonzero(np.diff(np.r_[0, equal.astype(np.int8), 0]))
        out = []
        for s, e in zip(edges[0::2].tolist(), edges[1::2].tolist()):
            start, end = first + s, first + e  # a[start:end] equals b[start+diag:end+diag]
            back = _matched(a[:start][::-1], 0, b[:start + diag][::-1], 0)
            start, end = start - back, end + _matched(a, end, b, end + diag)
            if end - start >= n:
                out.append((start, end - start))
        return out
