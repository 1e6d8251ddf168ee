"""ruler_filled: lm-eval's own samples, needle marks, the filled-region subset, prompt protocols."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rf_eval.tasks import common, needles, prompts, ruler_data
from rf_eval.tasks.ruler_filled import RulerFilledTask

LENGTHS = [1024]


def meta(tiny_llama, task_data, **extra):
    return {"pretrained": tiny_llama, "max_seq_lengths": LENGTHS, "essay_haystack": str(task_data["essays"]),
            **extra}


def lm_eval_own_docs(name, tiny_llama, task_data, monkeypatch):
    """Docs of lm-eval's own RULER task, generated as `lm_eval --seed` defaults do (0 / 1234)."""
    import datasets
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks.ruler import prepare_niah

    from rf_eval.tasks.ruler_data import load_essays

    texts = load_essays(task_data["essays"])
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: {"text": texts})
    prepare_niah.get_haystack.cache_clear()
    ruler_dir = prepare_niah.__file__.rsplit("/", 1)[0]
    tm = TaskManager(include_path=ruler_dir, include_defaults=False,
                     metadata={"pretrained": tiny_llama, "max_seq_lengths": LENGTHS})
    random.seed(0)
    np.random.seed(1234)
    try:
        return list(tm.load([name])["tasks"][name].eval_docs)
    finally:
        prepare_niah.get_haystack.cache_clear()


@pytest.mark.parametrize("name", ["niah_single_1", "niah_multikey_1", "ruler_fwe"])
def test_samples_equal_lm_eval_own_task(name, tiny_llama, task_data, monkeypatch, th):
    # ours first, after drawing from the global generators: our seeding must not depend on them
    random.random()
    np.random.rand()
    ours = list(th.load_task(f"{name}_filled", meta(tiny_llama, task_data)).eval_docs)
    theirs = lm_eval_own_docs(name, tiny_llama, task_data, monkeypatch)
    assert len(ours) == len(theirs) > 100
    assert {d.pop("ruler_task") for d in ours} == {name}  # each sample records its task
    assert ours == theirs  # one length: the balanced order is the generator's (two: test_task_balanced_limit.py)


def byte_doc(prefix_chars: int, after_chars: int) -> tuple[str, dict]:
    needle = "One of the special magic numbers for tidy-otter is: 1234567."
    text = "x" * prefix_chars + needle + "y" * after_chars
    doc = {"input": text, "outputs": ["1234567"], "max_length": 4096, "index": 0}
    return text, doc


def test_needle_one_token_either_side_of_tail(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)  # byte-level: one token per character here
    tail = 100
    # last needle token at row N - T - 1: the last prefix row -> filled
    text, doc = byte_doc(50, after_chars=tail)
    m = needles.mark(tok, "niah", text, doc, tail)
    assert m.n_tokens == len(text)
    assert m.spans == ((50, len(text) - tail - 1),)
    assert m.rows_from_end == tail and m.filled
    # last needle token at row N - T: the first tail row -> excluded
    text, doc = byte_doc(50, after_chars=tail - 1)
    m = needles.mark(tok, "niah", text, doc, tail)
    assert m.rows_from_end == tail - 1 and not m.filled
    # a needle whose first token is in the prefix but last in the tail is excluded too
    text, doc = byte_doc(50, after_chars=10)
    assert not needles.mark(tok, "niah", text, doc, tail).filled


def test_needle_spans_other_kinds():
    vt = "VAR ABC = 1\nnoise VAR QWERT = 12345 noise VAR ASDFG = VAR QWERT noise\nQuestion: q"
    spans = needles.vt_spans(vt, ["QWERT", "ASDFG"])
    assert [vt[s:e] for s, e in spans] == ["VAR QWERT = 12345", "VAR ASDFG = VAR QWERT"]
    cwe = "1. apple 2. pear 3. apple 4. applesauce\nQuestion: q"
    assert [cwe[s:e] for s, e in needles.word_spans(cwe, ["apple"], numbered=True)] == ["apple", "apple"]
    fwe = "abcdef ghijkl abcdef abcdefg"
    assert len(needles.word_spans(fwe, ["abcdef"], numbered=False)) == 2
    # a value repeated in a distractor needle: the needle whose key the question names is kept
    niah = ("One of the special magic numbers for a-b is: 1111111.\n"
            "One of the special magic numbers for c-d is: 1111111.\nWhat is the number for c-d?")
    (s, e), = needles.niah_spans(niah, ["1111111"])
    assert "c-d" in niah[s:e]


def filled_flags(task, chat=None):
    task.set_fewshot_seed(0)
    task.build_all_requests(limit=40, apply_chat_template=chat is not None, chat_template=chat)
    return {k: (m.filled, m.rows_from_end) for k, m in task._marks.items()}


def test_tail_changes_subset_fill_does_not(tiny_llama, task_data, th):
    base = meta(tiny_llama, task_data)
    a = filled_flags(th.load_task("niah_single_1_filled", {**base, "tail": 300, "fill": "exact"}))
    b = filled_flags(th.load_task("niah_single_1_filled", {**base, "tail": 300, "fill": "identity", "split": 2}))
    c = filled_flags(th.load_task("niah_single_1_filled", {**base, "tail": 600, "fill": "exact"}))
    assert a == b  # the arm does not move the subset
    assert {k: f for k, (f, _) in a.items()} != {k: f for k, (f, _) in c.items()}
    assert 0 < sum(f for f, _ in a.values()) < len(a)
    assert sum(f for f, _ in c.values()) < sum(f for f, _ in a.values())


