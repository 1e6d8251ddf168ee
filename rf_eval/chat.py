"""How rf-eval renders chat prompts: one rule shared by the lm-eval adapters and `rf-eval serve`.

A served arm pairs item by item with an adapter arm only if both turn the
same messages into the same prompt, so the rule lives here once and both
import it (`rf_eval.model_adapters.prefill_lm`, `rf_eval.serving.backend`).

The rule: lm-eval's `hf` (`HFLM`) arguments first, `chat_template_args` with
`enable_thinking` over it when given; then thinking off by default (RidgeFill
paper, section 3.2 and appendix E: the protocols run with thinking off): when
the chat template has an `enable_thinking` switch (Qwen3, Qwen3.5) and the
user set neither key, render with enable_thinking=False. A value the user
gives wins, and is passed on as given even to a template without the switch
(which then ignores it), as `hf` does; the record then says so
(`enable_thinking` null, `enable_thinking_ignored` the value given) instead
of recording a thinking setting the prompts never had.

Rendering itself is lm-eval's own `HFLM.apply_chat_template` (its
`continue_final_message` and system-role fallback included), so neither
side can drift from `--model hf`. `record` is what the results
(`rf_eval.chat_template`) and the server (`rf_chat_template`) report.
"""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any

THINKING = "enable_thinking"
EXAMPLE = [{"role": "user", "content": "Question?"}]  # the message every record renders


def template_has_thinking_switch(template: Any) -> bool:
    """True when a chat template (a string, or a dict of named templates) reads `enable_thinking`."""
    if isinstance(template, dict):
        return any(template_has_thinking_switch(t) for t in template.values())
    return isinstance(template, str) and THINKING in template


def template_args(hf_args: dict[str, Any], template: Any) -> tuple[dict[str, Any], bool]:
    """(the keyword arguments chat templates render with, True when thinking was switched off by default).

    `hf_args`: the `hf` model_args (`enable_thinking`, `chat_template_args`);
    `template`: the tokenizer's `chat_template`.
    """
    args = dict(hf_args.get("chat_template_args") or {})
    thinking = hf_args.get(THINKING)
    if thinking is not None:  # HFLM's own merge: enable_thinking over chat_template_args
        args[THINKING] = thinking
    if THINKING in args or not template_has_thinking_switch(template):
        return args, False
    return {**args, THINKING: False}, True


def render(tokenizer: Any, args: dict[str, Any], messages: list[dict[str, Any]],
           add_generation_prompt: bool = True) -> str:
    """`messages` as a prompt string, by lm-eval's `HFLM.apply_chat_template` with these template args."""
    from lm_eval.models.huggingface import HFLM

    # HFLM's method reads only `tokenizer` and `chat_template_args`: called on those, it is `hf`'s rendering
    shim = SimpleNamespace(tokenizer=tokenizer, chat_template_args=args)
    return HFLM.apply_chat_template(shim, messages, add_generation_prompt=add_generation_prompt)


def record(tokenizer: Any, args: dict[str, Any], thinking_default: bool) -> dict[str, Any] | None:
    """What chat prompts are rendered with: the switch, enable_thinking, hashes and an example (None: no template)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    text = json.dumps(template, sort_keys=True) if isinstance(template, dict) else str(template)
    try:
        example = render(tokenizer, args, EXAMPLE)
    except Exception as err:  # a template that needs other roles or arguments: record why
        example = f"(not rendered: {type(err).__name__})"
    switch, given = template_has_thinking_switch(template), args.get(THINKING)
    ignored = {"enable_thinking_ignored": given} if given is not None and not switch else {}
    return {
        "thinking_switch": switch,
        "enable_thinking": given if switch else None,  # a template without the switch renders the same either way
        **ignored,
        "enable_thinking_default": thinking_default,
        "template_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "rendered_example": example,
        "rendered_sha256": hashlib.sha256(example.encode()).hexdigest(),
    }
