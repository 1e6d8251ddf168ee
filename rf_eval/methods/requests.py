"""The request rules every shell shares, once: what a method's request runs, in which context, and how
generation continues from the method's cache.

- *one decision per prompt*: a shell asks the method's `plan(n)` once; a plain
  prompt runs the stock model's own code path (bitwise the unmodified model),
  the others are prefilled by the method with that plan handed on;
- *one forward context per request*: `ForwardContext`, entered once around
  the whole request (as lm-eval's `hf_steered.py` enters its steering around
  `_model_call`); the method's own entry points find it open;
- *one generation loop*: `generate_after` hands `model.generate` the method's
  cache (a dropper's kept rows at their positions) for the Python API, the
  lm-eval adapter and `rf-eval serve` alike; `generation_cache` prefills a
  prompt minus its last token (`for_generation`), which generate runs;
- *batches*: `batched_prefills` sends prompts of one length `--batch_size` at
  a time to `prefill_batch`;
- *sampling seeds*: `sampling_seed` derives a request's torch seed from a run's
  seed and the prompt's tokens, so arms and resumed runs draw the same stream.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any

import torch

from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.devices import check_model_source, input_device
from rf_eval.engine import PrefillResult, new_cache
from rf_eval.families import family_class_for
from rf_eval.fields import ArmError
from rf_eval.fills import FILL_OFF
from rf_eval.fills.base import replaced_forward
from rf_eval.fills.loading_report import check_loaded, recording_missing_keys
from rf_eval.integrity.tokenizers import check_tokenizers
from rf_eval.methods.dropped import decoding_positions, generation_inputs
from rf_eval.methods.source import REMOTE_KEYS, ModelSource
from rf_eval.prefill_timer import Stopwatch


def model_identity(model: Any, weights_sha256: str, maps: Any = None,
                   unrecorded: tuple[str, ...] = ("file_sha256",)) -> dict[str, Any]:
    """The identity every method's provenance records in one schema, beside its settings: the model whose
    cache it writes (`model_type`, `model_name`, `weights_sha256`: `rf_eval.integrity.weights`) and, with
    maps, `maps_sha256` and `maps_metadata` (less the `unrecorded` keys). What `stats` compares arms by."""
    info: dict[str, Any] = {
        "model_type": model.config.model_type,
        "model_name": getattr(model.config, "_name_or_path", ""),
        "weights_sha256": weights_sha256,
    }
    if maps is not None:
        info["maps_sha256"] = maps.sha256()
        info["maps_metadata"] = {k: v for k, v in maps.metadata.items() if k not in unrecorded}
    return info


# ---- prompts -------------------------------------------------------------------------------------
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
    """The vocabulary rule, for the methods and the server: every id names a row of the model's embedding;
    a ValueError naming an id that does not (a tensor's lowest or highest)."""
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


# ---- a second model beside the target (a source, a speculator) -------------------------------------
def check_second_model(source: Any, key: str, method: str) -> Any:
    """Before any weights: the second model that `source.files[key]` names loads its config, and its tokenizer is
    the target's, token for token (`rf_eval.integrity.tokenizers`); its config, or an ArmError naming
    `key` (a model given as an object: its own config, unchecked)."""
    from transformers import AutoConfig, AutoTokenizer

    path = source.files[key]
    if not isinstance(path, (str, os.PathLike)):  # a model given as an object (the Python API)
        return getattr(path, "config", None)
    path = str(path)
    trust = {k: v for k, v in source.remote.items() if k == "trust_remote_code"}
    try:
        check_model_source(path)
        config = AutoConfig.from_pretrained(path, **trust)
        family_class_for(config)  # a family rf-eval reads the layers of
        theirs = AutoTokenizer.from_pretrained(path, **trust)
    except (OSError, ValueError) as err:
        raise ArmError(f"{key}={path!r}: {' '.join(str(err).split())[:300]}") from None
    check_tokenizers(theirs, AutoTokenizer.from_pretrained(source.tokenizer, **trust), method)
    return config


def load_second_model(path: str, model: Any, remote: dict[str, Any], key: str) -> Any:
    """The second model at `path`, with `model`'s dtype, on its input device, every tensor read (a checkpoint
    that lacks one is refused, `rf_eval.fills.loading_report`)."""
    from transformers import AutoModelForCausalLM

    trust = bool(remote.get("trust_remote_code", False))
    with recording_missing_keys():
        second = AutoModelForCausalLM.from_pretrained(path, dtype=model.dtype, trust_remote_code=trust)
    check_loaded(second, FILL_OFF, f"the {key} model")
    return second.to(input_device(model)).eval()


# ---- the forward context -------------------------------------------------------------------------
#: the methods whose forward context this thread is inside (by id): their own entry points then enter nothing
_inside = threading.local()


class ForwardContext(AbstractContextManager):
    """Where a request runs the model for a method (its prefill, the stock forward of plain prompts and of
    decoded tokens): the base forward beside a fill that replaced the model's own
    (`rf_eval.fills.base.ReplacedForward`) unless the method's arm runs that fill, else the model as it is.
    Entered once per request; entering it again inside (a method's own entry points) does nothing."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.entered: list[AbstractContextManager | None] = []  # per entry: what it opened (None: found it open)

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
        replaced = replaced_forward(self.method.model)
        if replaced is None or self.method.forward_fill == replaced.fill:
            return nullcontext()
        return replaced.paused()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        inner = self.entered.pop()
        if inner is not None:
            _inside.methods.discard(id(self.method))
            inner.__exit__(kind, err, tb)


# ---- prefills ------------------------------------------------------------------------------------
def generation_prompt(method: Any, prompt: Sequence[int]) -> list[int]:
    """What a generation prefill reads of `prompt`: all but its last token, which `generate` runs; the whole
    prompt for a method whose rule reads the last token (`reads_whole_prompt`: the droppers, whose caches then
    hold their kept rows but the last, `rf_eval.methods.dropped.generation_inputs`)."""
    return list(prompt) if getattr(method, "reads_whole_prompt", False) else list(prompt[:-1])


def generation_cache_needed(plan: Any) -> bool:
    """Whether a generation prefills its prompt (two tokens or more and not plain: `plan`, the prompt's)."""
    return plan.n >= 2 and not plan.plain


def generation_cache(method: Any, prompt: Sequence[int], plan: Any) -> PrefillResult | None:
    """The cache `generate` continues from for `prompt` (whose plan is `plan`), or None when generate
    prefills the prompt itself (a plain prompt, or one of a single token: as lm-eval's `hf` model does)."""
    if not generation_cache_needed(plan):
        return None
    ids = torch.tensor([generation_prompt(method, prompt)], device=input_device(method.model))
    return method.prefill(ids, for_generation=True, plan=plan)


def whole_prompt(method: Any, given: int, for_generation: bool) -> int:
    """The tokens of the whole prompt a prefill of `given` tokens is part of (a generation prefill holds back
    the last token, unless the method reads the whole prompt)."""
    return given + int(for_generation and not getattr(method, "reads_whole_prompt", False))


def timed_prefill(method: Any, input_ids: torch.Tensor, plan: Any = None, *, for_generation: bool = False
                  ) -> tuple[PrefillResult, PrefillCost]:
    """`method.prefill`, timed (`rf_eval.prefill_timer.Stopwatch`, plus the seconds of any work it read
    back instead of running: its `timings["reused"]`), and what the whole prompt (`plan`, the caller's decision;
    None: asked here) cost."""
    if plan is None:
        plan = method.plan(whole_prompt(method, input_ids.shape[1], for_generation))
    with Stopwatch(input_ids.device) as clock:
        result = method.prefill(input_ids, for_generation=for_generation, plan=plan)
    return result, method.prefill_cost(plan.n, result, plan).timed(clock.seconds + reused_seconds(result))


def reused_seconds(result: PrefillResult) -> float:
    """The seconds of work a prefill read back instead of running (`timings["reused"]`: an earlier arm's lower
    layers, `rf_eval.engine.shared_lower`), this prompt's share of its batch's."""
    return result.timings.get("reused", 0.0) / result.timings.get("batch", 1)


def batched_prefills(method: Any, prompts: Sequence[Sequence[int]], plans: Sequence[Any] | None, batch_size: int, *,
                     for_generation: bool = False) -> Iterator[tuple[int, PrefillResult, PrefillCost]]:
    """(i, the method's prefill of prompts[i], its cost) for every prompt, longest first, prompts of one length
    `batch_size` at a time through `prefill_batch` (lm-eval's `--batch_size`; padding-free, so only equal
    lengths share a call). `plans[i]`: the whole prompt's plan (for generation, `prompts[i]` is what
    `generation_prompt` cut of it; None: asked here, once per length). Each cost is timed as its prompt's share
    of its batch's seconds. Runs inside the caller's forward context."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # stable: equal lengths keep their order
    step = max(int(batch_size), 1)
    for _, same in itertools.groupby(order, key=lambda i: len(prompts[i])):
        same = list(same)
        for start in range(0, len(same), step):
            chunk = same[start : start + step]
            plan = (plans[chunk[0]] if plans is not None  # one length, one plan
                    else method.plan(whole_prompt(method, len(prompts[chunk[0]]), for_generation)))
            ids = torch.tensor([list(prompts[i]) for i in chunk], device=input_device(method.model))
            with Stopwatch(ids.device) as clock:
                results = ([method.prefill(ids, for_generation=for_generation, plan=plan)] if len(chunk) == 1
                           else method.prefill_batch(ids, for_generation=for_generation, plan=plan))
            for i, result in zip(chunk, results):
                cost = method.prefill_cost(plan.n, result, plan)
                yield i, result, cost.timed(clock.seconds / len(chunk) + reused_seconds(result))


# ---- generation ----------------------------------------------------------------------------------
def generate_after(method: Any, prompt: list[int], result: PrefillResult | None, *, max_length: int | None = None,
                   criteria: Callable[[int], Any] | None = None, **kwargs: Any) -> tuple[Any, int]:
    """The one generation loop: `model.generate` after `prompt` over `result`, the method's cache of it (None:
    generate prefills the whole prompt itself, as the stock generation). A dropper's cache holds its kept rows:
    generate is handed the kept tokens at their positions, then what follows them
    (`rf_eval.methods.dropped.generation_inputs`), and decodes where the method puts the tokens after the prompt
    (`decoding_positions`). `max_length` counts `prompt`'s tokens; `criteria(k)`: the
    stopping criteria of a generation handed k input tokens. Runs inside the caller's forward context; returns
    (generate's output, how many input tokens it was handed)."""
    device = input_device(method.model)
    if result is None:
        fed, positions, cache = list(prompt), None, {}
    else:
        pending = prompt[result.prompt_length : -1]
        if pending and result.ragged:  # the stock mask cannot cover several new tokens over a ragged cache
            method.extend(result, torch.tensor([pending], device=device))
        fed, positions = generation_inputs(result, prompt)
        cache = {"cache": result.cache}
    ids = torch.tensor([fed], device=device)
    if positions is not None:
        kwargs["position_ids"] = torch.tensor([positions], device=device)
    if result is not None and not result.ragged:
        kwargs["attention_mask"] = torch.ones_like(ids)
    if max_length is not None:
        kwargs["max_length"] = max_length - len(prompt) + len(fed)
    if criteria is not None:
        kwargs["stopping_criteria"] = criteria(len(fed))
    with decoding_positions(method.model, result, prompt, positions):
        out = method.model.generate(input_ids=ids, **cache, **kwargs)
    if result is not None:
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        result.prompt_length = len(prompt) + sequences.shape[1] - len(fed) - 1  # generate's last token is not run
    return out, len(fed)


def generate(method: Any, input_ids: torch.Tensor, **kwargs: Any) -> Any:
    """The Python API's `generate`: `model.generate` (its own keyword arguments) over the method's cache of
    the prompt; what generate returns, its sequences the prompt then what was generated (a dropper's cache
    held only its kept rows)."""
    input_ids = input_ids.to(input_device(method.model))
    prompt = input_ids[0].tolist()
    with method.forward_context():
        plan = method.plan(len(prompt))
        out, fed = generate_after(method, prompt, generation_cache(method, prompt, plan), **kwargs)
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    whole = torch.cat([input_ids, sequences[:, fed:]], 1)
    if isinstance(out, torch.Tensor):
        return whole
    out.sequences = whole
    return out


def empty_result(model: Any) -> PrefillResult:
    """A prefill of nothing: the cache `generate` fills with the whole prompt itself."""
    return PrefillResult(new_cache(model), None, torch.arange(0), prompt_length=0)


def sampling_seed(seed: int, prompt: list[int]) -> int:
    """The torch seed of one sampled request: sha256 of (run seed, prompt tokens)."""
    digest = hashlib.sha256(json.dumps([int(seed), list(prompt)]).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def meta_model(source: Any, config: Any = None) -> Any:
    """A model of `config` (the `ModelSource`'s own by default) on the meta device: no weights, its shapes
    and modules, for the checks a method makes before the weights load."""
    from transformers import AutoModelForCausalLM

    trust = {k: v for k, v in source.remote.items() if k == "trust_remote_code"}
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config if config is not None else source.config, **trust)


def plan_on_meta(cls: Any, model_args: Mapping[str, Any], arm: Any, lengths: Sequence[int] | None) -> None:
    """Plan each of `lengths` under `arm` with the method built on the meta device (`Method.on_meta`), so a
    budget it cannot meet at one is refused before a study runs (the `BudgetError` names the length); nothing
    where the arm has no budget, no lengths are given, the config is not readable here or the method cannot
    be built so (its run checks)."""
    from transformers import AutoConfig

    if not lengths or getattr(arm, "budget", None) is None:
        return
    remote = {k: model_args[k] for k in REMOTE_KEYS if model_args.get(k)}
    pretrained = str(model_args["pretrained"])
    try:
        config = AutoConfig.from_pretrained(pretrained, **remote)
    except OSError:
        return
    files = {k: str(model_args[k]) for k in cls.loads if model_args.get(k) is not None}
    source = ModelSource(pretrained, config, str(model_args.get("tokenizer") or pretrained), remote, files)
    method = cls.on_meta(arm, source)
    for n in sorted({int(n) for n in lengths}) if method is not None else ():
        method.plan(n)
