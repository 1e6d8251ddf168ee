"""Start and stop `rf-eval serve` subprocesses on loopback for the serving tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warm_start import popen_argv

START_TIMEOUT = 360.0  # seconds: a cold start imports torch, transformers and lm-eval on a busy 2-core machine (the
# floors run it at nice 15 beside the main suite: one start there took 189 s)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_punkt(root: Path) -> Path:
    """An NLTK_DATA folder with an empty punkt_tab model, so lm-eval's RULER import does not try the network."""
    lang = root / "tokenizers" / "punkt_tab" / "english"
    lang.mkdir(parents=True, exist_ok=True)
    for name in ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab"):
        (lang / name).touch()
    return root


def child_env(nltk_data: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", NLTK_DATA=str(nltk_data))
    return env


@dataclass
class Served:
    url: str
    proc: Any  # subprocess.Popen or warm_start.WarmProcess
    request_log: Path
    output: Path

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.request_log.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def start_server(model_dir: str, folder: Path, env: dict[str, str], *args: str) -> Served:
    """`rf-eval serve --model model_dir ARGS` on a free loopback port; returns once /health answers."""
    import pytest

    for module in ("fastapi", "uvicorn", "tenacity"):  # the `serve` extra (tenacity: lm-eval's API models)
        pytest.importorskip(module, reason="needs the serve extra: pip install -e '.[serve]'")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log, out = folder / f"requests_{port}.jsonl", folder / f"server_{port}.out"
    cmd = [sys.executable, "-m", "rf_eval", "serve", "--model", model_dir, "--host", "127.0.0.1", "--port", str(port),
           "--threads", "1", "--request-log", str(log), *args]
    proc = popen_argv(cmd, stdout=out, env=env)  # forked warm (tests/warm_start.py), its own process
    served = Served(f"http://127.0.0.1:{port}", proc, log, out)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rf-eval serve exited with {proc.returncode}:\n{out.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(served.url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return served
        except (urllib.error.URLError, OSError):
            time.sleep(0.25)
    served.stop()
    raise RuntimeError(f"rf-eval serve did not answer within {START_TIMEOUT:.0f}s:\n{out.read_text()[-3000:]}")


def post(url: str, body: dict, timeout: float = 120.0) -> tuple[int, dict]:
    """(status, JSON body) of a POST, error statuses included."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def post_stream(url: str, body: dict, timeout: float = 120.0) -> list[dict]:
    """The data events of a streamed POST (up to [DONE])."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            events.append(json.loads(payload))
    return events
