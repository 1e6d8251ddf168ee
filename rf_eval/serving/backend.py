"""The model behind `rf-eval serve`: one lm-eval adapter, one prefill method per arm, batches served in turn.

The server is the lm-eval adapter (a `PrefillLM`, built from the same
model_args; `method=` names the method, RidgeFill by default): HFLM loads the
model and tokenizer, the adapter parses and checks its arm, renders chat
prompts (`rf_eval.harness.chat`: thinking off where the template has the
switch) and tokenizes generation prompts, so the server cannot drift from the
adapter. Each request's arm comes from the adapter (`arm_with`, `method_for`),
and its method is used only through the method protocol
(`rf_eval.methods.base.Method`), with the rules the adapter uses
(`rf_eval.methods.requests`): one plan per prompt, plain prompts run the stock
model, a generation prompt is prefilled by `generation_cache`, the one
generation loop continues it, sampled requests are seeded by `sampling_seed`
(one request's generation: `rf_eval.serving.generation`).
So a server request and an adapter request with the same arm and prompt
tokens generate the same tokens.

Requests queue in a first-come-first-served dynamic batching scheduler
(`rf_eval.serving.scheduler`, RaReCache appendix B.3): when the model is idle
it takes up to `max_batch` queued requests, oldest first. In a batch, the
prompts of one arm and one length are prefilled by one `prefill_batch` call of
the arm's method (the engine runs them together where their rows are the same:
RidgeFill arms without a selector; RaReCache, the droppers and selector arms
prefill them one by one inside that call, as their `prefill_batch` says), and
plain prompts (no filled row) of one length by one forward of the stock model,
its cache split per prompt. Then each request's first token and the rest of
its generation run one request after another, oldest first: decoding is not
batched. A batch of one request is exactly the one-request path (the stock
`generate` over a plain prompt, `generation_cache` otherwise); a batched
prompt's tokens equal its one-request tokens within rounding (bitwise where
the engine's batch is, `rf_eval.engine.batch`).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from rf_eval.engine import PrefillResult, decoder_layers, new_cache
from rf_eval.engine.batch import split_cache
from rf_eval.methods.base import Method
from rf_eval.methods.requests import (
    check_token_ids,
    generation_cache,
    generation_cache_needed,
    generation_prompt,
)
from rf_eval.model_adapters.prefill_lm import PrefillLM
from rf_eval.serving import arms
from rf_eval.serving.generation import Generation, GenParams, Request, generate_request
from rf_eval.serving.scheduler import MAX_BATCH, BatchScheduler, Cancelled, Job
from rf_eval.serving.scoring import TokenScore, score_prompt

MAX_ENGINES = 16  # arms kept built (least recently used dropped)


@dataclass(frozen=True)
class ServedArm:
    """A resolved arm: its spec, its method and what responses report about it."""

    arm: Any  # the method's arm
    method: Method
    info: dict[str, Any]


class Backend:
    """Serves one lm-eval adapter's model (`PrefillLM`): requests queue, and batches of up to `max_batch` of
    them are served in turn (see the module docstring)."""

    def __init__(self, lm: Any, served_name: str | None = None, max_batch: int = MAX_BATCH):
        self.lm, self.settings = lm, lm.settings
        self.model, self.tokenizer = lm.model, lm.tokenizer
        self.chat_template = lm.chat.record()
        self.n_layers = len(decoder_layers(self.model))
        self.max_length = int(lm.max_length)
        self.served_name = served_name or self.settings.pretrained.rstrip("/").rsplit("/", 1)[-1]
        self.lock = threading.Lock()  # the model: one batch (or prompt scoring) at a time
        self.scheduler = BatchScheduler(self._run_batch, max_batch)
        self._arms_lock = threading.Lock()
        self._arms: OrderedDict[str, ServedArm] = OrderedDict()  # by resolved arm
        self._asked: dict[str, ServedArm] = {}  # by the fields a request gave
        self.default_arm = self.arm({})

    @classmethod
    def from_model_args(cls, model_args: dict[str, Any], served_name: str | None = None,
                        max_batch: int = MAX_BATCH) -> Backend:
        """The adapter built from `model_args`, running the method `method` names (default ridgefill)."""
        return cls(PrefillLM(model_name="ridgefill", **model_args), served_name, max_batch)

    @property
    def arm_fields(self) -> tuple[str, ...]:
        """The fields a request's arm may set (the adapter's arm spec's)."""
        return self.lm.arm_fields()

    # ---- arms

    def arm(self, fields: dict[str, Any]) -> ServedArm:
        """The method of the server's arm with `fields` applied (an ArmError if they are bad)."""
        asked = json.dumps(fields, sort_keys=True, default=str)
        with self._arms_lock:
            if asked in self._asked:  # resolved before: no second check
                return self._asked[asked]
        resolved = arms.resolve(self.lm.method.arm, fields, self.lm.arm_with, self.arm_fields)
        key = arms.key(resolved)
        with self._arms_lock:
            arm = self._arms.get(key) or ServedArm(resolved, self.lm.method_for(resolved),
                                                   {"method": self.lm.method.name, **arms.describe(resolved),
                                                    "layers": self.n_layers})
            self._arms[key] = arm
            self._arms.move_to_end(key)
            while len(self._arms) > MAX_ENGINES:
                self._arms.popitem(last=False)
            if len(self._asked) >= 4 * MAX_ENGINES:
                self._asked.clear()
            self._asked[asked] = arm
            return arm

    # ---- text

    def encode(self, text: str) -> list[int]:
        """A prompt string tokenized as the adapter (`hf`'s generate_until) tokenizes a generation prompt."""
        return self.lm.encode_prompt(text)

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The messages as the adapter renders them (lm-eval's `apply_chat_template`, `rf_eval.harness.chat`'s rule)."""
        return self.lm.apply_chat_template(messages)

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def token_text(self, token: int) -> str:
        """One token's text; a token that is part of a character (bytes) by its vocabulary entry."""
        text = self.tokenizer.decode([token], skip_special_tokens=False)
        return text if "\ufffd" not in text else str(self.tokenizer.convert_ids_to_tokens(token))

    def check_ids(self, ids: list[int]) -> None:
        """Token-id prompts must name rows of the embedding (else the model raises deep inside: a 500);
        the methods' rule, `rf_eval.methods.requests.check_token_ids`."""
        check_token_ids(ids, self.model)

    def check_length(self, n_prompt: int, max_tokens: int) -> None:
        if n_prompt < 1:
            raise ValueError("the prompt is empty")
        if n_prompt + max_tokens > self.max_length:
            raise ValueError(
                f"prompt of {n_prompt} tokens plus max_tokens {max_tokens} exceeds the model's length {self.max_length}"
            )

    # ---- generation

    def generate(
        self,
        ids: list[int],
        arm: ServedArm,
        params: GenParams,
        on_token: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """Generate after `ids` under `arm`; `on_token` sees each token as it is made. The request queues for
        its batch (`Cancelled` if `cancel` is set before it runs)."""
        self.check_length(len(ids), params.max_tokens)
        if params.max_tokens < 1:
            return Generation([], "", "length", [] if params.logprobs is not None else None,
                              {"queue_seconds": 0.0, "prefill_seconds": 0.0, "prompt_seconds": 0.0,
                               "decode_seconds": 0.0, "total_seconds": 0.0})
        return self.scheduler.call(Request(list(ids), arm.method, params, on_token, cancel), cancel)

    # ---- a batch (the scheduler's worker thread)

    def _run_batch(self, jobs: list[Job], finish: Callable[..., None]) -> None:
        """Serve one batch: the prefills (grouped by arm and length), then each request's generation in turn. A
        batch of one arm (a single request's, always) runs inside that arm's forward context, entered once;
        one of several arms enters each arm's around its prefills and each request's generation."""
        methods = {id(job.payload.method): job.payload.method for job in jobs}
        one_arm = next(iter(methods.values())).forward_context() if len(methods) == 1 else nullcontext()
        with self.lock, one_arm:
            t0 = time.perf_counter()
            caches = self._prefill_batch(jobs, finish)
            t1 = time.perf_counter()
            for job in jobs:
                if job.done.is_set():  # its prefill failed
                    continue
                if job.gone:
                    finish(job, error=Cancelled())
                    continue
                request: Request = job.payload
                cached, together = caches.get(job, (None, 1))
                try:
                    gen = generate_request(self.lm, request, cached, t0, t1 if job in caches else None)
                except Exception as err:  # this request's failure, not its batch's
                    finish(job, error=err)
                    continue
                gen.timings["queue_seconds"] = t0 - job.submitted
                if job.batch is not None:  # the same record: `finish` stamps its end before the caller wakes
                    job.batch.update(prefilled_together=together, queued_seconds=t0 - job.submitted)
                gen.batch = job.batch
                finish(job, gen)

    def _prefill_batch(self, jobs: list[Job], finish: Callable[..., None]
                       ) -> dict[Job, tuple[PrefillResult, int]]:
        """{job: (the cache its generation continues from, how many prompts were prefilled in its call)} for
        the jobs that `generation_cache` would prefill, and for plain prompts of a group of two or more; the
        others (a plain prompt alone, a one-token prompt) are prefilled by the stock `generate`, as alone."""
        groups: dict[tuple[int, int], list[Job]] = {}
        for job in jobs:
            request: Request = job.payload
            if job.gone or len(request.ids) < 2:
                continue
            groups.setdefault((id(request.method), len(request.ids)), []).append(job)
        out: dict[Job, tuple[PrefillResult, int]] = {}
        for group in groups.values():
            method = group[0].payload.method
            plan = method.plan(len(group[0].payload.ids))  # the group's one decision: one arm, one length
            needed = generation_cache_needed(plan)
            if not needed and len(group) == 1:
                continue
            try:
                with method.forward_context():
                    if needed and len(group) == 1:
                        results = [generation_cache(method, group[0].payload.ids, plan)]
                    elif needed:
                        heads = torch.tensor([generation_prompt(method, j.payload.ids) for j in group],
                                             device=self.lm.input_device)
                        results = method.prefill_batch(heads, for_generation=True, plan=plan)
                    else:
                        results = self._plain_prefill_batch([j.payload.ids[:-1] for j in group])
            except Exception as err:  # the group's prompts fail together (a one-prompt group: its own failure)
                for job in group:
                    finish(job, error=err)
                continue
            for job, result in zip(group, results, strict=True):
                together = int(result.timings.get("batch", 1)) if result.timings else 1
                out[job] = (result, together)
        return out

    @torch.no_grad()
    def _plain_prefill_batch(self, heads: list[list[int]]) -> list[PrefillResult]:
        """Prompts of one length with no filled row, all but their last token, through one forward of the stock
        model; its cache split per prompt (`rf_eval.engine.batch.split_cache`)."""
        ids = torch.tensor(heads, device=self.lm.input_device)
        cache = new_cache(self.model)
        self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        batch, n = ids.shape
        rows = torch.arange(n, device=ids.device)
        return [PrefillResult(split_cache(cache, b, batch), None, rows, {"batch": batch}, prompt_length=n)
                for b in range(batch)]

    def score_prompt(self, ids: list[int], arm: ServedArm, k: int) -> list[TokenScore]:
        """Log-probabilities of the prompt's own tokens under `arm`; see `scoring.score_prompt`."""
        self.check_length(len(ids), 0)
        with self.lock, arm.method.forward_context():
            return score_prompt(self.model, arm.method, ids, k)
