"""keytoken_nll: masks on hand-built sequences, one engine prefill per document, exact against itself."""

from __future__ import annotations

import json

import pytest

from rf_eval.tasks import keytoken, token_masks

OPTS = {"score_tokens": 128, "key_context": 512}


def test_novel_and_copyable_masks():
    run = list(range(1, 10))  # 1..9
    seq = run + run + [30]  # the second 1..9 repeats the first
    assert token_masks.novel_mask(seq, start=9, n=8) == [False] * 9 + [True]
    # copyable: the token and the 8 before it occur earlier: only the repeat's last token
    assert token_masks.copyable_mask(seq, start=9, n=8) == [False] * 8 + [True, False]
    # a 7-token repeat is not an 8-token run: everything stays novel
    seq = list(range(1, 8)) + [50] + list(range(1, 8)) + [60]
    assert token_masks.novel_mask(seq, start=8, n=8) == [True] * 8
    # smaller windows are options
    assert token_masks.novel_mask(seq, start=8, n=7) == [False] * 7 + [True]


def test_copyable_share_by_hand():
    """Section 4.7's rule: a scored token is copyable when it and the 8 tokens before it already occur earlier
    in the window (context then scored tokens); the share is over the scored tokens."""
    context = list(range(100, 120))  # 20 distinct tokens
    scored = context[:12] + [7, 7, 7] + context[3:13]  # a copy, three new tokens, another copy
    seq = context + scored
    mask = token_masks.copyable_mask(seq, start=20, n=8)
    # the first copy's run of 9 lies in the scored text from its 9th token on (100..108 occurs at 0): 4 tokens;
    # the three 7s are not; the second copy's from its 9th token on (103..111, 104..112): 2 tokens
    assert [i for i, m in enumerate(mask) if m] == [8, 9, 10, 11, 23, 24]
    assert token_masks.copyable_share(seq, start=20, n=8) == 6 / 25
    assert token_masks.copyable_share(context, start=20) is None  # nothing scored
    # scored text repeating the whole context: its first 8 tokens' runs reach back over the seam (119 then 100
    # never occurred), the other 12 are copies
    assert token_masks.copyable_share(context * 2, start=20) == 12 / 20


def test_key_mask():
    full = [-1.0, -1.0, -5.0, -0.5]
    cut = [-4.0, -2.9, -5.0, -2.5]  # cutting raises the loss by 3, 1.9, 0, 2 nats
    assert token_masks.key_mask(full, cut) == [True, False, False, False]  # > 2, not >= 2
    assert token_masks.key_mask(full, cut, threshold=1.5) == [True, True, False, True]
    with pytest.raises(ValueError):
        token_masks.key_mask(full, cut[:2])


def test_split_document(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)  # one token per character for ASCII text
    text = "".join(chr(97 + i % 26) for i in range(1000))
    parts = keytoken.split_document(tok, text, score_tokens=128, key_context=512)
    assert parts["context"] + parts["continuation"] == text
    assert len(parts["continuation"]) == 128 and parts["context_tokens"] == 872
    assert parts["cut_context"] == parts["context"][-512:]
    assert keytoken.split_document(tok, text[:600], 128, 512)["cut_context"] is None
    with pytest.raises(keytoken.KeyTokenDataError):
        keytoken.split_document(tok, text[:100], 128, 512)


def word_tokenizer(folder, text: str) -> str:
    """A word-level tokenizer (one token per whitespace-separated word of `text`) saved to `folder`: a
    reference tokenizer that splits text unlike the tiny models' byte-level one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(text.split()))}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]").save_pretrained(folder)
    return str(folder)


def test_a_score_tokenizer_fixes_the_scored_characters_for_every_model(tiny_llama, tmp_path):
    """Section 3.2: the same stretch of text for every model, the last K tokens under one tokenizer. Two
    model tokenizers (byte-level, word-level) get the same continuation, the characters from the K-th last
    word on; the context count and the key-token cut stay in the model's own tokens."""
    from transformers import AutoTokenizer

    text = " ".join(f"w{i % 37}x{i}" for i in range(300))
    words = AutoTokenizer.from_pretrained(word_tokenizer(tmp_path / "words", text))
    byte_level = AutoTokenizer.from_pretrained(tiny_llama)
    last = text.split()[-20:]
    start = text.rindex(" " + last[0]) + 1
    split = {name: keytoken.split_document(tok, text, 20, 512, score_tokenizer=words)
             for name, tok in (("bytes", byte_level), ("words", words))}
    for parts in split.values():
        assert parts["continuation"] == text[start:] and parts["context"] == text[:start]
    assert split["bytes"]["context_tokens"] == start  # one byte-level token per ASCII character
    assert split["bytes"]["cut_context"] == text[start - 512 : start]
    assert split["words"]["context_tokens"] == 280 and split["words"]["cut_context"] is None
    own = keytoken.split_document(byte_level, text, 20, 512)  # default: the model's own last 20 tokens
    assert own["continuation"] == text[-20:]


