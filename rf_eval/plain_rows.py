"""The stock model's scored rows of one prompt, shared by the arms of one process.

A study's `reference=exact` arms each score every keytoken document with the stock model for
KL(exact || arm) (`token_logprobs`), and the exact arm scores the same documents as its own rows: the same
forward, on the same input, with the same weights, run once per arm. Arms that run one after another in
one process (`rf_eval.study.launch.InProcessLauncher`, `rf-eval demo`) share those rows inside
`shared_rows()`: the first arm computes them, the others read them (a third of a filled demo arm's time).

A row set is found only under what fixes every bit of it: the sha256 of all the model's parameter and
buffer bytes (`rf_eval.weights.weights_sha256`, not the sampled fingerprint: an in-place edit of one
element is another key), the model class, the device,
torch's thread count (reductions, so bits, depend on it), the tokens and the first scored row. Outside
`shared_rows()` nothing is kept or read. The rows are held on the CPU, up to the store's `max_bytes` (new
rows beyond it are not kept), for as long as the store lives (an `InProcessLauncher`: one study).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rf_eval.weights import weights_sha256

#: the bytes of rows one store keeps, at most (the quick demo's 12 documents: 0.6 GB in fp32)
DEFAULT_MAX_BYTES = 2 << 30


class SharedRows:
    """The rows one set of arms shares (an `InProcessLauncher` keeps one for all its arms)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.used = 0
        self.rows: dict[tuple, torch.Tensor] = {}
        self.hits = 0


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


def model_key(model: nn.Module, device: Any) -> tuple | None:
    """What, beside the tokens, fixes a row set's bits (a scorer computes it once, at its first lookup); None
    where the weights cannot all be read (`meta`): such a model shares nothing."""
    digest = weights_sha256(model)
    return None if digest is None else (digest, str(device), torch.get_num_threads())


def lookup(key: tuple, tokens: Sequence[int], first: int, device: Any) -> torch.Tensor | None:
    """The rows kept for (key, tokens, first scored row) in the current block, on `device`; None if none."""
    if not _ACTIVE:
        return None
    found = _ACTIVE[-1].rows.get((key, tuple(tokens), first))
    if found is None:
        return None
    _ACTIVE[-1].hits += 1
    return found.to(device)


def keep(key: tuple, tokens: Sequence[int], first: int, rows: torch.Tensor) -> None:
    """Keep `rows` for (key, tokens, first scored row) in the current block, if it has room."""
    if not _ACTIVE:
        return
    block = _ACTIVE[-1]
    size = rows.numel() * rows.element_size()
    if block.used + size <= block.max_bytes:
        block.rows[(key, tuple(tokens), first)] = rows.detach().to("cpu", copy=True)
        block.used += size


