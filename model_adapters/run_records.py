"""What a `PrefillLM` run records beside its arm, each kept by a small collaborator the adapter calls, so the
adapter itself holds only request plumbing:

- `ledger_head()`: the head of `$RF_EVAL_LEDGER` the run started from (read and verified before any weights
  load), recorded as `config.rf_eval.ledger` (`rf-eval report --ledger` checks it).
- `ChatRendering`: the chat-template arguments prompts render with, by `rf_eval.harness.chat`'s rule (thinking off
  by default where the template has a switch: RidgeFill paper section 3.2, appendix E; a thinking setting
  the template cannot render refused), and their record.
- `measure_engine_floor`: the partial path with every row exact against the stock model on a seeded probe
  prompt (RidgeFill paper sections 4.3, 9), recorded as `config.rf_eval.engine_floor` with `reference=exact`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from rf_eval.engine import engine_floor
from rf_eval.harness import chat
from rf_eval.methods.source import REMOTE_KEYS
from rf_eval.model_adapters.config import ModelArgsError
from rf_eval.stats.ledger import LedgerError, ledger_from_env

log = logging.getLogger(__name__)

#: tokens of the probe prompt the engine floor is measured on (seeded ids, `measure_engine_floor`)
FLOOR_PROBE_TOKENS = 64


def ledger_head() -> Any:
    """The head of `$RF_EVAL_LEDGER` (None without one); a ModelArgsError naming a bad ledger."""
    try:
        return ledger_from_env()
    except LedgerError as err:
        raise ModelArgsError(f"$RF_EVAL_LEDGER: {err}") from err


@dataclass(frozen=True)
class ChatRendering:
    """How chat prompts render: `args` (HFLM's `chat_template_args`), and whether thinking was switched off
    because the run left it unset (`thinking_default`)."""

    tokenizer: Any
    args: dict[str, Any]
    thinking_default: bool

    @classmethod
    def for_run(cls, hf_args: dict[str, Any], tokenizer: Any) -> ChatRendering:
        """The run's rendering; a thinking setting its template cannot render is refused (`rf_eval.harness.chat`; the
        model_args check has refused it before the weights loaded wherever the tokenizer loads alone)."""
        chat.check_thinking(tokenizer, hf_args, getattr(tokenizer, "name_or_path", ""))
        args, off = chat.template_args(hf_args, getattr(tokenizer, "chat_template", None))
        if off:
            log.info("the chat template has an enable_thinking switch: rendering with enable_thinking=False "
                     "(the paper's protocols; pass enable_thinking=True to think)")
        return cls(tokenizer, args, off)

    def record(self) -> dict[str, Any] | None:
        """What chat prompts are rendered with (`rf_eval.harness.chat.record`)."""
        return chat.record(self.tokenizer, self.args, self.thinking_default)

    @staticmethod
    def check_before_load(pretrained: str, hf_args: dict[str, Any]) -> None:
        """A thinking setting (`enable_thinking`, or in `chat_template_args`) the checkpoint's chat template
        cannot render, refused before the weights load (`rf_eval.harness.chat.check_thinking`). Only a run that sets
        one pays for loading the tokenizer here; where it cannot load alone, `for_run` checks the one HFLM
        loads."""
        if chat.template_args(hf_args, None)[0].get(chat.THINKING) is None or not pretrained:
            return
        source = hf_args.get("tokenizer") if isinstance(hf_args.get("tokenizer"), str) else pretrained
        remote = {k: hf_args[k] for k in REMOTE_KEYS if hf_args.get(k) is not None}
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source, **remote)
        except Exception:  # noqa: BLE001 - HFLM loads it its own way, and `for_run` checks it then
            return
        chat.check_thinking(tokenizer, hf_args, source)


def measure_engine_floor(model: Any, exact: Any, split: int, max_length: int, device: Any) -> dict[str, Any]:
    """`rf_eval.engine.engine_floor` at `split` on a seeded probe prompt, run under the exact method's
    forward (a fill that replaced the forward pauses): `{bitwise, max_abs, kl, first_diff, why,
    filled_kernel: {...}, probe_tokens, split}`."""
    n = min(FLOOR_PROBE_TOKENS, int(max_length))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(model.config.vocab_size), (1, n), generator=gen).to(device)
    with exact.forward_context():
        floor = engine_floor(model, ids, split)
    log.info("engine floor (partial path, every row exact, %d tokens, split %d): %s", n, split, floor)
    return {**floor, "probe_tokens": n, "split": split}
