"""Safetensors files, written and read in one place.

Every file rf-eval writes (maps, sums, unigram tables, state corrections, transfer maps) is written
atomically: to `NAME.tmp` beside it, then renamed over it, so a crash never leaves a half-written file that a
rerun would read. Reading returns every tensor and the metadata, with a damaged file reported in the
caller's error type naming the file (safetensors raises several types of its own)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str]) -> Path:
    """Write `tensors` (made contiguous) with string `metadata` to `path`, atomically; the path."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
              metadata={k: str(v) for k, v in metadata.items()})
    tmp.replace(path)
    return path


def read_tensors(path: str | Path, error: type[Exception] = ValueError,
                 what: str = "tensor file") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of a safetensors file and its metadata; `error("cannot read WHAT PATH: why")` for a
    file safetensors cannot read."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})
    except Exception as err:  # safetensors raises several types for corrupt files
        raise error(f"cannot read {what} {path}: {err}") from err


def read_metadata(path: str | Path, error: type[Exception] = ValueError, what: str = "tensor file") -> dict[str, str]:
    """A safetensors file's metadata alone (its header; no tensor read)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as err:
        raise error(f"cannot read {what} {path}: {err}") from err
