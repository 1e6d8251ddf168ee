"""The stock model's computation over one prompt, shared by the arms of one process.

A study's `reference=exact` arms each score every keytoken document with the stock model for
KL(exact || arm) (`token_logprobs`), and the exact arm scores the same documents as its own rows: the same
forward, on the same input, with the same weights, run once per arm. Likewise every arm of split S runs
layers 0..S-1 of the stock model over each whole prompt (`rf_eval.engine.shared_lower`). Arms that run one
after another in one process (`rf_eval.study.launch.InProcessLauncher`, `rf-eval demo`) share both inside
`shared_rows()`: the first arm computes, the others read back (a third of a filled demo arm's time for the
rows, most of what is left of its prefill for the lower layers).

An entry is found only under what fixes every bit of it: the sha256 of all the model's parameter and
buffer bytes (`rf_eval.integrity.weights.weights_sha256`, not the sampled fingerprint: an in-place edit of one
element is another key), the model class, the device,
torch's thread count (reductions, so bits, depend on it), the tokens and what was computed from them.
Outside `shared_rows()` nothing is kept or read. Entries are held on the CPU, up to the store's
`max_bytes` (new entries beyond it are not kept), for as long as the store lives (an `InProcessLauncher`:
one study).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rf_eval.integrity.weights import weights_sha256

#: the bytes one store keeps, at most (the quick demo: 0.6 GB of rows for its 12 documents, 0.4 GB of lower
#: layers for them and its 3 needle prompts, in fp32)
DEFAULT_MAX_BYTES = 2 << 30


class SharedRows:
    """What one set of arms shares (an `InProcessLauncher` keeps one for all its arms): scored rows (`keep`)
    by (model key, tokens, first scored row), and other entries (`hold`) by keys their owners make."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.used = 0
        self.entries: dict[tuple, Any] = {}
        self.hits = 0  # rows read back
        self.passes = 0  # other entries read back
        self.digests: dict[int, tuple[weakref.ref, str | None]] = {}  # by model object: its weights' sha256


_ACTIVE: list[SharedRows] = []


@contextmanager
def shared_rows(store: SharedRows | None = None) -> Iterator[SharedRows]:
    """Within the block, `lookup`/`keep` share the stock model's rows between scorers through `store` (a new
    one by default; see the module)."""
    store = SharedRows() if store is None else store
    _ACTIVE.append(store)
    try:
        yield store
    finally:
        _ACTIVE.pop()


def active() -> bool:
    return bool(_ACTIVE)


@contextmanager
def unshared() -> Iterator[None]:
    """Inside, the current block keeps and reads back nothing: a forward that is not the stock model's runs (a
    sparse attention pattern, `rf_eval.sparse.attention`), whose rows and passes no stock arm may read."""
    saved = _ACTIVE[:]
    _ACTIVE.clear()
    try:
        yield
    finally:
        _ACTIVE[:] = saved


def model_key(model: nn.Module, device: Any) -> tuple | None:
    """What, beside the tokens, fixes an entry's bits, in the current block: the weights' sha256 (taken once per
    model object in the block, for it reads every byte: the arms of a block load their models and leave the
    weights as loaded), the device and torch's thread count. None outside a block, and where the weights
    cannot all be read (`meta`): such a model shares nothing."""
    if not _ACTIVE:
        return None
    digests = _ACTIVE[-1].digests
    known = digests.get(id(model))
    if known is None or known[0]() is not model:
        known = digests[id(model)] = (weakref.ref(model), weights_sha256(model))
    return None if known[1] is None else (known[1], str(device), torch.get_num_threads())


def lookup(key: tuple, tokens: Sequence[int], first: int, device: Any) -> torch.Tensor | None:
    """The rows kept for (key, tokens, first scored row) in the current block, on `device`; None if none."""
    found = _kept((key, tuple(tokens), first))
    if found is None:
        return None
    _ACTIVE[-1].hits += 1
    return found.to(device)


def keep(key: tuple, tokens: Sequence[int], first: int, rows: torch.Tensor) -> None:
    """Keep `rows` for (key, tokens, first scored row) in the current block, if it has room."""
    if _ACTIVE:
        hold((key, tuple(tokens), first), rows.detach().to("cpu", copy=True), rows.numel() * rows.element_size())


def find(key: tuple) -> Any | None:
    """The entry kept under `key` in the current block (`hold`); None outside a block or if none."""
    found = _kept(key)
    if found is not None:
        _ACTIVE[-1].passes += 1
    return found


def holds(key: tuple) -> bool:
    """Whether the current block keeps an entry under `key` (nothing read back, nothing counted)."""
    return _kept(key) is not None


def _kept(key: tuple) -> Any | None:
    return _ACTIVE[-1].entries.get(key) if _ACTIVE else None


def hold(key: tuple, entry: Any, size: int) -> None:
    """Keep `entry` (`size` bytes, its tensors on the CPU: the caller copies them) under `key` in the current
    block, if it has room."""
    if not _ACTIVE:
        return
    block = _ACTIVE[-1]
    if key not in block.entries and block.used + size <= block.max_bytes:
        block.entries[key] = entry
        block.used += size


