"""What a prefill is asked to do (`Plan`) and what it gives back (`PrefillResult`); plain data only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

#: Whether layer S's filled rows read the fill's own map at S (x̂_S = A_S x_S + b_S) when an arm does not
#: say. False: layer S reads x_S, which the lower layers computed exactly, so any map there can only add
#: error (a ridge map of x_S on itself is a shrunk identity). The paper's released files carry a map for
#: layer S and its MAC counts charge it (section 2.2 "Size and cost", section 2.5); `map_split=True`
#: reproduces that accounting. The one place this default is stated: arms, fits and the cost model read it.
DEFAULT_MAP_SPLIT = False
#: The paper's tail T (its sections 2.6 and 9): the last prompt rows every layer computes exactly, when an arm
#: does not say. The rf-eval tasks size their filled prompts by it too, so it sits here, below them and arms.
DEFAULT_TAIL = 4096
#: The fill switched off: every prompt runs the plain model (not a fill: `rf_eval.fills` holds those).
FILL_OFF = "exact"
#: The fill of a RaReCache plan: keys and values mapped from another model's cache (given as a `MappedKV`).
MAPPED = "mapped"
#: the label of the engine floor's plans (`floor`): the partial path with every prefix row selected exact
EVERY_ROW_EXACT = "every-row-exact"

# A fill function maps (late layer index, split states of the filled rows) to that layer's predicted input.
FillFn = Callable[[int, torch.Tensor], torch.Tensor]
# A cache-to-cache fill: (layer index, filled rows) -> that layer's keys (rotated) and values for those rows.
KVFillFn = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Plan:
    """How to prefill one prompt.

    split: first late layer S (1..L-1; 0 for a mapped-K/V fill). tail: count of
    last prompt rows kept exact in every layer (0 only for a prompt whose last
    token is held back and runs afterwards: it is then the tail's one row). fill: `exact` (the fill off), a
    registered fill (`rf_eval.fills`) or `mapped` (RaReCache).
    chunk_size: run the lower layers in chunks of this many rows (None: one
    pass; bitwise equal to the plain model). query_chunk: exact-row queries per
    attention call in the late layers (bounds the mask's memory). map_split
    (default `DEFAULT_MAP_SPLIT`, False): filled rows of layer S itself read the
    fill's prediction x̂_S = fill(S, x_S) (A_S x_S + b_S for ridge maps, which
    cover layers S..L-1 as the paper's released maps do); False: layer S reads x_S.
    """

    split: int
    tail: int
    fill: str = FILL_OFF
    chunk_size: int | None = None
    query_chunk: int = 4096
    map_split: bool = DEFAULT_MAP_SPLIT

    def __post_init__(self):
        if not isinstance(self.fill, str) or not self.fill:
            raise ValueError(f"fill must be a fill's name, got {self.fill!r}")
        check_rows(self.tail, self.chunk_size, lowest_tail=0)

    def fills_no_row(self, n: int) -> bool:
        """True when no row of an n-row prompt is filled: the fill is off, or the tail covers the prompt."""
        return self.fill == FILL_OFF or self.tail >= n


def check_rows(tail: int, chunk_size: int | None = None, lowest_tail: int = 1) -> None:
    """The tail and chunk rules (an arm's: `lowest_tail` 1, the last prompt row is always exact; a plan's: 0,
    a generation prefill whose held-back last token is the tail): ValueError naming the bad value."""
    if tail < lowest_tail:
        why = "the last prompt row is always exact" if lowest_tail == 1 else "a count of rows"
        raise ValueError(f"tail must be >= {lowest_tail} ({why}), got {tail}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")


def check_split(split: int, n_layers: int | None, lowest: int = 1) -> None:
    """The split rule, for the engine, arms, fits and costs: `lowest` <= split <= n_layers - 1 (layer S runs
    filled rows, so at least one layer lies at or above it; `lowest` is 0 for fills that map every layer).
    Without `n_layers` (no model yet) only the lower bound is checked."""
    if n_layers is None:
        if split < lowest:
            raise ValueError(f"split {split} is below {lowest}")
    elif not lowest <= split <= n_layers - 1:
        raise ValueError(f"split {split} is outside {lowest}..{n_layers - 1} for this {n_layers}-layer model")


@dataclass
class LayerInputs:
    """What the engine knows after the lower layers: split states and RoPE tables.

    `cos`/`sin` are the tables the split layer reads; `tables` holds one pair
    per RoPE kind for a family whose layers rotate differently
    (`Family.rope_kind`: Gemma 3's local and global layers), else None.
    """

    x_split: torch.Tensor  # (1, N, d): hidden state entering layer S, every row
    cos: torch.Tensor  # (1, N, rope_dim)
    sin: torch.Tensor
    tables: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None

    def rope(self, kind: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The (cos, sin) tables of a RoPE kind (None: the split layer's)."""
        return (self.cos, self.sin) if kind is None or self.tables is None else self.tables[kind]

    def to(self, device: torch.device) -> LayerInputs:
        tables = None if self.tables is None else {
            kind: (c.to(device), s.to(device)) for kind, (c, s) in self.tables.items()
        }
        return LayerInputs(self.x_split.to(device), self.cos.to(device), self.sin.to(device), tables)


@dataclass
class PrefillResult:
    """The prompt's cache (the model's own type) and its last row's logits (1, vocab); (1, 0) when no
    late-layer row is exact (a plan of tail 0: the prompt's last token is held back and runs afterwards)."""

    cache: DynamicCache
    logits: torch.Tensor
    exact_rows: torch.Tensor  # late-layer exact rows (selected prefix rows + tail), sorted
    timings: dict[str, float] = field(default_factory=dict)
    prompt_length: int = 0
    #: True when late layers hold fewer rows than the prompt (nofill): see `extend`
    ragged: bool = False
    #: the plan that ran (a selector may lengthen the tail: the longer-tail control)
    plan: Plan | None = None
    #: a sparse-attention prefill's record (`rf_eval.sparse.method.Record`: the causal pairs computed per layer it
    #: made sparse, the estimation pass's MACs), set after the prefill; None for every other prefill
    attention: Any = field(default=None, init=False)
