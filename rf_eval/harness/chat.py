"""How rf-eval renders chat prompts: one rule shared by the lm-eval adapters and `rf-eval serve`.

A served arm pairs item by item with an adapter arm only if both turn the
same messages into the same prompt, so the rule lives here once and both
import it (`rf_eval.model_adapters.prefill_lm`, `rf_eval.serving.backend`).

The rule: lm-eval's `hf` (`HFLM`) arguments first, `chat_template_args` with
`enable_thinking` over it when given; then thinking off by default (RidgeFill
paper, section 3.2 and appendix E: the protocols run with thinking off): when
the chat template has an `enable_thinking` switch (Qwen3, Qwen3.5) and the
user set neither key, render with enable_thinking=False. A value the user
gives wins where it changes the prompt. Where it cannot (`check_thinking`: the
template renders the same prompt with enable_thinking True and False, or there
is no chat template), the run is refused with one line: `hf` would pass the
value on and render without it, and the run's model_args (which name its arm
in reports) would claim a thinking setting its prompts never had. The record's
`thinking_switch` is what the template rendered (`renders_thinking`), not
whether its text names the switch.

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

from rf_eval.errors import UserError

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


def renders_thinking(tokenizer: Any, args: dict[str, Any]) -> bool:
    """Whether the tokenizer's chat template renders `enable_thinking`: the example message rendered with it
    True and False differ (a template that cannot render the example: whether its text names the switch)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    try:
        return render(tokenizer, {**args, THINKING: True}, EXAMPLE) != render(tokenizer, {**args, THINKING: False}, EXAMPLE)
    except Exception:  # a template that needs other roles or arguments
        return template_has_thinking_switch(template)


def check_thinking(tokenizer: Any, hf_args: dict[str, Any], where: str = "") -> None:
    """A thinking setting the user gave (`enable_thinking`, or in `chat_template_args`) must change the prompts;
    a UserError when the chat template renders the same prompt either way, or there is none (see the module
    docstring). `where` names the checkpoint in the message."""
    args, _ = template_args(hf_args, None)
    given = args.get(THINKING)
    if given is None:
        return
    key = THINKING if hf_args.get(THINKING) is not None else f"chat_template_args {THINKING}"
    of = f" of {where}" if where else ""
    if not getattr(tokenizer, "chat_template", None):
        why = f"the tokenizer{of} has no chat template, so no prompt can carry it"
    elif not renders_thinking(tokenizer, args):
        why = (f"the chat template{of} renders the same prompt with {THINKING}=True and False (it has no thinking "
               "switch), so the run would be labelled with a thinking setting its prompts never had")
    else:
        return
    raise UserError(f"{key}={given!r}: {why}; leave {THINKING} out (think_end_token alone still strips the "
                    "thinking of a model that always thinks)")


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
    switch = renders_thinking(tokenizer, args)
    return {
        "thinking_switch": switch,  # what the template rendered, not whether its text names the switch
        "enable_thinking": args.get(THINKING) if switch else None,  # without the switch: the same either way
        "enable_thinking_default": thinking_default,
        "template_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "rendered_example": example,
        "rendered_sha256": hashlib.sha256(example.encode()).hexdigest(),
    }
