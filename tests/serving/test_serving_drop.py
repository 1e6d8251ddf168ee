"""`rf-eval serve --model-args method=gemfilter,...` serves droppers: a served sample equals the `--model drop`
adapter's, for the server's own arm and for a request's `rf_arm` (issue #40: every shell takes them)."""

from __future__ import annotations

from lm_eval.api.instance import Instance
from serving_helpers import post, start_server

PROMPT = " ".join(["garden signal 42: the copper clock by the north window reads seven while the river runs"] * 6)
MAX_TOKENS = 8


def adapter_text(model_dir: str, **arm) -> str:
    from rf_eval.model_adapters import prefill_lm
    lm = prefill_lm.drop.create_from_arg_obj({"pretrained": model_dir, "device": "cpu", **arm})
    request = Instance("generate_until", {}, (PROMPT, {"until": [], "max_gen_toks": MAX_TOKENS, "do_sample": False}), 0)
    assert not lm.method.is_plain(len(lm.encode_prompt(PROMPT)))  # the prompt is dropped, not run whole
    return lm.generate_until([request])[0]


def test_a_gemfilter_server_serves_the_adapters_samples(serve_model_dir, serve_env, tmp_path):
    served = start_server(serve_model_dir, tmp_path, serve_env, "--model-args", "method=gemfilter,keep=40,filter_layer=2")
    try:
        url = served.url + "/v1/completions"
        body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
        texts = {}
        for name, extra, arm in (("server's arm", {}, {"keep": 40}),
                                 ("rf_arm", {"rf_arm": {"keep": 20}}, {"keep": 20})):
            status, out = post(url, {**body, **extra})
            assert status == 200, out
            texts[name] = out["choices"][0]["text"]
            assert texts[name] == adapter_text(serve_model_dir, method="gemfilter", filter_layer=2, **arm), name
            assert out["rf_arm"]["method"] == "gemfilter" and out["rf_arm"]["keep"] == arm["keep"], out["rf_arm"]
        status, out = post(url, {**body, "rf_arm": {"keep": 0}})
        assert status == 400 and "keep" in out["error"]["message"]
    finally:
        served.stop()
