"""The `ridgefill` adapter's request types, in process, on tiny models of two families."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from adapter_helpers import identity_maps, lm
from lm_eval.api.instance import Instance
from lm_eval.api.model import CachingLM

from rf_eval.model_adapters.config import ModelArgsError
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.testing import FAMILIES

CONTEXT = "the quick brown fox jumps over the lazy dog while the river runs past the old stone house"
CONTINUATIONS = [" and then", " again and again", " x"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def req(kind: str, *args) -> Instance:
    return Instance(kind, {}, tuple(args), 0)


def count_prefills(monkeypatch, engine) -> list[int]:
    calls: list[int] = []
    original = engine.prefill

    def counted(ids, **kwargs):
        calls.append(ids.shape[1])
        return original(ids, **kwargs)

    monkeypatch.setattr(engine, "prefill", counted)
    return calls


def teacher_forced(engine, prompt: list[int], cont: list[int]) -> float:
    """Decoding over the engine's cache: one token at a time, as generation would run it."""
    result = engine.prefill(torch.tensor([prompt]))
    logprob = F.log_softmax(result.logits, -1)[0, cont[0]].item()
    for prev, nxt in zip(cont[:-1], cont[1:]):
        logits = engine.extend(result, torch.tensor([[prev]]))
        logprob += F.log_softmax(logits[0, -1], -1)[nxt].item()
    return logprob


@pytest.mark.parametrize("family, fill", [("llama", "identity"), ("qwen3_5", "identity"), ("qwen3_5", "nofill")])
def test_continuation_equals_teacher_forced_decoding_over_the_engine_cache(tiny_model_dir, family, fill, monkeypatch):
    model = lm(tiny_model_dir(family), fill=fill, tail=6, batch_size=2)
    calls = count_prefills(monkeypatch, model.method)
    got = model.loglikelihood([req("loglikelihood", CONTEXT, c) for c in CONTINUATIONS])
    assert calls == [len(model.tok_encode(CONTEXT))]  # one prefill serves all three continuations
    for cont_text, (logprob, _) in zip(CONTINUATIONS, got):
        ctx, cont = model._encode_pair(CONTEXT, cont_text)
        assert logprob == pytest.approx(teacher_forced(model.method, ctx, cont), abs=1e-4)


def test_filled_arm_differs_from_exact_only_past_the_tail(tiny_model_dir):
    path = tiny_model_dir("llama")
    exact, filled = lm(path, fill="exact"), lm(path, fill="identity", tail=8)
    # a single process (no `accelerate launch`): rank 0 of 1, collectives are identities
    ones = torch.ones(2)
    assert (filled.rank, filled.world_size, filled.gather_object(7), filled.all_gather(ones) is ones) == (0, 1, [7], True)
    short = [req("loglikelihood", "a b c", c) for c in CONTINUATIONS]  # 5 context tokens <= tail
    long = [req("loglikelihood", CONTEXT, c) for c in CONTINUATIONS]
    assert filled.loglikelihood(short) == exact.loglikelihood(short)
    diffs = [abs(a[0] - b[0]) for a, b in zip(filled.loglikelihood(long), exact.loglikelihood(long))]
    assert min(diffs) > 1e-3


def test_ridge_maps_of_identity_equal_the_identity_fill_and_are_recorded(tiny_model_dir, tmp_path):
    path = tiny_model_dir("llama")
    maps = identity_maps(path, 3, tmp_path)
    ridge, ident = lm(path, fill="ridge", maps=str(tmp_path), tail=8), lm(path, fill="identity", split=3, tail=8)
    requests = [req("loglikelihood", CONTEXT, c) for c in CONTINUATIONS]
    got, want = ridge.loglikelihood(requests), ident.loglikelihood(requests)
    assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in want], abs=1e-5)
    info = ridge.get_model_info()["rf_eval"]
    assert {info[k] for k in ("fill", "split", "tail")} == {"ridge", 3, 8}
    assert info["selector"] is None and info["corrections"] == [] and info["splice"] is None
    import hashlib

    assert info["maps_sha256"] == hashlib.sha256(maps.read_bytes()).hexdigest()
    assert info["maps_metadata"]["lambda"] == "0.01"


def test_engine_parts_pass_through_and_are_recorded(tiny_model_dir):
    path = tiny_model_dir("llama")
    requests = [req("loglikelihood", CONTEXT, c) for c in CONTINUATIONS]
    exact = [lp for lp, _ in lm(path, fill="exact").loglikelihood(requests)]
    # exact keys and values spliced into every filled row: the exact arm again (attention-only model)
    spliced = lm(path, fill="identity", tail=8, splice="both")
    assert [lp for lp, _ in spliced.loglikelihood(requests)] == pytest.approx(exact, abs=1e-4)
    assert spliced.get_model_info()["rf_eval"]["splice"] == "both"
    rows = lm(path, fill="identity", tail=8, selector="attention(share=0.3;layers=1|2)",
              corrections="value_rescale(c=4)")
    plain = [lp for lp, _ in lm(path, fill="identity", tail=8).loglikelihood(requests)]
    with_rows = [lp for lp, _ in rows.loglikelihood(requests)]
    assert min(abs(a - b) for a, b in zip(with_rows, plain)) > 1e-3
    info = rows.get_model_info()["rf_eval"]
    assert info["selector"]["name"] == "attention" and info["corrections"][0]["name"] == "value_rescale"


