"""lm-eval's `--batch_size` on a filled arm: prompts of one length share an engine call; no answer changes."""

from __future__ import annotations

import random

import pytest
from lm_eval.api.instance import Instance

from rf_eval.model_adapters import prefill_lm
from rf_eval.ridgefill import method as ridgefill_method

WORDS = "the quick brown fox jumps over the lazy dog while the river runs past the old stone house".split()
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def contexts() -> list[str]:
    """Four prompts of one length (the byte-level tiny tokenizer: shuffled words keep it), one longer, one shorter."""
    rng = random.Random(0)
    same = [" ".join(rng.sample(WORDS, len(WORDS))) for _ in range(4)]
    return [same[0], " ".join(WORDS * 2), *same[1:], " ".join(WORDS[:-2])]


def lm(path: str, batch_size: int, **args) -> prefill_lm.PrefillLM:
    return prefill_lm.ridgefill.create_from_arg_obj({"pretrained": path, "device": "cpu", "fill": "identity", "tail": 24,
                                            "batch_size": batch_size, **args})


def engine_calls(model: prefill_lm.PrefillLM, monkeypatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    original = ridgefill_method.prefill_arm

    def counted(model_, tokenizer, arm, ids, *args, **kwargs):
        if arm is model.method.arm:  # this adapter's engine calls, not another's
            calls.append(tuple(ids.shape))
        return original(model_, tokenizer, arm, ids, *args, **kwargs)

    monkeypatch.setattr(ridgefill_method, "prefill_arm", counted)
    return calls


def answers(model: prefill_lm.PrefillLM, kind: str) -> list:
    if kind == "loglikelihood":
        # one continuation per prompt: several would share a stock pass at batch 4 (a batch of their own)
        reqs = [Instance(kind, {}, (c, " and then"), 0) for c in contexts()]
        return model.loglikelihood(reqs)
    gen = {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}
    return model.generate_until([Instance(kind, {}, (c, gen), 0) for c in contexts()])


@pytest.mark.parametrize("kind", ["loglikelihood", "generate_until"])
def test_batch_size_prefills_equal_lengths_together_and_changes_no_answer(tiny_model_dir, kind, monkeypatch):
    path = tiny_model_dir("llama")
    one, four = lm(path, 1), lm(path, 4)
    calls = engine_calls(four, monkeypatch)
    assert answers(four, kind) == answers(one, kind)  # bitwise: the same floats, the same text
    lengths = [len(four.tok_encode(c)) - (kind == "generate_until") for c in contexts()]
    same = lengths[0]
    assert calls == [(1, max(lengths)), (4, same), (1, min(lengths))]  # longest first, the four together


def test_an_arm_with_a_selector_prefills_each_prompt_alone(tiny_model_dir, monkeypatch):
    path = tiny_model_dir("llama")
    model = lm(path, 4, selector="attention(share=0.1;layers=0)")
    calls = engine_calls(model, monkeypatch)
    answers(model, "loglikelihood")
    assert calls and all(shape[0] == 1 for shape in calls)
