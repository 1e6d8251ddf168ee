"""The prefill-method protocol both methods implement, and the rules every shell shares.

`RidgeFill` (rf_eval.ridgefill.api) and `RaReCache` (rf_eval.rarecache.api) are prefill
methods: they turn a prompt into the model's own cache and its last row's
logits, and after that everything is the stock model. The lm-eval adapters
and `rf-eval serve` talk to a method only through this protocol, and the
rules they share live here, once:

- *one request path*: a shell decides once per prompt whether it is plain
  (`is_plain(n)`: the plain model would prefill it, no filled rows) and runs a
  plain prompt through the stock model's own code path, so such requests are
  bitwise the unmodified model's; the others run inside the method's forward
  context, entered once per request (`forward_context`, as lm-eval's
  `hf_steered.py` enters its steering around `_model_call`): the method's
  prefill (which checks the prompt, once), then the stock model over its cache;
- *generation*: `generation_cache` prefills a prompt minus its last token
  (`prefill(..., for_generation=True)`), and `generate` runs that token
  exactly, as a tail row;
- *batches*: `batched_prefills` sends prompts of one length `--batch_size` at a
  time to `prefill_batch`;
- *sampling seeds*: `sampling_seed` derives a request's torch seed from a
  run's seed and the prompt's tokens, so arms and resumed runs draw the same
  stream whatever the request order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import torch

from rf_eval.devices import input_device
from rf_eval.dropped_result import generation_inputs
from rf_eval.engine import PrefillResult, new_cache
from rf_eval.fills.base import replaced_forward
from rf_eval.prefill_cost import PrefillCost
from rf_eval.prefill_timer import Stopwatch


@runtime_checkable
class PrefillMethod(Protocol):
    """What a shell needs of an approximate-prefill method."""

    model: Any  # the `transformers` model whose cache the method writes (RaReCache: the target)

    @property
    def device(self) -> torch.device:
        """Where prompt ids go (`input_device` of the model)."""
        ...

    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0) -> PrefillResult:
        """The cache of a 1 x N prompt and its last row's logits.

        for_generation: `input_ids` is a prompt minus its last token, which
        `generate` runs. held_back (k < `exact_tail` of the whole prompt): the
        prompt minus its last k tokens, which the caller runs with `extend`;
        every row keeps the class it has in a prefill of the whole prompt.
        """
        ...

    def prefill_batch(self, input_ids: torch.Tensor, *, for_generation: bool = False) -> list[PrefillResult]:
        """`prefill` of each row of a B x N batch of prompts of one length: one engine call where the method's
        rows are the same for every prompt, else one prefill each (`rf_eval.engine.batch` states how equal)."""
        ...

    def exact_tail(self, n: int) -> int:
        """How many of an n-token prompt's last rows run the stock model in every layer whatever the prompt
        (so `held_back` may hold back all but one of them)."""
        ...

    def speedup_ceilings(self, n: int) -> dict[str, float]:
        """The method's compute-bound speedup ceilings on an n-token prompt, by name (1.0 for a plain one)."""
        ...

    def prefill_cost(self, n: int, result: PrefillResult | None = None) -> PrefillCost:
        """What prefilling an n-token prompt cost under the method, against exact prefill (`rf_eval.prefill_cost`):
        its own cost model at the rows `result` ran (a prefill of the prompt, or of all but its held-back
        last tokens), exact's for a plain prompt."""
        ...

    def extend(self, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
        """The stock model over `tokens` (1 x k) after the prompt: their logits (1, k, V); advances the cache."""
        ...

    def is_plain(self, n: int) -> bool:
        """True when an n-token prompt has no filled row (the plain model's prefill, bitwise)."""
        ...

    def forward_context(self) -> AbstractContextManager:
        """The context a request runs the model in for this method, entered once around the whole request
        (prefill, extension, generation); re-entrant (`method_forward`, the default)."""
        ...

    def provenance(self) -> dict[str, Any]:
        """What results record about the arm: method, its settings, the maps' identity."""
        ...


def model_identity(model: Any, weights_sha256: str, maps: Any = None,
                   unrecorded: tuple[str, ...] = ("file_sha256",)) -> dict[str, Any]:
    """The identity every method's provenance records in one schema, beside its settings: the model whose
    cache it writes (`model_type`, `model_name`, `weights_sha256`: `rf_eval.weights.weights_fingerprint`) and,
    with maps, `maps_sha256` and `maps_metadata` (less the `unrecorded` keys). What `stats` compares arms by
    (`stats.comparable`)."""
    info: dict[str, Any] = {
        "model_type": model.config.model_type,
        "model_name": getattr(model.config, "_name_or_path", ""),
        "weights_sha256": weights_sha256,
    }
    if maps is not None:
        info["maps_sha256"] = maps.sha256()
        info["maps_metadata"] = {k: v for k, v in maps.metadata.items() if k not in unrecorded}
    return info


def check_prompt(input_ids: Any, model: Any) -> torch.Tensor:
    """`input_ids` as a 1 x N LongTensor of in-vocabulary ids, or a ValueError saying what it got."""
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids must be a 1 x N torch.LongTensor, got {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be a 1 x N tensor, got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: a prompt needs at least one token")
    if input_ids.device.type != "meta":
        check_token_ids(input_ids, model)
    return input_ids.long()


def vocabulary_rows(model: Any) -> int | None:
    """Token ids the model can read, 0..rows-1: its input embedding's rows (a padded embedding may hold more
    than `config.vocab_size`), else `config.vocab_size`; None when it says neither."""
    embed = getattr(model, "get_input_embeddings", None)
    weight = getattr(embed(), "weight", None) if callable(embed) else None
    if weight is not None:
        return int(weight.shape[0])
    return getattr(getattr(model, "config", None), "vocab_size", None)


def check_token_ids(ids: Sequence[int] | torch.Tensor, model: Any) -> None:
    """The vocabulary rule, for the methods and the server: every id names a row of the model's embedding
    (else the model fails deep inside); a ValueError naming an id that does not (a tensor's lowest or
    highest)."""
    rows = vocabulary_rows(model)
    if rows is None or len(ids) == 0:
        return
    if isinstance(ids, torch.Tensor):
        low, high = int(ids.min()), int(ids.max())
        bad = low if low < 0 else high if high >= rows else None
    else:
        bad = next((t for t in ids if not 0 <= t < rows), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the model's vocabulary 0..{rows - 1}")


#: the methods whose forward context this thread is inside (by id): their own entry points then enter nothing
_inside = threading.local()


class ForwardContext(AbstractContextManager):
    """`method_forward`'s context: `open` runs on the outermost entry only, so a method's entry points (its
    `prefill`, `extend`: the Python API's request path) enter nothing more under a shell's context."""

    def __init__(self, method: PrefillMethod) -> None:
        self.method = method
        self.entered: list[AbstractContextManager | None] = []  # per entry: what it opened (None: found it open)

    @property
    def inner(self) -> AbstractContextManager | None:
        """What the innermost entry of this context opened (None: nothing, it was open already)."""
        return self.entered[-1] if self.entered else None

    def __enter__(self) -> ForwardContext:
        held = _inside.__dict__.setdefault("methods", set())
        inner = None
        if id(self.method) not in held:
            inner = self.open()
            inner.__enter__()
            held.add(id(self.method))
        self.entered.append(inner)
        return self

    def open(self) -> AbstractContextManager:
        """The base forward for the exact arm beside a fill that replaced the model's forward
        (`rf_eval.fills.base.ReplacedForward`), else the model as it is."""
        replaced = replaced_forward(self.method.model)
        plan = getattr(self.method, "plan", None)
        if replaced is None or getattr(plan, "fill", None) == replaced.fill:
            return nullcontext()
        return replaced.paused()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        inner = self.entered.pop()
        if inner is not None:
            _inside.methods.discard(id(self.method))
            inner.__exit__(kind, err, tb)


def method_forward(method: PrefillMethod) -> AbstractContextManager:
    """Where a shell runs the model for `method` (its prefill, the stock forward of plain prompts and of
    decoded tokens), the default `PrefillMethod.forward_context`: the base forward for the exact arm beside
    a fill that replaced the model's forward (`rf_eval.fills.base.ReplacedForward`), else the model as it
    is. Entered once per request; inside it, entering it again (a method's own entry points) does nothing."""
    return ForwardContext(method)


def forward_context(method: PrefillMethod) -> AbstractContextManager:
    """`method.forward_context()`, or the default (`method_forward`) for a method that has none."""
    own = getattr(method, "forward_context", None)
    return own() if callable(own) else method_forward(method)


def generation_prompt(method: PrefillMethod, prompt: list[int]) -> list[int]:
    """What a generation prefill reads of `prompt`: all but its last token, which `generate` runs; the whole
    prompt for a method whose rule reads the last token (`reads_whole_prompt`: the droppers, whose caches then
    hold their kept rows but the last, `rf_eval.dropped_result.generation_inputs`)."""
    return list(prompt) if getattr(method, "reads_whole_prompt", False) else list(prompt[:-1])


def generation_cache_needed(method: PrefillMethod, prompt: Sequence[int], plain: bool | None = None) -> bool:
    """Whether `generation_cache` prefills `prompt` (it has two tokens or more and a filled row). `plain`: the
    request's decision, where its shell made it (`method.is_plain` runs once per request)."""
    return len(prompt) >= 2 and not (method.is_plain(len(prompt)) if plain is None else plain)


def timed_prefill(method: PrefillMethod, input_ids: torch.Tensor, *, for_generation: bool = False
                  ) -> tuple[PrefillResult, PrefillCost]:
    """`method.prefill`, timed (`rf_eval.prefill_timer.Stopwatch`, plus the seconds of any work it read back
    instead of running: its `timings["reused"]`), and what it cost: the whole prompt's `PrefillCost`,
    the held-back last token of a generation prefill included."""
    with Stopwatch(input_ids.device) as clock:
        result = method.prefill(input_ids, for_generation=for_generation)
    n = input_ids.shape[1] + int(for_generation and not getattr(method, "reads_whole_prompt", False))
    return result, method.prefill_cost(n, result).timed(clock.seconds + reused_seconds(result))


def reused_seconds(result: PrefillResult) -> float:
    """The seconds of work a prefill read back instead of running (`timings["reused"]`: an earlier arm's lower
    layers, `rf_eval.engine.shared_lower`), this prompt's share: one engine call over a batch reads one pass
    for all its prompts, and `engine.split_batch` gives each prompt the whole batch's timings."""
    return result.timings.get("reused", 0.0) / result.timings.get("batch", 1)


def generation_cache(method: PrefillMethod, prompt: list[int], plain: bool | None = None) -> PrefillResult | None:
    """The cache `generate` continues from for `prompt`, or None when it should prefill the prompt itself.

    None for a plain prompt (or one of under two tokens): `generate` then runs
    the whole prompt through the stock model, exactly as lm-eval's `hf` model
    does. Otherwise the method prefills every token but the last. `plain`: as `generation_cache_needed`.
    """
    if not generation_cache_needed(method, prompt, plain):
        return None
    ids = torch.tensor([generation_prompt(method, prompt)], device=input_device(method.model))
    return method.prefill(ids, for_generation=True)


def batched_prefills(method: PrefillMethod, prompts: Sequence[Sequence[int]], batch_size: int, *,
                     for_generation: bool = False) -> Iterator[tuple[int, PrefillResult, PrefillCost]]:
    """(i, the method's prefill of prompts[i], its cost) for every prompt, longest first, prompts of one length
    (for generation, each prompt as `generation_prompt` cuts it)
    `batch_size` at a time through `prefill_batch` (lm-eval's `--batch_size`; padding-free, so only equal
    lengths share a call; a batch of one prompt is its `prefill`). A batch's results are alive together, as
    `hf`'s batches are. Each cost is timed as its prompt's share of its batch's seconds. Runs inside the
    caller's `forward_context`."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # stable: equal lengths keep their order
    step = max(int(batch_size), 1)
    for length, same in itertools.groupby(order, key=lambda i: len(prompts[i])):
        same = list(same)
        for start in range(0, len(same), step):
            chunk = same[start : start + step]
            ids = torch.tensor([list(prompts[i]) for i in chunk], device=input_device(method.model))
            with Stopwatch(ids.device) as clock:
                results = ([method.prefill(ids, for_generation=for_generation)] if len(chunk) == 1
                           else method.prefill_batch(ids, for_generation=for_generation))
            whole = getattr(method, "reads_whole_prompt", False)
            for i, result in zip(chunk, results):
                cost = method.prefill_cost(length + int(for_generation and not whole), result)
                yield i, result, cost.timed(clock.seconds / len(chunk) + reused_seconds(result))


def prefill_each(method: PrefillMethod, input_ids: torch.Tensor, *, for_generation: bool = False
                 ) -> list[PrefillResult]:
    """`prefill_batch` for a method whose prompts never share a call: one `prefill` per row."""
    return [method.prefill(row[None], for_generation=for_generation) for row in input_ids]


def generate(method: PrefillMethod, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """`model.generate` (its own keyword arguments) over the method's cache of the prompt (`generation_cache`)."""
    input_ids = input_ids.to(input_device(method.model))
    with forward_context(method):
        prompt = input_ids[0].tolist()
        result = generation_cache(method, prompt)
        if result is None:
            return method.model.generate(input_ids, **kwargs)
        tokens, positions = generation_inputs(result, prompt)
        if positions is None:
            return method.model.generate(input_ids, cache=result.cache, **kwargs)
        ids = torch.tensor([tokens], device=input_ids.device)
        out = method.model.generate(ids, cache=result.cache, position_ids=torch.tensor([positions], device=ids.device),
                                    attention_mask=torch.ones_like(ids), **kwargs)
        return torch.cat([input_ids, out[:, len(tokens):]], 1)  # the prompt, then what was generated


def empty_result(model: Any) -> PrefillResult:
    """A prefill of nothing: the cache `generate` fills with the whole prompt itself."""
    return PrefillResult(new_cache(model), None, torch.arange(0), prompt_length=0)


def sampling_seed(seed: int, prompt: list[int]) -> int:
    """The torch seed of one sampled request: sha256 of (run seed, prompt tokens)."""
    digest = hashlib.sha256(json.dumps([int(seed), list(prompt)]).encode()).digest()
    return int.from_bytes(digest[:4], "little")
