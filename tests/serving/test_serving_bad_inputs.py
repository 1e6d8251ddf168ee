"""`rf-eval serve` bad inputs (issue #15): every bad request is a 400 naming the field; a port in use fails at
once; a dropped stream is logged."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request

import pytest
from serving_helpers import post
from warm_start import run_argv

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3

# (endpoint, body, HTTP status, field named, message fragment)
BAD_REQUESTS = [
    ("/v1/completions", {"prompt": [1, 2, 10**9], "max_tokens": 2}, 400, "prompt", "token id 1000000000 is outside"),
    ("/v1/completions", {"prompt": [-3, 5], "max_tokens": 2}, 400, "prompt", "token id -3 is outside"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": -1}, 400, "max_tokens", ""),
    ("/v1/completions", {"prompt": PROMPT, "top_p": 5}, 400, "top_p", "top_p must be <= 1, got 5"),
    ("/v1/completions", {"prompt": PROMPT, "top_p": 0}, 400, "top_p", "top_p must be in (0, 1], got 0"),
    ("/v1/completions", {"prompt": PROMPT, "top_k": -5}, 400, "top_k", "top_k must be >= -1, got -5"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": -0.5}, 400, "temperature", "temperature must be >= 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, 400, "top_p",
     "top_p must be <= 1"),
    ("/v1/completions", {"prompt": 5, "max_tokens": 2}, 400, "prompt", "prompt must be a string"),
    ("/v1/completions", {"prompt": "", "max_tokens": 2}, 400, "prompt", "the prompt is empty"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 10**7}, 400, "prompt", "exceeds the model's length"),
    ("/v1/completions", {"prompt": PROMPT, "rf_arm": {"fill": "bogus"}}, 400, "rf_arm", "valid fills"),
    ("/v1/completions", {"prompt": PROMPT, "rf_arm": {"selector": "probe", "fill": "identity", "split": 2}}, 400,
     "rf_arm", "no attention layer among layers [3, 7, 11, 15] lies below split 2"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens", "token id 1000000000 is outside"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens", "detokenize needs"),
    ("/tokenize", {"text": "no prompt"}, 400, "prompt", "tokenize needs"),
]  # fmt: skip


@pytest.mark.parametrize("endpoint, body, status, param, fragment", BAD_REQUESTS)
def test_bad_requests_are_400_naming_the_field(exact_server, endpoint, body, status, param, fragment):
    got, out = post(exact_server.url + endpoint, body)
    assert got == status, out
    assert out["error"]["param"] == param and fragment in out["error"]["message"], out


def test_a_body_that_is_not_json_is_a_400(exact_server):
    for endpoint in ("/v1/completions", "/tokenize", "/detokenize"):
        req = urllib.request.Request(exact_server.url + endpoint, data=b"{not json", method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("accepted")
        except urllib.error.HTTPError as err:
            assert err.code == 400, endpoint


def test_a_dropped_stream_is_logged(exact_server):
    host, port = exact_server.url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while b"data:" not in got:  # the first chunk comes; then the client goes away
            more = conn.recv(4096)
            assert more, got
            got += more
    # the server learns of the drop when a write fails, after the stream's next tokens: under a loaded CI
    # (the demo beside it) that took over 60 s once; a poll, so a longer deadline costs nothing when it passes
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        dropped = [r for r in exact_server.records() if r.get("status") == 499]
        if dropped:
            assert dropped[-1]["error"] == "client disconnected mid-stream"
            return
        time.sleep(0.5)
    raise AssertionError(f"no dropped-stream record: {exact_server.records()[-3:]}")


def test_a_port_in_use_fails_before_the_model_loads(serve_model_dir, serve_env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = run_argv([sys.executable, "-m", "rf_eval", "serve", "--model", serve_model_dir, "--port", str(port)],
                        env=serve_env, timeout=300)
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Loading weights" not in proc.stderr + proc.stdout


def test_probe_with_a_maps_folder_serves(serve_model_dir, serve_env, tmp_path):
    """The acceptance arm through `rf-eval serve`: fill=ridge from a fitted maps folder with selector=probe."""
    from serving_helpers import start_server
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.ridgefill.fitting import fit_maps

    model, tok = AutoModelForCausalLM.from_pretrained(serve_model_dir), AutoTokenizer.from_pretrained(serve_model_dir)
    cal = tmp_path / "cal.txt"
    cal.write_text(PROMPT * 6)
    fit_maps(model, tok, splits=[4], calibration=[str(cal)], lambdas=[0.03], out=tmp_path / "maps", progress=False)
    served = start_server(serve_model_dir, tmp_path / "server", serve_env, "--fill", "ridge", "--maps",
                          str(tmp_path / "maps"), "--tail", "8", "--model-args", "selector=probe")
    try:
        status, out = post(served.url + "/v1/completions", {"prompt": PROMPT * 2, "max_tokens": 3, "temperature": 0})
        assert status == 200, out
        assert out["rf_arm"]["fill"] == "ridge" and out["rf_arm"]["split"] == 4
        assert str(out["rf_arm"]["selector"]).startswith("probe"), out["rf_arm"]
    finally:
        served.stop()


# (arguments after `rf-eval serve`, message fragment): refused before any port is bound or weights load
BAD_STARTS = [
    ([], "needs a model: --model DIR"),
    (["--model", "{model}", "--model-args", "method=nope"], "method='nope' is not a prefill method; valid: exact, "
                                                            "fastkv, flexprefill, gemfilter, pop, rarecache, ridgefill, "
                                                            "sinkwindow, specprefill, xattention"),
    (["--model", "{model}", "--model-args", "method=drop"], "method='drop' is not a prefill method (--model drop is "
                                                            "an lm-eval model name; its method is gemfilter)"),
    (["--model", "{model}", "--model-args", "method=rarecache"], "source"),
    (["--model", "{model}", "--fill", "identity", "--model-args", "method=rarecache,source={model},maps={model}"],
     "fill"),
    (["--model", "{model}", "--model-args", "rho=0.3"], "rho"),
    (["--model", "{model}", "--fill", "bogus"], "valid fills"),
]  # fmt: skip


@pytest.mark.parametrize("args, fragment", BAD_STARTS)
def test_bad_server_arguments_fail_before_loading(serve_model_dir, capsys, args, fragment):
    from rf_eval.cli import main

    code = main(["serve", *(a.format(model=serve_model_dir) for a in args), "--port", "9"])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err, err
    assert "Loading weights" not in err
