"""The FastAPI application of `rf-eval serve` (OpenAI-compatible; see `protocol` for the fields).

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both also under
`/arm/<spec>/v1/...`), `GET /v1/models`, `POST /tokenize`, `POST /detokenize`,
`GET /rf/info`, `GET /health`. Each response carries `rf_arm` (the arm that
ran: fill, split, tail, layers) and `rf_timings` (server seconds: queue,
prefill, prompt = to the first generated token, decode, total; and the
prompt's speedup ceilings); `usage.prompt_time_ms` is the prompt time too.
Chat responses and `/rf/info` also carry `rf_chat_template`, the record
`--model ridgefill` keeps as `rf_eval.chat_template` (`rf_eval.harness.chat`), so a
served arm shows it rendered messages as the adapter arm it pairs with.
Streaming responses carry these in their last chunk. Every request is one
JSON line in the request log.

Requests queue for the model in the backend's first-come-first-served batching
scheduler (`rf_eval.serving.scheduler`); each response reports its batch as
`rf_batch` (a streamed response: one record; a completion: one per prompt),
and `/rf/info` the scheduler's state (`scheduler`: max_batch, queued, running,
batches, served). A streamed request whose client disconnects before its
batch starts is dropped from the queue (logged with status 499). Requests wait
in worker threads; their pool is raised from anyio's 40 to `WORKER_THREADS`,
so that a load run's queue is not capped at 40 requests in flight.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from lm_eval.models.utils import postprocess_generated_text
from starlette.concurrency import run_in_threadpool

from rf_eval.serving import protocol
from rf_eval.serving.arms import ArmError, as_fields, parse_rf_arm
from rf_eval.serving.backend import Backend, Generation, ServedArm
from rf_eval.serving.protocol import Parsed, RequestError
from rf_eval.serving.scheduler import Cancelled

log = logging.getLogger(__name__)

WORKER_THREADS = 2048  # requests waiting for their batch at once (each holds a worker thread)


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


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status)


class _Stream(StreamingResponse):
    """A streamed response that sets `cancel` when its client disconnects (a queued request is then dropped,
    a running one stops at its next token), and closes its generator when it ends, so that a dropped stream
    is logged then, not whenever the generator is garbage-collected."""

    def __init__(self, content: Iterator[str], cancel: threading.Event, **kwargs: Any):
        super().__init__(content, **kwargs)
        self.content, self.cancel = content, cancel

    async def listen_for_disconnect(self, receive: Any) -> None:
        await super().listen_for_disconnect(receive)
        self.cancel.set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.content, "close", None)
            if close is not None:
                try:
                    close()  # suspended at a yield (a cancelled `next` waits for its thread): runs its `finally`
                except ValueError:  # still running in its thread: it finishes, and is collected, by itself
                    pass


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    import anyio.to_thread

    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(limiter.total_tokens, WORKER_THREADS)
    yield


def create_app(backend: Backend, request_log: RequestLog | None = None) -> FastAPI:
    app = FastAPI(title="rf-eval serve", docs_url=None, redoc_url=None, lifespan=_lifespan)
    logger = request_log or RequestLog()

    def arm_for(req: Parsed, path_spec: str | None) -> tuple[ServedArm, str]:
        fields, source = {}, "server"
        if path_spec:
            fields, source = parse_rf_arm(path_spec, backend.arm_fields), "path"
        if req.arm_fields is not None:
            fields, source = {**fields, **as_fields(req.arm_fields, backend.arm_fields)}, "body"
        return backend.arm(fields), source

    async def handle(request: Request, chat: bool, path_spec: str | None = None):
        started = time.perf_counter()
        record: dict[str, Any] = {"endpoint": request.url.path}
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        try:
            req = (protocol.parse_chat if chat else protocol.parse_completion)(body, backend)
            arm, source = arm_for(req, path_spec)
            for ids in req.prompts:
                backend.check_ids(ids)
                backend.check_length(len(ids), req.params.max_tokens)
        except ArmError as err:
            logger.write({**record, "status": 400, "error": str(err), "rf_arm": body.get("rf_arm"), "path_arm": path_spec})
            return _error(400, str(err), "rf_arm")
        except RequestError as err:
            logger.write({**record, "status": 400, "error": str(err)})
            return _error(400, str(err), err.param)
        except ValueError as err:
            logger.write({**record, "status": 400, "error": str(err)})
            return _error(400, str(err), "prompt")
        except Exception as err:  # anything else the request's content made fail before any work: still its fault
            log.warning("bad request: %r", err)
            logger.write({**record, "status": 400, "error": repr(err)})
            return _error(400, f"the request could not be read: {err!r}")
        record.update(arm=arm.info, arm_source=source, stream=req.stream, ignored_fields=req.ignored or None)
        if chat and backend.chat_template is not None:  # how the messages were rendered, in brief
            record["chat_template"] = {k: backend.chat_template[k] for k in ("enable_thinking", "template_sha256")}
        rid = protocol.new_id(chat)
        model = req.model or backend.served_name
        if req.stream:
            cancel = threading.Event()
            return _Stream(_stream(backend, logger, req, arm, rid, model, record, started, cancel), cancel,
                           media_type="text/event-stream")
        try:
            return JSONResponse(await run_in_threadpool(_complete, backend, logger, req, arm, rid, model, record, started))
        except Exception as err:  # the server keeps serving; the log and the client get the reason
            log.exception("request failed")
            logger.write({**record, "status": 500, "error": repr(err)})
            return _error(500, f"internal error: {err!r}", kind="server_error")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    @app.post("/arm/{spec}/v1/completions")
    async def arm_completions(spec: str, request: Request):
        return await handle(request, chat=False, path_spec=spec)

    @app.post("/arm/{spec}/v1/chat/completions")
    async def arm_chat_completions(spec: str, request: Request):
        return await handle(request, chat=True, path_spec=spec)

    @app.get("/v1/models")
    @app.get("/arm/{spec}/v1/models")
    async def models(spec: str | None = None):
        entry = {"id": backend.served_name, "object": "model", "created": 0, "owned_by": "rf-eval",
                 "max_model_len": backend.max_length}
        return {"object": "list", "data": [entry]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/rf/info")
    async def info():
        return {"model": backend.settings.pretrained, "method": backend.lm.method.name,
                "served_name": backend.served_name, "layers": backend.n_layers,
                "max_model_len": backend.max_length, "default_arm": backend.default_arm.info,
                "arm_fields": list(backend.arm_fields), "maps": backend.settings.source.files.get("maps"),
                "rf_chat_template": backend.chat_template, "scheduler": backend.scheduler.state()}

    async def json_body(request: Request) -> Any:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await json_body(request)
        text = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(text, str):
            return _error(400, "tokenize needs {'prompt': string}", "prompt")
        if body.get("add_special_tokens", True):
            tokens = backend.encode(text)
        else:
            tokens = backend.tokenizer(text, add_special_tokens=False)["input_ids"]
        return {"tokens": tokens, "count": len(tokens), "max_model_len": backend.max_length}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await json_body(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not protocol._is_tokens(tokens) and tokens != []:
            return _error(400, "detokenize needs {'tokens': [int, ...]}", "tokens")
        try:
            backend.check_ids(tokens)
        except ValueError as err:
            return _error(400, str(err), "tokens")
        return {"prompt": backend.decode(tokens, skip_special_tokens=False)}

    return app


def _rf(backend: Backend, req: Parsed, arm: ServedArm, n_prompt: int, timings: dict[str, float], batch: Any = None
        ) -> dict[str, Any]:
    out = {"rf_arm": arm.info, "rf_timings": {**timings, "prompt_tokens": n_prompt, **backend.ceilings(arm, n_prompt)},
           "rf_batch": batch}
    return {**out, "rf_chat_template": backend.chat_template} if req.chat else out


def _complete(backend: Backend, logger: RequestLog, req: Parsed, arm: ServedArm, rid: str, model: str,
              record: dict[str, Any], started: float) -> dict[str, Any]:
    choices, n_prompt, n_gen, timings, batches = [], 0, 0, {}, []
    for index, ids in enumerate(req.prompts):
        prompt_scores = None
        if req.echo and req.params.logprobs is not None:
            prompt_scores = backend.score_prompt(ids, arm, req.params.logprobs)
        gen = backend.generate(ids, arm, req.params)
        choices.append(protocol.choice(backend, req, index, gen, prompt_scores))
        n_prompt, n_gen = n_prompt + len(ids), n_gen + len(gen.tokens)
        timings = {k: timings.get(k, 0.0) + v for k, v in gen.timings.items()}
        batches.append(gen.batch)
    rf = _rf(backend, req, arm, n_prompt, timings, batches)
    logger.write({**record, "status": 200, "prompt_tokens": n_prompt, "completion_tokens": n_gen,
                  **timings, "batch": batches, "wall_seconds": time.perf_counter() - started})
    return protocol.response(req, rid, model, choices, protocol.usage(n_prompt, n_gen, timings.get("prompt_seconds")), rf)


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


def _stream(backend: Backend, logger: RequestLog, req: Parsed, arm: ServedArm, rid: str, model: str,
            record: dict[str, Any], started: float, cancel: threading.Event) -> Iterator[str]:
    """The request queued now (in arrival order, before its response starts), and the generator of its events."""
    ids = req.prompts[0]
    events: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            events.put(("done", backend.generate(ids, arm, req.params, on_token=lambda t: events.put(("token", t)),
                                                 cancel=cancel)))
        except Cancelled:  # the client went away while the request queued
            events.put(("cancelled", None))
        except Exception as err:  # reported to the client as an error event
            events.put(("error", err))

    threading.Thread(target=work, name=f"rf-eval-{rid}", daemon=True).start()
    return _stream_events(backend, logger, req, arm, rid, model, record, started, cancel, events)


def _stream_events(backend: Backend, logger: RequestLog, req: Parsed, arm: ServedArm, rid: str, model: str,
                   record: dict[str, Any], started: float, cancel: threading.Event,
                   events: queue.Queue) -> Iterator[str]:
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
                logger.write({**record, "status": 500, "error": repr(value)})
                yield _sse({"error": {"message": f"internal error: {value!r}", "type": "server_error"}})
                break
            gen: Generation = value
            delta = gen.text[len(sent):] if gen.text.startswith(sent) else ""
            rf = _rf(backend, req, arm, len(ids), gen.timings, gen.batch)
            if not tokens:
                yield _sse(protocol.chunk(req, rid, model, "", first=True))
            yield _sse(protocol.chunk(req, rid, model, delta, finish=gen.finish_reason, extra=rf))
            use = protocol.usage(len(ids), len(gen.tokens), gen.timings.get("prompt_seconds"))
            if req.include_usage:
                yield _sse({"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
                            "created": int(time.time()), "model": model, "choices": [], "usage": use})
            logger.write({**record, "status": 200, "prompt_tokens": len(ids), "completion_tokens": len(gen.tokens),
                          **gen.timings, "batch": gen.batch, "wall_seconds": time.perf_counter() - started})
            break
        finished = True
        yield "data: [DONE]\n\n"
    finally:
        cancel.set()
        if not finished:  # the client went away (queued, or mid-stream): say so (the log would otherwise hold nothing)
            log.warning("stream %s dropped by the client after %d tokens", rid, len(tokens))
            logger.write({**record, "status": 499, "error": "client disconnected mid-stream" if tokens else
                          "client disconnected before the first token",
                          "completion_tokens": len(tokens), "wall_seconds": time.perf_counter() - started})
