"""RULER prompt protocols (paper section 3.2 and appendix E).

- `official`: RULER's own prompt; the answer prefix (lm-eval's `gen_prefix`) is
  prefilled after the chat template, as RULER's scripts do.
- `serving` (= `serving_llamacpp`): the serving deployments' protocol on
  Qwen3.8-27B: question and answer format in one user turn, nothing
  prefilled. RULER's question line is kept and an instruction appended:
  "Answer with the requested answer(s) in the form: [answer prefix] <answer(s)>."
- `serving_vllm`: the Flash-Next wording: the question line becomes
  "Answer the following question: [question]" followed by
  "In your answer, respond with the following format: [answer prefix]: <number>, ..."
  with one <number> per expected value. Where the expected values are not
  numbers (uuids, words, variable names) the placeholder is <answer>: the
  paper ran this wording on numeric needle tasks only.
"""

from __future__ import annotations

from typing import Any

PROTOCOLS = ("official", "serving", "serving_llamacpp", "serving_vllm")


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown RULER prompt protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    return "serving_llamacpp" if protocol == "serving" else protocol


def split_question(text: str) -> tuple[str, str]:
    """(everything before the question line, the question line) of a RULER input."""
    if "\n" not in text:
        return "", text
    head, question = text.rsplit("\n", 1)
    return head, question


def serving_instruction(gen_prefix: str, values: list[Any], wording: str) -> str:
    prefix = gen_prefix.strip()
    if wording == "serving_llamacpp":
        return f"Answer with the requested answer(s) in the form: {prefix} <answer(s)>."
    slot = "<number>" if values and all(str(v).isdigit() for v in values) else "<answer>"
    slots = ", ".join([slot] * max(1, len(values)))
    return f"In your answer, respond with the following format: {prefix.rstrip(':')}: {slots}"


def _join(a: str, b: str) -> str:
    return f"{a}\n{b}" if a else b


def format_turn(
    head: str, question: str, gen_prefix: str, values: list[Any], protocol: str
) -> tuple[str, str | None]:
    """(user text, answer prefix or None) of one question under `protocol`.

    `head` is what precedes the question line (the haystack; empty for a
    follow-up turn); `values` are the expected answers (they fix the count of
    placeholders in the `serving_vllm` format line).
    """
    wording = check_protocol(protocol)
    join = _join
    if wording == "official":
        return join(head, question), gen_prefix
    if wording == "serving_llamacpp":
        return join(join(head, question), serving_instruction(gen_prefix, values, wording)), None
    if question.startswith("Question: "):
        question = question[len("Question: ") :]
    body = join(head, f"Answer the following question: {question}")
    return join(body, serving_instruction(gen_prefix, values, wording)), None


def ruler_prompt(doc: dict[str, Any], protocol: str) -> tuple[str, str | None]:
    """(user text, answer prefix or None) of a RULER doc under `protocol`."""
    head, question = split_question(doc["input"])
    return format_turn(head, question, doc["gen_prefix"], list(doc["outputs"]), protocol)
