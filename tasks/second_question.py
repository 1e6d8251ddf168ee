"""`ruler_second_question`: a second question on a once-filled cache (paper appendix D).

The prompts are lm-eval's niah_multikey_1 samples (four keyed needles). The
first question is the sample's own; its answer is generated over the filled
prompt. A second question, for one of the other three keys (chosen by a
per-sample seed that depends on metadata `seed` and the sample only, so it is
the same on every model and arm), is appended after the first answer and runs
on the carried cache: no second prefill and no new row choice. This is the
adapter's `multiturn_generate` request type (`ridgefill`, `rarecache`).

Scores: `acc_strict` (the first seven-digit number in the reply is the
needle's value), `acc_ruler` (RULER's substring scorer), `acc_first` (RULER's
score of the first answer). `second_filled` records whether the second
needle lies in the filled region of the first prompt (tail from metadata
`tail`, default 4,096); `acc_strict_filled` / `acc_strict_tail` split the
strict score by it. With the adapter's `reference=exact`, `acc_strict_ref`
scores the exact arm's own two-turn run. `cap_hits` counts second answers that
hit `max_gen_toks` (`common.cap_hit`), `cap_hits_first` first answers.

Turn formatting: with `--apply_chat_template` the second turn is the chat
template's rendering of [answer, user question, assistant prefix] after the
answer, less the end-of-turn marker when it is the model's EOS string (the
first answer ends with that token, which the carried cache already holds).
Without a chat template the turn is a newline, the question and, under the
official protocol, the answer prefix.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from rf_eval.tasks import needles, prompts, request_types
from rf_eval.tasks.common import (
    CAP_METRICS,
    COST_METRICS,
    cost_fields,
    mean_present,
    option,
    sum_present,
    tokenizer_from,
)
from rf_eval.tasks.ruler_filled import RulerFilledTask, doc_key, ruler_score

BASE_TASK = "niah_multikey_1"  # the RULER task whose samples carry the four keyed needles
NEEDLE_RE = re.compile(r"One of the special magic \S+ for (.+?) is: (\d+)\.")
ANSWER_MARK = "\u2063RF_EVAL_ANSWER\u2063"


class Turns(list):
    """The `turns` argument of a `multiturn_generate` request: a list of strings that also
    encodes like one string, because lm-eval hashes a request's first argument as text when
    it logs samples (`prompt_hash`)."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return "".join(self).encode(encoding, errors)


def first_seven_digit(text: str) -> str | None:
    """The first run of exactly seven digits in `text`."""
    m = re.search(r"(?<!\d)\d{7}(?!\d)", text)
    return m.group(0) if m else None


def strict_score(reply: str, value: str) -> float:
    """Appendix D's rule: the first seven-digit number in the reply is the value."""
    return float(first_seven_digit(reply) == str(value))


def keyed_needles(text: str) -> list[tuple[str, str]]:
    """(key, value) of each needle sentence, in order of appearance."""
    return [(m.group(1), m.group(2)) for m in NEEDLE_RE.finditer(text)]


def query_key(doc: dict[str, Any]) -> str:
    """The first question's key: the needle whose value is the answer."""
    value = str(doc["outputs"][0])
    for key, v in keyed_needles(doc["input"]):
        if v == value:
            return key
    raise ValueError(f"sample {doc_key(doc)}: no needle holds the answer {value}")


def second_key(doc: dict[str, Any], seed: int) -> tuple[str, str]:
    """(key, value) of the second question: another key, drawn by a per-sample seed."""
    first = query_key(doc)
    others = [(k, v) for k, v in keyed_needles(doc["input"]) if k != first]
    if not others:
        raise ValueError(f"sample {doc_key(doc)} has no second key")
    rng = random.Random(f"{seed}:{int(doc['max_length'])}:{int(doc['index'])}")
    return rng.choice(others)


def second_turn_parts(doc: dict[str, Any], key2: str, value2: str, protocol: str) -> tuple[str, str | None]:
    """(user text, answer prefix or None) of the second question."""
    _, question = prompts.split_question(doc["input"])
    first = query_key(doc)
    return prompts.format_turn(
        "", question.replace(first, key2), doc["gen_prefix"].replace(first, key2), [value2], protocol
    )


