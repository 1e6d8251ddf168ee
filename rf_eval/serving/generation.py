"""One served request's generation, after its batch's prefills (`rf_eval.serving.backend` runs the batch).

The generation runs through the one generation loop (`rf_eval.methods.requests.generate_after`): over the
method's cache of the prompt, or, for a plain prompt (no cache), with the prompt run inside `generate`, as the
stock generation. The server's hooks (`rf_eval.serving.streaming`) report each token and stop when the client
has gone; a sampled request is seeded by the adapter's rule (`sampling_seed`). What comes back is the
response's material: tokens, text cut at a stop string, finish reason, scores and timings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import StoppingCriteriaList

from rf_eval.engine import PrefillResult
from rf_eval.methods.base import Method
from rf_eval.methods.requests import generate_after, sampling_seed
from rf_eval.model_adapters.prefill_lm import PrefillLM
from rf_eval.serving.scoring import TokenScore, token_score
from rf_eval.serving.streaming import ClientGone, TokenStreamer


@dataclass(frozen=True)
class GenParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: int | None = None  # top-k alternatives per generated token (0: the token's own only)


@dataclass
class Generation:
    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    scores: list[TokenScore] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    batch: dict[str, Any] | None = None  # the scheduler's record (`rf_eval.serving.scheduler`); None: no batch ran


@dataclass(frozen=True)
class Request:
    """A queued generation (a scheduler `Job`'s payload): the prompt, its arm's method, parameters and hooks."""

    ids: list[int]
    method: Method
    params: GenParams
    on_token: Callable[[int], None] | None
    cancel: threading.Event | None


def generate_request(lm: PrefillLM, request: Request, cached: PrefillResult | None, t0: float,
                     prefilled: float | None) -> Generation:
    """One request's generation after its batch's prefills (`cached`: its cache, None: `generate` runs the
    whole prompt; `t0`: when the batch started; `prefilled`: when the batch's prefills ended, None when this
    one's ran inside generate)."""
    from lm_eval.models.utils import postprocess_generated_text

    params = request.params
    first: list[float] = []
    t_gen = time.perf_counter()
    with request.method.forward_context():  # the method's forward (a fill that replaced it: the base's)
        out, fed = _run_generate(lm, request, cached, lambda: first.append(time.perf_counter()))
    t2 = time.perf_counter()
    tokens = out.sequences[0, fed:].tolist()
    raw = lm.tokenizer.decode(tokens, skip_special_tokens=True)
    text = postprocess_generated_text(raw, stop=list(params.stop), think_end_token=None)
    eos = lm.model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    stopped = len(text) < len(raw) or len(tokens) < params.max_tokens or bool(tokens and tokens[-1] in eos_ids)
    scores = None
    if params.logprobs is not None:
        scores = [token_score(row[0], tok, params.logprobs) for row, tok in zip(out.logits, tokens)]
    t_first = first[0] if first else t2
    timings = {
        "queue_seconds": 0.0,  # set by the batch
        # the batch's prefills (the engine's: all but the last row), else this prompt's inside generate
        "prefill_seconds": prefilled - t0 if prefilled is not None else t_first - t_gen,
        "prompt_seconds": t_first - t0,  # batch start to the first generated token (the whole prompt)
        "decode_seconds": t2 - t_first,
        "total_seconds": t2 - t0,
        # a second model's prefill inside it (RaReCache's source), which its paper's serving measurement
        # (section 4.6) assumes already ran: the load test reports the TTFT with and without it
        "source_seconds": float((cached.timings or {}).get("source", 0.0)) if cached is not None else 0.0,
    }
    return Generation(tokens, text, "stop" if stopped else "length", scores, timings)


def _run_generate(lm: PrefillLM, request: Request, cached: PrefillResult | None,
                  on_first: Callable[[], None]) -> tuple[Any, int]:
    """`model.generate` after the request's ids through the one generation loop (`requests.generate_after`):
    over the method's cache of them (`cached`), or, for a plain prompt (None), with the prompt run inside
    generate, as the stock generation. Returns its output and the length of the input it was handed."""
    from lm_eval.models.utils_hf import stop_sequences_criteria

    ids, params, cancel = request.ids, request.params, request.cancel
    stop = list(params.stop)

    def criteria(fed: int) -> StoppingCriteriaList | None:
        found = stop_sequences_criteria(lm.tokenizer, stop, fed, 1) if stop else None
        if cancel is not None:
            found = found or StoppingCriteriaList()
            found.append(ClientGone(cancel))
        return found

    kwargs: dict[str, Any] = {"do_sample": False}
    if params.temperature > 0:
        kwargs = {"do_sample": True, "temperature": params.temperature}
        if params.top_p is not None:
            kwargs["top_p"] = params.top_p
        if params.top_k is not None:
            kwargs["top_k"] = max(params.top_k, 0)  # vLLM's -1 (no cut) is transformers' 0
        seed = params.seed if params.seed is not None else lm.settings.seed
        if seed is not None:  # the adapter's rule: (seed, prompt tokens)
            torch.manual_seed(sampling_seed(seed, ids))
    if cached is None:  # the stock generation: generate runs the whole prompt
        kwargs["attention_mask"] = torch.ones((1, len(ids)), dtype=torch.long, device=lm.input_device)
    return generate_after(
        request.method, ids, cached, max_length=len(ids) + params.max_tokens, criteria=criteria,
        pad_token_id=lm.tokenizer.pad_token_id, use_cache=True, streamer=TokenStreamer(request.on_token, on_first),
        return_dict_in_generate=True, output_logits=params.logprobs is not None, **kwargs)
