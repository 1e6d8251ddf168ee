"""Data the tests write themselves: essay haystack, long documents, LongBench v2 items, nltk punkt params."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = (
    "river stone lantern orchard meadow copper window harbor signal garden ledger candle pocket thunder "
    "bridge canvas shadow marble tunnel compass willow engine fabric valley mirror basket anchor summit"
).split()


def sentences(n: int, seed: int) -> list[str]:
    """`n` plain sentences of project-written filler text."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 11))]
        out.append(" ".join(words).capitalize() + rng.choice([".", ".", ".", "!", "?"]))
    return out


def write_essays(folder: Path, n_files: int = 3, n_sentences: int = 400) -> Path:
    """A folder of .txt essays (the local essay haystack)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        paras = [" ".join(sentences(8, seed=100 * i + j)) for j in range(n_sentences // 8)]
        (folder / f"essay_{i:02d}.txt").write_text("\n\n".join(paras) + "\n", encoding="utf-8")
    return folder


def write_punkt(root: Path) -> Path:
    """An empty-parameter punkt_tab model (splits at sentence punctuation): an NLTK_DATA folder."""
    lang = root / "tokenizers" / "punkt_tab" / "english"
    lang.mkdir(parents=True, exist_ok=True)
    for name in ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab"):
        (lang / name).write_text("", encoding="utf-8")
    return root


def long_document(n_chars: int, seed: int, repeat_from: int | None = None) -> str:
    """Filler text of about n_chars; with `repeat_from`, the last quarter repeats text from there."""
    text = " ".join(sentences(n_chars // 40 + 1, seed))[:n_chars]
    if repeat_from is not None:
        quarter = len(text) // 4
        text = text[: len(text) - quarter] + text[repeat_from : repeat_from + quarter]
    return text


def write_documents(folder: Path, sizes: list[int]) -> Path:
    """Long documents as .txt files in two domain subfolders, plus one .jsonl file."""
    for i, size in enumerate(sizes):
        sub = folder / ("prose" if i % 2 == 0 else "code")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc_{i:02d}.txt").write_text(long_document(size, seed=i, repeat_from=40 if i == 0 else None))
    return folder


def longbench_items(n: int, doc_chars: int = 1500) -> list[dict]:
    """Items in the LongBench v2 dataset's schema (project-written content)."""
    domains = ["Single-Document QA", "Multi-Document QA", "Code Repository Understanding"]
    items = []
    for i in range(n):
        items.append({
            "_id": f"item{i:04d}",
            "domain": domains[i % len(domains)],
            "sub_domain": "test",
            "difficulty": "easy" if i % 2 == 0 else "hard",
            "length": ["short", "medium", "long"][i % 3],
            "question": f"Which word appears first in section {i}?",
            "choice_A": "river", "choice_B": "stone", "choice_C": "lantern", "choice_D": "orchard",
            "answer": "ABCD"[i % 4],
            "context": f"BEGIN-{i} " + long_document(doc_chars, seed=50 + i) + f" END-{i}",
        })
    return items


def write_longbench(path: Path, n: int = 3, doc_chars: int = 1500) -> Path:
    path.write_text(json.dumps(longbench_items(n, doc_chars)), encoding="utf-8")
    return path
