"""The two hooks the server hands `generate`: a streamer that reports each new token as it is made, and a
stopping criterion that ends generation once the client has gone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from transformers import StoppingCriteria
from transformers.generation.streamers import BaseStreamer


class TokenStreamer(BaseStreamer):
    """Calls `on_token(id)` for every generated token (generate first puts the prompt: skipped)."""

    def __init__(self, on_token: Callable[[int], None] | None, first: Callable[[], None]):
        self.on_token, self.first, self.seen_prompt, self.count = on_token, first, False, 0

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        for token in value.reshape(-1).tolist():
            if self.count == 0:
                self.first()
            self.count += 1
            if self.on_token is not None:
                self.on_token(int(token))

    def end(self) -> None:
        pass


class ClientGone(StoppingCriteria):
    """A stopping criterion that ends generation when the client has gone."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor | bool:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)
