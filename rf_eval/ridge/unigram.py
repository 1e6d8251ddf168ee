"""Unigram token counts over the calibration documents (paper section 2.4, protected tokens).

The capture pass counts every token id of the calibration documents it
reads; `rf-eval fit` saves the table beside the maps as `unigram.safetensors`
(tensor `counts`, int64, one entry per token id; metadata: documents, tokens,
config hash, calibration sha256). Selectors read add-one frequencies,
count + 1. Under torch.distributed the counts are all-reduced.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from rf_eval.devices import all_reduce
from rf_eval.files.tensor_files import read_tensors, save_tensors

FILENAME = "unigram.safetensors"


class UnigramCounter:
    """Running token counts; `wrap` counts documents as they stream to the capture pass."""

    def __init__(self, vocab_size: int):
        self.counts = torch.zeros(vocab_size, dtype=torch.int64)
        self.documents = 0

    def add(self, input_ids: torch.Tensor) -> None:
        ids = input_ids.flatten().to("cpu", torch.int64)
        if ids.numel() and int(ids.max()) >= self.counts.numel():
            grown = torch.zeros(int(ids.max()) + 1, dtype=torch.int64)
            grown[: self.counts.numel()] = self.counts
            self.counts = grown
        self.counts += torch.bincount(ids, minlength=self.counts.numel())
        self.documents += 1

    def wrap(self, documents: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
        for doc in documents:
            self.add(doc)
            yield doc

    def all_reduce(self) -> None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            size = torch.tensor([self.counts.numel()], dtype=torch.int64)
            all_reduce(size, op=dist.ReduceOp.MAX)
            padded = torch.zeros(int(size), dtype=torch.int64)
            padded[: self.counts.numel()] = self.counts
            docs = torch.tensor([self.documents], dtype=torch.int64)
            all_reduce(padded)
            all_reduce(docs)
            self.counts, self.documents = padded, int(docs)

    def save(self, out_dir: str | Path, metadata: dict[str, str] | None = None) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        meta = {k: str(v) for k, v in (metadata or {}).items()}
        meta.update(documents=str(self.documents), tokens=str(int(self.counts.sum())), kind="unigram")
        return save_tensors({"counts": self.counts}, out / FILENAME, meta)


def unigram_path(path: str | Path) -> Path:
    """The table file from a file path, a maps folder, or a map file's folder."""
    p = Path(path)
    if p.is_dir():
        p = p / FILENAME
    elif p.is_file() and p.name.startswith("ridgefill_split"):  # a map file: the table beside it
        p = p.parent / FILENAME
    if not p.is_file():
        raise FileNotFoundError(f"no unigram table at {p} (`rf-eval fit` writes {FILENAME} beside the maps)")
    return p


def load_unigram(path: str | Path) -> torch.Tensor:
    """Token counts (int64, one per id) from a table file or the folder holding it."""
    file = unigram_path(path)
    tensors, _ = read_tensors(file, ValueError, "unigram table")
    if "counts" not in tensors:
        raise ValueError(f"{file} holds no 'counts' tensor: not an rf-eval unigram table")
    return tensors["counts"]