def test_rolling_loglikelihood_sums_hf_windows(tiny_model_dir):
    model = lm(tiny_model_dir("llama"), fill="identity", tail=4, max_length=16)
    text = CONTEXT * 2
    (total,) = model.loglikelihood_rolling([req("loglikelihood_rolling", text)])
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    windows = get_rolling_token_windows(model.tok_encode(text), model.prefix_token_id, 16, 1)
    expected = sum(teacher_forced(model.method, *make_disjoint_window(w)) for w in windows)
    assert total == pytest.approx(expected, abs=1e-3)


def test_token_logprobs_one_pass_with_exact_reference(tiny_model_dir, monkeypatch):
    path = tiny_model_dir("qwen3_5")
    exact = lm(path, fill="exact", reference="exact")
    (out,) = exact.token_logprobs([req("token_logprobs", CONTEXT, " and then again")])
    assert out["kl"] == [0.0] * len(out["tokens"]) and all(out["top1_agree"])
    assert out["exact_logprobs"] == out["logprobs"]

    filled = lm(path, fill="identity", tail=4, reference="exact")
    calls = count_prefills(monkeypatch, filled.method)
    (res,) = filled.token_logprobs([req("token_logprobs", CONTEXT, " and then again")])
    assert len(calls) == 1  # one engine pass per document, not one per token
    n = len(res["tokens"])
    assert [len(res[k]) for k in ("logprobs", "greedy", "exact_logprobs", "kl", "top1_agree")] == [n] * 5
    assert res["context_tokens"] == len(filled.tok_encode(CONTEXT)) and res["truncated"] == 0
    assert max(res["kl"]) > 1e-4 and min(res["kl"]) >= 0
    assert res["exact_logprobs"] == pytest.approx(out["logprobs"], abs=1e-5)
    (ll,) = filled.loglikelihood([req("loglikelihood", CONTEXT, " and then again")])
    assert sum(res["logprobs"]) == pytest.approx(ll[0], abs=1e-4)


def _counted(calls: list, function, *args):
    calls.append(args)
    return function(*args)


def test_paired_timing_off_skips_the_timed_exact_prefill_and_keeps_every_score(tiny_model_dir):
    """`paired_timing=false`: no exact prefill timed beside the arm's (its seconds left out of the item's cost),
    and the arm's and the reference's scores bit for bit those of the paired run."""
    path = tiny_model_dir("llama")
    runs = {}
    for flag in (True, False):
        model = lm(path, fill="identity", tail=4, reference="exact", paired_timing=flag)
        timed: list = []
        model._exact_prefill_seconds = functools.partial(_counted, timed, model._exact_prefill_seconds)
        (res,) = model.token_logprobs([req("token_logprobs", CONTEXT, " and then again")])
        runs[flag] = res, len(timed), model.item_costs.fields(CONTEXT)["exact_prefill_seconds"]
    (paired, n_paired, seconds), (alone, n_alone, none) = runs[True], runs[False]
    assert n_paired == 1 and seconds > 0
    assert n_alone == 0 and none is None
    assert alone == paired

@pytest.mark.parametrize(("family", "batch_size"), [("llama", 1), *((f, 2) for f in FAMILIES)])
def test_plain_scoring_keeps_the_full_forwards_rows(tiny_model_dir, family, batch_size):
    """`_score_plain` computes logits only for the rows that predict the continuations (`logits_to_keep`); each
    continuation's rows are the full forward's over its own prompt + continuation, one at a time or
    right-padded beside a longer one, in every family (`logits_to_keep` is each model's own argument): the same sums, to the last bits a matrix product of fewer rows may
    round differently (on these tiny models; bit for bit at the demo model's sizes)."""
    model = lm(tiny_model_dir(family), fill="exact", batch_size=batch_size)
    prompt = model.tok_encode(CONTEXT)
    conts = [model.tok_encode(c, add_special_tokens=False) for c in CONTINUATIONS]
    got = model._score_plain(prompt, conts)
    for cont, rows in zip(conts, got):
        with torch.no_grad():
            full = model.model(torch.tensor([prompt + cont[:-1]])).logits
        expected = F.log_softmax(full, dim=-1)[0, len(prompt) - 1 :]
        torch.testing.assert_close(rows, expected, rtol=0, atol=1e-5)


def test_token_logprobs_against_the_exact_greedy_continuation(tiny_model_dir):
    model = lm(tiny_model_dir("llama"), fill="identity", tail=4, reference="exact")
    (res,) = model.token_logprobs([req("token_logprobs", CONTEXT, {"exact_greedy": 6})])
    ids = torch.tensor([model.encode_prompt(CONTEXT)])
    greedy = model.model.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1] :].tolist()
    assert res["tokens"] == greedy and res["text"] == model.tok_decode(greedy)
    # against its own greedy continuation the exact arm's argmax is the token itself
    assert res["top1_agree"] == res["greedy"]
    with pytest.raises(ValueError, match="exact_greedy"):
        model.token_logprobs([req("token_logprobs", CONTEXT, {"greedy": 3})])


