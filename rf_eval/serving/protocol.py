"""OpenAI-compatible request bodies in, response objects out (completions and chat completions).

Supported: `prompt` as a string, a token list, or a list of either (one
choice per prompt); `messages` (rendered with the model's chat template);
`max_tokens` (`max_completion_tokens` for chat), `temperature`, `top_p`,
`top_k`, `stop`, `seed`, `logprobs` (completions: top-k count; chat:
`logprobs` + `top_logprobs`), `echo` (completions: the prompt's own token
log-probabilities, as lm-eval's loglikelihood requests need), `stream`
(one prompt, no logprobs) with `stream_options.include_usage`,
`return_token_ids` (vLLM's: the prompt's and the generation's token ids in
the response, not streamed; for chat, the rendered prompt's, to check that
it is the one `--model ridgefill` would see), and the rf-eval field
`rf_arm`. Other fields are ignored and listed in the request log.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rf_eval.serving.backend import Backend
from rf_eval.serving.generation import Generation, GenParams
from rf_eval.serving.scoring import TokenScore

MAX_LOGPROBS = 20
KNOWN = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
         "stop", "seed", "logprobs", "top_logprobs", "echo", "stream", "stream_options", "n", "rf_arm", "user",
         "return_tokens_as_token_ids", "return_token_ids"}


class RequestError(ValueError):
    """A bad request body: HTTP 400 naming the parameter."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Parsed:
    chat: bool
    prompts: list[list[int]]
    prompt_texts: list[str]
    params: GenParams
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    arm_fields: Any = None
    model: str = ""
    ignored: list[str] = field(default_factory=list)
    token_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprob tokens as "token_id:<id>"
    return_ids: bool = False  # vLLM's return_token_ids: prompt and generated token ids in the response


def _number(body: dict, key: str, default: Any, kind: type, low: float | None = None,
            high: float | None = None) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise RequestError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}", key)
    if low is not None and value < low:
        raise RequestError(f"{key} must be >= {low}, got {value!r}", key)
    if high is not None and value > high:
        raise RequestError(f"{key} must be <= {high}, got {value!r}", key)
    return kind(value)


def _top_p(body: dict) -> float | None:
    """top_p, a probability mass in (0, 1] (OpenAI's and vLLM's range)."""
    value = _number(body, "top_p", None, float, 0, 1)
    if value is not None and value == 0:
        raise RequestError("top_p must be in (0, 1], got 0", "top_p")
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("stop must be a string or a list of strings", "stop")
    return tuple(s for s in stop if s)


def _common(body: dict, max_key: str, logprobs: int | None) -> tuple[GenParams, bool, bool]:
    if _number(body, "n", 1, int) != 1:
        raise RequestError("only n=1 is supported", "n")
    params = GenParams(
        max_tokens=_number(body, max_key, 16, int, 0),
        temperature=_number(body, "temperature", 1.0, float, 0),
        top_p=_top_p(body),
        top_k=_number(body, "top_k", None, int, -1),  # -1 or 0: no top-k cut (vLLM's -1, transformers' 0)
        stop=_stop(body),
        seed=_number(body, "seed", None, int),
        logprobs=logprobs,
    )
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    return params, stream, bool(isinstance(options, dict) and options.get("include_usage"))


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_completion(body: dict, backend: Backend) -> Parsed:
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_tokens(prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or not all(isinstance(p, str) or _is_tokens(p) for p in prompt):
        raise RequestError("prompt must be a string, a list of token ids, or a non-empty list of either", "prompt")
    logprobs = _number(body, "logprobs", None, int, 0)
    if logprobs is not None and logprobs > MAX_LOGPROBS:
        raise RequestError(f"logprobs must be <= {MAX_LOGPROBS}", "logprobs")
    params, stream, usage = _common(body, "max_tokens", logprobs)
    echo = bool(body.get("echo", False))
    if stream and (len(prompt) > 1 or logprobs is not None or echo):
        raise RequestError("stream supports one prompt without logprobs or echo", "stream")
    for p in prompt:
        if not isinstance(p, str):
            try:
                backend.check_ids(p)
            except ValueError as err:
                raise RequestError(str(err), "prompt") from None
    ids = [backend.encode(p) if isinstance(p, str) else list(p) for p in prompt]
    texts = [p if isinstance(p, str) else backend.decode(p, skip_special_tokens=False) for p in prompt]
    return Parsed(False, ids, texts, params, echo, stream, usage, body.get("rf_arm"), str(body.get("model") or ""),
                  sorted(set(body) - KNOWN), bool(body.get("return_tokens_as_token_ids")),
                  bool(body.get("return_token_ids")))


def parse_chat(body: dict, backend: Backend) -> Parsed:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    flat = [{**m, "content": _content_text(m.get("content"))} for m in messages]
    logprobs = None
    if body.get("logprobs"):
        logprobs = _number(body, "top_logprobs", 0, int, 0)
        if logprobs > MAX_LOGPROBS:
            raise RequestError(f"top_logprobs must be <= {MAX_LOGPROBS}", "top_logprobs")
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    params, stream, usage = _common(body, max_key, logprobs)
    if stream and logprobs is not None:
        raise RequestError("stream with logprobs is not supported", "stream")
    text = backend.render_chat(flat)
    return Parsed(True, [backend.encode(text)], [text], params, False, stream, usage, body.get("rf_arm"),
                  str(body.get("model") or ""), sorted(set(body) - KNOWN), bool(body.get("return_tokens_as_token_ids")),
                  bool(body.get("return_token_ids")))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) == len(content):
            return "".join(parts)
    raise RequestError("message content must be a string or a list of text parts", "messages")


