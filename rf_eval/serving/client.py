"""A small HTTP client for OpenAI-compatible servers (standard library only).

`Server(base_url)` accepts `http://host:port`, `.../v1`, `.../v1/completions`
or `.../v1/chat/completions` (and `/arm/<spec>` prefixes of `rf-eval serve`).
`stream_completion` measures the client-side time to first token: from just
before the request is sent to the arrival of the first streamed chunk that
carries a choice.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

_ENDPOINT_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/v1")


class ServerError(RuntimeError):
    """The server answered with an error status, or could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass
class StreamResult:
    ttft_seconds: float  # client side: request sent -> first chunk with a choice
    total_seconds: float
    text: str
    chunks: int
    last: dict[str, Any] = field(default_factory=dict)  # the chunk with finish_reason (rf_arm, rf_timings, ...)
    usage: dict[str, Any] | None = None
    started: float = 0.0  # time.perf_counter() when the request was about to be sent


class Server:
    def __init__(self, base_url: str, timeout: float = 600.0):
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL {base_url!r} is not an http(s) URL")
        path = parts.path.rstrip("/")
        for suffix in _ENDPOINT_SUFFIXES:
            if path.endswith(suffix):
                path = path[: -len(suffix)]
                break
        self.base_url = base_url
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = path
        self.root = path.split("/arm/", 1)[0]  # server-wide endpoints (tokenize) sit outside an arm prefix
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Server({self.base_url!r})"

    def _connect(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=self.timeout)

    def _send(self, method: str, path: str, body: dict | None,
              on_connect: Callable[[http.client.HTTPConnection], None] | None = None
              ) -> tuple[http.client.HTTPConnection, Any]:
        """`path` is under the URL's prefix; a path starting with `//` is under the server root. `on_connect`
        is handed the connection before the request is sent (another thread may then shut it)."""
        path = self.root + path[1:] if path.startswith("//") else self.prefix + path
        conn = self._connect()
        if on_connect is not None:
            on_connect(conn)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
        except OSError as err:
            conn.close()
            raise ServerError(f"{self.base_url}: cannot reach the server ({err})") from None
        if resp.status >= 400:
            text = resp.read().decode("utf-8", "replace")
            conn.close()
            try:
                message = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = text[:500]
            raise ServerError(f"{method} {path}: HTTP {resp.status}: {message}", resp.status)
        return conn, resp

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        conn, resp = self._send(method, path, body)
        try:
            return json.loads(resp.read())
        finally:
            conn.close()

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/completions", {**body, "stream": False})

    def stream_completion(self, body: dict[str, Any],
                          on_connect: Callable[[http.client.HTTPConnection], None] | None = None) -> StreamResult:
        start = time.perf_counter()
        conn, resp = self._send("POST", "/v1/completions", {**body, "stream": True}, on_connect)
        first: float | None = None
        text, chunks, last, usage = [], 0, {}, None
        try:
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                event = json.loads(payload)
                if "error" in event:
                    raise ServerError(f"{self.base_url}: stream error: {event['error'].get('message')}")
                choices = event.get("choices") or []
                if choices and first is None:
                    first = time.perf_counter()
                chunks += 1
                for c in choices:
                    text.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
                    if c.get("finish_reason") is not None:
                        last = event
                usage = event.get("usage") or usage
        finally:
            conn.close()
        end = time.perf_counter()
        if first is None:
            raise ServerError(f"{self.base_url}: the stream ended without a completion chunk")
        return StreamResult(first - start, end - start, "".join(text), chunks, last, usage, start)

    def tokenize(self, text: str) -> list[int] | None:
        """The server's tokens of `text` (`POST /tokenize`), or None if it has no such endpoint."""
        try:
            out = self.request("POST", "//tokenize", {"prompt": text, "add_special_tokens": True})
        except ServerError as err:
            if err.status in (404, 405):
                return None
            raise
        tokens = out.get("tokens") if isinstance(out, dict) else None
        return tokens if isinstance(tokens, list) else None
