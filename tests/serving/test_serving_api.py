"""`rf-eval serve`: the OpenAI-compatible API, per-request arms, clear errors, streaming, echo log-probabilities."""

from __future__ import annotations

import json
import urllib.request

import pytest
from serving_helpers import post, post_stream

from rf_eval.serving.arms import ArmError, parse_rf_arm
from rf_eval.serving.arms import resolve as resolve_fields

PROMPT = "The harbor ledger lists copper, lanterns and candles. " * 6 + "The ledger lists"


def completion(server, **body):
    status, out = post(server.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, **body})
    assert status == 200, out
    return out


def test_arm_spec_and_resolution():
    from transformers import LlamaConfig

    from rf_eval.ridgefill.arm_spec import RidgeFillArm
    from rf_eval.ridgefill.method import RidgeFill

    assert parse_rf_arm("fill=identity;tail=64") == {"fill": "identity", "tail": "64"}
    assert parse_rf_arm('{"fill": "nofill", "tail": 8}') == {"fill": "nofill", "tail": 8}
    fields = RidgeFill.arm_fields()  # what a RidgeFill server's requests may set (`PrefillLM.arm_fields`)
    assert set(fields) >= {"fill", "split", "tail", "chunk_size"}
    assert not {"pretrained", "maps", "device", "reference"} & set(fields)
    config = LlamaConfig(num_hidden_layers=6)

    def resolve(base, given, config):  # as `PrefillLM.arm_with` applies a request's fields
        return resolve_fields(base, given, lambda f: base.updated(f, config, what="rf_arm"), fields)

    base = RidgeFillArm(fill="exact", tail=512).resolve(config)
    arm = resolve(base, {"fill": "identity", "tail": "64"}, config)
    assert (arm.fill, arm.tail, arm.split) == ("identity", 64, 3)
    with pytest.raises(ArmError, match="unknown rf_arm field.*'fil'.*valid fields: fill"):
        resolve(base, {"fil": "identity"}, config)
    with pytest.raises(ArmError, match="split 7 is outside 1..5"):
        resolve(base, {"split": 7}, config)
    with pytest.raises(ArmError, match="pretrained"):
        resolve(base, {"pretrained": "other"}, config)
    # a request's preset replaces the server's fill, tail and split; its own tail leaves a server's preset
    pop = resolve(base, {"preset": "pop"}, config)
    assert (pop.fill, pop.tail, pop.split, pop.preset) == ("identity", 1, 4, "pop")
    left = resolve(pop, {"tail": "8"}, config)
    assert (left.fill, left.tail, left.preset) == ("identity", 8, None)


def test_a_served_preset_arm_runs_at_its_own_split_beside_the_servers_maps():
    """The server's maps are read only by a fill that reads maps (#54): POP's arm on a ridge server runs at
    POP's split, not refused for the maps' split."""
    from transformers import LlamaConfig

    from rf_eval.ridgefill.arm_spec import RidgeFillArm

    class ServerMaps:  # the maps of a server at split 3: any use of them fails the test
        split = 3

        def __getattr__(self, name):
            raise AssertionError(f"a preset's arm read the server's maps ({name})")

    config = LlamaConfig(num_hidden_layers=6)
    base = RidgeFillArm(fill="identity", split=3).resolve(config)
    pop = base.updated({"preset": "pop"}, config, ServerMaps(), what="rf_arm")
    assert (pop.fill, pop.split, pop.tail) == ("identity", 4, 1)
    with pytest.raises(ArmError, match=r"at 4, not 3 \(the split of the maps given: leave out maps=\)"):
        RidgeFillArm(preset="pop").split_for(config, maps_split=3)


