"""The paper's equivalence check across servers (section 4.3): identical greedy outputs and top-k
log-probabilities on the same prompts, e.g. a fork with its fill switched off against stock.

Each prompt goes to every server as a non-streaming completion (temperature
0, `max_tokens`, `logprobs=k`, `seed` 0, tokens named by id where the server
supports vLLM's `return_tokens_as_token_ids`). Two answers agree when the
text, finish reason, generated tokens, their log-probabilities and the top-k
log-probabilities at every step are identical (floats compared exactly).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from rf_eval.serving.client import Server

_WORDS = (
    "harbor ledger signal copper meadow lantern orchard window candle thunder bridge canvas marble tunnel compass "
    "willow engine fabric valley mirror basket anchor summit river stone garden pocket shadow"
).split()


def default_prompts() -> list[str]:
    """Three project-written prompts of about 300, 1,200 and 3,000 characters (deterministic)."""
    out = []
    for seed, n_words in ((1, 50), (2, 200), (3, 500)):
        rng = random.Random(seed)
        words = [rng.choice(_WORDS) for _ in range(n_words)]
        out.append("Notes from the survey. " + " ".join(words) + "\nSummary:")
    return out


def load_prompts(path: str | Path) -> list[str | list[int]]:
    """Prompts from a file: .jsonl (one JSON string, token list or {"prompt": ...} per line), .json (a list
    of those), anything else one prompt (the whole file)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    elif path.suffix == ".json":
        items = json.loads(text)
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a JSON list of prompts")
    else:
        return [text]
    prompts: list[str | list[int]] = []
    for i, item in enumerate(items):
        value = item.get("prompt") if isinstance(item, dict) else item
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(t, int) for t in value)):
            prompts.append(value)
        else:
            raise ValueError(f"{path}: prompt {i} is not a string or a token list")
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def answer(server: Server, prompt: str | list[int], max_tokens: int, top_k: int, arm: dict | None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": top_k,
                            "seed": 0, "return_tokens_as_token_ids": True}
    if arm is not None:
        body["rf_arm"] = arm
    out = server.completion(body)
    choice = out["choices"][0]
    logprobs = choice.get("logprobs") or {}
    return {"text": choice.get("text"), "finish_reason": choice.get("finish_reason"),
            "tokens": logprobs.get("tokens"), "token_logprobs": logprobs.get("token_logprobs"),
            "top_logprobs": logprobs.get("top_logprobs"), "rf_arm": out.get("rf_arm")}


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """None when two answers agree; else where they first differ."""
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        xs, ys = a.get(key) or [], b.get(key) or []
        for step, (x, y) in enumerate(zip(xs, ys)):
            if x != y:
                return f"{key} differ at generated token {step}: {_short(x)} vs {_short(y)}"
        if len(xs) != len(ys):
            return f"{key}: {len(xs)} vs {len(ys)} entries"
    if a.get("text") != b.get("text"):
        return f"text differs: {_short(a.get('text'))} vs {_short(b.get('text'))}"
    if a.get("finish_reason") != b.get("finish_reason"):
        return f"finish_reason differs: {a.get('finish_reason')} vs {b.get('finish_reason')}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 160 else text[:157] + "..."


def check(
    servers: list[Server],
    prompts: list[str | list[int]],
    max_tokens: int = 16,
    top_k: int = 10,
    arms: list[dict | None] | None = None,
    echo=print,
) -> int:
    """Compare every server with the first on every prompt; the count of prompts that differ."""
    arms = arms or [None] * len(servers)
    failures = 0
    for index, prompt in enumerate(prompts):
        answers = [answer(s, prompt, max_tokens, top_k, arm) for s, arm in zip(servers, arms)]
        size = f"{len(prompt)} {'tokens' if isinstance(prompt, list) else 'chars'}"
        diffs = [(s, first_difference(answers[0], a)) for s, a in zip(servers[1:], answers[1:])]
        bad = [(s, d) for s, d in diffs if d is not None]
        failures += bool(bad)
        if not bad:
            echo(f"OK   prompt {index} ({size}): {max_tokens} greedy tokens and top-{top_k} log-probabilities identical")
        for s, d in bad:
            echo(f"FAIL prompt {index} ({size}): {servers[0].base_url} vs {s.base_url}: {d}")
    return failures
