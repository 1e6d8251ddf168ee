"""Request types the rf-eval tasks add to every lm-eval model (`lm_eval.api.model.LM`).

lm-eval's evaluator sends each request type to `getattr(lm, request_type)`.

- `two_pass_generate` (LongBench v2 CoT, paper section 4.6): two dependent
  generations per item, built on the model's own `generate_until`, so any
  lm-eval model runs it (`hf`, `ridgefill`, ...). A model may define its own.
- `token_logprobs`, `multiturn_generate`: defined by rf-eval's adapter; a run
  of another model that needs them is refused before the model loads
  (`adapter_only_problems`), and they raise an error that says so, instead of
  an AttributeError from deep inside the evaluator, where a model is called directly.

`install()` adds only what the base class lacks; model classes override it.
"""

from __future__ import annotations

from typing import Any

#: the request types only rf-eval's models serve, and the tasks that send them
ADAPTER_TYPES = {
    "token_logprobs": ("keytoken_nll", "decode_agreement"),
    "multiturn_generate": ("ruler_second_question",),
}
ADAPTER_MODELS = "--model ridgefill, rarecache, drop or prefill"


def adapter_only_problems(tasks: list[str], model: str) -> list[str]:
    """One line per task of `tasks` that lm-eval model `model` (not rf-eval's) cannot serve: refused before the
    model loads (`rf_eval.tasks.data_needs`), not after, in the evaluator, as a traceback."""
    return [f"{task} sends `{kind}` requests, which --model {model} does not serve: run it with {ADAPTER_MODELS}"
            for kind, senders in ADAPTER_TYPES.items() for task in tasks if task in senders]


def two_pass_generate(self: Any, requests: list) -> list[dict[str, Any]]:
    """Request type `two_pass_generate`: args (context, gen_kwargs, pass-2 template, pass-2
    gen_kwargs, options{chat, seeds}). Pass 2's prompt is the template with the pass-1 answer
    (stripped) in `$COT$`, chat-formatted like pass 1 when `chat` (one user turn; no system
    instruction, as the official script sends none). One request at a time, each
    generation seeded from `seeds`: in-process models through torch's generator, API models
    (lm-eval's `TemplateAPI`: local-completions, vLLM or rf-eval servers) through the
    request's `seed` field, which otherwise carries lm-eval's one fixed seed for every item.
    Returns {"cot", "response", "prompt_2"} per request."""
    import torch
    from lm_eval.api.instance import Instance

    def generate(req: Any, context: str, gen_kwargs: dict, seed: int | None) -> str:
        if seed is not None:
            torch.manual_seed(seed)
            if _is_api_model(self):
                gen_kwargs = {**gen_kwargs, "seed": seed}  # the payload's own seed field, per item and pass
        inst = Instance("generate_until", req.doc, (context, gen_kwargs), 0, req.metadata)
        try:
            return self.generate_until([inst], disable_tqdm=True)[0]
        except TypeError:  # a model whose generate_until takes no disable_tqdm
            return self.generate_until([inst])[0]

    out = []
    for req in requests:
        context, gen1, template2, gen2, opts = req.args
        seeds = opts.get("seeds") or [None, None]
        cot = generate(req, context, gen1, seeds[0])
        text2 = template2.replace("$COT$", cot.strip())
        prompt2 = (
            self.apply_chat_template([{"role": "user", "content": text2}], add_generation_prompt=True)
            if opts.get("chat") else text2
        )
        response = generate(req, prompt2, gen2, seeds[1])
        out.append({"cot": cot, "response": response, "prompt_2": prompt2})
    return out


def _is_api_model(lm: Any) -> bool:
    try:
        from lm_eval.models.api_models import TemplateAPI
    except ImportError:  # an lm-eval without API models
        return False
    return isinstance(lm, TemplateAPI)


def _adapter_only(name: str, tasks: tuple[str, ...]):
    def method(self: Any, requests: list) -> list:
        raise NotImplementedError(
            f"{' and '.join(tasks)} send `{name}` requests, which lm-eval model `{type(self).__name__}` does not "
            f"serve: run them with {ADAPTER_MODELS}"
        )

    method.__name__ = name
    return method


def install() -> None:
    """Give lm-eval's `LM` base class the request types it lacks (idempotent)."""
    from lm_eval.api.model import LM

    if not hasattr(LM, "two_pass_generate"):
        LM.two_pass_generate = two_pass_generate
    for name, task in ADAPTER_TYPES.items():
        if not hasattr(LM, name):
            setattr(LM, name, _adapter_only(name, task))