def test_the_score_tokenizer_runs_through_lm_eval_and_is_recorded(task_data, tiny_llama, th, tmp_path):
    from lm_eval import simple_evaluate
    from transformers import AutoTokenizer

    docs = keytoken.load_documents(task_data["docs"])
    folder = word_tokenizer(tmp_path / "words", " ".join(d["text"] for d in docs))
    cls = th.ridgefill_class()
    lm = cls.create_from_arg_string(f"pretrained={tiny_llama},fill=exact,reference=exact,device=cpu")
    meta = {"pretrained": tiny_llama, "docs": str(task_data["docs"]), "score_tokens": 30, "key_context": 512,
            "fill": "exact", "reference": "exact", "score_tokenizer": folder}
    out = simple_evaluate(model=lm, tasks=["keytoken_nll"], task_manager=th.task_manager(meta), log_samples=True,
                          bootstrap_iters=0, verbosity="WARNING")
    assert out["configs"]["keytoken_nll"]["metadata"]["scored_text"] == (
        f"the last 30 tokens of each document under the {folder} tokenizer (the same text for every model)")
    words = AutoTokenizer.from_pretrained(folder)
    for sample in out["samples"]["keytoken_nll"]:
        text = sample["doc"]["text"]
        at = words(text, return_offsets_mapping=True)["offset_mapping"][-30][0]  # the last 30 words
        moved = at - len(text[:at].rstrip())  # lm-eval moves the context's trailing whitespace to the continuation
        assert at < len(text) - 30 and sample["n_tokens"] == len(text[at - moved :].encode())  # byte-level tokens
    bad = {**meta, "score_tokenizer": str(tmp_path / "no-such-tokenizer")}
    with pytest.raises(keytoken.KeyTokenDataError, match="score_tokenizer=.*offline, give a local tokenizer"):
        th.load_task("keytoken_nll", bad)


def test_documents_and_missing_option(task_data, tiny_llama, th):
    docs = keytoken.load_documents(task_data["docs"])
    assert [d["domain"] for d in docs] == ["code", "prose", "prose"]
    with pytest.raises(keytoken.KeyTokenDataError, match="docs"):
        th.load_task("keytoken_nll", {"pretrained": tiny_llama})


def run_inprocess(lm, metadata, th):
    from lm_eval import simple_evaluate

    tm = th.task_manager(metadata)
    return simple_evaluate(model=lm, tasks=["keytoken_nll"], task_manager=tm, log_samples=True,
                           bootstrap_iters=0, verbosity="WARNING")


def test_exact_against_itself_then_one_prefill_per_document(task_data, tiny_llama, th, tmp_path, monkeypatch):
    from lm_eval.utils import handle_non_serializable, sanitize_list

    from rf_eval.ridgefill.method import RidgeFill

    cls = th.ridgefill_class()
    base = {"pretrained": tiny_llama, "docs": str(task_data["docs"]), **OPTS}
    # 1. exact arm with its exact reference, key tokens in-process: delta NLL and KL exactly 0
    lm = cls.create_from_arg_string(f"pretrained={tiny_llama},fill=exact,tail=64,reference=exact,device=cpu")
    ref = run_inprocess(lm, {**base, "fill": "exact", "reference": "exact"}, th)
    samples = ref["samples"]["keytoken_nll"]
    assert len(samples) == 3
    for s in samples:
        assert s["dnll_all"] == 0.0 and s["dnll_novel"] in (0.0, None) and s["kl"] == 0.0
        assert s["top1_agree"] == 1.0 and len(s["filtered_resps"]) == 2  # scored pass + cut-context pass
    res = ref["results"]["keytoken_nll"]
    assert res["dnll_all,none"] == 0.0 and res["kl,none"] == 0.0
    # written as lm-eval's --log_samples writes it: responses as their Python repr
    ref_file = tmp_path / "samples_keytoken_nll_ref.jsonl"
    with ref_file.open("w") as f:
        for s in samples:
            rec = {**s, "filtered_resps": sanitize_list(s["filtered_resps"]), "resps": sanitize_list(s["resps"])}
            f.write(json.dumps(rec, default=handle_non_serializable) + "\n")

    # 2. a filled arm with key tokens from that file: one request, so one engine prefill, per
    #    document (an exact arm would not use the engine at all: its prompts run the plain model)
    calls = []
    real = RidgeFill.prefill
    monkeypatch.setattr(RidgeFill, "prefill", lambda self, ids, *a, **k: calls.append(ids.shape[1]) or real(self, ids, *a, **k))
    lm2 = cls.create_from_arg_string(f"pretrained={tiny_llama},fill=identity,split=3,tail=64,device=cpu")
    out = run_inprocess(lm2, {**base, "fill": "identity", "key_reference": str(ref_file)}, th)
    assert len(calls) == 3  # one engine prefill per document
    lengths = sorted(len(d["text"]) - OPTS["score_tokens"] for d in keytoken.load_documents(task_data["docs"]))
    assert sorted(calls) == lengths  # each of them the document's whole context
    again = {s["doc"]["doc_id"]: s for s in out["samples"]["keytoken_nll"]}
    for s in samples:
        arm = again[s["doc"]["doc_id"]]
        assert arm["n_key"] == s["n_key"] and arm["n_novel"] == s["n_novel"]  # shared subsets
        # paired with the file's exact losses
        assert arm["dnll_all"] == pytest.approx(arm["nll_all"] - s["nll_all"], abs=1e-9) and arm["dnll_all"] != 0
    json.loads(ref_file.read_text().splitlines()[0])  # a plain JSON-lines file