def test_generate_until_stops_and_matches_plain_generate_when_nothing_is_filled(tiny_model_dir):
    model = lm(tiny_model_dir("llama"), fill="identity", tail=4096)
    gen = {"until": ["\n"], "max_gen_toks": 12, "do_sample": False}
    (text,) = model.generate_until([req("generate_until", CONTEXT, gen)])
    ids = torch.tensor([model.encode_prompt(CONTEXT)])
    plain = model.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    expected = model.tok_decode(plain[0, ids.shape[1] :].tolist()).split("\n")[0]
    assert text == expected


@pytest.mark.parametrize("family, fill", [("llama", "identity"), ("qwen3_5", "nofill")])
def test_multiturn_appends_the_next_turn_to_the_kept_cache(tiny_model_dir, family, fill, monkeypatch):
    model = lm(tiny_model_dir(family), fill=fill, tail=6, reference="exact")
    gen = {"until": [], "max_gen_toks": 5, "do_sample": False}
    calls = count_prefills(monkeypatch, model.method)
    (out,) = model.multiturn_generate([req("multiturn_generate", [CONTEXT, " next question:"], gen)])
    assert len(calls) == 1 and len(out["answers"]) == 2 and len(out["exact_answers"]) == 2

    # by hand: prefill once, generate, append the turn's tokens after the answer, generate again
    arm = model.method
    prompt = model.encode_prompt(CONTEXT)
    shorter = dataclasses.replace(arm.arm.plan, tail=arm.arm.plan.tail - 1)
    result = prefill_arm(arm.model, arm.tokenizer, arm.arm, torch.tensor([prompt[:-1]]), shorter,
                         arm.arm.fill_obj.row_fill(arm.fill_fn))  # the engine, by hand
    first = model.model.generate(torch.tensor([prompt]), cache=result.cache, max_new_tokens=5, do_sample=False)
    seq = first[0].tolist() + model.tok_encode(" next question:", add_special_tokens=False)
    result.prompt_length = first.shape[1] - 1
    if result.ragged:
        arm.extend(result, torch.tensor([seq[result.prompt_length : -1]]))
    second = model.model.generate(torch.tensor([seq]), cache=result.cache, max_new_tokens=5, do_sample=False)
    assert out["answers"] == [
        model.tok_decode(first[0, len(prompt) :].tolist()), model.tok_decode(second[0, len(seq) :].tolist())
    ]


def test_use_cache_serves_custom_types_and_refuses_another_arm(tiny_model_dir, tmp_path, monkeypatch):
    path, db = tiny_model_dir("llama"), str(tmp_path / "cache.db")
    model = lm(path, fill="identity", tail=4)
    cached = CachingLM(model, db)
    requests = [req("token_logprobs", CONTEXT, " and then"), req("multiturn_generate", ["a b c", " d"], {"max_gen_toks": 3})]
    first = [cached.token_logprobs(requests[:1]), cached.multiturn_generate(requests[1:])]
    cached.dbdict.close()

    again = lm(path, fill="identity", tail=4)
    cached = CachingLM(again, db)

    def no_compute(*a, **k):
        raise AssertionError("a cached request was computed again")

    monkeypatch.setattr(again.method, "prefill", no_compute)
    assert [cached.token_logprobs(requests[:1]), cached.multiturn_generate(requests[1:])] == first
    cached.dbdict.close()
    with pytest.raises(ModelArgsError, match="holds results of another arm"):
        CachingLM(lm(path, fill="identity", tail=5), db)


@pytest.mark.parametrize("family, fill", [("llama", "nofill"), ("qwen3_5", "identity"), ("qwen3_5", "nofill")])
def test_any_fill_with_the_tail_covering_the_prompt_is_lm_eval_hf(tiny_model_dir, family, fill):
    from lm_eval.models.huggingface import HFLM

    path = tiny_model_dir(family)
    hf = HFLM(pretrained=path, device="cpu", dtype="float32", batch_size=1)
    rf = lm(path, fill=fill, tail=4096)
    ll = [req("loglikelihood", CONTEXT, c) for c in CONTINUATIONS] + [req("loglikelihood", "", "abc")]
    assert rf.loglikelihood(ll) == hf.loglikelihood(ll)
    gen = [req("generate_until", CONTEXT[: 20 * i], {"until": ["\n\n"], "max_gen_toks": 8}) for i in (1, 3)]
    assert rf.generate_until(gen) == hf.generate_until(gen)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": CONTEXT}]
    assert rf.apply_chat_template(chat) == hf.apply_chat_template(chat)
    assert rf.tokenizer_name == hf.tokenizer_name and rf.chat_template(True) == hf.chat_template(True)
    rolling = [req("loglikelihood_rolling", CONTEXT)]
    assert rf.loglikelihood_rolling(rolling) == hf.loglikelihood_rolling(rolling)
