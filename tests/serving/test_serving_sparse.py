"""`rf-eval serve --model-args method=xattention,...` serves sparse-attention arms (issue #56): a served sample
equals the `--model prefill` adapter's, for the server's own arm and for a request's `rf_arm`."""

from __future__ import annotations

from lm_eval.api.instance import Instance
from serving_helpers import post, start_server

PROMPT = " ".join(["garden signal 42: the copper clock by the north window reads seven while the river runs"] * 6)
MAX_TOKENS = 8


def adapter_text(model_dir: str, **arm) -> str:
    from rf_eval.model_adapters import prefill_lm
    lm = prefill_lm.prefill.create_from_arg_obj({"pretrained": model_dir, "device": "cpu", **arm})
    request = Instance("generate_until", {}, (PROMPT, {"until": [], "max_gen_toks": MAX_TOKENS, "do_sample": False}), 0)
    assert not lm.method.is_plain(len(lm.encode_prompt(PROMPT)))  # the prompt runs sparse, not whole
    return lm.generate_until([request])[0]


def test_a_sparse_server_serves_the_adapters_samples(serve_model_dir, serve_env, tmp_path):
    served = start_server(serve_model_dir, tmp_path, serve_env, "--model-args",
                          "method=xattention,block=16,stride=4,threshold=0.5")
    try:
        url = served.url + "/v1/completions"
        body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
        for name, extra, arm in (("server's arm", {}, {"threshold": 0.5}),
                                 ("rf_arm", {"rf_arm": {"threshold": 0.3}}, {"threshold": 0.3})):
            status, out = post(url, {**body, **extra})
            assert status == 200, out
            text = adapter_text(serve_model_dir, method="xattention", block=16, stride=4, **arm)
            assert out["choices"][0]["text"] == text, name
            assert out["rf_arm"]["method"] == "xattention" and out["rf_arm"]["threshold"] == arm["threshold"]
            assert out["rf_timings"]["prefills_together"] is False
        status, out = post(url, {**body, "rf_arm": {"stride": 5}})
        assert status == 400 and "stride=5" in out["error"]["message"]
    finally:
        served.stop()
