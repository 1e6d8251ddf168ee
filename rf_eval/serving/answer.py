"""Answering one checked request of `rf-eval serve`: the whole response, or its server-sent events as the
tokens come (`rf_eval.serving.app` reads and checks the request and wires the routes).

Every request is one JSON line in the request log (`RequestLog`). An answer writes its line when it ends:
status 200 with its token counts, timings and batch records; for a stream, 500 with the error, or 499 when
its client went away before it ended (queued, or mid-stream). `app` writes the lines of the requests it
refuses (400) and of a whole response that failed (500).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from lm_eval.models.utils import postprocess_generated_text

from rf_eval.serving import protocol
from rf_eval.serving.backend import Backend, ServedArm
from rf_eval.serving.generation import Generation
from rf_eval.serving.protocol import Parsed
from rf_eval.serving.scheduler import Cancelled

log = logging.getLogger(__name__)


class RequestLog:
    """Appends one JSON object per request to a file (or a stream)."""

    def __init__(self, path: str | Path | None = None, stream: TextIO | None = None):
        self._fh = open(path, "a", encoding="utf-8") if path else stream  # noqa: SIM115 (open for the server's life)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        line = json.dumps({"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), **record})
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()


@dataclass(frozen=True)
class Answer:
    """One checked request being answered: what its response and its log record are built from."""

    backend: Backend
    logger: RequestLog
    req: Parsed
    arm: ServedArm
    rid: str
    model: str
    record: dict[str, Any]
    started: float

    def rf(self, n_prompt: int, timings: dict[str, float], batch: Any = None) -> dict[str, Any]:
        """The response's rf-eval fields: `rf_arm`, `rf_timings`, `rf_batch` (and `rf_chat_template` for chat)."""
        arm, req = self.arm, self.req
        ceilings = arm.method.speedup_ceilings(n_prompt)  # the method's own (RidgeFill's 1/r, RaReCache's eq. 11)
        out = {"rf_arm": arm.info, "rf_timings": {**timings, "prompt_tokens": n_prompt, **ceilings,
                                                  "prefills_together": arm.method.prefills_together(n_prompt)},
               "rf_batch": batch}
        return {**out, "rf_chat_template": self.backend.chat_template} if req.chat else out

    def complete(self) -> dict[str, Any]:
        """The whole response (one choice per prompt), logged."""
        backend, req = self.backend, self.req
        choices, n_prompt, n_gen, timings, batches = [], 0, 0, {}, []
        for index, ids in enumerate(req.prompts):
            prompt_scores = None
            if req.echo and req.params.logprobs is not None:
                prompt_scores = backend.score_prompt(ids, self.arm, req.params.logprobs)
            gen = backend.generate(ids, self.arm, req.params)
            choices.append(protocol.choice(backend, req, index, gen, prompt_scores))
            n_prompt, n_gen = n_prompt + len(ids), n_gen + len(gen.tokens)
            timings = {k: timings.get(k, 0.0) + v for k, v in gen.timings.items()}
            batches.append(gen.batch)
        rf = self.rf(n_prompt, timings, batches)
        self.logger.write({**self.record, "status": 200, "prompt_tokens": n_prompt, "completion_tokens": n_gen,
                           **timings, "batch": batches, "wall_seconds": time.perf_counter() - self.started})
        return protocol.response(req, self.rid, self.model, choices,
                                 protocol.usage(n_prompt, n_gen, timings.get("prompt_seconds")), rf)

    def stream(self, cancel: threading.Event) -> Iterator[str]:
        """The request queued now (in arrival order, before its response starts), and the generator of its events."""
        ids, req = self.req.prompts[0], self.req
        events: queue.Queue = queue.Queue()

        def work() -> None:
            try:
                events.put(("done", self.backend.generate(ids, self.arm, req.params,
                                                          on_token=lambda t: events.put(("token", t)), cancel=cancel)))
            except Cancelled:  # the client went away while the request queued
                events.put(("cancelled", None))
            except Exception as err:  # reported to the client as an error event
                events.put(("error", err))

        threading.Thread(target=work, name=f"rf-eval-{self.rid}", daemon=True).start()
        return self._events(cancel, events)

    def _events(self, cancel: threading.Event, events: queue.Queue) -> Iterator[str]:
        """The server-sent events of a streamed response, from the generation's events; logged when it ends."""
        backend, req, rid, model, record, started = (self.backend, self.req, self.rid, self.model, self.record,
                                                     self.started)
        ids = req.prompts[0]
        tokens: list[int] = []
        sent = ""
        finished = False
        try:
            while True:
                kind, value = events.get()
                if kind == "token":
                    tokens.append(value)
                    text = _visible(backend, tokens, req.params.stop)
                    if len(tokens) == 1 or (len(text) > len(sent) and text.startswith(sent)):
                        delta, sent = (text[len(sent):], text) if text.startswith(sent) else ("", sent)
                        yield _sse(protocol.chunk(req, rid, model, delta, first=len(tokens) == 1))
                    continue
                if kind == "cancelled":
                    return  # `finally` logs the dropped request (status 499)
                if kind == "error":
                    self.logger.write({**record, "status": 500, "error": repr(value)})
                    yield _sse({"error": {"message": f"internal error: {value!r}", "type": "server_error"}})
                    break
                gen: Generation = value
                delta = gen.text[len(sent):] if gen.text.startswith(sent) else ""
                rf = self.rf(len(ids), gen.timings, gen.batch)
                if not tokens:
                    yield _sse(protocol.chunk(req, rid, model, "", first=True))
                yield _sse(protocol.chunk(req, rid, model, delta, finish=gen.finish_reason, extra=rf))
                use = protocol.usage(len(ids), len(gen.tokens), gen.timings.get("prompt_seconds"))
                if req.include_usage:
                    yield _sse({"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
                                "created": int(time.time()), "model": model, "choices": [], "usage": use})
                self.logger.write({**record, "status": 200, "prompt_tokens": len(ids),
                                   "completion_tokens": len(gen.tokens), **gen.timings, "batch": gen.batch,
                                   "wall_seconds": time.perf_counter() - started})
                break
            finished = True
            yield "data: [DONE]\n\n"
        finally:
            cancel.set()
            if not finished:  # the client went away (queued, or mid-stream): say so (the log would otherwise hold nothing)
                log.warning("stream %s dropped by the client after %d tokens", rid, len(tokens))
                self.logger.write({**record, "status": 499, "error": "client disconnected mid-stream" if tokens else
                                   "client disconnected before the first token",
                                   "completion_tokens": len(tokens), "wall_seconds": time.perf_counter() - started})


def _visible(backend: Backend, tokens: list[int], stop: tuple[str, ...]) -> str:
    """Text that can be sent now: cut at a stop string; a possible stop prefix or broken character held back."""
    raw = backend.decode(tokens)
    text = postprocess_generated_text(raw, stop=list(stop), think_end_token=None)
    if len(text) < len(raw):
        return text
    hold = len(text) - len(text.rstrip("\ufffd"))
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return text[: len(text) - hold]


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"
