"""Prefill seconds as a run records them: the device synchronised on CUDA, wall-clock time on a CPU.

`Stopwatch` times a step of the engine's (a method's prefill); `FirstForward`
times the first forward call of the stock model inside a block, which is the
prefill of a plain prompt that `model.generate` runs itself, with hooks that
leave the computation as it is. Neither makes a timing comparable across
machines: a report compares an arm's seconds with its reference's from the same
kind of run (`rf_eval.stats.speed`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["FirstForward", "Stopwatch", "timer_label"]


def timer_label(device: torch.device | str) -> str:
    """What a run's prefill seconds are, for its provenance."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "seconds with the CUDA device synchronised before and after each prefill"
    return f"wall-clock seconds on the {kind.upper()} (a shared machine's timings are noisy)"


class Stopwatch:
    """Seconds of one step on `device`: the device is synchronised before the start and after the stop, so a
    CUDA step is timed to its end, not to its launch."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.seconds: float | None = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __enter__(self) -> Stopwatch:
        self._sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._start


class FirstForward(Stopwatch):
    """Seconds of a model's first forward call inside the block: the prefill of `model.generate` over a whole
    prompt (the stock path of a plain prompt), timed by hooks that leave the computation as it is."""

    def __init__(self, model: torch.nn.Module, device: torch.device | str):
        super().__init__(device)
        self.model = model

    def __enter__(self) -> FirstForward:
        def start(*_: Any) -> None:
            if self.seconds is None and not hasattr(self, "_start"):
                Stopwatch.__enter__(self)

        def stop(*_: Any) -> None:
            if self.seconds is None and hasattr(self, "_start"):
                Stopwatch.__exit__(self)

        self._hooks = [self.model.register_forward_pre_hook(start), self.model.register_forward_hook(stop)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for hook in self._hooks:
            hook.remove()
