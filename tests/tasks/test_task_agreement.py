"""The agreement protocol (paper sections 3.1 and 4.7): per-position KL pooled over documents, the
length grid of keytoken_nll, and decode_agreement against the exact arm's greedy continuation."""

from __future__ import annotations

import statistics

import pytest

from rf_eval.tasks import decode_agreement

SCORE = 128


def run(lm, task, metadata, th):
    from lm_eval import simple_evaluate

    out = simple_evaluate(model=lm, tasks=[task], task_manager=th.task_manager(metadata), log_samples=True,
                          bootstrap_iters=0, verbosity="WARNING")
    return out["results"][task], out["samples"][task]


@pytest.fixture(scope="module")
def filled_lm(tiny_llama, th):
    return th.ridgefill_class().create_from_arg_string(
        f"pretrained={tiny_llama},fill=identity,split=3,tail=64,reference=exact,device=cpu")


def test_keytoken_length_grid_and_per_position_kl(filled_lm, tiny_llama, task_data, th):
    meta = {"pretrained": tiny_llama, "docs": str(task_data["docs"]), "score_tokens": SCORE, "key_context": 512,
            "reference": "exact", "lengths": [300, 600]}
    res, samples = run(filled_lm, "keytoken_nll", meta, th)
    # documents of 1000, 700 and 1100 one-character tokens: all three at N=300, two at N=600 (700 < 600 + 128)
    assert sorted(s["doc"]["doc_id"].rsplit("@", 1)[1] for s in samples) == ["300", "300", "300", "600", "600"]
    kls = {}
    for s in samples:
        resp = s["filtered_resps"][0]
        n = s["doc"]["length"]
        # the window is the first N + 128 tokens; lm-eval's loglikelihood moves a context's trailing
        # space to the continuation, so the scored part can start one token early
        assert resp["context_tokens"] + len(resp["tokens"]) == n + SCORE
        assert resp["context_tokens"] in (n - 1, n)
        kls[s["doc"]["doc_id"]] = resp["kl"]
    every = [x for v in kls.values() for x in v]
    assert res["kl_median,none"] == pytest.approx(statistics.median(every))
    assert res["kl_mean,none"] == pytest.approx(sum(every) / len(every))
    assert res["kl_median,none"] != pytest.approx(res["kl,none"])  # not the mean of per-document means
    at_300 = [x for k, v in kls.items() if k.endswith("@300") for x in v]
    assert res["kl_median_300,none"] == pytest.approx(statistics.median(at_300))
    assert res["kl,none"] == pytest.approx(statistics.mean(sum(v) / len(v) for v in kls.values()))


def test_decode_agreement_against_the_exact_greedy_continuation(filled_lm, tiny_llama, tmp_path, th):
    # documents on which the tiny model's greedy decoding does not end at once (EOS would end it early)
    for i in range(3):
        (tmp_path / f"d{i}.txt").write_text("Copper window harbor signal garden ledger candle pocket thunder " * (12 + i))
    meta = {"pretrained": tiny_llama, "docs": str(tmp_path), "n_docs": 2, "decode_tokens": 16,
            "lengths": [300, 600]}
    res, samples = run(filled_lm, "decode_agreement", meta, th)
    assert len(samples) == 2 and sorted(s["doc"]["length"] for s in samples) == [300, 600]  # balanced draw
    by_doc = {}
    for s in samples:
        resp = s["filtered_resps"][0]
        steps = len(resp["tokens"])
        assert steps == 16 and resp["context_tokens"] == s["doc"]["length"] and s["n_steps"] == steps
        assert s["agreement"] == pytest.approx(sum(resp["greedy"]) / steps)
        assert s["first_departure"] == decode_agreement.first_departure(resp["greedy"])
        assert s["kl"] == pytest.approx(sum(resp["kl"]) / steps)
        by_doc[s["doc"]["doc_id"]] = resp["tokens"]
    assert res["n_steps,none"] == sum(map(len, by_doc.values()))
    # the exact arm: same draw, same continuation, full agreement: the arms pair per document
    exact = th.ridgefill_class().create_from_arg_string(f"pretrained={tiny_llama},fill=exact,reference=exact,device=cpu")
    res_x, samples_x = run(exact, "decode_agreement", meta, th)
    assert {s["doc"]["doc_id"]: s["filtered_resps"][0]["tokens"] for s in samples_x} == by_doc
    assert res_x["agreement,none"] == 1.0
    assert res_x["first_departure,none"] == statistics.mean(map(len, by_doc.values()))
    assert res_x["full_agreement,none"] == 1.0 and res_x["kl_median,none"] == 0.0


def test_decode_agreement_draw_is_seeded_and_balanced():
    docs = [{"doc_id": f"d{i}", "domain": "", "text": "x" * 100} for i in range(30)]
    assert decode_agreement.quotas(20, 3) == [7, 7, 6]
    one = decode_agreement.draw(docs, 5, seed=1, lengths=[])
    assert one == decode_agreement.draw(docs, 5, seed=1, lengths=[]) and len(one) == 5
    assert one != decode_agreement.draw(docs, 5, seed=2, lengths=[])
    assert decode_agreement.first_departure([True, True, False, True]) == 2
    assert decode_agreement.first_departure([True, True]) == 2
