"""The requests of one load sweep or saturation burst in flight (`rf_eval.serving.load`).

Each request is streamed from its own thread, so an arrival never waits for an earlier response; each keeps a
record of its times (seconds from the start) and of what the server reported in its last chunk. Past the
deadline the requests still waiting are cut: their connections are shut, so `rf-eval serve` drops them from
its queue, and their records say so.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from rf_eval.serving.client import Server, ServerError

CUT_GRACE = 10.0  # seconds to wait for cut requests' threads to end after their connections are shut


class _Cut(Exception):
    """The sweep's deadline passed before this request was answered."""


class InFlight:
    """The requests of one sweep or burst in flight: their threads, connections and records."""

    def __init__(self, server: Server, body: dict[str, Any], n: int):
        self.server, self.body = server, body
        self.records: list[dict[str, Any]] = [{"index": i, "status": "unsent"} for i in range(n)]
        self.threads: list[threading.Thread] = []
        self.connections: dict[int, Any] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.start = time.perf_counter()

    def _connected(self, i: int, conn: Any) -> None:
        with self.lock:
            if self.stop.is_set():
                raise _Cut()
            self.connections[i] = conn

    def _one(self, i: int, go: threading.Event | None) -> None:
        rec = self.records[i]
        if go is not None:
            go.wait()
        rec["sent"] = time.perf_counter() - self.start
        try:
            result = self.server.stream_completion(self.body, on_connect=lambda conn: self._connected(i, conn))
        except (_Cut, ServerError, OSError, ValueError) as err:
            rec["status"] = "cut" if self.stop.is_set() else "failed"
            rec["error"] = "cut at the deadline" if isinstance(err, _Cut) else str(err)
            return
        finally:
            with self.lock:
                self.connections.pop(i, None)
        rec["sent"] = result.started - self.start
        rec["first_token"] = result.started + result.ttft_seconds - self.start
        rec["end"] = result.started + result.total_seconds - self.start
        rec["finished"] = bool(result.last)  # the chunk with finish_reason came (else cut after the first token)
        last = result.last or {}
        timings = last.get("rf_timings") or {}
        rec["server"] = {k: timings[k] for k in ("queue_seconds", "prefill_seconds", "prompt_seconds", "source_seconds")
                         if isinstance(timings.get(k), (int, float))} or None
        rec["batch"] = last.get("rf_batch") if isinstance(last.get("rf_batch"), dict) else None
        rec["status"] = "completed"

    def send(self, i: int, go: threading.Event | None = None) -> None:
        self.records[i]["status"] = "sending"
        thread = threading.Thread(target=self._one, args=(i, go), name=f"rf-eval-load-{i}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def wait(self, deadline: float) -> bool:
        """Join the threads until `deadline` (perf_counter); past it, cut the rest. True if anything was cut."""
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.perf_counter()))
        if not any(t.is_alive() for t in self.threads):
            return False
        self.stop.set()
        grace = time.perf_counter() + CUT_GRACE
        while any(t.is_alive() for t in self.threads) and time.perf_counter() < grace:
            with self.lock:
                socks = [getattr(c, "sock", None) for c in self.connections.values()]
            for sock in socks:
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            for thread in self.threads:
                thread.join(0.05)
        for rec in self.records:  # a thread that outlived the grace: still cut
            if rec["status"] == "sending":
                rec.update(status="cut", error="no answer after the deadline")
        return True
