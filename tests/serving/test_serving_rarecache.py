"""`rf-eval serve --model-args method=rarecache,...` serves RaReCache arms: a served sample equals the
`--model rarecache` adapter's, for the server's own arm and for a request's `rf_arm`."""

from __future__ import annotations

import random

import pytest
from lm_eval.api.instance import Instance
from serving_helpers import post, start_server

PROMPT = "garden signal 42: the copper clock by the north window reads seven while the river runs past"
WORDS = "the a of to and in river stone lamp seven blue quiet market paper ladder window north clock".split()
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, str]:
    """A tiny Llama source/target pair and transfer maps fitted for it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.rarecache.fit import fit_transfer
    from rf_eval.testing import make_tiny_pair

    root = tmp_path_factory.mktemp("rarecache_pair")
    source_dir, target_dir = make_tiny_pair("llama", root)
    rng = random.Random(0)
    docs = []
    for i in range(4):
        doc = root / f"doc{i}.txt"
        doc.write_text(" ".join(rng.choice(WORDS) for _ in range(40)) + ".\n")
        docs.append(str(doc))
    tok = AutoTokenizer.from_pretrained(target_dir)
    source, target = (AutoModelForCausalLM.from_pretrained(d).eval() for d in (source_dir, target_dir))
    fit_transfer(source, target, tok, tok, docs, k=2, rank=8, lam=0.01, out=root / "maps")
    return {"pretrained": str(target_dir), "source": str(source_dir), "maps": str(root / "maps")}


def adapter_sample(pair: dict[str, str], **arm) -> tuple[str, float]:
    """(greedy text, the first generated token's log-probability) through `--model rarecache`."""
    import torch

    from rf_eval.model_adapters import prefill_lm
    lm = prefill_lm.rarecache.create_from_arg_obj({**pair, "device": "cpu", **arm})
    (text,) = lm.generate_until([Instance("generate_until", {}, (PROMPT, {"until": [], "max_gen_toks": MAX_TOKENS,
                                                                           "do_sample": False}), 0)])
    ids = lm.encode_prompt(PROMPT)
    first = lm.method.prefill(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
    token = lm.tok_encode(text, add_special_tokens=False)[0]
    return text, float(first[token])


def test_a_rarecache_server_serves_the_adapters_samples(pair, serve_env, tmp_path):
    spec = ",".join(f"{k}={v}" for k, v in {"method": "rarecache", **pair, "rho": 0.3}.items() if k != "pretrained")
    served = start_server(pair["pretrained"], tmp_path, serve_env, "--model-args", spec)
    try:
        url = served.url + "/v1/completions"
        body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 0}
        cases = {"server's arm": ({}, {"rho": 0.3}),
                 "rf_arm": ({"rf_arm": {"rho": 0.6, "selector": "random-positions", "seed": 3}},
                            {"rho": 0.6, "selector": "random-positions", "seed": 3})}
        first = {}
        for name, (extra, arm) in cases.items():
            status, out = post(url, {**body, **extra})
            assert status == 200, out
            choice = out["choices"][0]
            text, logprob = adapter_sample(pair, **arm)
            assert choice["text"] == text, name
            reported = {k: v for k, v in out["rf_arm"].items() if k != "layers"}
            assert reported == {"method": "rarecache", "selector": "rank", **arm}, name
            assert choice["logprobs"]["token_logprobs"][0] == pytest.approx(logprob, abs=1e-5), name
            first[name] = logprob
            # the source model's prefill, inside the prompt's time (the load test reports TTFT without it too)
            timings = out["rf_timings"]
            assert 0 < timings["source_seconds"] < timings["prompt_seconds"], name
        # the mapped cache matters: the two arms' first tokens are scored differently
        assert abs(first["server's arm"] - first["rf_arm"]) > 1e-4
        status, out = post(url, {**body, "rf_arm": {"fill": "identity"}})
        assert status == 400 and "'fill'" in out["error"]["message"] and "rho" in out["error"]["message"]
    finally:
        served.stop()