def test_inprocess_key_tokens_need_exact_losses(task_data, tiny_llama, th):
    task = th.load_task("keytoken_nll", {"pretrained": tiny_llama, "docs": str(task_data["docs"]),
                                         "fill": "identity", **OPTS})
    task.set_fewshot_seed(0)
    with pytest.raises(keytoken.KeyTokenDataError, match="reference=exact"):
        task.build_all_requests(limit=1)


def test_models_without_the_request_type_say_so():
    from lm_eval.api.model import LM

    from rf_eval.tasks import request_types

    request_types.install()

    class Plain(LM):
        def loglikelihood(self, requests):
            return []

        def loglikelihood_rolling(self, requests):
            return []

        def generate_until(self, requests):
            return ["The correct answer is (B)" for _ in requests]

    with pytest.raises(NotImplementedError, match="--model ridgefill"):
        Plain().token_logprobs([])
    with pytest.raises(NotImplementedError, match="ruler_second_question"):
        Plain().multiturn_generate([])
    assert hasattr(Plain(), "two_pass_generate")


def test_no_key_tokens_is_said_in_words_not_a_bare_nan(task_data, tiny_llama, th, caplog):
    """Issue #41, item 2: a document set where no token is a key token gets a warning naming the threshold
    and context (once), the run records both for reports, and a set with key tokens averages as before."""
    import logging
    import math

    from rf_eval.stats.measures import missing_reason

    task = th.load_task("keytoken_nll", {"pretrained": tiny_llama, "docs": str(task_data["docs"]),
                                         "key_threshold": "3", "key_context": 512})
    mean = task.aggregation()["nll_key"]
    with caplog.at_level(logging.WARNING, logger="rf_eval.tasks.keytoken"):
        assert mean([0.5, None, 1.5]) == 1.0
        assert not [r for r in caplog.records if "no key tokens" in r.getMessage()]
        assert math.isnan(mean([None, None])) and math.isnan(mean([None, None]))
    said = [r.getMessage() for r in caplog.records if "no key tokens" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("keytoken_nll: no key tokens in these documents (key_threshold=3.0 nats, "
                              "key_context=512 tokens): ")
    assert said[0].endswith("; nll_key and dnll_key are nan over these 2 documents")
    recorded = task.config.metadata
    assert (recorded["key_threshold"], recorded["key_context"]) == (3.0, 512)
    assert "(key_threshold=3.0 nats, key_context=512 tokens)" in missing_reason("keytoken_nll", "nll_key", recorded)
    assert "(key_threshold, key_context)" in missing_reason("keytoken_nll", "nll_key")


def test_documents_shorter_than_key_context_are_warned_before_the_model_runs(task_data, tiny_llama, th, caplog):
    """Every document's context is shorter than the default key_context (4,096): the warning comes when the
    requests are built, and the run's nll_key is nan beside n_key 0, as lm-eval's table shows it."""
    import logging
    import math

    from lm_eval import simple_evaluate

    lm = th.ridgefill_class().create_from_arg_string(f"pretrained={tiny_llama},fill=exact,reference=exact,device=cpu")
    meta = {"pretrained": tiny_llama, "docs": str(task_data["docs"]), "score_tokens": 128, "fill": "exact",
            "reference": "exact"}
    with caplog.at_level(logging.WARNING, logger="rf_eval.tasks.keytoken"):
        out = simple_evaluate(model=lm, tasks=["keytoken_nll"], task_manager=th.task_manager(meta), limit=1,
                              bootstrap_iters=0, verbosity="WARNING")
    said = [r.getMessage() for r in caplog.records if "no key tokens" in r.getMessage()]
    assert len(said) == 1 and "(key_threshold=2.0 nats, key_context=4096 tokens)" in said[0], said
    assert said[0].endswith("will be nan: no document's context is longer than 4096 tokens")
    res = out["results"]["keytoken_nll"]
    assert math.isnan(res["nll_key,none"]) and res["n_key,none"] == 0 and res["nll_all,none"] > 0
