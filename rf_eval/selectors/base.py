"""Row selectors: the common interface, the per-prompt request they read, and the union.

Paper section 2.4. A selector returns prefix rows (never tail rows) that run
every late layer exactly. It is created once with its parameters, and for
each prompt it (1) names the lower-layer inputs it needs kept (`captures`,
before the engine runs) and (2) chooses rows from a `Request`, which holds the
prompt, the plan, the tokenizer and, once the lower layers have run, the
engine's `PrefillContext`.

Selectors marked `on_top` (special tokens) are added on top of the others:
a union evaluates them first and hides their rows from the rest, so they
never use up another selector's count.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from rf_eval.engine import FillFn, Plan, PrefillContext, RowFill, Selection, decoder_layers
from rf_eval.plugins import param_values


class Request:
    """One prompt as selectors see it. `ctx` is set once the lower layers ran."""

    def __init__(
        self,
        model,
        tokenizer,
        input_ids: torch.Tensor,
        plan: Plan,
        fill: FillFn | None = None,
        resources: dict[str, Any] | None = None,
        *,
        strategy: RowFill | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.input_ids = input_ids
        self.plan = plan
        self.fill = fill
        #: the arm's row-fill strategy, bound once (the engine runs it); None: `fill` from predicted inputs
        self.strategy = strategy
        self.resources = resources or {}
        self.ctx: PrefillContext | None = None
        self.capture_start: dict[int, int] = {}
        self.exclude = torch.zeros(self.n, dtype=torch.bool)
        self.memo: dict[Any, Any] = {}
        #: rows an arm's budget grants this prompt (`rf_eval.cost.budget`); a selector that `counts_rows` then picks
        #: this many instead of its own count
        self.row_budget: int | None = None

    @property
    def n(self) -> int:
        return self.input_ids.shape[1]

    @property
    def prefix_end(self) -> int:
        """N - tail: rows 0..prefix_end-1 are the prefix."""
        return max(self.n - self.plan.tail, 0)

    @property
    def ids(self) -> list[int]:
        if "ids" not in self.memo:
            self.memo["ids"] = self.input_ids[0].tolist()
        return self.memo["ids"]

    def need_tokenizer(self, who: str):
        if self.tokenizer is None:
            raise ValueError(f"selector {who!r} reads token texts: give RidgeFill a tokenizer")
        return self.tokenizer

    def attach(self, ctx: PrefillContext) -> Request:
        self.ctx = ctx
        return self

    def candidates(self) -> torch.Tensor:
        """Prefix rows a selector may choose: every prefix row not hidden by an on-top selector."""
        rows = torch.arange(self.prefix_end)
        return rows[~self.exclude[: self.prefix_end]]

    def lower_input(self, layer: int, start: int, stop: int) -> torch.Tensor:
        """The captured input to lower layer `layer` for rows start..stop-1 (1, stop-start, d)."""
        if self.ctx is None or layer not in self.ctx.lower_inputs:
            raise RuntimeError(f"layer {layer}'s input was not captured (a selector's captures() is missing it)")
        offset = self.capture_start[layer]
        return self.ctx.lower_inputs[layer][:, start - offset : stop - offset]

    def layers(self):
        return decoder_layers(self.model)


def top_rows(scores: torch.Tensor, rows: torch.Tensor, k: int) -> torch.Tensor:
    """The k rows of `rows` with the highest scores (ties: the earlier row), sorted by position."""
    k = max(0, min(int(k), rows.numel()))
    if k == 0:
        return rows[:0]
    order = torch.sort(-scores[rows].double(), stable=True).indices[:k]
    return torch.sort(rows[order]).values


def as_rows(rows: torch.Tensor | list[int]) -> torch.Tensor:
    """Sorted unique LongTensor of rows."""
    t = torch.as_tensor(rows, dtype=torch.long).flatten()
    return torch.unique(t)


class Selector:
    """Base class: subclasses set `name` and implement `select`; their constructor's parameters are those of
    its arm string (`make_selector`), each kept as an attribute of its name (`name_` where a method has it: `params`)."""

    name: ClassVar[str] = ""
    on_top: ClassVar[bool] = False
    # the inputs it reads: RidgeFill's split-layer state through a `Request` ("split_state"), or RaReCache's
    # mapped cache through a `rf_eval.selectors.mapped_cache.CachePrompt` ("mapped_cache")
    reads: ClassVar[str] = "split_state"
    #: True: it picks a count of rows (a share of the prompt), which an arm's budget may set (`Request.row_budget`)
    counts_rows: ClassVar[bool] = False

    def probe_rows(self) -> int:
        """Rows it runs through the late layers beyond the prompt's own (the probe's sweep; the cost model)."""
        return 0

    def params(self) -> dict[str, Any]:
        """The parameters it was built with, read back from its constructor's signature (`rf_eval.plugins`)."""
        return param_values(self)

    def captures(self, req: Request) -> dict[int, tuple[int, int]]:
        """Lower layers whose inputs this selector reads: layer -> (start row, stop row)."""
        return {}

    def planned_rows(self, n: int, prefix: int) -> int | None:
        """The rows it picks on an n-token prompt of `prefix` prefix rows where the length alone decides that
        (a share or count of the prompt), else None (the rows depend on the text): what a study's preview and a
        served answer's ceilings count before the prompt runs."""
        return None

    def select(self, req: Request) -> Selection:
        raise NotImplementedError

    def count(self, req: Request) -> int:
        """How many rows this selector picks on this prompt (controls match it)."""
        return int(self.select(req).rows.numel())

    def check_layers(self, model_config: Any, split: int) -> None:
        """Raise ValueError when this selector cannot run on this model at this split (checked at arm resolve).

        The base checks the selectors it is made of (attributes, lists of them).
        """
        for value in vars(self).values():
            for part in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(part, Selector):
                    part.check_layers(model_config, split)

    def describe(self) -> dict[str, Any]:
        """Name and parameters, recorded in the run's provenance."""
        out: dict[str, Any] = {"name": self.name}
        for key, value in self.params().items():
            out[key] = value.describe() if isinstance(value, Selector) else value
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


class Union(Selector):
    """Rows chosen by any part; `on_top` parts (special tokens) go first and are hidden from the others."""

    name = "union"

    def __init__(self, parts: list[Selector]):
        if not parts:
            raise ValueError("a union needs at least one selector")
        self.parts = list(parts)

    def probe_rows(self) -> int:
        return sum(p.probe_rows() for p in self.parts)

    def describe(self):
        return {"name": self.name, "parts": [p.describe() for p in self.parts]}

    def captures(self, req):
        return merge_captures(p.captures(req) for p in self.parts)

    def select(self, req):
        ordered = [p for p in self.parts if p.on_top] + [p for p in self.parts if not p.on_top]
        rows, tail, fill = [], None, None
        saved = req.exclude.clone()
        for part in ordered:
            got = part.select(req)
            rows.append(got.rows)
            if got.tail is not None:
                tail = max(tail or 0, got.tail)
            fill = fill if fill is not None else got.fill  # the first part's precomputed K/V (the probe's)
            if part.on_top and got.rows.numel():
                req.exclude[got.rows] = True
        req.exclude = saved
        return Selection(as_rows(torch.cat(rows)) if rows else torch.zeros(0, dtype=torch.long), tail, fill)


def merge_captures(items) -> dict[int, tuple[int, int]]:
    """One covering row range per layer."""
    out: dict[int, tuple[int, int]] = {}
    for item in items:
        for layer, (start, stop) in item.items():
            if layer in out:
                start, stop = min(start, out[layer][0]), max(stop, out[layer][1])
            out[layer] = (start, stop)
    return out
