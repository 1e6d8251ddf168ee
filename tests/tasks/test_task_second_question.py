"""ruler_second_question: key choice, scoring, and the carried cache equal to a from-scratch prefill."""

from __future__ import annotations

import pytest
import torch

from rf_eval.tasks import second_question as sq

LENGTHS = [1024]


def meta(tiny_llama, task_data, **extra):
    return {"pretrained": tiny_llama, "max_seq_lengths": LENGTHS, "essay_haystack": str(task_data["essays"]),
            "tail": 300, **extra}


@pytest.mark.parametrize(
    "reply, ok",
    [
        ("The number is 1234567.", 1.0),
        ("1234567", 1.0),
        ("It is 12345678, or 1234567.", 1.0),  # an eight-digit run is not a seven-digit number
        ("First 7654321 then 1234567", 0.0),  # only the first seven-digit number counts
        ("1234566", 0.0),
        ("no number", 0.0),
    ],
)
def test_strict_score(reply, ok):
    assert sq.strict_score(reply, "1234567") == ok


def test_second_key_is_another_needle_and_seeded():
    text = "\n".join(
        f"One of the special magic numbers for key-{i} is: {1000000 + i}." for i in range(4)
    ) + "\nWhat is the special magic number for key-2 mentioned in the provided text?"
    doc = {"input": text, "outputs": ["1000002"], "max_length": 1024, "index": 7,
           "gen_prefix": "The special magic number for key-2 mentioned in the provided text is"}
    assert sq.keyed_needles(text)[2] == ("key-2", "1000002")
    picks = {sq.second_key(doc, seed=s) for s in range(20)}
    assert ("key-2", "1000002") not in picks and len(picks) > 1
    assert sq.second_key(doc, seed=3) == sq.second_key(dict(doc), seed=3)
    user2, prefix2 = sq.second_turn_parts(doc, "key-0", "1000000", "official")
    assert user2 == "What is the special magic number for key-0 mentioned in the provided text?"
    assert prefix2 == "The special magic number for key-0 mentioned in the provided text is"


def from_scratch(model, tokenizer, turns, max_new):
    """Greedy two-turn run with the plain model, each turn prefilled from scratch over the whole text: the
    answers, and whether each spent all `max_new` tokens without EOS (hit the length cap)."""
    eos = tokenizer.eos_token_id
    seq = tokenizer(turns[0], add_special_tokens=False)["input_ids"]
    answers, capped = [], []
    for i, turn in enumerate(turns):
        if i:
            seq = seq + tokenizer(turn, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([seq]), max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        new = out[0, len(seq):].tolist()
        seq = seq + new
        answers.append(tokenizer.decode(new, skip_special_tokens=True))
        capped.append(int(len(new) == max_new and eos not in new))
    return answers, capped


@pytest.mark.parametrize("chat", [False, True])
def test_carried_cache_equals_whole_conversation(chat, tiny_llama, task_data, th):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = th.ridgefill_class().create_from_arg_string(f"pretrained={tiny_llama},fill=exact,tail=64,device=cpu")
    task = th.load_task("ruler_second_question", meta(tiny_llama, task_data))
    task.set_fewshot_seed(0)
    gen = {"until": [], "max_gen_toks": 12, "do_sample": False}
    task.set_config("generation_kwargs", gen)
    task.build_all_requests(limit=2, apply_chat_template=chat, chat_template=lm.apply_chat_template if chat else None)
    reqs = task.instances
    assert {r.request_type for r in reqs} == {"multiturn_generate"}
    carried = lm.multiturn_generate(reqs)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    for req, got in zip(reqs, carried):
        turns = list(req.args[0])
        assert len(turns) == 2 and turns[0] == req.args[0][0]
        answers, capped = from_scratch(model, tokenizer, turns, 12)
        assert got["answers"] == answers
        if chat:  # the answer's EOS closes the assistant turn; the turn opens the next user message
            assert turns[1].startswith("\n<|im_start|>user\n")
            assert "<|im_end|>\n<|im_start|>assistant\nThe special magic number for " in turns[1]
        metrics = task.process_results(req.doc, [got])
        assert metrics["second_filled"] in (0, 1) and metrics["acc_strict"] in (0.0, 1.0)
        assert (metrics["cap_hits_first"], metrics["cap_hits"]) == tuple(capped)  # the rule against the tokens