# ---- responses


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def _namer(backend: Backend, token_ids: bool):
    return (lambda t: f"token_id:{t}") if token_ids else backend.token_text


def _top_dict(name, score: TokenScore) -> dict[str, float] | None:
    if score.logprob is None:
        return None
    out: dict[str, float] = {}
    for token, lp in score.top:
        out.setdefault(name(token), lp)
    return out


def completion_logprobs(backend: Backend, scores: list[TokenScore], token_ids: bool = False) -> dict[str, Any]:
    """The legacy completions `logprobs` object: tokens, token_logprobs, top_logprobs, text_offset."""
    name = _namer(backend, token_ids)
    tokens = [name(s.token) for s in scores]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [s.logprob for s in scores],
        "top_logprobs": [_top_dict(name, s) for s in scores],
        "text_offset": offsets,
    }


def chat_logprobs(backend: Backend, scores: list[TokenScore], token_ids: bool = False) -> dict[str, Any]:
    name = _namer(backend, token_ids)

    def entry(token: int, lp: float | None) -> dict[str, Any]:
        text = name(token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**entry(s.token, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top]}
                        for s in scores]}


def choice(backend: Backend, req: Parsed, index: int, gen: Generation,
           prompt_scores: list[TokenScore] | None = None) -> dict[str, Any]:
    ids = {"token_ids": gen.tokens} if req.return_ids else {}
    if req.chat:
        return {"index": index, "message": {"role": "assistant", "content": gen.text},
                "logprobs": chat_logprobs(backend, gen.scores, req.token_ids) if gen.scores is not None else None,
                "finish_reason": gen.finish_reason, **ids}
    text = gen.text
    logprobs = None
    if req.echo:
        text = req.prompt_texts[index] + text
    if gen.scores is not None or prompt_scores is not None:
        logprobs = completion_logprobs(backend, (prompt_scores or []) + (gen.scores or []), req.token_ids)
    if req.return_ids:
        ids = {"prompt_token_ids": req.prompts[index], **ids}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": gen.finish_reason, **ids}


def response(req: Parsed, rid: str, model: str, choices: list[dict], usage: dict, rf: dict) -> dict[str, Any]:
    ids = {"prompt_token_ids": req.prompts[0]} if req.chat and req.return_ids else {}  # vLLM: chat's at the top
    return {"id": rid, "object": "chat.completion" if req.chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage, **ids, **rf}


def chunk(req: Parsed, rid: str, model: str, delta: str | None, finish: str | None = None,
          first: bool = False, extra: dict | None = None) -> dict[str, Any]:
    if req.chat:
        d: dict[str, Any] = {"role": "assistant", "content": delta or ""} if first else {}
        if delta and not first:
            d["content"] = delta
        body = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
    else:
        body = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [body], **(extra or {})}


def usage(prompt_tokens: int, completion_tokens: int, prompt_seconds: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if prompt_seconds is not None:
        out["prompt_time_ms"] = 1000.0 * prompt_seconds
    return out