def chat_turn(
    chat_template: Callable[..., str], first_user: str, first_prefix: str | None, user2: str,
    prefix2: str | None, eos: str | None,
) -> str:
    """The chat-rendered text that follows the first answer (see the module docstring)."""
    answer = (first_prefix + " " if first_prefix else "") + ANSWER_MARK
    history = [
        {"role": "user", "content": first_user},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": user2},
    ]
    if prefix2:
        history.append({"role": "assistant", "content": prefix2})
    rendered = chat_template(history, add_generation_prompt=not prefix2)
    tail = rendered[rendered.index(ANSWER_MARK) + len(ANSWER_MARK) :]
    if eos and tail.startswith(eos):
        tail = tail[len(eos) :]
    return tail


def plain_turn(user2: str, prefix2: str | None) -> str:
    return "\n" + user2 + (" " + prefix2 if prefix2 else "")


request_types.install()


class SecondQuestionTask(RulerFilledTask):
    """BASE_TASK (niah_multikey_1) with a second question asked of the carried cache."""

    def __init__(self, data_dir=None, cache_dir=None, download_mode=None, config: dict | None = None) -> None:
        cfg = dict(config or {})
        cfg["ruler_task"] = BASE_TASK
        self.seed = option(cfg.get("metadata"), "seed", 0, int)
        self._second: dict[tuple[int, int], dict[str, Any]] = {}
        super().__init__(config=cfg)

    def metric_spec(self) -> dict[str, tuple[Any, bool]]:
        spec = {
            "acc_strict": (mean_present, True),
            "acc_ruler": (mean_present, True),
            "acc_first": (mean_present, True),
            "second_filled": (mean_present, True),
            "n_second_filled": (sum_present, True),
            "n_second_tail": (sum_present, True),
            "acc_strict_filled": (mean_present, True),
            "acc_strict_tail": (mean_present, True),
            "acc_ruler_filled": (mean_present, True),
            "acc_strict_ref": (mean_present, True),
            "cap_hits_first": (sum_present, False),
            **CAP_METRICS,
        }
        for length in self.lengths:
            spec[f"acc_strict_{length}"] = (mean_present, True)
        return {**spec, **COST_METRICS}

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any):
        from lm_eval.api.instance import Instance

        chat = kwargs.pop("chat_template", None)
        use_chat = bool(kwargs.pop("apply_chat_template", False)) and chat is not None
        key2, value2 = second_key(doc, self.seed)
        user2, prefix2 = second_turn_parts(doc, key2, value2, self.protocol)
        if use_chat:
            first_user, first_prefix = prompts.ruler_prompt(doc, self.protocol)
            eos = getattr(tokenizer_from(self.config.metadata), "eos_token", None)
            turn2 = chat_turn(chat, first_user, first_prefix, user2, prefix2, eos)
        else:
            turn2 = plain_turn(user2, prefix2)
        tokenizer = tokenizer_from(self.config.metadata)
        n, spans = needles.token_spans(tokenizer, ctx, needles.niah_spans(ctx, [value2]))
        self._second[doc_key(doc)] = {
            "key": key2, "value": value2, "mark": needles.NeedleMark(n, tuple(spans), self.tail),
        }
        self.mark_prompt(doc, ctx)
        turns = Turns([ctx, turn2])
        self._requests[doc_key(doc)] = turns  # the request's first argument: its cost record's key
        gen = dict(self.config.generation_kwargs or {})
        return Instance(request_type="multiturn_generate", doc=doc, arguments=(turns, gen), idx=0, **kwargs)

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        out = results[0]
        answers = out["answers"] if isinstance(out, dict) else list(out)
        key = doc_key(doc)
        if key not in self._second:
            for inst in self.instances or []:
                if doc_key(inst.doc) == key:
                    self.construct_requests(inst.doc, inst.arguments[0][0])
        info = self._second[key]
        value2, mark2 = info["value"], info["mark"]
        strict = strict_score(answers[1], value2)
        ruler = ruler_score(BASE_TASK, {"outputs": [value2]}, answers[1])
        filled = mark2.filled
        ref = out.get("exact_answers") if isinstance(out, dict) else None
        res = {
            "acc_strict": strict,
            "acc_ruler": ruler,
            "acc_first": ruler_score(BASE_TASK, doc, answers[0]),
            "second_filled": int(filled),
            "n_second_filled": int(filled),
            "n_second_tail": int(not filled),
            "acc_strict_filled": strict if filled else None,
            "acc_strict_tail": None if filled else strict,
            "acc_ruler_filled": ruler if filled else None,
            "acc_strict_ref": strict_score(ref[1], value2) if ref else None,
            "cap_hits": self.cap_hit(answers[1]),
            "cap_hits_first": self.cap_hit(answers[0]),
            **cost_fields(self._requests.get(key)),
        }
        for length in self.lengths:
            res[f"acc_strict_{length}"] = strict if length == int(doc["max_length"]) else None
        return res