def test_chat_template_moves_positions(tiny_llama, task_data, th):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)

    def chat(history, add_generation_prompt=True):
        return tok.apply_chat_template(history, tokenize=False, add_generation_prompt=add_generation_prompt,
                                       continue_final_message=not add_generation_prompt)

    task = th.load_task("niah_single_1_filled", {**meta(tiny_llama, task_data), "tail": 300})
    plain = filled_flags(task)
    task._marks.clear()
    chatted = filled_flags(task, chat)
    key = next(iter(plain))
    # the template puts "<|im_end|>\n<|im_start|>assistant\n" where plain mode has one space
    # before the answer prefix: the needle moves that many rows further from the end
    added = len(tok("<|im_end|>\n<|im_start|>assistant\n")["input_ids"]) - 1
    assert chatted[key][1] - plain[key][1] == added


def test_serving_protocols():
    doc = {"input": "haystack\nWhat are all the special magic numbers for k mentioned in the provided text?",
           "gen_prefix": "The special magic numbers for k mentioned in the provided text are",
           "outputs": ["1234567", "7654321"]}
    text, prefix = prompts.ruler_prompt(doc, "official")
    assert text == doc["input"] and prefix == doc["gen_prefix"]
    text, prefix = prompts.ruler_prompt(doc, "serving")
    assert prefix is None and text.startswith(doc["input"] + "\n")
    assert text.endswith(f"Answer with the requested answer(s) in the form: {doc['gen_prefix']} <answer(s)>.")
    text, prefix = prompts.ruler_prompt(doc, "serving_vllm")
    assert prefix is None
    assert text.splitlines()[1] == ("Answer the following question: What are all the special magic numbers "
                                    "for k mentioned in the provided text?")
    assert text.endswith(f"respond with the following format: {doc['gen_prefix']}: <number>, <number>")
    with pytest.raises(ValueError, match="protocol"):
        prompts.ruler_prompt(doc, "chatty")


def test_essay_task_without_haystack_names_the_option(tiny_llama, th):
    with pytest.raises(ruler_data.RulerDataError, match="essay_haystack"):
        th.load_task("niah_multikey_1_filled", {"pretrained": tiny_llama, "max_seq_lengths": LENGTHS})


def test_scores_and_counts(tiny_llama, task_data, th):
    """Scores, subset counts, and the length-cap flag (`cap_hits`, paper section 4.5) of constructed answers."""
    task = th.load_task("niah_single_1_filled", {**meta(tiny_llama, task_data), "tail": 300})
    assert isinstance(task, RulerFilledTask)
    filled_flags(task)
    docs = list(task.eval_docs)[:2]
    cap = task.config.generation_kwargs["max_gen_toks"]
    for doc in docs:
        m = task._marks[(doc["max_length"], doc["index"])]
        right = task.process_results(doc, [f"It is {doc['outputs'][0]}."])
        wrong = task.process_results(doc, ["no idea"])
        assert right["acc_all"] == 1.0 and wrong["acc_all"] == 0.0
        assert right["filled"] == int(m.filled) and right["n_excluded"] == int(not m.filled)
        assert right["acc_filled"] == (1.0 if m.filled else None)
        assert right[f"acc_all_{LENGTHS[0]}"] == 1.0
        # the tiny tokenizer has one token per ASCII character: an answer of `cap` digits spent the whole
        # budget without a stop; one a token shorter stopped (EOS or a stop string, left out of the text)
        assert right["cap_hits"] == 0
        assert task.process_results(doc, [doc["outputs"][0] * (cap // 7 + 1)])["cap_hits"] == 1
        assert task.process_results(doc, ["7" * cap])["cap_hits"] == 1
        assert task.process_results(doc, ["7" * (cap - 1)])["cap_hits"] == 0
    assert task.aggregation()["cap_hits"]([1, 0, None, 1]) == 2 and not task.higher_is_better()["cap_hits"]


def test_cap_hit_rule():
    from rf_eval.testing import build_tokenizer

    tok = build_tokenizer()  # byte-level: one token per byte
    assert common.cap_hit(tok, "a" * 16, 16) == 1 and common.cap_hit(tok, "a" * 20, 16) == 1
    assert common.cap_hit(tok, "a" * 15, 16) == 0 and common.cap_hit(tok, "", 16) == 0
    assert common.cap_hit(tok, "é" * 8, 16) == 1  # tokens, not characters: 2 bytes each
    assert common.cap_hit(tok, "a" * 16, None) is None and common.cap_hit(tok, None, 16) is None
    assert common.max_gen_toks({"max_gen_toks": "32", "until": []}) == 32 and common.max_gen_toks(None) is None


def test_chat_api_messages_are_marked_in_their_rendering(tiny_llama, task_data, th):
    """local-chat-completions hands the task JSON messages; they are marked as the server renders them."""
    import json

    from lm_eval.models.api_models import JsonChatStr
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    task = th.load_task("niah_single_1_filled", {**meta(tiny_llama, task_data), "tail": 300})
    doc = task.test_docs()[0]
    messages = [{"role": "user", "content": task.doc_to_text(doc)}]
    from_json = task.mark_prompt(doc, JsonChatStr(json.dumps(messages)))
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    from_text = task.mark_prompt(doc, rendered)
    assert from_json.spans and from_json == from_text
