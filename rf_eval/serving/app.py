"""The FastAPI application of `rf-eval serve` (OpenAI-compatible; see `protocol` for the fields).

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both also under
`/arm/<spec>/v1/...`), `GET /v1/models`, `POST /tokenize`, `POST /detokenize`,
`GET /rf/info`, `GET /health`. Each response carries `rf_arm` (the arm that
ran: fill, split, tail, layers) and `rf_timings` (server seconds: queue,
prefill, prompt = to the first generated token, decode, total; and the
prompt's speedup ceilings, and `prefills_together`: whether a batch's prompts of
its length share one forward); `usage.prompt_time_ms` is the prompt time too.
Chat responses and `/rf/info` also carry `rf_chat_template`, the record
`--model ridgefill` keeps as `rf_eval.chat_template` (`rf_eval.harness.chat`), so a
served arm shows it rendered messages as the adapter arm it pairs with.
Streaming responses carry these in their last chunk. Every request is one
JSON line in the request log. This module reads and checks requests and wires
the routes; a checked request is answered, whole or streamed, and logged by
`rf_eval.serving.answer`.

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
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from rf_eval.serving import protocol
from rf_eval.serving.answer import Answer, RequestLog
from rf_eval.serving.arms import ArmError, as_fields, parse_rf_arm
from rf_eval.serving.backend import Backend, ServedArm
from rf_eval.serving.protocol import Parsed, RequestError

log = logging.getLogger(__name__)

WORKER_THREADS = 2048  # requests waiting for their batch at once (each holds a worker thread)


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


class _Routes:
    """The endpoints over one backend and one request log; `create_app` wires them to their paths."""

    def __init__(self, backend: Backend, logger: RequestLog):
        self.backend, self.logger = backend, logger

    def arm_for(self, req: Parsed, path_spec: str | None) -> tuple[ServedArm, str]:
        """The request's arm (the server's, then the URL prefix's fields, then the body's) and where it came from."""
        backend = self.backend
        fields, source = {}, "server"
        if path_spec:
            fields, source = parse_rf_arm(path_spec, backend.arm_fields), "path"
        if req.arm_fields is not None:
            fields, source = {**fields, **as_fields(req.arm_fields, backend.arm_fields)}, "body"
        return backend.arm(fields), source

    async def handle(self, request: Request, chat: bool, path_spec: str | None = None) -> Response:
        """A completion or chat completion request: read, checked, then answered whole or streamed."""
        backend, logger = self.backend, self.logger
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
            arm, source = self.arm_for(req, path_spec)
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
        answer = Answer(backend, logger, req, arm, protocol.new_id(chat), req.model or backend.served_name, record,
                         started)
        if req.stream:
            cancel = threading.Event()
            return _Stream(answer.stream(cancel), cancel, media_type="text/event-stream")
        try:
            return JSONResponse(await run_in_threadpool(answer.complete))
        except Exception as err:  # the server keeps serving; the log and the client get the reason
            log.exception("request failed")
            logger.write({**record, "status": 500, "error": repr(err)})
            return _error(500, f"internal error: {err!r}", kind="server_error")

    async def completions(self, request: Request) -> Response:
        """`POST /v1/completions`."""
        return await self.handle(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        """`POST /v1/chat/completions`."""
        return await self.handle(request, chat=True)

    async def arm_completions(self, spec: str, request: Request) -> Response:
        """`POST /arm/<spec>/v1/completions`: the arm from the URL prefix."""
        return await self.handle(request, chat=False, path_spec=spec)

    async def arm_chat_completions(self, spec: str, request: Request) -> Response:
        """`POST /arm/<spec>/v1/chat/completions`: the arm from the URL prefix."""
        return await self.handle(request, chat=True, path_spec=spec)

    async def models(self, spec: str | None = None) -> dict[str, Any]:
        """`GET /v1/models`: the one served model."""
        entry = {"id": self.backend.served_name, "object": "model", "created": 0, "owned_by": "rf-eval",
                 "max_model_len": self.backend.max_length}
        return {"object": "list", "data": [entry]}

    async def health(self) -> dict[str, Any]:
        """`GET /health`."""
        return {"status": "ok"}

    async def info(self) -> dict[str, Any]:
        """`GET /rf/info`: the model, its method, the default arm, the arm fields and the scheduler's state."""
        backend = self.backend
        return {"model": backend.settings.pretrained, "method": backend.lm.method.name,
                "served_name": backend.served_name, "layers": backend.n_layers,
                "max_model_len": backend.max_length, "default_arm": backend.default_arm.info,
                "arm_fields": list(backend.arm_fields), "maps": backend.settings.source.files.get("maps"),
                "rf_chat_template": backend.chat_template, "scheduler": backend.scheduler.state()}

    async def tokenize(self, request: Request) -> Any:
        """`POST /tokenize`: a prompt's token ids."""
        body = await _json_body(request)
        text = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(text, str):
            return _error(400, "tokenize needs {'prompt': string}", "prompt")
        if body.get("add_special_tokens", True):
            tokens = self.backend.encode(text)
        else:
            tokens = self.backend.tokenizer(text, add_special_tokens=False)["input_ids"]
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.backend.max_length}

    async def detokenize(self, request: Request) -> Any:
        """`POST /detokenize`: token ids' text."""
        body = await _json_body(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not protocol._is_tokens(tokens) and tokens != []:
            return _error(400, "detokenize needs {'tokens': [int, ...]}", "tokens")
        try:
            self.backend.check_ids(tokens)
        except ValueError as err:
            return _error(400, str(err), "tokens")
        return {"prompt": self.backend.decode(tokens, skip_special_tokens=False)}


async def _json_body(request: Request) -> Any:
    """The request's JSON body; None if it is not JSON."""
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def create_app(backend: Backend, request_log: RequestLog | None = None) -> FastAPI:
    """The app of `rf-eval serve` over `backend`, each request logged to `request_log` (none: not logged)."""
    app = FastAPI(title="rf-eval serve", docs_url=None, redoc_url=None, lifespan=_lifespan)
    routes = _Routes(backend, request_log or RequestLog())
    for method, path, endpoint in (  # response_model=None: a return annotation is no response model
        ("POST", "/v1/completions", routes.completions), ("POST", "/v1/chat/completions", routes.chat_completions),
        ("POST", "/arm/{spec}/v1/completions", routes.arm_completions),
        ("POST", "/arm/{spec}/v1/chat/completions", routes.arm_chat_completions),
        ("GET", "/arm/{spec}/v1/models", routes.models), ("GET", "/v1/models", routes.models),
        ("GET", "/health", routes.health), ("GET", "/rf/info", routes.info),
        ("POST", "/tokenize", routes.tokenize), ("POST", "/detokenize", routes.detokenize),
    ):
        app.add_api_route(path, endpoint, methods=[method], response_model=None)
    return app