def test_unknown_arm_is_a_clear_400_and_the_server_keeps_serving(exact_server):
    url = exact_server.url
    cases = [
        (url + "/v1/completions", {"rf_arm": {"fil": "identity"}}, ["'fil'", "valid fields: fill, split, tail"]),
        (url + "/v1/completions", {"rf_arm": {"fill": "bogus"}}, ["'bogus'", "valid fills: exact, identity, kv_ridge, nofill, ridge"]),
        (url + "/v1/completions", {"rf_arm": "fill=identity;tail=0"}, ["tail must be >= 1"]),
        (url + "/v1/completions", {"rf_arm": {"fill": "ridge"}}, ["fill=ridge needs maps="]),
        (url + "/arm/fill=nope/v1/completions", {}, ["'nope'", "valid fills"]),
        (url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                        "rf_arm": {"tial": 3}}, ["'tial'"]),
    ]
    for endpoint, extra, needles in cases:
        status, out = post(endpoint, {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, **extra})
        assert status == 400, out
        assert out["error"]["param"] == "rf_arm" and out["error"]["type"] == "invalid_request_error"
        for needle in needles:
            assert needle in out["error"]["message"], out
    status, out = post(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": -1})
    assert status == 400 and out["error"]["param"] == "max_tokens"
    ok = completion(exact_server)  # still serving
    assert ok["choices"][0]["finish_reason"] in ("stop", "length") and ok["rf_arm"]["fill"] == "exact"
    errors = [r for r in exact_server.records() if r["status"] == 400]
    assert len(errors) >= len(cases) and all("error" in r for r in errors)


def test_arm_switches_per_request_and_is_reported_and_logged(exact_server):
    exact = completion(exact_server, logprobs=3)
    filled = completion(exact_server, logprobs=3, rf_arm={"fill": "identity", "tail": 16})
    by_path = post(exact_server.url + "/arm/fill=identity;tail=16/v1/completions",
                   {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 3})[1]
    assert exact["rf_arm"] == {"method": "ridgefill", "fill": "exact", "tail": 1024, "split": 3, "map_split": False,
                               "layers": 6}
    assert filled["rf_arm"] == {"method": "ridgefill", "fill": "identity", "tail": 16, "split": 3, "map_split": False,
                                "layers": 6}
    assert by_path["choices"] == filled["choices"]
    assert exact["choices"][0]["logprobs"] != filled["choices"][0]["logprobs"]
    timings = filled["rf_timings"]
    n = filled["usage"]["prompt_tokens"]
    assert timings["prompt_tokens"] == n and 0 < timings["prefill_seconds"] <= timings["prompt_seconds"]
    assert timings["ceiling"] > 1 and filled["usage"]["prompt_time_ms"] == pytest.approx(1000 * timings["prompt_seconds"])
    record = exact_server.records()[-1]
    assert record["arm"]["fill"] == "identity" and record["arm_source"] == "path"
    assert record["prompt_tokens"] == n and record["prefill_seconds"] > 0
    with urllib.request.urlopen(exact_server.url + "/v1/models", timeout=30) as resp:
        assert json.load(resp)["data"][0]["object"] == "model"


def test_stream_matches_non_stream_and_honours_stop(exact_server):
    full = completion(exact_server, max_tokens=12)["choices"][0]["text"]
    assert len(full) >= 4
    stop = full[2:4]
    cut = completion(exact_server, max_tokens=12, stop=[stop])["choices"][0]
    assert cut["text"] == full[: full.index(stop)] and cut["finish_reason"] == "stop"
    events = post_stream(exact_server.url + "/v1/completions",
                         {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stop": [stop]})
    assert "".join(e["choices"][0]["text"] for e in events) == cut["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and "rf_timings" in events[-1]
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 10, "temperature": 0}
    status, whole = post(exact_server.url + "/v1/chat/completions", chat)
    assert status == 200
    events = post_stream(exact_server.url + "/v1/chat/completions", {**chat, "stream_options": {"include_usage": True}})
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert events[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_echo_logprobs_give_lm_eval_loglikelihoods_equal_to_the_adapter(exact_server, serve_model_dir):
    """lm-eval's own local-completions loglikelihood path (echo + logprobs) against the server, fill off."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from rf_eval.model_adapters import prefill_lm
    pairs = [(PROMPT, " copper"), ("Count: one, two,", " three"), (PROMPT[:80], " lanterns and candles")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    api = LocalCompletionsAPI(base_url=exact_server.url + "/v1/completions", model="tiny", tokenizer=serve_model_dir,
                              tokenizer_backend="huggingface", max_retries=1)
    remote = api.loglikelihood(requests, disable_tqdm=True)
    local = prefill_lm.ridgefill(pretrained=serve_model_dir, fill="exact", device="cpu").loglikelihood(requests, disable_tqdm=True)
    assert [g for _, g in remote] == [g for _, g in local]
    assert [lp for lp, _ in remote] == pytest.approx([lp for lp, _ in local], abs=1e-4)
    # a filled arm scores only the rows it computes: its tail; the rows it fills get no log-probability
    status, out = post(exact_server.url + "/v1/completions",
                       {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1,
                        "rf_arm": {"fill": "identity", "tail": 8}})
    lps = out["choices"][0]["logprobs"]["token_logprobs"]
    n = out["usage"]["prompt_tokens"]
    assert status == 200 and len(lps) == n + 1 and out["choices"][0]["text"].startswith(PROMPT)
    assert all(x is None for x in lps[: n - 7]) and all(x is not None for x in lps[n - 7 :])


def test_generation_equals_the_adapter_greedy_exact_and_seeded_sampling(exact_server, serve_model_dir):
    """Greedy with the fill off, and sampling under a filled arm: a request's `seed` seeds torch by the
    adapter's rule (`rf_eval.method.sampling_seed` of the seed and the prompt tokens), as `--model
    ridgefill` with `seed=` does: equal seeds, equal samples."""
    from lm_eval.api.instance import Instance

    from rf_eval.model_adapters import prefill_lm
    greedy = {"until": [], "max_gen_toks": 12, "do_sample": False, "temperature": 0.0}
    exact = prefill_lm.ridgefill(pretrained=serve_model_dir, fill="exact", device="cpu")
    for prompt in (PROMPT, PROMPT[:40]):
        local = exact.generate_until([Instance("generate_until", {}, (prompt, greedy), 0)], disable_tqdm=True)[0]
        status, out = post(exact_server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                                  "stop": ["<|im_end|>"]})
        assert out["choices"][0]["text"] == local
    kwargs = {"until": [], "max_gen_toks": 12, "do_sample": True, "temperature": 0.7}
    for seed in (3, 4):
        lm = prefill_lm.ridgefill(pretrained=serve_model_dir, fill="identity", tail=16, device="cpu", seed=seed)
        local = lm.generate_until([Instance("generate_until", {}, (PROMPT, kwargs), 0)], disable_tqdm=True)[0]
        remote = completion(exact_server, max_tokens=12, temperature=0.7, seed=seed, stop=["<|im_end|>"],
                            rf_arm={"fill": "identity", "tail": 16})["choices"][0]["text"]
        assert remote == local
